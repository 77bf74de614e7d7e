"""The ``afxdp`` data plane: STAMP frames of active sessions in an AF_XDP socket, in batches.

Theory of operation
-------------------
An XDP program (``stamp_xsk`` in ``sixlab/linux/bpf/``) on ``config.interface`` sends
the frames of the active sessions' STAMP packets (IPv6 + [SRH at Segments Left 0] +
UDP to the plane's port, an SSID of a session the engines added, or any SSID with a
default session) into an AF_XDP socket, with their arrival time in 8 bytes of XDP
metadata; everything else goes on to the kernel untouched. User space reads and writes
whole frames in the UMEM through the fill, RX, TX and completion rings
(``sixlab.linux.xsk``, libxdp through ctypes): no system call per packet, one
``sendto`` per 32 transmitted frames in copy mode (the kernel's batch), none to
receive while frames keep coming.

Queues: an AF_XDP socket receives from one receive queue, and ``stamp_xsk`` redirects
a frame to the socket of the queue it arrived on (a frame of a queue without one goes
to the kernel). The plane binds one socket per receive queue of the interface
(``IFLA_NUM_RX_QUEUES``; a queue the driver does not run ends the list), each with its
own UMEM (``RX_FRAMES`` shared out, at least ``MIN_RX_FRAMES`` each, plus
``TX_FRAMES``), and answers each queue's frames on that queue's socket; with more than
one, ``fileno`` is an epoll descriptor over all of them. A queue that another socket
holds (a live afxdp plane on the same interface) makes ``open`` fail with that said,
before anything of the other plane's is touched.

Zero-copy where the driver has it, copy mode where it does not (veth): the socket is
bound without forcing either, so the kernel picks (``zero_copy`` tells which). The
program attaches in the driver's native XDP mode where there is one.

Reflector fast path (``reflect_frames``, what ``ReflectorEngine`` calls on this plane):
a batch of RX descriptors (up to ``DEFAULT_BATCH``) is read at once and the frames'
bytes gathered into one NumPy array; classification (IPv6, an SRH at Segments Left 0
or none, lengths) is done with array operations per batch — the UDP checksum was
verified by ``stamp_xsk`` before the frame entered the socket; the payloads go through
``sixlab.stamp.batch`` (the reflector core over the batch, byte for byte the
reference's replies); the reply frames are written into free UMEM frames from a
cached head per (probe addresses and ports, session return path) — Ethernet from the
kernel's neighbour table, IPv6 [+ the session's return SRH] + UDP — with the UDP
checksum as the head's sum plus the payload's, all per batch. T3 is read once, after
the frames are written and before they are handed to the kernel; it and its share of
each checksum are patched in last (``sixlab.stamp.batch``, "T3"). Frames the batch path
does not take (TLVs other than Extra Padding, authentication, a Return Path TLV,
another frame layout) come back to the engine as ``Received`` for the general path,
whose replies ``send`` writes into the TX ring one at a time.

Sender fast path (``collect_frames``, what ``SenderEngine`` calls on this plane): the
same classification, the reflected payloads handed over as arrays with their T4 for
``sixlab.stamp.batch.receive_batch``.

Receive (``receive``, the sender side and the general path): each frame is decoded
with ``sixlab.wire.packet``; the time stamp is the XDP program's
``bpf_ktime_get_tai_ns()`` less the CLOCK_TAI − CLOCK_REALTIME offset measured at
``open`` (as the ``xdp`` plane does), so T2 and T4 are taken before any user-space work.

Send: ``send`` builds the whole frame (``sixlab.wire.packet.build_udp_packet``), the
Ethernet header from the kernel's tables (``sixlab.dataplane._nexthop``); while the
neighbour is unresolved, or when the route leaves by another interface, the packet
goes through an ``AF_INET6``/``IPPROTO_RAW`` socket instead (the kernel resolves it).

Traffic Class (``sets_tclass``): ``send`` writes its ``tclass`` into the IPv6 header,
and every received frame's Traffic Class reaches the reflector core, so a Class of
Service TLV (RFC 8972 §4.4) is answered as the ``socket`` and ``xdp`` planes answer it:
DSCP2/ECN from the probe, the reply sent with DSCP1, RP 0. Such probes take the
reference core (the batch path takes Extra Padding only). Every other reply carries
Traffic Class 0 and Flow Label 0, as the ``xdp`` plane's program and a kernel socket
(``net.ipv6.auto_flowlabels = 0``) give them.

On a veth testbed, frames sent by a local socket with tx checksum offload on carry an
unfinished UDP checksum (the ``xdp`` plane's docstring explains why): ``stamp_xsk``
passes them to the kernel, which has no socket on the port; turn the offload off on the
sending veth (``ethtool -K IF tx off``), as the tests do.

Lifetime: ``close`` (and an ``atexit`` hook) detaches the program, deletes the socket
and the UMEM. The next ``open`` on an interface where a killed run left ``stamp_xsk``
attached detaches it first. The plane re-enters the namespace it was opened in to
attach and detach, as the ``xdp`` plane does.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import os
import select
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from ipaddress import IPv6Address
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from sixlab.dataplane._nexthop import NextHop, resolve_next_hop
from sixlab.dataplane.base import (
    Dataplane,
    DataplaneConfig,
    DataplaneError,
    FastBatch,
    IPAddress,
    Received,
    full_path,
    require_ipv6,
)
from sixlab.dataplane.xdp_plane import _in_netns, _plane_errors, measure_tai_offset_ns, pack_config
from sixlab.linux import libbpf, xsk
from sixlab.linux.bpfbuild import build_objects
from sixlab.linux.errors import LinuxError
from sixlab.stamp.batch import BatchReflector
from sixlab.stamp.reflector import PacketContext, Reflection, Reflector, ReflectorSessionConfig
from sixlab.wire import WireError
from sixlab.wire.packet import build_udp_packet, parse_udp_packet

__all__ = ["PROGRAM_NAME", "AfXdpCounters", "AfXdpDataplane"]

PROGRAM_NAME = "stamp_xsk"
FRAME_SIZE = 2048
#: Frames the kernel may receive into (all in the fill ring at rest): 64 MiB, about
#: 40 ms of a stalled Python process at 800 kpps (the fill ring ran empty with 8192
#: under load: ``rx_fill_ring_empty_descs``); the RX, fill and completion rings have as
#: many entries. With several receive queues each socket gets a share (``_rx_frames``).
RX_FRAMES = 32768
RING_SIZE = RX_FRAMES
#: Receive frames per queue at least, however many queues.
MIN_RX_FRAMES = 4096
#: Frames for transmit (reply frames wait in the TX ring until the kernel sends them).
TX_FRAMES = 4096
FRAME_COUNT = RX_FRAMES + TX_FRAMES
_EBUSY = 16
_EINVAL = 22
_META = 8  # bytes of XDP metadata before each received frame: the arrival time (TAI ns)
_DEFAULT_KEY = 0x10000  # STAMP_DEFAULT_SSID: the default session
_U32 = struct.Struct("<I")
#: Default frames per ``reflect_frames`` call (the engine's batch).
DEFAULT_BATCH = 1024
#: Reply heads kept; a sweep of many peers rebuilds rather than grows.
_MAX_TEMPLATES = 4096
_HOP_LIMIT = 64

# Offsets in an Ethernet frame: IPv6 at 14 (RFC 8200 §3), a Routing header at 54.
_ETH = 14
_IP_PLEN = _ETH + 4
_IP_NH = _ETH + 6
_IP_HOP = _ETH + 7
_IP_SRC = _ETH + 8
_IP_END = _ETH + 40
_RH_NH, _RH_LEN, _RH_TYPE, _RH_SL = _IP_END, _IP_END + 1, _IP_END + 2, _IP_END + 3
_UDP = 17
_ROUTING = 43
_SRH = 4
_STAMP_BASE = 44

U8 = npt.NDArray[np.uint8]


@dataclass(slots=True)
class AfXdpCounters:
    """What the plane did with frames the engine never saw, and its transmit trouble."""

    fast_replies: int = 0  # replies written by the batch path
    collected: int = 0  # reflected packets handed over as arrays (``collect_frames``)
    general_sends: int = 0  # replies and probes written by ``send``
    fallback_sends: int = 0  # sent through the kernel (neighbour not resolved yet)
    not_ipv6: int = 0
    malformed: int = 0
    bad_checksum: int = 0
    tx_full: int = 0  # no free UMEM frame or TX slot: the packet was not sent
    kicks: int = 0  # sendto calls
    #: The longest time from a batch's T3 reading to the return of its last transmit
    #: call (in copy mode the frames are on the link by then): the worst T3 error.
    t3_lag_max_ns: int = 0


@dataclass(frozen=True, slots=True)
class _Head:
    """A cached reply head: Ethernet + IPv6 [+ SRH] + UDP up to its checksum."""

    head: U8
    header_sum: int  # one's-complement sum of pseudo-header and UDP header (mod 0xFFFF)
    route: object  # the session's return path (by identity)
    expires: float


def _sum16(block: U8) -> npt.NDArray[np.uint64]:
    """Per row, the sum of the big-endian 16-bit words of ``block`` (a zero byte pads an
    odd row, RFC 1071)."""
    if block.shape[1] & 1:
        block = np.concatenate([block, np.zeros((block.shape[0], 1), np.uint8)], axis=1)
    high = block[:, 0::2].astype(np.uint64).sum(axis=1) << np.uint64(8)
    out: npt.NDArray[np.uint64] = high + block[:, 1::2].astype(np.uint64).sum(axis=1)
    return out


def _tclass(first: int, second: int) -> int:
    """The Traffic Class of an IPv6 header from its first two bytes (RFC 8200 §3)."""
    return (int(first) & 0x0F) << 4 | int(second) >> 4


def _received(frames: U8, t4: npt.NDArray[np.int64], udp: int, length: int, i: int) -> Received:
    """Row ``i`` of a classified group (``AfXdpDataplane._classify``) as a ``Received``."""
    frame = frames[i]
    ports = frame[udp : udp + 4].tobytes()
    return Received(
        frame[udp + 8 : length].tobytes(),
        frame[_IP_SRC : _IP_SRC + 16].tobytes(),
        frame[_IP_SRC + 16 : _IP_END].tobytes(),
        int.from_bytes(ports[:2], "big"),
        int.from_bytes(ports[2:], "big"),
        int(frame[_IP_HOP]),
        int(t4[i]),
        _tclass(frame[_ETH], frame[_ETH + 1]),
    )


def _rx_frames(queues: int) -> int:
    """Receive frames (and ring entries) per queue: ``RX_FRAMES`` shared out, a power of
    two (the rings' sizes must be), at least ``MIN_RX_FRAMES``."""
    share = RX_FRAMES // max(1, queues)
    return max(MIN_RX_FRAMES, 1 << (share.bit_length() - 1))


@dataclass(slots=True)
class _Queue:
    """One receive queue's socket, its UMEM and the UMEM's free transmit frames."""

    index: int
    umem: xsk.Umem
    sock: xsk.XskSocket
    free: npt.NDArray[np.int64]
    nfree: int
    received: int = 0  # frames taken off this socket's RX ring


def _detach_ours(ifindex: int) -> None:
    """Detach a ``stamp_xsk`` a killed run left on ``ifindex``."""
    for mode in (libbpf.XDP_FLAGS_DRV_MODE, libbpf.XDP_FLAGS_SKB_MODE):
        prog_id = libbpf.xdp_query_id(ifindex, mode)
        if prog_id:
            info = libbpf.prog_info_by_id(prog_id)
            if info is not None and info.name == PROGRAM_NAME:
                libbpf.xdp_detach(ifindex, mode)


class AfXdpDataplane(Dataplane):
    """STAMP frames through an AF_XDP socket on ``config.interface`` (module doc)."""

    name = "afxdp"
    sets_tclass = True

    #: Frames per ``reflect_frames`` call; the engine takes this as its batch.
    fast_batch: int = DEFAULT_BATCH

    def __init__(
        self,
        config: DataplaneConfig,
        *,
        cache_dir: Path | None = None,
        xdp_flags: int = 0,
        bind_flags: int = xsk.XDP_USE_NEED_WAKEUP,
    ) -> None:
        super().__init__(config)
        self.cache_dir = cache_dir
        self.xdp_flags = xdp_flags
        self.bind_flags = bind_flags
        self.stats = AfXdpCounters()
        self.tai_offset_ns = 0
        self.ifindex = 0
        self._obj: libbpf.BpfObject | None = None
        #: One socket per receive queue (module doc, "Queues"); the methods below work
        #: on the active one: ``_umem``, ``_xsk``, ``_free``/``_nfree`` (``_activate``).
        self._queues: list[_Queue] = []
        self._active: _Queue | None = None
        self._epoll: select.epoll | None = None
        self._umem: xsk.Umem | None = None
        self._xsk: xsk.XskSocket | None = None
        self._attached = False
        self._netns: int | None = None
        self._l3: socket.socket | None = None
        self._ipr: Any = None
        self._hops: dict[IPv6Address, NextHop] = {}
        self._heads: dict[tuple[bytes, int, int], _Head] = {}
        #: Free transmit frames: a stack, ``_free[:_nfree]`` (UMEM addresses).
        self._free = np.empty(TX_FRAMES, np.int64)
        self._nfree = 0
        self._keys: set[int] = set()
        self._batchers: dict[int, BatchReflector] = {}

    # -- lifecycle --------------------------------------------------------------------

    @_plane_errors
    def open(self) -> None:
        if self._xsk is not None:
            return
        config = self.config
        ifname = config.interface
        if not ifname:
            raise DataplaneError("afxdp: the afxdp data plane needs an interface (--interface)")
        if not 0 < config.port <= 0xFFFF:
            raise DataplaneError(f"afxdp: needs a fixed UDP port, got {config.port}")
        require_ipv6("afxdp", config.source)  # an IPv4 listen address: a clear error
        try:
            self.ifindex = socket.if_nametoindex(ifname)
        except OSError as exc:
            raise DataplaneError(f"afxdp: no interface {ifname!r} in this namespace") from exc
        paths = build_objects(self.cache_dir)
        import pyroute2  # noqa: PLC0415 - now, not on the first packet

        try:
            self._netns = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            self.tai_offset_ns = measure_tai_offset_ns()
            obj = libbpf.BpfObject(paths[PROGRAM_NAME])
            self._obj = obj
            obj.load()
            cfg = pack_config(config.port, _HOP_LIMIT, self.tai_offset_ns)
            obj.map("stamp_cfg").update(_U32.pack(0), cfg)
            # Netlink in the namespace of ``open`` (the engine's thread may be elsewhere).
            self._ipr = pyroute2.IPRoute()
            self._open_queues(ifname, self._rx_queue_count())
            for q in self._queues:
                obj.map("xsk_sockets").update(_U32.pack(q.index), _U32.pack(q.sock.fd))
            self._l3 = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
            # Only now, with every queue bound: a live plane's sockets would have
            # refused ours (EBUSY), and its program must not be touched.
            _detach_ours(self.ifindex)
            with _in_netns(self._netns):
                libbpf.xdp_attach(
                    self.ifindex,
                    obj.program(PROGRAM_NAME).fd,
                    self.xdp_flags | libbpf.XDP_FLAGS_UPDATE_IF_NOEXIST,
                )
            self._attached = True
        except LinuxError as exc:
            self.close()
            if isinstance(exc, libbpf.LibbpfError) and exc.errno == 16:  # EBUSY
                raise DataplaneError(
                    f"afxdp: {ifname} already has an XDP program that is not sixlab's; "
                    "detach it first (`ip link set dev IF xdp off`)"
                ) from exc
            raise
        except BaseException:
            self.close()
            raise
        atexit.register(self.close)

    def close(self) -> None:
        atexit.unregister(self.close)
        if self._attached and self.ifindex:
            with contextlib.suppress(LinuxError, DataplaneError), _in_netns(self._netns):
                libbpf.xdp_detach(self.ifindex, self.xdp_flags & 0x6)
            self._attached = False
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None
        for q in self._queues:
            q.sock.close()
            q.umem.close()
        self._queues = []
        self._active = None
        self._xsk = None
        self._umem = None
        if self._obj is not None:
            self._obj.close()
            self._obj = None
        for name in ("_l3",):
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
        self._keys.clear()
        self._heads.clear()
        self._hops.clear()

    def _rx_queue_count(self) -> int:
        """The interface's receive queues (``IFLA_NUM_RX_QUEUES``); 1 if not said."""
        assert self._ipr is not None
        links = self._ipr.get_links(self.ifindex)
        count = links[0].get_attr("IFLA_NUM_RX_QUEUES") if links else None
        return max(1, int(count or 1))

    def _open_queues(self, ifname: str, count: int) -> None:
        """One UMEM and socket per receive queue ``0..count-1`` (module doc, "Queues").

        A queue the driver does not run (EINVAL: fewer real queues than allocated)
        ends the list; one another socket holds (EBUSY) is an error that names it.
        """
        rx_frames = _rx_frames(count)
        for index in range(count):
            umem = xsk.Umem(rx_frames + TX_FRAMES, FRAME_SIZE, rx_frames)
            try:
                sock = xsk.XskSocket(
                    ifname, index, umem, ring_size=rx_frames, bind_flags=self.bind_flags
                )
            except xsk.XskError as exc:
                umem.close()
                if exc.errno == _EINVAL and index > 0:
                    break
                if exc.errno == _EBUSY:
                    raise DataplaneError(
                        f"afxdp: queue {index} of {ifname} already has an AF_XDP socket "
                        "(another afxdp plane on this interface?)"
                    ) from exc
                raise
            free = np.arange(rx_frames, rx_frames + TX_FRAMES, dtype=np.int64) * FRAME_SIZE
            q = _Queue(index, umem, sock, free, TX_FRAMES)
            self._queues.append(q)
            self._activate(q)
            self._fill_rx(np.arange(rx_frames, dtype=np.uint64) * np.uint64(FRAME_SIZE))
        if len(self._queues) > 1:
            self._epoll = select.epoll()
            for q in self._queues:
                self._epoll.register(q.sock.fd, select.EPOLLIN)
        self._activate(self._queues[0])

    def _activate(self, q: _Queue) -> None:
        """Make ``q`` the queue the ring methods work on (its free stack kept)."""
        if self._active is not None:
            self._active.nfree = self._nfree
        self._active = q
        self._umem, self._xsk = q.umem, q.sock
        self._free, self._nfree = q.free, q.nfree

    @property
    def queues(self) -> int:
        """Receive queues served, one AF_XDP socket each."""
        return len(self._queues)

    def fileno(self) -> int:
        """The socket's descriptor; with several queues an epoll descriptor over all of
        them (readable when any socket is)."""
        if self._epoll is not None:
            return self._epoll.fileno()
        return self._socket().fd

    def zero_copy(self) -> bool:
        """Whether the kernel runs the socket in zero-copy mode (else copy mode)."""
        return self._socket().zero_copy()

    def counters(self) -> dict[str, int]:
        out = dataclasses.asdict(self.stats)
        out["queues"] = len(self._queues)
        for q in self._queues:  # frames per queue, then the kernel's counts, summed
            out[f"rx_q{q.index}"] = q.received
        for q in self._queues:
            for name, value in q.sock.statistics().items():
                out[name] = out.get(name, 0) + value
        return out

    def _socket(self) -> xsk.XskSocket:
        if self._xsk is None:
            raise DataplaneError("afxdp: data plane is not open (Init first)")
        return self._xsk

    def _umem_(self) -> xsk.Umem:
        if self._umem is None:
            raise DataplaneError("afxdp: data plane is not open (Init first)")
        return self._umem

    # -- sessions: which SSIDs the program steers to the socket ------------------------

    def _steer(self, ssid: int | None, on: bool) -> None:
        if self._obj is None:
            if on:
                raise DataplaneError("afxdp: data plane is not open (Init first)")
            return
        key = _DEFAULT_KEY if ssid is None else ssid
        ssids = self._obj.map("xsk_ssids")
        try:
            if on:
                ssids.update(_U32.pack(key), _U32.pack(1))
                self._keys.add(key)
            else:
                ssids.delete(_U32.pack(key))
                self._keys.discard(key)
        except LinuxError as exc:
            raise DataplaneError(str(exc)) from exc

    def reflector_session_added(self, config: ReflectorSessionConfig) -> None:
        self._steer(config.ssid, True)

    def reflector_session_removed(self, ssid: int | None) -> None:
        self._steer(ssid, False)

    def sender_session_added(self, ssid: int) -> None:
        self._steer(ssid, True)

    def sender_session_removed(self, ssid: int) -> None:
        self._steer(ssid, False)

    # -- rings --------------------------------------------------------------------------

    def _fill_rx(self, addrs: npt.NDArray[np.uint64]) -> None:
        """Give frames back to the kernel to receive into (the fill ring)."""
        fill = self._umem_().fill
        n = len(addrs)
        first = fill.reserve(n)
        if first < 0:  # cannot happen: the ring holds every receive frame
            raise DataplaneError("afxdp: fill ring full")
        fill.entries[fill.slots(first, n)] = addrs
        fill.submit(n)

    def _reap(self) -> None:
        """Frames the kernel has sent come back to the free list (the completion ring)."""
        comp = self._umem_().comp
        n, first = comp.peek(RING_SIZE)
        if n:
            self._give_back(comp.entries[comp.slots(first, n)])
            comp.release(n)

    def _give_back(self, addrs: npt.NDArray[Any]) -> None:
        """Transmit frames back on the free stack."""
        n = len(addrs)
        self._free[self._nfree : self._nfree + n] = addrs
        self._nfree += n

    def _take_rx(self, max_batch: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Up to ``max_batch`` received descriptors: (addresses, lengths); released."""
        rx = self._socket().rx
        n, first = rx.peek(max_batch)
        if not n:
            empty = np.empty(0, np.int64)
            return empty, empty
        descs = rx.entries[rx.slots(first, n)]
        rx.release(n)
        if self._active is not None:
            self._active.received += n
        return descs["addr"].astype(np.int64), descs["len"].astype(np.int64)

    def _transmit(self, addrs: npt.NDArray[np.int64], lengths: npt.NDArray[Any] | int) -> int:
        """Queue frames already written at ``addrs`` and kick; how many could not go."""
        tx = self._socket().tx
        n = len(addrs)
        first = tx.reserve(n)
        if first < 0:
            self._socket().kick()
            self._reap()
            first = tx.reserve(n)
            if first < 0:
                self._give_back(addrs)
                self.stats.tx_full += n
                return n
        slots = tx.slots(first, n)
        tx.entries["addr"][slots] = addrs
        tx.entries["len"][slots] = lengths
        tx.entries["options"][slots] = 0
        tx.submit(n)
        self.stats.kicks += self._socket().kick()
        return 0

    def _frames(self, n: int) -> npt.NDArray[np.int64]:
        """Up to ``n`` free UMEM frames for transmit (their addresses)."""
        if self._nfree < n:
            self._reap()
        take = min(n, self._nfree)
        self._nfree -= take
        return self._free[self._nfree : self._nfree + take].copy()

    # -- receive ------------------------------------------------------------------------

    def receive(self, max_batch: int = 64) -> list[Received]:
        if len(self._queues) <= 1:
            return self._receive_one(max_batch)
        out: list[Received] = []
        for q in self._queues:
            self._activate(q)
            out += self._receive_one(max_batch)
        self._activate(self._queues[0])
        return out

    def _receive_one(self, max_batch: int) -> list[Received]:
        self._reap()
        addrs, lengths = self._take_rx(max_batch)
        if not len(addrs):
            return []
        area = self._umem_().area
        out = []
        for a, length in zip(addrs.tolist(), lengths.tolist(), strict=True):
            rx = self._decode(area[a - _META : a + length])
            if rx is not None:
                out.append(rx)
        self._fill_rx((addrs & ~(FRAME_SIZE - 1)).astype(np.uint64))
        return out

    def _decode(self, frame: bytes) -> Received | None:
        """One received frame (metadata first) as a ``Received``, or None (counted)."""
        rx_ns = int.from_bytes(frame[:_META], "little") - self.tai_offset_ns
        data = frame[_META:]
        if data[12:14] != b"\x86\xdd":
            self.stats.not_ipv6 += 1
            return None
        try:
            packet = parse_udp_packet(data[_ETH:], verify_checksum=True)
        except WireError as exc:
            if "checksum" in str(exc).lower():
                self.stats.bad_checksum += 1
            else:
                self.stats.malformed += 1
            return None
        udp = packet.udp
        return Received(
            packet.payload, packet.src, packet.dst, udp.src_port, udp.dst_port,
            packet.hop_limit, rx_ns, _tclass(data[_ETH], data[_ETH + 1]),
        )  # fmt: skip

    # -- reflector fast path ------------------------------------------------------------

    def reflect_frames(
        self, reflector: Reflector, clock: Callable[[], int], max_batch: int = DEFAULT_BATCH
    ) -> FastBatch:
        """Answer up to ``max_batch`` received frames with the batch core (module doc).

        Returns what was taken off the ring, handed to the core, failed to send, and
        the frames left to the general path as ``Received``, in arrival order (per
        queue: with several, each gives up to ``max_batch``, and the sums come back).
        """
        if len(self._queues) <= 1:
            return self._reflect_one(reflector, clock, max_batch)
        consumed = handled = failed = 0
        slow: list[Received] = []
        for q in self._queues:
            self._activate(q)
            got = self._reflect_one(reflector, clock, max_batch)
            consumed += got.consumed
            handled += got.handled
            failed += got.send_failed
            slow += got.slow
        self._activate(self._queues[0])
        return FastBatch(consumed, handled, failed, slow)

    def _reflect_one(
        self, reflector: Reflector, clock: Callable[[], int], max_batch: int
    ) -> FastBatch:
        umem = self._umem_()
        self._reap()
        addrs, lengths = self._take_rx(max_batch)
        n = len(addrs)
        if not n:
            return FastBatch(0, 0, 0, [])
        try:
            return self._reflect(reflector, clock, umem, addrs, lengths)
        finally:
            self._fill_rx((addrs & ~(FRAME_SIZE - 1)).astype(np.uint64))

    def _classify(
        self, umem: xsk.Umem, addrs: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
    ) -> tuple[U8, npt.NDArray[np.int64], list[tuple[npt.NDArray[np.intp], int, int]], list[int]]:
        """Sort a batch of received frames, with array operations (module doc).

        Returns the frames' bytes (one row each, from the Ethernet header), their arrival
        times (UTC ns), the groups of rows the fast paths take — (rows, UDP offset, frame
        length): IPv6, an SRH at Segments Left 0 or none, an IPv6 Payload Length that
        matches the frame, at least a base packet — and the other rows. The UDP checksum
        was verified by ``stamp_xsk`` (it passes the frames whose checksum fails); the
        UDP Length is covered by it (pseudo-header and header alike).
        """
        n = len(addrs)
        rows = addrs // FRAME_SIZE
        offs = addrs - rows * FRAME_SIZE
        width = int(lengths.max())
        empty = np.empty((0, 0), np.uint8)
        if not (offs == offs[0]).all() or offs[0] < _META or width < _IP_END + 8:
            return empty, np.empty(0, np.int64), [], list(range(n))
        off = int(offs[0])
        gathered = umem.frames[rows, off - _META : off + width]
        data = gathered[:, _META:]
        tai = np.ascontiguousarray(gathered[:, :_META]).view("<u8")[:, 0].astype(np.int64)
        t_utc = tai - np.int64(self.tai_offset_ns)
        nh = data[:, _IP_NH]
        plain = nh == _UDP
        srh = (
            (nh == _ROUTING)
            & (data[:, _RH_TYPE] == _SRH)
            & (data[:, _RH_SL] == 0)
            & (data[:, _RH_NH] == _UDP)
        )
        udp = np.where(plain, _IP_END, _IP_END + (data[:, _RH_LEN].astype(np.int64) + 1) * 8)
        ok = (data[:, 12] == 0x86) & (data[:, 13] == 0xDD) & (plain | srh)
        ok &= lengths >= udp + 8 + _STAMP_BASE
        plen = data[:, _IP_PLEN].astype(np.int64) << 8 | data[:, _IP_PLEN + 1]
        ok &= plen == lengths - _IP_END
        keys = np.where(ok, udp * 65536 + lengths, -1)
        groups: list[tuple[npt.NDArray[np.intp], int, int]] = []
        slow = np.flatnonzero(~ok).tolist()
        first = int(keys[0])
        if first >= 0 and (keys == first).all():  # the common case: one layout
            return data, t_utc, [(np.arange(n), first // 65536, first % 65536)], []
        for key in np.unique(keys[ok]).tolist():
            group = np.flatnonzero(keys == key)
            groups.append((group, key // 65536, key % 65536))
        return data, t_utc, groups, slow

    def _reflect(
        self,
        reflector: Reflector,
        clock: Callable[[], int],
        umem: xsk.Umem,
        addrs: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
    ) -> FastBatch:
        data, t_utc, groups, slow_rows = self._classify(umem, addrs, lengths)
        handled = failed = 0
        for rows, udp, length in groups:
            whole = len(rows) == len(data)
            got = self._reflect_group(
                reflector, clock, umem, data if whole else data[rows],
                t_utc if whole else t_utc[rows], udp=udp, length=length,
            )  # fmt: skip
            handled += got[0]
            failed += got[1]
        slow = self._decode_rows(umem, addrs, lengths, sorted(slow_rows))
        return FastBatch(len(addrs), handled, failed, slow)

    def collect_frames(
        self, max_batch: int = DEFAULT_BATCH
    ) -> tuple[list[tuple[U8, npt.NDArray[np.int64], Callable[[int], Received]]], list[Received]]:
        """The sender side's fast path: up to ``max_batch`` received frames as groups of
        (UDP payloads as an ``(n, L)`` array, T4 in UTC ns, row ``i`` as a ``Received``)
        for ``sixlab.stamp.batch.receive_batch`` and the rows the engine must take one by
        one, and the frames the classification left (``_classify``) as ``Received``
        (with several queues, up to ``max_batch`` from each)."""
        if len(self._queues) <= 1:
            return self._collect_one(max_batch)
        groups: list[tuple[U8, npt.NDArray[np.int64], Callable[[int], Received]]] = []
        slow: list[Received] = []
        for q in self._queues:
            self._activate(q)
            got, rest = self._collect_one(max_batch)
            groups += got
            slow += rest
        self._activate(self._queues[0])
        return groups, slow

    def _collect_one(
        self, max_batch: int
    ) -> tuple[list[tuple[U8, npt.NDArray[np.int64], Callable[[int], Received]]], list[Received]]:
        umem = self._umem_()
        self._reap()
        addrs, lengths = self._take_rx(max_batch)
        if not len(addrs):
            return [], []
        try:
            data, t_utc, groups, slow_rows = self._classify(umem, addrs, lengths)
            out: list[tuple[U8, npt.NDArray[np.int64], Callable[[int], Received]]] = []
            for rows, udp, length in groups:
                frames = data[rows]
                payloads = np.ascontiguousarray(frames[:, udp + 8 : length])
                t4 = t_utc[rows]
                out.append((payloads, t4, functools.partial(_received, frames, t4, udp, length)))
            self.stats.collected += sum(len(rows) for rows, _, _ in groups)
            return out, self._decode_rows(umem, addrs, lengths, sorted(slow_rows))
        finally:
            self._fill_rx((addrs & ~(FRAME_SIZE - 1)).astype(np.uint64))

    def _decode_rows(
        self,
        umem: xsk.Umem,
        addrs: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        rows: Sequence[int] | range,
    ) -> list[Received]:
        out = []
        for i in rows:
            a = int(addrs[i])
            rx = self._decode(umem.area[a - _META : a + int(lengths[i])])
            if rx is not None:
                out.append(rx)
        return out

    def _reflect_group(  # noqa: PLR0912, PLR0915 - the per-frame hot loop, inlined: a call per frame costs more than its work
        self,
        reflector: Reflector,
        clock: Callable[[], int],
        umem: xsk.Umem,
        data: U8,
        t_utc: npt.NDArray[np.int64],
        *,
        udp: int,
        length: int,
    ) -> tuple[int, int]:
        """Frames of one layout (UDP at ``udp``, ``length`` bytes), checksums verified:
        (handed to the core, failed sends)."""
        size = length - udp - 8
        payloads = np.ascontiguousarray(data[:, udp + 8 : length])
        hops = data[:, _IP_HOP].copy()
        t2 = t_utc
        # Each packet's flow key, ``Received.flow``'s layout: addresses, then ports.
        flows = np.concatenate([data[:, _IP_SRC:_IP_END], data[:, udp : udp + 4]], axis=1)
        batch = self._batchers.get(id(reflector))
        if batch is None or batch.reflector is not reflector:
            batch = self._batchers[id(reflector)] = BatchReflector(reflector)

        def fallback(i: int) -> Reflection | None:
            frame = data[i]
            src, dst = frame[_IP_SRC : _IP_SRC + 16].tobytes(), frame[_IP_SRC + 16 : _IP_END]
            ports = frame[udp : udp + 4].tobytes()
            context = PacketContext(
                IPv6Address(src), IPv6Address(dst.tobytes()),
                int.from_bytes(ports[:2], "big"), int.from_bytes(ports[2:], "big"),
                _tclass(frame[_ETH], frame[_ETH + 1]), True,
            )  # fmt: skip
            return reflector.reflect(
                payloads[i].tobytes(), int(t2[i]), clock, int(hops[i]), context,
                flow=flows[i].tobytes(),
            )  # fmt: skip

        out = batch.reflect(payloads, t2, hops, fallback, flows)
        failed = 0
        for i, reply in out.fallback.items():
            if reply is not None:
                failed += self._send_reply(
                    data[i], udp, reply.payload, reply.return_path, reply.tclass
                )
        answered = np.flatnonzero(out.answered)
        if not len(answered):
            return len(data), failed
        # Reply heads per (probe addresses and ports, return path).
        peer = flows[answered]
        route_of = out.route_of[answered]
        now = time.monotonic()
        plans: list[tuple[npt.NDArray[np.intp], _Head | None]] = []
        if (peer == peer[0]).all() and (route_of == route_of[0]).all():
            head = self._head(peer[0].tobytes(), out.routes[int(route_of[0])], size, now)
            plans.append((answered, head))
        else:
            combo = np.concatenate([peer, route_of.astype(">u2").view(np.uint8).reshape(-1, 2)], 1)
            uniq, inverse = np.unique(combo, axis=0, return_inverse=True)
            for k in range(len(uniq)):
                sel = answered[inverse.ravel() == k]
                j = int(np.flatnonzero(inverse.ravel() == k)[0])
                head = self._head(peer[j].tobytes(), out.routes[int(route_of[j])], size, now)
                plans.append((sel, head))
        replies = out.replies
        writes: list[tuple[npt.NDArray[np.intp], npt.NDArray[np.int64], int, Any]] = []
        general: list[npt.NDArray[np.intp]] = []
        for sel, head in plans:
            if head is None:
                general.append(sel)
                continue
            frames = self._frames(len(sel))
            if len(frames) < len(sel):
                self._give_back(frames)
                self.stats.tx_full += len(sel)
                failed += len(sel)
                continue
            hl = len(head.head)
            tx_rows = frames // FRAME_SIZE
            block = umem.frames
            chosen = replies if len(sel) == len(replies) else replies[sel]
            block[tx_rows, :hl] = head.head
            block[tx_rows, hl + 2 : hl + 2 + size] = chosen
            partial = _sum16(chosen) + np.uint64(head.header_sum)
            writes.append((sel, tx_rows, hl, (frames, partial)))
        # T3: one clock reading, as late as the batch allows (module doc).
        t3_ns = clock()
        out.set_t3(t3_ns)
        for sel, tx_rows, hl, (frames, partial) in writes:
            t3 = replies[:, 4:12] if len(sel) == len(replies) else replies[sel, 4:12]
            total = partial + _sum16(t3)
            csum = np.uint64(0xFFFF) - total % np.uint64(0xFFFF)
            block = umem.frames
            block[tx_rows, hl + 6 : hl + 14] = t3
            block[tx_rows, hl : hl + 2] = csum.astype(">u2").view(np.uint8).reshape(-1, 2)
            failed += self._transmit(frames, hl + 2 + size)
            self.stats.fast_replies += len(frames)
        if writes:
            self.stats.t3_lag_max_ns = max(self.stats.t3_lag_max_ns, clock() - t3_ns)
        for sel in general:
            for i in sel.tolist():
                route = out.routes[int(out.route_of[i])]
                failed += self._send_reply(data[i], udp, replies[i].tobytes(), route)
        return len(data), failed

    def _head(self, key: bytes, route: Any, size: int, now: float) -> _Head | None:
        """The reply head towards the probe addresses and ports in ``key`` along
        ``route`` for a payload of ``size`` bytes (None: leave it to ``send``:
        unresolved, or another interface). The head carries the payload's length (UDP
        Length, IPv6 Payload Length and their share of the checksum): one per size."""
        cache_key = (key, id(route), size)
        head = self._heads.get(cache_key)
        if head is not None and head.expires >= now and head.route is route:
            return head
        peer = IPv6Address(key[:16])
        path = full_path(peer, route.segments)
        hop = self._hop(path[0] if path is not None else peer, now)
        if not hop.ethernet or hop.ifname != self.config.interface:
            return None
        packet = build_udp_packet(
            key[16:32], key[:16], self.config.port, int.from_bytes(key[32:34], "big"), b"",
            hop_limit=_HOP_LIMIT, segments=list(path) if path is not None else None,
        )  # fmt: skip
        # Built over an empty payload: the UDP Length and the IPv6 Payload Length are
        # patched for ``size``, and the checksum becomes the sum of the header alone.
        frame = bytearray(hop.ethernet + packet[:-2])
        ulen = 8 + size
        udp_at = len(frame) - 6
        frame[udp_at + 4 : udp_at + 6] = ulen.to_bytes(2, "big")
        plen = len(frame) - _IP_END + 2 + size
        frame[_IP_PLEN : _IP_PLEN + 2] = plen.to_bytes(2, "big")
        pseudo = (
            int.from_bytes(frame[_IP_SRC : _IP_SRC + 16], "big")
            + int.from_bytes(key[:16], "big")  # the final destination: the probe's source
            + ulen
            + _UDP
            + int.from_bytes(frame[udp_at:], "big")
        )
        head = _Head(np.frombuffer(bytes(frame), np.uint8), pseudo % 0xFFFF, route, hop.expires)
        if len(head.head) + 2 + size > FRAME_SIZE:
            return None
        if len(self._heads) >= _MAX_TEMPLATES:
            self._heads.clear()
        self._heads[cache_key] = head
        return head

    def _hop(self, first_hop: IPv6Address, now: float) -> NextHop:
        hop = self._hops.get(first_hop)
        if hop is None or hop.expires < now:
            # In the namespace of ``open``: pyroute2 opens its netlink socket in the
            # namespace of the thread that first uses it, and the engine's thread may
            # be elsewhere (a test's, a lab's).
            with _in_netns(self._netns):
                if self._ipr is None:
                    from pyroute2 import IPRoute  # noqa: PLC0415

                    self._ipr = IPRoute()
                hop = resolve_next_hop(self._ipr, first_hop)
            self._hops[first_hop] = hop
        return hop

    def _send_reply(
        self, frame: U8, udp: int, payload: bytes, route: Any, tclass: int | None = None
    ) -> int:
        """A reply by ``send`` to the probe in ``frame`` (with ``tclass``, the Traffic
        Class the reflector core asked for); 1 if it failed, else 0."""
        dst = route.address if route.address is not None else None
        if dst is None:
            dst = IPv6Address(frame[_IP_SRC : _IP_SRC + 16].tobytes())
        if not isinstance(dst, IPv6Address):
            return 1
        src = IPv6Address(frame[_IP_SRC + 16 : _IP_END].tobytes())
        port = int(frame[udp]) << 8 | int(frame[udp + 1])
        try:
            self.send(payload, dst, port, segments=route.segments, src=src, tclass=tclass)
        except DataplaneError:
            return 1
        return 0

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
        dst6 = require_ipv6("afxdp", dst)
        assert dst6 is not None
        dst, src = dst6, require_ipv6("afxdp", src)
        umem = self._umem_()
        path = full_path(dst, segments)
        first_hop = path[0] if path is not None else dst
        hop = self._hop(first_hop, time.monotonic())
        if src is not None:
            source = src.packed
        elif self.config.source is not None:
            source = self.config.source.packed
        elif hop.source is not None:
            source = hop.source
        else:
            raise DataplaneError(f"afxdp: no source address to reach {first_hop}")
        try:
            packet = build_udp_packet(
                source, dst, self.config.port, dst_port, payload, hop_limit=_HOP_LIMIT,
                segments=list(path) if path is not None else None, traffic_class=tclass or 0,
            )  # fmt: skip
        except WireError as exc:
            raise DataplaneError(f"afxdp: cannot send to [{dst}]:{dst_port}: {exc}") from exc
        frame = hop.ethernet + packet
        if not hop.ethernet or hop.ifname != self.config.interface or len(frame) > FRAME_SIZE:
            assert self._l3 is not None
            try:
                self._l3.sendmsg([packet], (), 0, (str(first_hop), 0))
            except OSError as exc:
                self._hops.pop(first_hop, None)
                raise DataplaneError(f"afxdp: cannot send to [{dst}]:{dst_port}: {exc}") from exc
            self.stats.fallback_sends += 1
            return
        frames = self._frames(1)
        if not len(frames):
            self.stats.tx_full += 1
            raise DataplaneError("afxdp: no free frame to send (transmit ring full)")
        row = int(frames[0]) // FRAME_SIZE
        umem.frames[row, : len(frame)] = np.frombuffer(frame, np.uint8)
        if self._transmit(frames, len(frame)):
            raise DataplaneError("afxdp: transmit ring full")
        self.stats.general_sends += 1
