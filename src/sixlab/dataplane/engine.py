"""Engines: the thin adapters that join a data plane to the sans-I/O STAMP core.

Each engine owns one thread that waits on the data plane's descriptor (and a wake-up
pipe) until the next timer of its sessions, feeds what arrived to the core, and sends
what the core produced (receive → core → transmit → re-arm timer: docs/architecture.md). The
public methods are thread-safe: the gRPC agent and the standalone tools call them from
other threads.

Results of a Session-Sender go into a bounded FIFO per session, drained by
``SenderEngine.results`` (polling) or ``wait_results`` (push/streaming). When a FIFO is
full the oldest record is dropped and ``overflow`` counts it: never silent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sixlab.dataplane.base import Dataplane, DataplaneError, Received
from sixlab.stamp import _events as ev
from sixlab.stamp._events import DropReason
from sixlab.stamp.reflector import PacketContext, Reflector, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig, SenderCounters, SenderSession, State
from sixlab.wire import stamp as wire

__all__ = [
    "DEFAULT_FIFO_CAPACITY",
    "EngineCounters",
    "ReflectorEngine",
    "SenderEngine",
    "SenderSessionSpec",
    "SessionSnapshot",
]

IPv6Address = ipaddress.IPv6Address
#: Records kept per session until fetched: at 1000 packets/s, about 100 s of results.
DEFAULT_FIFO_CAPACITY = 100_000
#: The loop re-checks its stop flag at least this often even when nothing happens.
_IDLE_WAKE_S = 0.5
_ZERO_ADDR = bytes(16)
#: Packets taken from a data plane per call (the planes' ``receive`` default).
_BATCH = 64

Clock = Callable[[], int]


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
        try:
            while not self._stop.is_set():
                timeout = self._timeout()
                readable, _, _ = select.select(fds, [], [], timeout)
                if self._waker.r in readable:
                    self._waker.drain()
                if fds[0] in readable:
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

    def _on_batch(self, batch: list[Received]) -> None:
        raise NotImplementedError

    def _on_tick(self) -> None:
        """Called after every wake-up."""

    def _send(
        self,
        payload: bytes,
        dst: IPv6Address,
        port: int,
        segments: tuple[IPv6Address, ...] | None,
        src: IPv6Address | None,
    ) -> None:
        try:
            self.dataplane.send(payload, dst, port, segments=segments, src=src)
        except DataplaneError:
            self.counters.send_failed += 1


# --------------------------------------------------------------------------- reflector


class ReflectorEngine(_Loop):
    """Answers Session-Sender packets with a ``Reflector`` core over a data plane.

    Fast path: a plane with ``reflect_batch`` (the ``mmap`` plane) is handed the core's
    ``reflect`` and answers plain packets itself, from its receive ring into its TX ring,
    with no per-packet objects but the reply; what it cannot answer comes back as
    ``Received`` for the general path below. ``fast_batch`` bounds the packets per call,
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
        fast_batch: int = _BATCH,
    ) -> None:
        super().__init__(dataplane, clock, "stamp-reflector")
        self.reflector = reflector
        self.fast_batch = fast_batch
        self._fast = getattr(dataplane, "reflect_batch", None) if fast_path else None
        dataplane.set_restamp(lambda payload: reflector.restamp(payload, clock()))

    # -- control (any thread) ----------------------------------------------------------
    # The one place sessions change on a reflector: the core under the engine lock, then
    # the data plane's hook (a plane that answers in the kernel needs the session too).
    # A plane that refuses leaves the core as it was.

    def add_session(self, config: ReflectorSessionConfig) -> None:
        """Answer the SSID of ``config`` (use ``set_default`` for the SSID-agnostic one)."""
        with self.lock:
            self.reflector.add_session(config)
            try:
                self.dataplane.reflector_session_added(config)
            except BaseException:
                assert config.ssid is not None  # add_session refused None
                self.reflector.remove_session(config.ssid)
                raise

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
        self.counters.received += len(batch)
        for rx in batch:
            payload = rx.payload
            context = None
            if len(payload) > wire.UNAUTH_PACKET_SIZE:  # TLVs may ask for addresses
                context = PacketContext(
                    IPv6Address(rx.src), IPv6Address(rx.dst), rx.src_port, rx.dst_port
                )
            with self.lock:
                out = reflect(payload, rx.rx_ns or clock(), clock, rx.hop_limit, context)
            if out is None:
                continue
            route = out.return_path
            dst = route.address if route.address is not None else IPv6Address(rx.src)
            if not isinstance(dst, IPv6Address):
                self.counters.send_failed += 1  # an IPv4 return address on an IPv6 plane
                continue
            src = IPv6Address(rx.dst) if rx.dst != _ZERO_ADDR else None
            self._send(out.payload, dst, rx.src_port, route.segments, src)


