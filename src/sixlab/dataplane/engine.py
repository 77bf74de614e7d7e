"""Engines: the thin adapters that join a data plane to the sans-I/O STAMP core.

Each engine owns one thread that waits on the data plane's descriptor (and a wake-up
pipe) until the next timer of its sessions, feeds what arrived to the core, and sends
what the core produced (receive → core → transmit → re-arm timer: docs/architecture.md). The
public methods are thread-safe: the gRPC agent and the standalone tools call them from
other threads.

SR performance measurement (docs/srpm.md). A packet of a session with flow labels is
sent with the label its Seq (the payload's first four bytes) gives
(``stamp.flows.flow_label_for``) through the plane's ``send_labelled``. A session with
a ``data_counters`` source (direct-mode loss) has it read just before its timer runs
and before each of its replies is handed over (sender), or by the reflector core when
it answers one of its TLV packets (``Reflector.set_data_source``, so every path of a
plane reads it, fast ones included): the core gets the data flow's counts as they are
at T1, T4 and when it reflects. A read that fails is counted in
``data_counter_failed`` and leaves the core with the counts of the last read that
worked.

Two clocks. ``clock`` is the wall clock (Unix-epoch UTC ns): T1–T4 come from it (or
from the data plane's receive timestamps). ``monotonic`` is what schedules and timeouts
run on (``time.monotonic_ns``): the sender core gets it as ``now`` and the wall clock as
``wall``, so a step of the wall clock (NTP, an operator) neither stalls nor bursts the
send schedule nor expires the packets in flight (``docs/architecture.md``, "Time").

Results of a Session-Sender go into a bounded FIFO per session, drained by
``SenderEngine.results`` (polling) or ``wait_results`` (push/streaming). When a FIFO is
full the oldest record is dropped and ``overflow`` counts it: never silent.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import dataclasses
import heapq
import ipaddress
import itertools
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sixlab import stamp as ev
from sixlab.dataplane import probeio
from sixlab.dataplane._idqueue import IdQueue
from sixlab.dataplane.base import (
    Dataplane,
    DataplaneError,
    FastBatch,
    IPAddress,
    Received,
    ReflectFn,
)
from sixlab.stamp import DropReason
from sixlab.stamp.batch import (
    LOOP_EVICT,
    LOOP_SENT,
    due_seq,
    loop_handback,
    loop_hold,
    loop_record,
    loop_state,
    receive_batch,
    receive_one,
    receive_record,
    send_due,
    send_template,
    sent_at,
)
from sixlab.stamp.flows import flow_label_for
from sixlab.stamp.reflector import PacketContext, Reflector, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig, SenderCounters, SenderSession, State
from sixlab.wire import stamp as wire
from sixlab.wire.timestamp import TimestampFormat

__all__ = [
    "DEFAULT_FIFO_CAPACITY",
    "DEFAULT_TICK_NS",
    "EngineCounters",
    "ReflectorEngine",
    "ScheduleStats",
    "SenderEngine",
    "SenderSessionSpec",
    "SessionSnapshot",
]

IPv6Address = ipaddress.IPv6Address
ip_address = ipaddress.ip_address
#: Records kept per session until fetched: at 1000 packets/s, about 100 s of results.
DEFAULT_FIFO_CAPACITY = 100_000
#: The least time between two runs of a sender engine's timers: with thousands of
#: sessions their slots are microseconds apart, and a wake-up per slot (a select, the
#: kernel's timer, the loop's own work) would cost more than the packet it sends. Every
#: slot that falls within a tick is served at its end, so a packet leaves up to a tick
#: after its slot (benchmarks/README.md, "One sender agent, socket plane").
DEFAULT_TICK_NS = 250_000
#: Replies wait for the next run of the timers, rather than wake the loop themselves,
#: while that run is due within this many ticks (2 ms with the default tick): a
#: reply's T4 is the kernel's and its age moves ``now`` back (``SenderEngine._deliver``),
#: so only its record comes later, and at 1,000 packets/s a wake-up per reply would
#: nearly double the wake-ups, each of which costs more than the packet it serves
#: (benchmarks/README.md, "One sender agent, socket plane").
_HOLD_TICKS = 8
#: The longest one call of the compiled run loop runs (``SenderEngine.loop_slice_ns``):
#: what it did reaches the sessions' FIFOs and waiters at least this often. The loop
#: sends nothing while the engine files what it did (but for one pass per tick of
#: filing, ``SenderEngine._apply_loop``), so a shorter slice shortens that pause at the
#: cost of more returns from C: 2 ms against 20 ms took slip p99 from
#: 1.3-1.9 ms to 0.4-1.7 ms at 10,000 probes/s for 0-5 µs more per probe
#: (benchmarks/README.md, "The compiled run loop").
DEFAULT_LOOP_SLICE_NS = 2_000_000
#: While the engine files the run loop's records, how many go between two looks at the
#: clock for a pass of the loop (``SenderEngine._apply_loop``).
_POLL_EVERY = 8
#: The loop re-checks its stop flag at least this often even when nothing happens.
_IDLE_WAKE_S = 0.5
_ZERO_ADDR = bytes(16)
#: Packets taken from a data plane per call (the planes' ``receive`` default).
_BATCH = 64
#: Reflected frames per ``collect_frames`` call.
_FRAMES_BATCH = 256
#: <linux/prctl.h>: set the calling thread's timer slack (``SenderEngine``'s
#: ``timer_slack_ns``).
_PR_SET_TIMERSLACK = 29

Clock = Callable[[], int]
#: Reads a data flow's (packets sent, packets received) so far (direct-mode loss).
DataCounterSource = Callable[[], tuple[int, int]]


class _Waker:
    """A self-pipe so that configuration changes wake the engine's select()."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self.w, False)

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self.w, b"x")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.r, 512):
                pass

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


@dataclass(slots=True)
class EngineCounters:
    """Packets seen by an engine, and what it could not hand to a session."""

    received: int = 0
    no_session: int = 0
    send_failed: int = 0
    #: Reads of a session's data counters that failed (docs/srpm.md, direct-mode loss).
    data_counter_failed: int = 0
    #: Datagrams longer than the data plane's receive buffer, so cut (``Received``):
    #: malformed, handed to no session, whatever SSID their first bytes carry.
    truncated: int = 0


class _Loop:
    """The thread and wake-up plumbing both engines share."""

    def __init__(self, dataplane: Dataplane, clock: Clock, name: str) -> None:
        self.dataplane = dataplane
        self.clock = clock
        self.lock = threading.RLock()
        self.counters = EngineCounters()
        self._waker = _Waker()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._waker.wake()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._waker.close()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def wake(self) -> None:
        self._waker.wake()

    def _run(self) -> None:
        fds = [self.dataplane.fileno(), self._waker.r]
        waker = fds[1:]
        try:
            while not self._stop.is_set():
                timeout, poll = self._wait()
                # ``poll``: the next wake-up is near anyway, so the data plane does not
                # wake the loop; what it has is read at that wake-up (_wait).
                readable, _, _ = select.select(waker if poll else fds, [], [], timeout)
                if self._waker.r in readable:
                    self._waker.drain()
                if poll or fds[0] in readable:
                    self._on_readable()
                self._on_tick()
                self.dataplane.flush()
        except BaseException as exc:  # noqa: BLE001 - kept for the owner to report
            self.error = exc

    def _on_readable(self) -> None:
        """Take what the data plane has, batch by batch, until a batch comes short."""
        batch = self.dataplane.receive()
        while batch:
            self._on_batch(batch)
            batch = self.dataplane.receive() if len(batch) >= _BATCH else []

    def _timeout(self) -> float:
        return _IDLE_WAKE_S

    def _wait(self) -> tuple[float, bool]:
        """How long the loop may sleep (s), and whether it reads the data plane at its
        next wake-up whatever the plane says (False: the plane's descriptor wakes it)."""
        return self._timeout(), False

    def _on_batch(self, batch: list[Received]) -> None:
        raise NotImplementedError

    def _on_tick(self) -> None:
        """Called after every wake-up."""

    def _send(
        self,
        payload: bytes,
        dst: IPAddress,
        port: int,
        segments: tuple[IPv6Address, ...] | None,
        src: IPAddress | None,
        *,
        tclass: int | None = None,
        flow_label: int | None = None,
    ) -> None:
        try:
            if flow_label is None:
                self.dataplane.send(payload, dst, port, segments=segments, src=src, tclass=tclass)
            elif isinstance(dst, IPv6Address) and (src is None or isinstance(src, IPv6Address)):
                self.dataplane.send_labelled(
                    payload, dst, port, flow_label, segments=segments, src=src
                )
            else:
                raise DataplaneError("a flow label needs IPv6")  # noqa: TRY301 - counted below
        except DataplaneError:
            self.counters.send_failed += 1

    def _read_data(self, source: DataCounterSource) -> tuple[int, int] | None:
        """A data counter source's reading, or None (counted) when it fails."""
        try:
            return source()
        except (OSError, RuntimeError):
            self.counters.data_counter_failed += 1
            return None


