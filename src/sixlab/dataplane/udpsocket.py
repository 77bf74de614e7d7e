"""The ``socket`` data plane: one kernel UDP socket, SRv6 through the kernel's SRH support.

IPv6 and IPv4. With an IPv6 ``source`` the socket is IPv6 only, with an IPv4 one it is an
IPv4 socket, without one it is a dual-stack IPv6 socket bound to ``::`` (RFC 3493 §3.7:
IPv4 peers appear as IPv4-mapped addresses, which this plane turns back into IPv4 ones).

Receive: ``recvmsg`` with ancillary data for the arrival time (``SO_TIMESTAMPNS``: the
kernel's receive timestamp, taken when the packet entered the stack, not when Python got
to it), the Hop Limit or TTL (``IPV6_RECVHOPLIMIT`` / ``IP_RECVTTL``, for Ses-Sender TTL),
the Traffic Class or TOS byte (``IPV6_RECVTCLASS`` / ``IP_RECVTOS``, for the Class of
Service TLV, RFC 8972 §4.4) and the local address the packet was sent to
(``IPV6_RECVPKTINFO`` / ``IP_PKTINFO``, to answer from it). A datagram that came with an
SRH (Segments Left 0) is delivered like any other.

Send: ``sendmsg`` with the source address (``IPV6_PKTINFO`` / ``IP_PKTINFO``) and the
Traffic Class or TOS (``IPV6_TCLASS`` / ``IP_TOS``) as per-message control data. SRv6
(IPv6 only): to the final destination with the socket's sticky ``IPV6_RTHDR`` option
holding a type-4 routing header (RFC 8754). Linux (``ipv6_push_rthdr4``) writes the
socket's destination into Segment List[0] and sends to the active segment, and it
computes the UDP checksum over the final destination (RFC 8200 §8.1). The per-message
form (an ``IPV6_RTHDR`` control message) is refused with EINVAL for type 4 on this
kernel, so the sticky option is set whenever the path changes from the last send.
Receiving a packet with an SRH needs ``seg6_enabled`` on the receiving interface; the
testbed sets it.

Flow labels (ECMP coverage, docs/srpm.md): ``send_labelled`` leases the label for the
socket once (``IPV6_FLOWLABEL_MGR``, shared with any socket that leases it toward the
same destination; Linux wants a destination in the lease, the first packet's), turns on
``IPV6_FLOWINFO_SEND`` and puts the label in the destination's ``sin6_flowinfo``. Linux
refuses to send a label the socket did not lease.

This plane needs no capture and no filter: the kernel delivers STAMP packets to the
socket, so it never answers them with ICMP port unreachable. It is the default of the
standalone tools and works with any RFC 8762 peer.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Callable, Sequence
from ipaddress import IPv4Address, IPv6Address
from typing import Any

from sixlab.dataplane import probeio
from sixlab.dataplane.base import Dataplane, DataplaneError, IPAddress, Received, full_path
from sixlab.dataplane.probeio import ProbeIO
from sixlab.wire.ipv6 import NextHeader
from sixlab.wire.srh import SegmentRoutingHeader

__all__ = ["SocketDataplane"]

# Linux values (asm-generic/socket.h, linux/in6.h, linux/in.h); the socket module lacks
# some of them.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
IPV6_RECVHOPLIMIT = getattr(socket, "IPV6_RECVHOPLIMIT", 51)
IPV6_HOPLIMIT = getattr(socket, "IPV6_HOPLIMIT", 52)
IPV6_RECVPKTINFO = getattr(socket, "IPV6_RECVPKTINFO", 49)
IPV6_PKTINFO = getattr(socket, "IPV6_PKTINFO", 50)
IPV6_RTHDR = getattr(socket, "IPV6_RTHDR", 57)
#: <linux/in6.h>: flow label manager and "send the flow label of sin6_flowinfo".
IPV6_FLOWLABEL_MGR = 32
IPV6_FLOWINFO_SEND = 33
_IPV6_FL_A_GET = 0
_IPV6_FL_F_CREATE = 1
_IPV6_FL_S_ANY = 255
IPV6_RECVTCLASS = getattr(socket, "IPV6_RECVTCLASS", 66)
IPV6_TCLASS = getattr(socket, "IPV6_TCLASS", 67)
IP_TOS = getattr(socket, "IP_TOS", 1)
IP_TTL = getattr(socket, "IP_TTL", 2)
IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)
IP_RECVTTL = getattr(socket, "IP_RECVTTL", 12)
IP_RECVTOS = getattr(socket, "IP_RECVTOS", 13)

_TIMESPEC = struct.Struct("@qq")
_INT = struct.Struct("@i")
_PKTINFO = struct.Struct("@16sI")  # struct in6_pktinfo
_IN_PKTINFO = struct.Struct("@i4s4s")  # struct in_pktinfo: ifindex, spec_dst, addr
_CMSG_SPACE = (
    socket.CMSG_SPACE(_TIMESPEC.size)
    + 2 * socket.CMSG_SPACE(_INT.size)
    + socket.CMSG_SPACE(_PKTINFO.size)
    + socket.CMSG_SPACE(_IN_PKTINFO.size)
)
#: Largest STAMP payload accepted: base packet plus TLVs within an IPv6 minimum MTU
#: would be 1232 bytes, but jumbo-frame links exist; 9000 covers them.
_MAX_PAYLOAD = 9000
#: recvmsg's flag of a datagram longer than the buffer (its payload is cut: ``Received``).
_TRUNC = socket.MSG_TRUNC
_V4_MAPPED = bytes(10) + b"\xff\xff"
_ZEROS = {4: bytes(4), 16: bytes(16)}
#: Source addresses remembered in packed form (``_source``) before the cache starts over.
_SOURCES_KEPT = 4096
#: What ``sendmsg`` needs for one destination: the routing header the socket must hold
#: (None: IPv4, none applies), the control messages, the address, and the destination.
_Route = tuple[bytes | None, list[tuple[int, int, bytes]], tuple[Any, ...], IPAddress]


def _unmap(packed: bytes) -> bytes:
    """An IPv4-mapped IPv6 address as its 4 IPv4 bytes; anything else unchanged."""
    return packed[12:] if len(packed) == 16 and packed[:12] == _V4_MAPPED else packed


def _flowlabel_request(label: int, dst: IPv6Address) -> bytes:
    """struct in6_flowlabel_req: lease ``label`` (toward ``dst``: Linux wants one, though it
    checks only the label when sending), shared with any socket."""
    return (
        dst.packed  # flr_dst
        + label.to_bytes(4, "big")  # flr_label (__be32)
        + struct.pack("=BBHHHI", _IPV6_FL_A_GET, _IPV6_FL_S_ANY, _IPV6_FL_F_CREATE, 0, 0, 0)
    )


_SOL_SOCKET = socket.SOL_SOCKET
_IPPROTO_IPV6 = socket.IPPROTO_IPV6
_IPPROTO_IP = socket.IPPROTO_IP
_timespec = _TIMESPEC.unpack_from
_int = _INT.unpack_from


def _ancillary(
    ancdata: list[tuple[int, int, bytes]], dst: bytes
) -> tuple[int, int, bytes, int | None]:
    """(receive time ns, hop limit or TTL, destination address, traffic class or TOS)
    from a datagram's control messages; ``dst`` when no packet-info message came.
    (Called once per datagram: the module's names are bound to locals above.)"""
    rx_ns = hop = 0
    tclass = None
    for level, kind, value in ancdata:
        if level == _IPPROTO_IPV6:
            if kind == IPV6_HOPLIMIT:
                hop = _int(value)[0]
            elif kind == IPV6_PKTINFO:
                dst = _unmap(_PKTINFO.unpack_from(value)[0])
            elif kind == IPV6_TCLASS:
                tclass = _int(value)[0] & 0xFF
        elif level == _SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = _timespec(value)
            rx_ns = sec * 1_000_000_000 + nsec
        elif level == _IPPROTO_IP:
            if kind == IP_TTL:
                hop = _int(value)[0]
            elif kind == IP_PKTINFO:
                dst = _IN_PKTINFO.unpack_from(value)[2]
            elif kind == IP_TOS:
                tclass = value[0]
    return rx_ns, hop, dst, tclass


class SocketDataplane(Dataplane):
    name = "socket"
    sets_tclass = True
    sets_flow_label = True
    _sock: socket.socket | None = None
    _family: socket.AddressFamily = socket.AF_INET6
    _leased: set[int]
    _srh_cache: dict[tuple[IPv6Address, ...], bytes]
    _sources: dict[str, bytes]
    _rthdr: bytes = b""  # the sticky routing header currently set on the socket

    def open(self) -> None:
        if self._sock is not None:
            return
        self._srh_cache = {}
        self._sources = {}
        self._rthdr = b""
        self._leased = set()
        source = self.config.source
        self._family = socket.AF_INET if isinstance(source, IPv4Address) else socket.AF_INET6
        sock = socket.socket(self._family, socket.SOCK_DGRAM)
        try:
            # No SO_REUSEADDR: on UDP it lets a second reflector bind the same port and
            # silently take part of the traffic. UDP has no TIME_WAIT to get around.
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            if self._family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVHOPLIMIT, 1)
                sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVPKTINFO, 1)
                sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVTCLASS, 1)
                # Dual stack only when bound to any address (module doc).
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, source is not None)
            if self._family == socket.AF_INET or source is None:
                sock.setsockopt(socket.IPPROTO_IP, IP_RECVTTL, 1)
                sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
                sock.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
            # Probe bursts must not be dropped in the socket queue: 4 MiB of buffer.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            src = str(source) if source else "::"
            sock.bind((src, self.config.port))
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise DataplaneError(
                f"socket: cannot bind UDP port {self.config.port} on "
                f"{source or '::'}: {exc.strerror}"
            ) from exc
        self._sock = sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    @property
    def local_port(self) -> int:
        """The bound port (useful when the config asked for port 0)."""
        port: int = self._socket().getsockname()[1]
        return port

    def _socket(self) -> socket.socket:
        if self._sock is None:
            raise DataplaneError("socket: data plane is not open (Init first)")
        return self._sock

    def fileno(self) -> int:
        return self._socket().fileno()

    def receive(self, max_batch: int = 64) -> list[Received]:
        recvmsg = self._socket().recvmsg
        port = self.config.port
        sources = self._sources
        out: list[Received] = []
        for _ in range(max_batch):
            try:
                data, ancdata, flags, addr = recvmsg(_MAX_PAYLOAD, _CMSG_SPACE)
            except BlockingIOError:
                break
            except OSError as exc:
                # ICMP errors queued on the socket (e.g. port unreachable from a peer that
                # is gone) surface here; they are not datagrams.
                if exc.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
                    continue
                raise
            src = sources.get(addr[0])
            if src is None:
                src = self._source(addr[0])
            rx_ns, hop, dst, tclass = _ancillary(ancdata, _ZEROS[len(src)])
            out.append(
                Received(data, src, dst, addr[1], port, hop, rx_ns, tclass, bool(flags & _TRUNC))
            )
        return out

    def probe_io(self) -> ProbeIO | None:
        """The batched probe path on this socket (``sixlab.dataplane.probeio``: sendmmsg
        and recvmmsg in C), or None when the helper cannot be built here."""
        lib = probeio.load()
        if lib is None:
            return None
        sock = self._socket()
        return ProbeIO(lib, sock.fileno(), self._family, self)

    def _source(self, text: str) -> bytes:
        """A source address as the kernel reports it, packed (IPv4-mapped ones as IPv4),
        remembered: a sender hears from few reflectors, each thousands of times."""
        if len(self._sources) >= _SOURCES_KEPT:
            self._sources.clear()
        address = text.partition("%")[0]  # without a scope id
        src = self._sources[text] = _unmap(socket.inet_pton(self._family, address))
        return src

    def send_labelled(
        self,
        payload: bytes,
        dst: IPv6Address,
        dst_port: int,
        flow_label: int,
        *,
        segments: Sequence[IPv6Address] | None = None,
        src: IPv6Address | None = None,
    ) -> None:
        if not 1 <= flow_label <= 0x7FFFF:
            raise DataplaneError(f"socket: flow label {flow_label:#x} is not in 0x1..0x7ffff")
        sock = self._socket()
        if self._family != socket.AF_INET6:
            raise DataplaneError("socket: a flow label needs IPv6 (bound to an IPv4 address)")
        if flow_label not in self._leased:
            try:
                if not self._leased:
                    sock.setsockopt(socket.IPPROTO_IPV6, IPV6_FLOWINFO_SEND, 1)
                sock.setsockopt(
                    socket.IPPROTO_IPV6, IPV6_FLOWLABEL_MGR, _flowlabel_request(flow_label, dst)
                )
            except OSError as exc:
                raise DataplaneError(
                    f"socket: the kernel refused flow label {flow_label:#x}: {exc.strerror}"
                ) from exc
            self._leased.add(flow_label)
        self.send(payload, dst, dst_port, segments=segments, src=src, flowinfo=flow_label)

    def send(
        self,
        payload: bytes,
        dst: IPAddress,
        dst_port: int,
        *,
        segments: Sequence[IPv6Address] | None = None,
        src: IPAddress | None = None,
        tclass: int | None = None,
        flowinfo: int = 0,
    ) -> None:
        route = self._route(dst, dst_port, segments, src, tclass=tclass, flowinfo=flowinfo)
        self._transmit(payload, *route)

    def sender(
        self,
        dst: IPAddress,
        dst_port: int,
        *,
        segments: Sequence[IPv6Address] | None = None,
        src: IPAddress | None = None,
    ) -> Callable[[bytes], None]:
        """``send`` with the checks, the address and the control data worked out once."""
        route = self._route(dst, dst_port, segments, src)
        transmit = self._transmit

        def send(payload: bytes) -> None:
            transmit(payload, *route)

        return send

    def _route(
        self,
        dst: IPAddress,
        dst_port: int,
        segments: Sequence[IPv6Address] | None,
        src: IPAddress | None,
        *,
        tclass: int | None = None,
        flowinfo: int = 0,
    ) -> _Route:
        """What ``sendmsg`` needs to send to ``dst`` (DataplaneError when it cannot)."""
        self._socket()
        v4 = isinstance(dst, IPv4Address)
        if src is not None and isinstance(src, IPv4Address) != v4:
            raise DataplaneError(f"socket: cannot send from {src} to {dst}")
        if v4 and self._family == socket.AF_INET6 and self.config.source is not None:
            raise DataplaneError(f"socket: bound to the IPv6 address {self.config.source}")
        if not v4 and self._family == socket.AF_INET:
            raise DataplaneError(f"socket: bound to the IPv4 address {self.config.source}")
        rthdr = self.routing_header(dst, segments)
        cmsgs = []
        if v4:
            if src is not None:
                info = _IN_PKTINFO.pack(0, src.packed, bytes(4))
                cmsgs.append((socket.IPPROTO_IP, IP_PKTINFO, info))
            if tclass is not None:
                cmsgs.append((socket.IPPROTO_IP, IP_TOS, _INT.pack(tclass)))
            where = str(dst) if self._family == socket.AF_INET else f"::ffff:{dst}"
        else:
            if src is not None:
                cmsgs.append((socket.IPPROTO_IPV6, IPV6_PKTINFO, _PKTINFO.pack(src.packed, 0)))
            if tclass is not None:
                cmsgs.append((socket.IPPROTO_IPV6, IPV6_TCLASS, _INT.pack(tclass)))
            where = str(dst)
        address = (where, dst_port, flowinfo, 0) if flowinfo else (where, dst_port)
        return rthdr, cmsgs, address, dst

    def _transmit(
        self,
        payload: bytes,
        rthdr: bytes | None,
        cmsgs: list[tuple[int, int, bytes]],
        address: tuple[Any, ...],
        dst: IPAddress,
    ) -> None:
        sock = self._socket()
        self.use_routing_header(rthdr)
        try:
            sock.sendmsg([payload], cmsgs, 0, address)
        except BlockingIOError:
            raise DataplaneError("socket: send buffer full") from None
        except OSError as exc:
            raise DataplaneError(
                f"socket: cannot send to [{dst}]:{address[1]}: {exc.strerror}"
            ) from exc

    def routing_header(
        self, dst: IPAddress, segments: Sequence[IPv6Address] | None
    ) -> bytes | None:
        """The sticky routing header a send to ``dst`` along ``segments`` needs on this
        socket: a type-4 one, ``b""`` (none: any other send's must be cleared), or None
        for an IPv4 destination, which the socket's IPv6 option does not touch."""
        if isinstance(dst, IPv4Address):
            if segments:
                raise DataplaneError(f"socket: SRv6 needs IPv6, not the IPv4 address {dst}")
            return None
        return self._srh(dst, segments) if segments else b""

    def use_routing_header(self, rthdr: bytes | None) -> None:
        """Make ``rthdr`` (``routing_header``) the socket's sticky ``IPV6_RTHDR`` unless
        it is already; every send on the socket, this plane's or ``probe_io``'s, goes
        out with it."""
        if rthdr is not None and rthdr != self._rthdr:
            try:
                self._socket().setsockopt(socket.IPPROTO_IPV6, IPV6_RTHDR, rthdr)
            except OSError as exc:
                raise DataplaneError(f"socket: the kernel refused the SRH: {exc.strerror}") from exc
            self._rthdr = rthdr

    def _srh(self, dst: IPv6Address, segments: Sequence[IPv6Address]) -> bytes:
        path = full_path(dst, segments) or (dst,)
        cached = self._srh_cache.get(path)
        if cached is None:
            # The kernel fills Next Header itself; UDP is what it will be.
            cached = SegmentRoutingHeader.from_path(path, NextHeader.UDP).encode()
            self._srh_cache[path] = cached
        return cached
