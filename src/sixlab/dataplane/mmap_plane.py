"""The ``mmap`` data plane: a TPACKET_V3 receive ring and pre-built reply templates.

This is the "optimized" implementation of "High Performance Delay Monitoring for SRv6
Based SD-WANs" (docs/papers.md), done with fewer copies and system calls.

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
  ``fileno()``) wakes when a block is retired. The ring is the shared
  :class:`sixlab.linux.packetring.PacketRing`, read with its one walk
  (``PacketRing.records``: a plain tuple per packet, no object); a call that finds no
  block clears the socket's error, which the kernel sets when the link goes down and
  which would otherwise keep ``select`` waking, and resyncs a cursor that lost its place.
  ``retire_blk_tov`` = 1 ms bounds how long a lone packet waits in a half-filled block
  (the default grows with link speed and can reach 8+ ms, which at 1 probe/s would be
  pure added turnaround).

The RX timestamp is the kernel's software receive time (``PACKET_TIMESTAMP`` unset:
``CLOCK_REALTIME`` when the packet entered the stack), i.e. T2 taken before any user
space work. Packets whose link-layer type is not ``PACKET_HOST`` (promiscuous
captures, multicast) are skipped; a packet larger than the block is skipped and counted.
The UDP checksum is verified unless the kernel says it is already valid
(``TP_STATUS_CSUM_VALID``) or not yet computed (``TP_STATUS_CSUMNOTREADY``: a locally
generated packet on a checksum-offloading veth).

Send
----
A reply differs from the previous reply to the same peer only in the payload (the STAMP
paper's observation), so per (source, destination, port, SRv6 path, payload length) the
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

``send`` (the general path) uses one ``sendmsg`` per reply, so the packet leaves right
after T3 is read (RFC 8762 §4.3: as late as possible before transmission).

The route and neighbour tables are those of the namespace the plane was opened in:
netlink is opened there and every lookup re-enters it, since the engine's thread (or a
caller of ``send``) may be in another (an agent serving a lab node, a test).

Traffic Class (``sets_tclass``): every received packet's Traffic Class reaches the
reflector core, and ``send`` writes its ``tclass`` into the IPv6 header (the templates
are cached per Traffic Class too), so a Class of Service TLV (RFC 8972 §4.4) is
answered as on the ``socket`` plane: DSCP2/ECN from the probe, the reply sent with
DSCP1, RP 0. Such probes take the general path (the fast path takes Extra Padding only);
every other reply carries Traffic Class 0.

Fast path (reflector)
---------------------
``reflect_batch`` is what ``ReflectorEngine`` calls on this plane: it reads packets off
the RX ring and answers from them, into a ``PACKET_TX_RING`` (TPACKET_V2, qdisc
bypassed, bound to ``config.interface``), the probes of an SRv6 network as well as plain
ones: IPv6/UDP directly or behind a Segment Routing Header at Segments Left 0 (any
number of segments, RFC 8754), a UDP payload of at most ``FAST_MAX_PAYLOAD`` bytes whose
TLVs, if any, are Extra Padding (RFC 8972 §4.1), a UDP checksum that verifies when the
kernel has not vouched for it (the pseudo-header's words plus the datagram's, mod
0xFFFF, in one big-integer sum). The reflector core answers the payload; the reply goes
back to the probe's source along the session's return SID list (the STAMP paper's
configured return path, a new SRH) or straight back. There are no per-packet objects
but the frame: its head (Ethernet + IPv6 [+ SRH] + UDP up to the checksum) is cached
per (probe addresses and ports, session return path) with the one's-complement sum of
its pseudo-header and header, so the checksum is one big-integer sum of the payload
(RFC 1624's incremental update from an all-zero payload).

Everything else (authentication, TLVs other than Extra Padding, a Return Path TLV that
names another address, an SRH with segments left, a bad or unfinished checksum, an
unresolved neighbour, a return path that leaves by another interface, capture on every
interface) comes back to the engine as ``Received`` and takes the general path; the
``fast_replies`` counter tells how many replies took the ring.

The ring is kicked (one ``send`` system call) every ``tx_batch`` frames and at the end
of every ``reflect_batch`` call. Why a ring and not one ``send`` per reply: on a veth
each transmit call that wakes the peer's CPU costs an inter-processor interrupt, a VM
exit here; the PDR of this plane was 43 kpps with a ``send`` per reply and about three
times that with the ring (``benchmarks/README.md``). Trade-off: under load a reply's
departure trails its T3 by up to one batch of work (64 replies, some 100-300 µs here);
at probe rates a batch is one packet and the kick follows at once. Lower ``tx_batch``
(or the engine's ``fast_batch``) for tighter T3, or turn the fast path off
(``ReflectorEngine(fast_path=False)``) for a ``sendmsg`` right after each T3.

Our ring cursor must stay the kernel's: ``tpacket_snd`` stops at the first frame that is
not SEND_REQUEST, and after a failed transmit it may leave its head on a frame it has
already released, so every later kick sends nothing until we wrap around, then frames
written a whole ring earlier (seen in the PDR bench after an overload: replies of probes
long gone, 2 of 199 on time). ``_kick`` therefore checks that the last frame written has
left; if not, the ring is replaced (``tx_ring_resets``), its unsent frames counted in
``tx_errors``.

Kernel drop: the nftables table of ``sixlab.dataplane._filters.stamp_drop`` keeps the
kernel from answering our probes with ICMPv6 port unreachable (no socket is bound on
the port); it is made by ``open`` and removed by ``close`` or at exit.

``config.interface`` names the capture interface; None captures on every interface
(``ifindex`` 0) and replies leave wherever the route says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from ipaddress import IPv6Address
from pathlib import Path
from typing import Any

from sixlab.dataplane import _filters
from sixlab.dataplane._nexthop import NextHop as _NextHop
from sixlab.dataplane._nexthop import resolve_next_hop
from sixlab.dataplane.base import (
    Dataplane,
    DataplaneError,
    FastBatch,
    FastRoute,
    IPAddress,
    Received,
    ReflectFn,
    full_path,
    require_ipv6,
)
from sixlab.dataplane.xdp_plane import _in_netns
from sixlab.linux.packetring import (
    ETH_P_IPV6,
    TP_STATUS_CSUM_VALID,
    TP_STATUS_CSUMNOTREADY,
    PacketRing,
    RingGeometry,
)
from sixlab.wire import ChecksumError, WireError
from sixlab.wire.checksum import checksum_adjust
from sixlab.wire.packet import build_udp_packet, parse_udp_packet

__all__ = ["MmapCounters", "MmapDataplane"]

SOL_PACKET = 263
PACKET_VERSION = 10
PACKET_HOST = 0

#: Ring geometry: 256 blocks of 64 KiB (16 MiB). A block is handed over when full or
#: after RETIRE_BLOCK_TOV_MS, so at low rates each block holds a few packets and the
#: ring's depth in *time* is about BLOCK_COUNT ms: 256 blocks ride out a 1/4 s stall of
#: the Python process (GC, scheduling) at any rate; 16 blocks lost packets at 10 kpps.
#: At full rate a block holds ~370 minimum-size STAMP frames (~94,000 in the ring); a
#: frame may be up to a block minus its header, so jumbo probes fit too.
BLOCK_SIZE = 1 << 16
BLOCK_COUNT = 256
#: V3 still wants a frame size (a multiple of TPACKET_ALIGNMENT = 16) to size the ring.
FRAME_SIZE = 2048
#: Milliseconds before a partly filled block is handed to user space (module doc).
RETIRE_BLOCK_TOV_MS = 1
_GEOMETRY = RingGeometry(BLOCK_SIZE, BLOCK_COUNT, FRAME_SIZE, RETIRE_BLOCK_TOV_MS)
#: Bound on cached reply templates; a sweep of many peers rebuilds rather than grows.
_MAX_TEMPLATES = 4096
_UDP_CHECKSUM_FROM_END = 2  # the checksum is the last field of the UDP header

PACKET_QDISC_BYPASS = 20  # <linux/if_packet.h>
# TX ring, <linux/if_packet.h>: TPACKET_V2 frames (V3 TX rings are frame-based anyway).
PACKET_TX_RING = 13
TPACKET_V2 = 1
TP_STATUS_SEND_REQUEST = 1
TP_STATUS_SENDING = 2
#: 512 frames of 2 KiB (1 MiB): eight full batches of 64 may wait for the kernel.
TX_FRAME_SIZE = 2048
TX_BLOCK_SIZE = 1 << 16
TX_FRAME_COUNT = 512
_TX_REQ = struct.Struct("=4I")  # struct tpacket_req: block size/count, frame size/count
_TX_HEADER = struct.Struct("=III")  # tpacket2_hdr: tp_status, tp_len, tp_snaplen
#: TPACKET2_HDRLEN - sizeof(struct sockaddr_ll): where the kernel reads a TX frame.
_TX_DATA_OFFSET = 32
#: Default frames per TX ring kick (module doc, "Fast path": bounds T3 skew).
DEFAULT_TX_BATCH = 64


# Fast path: offsets in an IPv6 packet (RFC 8200 §3), its SRH (RFC 8754 §2), UDP (RFC 768).
_HOP_LIMIT = 7
_NEXT_HEADER = 6
_ADDRS = 8  # source, then destination; they end at 40
_IPV6_HEADER = 40
_IPPROTO_UDP = 17
_IPPROTO_ROUTING = 43
_SRH_TYPE = 4  # RFC 8754 §2: Routing Type 4
# Inside a Routing header at 40: Next Header, Hdr Ext Len, Routing Type, Segments Left.
_RH_NEXT_HEADER = 40
_RH_LENGTH = 41
_RH_TYPE = 42
_RH_SEGMENTS_LEFT = 43
_UDP_HEADER = 8
_STAMP_BASE = 44  # RFC 8762 §4.2.1 unauthenticated base packet
_TLV_EXTRA_PADDING = 1  # RFC 8972 §4.1
#: Largest probe the fast path takes: the reply frame (Ethernet + IPv6 + return SRH + UDP
#: + the same payload) must fit a TX ring frame; larger ones take the general path.
FAST_MAX_PAYLOAD = 1400
_CSUM_TRUSTED = TP_STATUS_CSUM_VALID | TP_STATUS_CSUMNOTREADY


@dataclass(slots=True)
class MmapCounters:
    """What the ring gave us that was not a datagram for the core."""

    not_host: int = 0
    truncated: int = 0
    malformed: int = 0
    bad_checksum: int = 0
    fallback_sends: int = 0
    tx_errors: int = 0
    tx_ring_resets: int = 0
    #: Replies the fast path wrote into the TX ring (module doc, "Fast path").
    fast_replies: int = 0


@dataclass(frozen=True, slots=True)
class _FastTemplate:
    prefix: bytes  # Ethernet + IPv6 + UDP header up to its checksum
    header_sum: int  # one's-complement sum (mod 0xFFFF) of pseudo-header and UDP header
    size: int  # the payload size it was built for (the UDP length is in it)
    expires: float  # the next hop's answer is trusted until then
    route: FastRoute  # the return path it follows (the session's, compared by identity)


@dataclass(frozen=True, slots=True)
class _Template:
    header: bytes  # IPv6 [+ SRH] + UDP without its checksum field
    checksum: int  # the UDP checksum of the all-zero payload
    zeros: bytes


#: (source, final destination, destination port, SRv6 path in travel order, payload size,
#: Traffic Class)
_TemplateKey = tuple[bytes, bytes, int, tuple[IPv6Address, ...] | None, int, int]


def _fast_udp(data: bytes, snaplen: int, verify: bool) -> int:
    """Offset of the UDP header of a probe the fast path answers, or 0 (general path).

    Fast: IPv6 whose Next Header is UDP, or a Segment Routing Header at Segments Left 0
    (RFC 8754 §4.3.1: the packet has reached its last segment, which is the Destination
    Address) followed by UDP; Payload Length and UDP Length agree with the packet; a UDP
    payload of at most ``FAST_MAX_PAYLOAD`` bytes whose TLVs, if any, are all Extra
    Padding (RFC 8972 §4.1: the others may need the packet's addresses or choose another
    return path); and, if ``verify``, a UDP checksum that verifies (RFC 8200 §8.1: over
    the pseudo-header of the final destination, which here is the Destination Address).
    """
    if snaplen < _IPV6_HEADER + _UDP_HEADER:
        return 0
    nh = data[_NEXT_HEADER]
    if nh == _IPPROTO_UDP:
        udp = _IPV6_HEADER
    elif (
        nh == _IPPROTO_ROUTING
        and data[_RH_TYPE] == _SRH_TYPE
        and data[_RH_SEGMENTS_LEFT] == 0
        and data[_RH_NEXT_HEADER] == _IPPROTO_UDP
    ):
        udp = _IPV6_HEADER + (data[_RH_LENGTH] + 1) * 8
    else:
        return 0
    ulen = snaplen - udp
    if (
        not _UDP_HEADER <= ulen <= _UDP_HEADER + FAST_MAX_PAYLOAD
        or (data[4] << 8 | data[5]) != snaplen - _IPV6_HEADER
        or (data[udp + 4] << 8 | data[udp + 5]) != ulen
    ):
        return 0
    # The TLV area: Flags, Type, Length (2), Value (RFC 8972 §4). Every TLV must be
    # Extra Padding and end inside the packet, the last one at its end; a TLV that runs
    # past the end goes to the core, which marks it (M).
    base = udp + _UDP_HEADER + _STAMP_BASE
    pos = base
    while pos + 4 <= snaplen and data[pos + 1] == _TLV_EXTRA_PADDING:
        pos += 4 + (data[pos + 2] << 8 | data[pos + 3])
    if pos != snaplen and snaplen > base:
        return 0
    # A zero checksum is invalid over IPv6 (RFC 8200 §8.1). Otherwise the words of the
    # pseudo-header and the datagram must sum to -0; mod 0xFFFF (2**16 = 1) that is 0.
    # An odd datagram is summed padded with a zero byte.
    if verify and (
        data[udp + 6] == data[udp + 7] == 0
        or (
            int.from_bytes(data[_ADDRS:_IPV6_HEADER], "big")
            + int.from_bytes(data[udp:] + b"\0" if ulen & 1 else data[udp:], "big")
            + ulen
            + _IPPROTO_UDP
        )
        % 0xFFFF
    ):
        return 0
    return udp


def _default_hop_limit() -> int:
    try:
        return int(Path("/proc/sys/net/ipv6/conf/default/hop_limit").read_text())
    except (OSError, ValueError):
        return 64  # RFC 8200 §3 leaves it to the node; 64 is Linux's default


class MmapDataplane(Dataplane):
    name = "mmap"
    has_fast_path = True
    sets_tclass = True
    _rx: socket.socket | None = None
    _tx: socket.socket | None = None
    _l3: socket.socket | None = None
    _ring: mmap.mmap | None = None
    _rxring: PacketRing | None = None
    #: The ring's cumulated (packets, drops) at the last ``kernel_stats`` call.
    _stats_seen: tuple[int, int] = (0, 0)
    _txs: socket.socket | None = None
    _txr: mmap.mmap | None = None
    #: Frames written to the TX ring between two kicks (module doc, "Fast path").
    tx_batch: int = DEFAULT_TX_BATCH
    _drop: _filters.KernelDrop | None = None
    _ipr: Any = None
    #: The network namespace of ``open`` (an fd): where next hops are looked up.
    _netns: int | None = None

    def open(self) -> None:
        if self._rx is not None:
            return
        config = self.config
        source = require_ipv6("mmap", config.source)
        if not 0 < config.port <= 0xFFFF:
            raise DataplaneError(f"mmap: needs a fixed UDP port, got {config.port}")
        self.stats = MmapCounters()
        self._ports = tuple(sorted({config.port, *config.peer_ports}))
        self._hop_limit = _default_hop_limit()
        self._templates: dict[_TemplateKey, _Template] = {}
        self._next_hops: dict[IPv6Address, _NextHop] = {}
        self._fast_templates: dict[bytes, _FastTemplate] = {}
        self._tx_slot = 0
        # Netlink now, not on the first packet (a ~100 ms stall under load), and in the
        # namespace of ``open``: the engine's thread, or a caller's, may be elsewhere.
        import pyroute2  # noqa: PLC0415

        try:
            self._netns = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            self._ipr = pyroute2.IPRoute()
            self._open_rx()
            self._open_tx_ring()
            self._tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            self._l3 = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
            self._drop = _filters.stamp_drop(config.port, self._ports, destination=source)
            self._drop.install()
        except (OSError, _filters.KernelDropError) as exc:
            self.close()
            raise DataplaneError(f"mmap: cannot open on {self._where()}: {exc}") from exc

    def _where(self) -> str:
        name = self.config.interface or "all interfaces"
        return f"{name}, UDP port {self.config.port}"

    def _open_rx(self) -> None:
        # Bound to an interface, the ring's socket receives nothing until its filter
        # and ring are in place. Capturing everywhere has no bind with ifindex 0 in
        # Python's AF_PACKET addresses, so that socket listens from creation on (the
        # few packets queued before the ring exists stay in a queue nobody reads).
        program = _filters.stamp_filter(
            self._ports, destination=require_ipv6("mmap", self.config.source)
        )
        ring = PacketRing(
            self.config.interface or None,
            protocol=ETH_P_IPV6,
            program=program,
            geometry=_GEOMETRY,
            cooked=True,
        )
        self._rxring, self._rx, self._ring = ring, ring.sock, ring.map
        self._stats_seen = (0, 0)

    def _open_tx_ring(self) -> None:
        """A TPACKET_V2 TX ring on the capture interface (none when capturing everywhere).

        Bound with protocol 0, so the socket receives nothing; the qdisc is bypassed
        (the reply leaves as the driver takes it, as ``sendmsg`` on a noqueue veth does).
        """
        interface = self.config.interface
        if not interface:
            return
        txs = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        self._txs = txs
        txs.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V2)
        with contextlib.suppress(OSError):  # an optimisation only
            txs.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
        blocks = TX_FRAME_SIZE * TX_FRAME_COUNT // TX_BLOCK_SIZE
        req = _TX_REQ.pack(TX_BLOCK_SIZE, blocks, TX_FRAME_SIZE, TX_FRAME_COUNT)
        txs.setsockopt(SOL_PACKET, PACKET_TX_RING, req)
        self._txr = mmap.mmap(
            txs.fileno(), TX_FRAME_SIZE * TX_FRAME_COUNT, mmap.MAP_SHARED,
            mmap.PROT_READ | mmap.PROT_WRITE,
        )  # fmt: skip
        txs.bind((interface, 0))
        self._tx_slot = 0

    def _close_tx_ring(self) -> None:
        if self._txr is not None:
            self._txr.close()
            self._txr = None
        if self._txs is not None:
            self._txs.close()
            self._txs = None

    def close(self) -> None:
        if self._drop is not None:
            with contextlib.suppress(_filters.KernelDropError):
                self._drop.remove()
            self._drop = None
        if self._rxring is not None:
            self._rxring.close()
            self._rxring = self._ring = self._rx = None
        self._close_tx_ring()
        for name in ("_rx", "_tx", "_l3"):
            sock = getattr(self, name)
            if sock is not None:
                sock.close()
                setattr(self, name, None)
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None
        if self._netns is not None:
            os.close(self._netns)
            self._netns = None

    def fileno(self) -> int:
        if self._rx is None:
            raise DataplaneError("mmap: data plane is not open (Init first)")
        return self._rx.fileno()

    def counters(self) -> dict[str, int]:
        """``MmapCounters`` by field name: what the ring gave that the engine never saw,
        and how often a reply took the kernel's route or the device refused a frame."""
        stats = getattr(self, "stats", None)
        if stats is None:
            return {}
        out = dataclasses.asdict(stats)
        if self._rxring is not None:  # cursor moves of the RX ring (PacketRing.resync)
            out["rx_ring_resyncs"] = self._rxring.resyncs
        return out

    def kernel_stats(self) -> tuple[int, int]:
        """(packets, drops) the kernel counted for the ring since the last call."""
        if self._rxring is None:
            raise DataplaneError("mmap: data plane is not open (Init first)")
        packets, drops = self._rxring.statistics()
        seen_packets, seen_drops = self._stats_seen
        self._stats_seen = (packets, drops)
        return packets - seen_packets, drops - seen_drops

    # -- receive --------------------------------------------------------------------------

    def receive(self, max_batch: int = 64) -> list[Received]:
        rxr = self._rxring
        if rxr is None:
            raise DataplaneError("mmap: data plane is not open (Init first)")
        decode = self._decode
        out: list[Received] = []
        # Up to max_batch datagrams: packets the ring gave that are not ours (counted in
        # _decode) do not shorten the batch, which the engine reads as "drained".
        want = max_batch
        while want > 0:
            taken = 0
            for data, rx_ns, length, snaplen, status, pkttype, _gso in rxr.records(want):
                taken += 1
                rx = decode(
                    data, rx_ns, snaplen=snaplen, length=length, status=status, pkttype=pkttype
                )
                if rx is not None:
                    out.append(rx)
            if taken < want:  # the ring has no more
                break
            want = max_batch - len(out)
        return out

    def _decode(
        self, data: bytes, rx_ns: int, *, snaplen: int, length: int, status: int, pkttype: int
    ) -> Received | None:
        """One ring packet as a ``Received``, or None (counted) if it is not one for us."""
        counters = self.stats
        if pkttype != PACKET_HOST:
            counters.not_host += 1
            return None
        if snaplen < length:
            counters.truncated += 1
            return None
        verify = not status & (TP_STATUS_CSUM_VALID | TP_STATUS_CSUMNOTREADY)
        try:
            packet = parse_udp_packet(data, verify_checksum=verify)
        except ChecksumError:
            counters.bad_checksum += 1
            return None
        except WireError:
            counters.malformed += 1
            return None
        udp = packet.udp
        return Received(
            packet.payload,
            packet.src,
            packet.dst,
            udp.src_port,
            udp.dst_port,
            packet.hop_limit,
            rx_ns,
            packet.traffic_class,
        )

    # -- reflector fast path ----------------------------------------------------------------

    def reflect_batch(  # noqa: PLR0912, PLR0915 - the hand-inlined hot loop: a call per packet costs as much as the reply
        self, reflect: ReflectFn, clock: Callable[[], int], max_batch: int = 64
    ) -> FastBatch:
        """Answer up to ``max_batch`` ring packets with ``reflect`` (module doc, "Fast path").

        ``reflect(payload, rx_ns, clock, hop_limit, flow=...)`` is the reflector core.
        Probes that ``_fast_udp`` accepts (plain or behind an SRH at Segments Left 0, a
        verified UDP checksum, no TLV but Extra Padding) are answered here when the
        reply goes back to their source, along the session's return SID list or none;
        every other packet is returned in ``FastBatch.slow`` for the caller's general
        path, in arrival order among them.
        """
        rxr = self._rxring
        if rxr is None:
            raise DataplaneError("mmap: data plane is not open (Init first)")
        slow: list[Received] = []
        consumed = handled = failed = pending = 0
        now = time.monotonic()
        templates = self._fast_templates
        txr = self._txr
        tx_header = _TX_HEADER.pack_into
        tx_batch = self.tx_batch
        fast_udp = _fast_udp
        stats = self.stats
        # The TX cursor lives in a local for the loop (attribute writes per packet cost
        # a tenth of it) and goes back to the object when it ends; the RX ring's walk
        # keeps its own cursor the same way (PacketRing.records).
        tx_slot = self._tx_slot
        for data, rx_ns, length, snaplen, status, pkttype, _gso in rxr.records(max_batch):
            consumed += 1
            udp = (
                fast_udp(data, snaplen, not status & _CSUM_TRUSTED)
                if pkttype == PACKET_HOST and snaplen == length
                else 0
            )
            if not udp:
                rx = self._decode(
                    data, rx_ns, snaplen=snaplen, length=length, status=status, pkttype=pkttype
                )
                if rx is not None:
                    slow.append(rx)
                continue
            handled += 1
            # The addresses and ports: the reflector's flow key (Received.flow's layout)
            # and the reply template's.
            key = data[_ADDRS:_IPV6_HEADER] + data[udp : udp + 4]
            out = reflect(data[udp + _UDP_HEADER :], rx_ns, clock, data[_HOP_LIMIT], flow=key)
            if out is None:
                continue
            payload = out.payload
            route = out.return_path
            if txr is None or route.address is not None:
                failed += self._send_general(data, udp, payload, route)
                continue
            size = len(payload)
            template = templates.get(key)
            if (
                template is None
                or template.expires < now
                or template.size != size
                or template.route is not route
            ):
                template = self._fast_template(key, size, now, route)
                if template is None:
                    failed += self._send_general(data, udp, payload, route)
                    continue
            total = template.header_sum + int.from_bytes(
                payload + b"\0" if size & 1 else payload, "big"
            )
            # One's-complement sum mod 0xFFFF (2**16 = 1 mod 0xFFFF): 0..0xFFFE, so the
            # checksum 0xFFFF - sum is never 0 (RFC 768: a computed 0 is sent as 0xFFFF).
            frame = template.prefix + (0xFFFF - total % 0xFFFF).to_bytes(2, "big") + payload
            slot = tx_slot * TX_FRAME_SIZE
            if txr[slot] & (TP_STATUS_SEND_REQUEST | TP_STATUS_SENDING):
                if pending:  # the ring is full: push it out and look again
                    self._tx_slot = tx_slot
                    self._kick()
                    pending = 0
                    tx_slot, txr = self._tx_slot, self._txr
                    slot = tx_slot * TX_FRAME_SIZE
                if txr is None or txr[slot] & (TP_STATUS_SEND_REQUEST | TP_STATUS_SENDING):
                    failed += self._send_general(data, udp, payload, route)
                    continue
            flen = len(frame)
            txr[slot + _TX_DATA_OFFSET : slot + _TX_DATA_OFFSET + flen] = frame
            # Status, length and snap length in one write: the kernel reads TX frames
            # only inside our own kick below, so there is no ordering to keep.
            tx_header(txr, slot, TP_STATUS_SEND_REQUEST, flen, flen)
            tx_slot = (tx_slot + 1) % TX_FRAME_COUNT
            pending += 1
            stats.fast_replies += 1
            if pending >= tx_batch:
                self._tx_slot = tx_slot
                self._kick()
                pending = 0
                tx_slot, txr = self._tx_slot, self._txr
        self._tx_slot = tx_slot
        if pending:
            self._kick()
        return FastBatch(consumed, handled, failed, slow)

    def _send_general(self, data: bytes, udp: int, payload: bytes, route: FastRoute) -> int:
        """The reply by ``send`` (addresses from the probe); 1 if it failed, else 0."""
        dst = route.address if route.address is not None else IPv6Address(data[8:24])
        if not isinstance(dst, IPv6Address):
            return 1  # an IPv4 return address on an IPv6 plane
        src = data[24:40]
        port = int.from_bytes(data[udp : udp + 2], "big")
        try:
            self.send(payload, dst, port, segments=route.segments, src=IPv6Address(src))
        except DataplaneError:
            return 1
        return 0

    def _fast_template(
        self, key: bytes, size: int, now: float, route: FastRoute
    ) -> _FastTemplate | None:
        """The frame head of replies to the probe addresses and ports in ``key``, along
        ``route``'s SID list (None: straight back)."""
        peer = IPv6Address(key[:16])
        path = full_path(peer, route.segments)
        first_hop = path[0] if path is not None else peer
        hop = self._next_hops.get(first_hop)
        if hop is None or hop.expires < now:
            hop = self._resolve(first_hop)
        if not hop.ethernet or hop.ifname != self.config.interface:
            return None  # not resolved yet, or leaves by another interface: general path
        # From the address the probe was sent to, as the engine's general path does.
        packet = build_udp_packet(
            key[16:32],
            key[:16],
            self.config.port,
            int.from_bytes(key[32:34], "big"),
            bytes(size),
            hop_limit=self._hop_limit,
            segments=list(path) if path is not None else None,
        )
        cut = len(packet) - size - _UDP_CHECKSUM_FROM_END
        if len(hop.ethernet) + len(packet) > TX_FRAME_SIZE - _TX_DATA_OFFSET:
            return None  # larger than a TX ring frame
        zero_sum = 0xFFFF - int.from_bytes(packet[cut : cut + _UDP_CHECKSUM_FROM_END], "big")
        template = _FastTemplate(hop.ethernet + packet[:cut], zero_sum, size, hop.expires, route)
        if len(self._fast_templates) >= _MAX_TEMPLATES:
            self._fast_templates.clear()
        self._fast_templates[key] = template
        return template

    def _kick(self) -> None:
        """Send every frame marked in the TX ring (one system call), and check that the
        kernel's cursor is still ours (module doc, "Fast path"): after a kick on this
        thread, the frame before ``_tx_slot`` must have left (it is AVAILABLE, or SENDING
        until a real NIC completes it). If it is still SEND_REQUEST the kernel stopped
        short, and may never step past the frame it stopped at: the ring is replaced and
        the frames still in it are counted as lost."""
        txs, txr = self._txs, self._txr
        assert txs is not None
        assert txr is not None
        try:
            txs.send(b"", socket.MSG_DONTWAIT)
        except OSError:
            self.stats.tx_errors += 1  # ENOBUFS: the device dropped a frame
        last = (self._tx_slot - 1) % TX_FRAME_COUNT * TX_FRAME_SIZE
        if txr[last] & TP_STATUS_SEND_REQUEST:
            self.stats.tx_ring_resets += 1
            self.stats.tx_errors += sum(
                bool(txr[i * TX_FRAME_SIZE] & TP_STATUS_SEND_REQUEST) for i in range(TX_FRAME_COUNT)
            )
            self._close_tx_ring()
            with contextlib.suppress(OSError):  # without a ring, replies take ``send``
                self._open_tx_ring()

    # -- send -----------------------------------------------------------------------------

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
        dst6 = require_ipv6("mmap", dst)
        assert dst6 is not None
        dst, src = dst6, require_ipv6("mmap", src)
        tx, l3 = self._tx, self._l3
        if tx is None or l3 is None:
            raise DataplaneError("mmap: data plane is not open (Init first)")
        path = full_path(dst, segments)
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
        key = (source, dst.packed, dst_port, path, size, tclass or 0)
        template = self._templates.get(key)
        if template is None:
            try:
                template = self._template(key)
            except WireError as exc:
                raise DataplaneError(f"mmap: cannot send to [{dst}]:{dst_port}: {exc}") from exc
        odd = size & 1  # RFC 1071: an odd tail is summed padded with a zero byte
        checksum = checksum_adjust(
            template.checksum, template.zeros, payload + b"\0" if odd else payload, udp=True
        )
        pieces = [template.header, checksum.to_bytes(2, "big"), payload]
        try:
            if hop.ethernet:
                tx.sendmsg([hop.ethernet, *pieces], (), 0, (hop.ifname, ETH_P_IPV6))
            else:
                self.stats.fallback_sends += 1
                l3.sendmsg(pieces, (), 0, (str(first_hop), 0))
        except OSError as exc:
            self._next_hops.pop(first_hop, None)  # the route may have changed: ask again
            raise DataplaneError(f"mmap: cannot send to [{dst}]:{dst_port}: {exc}") from exc

    def _template(self, key: _TemplateKey) -> _Template:
        source, dst, dst_port, path, size, tclass = key
        zeros = bytes(size + (size & 1))
        packet = build_udp_packet(
            source,
            dst,
            self.config.port,
            dst_port,
            bytes(size),
            hop_limit=self._hop_limit,
            segments=list(path) if path is not None else None,
            traffic_class=tclass,
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
        """Output interface, Ethernet header and source for ``first_hop`` (module doc),
        from the tables of the namespace the plane was opened in: pyroute2 opens its
        netlink socket in the namespace of the thread that first uses it, and the
        engine's thread, or a caller of ``send``, may be in another."""
        if self._ipr is None:
            raise DataplaneError("mmap: data plane is not open (Init first)")
        with _in_netns(self._netns):
            hop = resolve_next_hop(self._ipr, first_hop)
        self._next_hops[first_hop] = hop
        return hop