# --------------------------------------------------------------------------- reflector


class ReflectorEngine(_Loop):
    """Answers Session-Sender packets with a ``Reflector`` core over a data plane.

    Fast path: a plane with ``has_fast_path`` (the ``mmap`` plane) is handed the core's
    ``reflect`` and answers plain packets itself, from its receive ring into its TX ring,
    with no per-packet objects but the reply; a plane with ``reflect_frames`` (the
    ``afxdp`` plane) is handed the ``Reflector`` and answers whole batches with
    ``sixlab.stamp.batch``. What they cannot answer comes back as ``Received`` for the
    general path below. ``fast_batch`` (default: the plane's ``fast_batch``, else 64)
    bounds the packets per call,
    and so how long the lock is held and (the plane kicks its TX ring at least once per
    call) how far a reply's departure may trail its T3 under load. ``fast_path=False``
    keeps the general path for every packet.
    """

    def __init__(
        self,
        dataplane: Dataplane,
        reflector: Reflector,
        clock: Clock = time.time_ns,
        *,
        fast_path: bool = True,
        fast_batch: int | None = None,
    ) -> None:
        super().__init__(dataplane, clock, "stamp-reflector")
        self.reflector = reflector
        self.fast_batch = fast_batch or int(getattr(dataplane, "fast_batch", _BATCH))
        self._fast: Callable[[ReflectFn, Clock, int], FastBatch] | None = (
            dataplane.reflect_batch if fast_path and dataplane.has_fast_path else None
        )
        frames = getattr(dataplane, "reflect_frames", None) if fast_path else None
        if frames is not None:
            self._fast = lambda _reflect, clk, n: frames(reflector, clk, n)
        dataplane.set_restamp(lambda payload: reflector.restamp(payload, clock()))

    # -- control (any thread) ----------------------------------------------------------
    # The one place sessions change on a reflector: the core under the engine lock, then
    # the data plane's hook (a plane that answers in the kernel needs the session too).
    # A plane that refuses leaves the core as it was.

    def add_session(
        self, config: ReflectorSessionConfig, data_counters: DataCounterSource | None = None
    ) -> None:
        """Answer the SSID of ``config`` (use ``set_default`` for the SSID-agnostic one);
        ``data_counters`` fills Direct Measurement TLVs with the data flow's counts."""
        with self.lock:
            self.reflector.add_session(config)
            try:
                self.dataplane.reflector_session_added(config)
            except BaseException:
                assert config.ssid is not None  # add_session refused None
                self.reflector.remove_session(config.ssid)
                raise
            if data_counters is not None:
                assert config.ssid is not None
                source = data_counters
                self.reflector.set_data_source(config.ssid, lambda: self._read_data(source))

    def remove_session(self, ssid: int) -> tuple[int, dict[DropReason, int]]:
        """Stop answering ``ssid``; the core's (replies, drops by reason) of the session."""
        with self.lock:
            counts = self.reflector.session_counters(ssid)
            self.reflector.remove_session(ssid)
            self.dataplane.reflector_session_removed(ssid)
            return counts

    def set_default(self, config: ReflectorSessionConfig | None) -> None:
        """Answer every SSID without a session of its own with ``config`` (None: stop)."""
        with self.lock:
            self.reflector.set_default(config)
            if config is None:
                self.dataplane.reflector_session_removed(None)
                return
            try:
                self.dataplane.reflector_session_added(config)
            except BaseException:
                self.reflector.set_default(None)
                raise

    def _on_readable(self) -> None:
        fast = self._fast
        if fast is None:
            super()._on_readable()
            return
        reflect = self.reflector.reflect
        counters = self.counters
        while True:
            with self.lock:
                consumed, handled, failed, slow = fast(reflect, self.clock, self.fast_batch)
            counters.received += handled
            counters.send_failed += failed
            if slow:
                self._on_batch(slow)
            if consumed < self.fast_batch:
                return

    def _on_batch(self, batch: list[Received]) -> None:
        clock = self.clock
        reflect = self.reflector.reflect
        sets_tclass = self.dataplane.sets_tclass
        self.counters.received += len(batch)
        for rx in batch:
            if rx.truncated:
                self.counters.truncated += 1
                continue
            payload = rx.payload
            context = None
            if len(payload) > wire.UNAUTH_PACKET_SIZE:  # TLVs may ask for addresses
                context = PacketContext(
                    ip_address(rx.src),
                    ip_address(rx.dst),
                    rx.src_port,
                    rx.dst_port,
                    rx.tclass,
                    sets_tclass,
                )
            with self.lock:
                out = reflect(
                    payload, rx.rx_ns or clock(), clock, rx.hop_limit, context, flow=rx.flow
                )
            if out is None:
                continue
            route = out.return_path
            dst = route.address if route.address is not None else ip_address(rx.src)
            src = ip_address(rx.dst) if any(rx.dst) else None
            if src is not None and src.version != dst.version:
                src = None  # a Return Address of the other family: the kernel picks
            self._send(out.payload, dst, rx.src_port, route.segments, src, tclass=out.tclass)


# ------------------------------------------------------------------------------ sender


def _announced(spec: SenderSessionSpec, plane: Dataplane) -> bool:
    """Whether the plane hears of the session (``sender_session_added``). A plane that
    rebuilds replies from what it collected (``xdp``) would read a loopback session's
    own Session-Sender packets as reflector packets: it never hears of one, and the
    session's packets take the plane's ordinary path. Other planes (``afxdp``) must, or
    its packets would not reach user space at all."""
    return not (spec.config.loopback and plane.rebuilds_replies)


def _batchable(spec: SenderSessionSpec) -> bool:
    """Whether the session's packets and replies may take ``sixlab.stamp.batch``
    (``send_due``, ``receive_one``, ``receive_batch`` on arrays): plain reflector packets
    of an unauthenticated session without flow labels or Direct Measurement TLV that
    counts no data flow (records of the batch path carry neither; a loopback session's
    replies are its own Session-Sender packets, docs/srpm.md)."""
    cfg = spec.config
    return not (
        cfg.authenticated
        or cfg.loopback
        or cfg.flow_labels
        or cfg.direct_measurement
        or spec.data_counters is not None
    )


@dataclass(frozen=True, slots=True)
class SenderSessionSpec:
    """A session as the sender engine runs it: the core's config plus where to send."""

    config: SenderConfig
    reflector: IPAddress
    reflector_port: int = wire.STAMP_PORT
    #: The SRv6 path to the reflector, travel order; the reflector closes it if absent.
    segments: tuple[IPv6Address, ...] | None = None
    source: IPAddress | None = None
    #: The data flow's counts, for a session with direct-mode loss (docs/srpm.md).
    data_counters: DataCounterSource | None = None


