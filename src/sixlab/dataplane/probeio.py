"""The socket plane's batched probe path: ``probeio.c``, built at first use, via ctypes.

Why. A sender engine with 10,000 sessions at 1 packet/s serves a few packets per run
of its timers; on the pure-Python path each costs a ``sendmsg`` and a ``recvmsg`` with
its control messages unpacked in Python and a ``Received`` built
(benchmarks/README.md, "One sender agent, socket plane"). Here the packets due in one
run go out in one ``sendmmsg(2)``, Seq and T1 written in C right before it (one wall
clock reading for the batch: RFC 8762 §4.2.1, the Timestamp is when the packet is sent),
and the replies come in through ``recvmmsg(2)`` as fixed-size records with the control
messages and the RFC 8762 §4.3.1 fields decoded (``RECORD``), which the engine hands to
``sixlab.stamp.batch.receive_record``.

Build. ``gcc -O2 -shared -fPIC`` on ``probeio.c`` (next to this file), cached by the
source's hash under ``$XDG_CACHE_HOME/sixlab/dataplane`` (``~/.cache``), written
atomically so that concurrent first uses see all or nothing. No compiler, or a build
that fails: ``load`` returns None and the engine keeps the pure-Python path;
``SIXLAB_PROBEIO=0`` in the environment does the same on purpose.
"""

from __future__ import annotations

import array
import ctypes
import os
import socket
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path
from typing import Protocol

from sixlab.linux.bpfbuild import BuildError
from sixlab.linux.ccbuild import build_c, cache_dir

__all__ = ["LOOP_OUT", "RECORD", "RECORD_FIELDS", "ProbeIO", "RoutingHeaders", "SendLoop", "load"]

_SOURCE = Path(__file__).with_name("probeio.c")
#: Packets per ``sendmmsg`` / ``recvmmsg`` call (``MAX_BATCH`` in probeio.c).
BATCH = 256
#: Bytes per received datagram: the socket plane's largest accepted STAMP payload.
SLOT = 9000
#: ``struct recv_rec`` of probeio.c: T4 (kernel, UTC ns), T1, T2, T3 (ns; raw when PTP),
#: payload length, reflector Seq, sender Seq, SSID, reflector and sender Error Estimate,
#: source port, Traffic Class (-1: none), Hop Limit, Ses-Sender TTL, flags (bit 0
#: truncated, bit 1 IPv4), source and destination address (16 bytes; IPv4 in the first 4).
RECORD = struct.Struct("=q3Q3I4HhBBB7x16s16s")
#: ``RECORD`` without the two addresses (skipped, not made into bytes): what a reply
#: that takes ``batch.receive_record`` needs.
RECORD_FIELDS = struct.Struct("=q3Q3I4HhBBB7x32x")
#: Bytes before each payload in the send buffer (``SEND_HEAD`` in probeio.c).
_SEND_HEAD = struct.Struct("=4Iq32s")
TRUNCATED = 1
IPV4 = 2
#: ``struct sl_out`` of probeio.c, one outcome of the run loop: T1 (UTC ns), then for a
#: packet sent the run's monotonic time and the next slot, for a result T2, T3, T4;
#: the session's index, the sender's Seq, the reflector's Seq (a drop: its reason),
#: the reflector's Error Estimate, the kind (``sixlab.stamp.batch.LOOP_*``; bit 7 of a
#: result: reordered), Ses-Sender TTL.
LOOP_OUT = struct.Struct("=4q3IHBB")
#: ``struct sl_sess`` of probeio.c (checked against the library).
_LOOP_SESSION_SIZE = 128
#: Bytes of a session's send record the run loop keeps (``SL_REC`` in probeio.c).
LOOP_RECORD_MAX = 512
#: ``sl_run``'s reasons to return (``SL_*`` in probeio.c).
LOOP_WAKER, LOOP_SOCKET, LOOP_UNTIL, LOOP_FULL = 1, 2, 4, 8
#: Out records the run loop holds before it returns for the engine to take them: room
#: for a whole window of losses of a session (``sixlab.stamp.batch.LOOP_WINDOW_MAX``,
#: which ``sl_add`` checks) and a batch of sends besides.
LOOP_OUT_CAP = 8192
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


