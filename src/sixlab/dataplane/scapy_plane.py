"""The ``scapy`` data plane: the STAMP paper's "basic" implementation, the readable reference.

Receive: a packet socket (``AF_PACKET``/``SOCK_DGRAM``, bound to ``config.interface`` or
listening on every interface) with the same kernel BPF filter as the ``mmap`` plane
(``sixlab.dataplane._filters``: IPv6, UDP to our port, directly or behind an SRH), and
``PACKET_IGNORE_OUTGOING`` so the plane never sees its own replies. One ``recvmsg`` per
packet, with ``SO_TIMESTAMPNS`` for the kernel's arrival time; scapy dissects the bytes
(``IPv6`` / ``IPv6ExtHdrSegmentRouting`` / ``UDP`` / ``Raw``) and the plane reads the
fields by name. "High Performance Delay Monitoring for SRv6 Based SD-WANs" (docs/papers.md)
used scapy's ``AsyncSniffer`` with a tcpdump filter; a tcpdump
``udp port`` expression cannot see UDP behind an SRH, hence our own program.

Send: scapy builds ``IPv6 [/ IPv6ExtHdrSegmentRouting] / UDP / Raw`` (it computes the
UDP checksum over the final destination itself) and the bytes go out on an
``AF_INET6``/``SOCK_RAW``/``IPPROTO_RAW`` socket, as scapy's ``L3RawSocket6`` does: the
kernel adds the link header and routes to the first segment.

Like the ``mmap`` plane it owns no UDP socket, so it installs the same nftables drop
(``KernelDrop``) to keep the kernel from answering probes with port unreachable.

Everything is done per packet, in Python objects, on purpose: this plane is the one to
read and the baseline to measure the ``mmap`` plane against (as the paper measures its
optimized implementation against the basic one, Section VIII). Scapy is imported in
``open`` only, so the rest of sixlab never loads it.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Callable, Sequence
from ipaddress import IPv6Address
from typing import Any

from sixlab.dataplane import _filters
from sixlab.dataplane.base import (
    Dataplane,
    DataplaneError,
    IPAddress,
    Received,
    full_path,
    require_ipv6,
)
from sixlab.wire.checksum import checksum_adjust

__all__ = ["ScapyDataplane"]

SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23
PACKET_HOST = 0
ETH_P_IPV6 = 0x86DD
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@qq")
_CMSG_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)
#: Largest packet read: a 9000-byte jumbo frame's IPv6 packet.
_MAX_PACKET = 9000


class ScapyDataplane(Dataplane):
    name = "scapy"
    _rx: socket.socket | None = None
    _tx: socket.socket | None = None
    _drop: _filters.KernelDrop | None = None
    _layers: Any = None
    _restamp: Callable[[bytes], bytes] | None = None

    def set_restamp(self, restamp: Callable[[bytes], bytes]) -> None:
        self._restamp = restamp

    def open(self) -> None:
        if self._rx is not None:
            return
        config = self.config
        source = require_ipv6("scapy", config.source)
        if not 0 < config.port <= 0xFFFF:
            raise DataplaneError(f"scapy: needs a fixed UDP port, got {config.port}")
        try:
            from scapy import packet  # noqa: PLC0415
            from scapy.layers import inet, inet6  # noqa: PLC0415 - scapy stays in this module
        except ImportError as exc:
            raise DataplaneError("scapy: the scapy package is not installed") from exc
        self._layers = (inet6.IPv6, inet6.IPv6ExtHdrSegmentRouting, inet.UDP, packet.Raw)
        self._sources: dict[IPv6Address, str] = {}
        ports = sorted({config.port, *config.peer_ports})
        try:
            proto = 0 if config.interface else socket.htons(ETH_P_IPV6)
            rx = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, proto)
            self._rx = rx
            _filters.attach_filter(rx, _filters.stamp_filter(ports, destination=source))
            rx.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
            rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            if config.interface:
                rx.bind((config.interface, ETH_P_IPV6))
            rx.setblocking(False)
            self._tx = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
            self._drop = _filters.stamp_drop(config.port, ports, destination=source)
            self._drop.install()
        except (OSError, _filters.KernelDropError) as exc:
            self.close()
            where = config.interface or "all interfaces"
            raise DataplaneError(f"scapy: cannot open on {where}: {exc}") from exc

    def close(self) -> None:
        if self._drop is not None:
            with contextlib.suppress(_filters.KernelDropError):
                self._drop.remove()
            self._drop = None
        for name in ("_rx", "_tx"):
            sock = getattr(self, name)
            if sock is not None:
                sock.close()
                setattr(self, name, None)

    def fileno(self) -> int:
        if self._rx is None:
            raise DataplaneError("scapy: data plane is not open (Init first)")
        return self._rx.fileno()

    def receive(self, max_batch: int = 64) -> list[Received]:
        rx = self._rx
        if rx is None:
            raise DataplaneError("scapy: data plane is not open (Init first)")
        ipv6, srh_layer, udp_layer, _raw = self._layers
        out: list[Received] = []
        for _ in range(max_batch):
            try:
                data, ancdata, flags, addr = rx.recvmsg(_MAX_PACKET, _CMSG_SPACE)
            except BlockingIOError:
                break
            if addr[2] != PACKET_HOST:  # (ifname, proto, pkttype, hatype, mac)
                continue
            rx_ns = 0
            for level, kind, value in ancdata:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    sec, nsec = _TIMESPEC.unpack_from(value)
                    rx_ns = sec * 1_000_000_000 + nsec
            packet = ipv6(data)
            if udp_layer not in packet:
                continue
            if srh_layer in packet and packet[srh_layer].segleft != 0:
                continue  # still travelling (the filter already refuses these)
            udp = packet[udp_layer]
            out.append(
                Received(
                    payload=bytes(udp.payload),
                    src=socket.inet_pton(socket.AF_INET6, packet.src),
                    dst=socket.inet_pton(socket.AF_INET6, packet.dst),
                    src_port=udp.sport,
                    dst_port=udp.dport,
                    hop_limit=packet.hlim,
                    rx_ns=rx_ns,
                    truncated=bool(flags & socket.MSG_TRUNC),  # the frame was cut
                )
            )
        return out

    def send(
        self,
        payload: bytes,
        dst: IPAddress,
        dst_port: int,
        *,
        segments: Sequence[IPv6Address] | None = None,
        src: IPAddress | None = None,
        tclass: int | None = None,
    ) -> None:
        del tclass  # not applied: ``sets_tclass`` is False
        dst6 = require_ipv6("scapy", dst)
        assert dst6 is not None
        dst, src = dst6, require_ipv6("scapy", src)
        tx = self._tx
        if tx is None:
            raise DataplaneError("scapy: data plane is not open (Init first)")
        ipv6, srh_layer, udp_layer, raw = self._layers
        path = full_path(dst, segments) or ()
        first_hop = path[0] if path else dst
        source = src or self.config.source
        packet = ipv6(src=str(source) if source else self._source(first_hop), dst=str(first_hop))
        if path:
            # SRH wire order: Segment List[0] is the final destination (RFC 8754 §2).
            packet /= srh_layer(
                addresses=[str(a) for a in reversed(path)],
                segleft=len(path) - 1,
                lastentry=len(path) - 1,
            )
        packet /= udp_layer(sport=self.config.port, dport=dst_port) / raw(payload)
        frame = bytes(packet)  # scapy's build: slow, so T3 is read again after it
        if self._restamp is not None:
            frame = _restamped(frame, payload, self._restamp(payload))
        try:
            tx.sendto(frame, (str(first_hop), 0))
        except OSError as exc:
            raise DataplaneError(f"scapy: cannot send to [{dst}]:{dst_port}: {exc}") from exc

    def _source(self, first_hop: IPv6Address) -> str:
        """The kernel's source address choice towards ``first_hop`` (a raw IPv6 header
        must carry one): the address a connected UDP socket gets."""
        source = self._sources.get(first_hop)
        if source is None:
            with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
                probe.connect((str(first_hop), 9))  # no packet is sent by connect
                source = str(probe.getsockname()[0])
            self._sources[first_hop] = source
        return source


def _restamped(frame: bytes, old: bytes, new: bytes) -> bytes:
    """``frame`` (IPv6 ... UDP, ``old`` as its payload) carrying ``new`` instead, its UDP
    checksum updated incrementally (RFC 1624): only T3 (and an HMAC) changed."""
    if new == old:
        return frame
    start = len(frame) - len(old)
    pad = b"\0" * (len(old) % 2)  # the checksum pads an odd payload with a zero byte
    csum_at = start - 2  # UDP checksum: the last field of the header before the payload
    checksum = int.from_bytes(frame[csum_at:start])
    checksum = checksum_adjust(checksum, old + pad, new + pad, udp=True)
    return frame[:csum_at] + checksum.to_bytes(2) + new