@dataclass(frozen=True, slots=True)
class ScheduleStats:
    """How well the engine kept a session's send schedule, start + k × interval (the
    core sends one packet for the latest slot due when its timer runs late, and skips
    the slots before it rather than bursting)."""

    #: Slots passed over: the engine came too late for them and sent no packet.
    skipped: int = 0
    #: Packets sent, and how late they left after their slots (ns): in total and the most.
    sent: int = 0
    late_ns_total: int = 0
    late_ns_max: int = 0


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    ssid: int
    state: State
    counters: SenderCounters
    fifo_len: int
    overflow: int
    schedule: ScheduleStats = ScheduleStats()


@dataclass(slots=True)
class _Batch:
    """Packets of one timer run that go out in one ``ProbeIO.send``: their records,
    Seqs and sessions."""

    buf: bytearray = field(default_factory=bytearray)
    seqs: array.array[int] = field(default_factory=lambda: array.array("I"))
    entries: list[tuple[_SenderEntry, int]] = field(default_factory=list)


@dataclass(slots=True)
class _SenderEntry:
    spec: SenderSessionSpec
    session: SenderSession
    #: Records not yet removed, by ids counting from 1 in arrival order, and loss
    #: reports not yet removed, by ids counting from 1 in the order declared.
    fifo: IdQueue[ev.StampResult] = field(default_factory=IdQueue)
    lost: IdQueue[ev.PacketLost] = field(default_factory=IdQueue)
    #: Records and loss reports dropped for room, and records removed.
    overflow: int = 0
    fetched: int = 0
    #: The timer this entry has in the engine's heap (None: none), on the monotonic clock.
    timer: int | None = None
    #: The session's fixed packet after Seq and T1 when its packets and replies take
    #: ``send_due`` and ``receive_one`` (``_batchable``), else None: the reference.
    template: bytes | None = None
    #: Sends to the session's reflector (``Dataplane.sender``), made at the first send.
    sender: Callable[[bytes], None] | None = None
    #: The session's entry in a batched send (``ProbeIO.record``), made at the first
    #: send; None: it sends one by one (``sender``). ``record_made``: whether tried.
    record: bytes | None = None
    record_made: bool = False
    #: The routing header its batch goes with (``ProbeIO.path``): the SRv6 path's,
    #: ``b""`` for none, None for an IPv4 reflector.
    rthdr: bytes | None = None
    #: The schedule's origin (monotonic ns; None until started), the slot of the last
    #: packet sent, and the schedule's statistics (``ScheduleStats``' fields).
    start: int | None = None
    last_slot: int = -1
    skipped: int = 0
    on_slot: int = 0
    late_ns_total: int = 0
    late_ns_max: int = 0
    #: ``spec.config``'s SSID and interval (ns), kept here for the per-probe work.
    ssid: int = 0
    interval: int = 0
    #: The session's index in the compiled run loop while the loop sends its packets
    #: (``SenderEngine.send_loop``), else None.
    loop_idx: int | None = None

    @property
    def schedule(self) -> ScheduleStats:
        return ScheduleStats(self.skipped, self.on_slot, self.late_ns_total, self.late_ns_max)