def build(cache: Path | None = None) -> Path | None:
    """The shared object of ``probeio.c`` (built if its source changed); None when no
    C compiler is there, the cache cannot be written or the build fails."""
    try:
        return build_c(_SOURCE, cache or cache_dir("dataplane"), shared=True)
    except BuildError:
        return None


def load() -> ctypes.CDLL | None:
    """The helper library, built and loaded once per process; None: the Python path."""
    global _lib, _tried  # noqa: PLW0603 - one library per process
    with _lock:
        if not _tried:
            _tried = True
            if os.environ.get("SIXLAB_PROBEIO", "1") != "0":
                path = build()
                try:
                    lib = None if path is None else ctypes.CDLL(str(path))
                except OSError:  # e.g. a cache on a noexec mount
                    lib = None
                if lib is not None:
                    vp, i = ctypes.c_void_p, ctypes.c_int
                    lib.pio_send.argtypes = [i, vp, i, vp, vp, vp]
                    lib.pio_send.restype = i
                    lib.pio_recv.argtypes = [i, vp, i, i, vp]
                    lib.pio_recv.restype = i
                    _declare_loop(lib)
                    if (
                        lib.pio_record_size() == RECORD.size
                        and lib.sl_out_size() == LOOP_OUT.size
                        and lib.sl_session_size() == _LOOP_SESSION_SIZE
                    ):
                        _lib = lib
        return _lib


def _declare_loop(lib: ctypes.CDLL) -> None:
    """The run loop's functions' signatures (probeio.c, ``sl_*``)."""
    vp, i, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    lib.sl_new.argtypes = [i, i, vp, i, vp]
    lib.sl_new.restype = vp
    lib.sl_free.argtypes = [vp]
    lib.sl_free.restype = None
    lib.sl_lock.argtypes = lib.sl_unlock.argtypes = [vp]
    lib.sl_lock.restype = lib.sl_unlock.restype = None
    lib.sl_add.argtypes = [vp, i, vp, i, vp, ctypes.c_uint32, ctypes.c_uint16, i, vp, i, vp]
    lib.sl_add.restype = i
    lib.sl_get.argtypes = [vp, i, i, vp, vp, i]
    lib.sl_get.restype = i
    lib.sl_take.argtypes = [vp, vp, vp]
    lib.sl_take.restype = i
    lib.sl_run.argtypes = [vp, i, i, i, i, i64, i64, i64]
    lib.sl_run.restype = i
    lib.sl_left_done.argtypes = [vp]
    lib.sl_left_done.restype = None


def _sockaddr(family: socket.AddressFamily, dst: IPv4Address | IPv6Address, port: int) -> bytes:
    """``struct sockaddr_in6`` (an IPv4 destination as IPv4-mapped on a dual-stack
    socket) or ``struct sockaddr_in``, as ``sendmsg`` gets it."""
    if family == socket.AF_INET:
        return struct.pack("=H", socket.AF_INET) + port.to_bytes(2) + dst.packed + bytes(8)
    packed = dst.packed if dst.version == 6 else bytes(10) + b"\xff\xff" + dst.packed
    return struct.pack("=H", socket.AF_INET6) + port.to_bytes(2) + bytes(4) + packed + bytes(4)


class RoutingHeaders(Protocol):
    """The socket's sticky routing header, kept by its plane (``SocketDataplane``)."""

    def routing_header(
        self, dst: IPv4Address | IPv6Address, segments: Sequence[IPv6Address] | None
    ) -> bytes | None: ...

    def use_routing_header(self, rthdr: bytes | None) -> None: ...