# ------------------------------------------------------------------------------ sender


@dataclass(frozen=True, slots=True)
class SenderSessionSpec:
    """A session as the sender engine runs it: the core's config plus where to send."""

    config: SenderConfig
    reflector: IPv6Address
    reflector_port: int = wire.STAMP_PORT
    #: The SRv6 path to the reflector, travel order; the reflector closes it if absent.
    segments: tuple[IPv6Address, ...] | None = None
    source: IPv6Address | None = None


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    ssid: int
    state: State
    counters: SenderCounters
    fifo_len: int
    overflow: int


@dataclass(slots=True)
class _SenderEntry:
    spec: SenderSessionSpec
    session: SenderSession
    fifo: deque[ev.StampResult]
    lost: list[ev.PacketLost] = field(default_factory=list)
    overflow: int = 0
    fetched: int = 0
    #: Cursor id of ``fifo[0]``: record ids count from 1 in arrival order, so a reader
    #: that stored everything up to id N asks for "after N" and never sees one twice.
    first_id: int = 1

    def index_after(self, record_id: int) -> int:
        """Index in ``fifo`` of the first record with an id above ``record_id``."""
        return max(0, record_id + 1 - self.first_id)

    def pop_oldest(self) -> ev.StampResult:
        self.first_id += 1
        return self.fifo.popleft()