class SenderEngine(_Loop):
    """Runs Session-Sender sessions over a data plane and queues their results."""

    def __init__(
        self,
        dataplane: Dataplane,
        clock: Clock = time.time_ns,
        fifo_capacity: int = DEFAULT_FIFO_CAPACITY,
        on_event: Callable[[ev.Event], None] | None = None,
        *,
        monotonic: Clock = time.monotonic_ns,
        tick_ns: int = DEFAULT_TICK_NS,
        fast_path: bool = True,
        compiled: bool = True,
        compiled_loop: bool = True,
        timer_slack_ns: int | None = None,
        realtime_priority: int | None = None,
    ) -> None:
        """``clock``: the wall clock (T1, T4); ``monotonic``: the schedules' clock;
        ``tick_ns``: the least time between two runs of the timers (0: none), see
        ``DEFAULT_TICK_NS``; ``fast_path=False`` keeps every session on the core's
        reference ``handle_timer`` and ``receive`` (else the sessions ``_batchable``
        takes go through ``send_due`` and ``receive_one``, sixlab.stamp.batch).

        ``compiled``: on a plane with ``probe_io`` (the ``socket`` plane, when its C
        helper builds: ``sixlab.dataplane.probeio``) those sessions' packets of one run
        of the timers leave in one ``sendmmsg``, T1 read in C right before it, and
        replies come in through ``recvmmsg`` (``_deliver_records``), one batch per SRv6
        path (``_Batch``); sessions with a source address, and every other packet, take
        the Python path.
        The C path reads the system's wall clock itself, so it is used only with
        ``clock=time.time_ns``.

        ``compiled_loop`` (with ``compiled``, and ``monotonic=time.monotonic_ns``, the
        clock the C loop reads): once started, the sessions the core lets it run
        (``sixlab.stamp.batch.loop_state``: no count or duration, TLV, stateful
        reflector; here also no SRv6 path) are served in C (``probeio.SendLoop``: the
        schedule, sends, replies matched, losses; the GIL released while it runs and
        sleeps), and the engine files what it did (``loop_record``). Every reply it
        does not answer comes to the Python path as before; a session stopped,
        removed, or answered oddly goes back to its core (docs/architecture.md,
        "Time").

        ``timer_slack_ns``: the engine thread's timer slack (``PR_SET_TIMERSLACK``;
        None: the kernel's, 50 µs by default, by which it may defer a wake-up to group
        it with others). 1 ns did not pay at 10,000 probes/s: more system time, no
        steadier slip (benchmarks/README.md, "One sender agent, socket plane").

        ``realtime_priority``: run the engine thread (alone, not the process) under
        ``SCHED_FIFO`` at this priority (1-99; needs ``CAP_SYS_NICE``). On a loaded host
        an ordinary thread's wake-ups wait for the CPU by milliseconds, and that, not
        the engine's work, set the slip tail (benchmarks/README.md, "Where the slip
        tail comes from"). Set by ``start``; a refusal leaves the thread's scheduling
        as it was: ``realtime`` stays False and ``realtime_error`` says why. The thread
        sleeps between ticks; were it ever to spin, the kernel's real-time throttling
        (``sched_rt_runtime_us``) caps it at 95 % of a CPU by default."""
        if realtime_priority is not None and not 1 <= realtime_priority <= 99:
            raise ValueError(f"realtime_priority: {realtime_priority}, not 1-99 (SCHED_FIFO)")
        super().__init__(dataplane, clock, "stamp-sender")
        self.monotonic = monotonic
        self.tick_ns = tick_ns
        self.fast_path = fast_path
        self.compiled = compiled
        self.compiled_loop = compiled_loop
        self.timer_slack_ns = timer_slack_ns
        self.realtime_priority = realtime_priority
        #: Whether the engine thread runs under SCHED_FIFO (``realtime_priority``).
        self.realtime = False
        #: Why ``realtime_priority`` was refused (None: asked for and granted, or not asked).
        self.realtime_error: str | None = None
        #: The plane's batched probe path, once the loop runs (None: the Python path).
        self.probe_io: probeio.ProbeIO | None = None
        #: The compiled run loop, once the loop runs (None: the Python schedule).
        self.send_loop: probeio.SendLoop | None = None
        #: The longest one call of the run loop lasts (``DEFAULT_LOOP_SLICE_NS``); with
        #: ``loop_thread`` how often this thread files what the loop did at least.
        self.loop_slice_ns = DEFAULT_LOOP_SLICE_NS
        #: Passes of the run loop while this thread files what a call did
        #: (``_apply_loop``), every tick.
        self.loop_passes = True
        #: The run loop on a thread of its own (``_run_threaded``), set before ``start``.
        self.loop_thread = False
        #: The run loop's resume pipe while it runs on its own thread (``_run_threaded``).
        self._resume: int | None = None
        #: Sessions with an SRv6 path (``_on_tick_exclusive``).
        self._segmented = 0
        #: The sessions in ``send_loop`` by their index there, and the free indexes.
        self._loop_entries: list[_SenderEntry | None] = []
        self._loop_free: list[int] = []
        #: When timers last ran (monotonic ns).
        self._last_run = -tick_ns
        self.fifo_capacity = fifo_capacity
        self.on_event = on_event
        self._entries: dict[int, _SenderEntry] = {}
        #: The sessions the run loop does not hold, by their reflector's (packed
        #: address, port) and SSID: the only ones a reply with SSID 0 from there can
        #: answer on the Python path (``_match_ssid_zero``).
        self._by_peer: dict[tuple[bytes, int], dict[int, _SenderEntry]] = {}
        #: Timers of every session, (when, tie-breaker, ssid): the loop pops what is due
        #: instead of asking every session. An entry whose ``timer`` differs is stale.
        self._heap: list[tuple[int, int, int]] = []
        self._pushes = itertools.count()
        self._cond = threading.Condition(self.lock)
        #: Bumped whenever a waiter may have something new: a record, a loss report, a
        #: session finished or removed (see ``wait_change``).
        self._version = 0
        #: Records or ends filed that waiters have not been woken for (``_notify_pending``).
        self._pending = False

    def start(self) -> None:
        make = getattr(self.dataplane, "probe_io", None)
        if self.compiled and self.fast_path and make is not None and self.clock is time.time_ns:
            with contextlib.suppress(DataplaneError):  # not open: the loop reports it
                self.probe_io = make()
            if (
                self.probe_io is not None
                and self.compiled_loop
                and self.monotonic is time.monotonic_ns
            ):
                self.send_loop = self.probe_io.send_loop()
        super().start()
        if self.realtime_priority is not None:
            self._go_realtime(self.realtime_priority)

    def shutdown(self, timeout: float = 5.0) -> None:
        super().shutdown(timeout)
        loop = self.send_loop
        if loop is not None and not self.running:  # still in C: leave it allocated
            loop.close()

    def _run(self) -> None:
        if self.timer_slack_ns is not None:  # this thread's; a refusal leaves the default
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(self.timer_slack_ns), 0, 0, 0)
        if self.send_loop is None:
            super()._run()
            return
        try:
            self._run_compiled(self.send_loop)
        except BaseException as exc:  # noqa: BLE001 - kept for the owner to report
            self.error = exc

    def _go_realtime(self, priority: int) -> None:
        """The engine thread, once started, under SCHED_FIFO (by its thread id: the
        policy is per thread on Linux), or the refusal kept in ``realtime_error``."""
        tid = self._thread.native_id
        assert tid is not None  # started
        try:
            os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(priority))
        except OSError as exc:
            self.realtime_error = f"SCHED_FIFO priority {priority}: {exc.strerror}"
            return
        self.realtime = True

    def _run_compiled(self, loop: probeio.SendLoop) -> None:
        """The loop with the compiled run loop: ``SendLoop.run`` serves the sessions it
        holds and reads every reply, until the next Python timer (sessions it does not
        hold, loss deadlines of stopped ones), a control call's wake-up, replies it
        leaves to Python, or a full out buffer; then, under the lock, its records go to
        the cores (``_sync_loop``) and the Python timers run."""
        if self.loop_thread:
            self._run_threaded(loop)
            return
        pio = self.probe_io
        assert pio is not None
        waker = self._waker.r
        hold = _HOLD_TICKS * self.tick_ns
        while not self._stop.is_set():
            with self.lock:
                timeout, _ = self._wait()
                until = self.monotonic() + min(int(timeout * 1e9), self.loop_slice_ns)
                if self._loop_entries:
                    pio.clear_routing_header()  # the loop's sends carry none
            try:
                why = loop.run(waker, until, self.tick_ns, hold)
            except OSError as exc:
                raise DataplaneError(f"socket: receive failed: {exc.strerror}") from exc
            if why & probeio.LOOP_WAKER:
                self._waker.drain()
            with self.lock:
                self._sync_loop(loop, poll=(waker, hold) if self.loop_passes else None)
            self._on_tick()
            self.dataplane.flush()

    def _run_threaded(self, loop: probeio.SendLoop) -> None:
        """``loop_thread``: the run loop on a thread of its own that stays in C (it
        writes a byte to a pipe when it leaves replies for Python or its records are
        full, and goes on), while this thread files its records every slice or when
        told, runs the Python timers, and tells it to look again (a byte on ``resume``).
        The loop's sends go on while Python files what it did."""
        pio = self.probe_io
        assert pio is not None
        notify_r, notify_w = os.pipe()
        resume_r, resume_w = os.pipe()
        stop_r, stop_w = os.pipe()
        for fd in (notify_r, notify_w, resume_r, resume_w):
            os.set_blocking(fd, False)
        self._resume = resume_w
        hold = _HOLD_TICKS * self.tick_ns
        failed: list[BaseException] = []

        def drive() -> None:
            try:
                while not self._stop.is_set():
                    until = self.monotonic() + int(_IDLE_WAKE_S * 1e9)
                    loop.run(stop_r, until, self.tick_ns, hold, notify=notify_w, resume=resume_r)
            except BaseException as exc:  # noqa: BLE001 - reported by the engine thread
                failed.append(exc)
                self.wake()

        with self.lock:
            pio.clear_routing_header()  # the loop's sends carry none
        runner = threading.Thread(target=drive, name="stamp-sender-loop", daemon=True)
        runner.start()
        fds = [self._waker.r, notify_r]
        try:
            while not self._stop.is_set() and not failed:
                timeout, _ = self._wait()
                wait = min(timeout, self.loop_slice_ns / 1e9)
                readable, _, _ = select.select(fds, [], [], wait)
                if self._waker.r in readable:
                    self._waker.drain()
                if notify_r in readable:
                    with contextlib.suppress(BlockingIOError):
                        os.read(notify_r, 512)
                with self.lock:
                    self._sync_loop(loop)
                    self._on_tick_exclusive(loop, pio)
                with contextlib.suppress(BlockingIOError):
                    os.write(resume_w, b"x")
                self.dataplane.flush()
            if failed:
                raise DataplaneError(f"socket: the run loop failed: {failed[0]}")
        finally:
            self._resume = None
            os.write(stop_w, b"x")
            runner.join(5.0)
            for fd in (notify_r, notify_w, resume_r, resume_w, stop_r, stop_w):
                os.close(fd)

    def _on_tick_exclusive(self, loop: probeio.SendLoop, pio: probeio.ProbeIO) -> None:
        """``_on_tick`` beside a run loop on its own thread (lock held): with the loop's
        mutex when a session has an SRv6 path, whose sends on the heap set the socket's
        sticky routing header (cleared again before the loop sends)."""
        if not self._segmented:
            self._on_tick()
            return
        loop.lock()
        try:
            self._on_tick()
            pio.clear_routing_header()
        finally:
            loop.unlock()

    # -- control (any thread) ----------------------------------------------------------

    def add_session(self, spec: SenderSessionSpec) -> None:
        ssid = spec.config.ssid
        with self.lock:
            if ssid in self._entries:
                raise ev.SessionConfigError(f"ssid: session {ssid} already exists")
            if spec.config.flow_labels and not self.dataplane.sets_flow_label:
                raise ev.SessionConfigError(
                    f"flow_labels: the {self.dataplane.name} data plane cannot set flow "
                    "labels (the socket plane can)"
                )
            entry = _SenderEntry(spec, SenderSession(spec.config))
            entry.ssid, entry.interval = ssid, spec.config.interval_ns
            if self.fast_path and _batchable(spec):
                entry.template = send_template(spec.config)
            self._entries[ssid] = entry
            self._unheld(entry, True)
            self._segmented += bool(spec.segments)
            if not _announced(spec, self.dataplane):
                return
            try:
                self.dataplane.sender_session_added(ssid)
            except BaseException:
                self._forget(entry)
                raise

    def start_session(self, ssid: int) -> None:
        with self.lock:
            entry = self._entry(ssid)
            now = self.monotonic()
            self._feed_data(entry)
            # With a run loop, its mutex from the first packet until the loop has the
            # session: the reply must not reach the loop before the session does (and
            # the socket's sticky SRv6 header, set for this send, must not be on the
            # loop's packets).
            loop = self.send_loop
            if loop is not None:
                loop.lock()
            try:
                entry.session.start(now, self.clock())
                entry.start = now
                self._pump(entry, now)
                self._arm(entry)
                if loop is not None:
                    if entry.spec.segments:
                        assert self.probe_io is not None
                        self.probe_io.clear_routing_header()
                    self._adopt(entry)
            finally:
                if loop is not None:
                    loop.unlock()
            self._notify_pending()
            if self._resume is not None:  # its heap changed: the loop looks again
                with contextlib.suppress(BlockingIOError):
                    os.write(self._resume, b"x")
        self.wake()

    def stop_session(self, ssid: int) -> None:
        with self.lock:
            entry = self._entry(ssid)
            self._evict(entry)
            entry.session.stop()
            self._pump(entry)
            self._arm(entry)
            self._notify_pending()
        self.wake()

    def remove_session(self, ssid: int) -> None:
        with self.lock:
            entry = self._entry(ssid)
            self._evict(entry)
            if entry.session.state in (State.RUNNING, State.DRAINING):
                entry.session.stop()
            self._forget(entry)
            if _announced(entry.spec, self.dataplane):
                self.dataplane.sender_session_removed(ssid)
            self._notify()

    def _forget(self, entry: _SenderEntry) -> None:
        """Take the session out of the engine's tables (lock held)."""
        spec = entry.spec
        del self._entries[entry.ssid]
        self._unheld(entry, False)
        self._segmented -= bool(spec.segments)

    def _unheld(self, entry: _SenderEntry, unheld: bool) -> None:
        """Put the session in ``_by_peer`` (it runs on the Python path) or take it out
        (the run loop holds it, or it went), lock held."""
        spec = entry.spec
        key = (spec.reflector.packed, spec.reflector_port)
        if unheld:
            self._by_peer.setdefault(key, {})[entry.ssid] = entry
            return
        peer = self._by_peer.get(key)
        if peer is not None:
            peer.pop(entry.ssid, None)
            if not peer:
                del self._by_peer[key]

    def sessions(self) -> list[int]:
        with self.lock:
            return sorted(self._entries)

    def snapshot(self, ssid: int) -> SessionSnapshot:
        with self.lock:
            e = self._entry(ssid)
            schedule = e.schedule
            loop = self.send_loop
            if loop is not None and e.loop_idx is not None:
                held = self._sync_loop(loop, e.loop_idx)
                if held is not None:
                    schedule = ScheduleStats(
                        e.skipped + held.skipped,
                        e.on_slot + held.on_slot,
                        e.late_ns_total + held.late_ns_total,
                        max(e.late_ns_max, held.late_ns_max),
                    )
            c = e.session.counters
            copy = dataclasses.replace(c, dropped=dict(c.dropped))
            return SessionSnapshot(ssid, e.session.state, copy, len(e.fifo), e.overflow, schedule)

    def results(self, ssid: int, max_items: int | None = None) -> list[ev.StampResult]:
        """Drain up to ``max_items`` queued records of a session (polling mode)."""
        with self.lock:
            return self._drain(self._entry(ssid), max_items)

    def wait_results(
        self, ssid: int, timeout: float, max_items: int | None = None
    ) -> list[ev.StampResult]:
        """Like ``results`` but waits up to ``timeout`` s for at least one (push mode).

        Returns an empty list on timeout and when the session finished with nothing left.
        """

        def ready() -> bool:
            entry = self._entry(ssid)
            return bool(entry.fifo) or entry.session.state is State.FINISHED

        with self._cond:
            if not self._cond.wait_for(ready, timeout):
                return []
            return self._drain(self._entry(ssid), max_items)

    def wait_change(self, seen: int, timeout: float) -> int:
        """Wait up to ``timeout`` s for a change after ``seen`` (a value this returned
        before; -1 at first): a record or loss report queued, a session finished or
        removed, in any session. Returns the current value, for the next call."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != seen, timeout)
            return self._version

    def last_id(self, ssid: int) -> int:
        """The id of the newest record of the session (queued or not): records with
        higher ids are yet to come; 0 before the first."""
        with self.lock:
            return self._entry(ssid).fifo.last_id

    def lost(self, ssid: int, max_items: int | None = None) -> list[ev.PacketLost]:
        """Drain the loss events of a session (each lost Seq once), the oldest
        ``max_items`` of them if given (the rest stay for the next call)."""
        with self.lock:
            return self._entry(ssid).lost.pop(max_items)

    def peek_lost(
        self, ssid: int, after: int, max_items: int | None = None
    ) -> list[tuple[int, ev.PacketLost]]:
        """The loss events with ids above ``after`` (up to ``max_items``), with their
        ids, left queued: cursor mode for loss events, as ``peek`` for records."""
        with self.lock:
            return self._entry(ssid).lost.after(after, max_items)

    def lost_after(self, ssid: int, after: int) -> bool:
        """Whether loss events with ids above ``after`` are queued (``peek_lost`` would
        return some)."""
        with self.lock:
            return self._entry(ssid).lost.has_after(after)

    def acknowledge_lost(self, ssid: int, through: int) -> int:
        """Remove the loss events with ids up to ``through``; returns how many went."""
        with self.lock:
            return self._entry(ssid).lost.acknowledge(through)

    def wait_finished(self, ssid: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: self._entry(ssid).session.state is State.FINISHED, timeout
            )

    # -- the loop (engine thread) ------------------------------------------------------

    def _entry(self, ssid: int) -> _SenderEntry:
        try:
            return self._entries[ssid]
        except KeyError:
            raise ev.SessionConfigError(f"ssid: no session {ssid}") from None

    def _drain(self, entry: _SenderEntry, max_items: int | None) -> list[ev.StampResult]:
        out = entry.fifo.pop(max_items)
        entry.fetched += len(out)
        return out

    def fetch(
        self, ssid: int, after: int, max_items: int = 1000, timeout: float = 0.0
    ) -> list[tuple[int, ev.StampResult]]:
        """At-least-once delivery with acknowledgement, for a controller that must store
        every record exactly once even across its own restarts.

        Every record with an id up to ``after`` is acknowledged (removed); up to
        ``max_items`` of the following ones are returned with their ids and stay queued
        until a later call acknowledges them. Waits up to ``timeout`` s for one to come.
        A gap in the ids is records the FIFO had to drop (``overflow``).
        """
        self.acknowledge(ssid, after)
        return self.peek(ssid, after, max_items, timeout)

    def acknowledge(self, ssid: int, through: int) -> int:
        """Remove the records with ids up to ``through``; returns how many went."""
        with self.lock:
            entry = self._entry(ssid)
            n = entry.fifo.acknowledge(through)
            entry.fetched += n
            return n

    def peek(
        self, ssid: int, after: int, max_items: int = 1000, timeout: float = 0.0
    ) -> list[tuple[int, ev.StampResult]]:
        """Up to ``max_items`` records with ids above ``after``, left queued (waits up to
        ``timeout`` s for one; returns at once when the session has finished)."""

        def ready() -> bool:
            entry = self._entry(ssid)
            return entry.fifo.has_after(after) or entry.session.state is State.FINISHED

        with self._cond:
            self._cond.wait_for(ready, timeout)
            return self._entry(ssid).fifo.after(after, max_items)

    def _adopt(self, entry: _SenderEntry) -> None:
        """Hand a started session to the compiled run loop if it takes it (lock and the
        loop's mutex held):
        a session on ``send_due`` with a batched-send record and no SRv6 path whose
        core says the loop can run it (``loop_state``). Its timers leave the heap; its
        packets outstanding go with it (``loop_hold``)."""
        loop, pio = self.send_loop, self.probe_io
        if loop is None or pio is None or entry.template is None or entry.start is None:
            return
        session = entry.session
        state = loop_state(session)
        record = self._record(entry, pio) if state is not None else None
        if state is None or record is None or entry.rthdr not in (b"", None):
            return
        cfg = entry.spec.config
        tai = cfg.tai_utc_offset_ns if cfg.fmt is TimestampFormat.PTP else 0
        loss = cfg.loss_timeout_ns
        timing = (state.next_send, entry.interval, entry.start, entry.last_slot, loss, tai)
        idx = self._loop_free.pop() if self._loop_free else len(self._loop_entries)
        added = loop.add(
            idx,
            record,
            ssid=entry.ssid,
            timing=timing,
            seq=state.next_seq,
            highest=state.highest,
            window=state.window,
            outstanding=state.outstanding,
            answered=state.answered,
            echoed=state.echoed,
        )
        if not added:
            if idx < len(self._loop_entries):
                self._loop_free.append(idx)
            return
        if idx == len(self._loop_entries):
            self._loop_entries.append(entry)
        else:
            self._loop_entries[idx] = entry
        loop_hold(session)
        entry.loop_idx = idx
        entry.timer = None  # what the heap holds of it is stale now
        self._unheld(entry, False)

    def _evict(self, entry: _SenderEntry) -> None:
        """Take a session back from the run loop (lock held): what the loop did so far
        goes to the cores first, then the session's schedule, packets outstanding and
        statistics come back to the entry and its core, which runs it from here on
        the heap."""
        loop, idx = self.send_loop, entry.loop_idx
        if loop is None or idx is None:
            return
        loop.lock()
        try:
            took, records = self._take(loop)
            held = loop.get(idx, remove=True)
        finally:
            loop.unlock()
        entry.loop_idx = None  # its LOOP_EVICT record, if any, is this
        self._apply_loop(loop, took, records)
        self._handback(entry, idx, held)
        if took.left:
            self._leftovers(loop, took.left)
        self._notify_pending()

    def _handback(self, entry: _SenderEntry, idx: int, held: probeio.LoopSession | None) -> None:
        """The Python half of ``_evict`` (lock held): ``held``, what the loop kept of
        the session at index ``idx`` (now out of it), back to the entry and the core."""
        entry.loop_idx = None
        self._loop_entries[idx] = None
        self._loop_free.append(idx)
        self._unheld(entry, True)
        if held is not None:
            loop_handback(entry.session, held.due, held.seq, held.outstanding, held.highest)
            entry.skipped += held.skipped
            entry.on_slot += held.on_slot
            entry.late_ns_total += held.late_ns_total
            entry.late_ns_max = max(entry.late_ns_max, held.late_ns_max)
            entry.last_slot = held.last_slot
        self._arm(entry)

    @staticmethod
    def _take(loop: probeio.SendLoop) -> tuple[probeio.LoopTake, bytes]:
        """The loop's records since the last take, copied (its mutex held): they are
        filed without the mutex, while the loop goes on (``_apply_loop``)."""
        took = loop.take()
        return took, bytes(memoryview(loop.out)[: took.records * probeio.LOOP_OUT.size])

    def _sync_loop(
        self,
        loop: probeio.SendLoop,
        idx: int | None = None,
        poll: tuple[int, int] | None = None,
    ) -> probeio.LoopSession | None:
        """What the run loop did since the last time to the cores (lock held), the
        datagrams it left handled; and the state of its session ``idx`` if given.
        ``poll`` (the engine thread only, the one that runs the loop): its waker fd and
        hold, for ``_apply_loop``'s passes of the loop while it files."""
        loop.lock()
        try:
            took, records = self._take(loop)
            held = None if idx is None else loop.get(idx)
        finally:
            loop.unlock()
        self._apply_loop(loop, took, records, poll)
        if took.left:
            self._leftovers(loop, took.left)
        self._notify_pending()
        return held

    def _apply_loop(
        self,
        loop: probeio.SendLoop,
        took: probeio.LoopTake,
        records: bytes,
        poll: tuple[int, int] | None = None,
    ) -> None:
        """The run loop's records to their sessions (lock held, not the loop's mutex):
        counters and events filed by ``loop_record``, ``PacketSent`` to ``on_event``; a
        session that left the loop (``LOOP_EVICT``) back to its core.

        The loop sends nothing while this runs, so with ``poll`` (waker fd, hold) one
        pass of it (``SendLoop.run`` with ``until`` now: the packets due sent, the
        replies read, into records the next take files) runs whenever a tick has gone
        by since the call returned or the last pass: no packet waits for the whole
        filing (benchmarks/README.md, "Where the slip tail comes from")."""
        counters = self.counters
        counters.send_failed += took.failed
        counters.received += took.received - took.left  # those: ``_deliver_records``
        if not records:
            return
        entries = self._loop_entries
        on_event = self.on_event
        pump = self._pump
        clock, tick = self.monotonic, self.tick_ns
        next_pass = clock() + tick if poll is not None else None
        for n, record in enumerate(probeio.LOOP_OUT.iter_unpack(records)):
            if next_pass is not None and not n % _POLL_EVERY and clock() >= next_pass:
                assert poll is not None
                try:
                    loop.run(poll[0], 0, tick, poll[1])
                except OSError as exc:
                    raise DataplaneError(f"socket: receive failed: {exc.strerror}") from exc
                next_pass = clock() + tick
            idx = record[4]
            entry = entries[idx]
            if entry is None:
                continue  # cannot be: a session leaves the loop after its records
            session = entry.session
            kind = record[8]
            if kind == LOOP_EVICT:
                if entry.loop_idx is not None:  # else ``_evict`` hands it back itself
                    loop.lock()
                    try:
                        held = loop.get(idx, remove=True)
                    finally:
                        loop.unlock()
                    self._handback(entry, idx, held)
                continue
            loop_record(session, record)
            if kind == LOOP_SENT:
                if on_event is not None:
                    on_event(ev.PacketSent(entry.ssid, record[5], record[0]))
            elif session.has_output:
                pump(entry)

    def _leftovers(self, loop: probeio.SendLoop, left: int) -> None:
        """The datagrams the run loop left at the start of the receive buffers (replies
        it does not answer: the sessions they could be for have left it), in the order
        they came, through the Python path (``_deliver_records``), lock held."""
        pio = self.probe_io
        assert pio is not None
        self._deliver_records(pio, left)
        loop.lock()
        try:
            loop.left_done()
        finally:
            loop.unlock()

    def _arm(self, entry: _SenderEntry) -> None:
        """Put the session's next timer in the heap if it changed (lock held); none
        while the run loop holds the session's schedule."""
        if entry.loop_idx is not None:
            return
        timer = entry.session.get_timer()
        if timer != entry.timer:
            entry.timer = timer
            if timer is not None:
                heapq.heappush(self._heap, (timer, next(self._pushes), entry.ssid))

    def _due(self) -> _SenderEntry | None:
        """The heap's earliest live timer's session, dropping stale ones (lock held)."""
        heap = self._heap
        while heap:
            when, _, ssid = heap[0]
            entry = self._entries.get(ssid)
            if entry is not None and entry.timer == when:
                return entry
            heapq.heappop(heap)
        return None

    def _timeout(self) -> float:
        return self._wait()[0]

    def _wait(self) -> tuple[float, bool]:
        """Until the earliest timer, but no sooner than one tick after the last run of
        timers; while the next run is due within ``_HOLD_TICKS`` ticks, replies wait for
        it (their T4 is the kernel's, their age moves ``now`` back: ``_deliver``)."""
        with self.lock:
            entry = self._due()
            if entry is None or entry.timer is None:
                return _IDLE_WAKE_S, False
            now = self.monotonic()
            wait = max(entry.timer - now, self._last_run + self.tick_ns - now)
        poll = 0 < wait <= _HOLD_TICKS * self.tick_ns
        return min(_IDLE_WAKE_S, max(0.0, wait / 1e9)), poll

    def _on_batch(self, batch: list[Received]) -> None:
        with self.lock:
            mono, wall = self.monotonic(), self.clock()
            self.counters.received += len(batch)
            deliver = self._deliver
            for rx in batch:
                deliver(rx, mono, wall)
            self._notify_pending()

    def _deliver(self, rx: Received, mono: int, wall: int) -> None:
        """One reflected packet to its session (lock held); ``mono``/``wall``: the
        monotonic and wall clocks read once for the batch it came in. A truncated one
        is counted and goes to no session: its session's state (the run loop may hold
        it) has nothing to say about a malformed packet."""
        if rx.truncated:
            self.counters.truncated += 1
            return
        entry = self._match(rx)
        if entry is None:
            self.counters.no_session += 1
            return
        # A reply is late by when it arrived, not by when the loop got to it:
        # its age (a short difference of wall times, T4 from the kernel) moves
        # the monotonic time back to its arrival.
        t4 = rx.rx_ns or wall
        arrived = mono - wall + t4 if t4 < wall else mono
        session = entry.session
        if entry.template is not None:
            receive_one(session, rx.payload, arrived, t4)
        else:
            self._feed_data(entry)
            session.receive(rx.payload, arrived, t4)
        if session.has_output:
            self._pump(entry)
        self._arm(entry)

    def _on_readable(self) -> None:
        """A plane with ``collect_frames`` (``afxdp``) hands over arrays of reflected
        payloads; each unauthenticated session's rows (by the SSID at bytes 14:16) go
        to ``sixlab.stamp.batch.receive_batch`` at once, every other row one by one as a
        ``Received`` (authenticated sessions, SSID 0, no session, and the sessions of
        docs/srpm.md whose replies are not plain reflector packets or need data counts)."""
        if self.probe_io is not None:
            self._read_records(self.probe_io)
            return
        collect = getattr(self.dataplane, "collect_frames", None)
        if collect is None:
            super()._on_readable()
            return
        while True:
            groups, slow = collect(_FRAMES_BATCH)
            taken = len(slow) + sum(len(t4) for _, t4, _ in groups)
            with self.lock:
                mono, wall = self.monotonic(), self.clock()
                for payloads, t4, received in groups:
                    self.counters.received += len(t4)
                    self._deliver_arrays(payloads, t4, received, mono, wall)
                self._notify_pending()
            if slow:
                self._on_batch(slow)
            if taken < _FRAMES_BATCH:
                return

    def _read_records(self, pio: probeio.ProbeIO) -> None:
        """Replies through the plane's ``recvmmsg`` (``probeio``), batch by batch."""
        while True:
            try:
                got = pio.receive()
            except OSError as exc:
                raise DataplaneError(f"socket: receive failed: {exc.strerror}") from exc
            if got:
                with self.lock:
                    self._deliver_records(pio, got)
            if got < probeio.BATCH:
                return

    def _deliver_records(self, pio: probeio.ProbeIO, got: int) -> None:
        """``got`` replies of ``pio`` to their sessions (lock held), as ``_deliver``:
        a session on ``receive_one`` takes the decoded fields (``receive_record``);
        every other datagram (short, truncated, possibly authenticated, SSID 0, no or
        another kind of session) goes to ``_deliver`` as the ``Received`` the socket
        plane would have made of it."""
        mono, wall = self.monotonic(), self.clock()
        self.counters.received += got
        entries = self._entries
        data = pio.data
        slot = probeio.SLOT
        records = memoryview(pio.records)[: got * probeio.RECORD.size]
        for i, rec in enumerate(probeio.RECORD_FIELDS.iter_unpack(records)):
            t4, t1, t2, t3, size, rseq, seq, ssid, r_ee, s_ee, _, _, _, ttl, flags = rec
            entry = entries.get(ssid)
            at = i * slot
            if (
                entry is None
                or entry.template is None
                or size < wire.UNAUTH_PACKET_SIZE
                or flags & probeio.TRUNCATED
                or (size >= wire.AUTH_PACKET_SIZE and self._authenticated(data, at))
            ):
                full = probeio.RECORD.unpack_from(records, i * probeio.RECORD.size)
                self._deliver(self._received(pio, i, full), mono, wall)
                continue
            t4 = t4 or wall
            arrived = mono - wall + t4 if t4 < wall else mono
            tlvs = (
                bytes(data[at + wire.UNAUTH_PACKET_SIZE : at + size])
                if size > wire.UNAUTH_PACKET_SIZE
                else b""
            )
            session = entry.session
            fields = (rseq, r_ee, ssid, seq, s_ee, ttl, t1, t2, t3)
            receive_record(session, arrived, t4, fields, tlvs)
            if session.has_output:
                self._pump(entry)
            self._arm(entry)
        self._notify_pending()

    def _authenticated(self, data: bytearray, at: int) -> bool:
        """Whether the datagram at ``data[at:]`` (long enough) is an authenticated
        session's by its SSID at bytes 26:28 (``_match`` takes those first)."""
        entry = self._entries.get(int.from_bytes(data[at + 26 : at + 28]))
        return entry is not None and entry.spec.config.authenticated

    def _received(self, pio: probeio.ProbeIO, i: int, rec: tuple[Any, ...]) -> Received:
        """Datagram ``i`` of ``pio`` as ``SocketDataplane.receive`` builds it."""
        t4, size, sport, tclass, hop, flags, src, dst = (
            rec[j] for j in (0, 4, 10, 11, 12, 14, 15, 16)
        )
        n = 4 if flags & probeio.IPV4 else 16
        at = i * probeio.SLOT
        port = self.dataplane.config.port
        return Received(
            bytes(pio.data[at : at + size]), src[:n], dst[:n], sport, port, hop, t4,
            None if tclass < 0 else tclass, bool(flags & probeio.TRUNCATED),
        )  # fmt: skip

    def _deliver_arrays(
        self, payloads: Any, t4: Any, received: Callable[[int], Received], mono: int, wall: int
    ) -> None:
        """Rows of reflected payloads to their sessions (lock held); ``received(i)`` is
        row ``i`` as a ``Received``, for the rows that take the per-packet path."""
        ssids = payloads[:, 14].astype(np.int64) << 8 | payloads[:, 15]
        # Each row's arrival on the monotonic clock, as ``_deliver`` computes it.
        arrived = mono - np.maximum(0, wall - t4)
        for ssid in np.unique(ssids).tolist():
            rows = np.flatnonzero(ssids == ssid)
            entry = self._entries.get(ssid)
            if entry is None or not _batchable(entry.spec):
                for i in rows.tolist():
                    self._deliver(received(i), mono, wall)
                continue
            receive_batch(entry.session, payloads[rows], t4[rows], arrived[rows])
            self._pump(entry)
            self._arm(entry)

    def _match(self, rx: Received) -> _SenderEntry | None:
        payload = rx.payload
        size = len(payload)
        if size >= wire.AUTH_PACKET_SIZE:
            entry = self._entries.get(int.from_bytes(payload[26:28]))
            if entry is not None and entry.spec.config.authenticated:
                return entry
        if size >= wire.UNAUTH_PACKET_SIZE:
            entry = self._entries.get(int.from_bytes(payload[14:16]))
            if entry is not None and not entry.spec.config.authenticated:
                return entry
            return self._match_ssid_zero(rx)
        return None

    def _match_ssid_zero(self, rx: Received) -> _SenderEntry | None:
        """The session a reply with SSID 0 answers (an RFC 8762-only reflector, RFC 8972
        §3): the one whose reflector address and port are the reply's source and that
        sent the packet with the reply's Seq and T1 (``SenderSession.claims``). None when
        no session, or more than one, claims it: sessions that share the reflector's
        address and port and sent the same Seq at the same T1 cannot be told apart
        without the SSID, and such a reply is counted ``no_session``. Only the sessions
        to that address and port that the run loop does not hold are asked
        (``_by_peer``): the packets outstanding of a held one are the loop's, which
        hands over every one that claims the reply (``sl_zero`` in probeio.c)."""
        payload = rx.payload
        found = None
        for entry in self._by_peer.get((rx.src, rx.src_port), {}).values():
            auth = entry.spec.config.authenticated
            at = 26 if auth else 14
            if (
                len(payload) >= (wire.AUTH_PACKET_SIZE if auth else wire.UNAUTH_PACKET_SIZE)
                and payload[at : at + 2] == b"\0\0"
                and entry.session.claims(payload)
            ):
                if found is not None:
                    return None
                found = entry
        return found

    def _on_tick(self) -> None:
        """Run every timer that is due, earliest first, from the heap: one pass over
        the slots of the tick, with the clocks read once for all of them."""
        heap, entries, pop = self._heap, self._entries, heapq.heappop
        pio = self.probe_io
        # One batch per routing header: the socket holds one at a time (ProbeIO).
        batches: dict[bytes | None, _Batch] = {}
        with self.lock:
            now = self.monotonic()
            wall = self.clock()
            while heap:
                when, _, ssid = heap[0]
                if when > now:
                    break
                pop(heap)
                entry = entries.get(ssid)
                if entry is None or entry.timer != when:
                    continue  # stale: the session re-armed or went
                self._last_run = now
                entry.timer = None
                if entry.template is not None:
                    if pio is not None and (entry.record or self._record(entry, pio)):
                        seq = due_seq(entry.session, now, wall)
                        if seq is not None:
                            assert entry.record is not None
                            batch = batches.get(entry.rthdr)
                            if batch is None:
                                batch = batches[entry.rthdr] = _Batch()
                            batch.buf += entry.record
                            batch.seqs.append(seq)
                            batch.entries.append((entry, seq))
                            if len(batch.entries) == probeio.BATCH:
                                self._send_batch(pio, entry.rthdr, batches.pop(entry.rthdr), now)
                        if entry.session.has_output:
                            self._pump(entry)
                    else:
                        self._fire(entry, entry.template, now, wall)
                else:
                    self._feed_data(entry)
                    entry.session.handle_timer(now, wall)
                    self._pump(entry, now)
                self._arm(entry)
            for rthdr, batch in batches.items():
                self._send_batch(pio, rthdr, batch, now)
            self._notify_pending()

    def _record(self, entry: _SenderEntry, pio: probeio.ProbeIO) -> bytes | None:
        """The session's entry in a batched send, made once (``ProbeIO.record``), and
        its routing header (``ProbeIO.path``): None for a session with a source address
        (per-message control data stays on the Python path) or whose path the plane
        refuses (the Python path's send reports it)."""
        if not entry.record_made:
            entry.record_made = True
            spec = entry.spec
            if spec.source is None and entry.template is not None:
                try:
                    entry.rthdr = pio.path(spec.reflector, spec.segments)
                except DataplaneError:
                    return None
                cfg = spec.config
                ptp = cfg.fmt is TimestampFormat.PTP
                entry.record = pio.record(
                    spec.reflector,
                    spec.reflector_port,
                    entry.template,
                    ptp=ptp,
                    tai_ns=cfg.tai_utc_offset_ns,
                )
        return entry.record

    def _send_batch(
        self, pio: probeio.ProbeIO | None, rthdr: bytes | None, batch: _Batch, now: int
    ) -> None:
        """Send one batch of ``due_seq`` packets along one path (lock held) and give
        each session the T1 the batch went with; the schedule's slip is counted as
        ``_fire`` counts it. A path the kernel refuses fails the whole batch (counted)."""
        assert pio is not None
        try:
            t1, failed, _ = pio.send(batch.buf, batch.seqs, rthdr)
        except DataplaneError:
            t1, failed = self.clock(), len(batch.entries)
        self.counters.send_failed += failed
        on_event = self.on_event
        for entry, seq in batch.entries:
            sent_at(entry.session, seq, t1)
            if entry.start is not None:
                self._slip(entry, now)
            if on_event is not None:
                on_event(ev.PacketSent(entry.ssid, seq, t1))

    def _fire(self, entry: _SenderEntry, template: bytes, now: int, wall: int) -> None:
        """``handle_timer`` and ``_pump`` for a session on ``send_due`` (lock held)."""
        session = entry.session
        payload = send_due(session, template, now, wall)
        if payload is not None:
            send = entry.sender
            try:
                if send is None:
                    spec = entry.spec
                    send = entry.sender = self.dataplane.sender(
                        spec.reflector, spec.reflector_port, segments=spec.segments, src=spec.source
                    )
                send(payload)
            except DataplaneError:
                self.counters.send_failed += 1
            if entry.start is not None:
                self._slip(entry, now)
            if self.on_event is not None:
                seq = int.from_bytes(payload[:4])
                self.on_event(ev.PacketSent(entry.ssid, seq, wall))
        if session.has_output:
            self._pump(entry)  # what else the timer produced: losses, the end

    def _feed_data(self, entry: _SenderEntry) -> None:
        """Hand the session its data flow's counts, if it has a source (lock held)."""
        source = entry.spec.data_counters
        if source is not None:
            reading = self._read_data(source)
            if reading is not None:  # a failed read keeps the last counts, not a jump
                entry.session.set_data_counters(*reading)

    def _pump(self, entry: _SenderEntry, now: int | None = None) -> None:
        """Send what the session produced and file its events (lock held). ``now``: the
        monotonic time of the timer that made them, to measure the schedule's slip."""
        spec = entry.spec
        session = entry.session
        labels = spec.config.flow_labels
        for payload in session.datagrams_to_send():
            label = flow_label_for(labels, int.from_bytes(payload[:4])) if labels else None
            self._send(
                payload,
                spec.reflector,
                spec.reflector_port,
                spec.segments,
                spec.source,
                flow_label=label,
            )
        notify = False
        on_event = self.on_event
        next_event = session.next_event
        while (event := next_event()) is not None:
            if isinstance(event, ev.StampResult):  # the common case first
                if entry.fifo.push(event, self.fifo_capacity):
                    entry.overflow += 1
                notify = True
            elif isinstance(event, ev.PacketSent):
                if now is not None and entry.start is not None:
                    self._slip(entry, now)
            elif isinstance(event, ev.PacketLost):
                if entry.lost.push(event, self.fifo_capacity):
                    entry.overflow += 1
                notify = True  # a lossy path's only news: no record comes
            elif isinstance(event, ev.SessionFinished):
                notify = True
            if on_event is not None:
                on_event(event)
        if notify:
            self._pending = True

    @staticmethod
    def _slip(entry: _SenderEntry, now: int) -> None:
        """A packet left at ``now`` for the latest slot due (see ScheduleStats)."""
        assert entry.start is not None
        slot, late = divmod(now - entry.start, entry.interval)
        if slot > entry.last_slot + 1:
            entry.skipped += slot - entry.last_slot - 1
        entry.on_slot += 1
        entry.late_ns_total += late
        entry.late_ns_max = max(entry.late_ns_max, late)
        entry.last_slot = slot

    def _notify(self) -> None:
        self._version += 1
        self._cond.notify_all()

    def _notify_pending(self) -> None:
        """Wake the waiters once for every record, loss report and end ``_pump`` filed
        since the last call (lock held): once per batch of replies or run of timers, not
        per record."""
        if self._pending:
            self._pending = False
            self._notify()