class ProbeIO:
    """Batched send and receive on one socket plane's socket (module doc).

    SRv6: the kernel takes a type-4 routing header only as the socket's sticky
    ``IPV6_RTHDR`` (``sixlab.dataplane.udpsocket``), so a batch holds the packets of one
    path (``path``), and ``send`` makes that path's header the socket's first."""

    def __init__(
        self, lib: ctypes.CDLL, fd: int, family: socket.AddressFamily, routes: RoutingHeaders
    ) -> None:
        self._lib = lib
        self._fd = fd
        self.family = family
        self._routes = routes
        self.data = bytearray(BATCH * SLOT)
        self.records = bytearray(BATCH * RECORD.size)
        self._data_p = ctypes.addressof(ctypes.c_char.from_buffer(self.data))
        self._records_p = ctypes.addressof(ctypes.c_char.from_buffer(self.records))
        self.data_p, self.records_p = self._data_p, self._records_p
        self._t1 = ctypes.c_int64()
        self._err = ctypes.c_int()
        self._t1_p = ctypes.addressof(self._t1)
        self._err_p = ctypes.addressof(self._err)

    def record(
        self, dst: IPv4Address | IPv6Address, port: int, body: bytes, *, ptp: bool, tai_ns: int
    ) -> bytes | None:
        """A session's entry in the send buffer: the header, 12 bytes for Seq and
        Timestamp, ``body`` (the packet after them, ``send_template``) and padding to 8
        bytes; None when this socket cannot reach ``dst`` (the other family)."""
        if self.family == socket.AF_INET and dst.version != 4:
            return None
        address = _sockaddr(self.family, dst, port)
        size = 12 + len(body)
        head = _SEND_HEAD.pack(size, len(address), int(ptp), 0, tai_ns, address)
        return head + bytes(12) + body + bytes(-size % 8)

    def path(
        self, dst: IPv4Address | IPv6Address, segments: Sequence[IPv6Address] | None
    ) -> bytes | None:
        """The routing header of sends to ``dst`` along ``segments``, for ``send`` (the
        plane's error when there can be none, e.g. SRv6 to an IPv4 address)."""
        return self._routes.routing_header(dst, segments)

    def send(
        self, buf: bytearray, seqs: array.array[int], rthdr: bytes | None = None
    ) -> tuple[int, int, int]:
        """Send the records of ``buf`` (``record``), the i-th with Seq ``seqs[i]``, at
        most ``BATCH``, all along the path ``rthdr`` (``path``): (T1 written into them,
        packets refused, errno of the last). The plane's error when the kernel refuses
        the routing header (nothing sent)."""
        self._routes.use_routing_header(rthdr)
        n = len(seqs)
        buf_p = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        seq_p = seqs.buffer_info()[0]
        failed = self._lib.pio_send(self._fd, buf_p, n, seq_p, self._t1_p, self._err_p)
        return self._t1.value, failed, self._err.value

    def clear_routing_header(self) -> None:
        """No routing header on the socket's sends: what the run loop's packets carry
        (it takes no session with an SRv6 path)."""
        if self.family == socket.AF_INET6:
            self._routes.use_routing_header(b"")

    def send_loop(self) -> SendLoop:
        """A compiled run loop (``SendLoop``) that sends on this socket."""
        return SendLoop(self._lib, self._fd, self)

    def receive(self) -> int:
        """Datagrams now in ``data`` (``SLOT`` bytes each) and ``records``: how many;
        OSError on a socket error other than an ICMP report."""
        got: int = self._lib.pio_recv(self._fd, self._data_p, SLOT, BATCH, self._records_p)
        if got < 0:
            raise OSError(-got, os.strerror(-got))
        return got


@dataclass(frozen=True, slots=True)
class LoopSession:
    """A session's state in the run loop (``SendLoop.get``): its next slot (monotonic
    ns), next Seq, the schedule's statistics (``SenderEngine._slip``'s fields), the
    highest Seq answered (-1: none), whether the loop still runs it (False: it left on
    a reply the loop does not answer, an ``LOOP_EVICT`` record), and its packets
    outstanding (Seq, T1, loss deadline) in send order."""

    due: int
    seq: int
    skipped: int
    on_slot: int
    late_ns_total: int
    late_ns_max: int
    last_slot: int
    highest: int
    held: bool
    outstanding: list[tuple[int, int, int]]


@dataclass(frozen=True, slots=True)
class LoopTake:
    """What ``SendLoop.take`` moved: records in ``out``, packets the kernel refused
    (and the errno of the last), datagrams received, and datagrams left for the engine
    at the start of the receive buffers (``ProbeIO.data``/``records``, as after
    ``ProbeIO.receive``), to be handled before ``SendLoop.left_done``."""

    records: int
    failed: int
    errno: int
    received: int
    left: int


