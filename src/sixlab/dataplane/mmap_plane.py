"""The ``mmap`` data plane: a TPACKET_V3 receive ring and pre-built reply templates.

This is the seed's "optimized" plane (§VI-B), done with fewer copies and system calls.

Receive
-------
An ``AF_PACKET``/``SOCK_DGRAM`` socket (the packet from its IPv6 header on, the link
header removed, so offsets are the same on every link type) with:

* the classic BPF program of ``sixlab.dataplane._filters`` (IPv6, UDP to our ports,
  directly or behind one finished Routing header such as an SRH), attached before the
  socket is bound so no unfiltered packet ever reaches the ring;
* ``PACKET_IGNORE_OUTGOING``: our own replies never come back to us;
* ``PACKET_VERSION = TPACKET_V3`` and ``PACKET_RX_RING``: the kernel writes packets into
  blocks of a ring shared with us by ``mmap``. A block is ours while its
  ``block_status`` has ``TP_STATUS_USER``; we read its packets (each a
  ``tpacket3_hdr``: ``tp_next_offset``, the RX time ``tp_sec``/``tp_nsec``, lengths,
  ``tp_net`` offset, then a ``sockaddr_ll``) and hand the block back by writing
  ``TP_STATUS_KERNEL``. No system call per packet; ``poll`` (the engine's ``select`` on
  ``fileno()``) wakes when a block is retired. ``retire_blk_tov`` = 1 ms bounds how long
  a lone packet waits in a half-filled block (the default grows with link speed and can
  reach 8+ ms, which at 1 probe/s would be pure added turnaround).

The RX timestamp is the kernel's software receive time (``PACKET_TIMESTAMP`` unset:
``CLOCK_REALTIME`` when the packet entered the stack), i.e. T2 taken before any user
space work. Packets whose link-layer type is not ``PACKET_HOST`` (promiscuous
captures, multicast) are skipped; a packet larger than the block is skipped and counted.
The UDP checksum is verified unless the kernel says it is already valid
(``TP_STATUS_CSUM_VALID``) or not yet computed (``TP_STATUS_CSUMNOTREADY``: a locally
generated packet on a checksum-offloading veth).

Send
----
A reply differs from the previous reply to the same peer only in the payload (the seed's
observation, §VI-B), so per (source, destination, port, SRv6 path, payload length) the
IPv6 [+ SRH] + UDP header is built once with ``sixlab.wire.packet.build_udp_packet``
over a zero payload, and each packet only patches the UDP checksum with RFC 1624
(``checksum_adjust`` from zeros to the payload: one sum of the payload, the header and
pseudo-header sums are in the template's checksum already). The frame goes out with one
``sendmsg`` on an ``AF_PACKET``/``SOCK_RAW`` socket as four scattered pieces (Ethernet
header, template, checksum, payload): nothing is concatenated.

The Ethernet header comes from the kernel's own tables, not from swapping the MACs of
the probe: ``RTM_GETROUTE`` for the first hop (the first segment of the return path, or
the peer) gives the output interface, the gateway and the preferred source; the
neighbour table gives the MAC. This follows the return path even when it leaves by
another interface or router than the probe came from. The answer is cached for 1 s per
first hop (a route or neighbour change is picked up within that time). When the
neighbour is not resolved yet (first packet to a peer) or the first hop is a local
address, the packet goes through an ``AF_INET6``/``IPPROTO_RAW`` socket instead (the
kernel routes it and resolves the neighbour, so the next packet takes the fast path).

Why ``sendmsg`` per reply rather than ``PACKET_TX_RING``: a TX ring saves the system
call per packet but sends only when kicked, i.e. once per batch; T3 is read when the
reply is built (RFC 8762 §4.3: as late as possible before transmission), so batching
moves the packet's departure away from T3 by up to a whole batch of Python work. One
``sendmsg`` of a 100-byte frame costs a few µs, small next to the per-packet Python
cost of the STAMP core (see ``benchmarks/bench_dataplanes.py``). ``flush`` is a no-op.

Kernel drop: the nftables table of ``sixlab.dataplane._filters.KernelDrop`` keeps the
kernel from answering our probes with ICMPv6 port unreachable (no socket is bound on
the port); it is made by ``open`` and removed by ``close`` or at exit.

``config.interface`` names the capture interface; None captures on every interface
(``ifindex`` 0) and replies leave wherever the route says.
"""

from __future__ import annotations

import contextlib
import mmap
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv6Address
from pathlib import Path
from typing import Any

from sixlab.dataplane import _filters
from sixlab.dataplane.base import Dataplane, DataplaneError, Received, register
from sixlab.wire._errors import WireError
from sixlab.wire.checksum import checksum_adjust
from sixlab.wire.packet import build_udp_packet, parse_udp_packet