class SenderEngine(_Loop):
    """Runs Session-Sender sessions over a data plane and queues their results."""

    def __init__(
        self,
        dataplane: Dataplane,
        clock: Clock = time.time_ns,
        fifo_capacity: int = DEFAULT_FIFO_CAPACITY,
        on_event: Callable[[ev.Event], None] | None = None,
    ) -> None:
        super().__init__(dataplane, clock, "stamp-sender")
        self.fifo_capacity = fifo_capacity
        self.on_event = on_event
        self._entries: dict[int, _SenderEntry] = {}
        self._cond = threading.Condition(self.lock)

    # -- control (any thread) ----------------------------------------------------------

    def add_session(self, spec: SenderSessionSpec) -> None:
        ssid = spec.config.ssid
        with self.lock:
            if ssid in self._entries:
                raise ev.ConfigError(f"ssid: session {ssid} already exists")
            entry = _SenderEntry(spec, SenderSession(spec.config), deque(maxlen=None))
            self._entries[ssid] = entry
            try:
                self.dataplane.sender_session_added(ssid)
            except BaseException:
                del self._entries[ssid]
                raise

    def start_session(self, ssid: int) -> None:
        with self.lock:
            self._entry(ssid).session.start(self.clock())
            self._pump(self._entry(ssid))
        self.wake()

    def stop_session(self, ssid: int) -> None:
        with self.lock:
            entry = self._entry(ssid)
            entry.session.stop()
            self._pump(entry)
        self.wake()

    def remove_session(self, ssid: int) -> None:
        with self.lock:
            entry = self._entry(ssid)
            if entry.session.state in (State.RUNNING, State.DRAINING):
                entry.session.stop()
            del self._entries[ssid]
            self.dataplane.sender_session_removed(ssid)
            self._cond.notify_all()

    def sessions(self) -> list[int]:
        with self.lock:
            return sorted(self._entries)

    def snapshot(self, ssid: int) -> SessionSnapshot:
        with self.lock:
            e = self._entry(ssid)
            c = e.session.counters
            copy = dataclasses.replace(c, dropped=dict(c.dropped))
            return SessionSnapshot(ssid, e.session.state, copy, len(e.fifo), e.overflow)

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

    def lost(self, ssid: int) -> list[ev.PacketLost]:
        """Drain the loss events of a session (each lost Seq once)."""
        with self.lock:
            entry = self._entry(ssid)
            out, entry.lost = entry.lost, []
            return out

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
            raise ev.ConfigError(f"ssid: no session {ssid}") from None

    def _drain(self, entry: _SenderEntry, max_items: int | None) -> list[ev.StampResult]:
        n = len(entry.fifo) if max_items is None else min(max_items, len(entry.fifo))
        out = [entry.pop_oldest() for _ in range(n)]
        entry.fetched += n
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
            n = 0
            while entry.fifo and entry.first_id <= through:
                entry.pop_oldest()
                n += 1
            entry.fetched += n
            return n

    def peek(
        self, ssid: int, after: int, max_items: int = 1000, timeout: float = 0.0
    ) -> list[tuple[int, ev.StampResult]]:
        """Up to ``max_items`` records with ids above ``after``, left queued (waits up to
        ``timeout`` s for one; returns at once when the session has finished)."""

        def ready() -> bool:
            entry = self._entry(ssid)
            return len(entry.fifo) > entry.index_after(after) or (
                entry.session.state is State.FINISHED
            )

        with self._cond:
            self._cond.wait_for(ready, timeout)
            entry = self._entry(ssid)
            start = entry.index_after(after)
            stop = min(len(entry.fifo), start + max_items)
            return [(entry.first_id + i, entry.fifo[i]) for i in range(start, stop)]

    def _timeout(self) -> float:
        with self.lock:
            timers = [t for e in self._entries.values() if (t := e.session.get_timer()) is not None]
        if not timers:
            return _IDLE_WAKE_S
        return min(_IDLE_WAKE_S, max(0.0, (min(timers) - self.clock()) / 1e9))

    def _on_batch(self, batch: list[Received]) -> None:
        with self.lock:
            self.counters.received += len(batch)
            for rx in batch:
                entry = self._match(rx.payload)
                if entry is None:
                    self.counters.no_session += 1
                    continue
                entry.session.receive(rx.payload, rx.rx_ns or self.clock())
                self._pump(entry)

    def _match(self, payload: bytes) -> _SenderEntry | None:
        size = len(payload)
        if size >= wire.AUTH_PACKET_SIZE:
            entry = self._entries.get(int.from_bytes(payload[26:28]))
            if entry is not None and entry.spec.config.authenticated:
                return entry
        if size >= wire.UNAUTH_PACKET_SIZE:
            entry = self._entries.get(int.from_bytes(payload[14:16]))
            if entry is not None and not entry.spec.config.authenticated:
                return entry
        return None

    def _on_tick(self) -> None:
        with self.lock:
            now = self.clock()
            for entry in self._entries.values():
                timer = entry.session.get_timer()
                if timer is not None and timer <= now:
                    entry.session.handle_timer(now)
                    self._pump(entry)

    def _pump(self, entry: _SenderEntry) -> None:
        """Send what the session produced and file its events (lock held)."""
        spec = entry.spec
        for payload in entry.session.datagrams_to_send():
            self._send(payload, spec.reflector, spec.reflector_port, spec.segments, spec.source)
        notify = False
        while (event := entry.session.next_event()) is not None:
            if isinstance(event, ev.StampResult):
                if len(entry.fifo) >= self.fifo_capacity:
                    entry.pop_oldest()
                    entry.overflow += 1
                entry.fifo.append(event)
                notify = True
            elif isinstance(event, ev.PacketLost):
                if len(entry.lost) >= self.fifo_capacity:
                    del entry.lost[0]
                    entry.overflow += 1
                entry.lost.append(event)
            elif isinstance(event, ev.SessionFinished):
                notify = True
            if self.on_event is not None:
                self.on_event(event)
        if notify:
            self._cond.notify_all()