class SendLoop:
    """The compiled run loop of probeio.c (``sl_*``): the send schedule, replies and
    loss of the sessions a ``SenderEngine`` hands over, served in C with the GIL
    released (``run``); it receives into its ``ProbeIO``'s buffers.

    Every method but ``run`` must be called between ``lock`` and ``unlock`` (the loop
    holds the same mutex while it runs, not while it sleeps); ``run`` from one thread
    at a time; ``close`` once no thread runs it."""

    def __init__(self, lib: ctypes.CDLL, fd: int, pio: ProbeIO, capacity: int = 1024) -> None:
        self._lib = lib
        self._fd = fd
        state = lib.sl_new(capacity, LOOP_OUT_CAP, pio.data_p, SLOT, pio.records_p)
        if not state:
            raise MemoryError("probeio: no memory for the run loop")
        self._state: int | None = state
        self.out = bytearray(LOOP_OUT_CAP * LOOP_OUT.size)
        self._out_p = ctypes.addressof(ctypes.c_char.from_buffer(self.out))
        self._values = (ctypes.c_int64 * 9)()
        self._counts = (ctypes.c_int * 4)()
        self._window = (ctypes.c_int64 * (3 * 4096))()
        #: The answered bitmaps the loop writes, kept exported (not resizable) while held.
        self._pinned: dict[int, ctypes.Array[ctypes.c_char]] = {}

    def close(self) -> None:
        if self._state is not None:
            self._lib.sl_free(self._state)
            self._state = None

    def lock(self) -> None:
        self._lib.sl_lock(self._state)

    def unlock(self) -> None:
        self._lib.sl_unlock(self._state)

    def add(
        self,
        idx: int,
        record: bytes,
        *,
        ssid: int,
        timing: tuple[int, int, int, int, int, int],
        seq: int,
        highest: int,
        window: int,
        outstanding: list[tuple[int, int, int]],
        answered: bytearray,
        echoed: bool = False,
    ) -> bool:
        """Hand session ``idx`` (a free index) to the loop: its send record
        (``ProbeIO.record``), SSID, ``timing`` (next slot, interval, schedule origin,
        last slot sent, loss timeout, TAI - UTC; ns), next Seq, highest Seq answered
        (-1: none), window (a power of two), packets outstanding (Seq, T1, deadline)
        and answered bitmap, and whether a reply with its own SSID was answered
        (``sixlab.stamp.batch.loop_state``). False when the loop
        cannot take it (bad input, record too long, SSID held, no memory)."""
        cfg = (ctypes.c_int64 * 8)(*timing, highest, int(echoed))
        flat = [v for triple in outstanding for v in triple]
        out = (ctypes.c_int64 * max(1, len(flat)))(*flat)
        bitmap = (ctypes.c_char * len(answered)).from_buffer(answered)
        rc = self._lib.sl_add(
            self._state, idx, record, len(record), cfg, seq, ssid, window, out,
            len(outstanding), bitmap,
        )  # fmt: skip
        if rc != 0:
            return False
        self._pinned[idx] = bitmap
        return True

    def get(self, idx: int, *, remove: bool = False) -> LoopSession | None:
        """Session ``idx``'s state (None: no session there), and out of the loop with
        ``remove`` (the index is free again)."""
        room = len(self._window) // 3
        n = self._lib.sl_get(self._state, idx, int(remove), self._values, self._window, room)
        if n < 0:
            return None
        if remove:
            self._pinned.pop(idx, None)
        w = self._window
        out = [(w[3 * i], w[3 * i + 1], w[3 * i + 2]) for i in range(n)]
        due, seq, skipped, on_slot, total, most, last, highest, held = self._values
        return LoopSession(due, seq, skipped, on_slot, total, most, last, highest, bool(held), out)

    def take(self) -> LoopTake:
        """Move the out records into ``out`` (``LOOP_OUT`` each)."""
        n = self._lib.sl_take(self._state, self._out_p, self._counts)
        return LoopTake(int(n), *self._counts)

    def left_done(self) -> None:
        """The datagrams ``take`` left for the engine are handled: the loop may receive
        into the buffers again."""
        self._lib.sl_left_done(self._state)

    def run(
        self, waker: int, until: int, tick: int, hold: int, *, notify: int = -1, resume: int = -1
    ) -> int:
        """Serve the loop (probeio.c ``sl_run``) until monotonic ``until`` (ns), the
        ``waker`` fd is readable, or, without ``notify``, datagrams are left for the
        engine or the out records near full: which of those (``LOOP_*`` bits). With
        ``notify`` (a thread of its own) it writes a byte there for those and goes on;
        a byte on ``resume`` makes it look again. OSError on a socket error."""
        why: int = self._lib.sl_run(self._state, self._fd, waker, notify, resume, until, tick, hold)
        if why < 0:
            raise OSError(-why, os.strerror(-why))
        return why