__all__ = ["MmapCounters", "MmapDataplane"]

# <linux/if_packet.h>, <linux/if_ether.h>
SOL_PACKET = 263
PACKET_RX_RING = 5
PACKET_STATISTICS = 6
PACKET_VERSION = 10
PACKET_IGNORE_OUTGOING = 23
TPACKET_V3 = 2
TP_STATUS_KERNEL = 0
TP_STATUS_USER = 1
TP_STATUS_CSUMNOTREADY = 1 << 3
TP_STATUS_CSUM_VALID = 1 << 7
PACKET_HOST = 0
ETH_P_IPV6 = 0x86DD

#: Ring geometry: 16 blocks of 256 KiB (4 MiB), ~2,800 minimum-size STAMP frames each;
#: a frame may be up to a block minus its header, so jumbo probes fit too.
BLOCK_SIZE = 1 << 18
BLOCK_COUNT = 16
#: V3 still wants a frame size (a multiple of TPACKET_ALIGNMENT = 16) to size the ring.
FRAME_SIZE = 2048
#: Milliseconds before a partly filled block is handed to user space (module doc).
RETIRE_BLOCK_TOV_MS = 1

_REQ3 = struct.Struct("=7I")  # struct tpacket_req3
# struct tpacket_block_desc: version, offset_to_priv, then tpacket_hdr_v1 whose
# block_status, num_pkts and offset_to_first_pkt follow at 8, 12 and 16.
_BLOCK_STATUS = struct.Struct("=I")
_BLOCK_STATUS_OFFSET = 8
_BLOCK_PKTS = struct.Struct("=II")
_BLOCK_PKTS_OFFSET = 12
# struct tpacket3_hdr up to tp_net: next_offset, sec, nsec, snaplen, len, status, mac, net
_PKT = struct.Struct("=6I2H")
#: TPACKET_ALIGN(sizeof(struct tpacket3_hdr)): where the sockaddr_ll follows.
_SLL_OFFSET = 48
_SLL_PKTTYPE = 10  # sll_family(2) sll_protocol(2) sll_ifindex(4) sll_hatype(2) pkttype
_STATS = struct.Struct("=III")  # struct tpacket_stats_v3
#: Per-first-hop link-layer answers are trusted this long (module doc).
_NEXT_HOP_TTL_S = 1.0
#: Bound on cached reply templates; a sweep of many peers rebuilds rather than grows.
_MAX_TEMPLATES = 4096
_ETHERTYPE_IPV6 = ETH_P_IPV6.to_bytes(2, "big")
#: <linux/neighbour.h> states whose MAC can be used now.
_NUD_USABLE = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80
_RTN_LOCAL = 2
_UDP_CHECKSUM_FROM_END = 2  # the checksum is the last field of the UDP header


@dataclass(slots=True)
class MmapCounters:
    """What the ring gave us that was not a datagram for the core."""

    not_host: int = 0
    truncated: int = 0
    malformed: int = 0
    bad_checksum: int = 0
    fallback_sends: int = 0


@dataclass(frozen=True, slots=True)
class _NextHop:
    ifname: str
    ethernet: bytes  # destination MAC + our MAC + EtherType, or b"" for the L3 path
    source: bytes | None  # the route's preferred source
    expires: float


@dataclass(frozen=True, slots=True)
class _Template:
    header: bytes  # IPv6 [+ SRH] + UDP without its checksum field
    checksum: int  # the UDP checksum of the all-zero payload
    zeros: bytes


#: (source, final destination, destination port, SRv6 path in travel order, payload size)
_TemplateKey = tuple[bytes, bytes, int, tuple[IPv6Address, ...] | None, int]


def _default_hop_limit() -> int:
    try:
        return int(Path("/proc/sys/net/ipv6/conf/default/hop_limit").read_text())
    except (OSError, ValueError):
        return 64  # RFC 8200 §3 leaves it to the node; 64 is Linux's default


