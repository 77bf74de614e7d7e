"""A TPACKET_V3 receive ring on an ``AF_PACKET`` socket: the one every capture uses.

Theory of operation
-------------------
The kernel copies each packet that passes the socket's classic BPF program into blocks
of a ring that user space maps with ``mmap`` (``Documentation/networking/
packet_mmap.rst``). A block is user space's while its ``block_status`` has
``TP_STATUS_USER``; its packets (``struct tpacket3_hdr``: ``tp_next_offset``, the
receive time ``tp_sec``/``tp_nsec``, ``tp_snaplen``/``tp_len``, ``tp_status``,
``tp_mac``/``tp_net``, then a ``sockaddr_ll``) are read in place and the block is handed
back by writing ``TP_STATUS_KERNEL``. No system call per packet; the socket polls
readable when a block is retired, which happens when it is full or after
``retire_ms`` (so a lone packet waits at most that long).

Opening order matters: a socket bound to one interface is created with protocol 0
(it receives nothing), gets its filter and its ring, and only then is bound with the
real protocol, so no unfiltered packet ever reaches the ring. Without an interface
(``ifname=None``, every interface) there is no such bind, and the socket listens from
creation on.

Errors on the socket
--------------------
When the bound interface goes down the kernel unhooks the socket and sets its error
to ``ENETDOWN`` (``packet_notifier`` in ``net/packet/af_packet.c``); when the interface
comes back up it hooks the socket again by itself. A ring reader never calls
``recv``, so nothing reads that error, and ``poll``/``epoll`` report ``EPOLLERR`` (and
``select`` readable) for as long as it is set: a loop that waits on the socket wakes
at once, finds no block, and waits again, for ever. :meth:`PacketRing.clear_error`
reads and so clears it (``SO_ERROR``), counting it in :attr:`PacketRing.errors`; a
reader calls it whenever it was woken and found nothing (:meth:`frames` does so
itself). An interface that is deleted and made again has a new index the old socket
will never see: :meth:`reopen` makes a new socket and ring on the same name.

Losing the place
----------------
The kernel fills the blocks in ring order and the reader must take them in the same
order: a reader whose cursor rests on a block the kernel owns while later blocks are
the user's waits there until the kernel comes round to that block, and every packet is
then read one lap of the ring late while the kernel drops what does not fit. The
``mmap`` plane was seen in that state after overload (its cursor's block handed back
with its packets unread, the next blocks the user's; benchmarks/README.md, issue 14
section); what put it there is not known. A reader that was woken and found nothing
calls :meth:`resync` (:meth:`frames` does so itself), which moves the cursor to the
oldest block the user holds (the lowest ``seq_num`` of ``struct tpacket_hdr_v1``),
counted in :attr:`PacketRing.resyncs`. In step, a wake-up for nothing finds no block
of the user's, and the scan (one status read per block) changes nothing.

Two ways to read, one walk
--------------------------
:meth:`records` walks the blocks and yields each packet as a plain tuple (packet bytes,
kernel receive time, lengths, status, packet type): what the STAMP ``mmap`` plane's
receive and reflector loops read, with no object per packet. :meth:`frames` gives the
same as :class:`Frame` named tuples: what the ILNP daemon reads. The walk keeps its
cursor in locals and writes it back to :attr:`left` and :attr:`offset` when it ends
(:attr:`block` moves as each block is handed back): a write per packet would cost the
reflector loop a tenth of its time. A wake-up for nothing clears the socket's error and
resyncs the cursor in that one place.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import socket
import struct
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sixlab.linux.cbpf import BpfInstruction, attach_filter

__all__ = [
    "BLOCK_PKTS",
    "BLOCK_PKTS_OFFSET",
    "BLOCK_SEQ",
    "BLOCK_SEQ_OFFSET",
    "BLOCK_STATUS",
    "BLOCK_STATUS_OFFSET",
    "ETH_P_ALL",
    "ETH_P_IPV6",
    "PKT_HEADER",
    "SLL_OFFSET",
    "SLL_PKTTYPE",
    "TP_STATUS_CSUMNOTREADY",
    "TP_STATUS_CSUM_VALID",
    "TP_STATUS_KERNEL",
    "TP_STATUS_USER",
    "VIRTIO_NET_HDR_GSO_ECN",
    "VIRTIO_NET_HDR_GSO_NONE",
    "VIRTIO_NET_HDR_GSO_TCPV4",
    "VIRTIO_NET_HDR_GSO_TCPV6",
    "VIRTIO_NET_HDR_GSO_UDP_L4",
    "Frame",
    "PacketRing",
    "Record",
    "RingGeometry",
]

# <linux/if_packet.h>, <linux/if_ether.h>
SOL_PACKET = 263
PACKET_RX_RING = 5
PACKET_STATISTICS = 6
PACKET_VERSION = 10
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
TPACKET_V3 = 2
TP_STATUS_KERNEL = 0
TP_STATUS_USER = 1
TP_STATUS_CSUMNOTREADY = 1 << 3
TP_STATUS_CSUM_VALID = 1 << 7
ETH_P_ALL = 0x0003
ETH_P_IPV6 = 0x86DD

_REQ3 = struct.Struct("=7I")  # struct tpacket_req3
# struct tpacket_block_desc: version, offset_to_priv, then tpacket_hdr_v1 whose
# block_status, num_pkts and offset_to_first_pkt follow at 8, 12 and 16.
BLOCK_STATUS = struct.Struct("=I")
BLOCK_STATUS_OFFSET = 8
BLOCK_PKTS = struct.Struct("=II")
BLOCK_PKTS_OFFSET = 12
#: tpacket_hdr_v1.seq_num: the kernel numbers the blocks as it opens them.
BLOCK_SEQ = struct.Struct("=Q")
BLOCK_SEQ_OFFSET = 24
#: ``struct virtio_net_hdr`` (<linux/virtio_net.h>), 10 bytes in front of the link header
#: on a ``vnet_hdr`` ring; ``gso_type`` is its second byte.
VNET_HDR_SIZE = 10
VIRTIO_NET_HDR_GSO_NONE = 0
VIRTIO_NET_HDR_GSO_TCPV4 = 1
VIRTIO_NET_HDR_GSO_UDP_L4 = 5
VIRTIO_NET_HDR_GSO_TCPV6 = 4
VIRTIO_NET_HDR_GSO_ECN = 0x80
#: struct tpacket3_hdr up to tp_net: next_offset, sec, nsec, snaplen, len, status, mac, net.
PKT_HEADER = struct.Struct("=6I2H")
#: TPACKET_ALIGN(sizeof(struct tpacket3_hdr)): where the sockaddr_ll follows.
SLL_OFFSET = 48
#: Offset of ``sll_pkttype`` in the sockaddr_ll (family 2, protocol 2, ifindex 4, hatype 2).
SLL_PKTTYPE = 10
_STATS = struct.Struct("=III")  # struct tpacket_stats_v3: packets, drops, freeze count


@dataclass(frozen=True, slots=True)
class RingGeometry:
    """Blocks of ``block_size`` bytes, ``block_count`` of them, retired after
    ``retire_ms`` when not full. At low rates every block retires nearly empty, so the
    block *count* is what buys time: the ring rides out a stall of about
    ``block_count * retire_ms`` ms of its reader whatever the rate. ``frame_size`` (a
    multiple of 16) only sizes the ring's bookkeeping in V3; a packet may be as large
    as a block less its headers."""

    block_size: int = 1 << 16
    block_count: int = 256
    frame_size: int = 2048
    retire_ms: int = 1

    @property
    def size(self) -> int:
        return self.block_size * self.block_count


class Frame(NamedTuple):
    """One packet of the ring."""

    #: From the network header on (``tp_net``), ``snaplen`` bytes from the link header.
    data: bytes
    #: Kernel receive time, ns (``CLOCK_REALTIME`` unless ``PACKET_TIMESTAMP`` is set).
    rx_ns: int
    #: Length on the wire, from the link header (``tp_len``); above ``snaplen``: cut.
    length: int
    snaplen: int
    #: ``tp_status`` (``TP_STATUS_CSUM_VALID``, ``TP_STATUS_CSUMNOTREADY``, ...).
    status: int
    #: ``sll_pkttype``: ``PACKET_HOST`` (0), ``PACKET_OTHERHOST``, ...
    pkttype: int
    #: On a ``vnet_hdr`` ring, the ``gso_type`` of the packet's virtio header
    #: (``VIRTIO_NET_HDR_GSO_*``): not NONE for an aggregate that GRO (or the device's
    #: LRO) made of several segments; always NONE on other rings.
    gso_type: int


#: One packet as :meth:`PacketRing.records` yields it: :class:`Frame`'s fields in order.
Record = tuple[bytes, int, int, int, int, int, int]


class PacketRing:
    """A TPACKET_V3 receive ring (module doc).

    ``ifname`` None captures on every interface. ``protocol`` is the ethertype
    (``ETH_P_IPV6``); ``program`` the classic BPF filter, attached before the first
    packet can arrive; ``cooked`` makes it ``SOCK_DGRAM`` (no link header: the filter's
    offsets start at the network header) rather than ``SOCK_RAW``. Own outgoing
    packets are skipped (``PACKET_IGNORE_OUTGOING``, Linux 4.20) unless
    ``ignore_outgoing`` is False; on older kernels that option is silently absent.
    ``vnet_hdr`` (``PACKET_VNET_HDR``, raw sockets only) has the kernel put a
    ``struct virtio_net_hdr`` in front of each packet, which says whether it is a
    segmentation offload aggregate (:attr:`Frame.gso_type`); the kernel counts a packet
    it cannot describe (a GSO type virtio has no name for) as a ring drop. A ring
    that is to take aggregates whole needs blocks larger than 64 KiB. Raises
    ``OSError`` (the socket is closed again) when the kernel refuses.
    """

    def __init__(
        self,
        ifname: str | None,
        *,
        protocol: int = ETH_P_IPV6,
        program: Sequence[BpfInstruction] | None = None,
        geometry: RingGeometry | None = None,
        cooked: bool = False,
        ignore_outgoing: bool = True,
        vnet_hdr: bool = False,
    ) -> None:
        self.ifname = ifname
        self.protocol = protocol
        self.program = None if program is None else tuple(program)
        self.geometry = geometry or RingGeometry()
        self.cooked = cooked
        self.ignore_outgoing = ignore_outgoing
        self.vnet_hdr = vnet_hdr
        g = self.geometry
        self.block_size = g.block_size
        self.block_count = g.block_count
        #: Errors read off the socket (``clear_error``), by errno name.
        self.errors: Counter[str] = Counter()
        #: Packets the kernel offered and dropped (ring full), over every socket so far.
        self.seen = 0
        self.drops = 0
        #: Times the socket was made again (:meth:`reopen`).
        self.reopened = 0
        #: Times the cursor was moved to the oldest user block (:meth:`resync`).
        self.resyncs = 0
        self.sock, self.map, self.ifindex = self._open()
        self.block = 0
        self.left = 0
        self.offset = 0

    def _open(self) -> tuple[socket.socket, mmap.mmap, int]:
        g = self.geometry
        kind = socket.SOCK_DGRAM if self.cooked else socket.SOCK_RAW
        # Protocol 0 receives nothing until bind (module doc).
        proto = 0 if self.ifname else socket.htons(self.protocol)
        sock = socket.socket(socket.AF_PACKET, kind, proto)
        try:
            if self.program is not None:
                attach_filter(sock, self.program)
            if self.ignore_outgoing:
                with contextlib.suppress(OSError):  # Linux >= 4.20
                    sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
            sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V3)
            if self.vnet_hdr:  # before the ring: the kernel refuses it afterwards
                sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
            frames = g.size // g.frame_size
            req = _REQ3.pack(g.block_size, g.block_count, g.frame_size, frames, g.retire_ms, 0, 0)
            sock.setsockopt(SOL_PACKET, PACKET_RX_RING, req)
            prot = mmap.PROT_READ | mmap.PROT_WRITE
            ring = mmap.mmap(sock.fileno(), g.size, mmap.MAP_SHARED, prot)
            ifindex = 0
            if self.ifname:
                try:
                    sock.bind((self.ifname, self.protocol))
                    ifindex = socket.if_nametoindex(self.ifname)
                except BaseException:
                    ring.close()
                    raise
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock, ring, ifindex

    def reopen(self) -> None:
        """A new socket and ring on the same interface name (an interface made again
        has a new index; the old socket would never see it). Statistics carry over;
        the packets left in the old ring are lost (counted in ``drops`` by the kernel's
        own count only if it had dropped any)."""
        new_sock, new_map, ifindex = self._open()
        self._fold_statistics()
        self._close_ring()
        self.sock, self.map, self.ifindex = new_sock, new_map, ifindex
        self.block = self.left = self.offset = 0
        self.reopened += 1

    def fileno(self) -> int:
        return self.sock.fileno()

    # ------------------------------------------------------------------ errors

    def clear_error(self) -> int:
        """Read (and so clear) the socket's pending error; 0 when there was none.

        Call it when a wake-up found no block (module doc, "Errors on the socket");
        each error is counted in :attr:`errors` under its errno name.
        """
        try:
            code = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        except OSError as exc:  # closed under us: nothing pending that we could clear
            code = exc.errno or 0
        if code:
            self.errors[errno.errorcode.get(code, str(code))] += 1
        return code

    # ------------------------------------------------------------------ statistics

    def _fold_statistics(self) -> None:
        with contextlib.suppress(OSError):
            raw = self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, _STATS.size)
            packets, drops, _freezes = _STATS.unpack(raw)  # reading resets them
            self.seen += packets
            self.drops += drops

    def statistics(self) -> tuple[int, int]:
        """Packets the kernel offered to the ring and dropped (ring full), cumulated."""
        self._fold_statistics()
        return self.seen, self.drops

    # ------------------------------------------------------------------ reading

    def next_block(self) -> bool:
        """Enter the next block if the kernel has handed it over; False if not yet.

        Sets :attr:`left` (its packets) and :attr:`offset` (the first one); an empty
        block is handed back at once.
        """
        base = self.block * self.block_size
        (status,) = BLOCK_STATUS.unpack_from(self.map, base + BLOCK_STATUS_OFFSET)
        if not status & TP_STATUS_USER:
            return False
        self.left, first = BLOCK_PKTS.unpack_from(self.map, base + BLOCK_PKTS_OFFSET)
        self.offset = base + first
        if self.left == 0:
            self.release()
        return True

    def resync(self) -> bool:
        """If the cursor's block is the kernel's while others are the user's, move the
        cursor to the oldest of those (module doc, "Losing the place"); True if it moved.

        Call it after a wake-up found nothing; a partly read block stays as it is.
        """
        if self.left:
            return False
        size, ring = self.block_size, self.map
        oldest = None
        for block in range(self.block_count):
            base = block * size
            (status,) = BLOCK_STATUS.unpack_from(ring, base + BLOCK_STATUS_OFFSET)
            if status & TP_STATUS_USER:
                (seq,) = BLOCK_SEQ.unpack_from(ring, base + BLOCK_SEQ_OFFSET)
                if oldest is None or seq < oldest[0]:
                    oldest = (seq, block)
        if oldest is None or oldest[1] == self.block:
            return False
        self.block = oldest[1]
        self.resyncs += 1
        return True

    def release(self) -> None:
        """Hand the current block back to the kernel and move to the next one."""
        BLOCK_STATUS.pack_into(
            self.map, self.block * self.block_size + BLOCK_STATUS_OFFSET, TP_STATUS_KERNEL
        )
        self.block = (self.block + 1) % self.block_count

    def records(self, limit: int = 64) -> Iterator[Record]:
        """Up to ``limit`` packets the kernel has handed over, in arrival order, each as
        a plain tuple with :class:`Frame`'s fields: the one walk of the ring (module doc,
        "Two ways to read").

        A call that finds nothing clears the socket's error and puts a cursor that
        lost its place back in step (module doc): a wake-up for nothing is how either
        shows. The cursor lives in the generator while it runs and is written back when
        it ends or is closed (a ``for`` loop that breaks closes it), so stop iterating
        early and the rest stay for the next call. One walk at a time: the cursor is
        the ring's.
        """
        view = self.map
        unpack = PKT_HEADER.unpack_from
        # gso_type, the virtio header's second byte, ends 9 bytes before the link header.
        gso_at = VNET_HDR_SIZE - 1 if self.vnet_hdr else 0
        count = 0
        left, offset = self.left, self.offset
        try:
            while count < limit:
                if left == 0:
                    self.left = 0
                    if not self.next_block():
                        if count == 0:
                            self.clear_error()
                            if self.resync():
                                continue
                        return
                    left, offset = self.left, self.offset
                    continue
                nxt, sec, nsec, snaplen, length, status, mac, net = unpack(view, offset)
                pkttype = view[offset + SLL_OFFSET + SLL_PKTTYPE]
                data = view[offset + net : offset + mac + snaplen]
                gso = view[offset + mac - gso_at] if gso_at else 0
                offset += nxt
                left -= 1
                if left == 0:
                    self.release()
                count += 1
                yield data, sec * 1_000_000_000 + nsec, length, snaplen, status, pkttype, gso
        finally:
            self.left, self.offset = left, offset

    def frames(self, limit: int = 64) -> Iterator[Frame]:
        """:meth:`records` as :class:`Frame` objects."""
        return map(Frame._make, self.records(limit))

    def _close_ring(self) -> None:
        with contextlib.suppress(BufferError):  # a view still exported: the GC frees it
            self.map.close()
        self.sock.close()

    def close(self) -> None:
        """Close the socket and unmap the ring; safe to call twice."""
        if self.sock.fileno() < 0:
            return
        self._fold_statistics()
        self._close_ring()