@register("mmap")
class MmapDataplane(Dataplane):
    _rx: socket.socket | None = None
    _tx: socket.socket | None = None
    _l3: socket.socket | None = None
    _ring: mmap.mmap | None = None
    _drop: _filters.KernelDrop | None = None
    _ipr: Any = None

    def open(self) -> None:
        if self._rx is not None:
            return
        config = self.config
        if not 0 < config.port <= 0xFFFF:
            raise DataplaneError(f"mmap: needs a fixed UDP port, got {config.port}")
        self.counters = MmapCounters()
        self._ports = tuple(sorted({config.port, *config.peer_ports}))
        self._hop_limit = _default_hop_limit()
        self._templates: dict[_TemplateKey, _Template] = {}
        self._next_hops: dict[IPv6Address, _NextHop] = {}
        self._block = 0
        self._left = 0
        self._offset = 0
        try:
            self._open_rx()
            self._tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            self._l3 = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
            self._drop = _filters.KernelDrop(config.port, self._ports, destination=config.source)
            self._drop.install()
        except (OSError, _filters.KernelDropError) as exc:
            self.close()
            raise DataplaneError(f"mmap: cannot open on {self._where()}: {exc}") from exc

    def _where(self) -> str:
        name = self.config.interface or "all interfaces"
        return f"{name}, UDP port {self.config.port}"

    def _open_rx(self) -> None:
        # Protocol 0 receives nothing until bind(): the filter and the ring are in place
        # before the first packet. Capturing everywhere has no bind with ifindex 0 in
        # Python's AF_PACKET addresses, so that socket listens from creation on (the few
        # packets queued before the ring exists stay in a queue nobody reads).
        interface = self.config.interface
        proto = 0 if interface else socket.htons(ETH_P_IPV6)
        rx = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, proto)
        self._rx = rx
        program = _filters.stamp_filter(self._ports, destination=self.config.source)
        _filters.attach_filter(rx, program)
        rx.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        rx.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V3)
        frames = BLOCK_SIZE * BLOCK_COUNT // FRAME_SIZE
        req = _REQ3.pack(BLOCK_SIZE, BLOCK_COUNT, FRAME_SIZE, frames, RETIRE_BLOCK_TOV_MS, 0, 0)
        rx.setsockopt(SOL_PACKET, PACKET_RX_RING, req)
        self._ring = mmap.mmap(
            rx.fileno(), BLOCK_SIZE * BLOCK_COUNT, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
        )
        if interface:
            rx.bind((interface, ETH_P_IPV6))
        rx.setblocking(False)

    def close(self) -> None:
        if self._drop is not None:
            with contextlib.suppress(_filters.KernelDropError):
                self._drop.remove()
            self._drop = None
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        for name in ("_rx", "_tx", "_l3"):
            sock = getattr(self, name)
            if sock is not None:
                sock.close()
                setattr(self, name, None)
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None

    def fileno(self) -> int:
        if self._rx is None:
            raise DataplaneError("mmap: data plane is not open (Init first)")
        return self._rx.fileno()

    def kernel_stats(self) -> tuple[int, int]:
        """(packets, drops) the kernel counted for the ring since the last call."""
        if self._rx is None:
            raise DataplaneError("mmap: data plane is not open (Init first)")
        packets, drops, _freeze = _STATS.unpack(
            self._rx.getsockopt(SOL_PACKET, PACKET_STATISTICS, _STATS.size)
        )
        return packets, drops

    # -- receive --------------------------------------------------------------------------

    def receive(self, max_batch: int = 64) -> list[Received]:
        ring = self._ring
        if ring is None:
            raise DataplaneError("mmap: data plane is not open (Init first)")
        out: list[Received] = []
        counters = self.counters
        while len(out) < max_batch:
            if self._left == 0:
                base = self._block * BLOCK_SIZE
                (status,) = _BLOCK_STATUS.unpack_from(ring, base + _BLOCK_STATUS_OFFSET)
                if not status & TP_STATUS_USER:
                    break
                self._left, first = _BLOCK_PKTS.unpack_from(ring, base + _BLOCK_PKTS_OFFSET)
                self._offset = base + first
                if self._left == 0:
                    self._release()
                continue
            off = self._offset
            next_offset, sec, nsec, snaplen, length, status, _mac, net = _PKT.unpack_from(ring, off)
            pkttype = ring[off + _SLL_OFFSET + _SLL_PKTTYPE]
            data = ring[off + net : off + net + snaplen]
            self._offset = off + next_offset
            self._left -= 1
            if self._left == 0:
                self._release()
            if pkttype != PACKET_HOST:
                counters.not_host += 1
                continue
            if snaplen < length:
                counters.truncated += 1
                continue
            verify = not status & (TP_STATUS_CSUM_VALID | TP_STATUS_CSUMNOTREADY)
            try:
                packet = parse_udp_packet(data, verify_checksum=verify)
            except WireError as exc:
                if "checksum" in str(exc):
                    counters.bad_checksum += 1
                else:
                    counters.malformed += 1
                continue
            udp = packet.udp
            out.append(
                Received(
                    packet.payload,
                    packet.src,
                    packet.dst,
                    udp.src_port,
                    udp.dst_port,
                    packet.hop_limit,
                    sec * 1_000_000_000 + nsec,
                )
            )
        return out

    def _release(self) -> None:
        """Hand the current block back to the kernel and move to the next one."""
        assert self._ring is not None
        _BLOCK_STATUS.pack_into(
            self._ring, self._block * BLOCK_SIZE + _BLOCK_STATUS_OFFSET, TP_STATUS_KERNEL
        )
        self._block = (self._block + 1) % BLOCK_COUNT

    # -- send -----------------------------------------------------------------------------

    def send(
        self,
        payload: bytes,
        dst: IPv6Address,
        dst_port: int,
        *,
        segments: Sequence[IPv6Address] | None = None,
        src: IPv6Address | None = None,
    ) -> None:
        tx, l3 = self._tx, self._l3
        if tx is None or l3 is None:
            raise DataplaneError("mmap: data plane is not open (Init first)")
        path = tuple(segments) if segments else None
        if path is not None and path[-1] != dst:
            path = (*path, dst)  # the final destination closes the SID list
        first_hop = path[0] if path is not None else dst
        hop = self._next_hops.get(first_hop)
        if hop is None or hop.expires < time.monotonic():
            hop = self._resolve(first_hop)
        if src is not None:
            source = src.packed
        elif self.config.source is not None:
            source = self.config.source.packed
        elif hop.source is not None:
            source = hop.source
        else:
            raise DataplaneError(f"mmap: no source address to reach {first_hop}")
        size = len(payload)
        key = (source, dst.packed, dst_port, path, size)
        template = self._templates.get(key)
        if template is None:
            template = self._template(key)
        odd = size & 1  # RFC 1071: an odd tail is summed padded with a zero byte
        checksum = checksum_adjust(
            template.checksum, template.zeros, payload + b"\0" if odd else payload, udp=True
        )
        pieces = [template.header, checksum.to_bytes(2, "big"), payload]
        try:
            if hop.ethernet:
                tx.sendmsg([hop.ethernet, *pieces], (), 0, (hop.ifname, ETH_P_IPV6))
            else:
                self.counters.fallback_sends += 1
                l3.sendmsg(pieces, (), 0, (str(first_hop), 0))
        except OSError as exc:
            self._next_hops.pop(first_hop, None)  # the route may have changed: ask again
            raise DataplaneError(f"mmap: cannot send to [{dst}]:{dst_port}: {exc}") from exc

    def _template(self, key: _TemplateKey) -> _Template:
        source, dst, dst_port, path, size = key
        zeros = bytes(size + (size & 1))
        packet = build_udp_packet(
            source,
            dst,
            self.config.port,
            dst_port,
            bytes(size),
            hop_limit=self._hop_limit,
            segments=list(path) if path is not None else None,
        )
        cut = len(packet) - size - _UDP_CHECKSUM_FROM_END
        template = _Template(
            packet[:cut], int.from_bytes(packet[cut : cut + _UDP_CHECKSUM_FROM_END]), zeros
        )
        if len(self._templates) >= _MAX_TEMPLATES:
            self._templates.clear()
        self._templates[key] = template
        return template

    def _resolve(self, first_hop: IPv6Address) -> _NextHop:
        """Output interface, Ethernet header and source for ``first_hop`` (module doc)."""
        from pyroute2 import IPRoute  # noqa: PLC0415 - netlink only when a peer is new
        from pyroute2.netlink.exceptions import NetlinkError  # noqa: PLC0415

        if self._ipr is None:
            self._ipr = IPRoute()
        ipr = self._ipr
        now = time.monotonic()
        try:
            route = ipr.route("get", dst=str(first_hop))[0]
        except NetlinkError as exc:
            raise DataplaneError(f"mmap: no route to {first_hop}: {exc}") from exc
        oif = route.get_attr("RTA_OIF")
        prefsrc = route.get_attr("RTA_PREFSRC")
        source = IPv6Address(prefsrc).packed if prefsrc else None
        ethernet = b""
        ifname = ""
        if route["type"] != _RTN_LOCAL and oif:
            ifname = socket.if_indextoname(oif)
            neighbour = route.get_attr("RTA_GATEWAY") or str(first_hop)
            try:
                entries = ipr.neigh("get", dst=neighbour, ifindex=oif)
            except NetlinkError:
                entries = []
            link = ipr.get_links(oif)[0].get_attr("IFLA_ADDRESS")
            for entry in entries:
                lladdr = entry.get_attr("NDA_LLADDR")
                if lladdr and entry["state"] & _NUD_USABLE and link:
                    ethernet = (
                        bytes.fromhex(lladdr.replace(":", ""))
                        + bytes.fromhex(link.replace(":", ""))
                        + _ETHERTYPE_IPV6
                    )
                    break
        # An unresolved neighbour is retried on the next packet (the L3 send resolves it).
        expires = now + _NEXT_HOP_TTL_S if ethernet or route["type"] == _RTN_LOCAL else now
        hop = _NextHop(ifname, ethernet, source, expires)
        self._next_hops[first_hop] = hop
        return hop
