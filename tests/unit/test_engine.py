"""Engines over the in-memory data plane: threads, FIFOs, cursors, overflow, lifecycle."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from ipaddress import IPv6Address
from typing import Any

import pytest

from sixlab.dataplane.base import DataplaneConfig, DataplaneError, create
from sixlab.dataplane.engine import (
    ReflectorEngine,
    ScheduleStats,
    SenderEngine,
    SenderSessionSpec,
)
from sixlab.dataplane.memory import MemoryDataplane, MemoryNetwork
from sixlab.stamp._events import DropReason, SessionConfigError, StampResult
from sixlab.stamp.reflector import Reflection, Reflector, ReflectorMode, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig, State
from sixlab.wire import stamp as wire
from sixlab.wire import stamp_auth
from sixlab.wire import stamp_tlv as t
from sixlab.wire.timestamp import TimestampFormat, ns_from_ntp

R_ADDR = IPv6Address("fd00::2")
S = 1_000_000_000
T0 = 1_800_000_000 * S  # Unix ns
S_ADDR = IPv6Address("fd00::1")
MS = 1_000_000


@pytest.fixture
def net() -> Iterator[tuple[MemoryNetwork, SenderEngine, ReflectorEngine, Reflector]]:
    network = MemoryNetwork(hop_limit=60)
    rplane = network.plane(DataplaneConfig(port=862, source=R_ADDR))
    splane = network.plane(DataplaneConfig(port=0, source=S_ADDR))
    rplane.open()
    splane.open()
    reflector = Reflector()
    rengine = ReflectorEngine(rplane, reflector)
    sengine = SenderEngine(splane, fifo_capacity=1000)
    rengine.start()
    sengine.start()
    yield network, sengine, rengine, reflector
    sengine.shutdown()
    rengine.shutdown()
    rplane.close()
    splane.close()
    assert sengine.error is None
    assert rengine.error is None


#: A loss timeout none of these sessions meets: every probe is answered, and a loaded
#: machine's pauses (over 200 ms seen, failing three of these tests once each) must not
#: count one lost.
SLACK = 5000 * MS


def _spec(ssid: int, count: int, **kw: object) -> SenderSessionSpec:
    cfg = SenderConfig(ssid=ssid, interval_ns=MS, count=count, loss_timeout_ns=SLACK)
    return SenderSessionSpec(cfg, R_ADDR, 862, **kw)  # type: ignore[arg-type]


def test_session_runs_and_results_drain(
    net: tuple[MemoryNetwork, SenderEngine, ReflectorEngine, Reflector],
) -> None:
    _network, sender, _rengine, reflector = net
    reflector.add_session(ReflectorSessionConfig(ssid=4, mode=ReflectorMode.STATEFUL))
    sender.add_session(_spec(4, 30))
    sender.start_session(4)
    assert sender.wait_finished(4, 10)
    first = sender.results(4, max_items=10)
    rest = sender.results(4)
    assert [r.seq for r in first + rest] == list(range(30))
    assert all(r.ses_sender_ttl == 60 for r in first + rest)
    assert sender.results(4) == []
    snap = sender.snapshot(4)
    assert (snap.state, snap.counters.sent, snap.counters.received, snap.fifo_len) == (
        State.FINISHED,
        30,
        30,
        0,
    )


def test_fetch_is_exactly_once_with_acknowledgement(
    net: tuple[MemoryNetwork, SenderEngine, ReflectorEngine, Reflector],
) -> None:
    _network, sender, _rengine, reflector = net
    reflector.set_default(ReflectorSessionConfig(ssid=None))
    sender.add_session(_spec(5, 25))
    sender.start_session(5)
    assert sender.wait_finished(5, 10)
    a = sender.fetch(5, after=0, max_items=10)
    again = sender.fetch(5, after=0, max_items=10)  # nothing acknowledged: same records
    assert a == again
    assert [i for i, _ in a] == list(range(1, 11))
    b = sender.fetch(5, after=a[-1][0], max_items=100)  # acknowledges 1..10
    assert [i for i, _ in b] == list(range(11, 26))
    assert [r.seq for _, r in a + b] == list(range(25))
    assert sender.fetch(5, after=25) == []
    assert sender.snapshot(5).fifo_len == 0


def test_fifo_overflow_is_counted_never_silent(
    net: tuple[MemoryNetwork, SenderEngine, ReflectorEngine, Reflector],
) -> None:
    network, _sender, _rengine, reflector = net
    reflector.set_default(ReflectorSessionConfig(ssid=None))
    splane = network.plane(DataplaneConfig(port=0, source=IPv6Address("fd00::9")))
    splane.open()
    small = SenderEngine(splane, fifo_capacity=5)
    small.start()
    try:
        small.add_session(_spec(6, 12))
        small.start_session(6)
        assert small.wait_finished(6, 10)
        snap = small.snapshot(6)
        assert (snap.fifo_len, snap.overflow) == (5, 7)
        got = small.fetch(6, after=0)
        assert [i for i, _ in got] == list(range(8, 13))  # ids 1..7 were dropped
        assert [r.seq for _, r in got] == list(range(7, 12))
    finally:
        small.shutdown()
        splane.close()


def test_srv6_path_is_handed_to_the_plane(
    net: tuple[MemoryNetwork, SenderEngine, ReflectorEngine, Reflector],
) -> None:
    network, sender, _rengine, reflector = net
    ret = (IPv6Address("fd00:ff::1"), S_ADDR)
    reflector.add_session(ReflectorSessionConfig(ssid=7, return_segments=ret))
    fwd = (IPv6Address("fd00:ee::1"), R_ADDR)
    sender.add_session(_spec(7, 3, segments=fwd))
    sender.start_session(7)
    assert sender.wait_finished(7, 10)
    assert (R_ADDR, 862, fwd) in network.sent
    assert any(seg == ret for _dst, _port, seg in network.sent)


def test_wait_results_returns_on_timeout_and_on_finish(
    net: tuple[MemoryNetwork, SenderEngine, ReflectorEngine, Reflector],
) -> None:
    _network, sender, _rengine, reflector = net
    reflector.set_default(ReflectorSessionConfig(ssid=None))
    sender.add_session(_spec(8, 5))
    assert sender.wait_results(8, timeout=0.05) == []  # not started: nothing comes
    sender.start_session(8)
    got: list[StampResult] = []
    while len(got) < 5:
        batch = sender.wait_results(8, timeout=5)
        assert batch
        got += batch
    assert [r.seq for r in got] == list(range(5))


def test_bad_control_calls(
    net: tuple[MemoryNetwork, SenderEngine, ReflectorEngine, Reflector],
) -> None:
    _network, sender, _rengine, _reflector = net
    sender.add_session(_spec(9, 1))
    with pytest.raises(SessionConfigError, match="already exists"):
        sender.add_session(_spec(9, 1))
    for call in (sender.start_session, sender.stop_session, sender.remove_session):
        with pytest.raises(SessionConfigError, match="no session 10"):
            call(10)
    sender.remove_session(9)
    assert sender.sessions() == []


def test_unknown_ssid_replies_are_counted(
    net: tuple[MemoryNetwork, SenderEngine, ReflectorEngine, Reflector],
) -> None:
    network, sender, _rengine, _reflector = net
    stray = network.plane(DataplaneConfig(port=0, source=IPv6Address("fd00::7")))
    stray.open()
    try:
        port = sender.dataplane.local_port
        stray.send(bytes(44), S_ADDR, port)
        deadline = time.monotonic() + 5
        while not sender.counters.no_session and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sender.counters.no_session == 1
    finally:
        stray.close()


def test_registry_knows_socket_and_refuses_unknown_names() -> None:
    plane = create("socket", DataplaneConfig(port=0))
    assert plane.name == "socket"
    with pytest.raises(DataplaneError, match="unknown data plane 'nope'"):
        create("nope", DataplaneConfig(port=0))


def test_memory_plane_refuses_double_bind() -> None:
    network = MemoryNetwork()
    a = MemoryDataplane(DataplaneConfig(port=5, source=R_ADDR), network)
    b = MemoryDataplane(DataplaneConfig(port=5, source=R_ADDR), network)
    a.open()
    with pytest.raises(DataplaneError, match="already bound"):
        b.open()
    a.close()
    b.open()
    b.close()


class _HookedPlane(MemoryDataplane):
    """A memory plane that records the session hooks, and refuses ``refuse`` SSIDs."""

    def __init__(self, config: DataplaneConfig, network: MemoryNetwork, refuse: int) -> None:
        super().__init__(config, network)
        self.refuse = refuse
        self.calls: list[tuple[str, int | None]] = []

    def reflector_session_added(self, config: ReflectorSessionConfig) -> None:
        if config.ssid == self.refuse:
            raise DataplaneError(f"hooked: ssid {config.ssid} refused")
        self.calls.append(("reflector+", config.ssid))

    def reflector_session_removed(self, ssid: int | None) -> None:
        self.calls.append(("reflector-", ssid))

    def sender_session_added(self, ssid: int) -> None:
        if ssid == self.refuse:
            raise DataplaneError(f"hooked: ssid {ssid} refused")
        self.calls.append(("sender+", ssid))

    def sender_session_removed(self, ssid: int) -> None:
        self.calls.append(("sender-", ssid))


def test_reflector_engine_sessions_reach_the_core_and_the_plane_hooks() -> None:
    plane = _HookedPlane(DataplaneConfig(port=862, source=R_ADDR), MemoryNetwork(), refuse=9)
    reflector = Reflector()
    engine = ReflectorEngine(plane, reflector)
    engine.add_session(ReflectorSessionConfig(ssid=3))
    engine.set_default(ReflectorSessionConfig(ssid=None))
    assert reflector.ssids == [3]
    with pytest.raises(DataplaneError, match="refused"):
        engine.add_session(ReflectorSessionConfig(ssid=9))
    assert reflector.ssids == [3]  # the plane refused: the core is as it was
    with pytest.raises(SessionConfigError):
        engine.add_session(ReflectorSessionConfig(ssid=3))  # the core refuses first
    assert engine.remove_session(3) == (0, {})
    assert reflector.ssids == []
    with pytest.raises(SessionConfigError):
        engine.remove_session(3)
    engine.set_default(None)
    with pytest.raises(SessionConfigError):
        reflector.session_counters(None)  # no default any more
    assert plane.calls == [
        ("reflector+", 3),
        ("reflector+", None),
        ("reflector-", 3),
        ("reflector-", None),
    ]


def test_sender_engine_sessions_reach_the_plane_hooks() -> None:
    plane = _HookedPlane(DataplaneConfig(port=0, source=S_ADDR), MemoryNetwork(), refuse=9)
    engine = SenderEngine(plane)
    engine.add_session(_spec(4, 1))
    with pytest.raises(DataplaneError, match="refused"):
        engine.add_session(_spec(9, 1))
    assert engine.sessions() == [4]  # the plane refused: nothing was added
    engine.remove_session(4)
    assert plane.calls == [("sender+", 4), ("sender-", 4)]


def test_planes_without_their_own_path_have_no_counters() -> None:
    plane = MemoryDataplane(DataplaneConfig(port=5, source=R_ADDR), MemoryNetwork())
    assert plane.counters() == {}
    assert plane.session_counters(1) == {}


def test_full_path_closes_the_sid_list_with_the_destination() -> None:
    from sixlab.dataplane.base import full_path  # noqa: PLC0415

    seg = IPv6Address("fc00::1")
    assert full_path(R_ADDR, None) is None
    assert full_path(R_ADDR, ()) is None
    assert full_path(R_ADDR, (seg,)) == (seg, R_ADDR)
    assert full_path(R_ADDR, (seg, R_ADDR)) == (seg, R_ADDR)  # already closed: unchanged


class SteppedClocks:
    """A monotonic clock the test advances, and a wall clock it can also step."""

    def __init__(self) -> None:
        self.mono_ns = 1000 * S
        self.wall_ns = T0

    def mono(self) -> int:
        return self.mono_ns

    def wall(self) -> int:
        return self.wall_ns

    def advance(self, ns: int) -> None:
        self.mono_ns += ns
        self.wall_ns += ns


def test_a_stepped_wall_clock_does_not_move_the_send_schedule() -> None:
    """The engine schedules on its monotonic clock and stamps T1 from the wall clock: the
    wall clock stepping back an hour, then forward two, neither stalls nor bursts the
    sends (the engine's loop is driven by hand, tick by tick)."""
    network = MemoryNetwork()
    sink = network.plane(DataplaneConfig(port=862, source=R_ADDR))  # receives, never answers
    splane = network.plane(DataplaneConfig(port=0, source=S_ADDR))
    sink.open()
    splane.open()
    clocks = SteppedClocks()
    engine = SenderEngine(splane, clocks.wall, monotonic=clocks.mono)
    cfg = SenderConfig(ssid=3, interval_ns=10 * MS, loss_timeout_ns=10 * S)
    engine.add_session(SenderSessionSpec(cfg, R_ADDR, 862))
    engine.start_session(3)
    stamped = [clocks.wall()]
    for k in range(1, 40):
        clocks.advance(10 * MS)
        if k == 10:
            clocks.wall_ns -= 3600 * S
        if k == 25:
            clocks.wall_ns += 7200 * S
        engine._on_tick()
        stamped.append(clocks.wall())
        assert engine._timeout() == pytest.approx(0.010)  # the next slot, 10 ms ahead
    sent = sink.receive(1000)
    assert len(sent) == 40  # one per slot: no stall after the step back, no burst after
    t1 = [ns_from_ntp(wire.decode_sender(rx.payload).timestamp) for rx in sent]
    assert t1 == pytest.approx(stamped, abs=1000)  # T1 is the wall clock (NTP: ~ns)
    assert engine.snapshot(3).counters.lost == 0  # nothing expired by the forward step
    splane.close()
    sink.close()


def test_five_hundred_sessions_keep_their_grid_and_report_their_slip() -> None:
    """500 sessions, one timer heap: driven tick by tick each session sends on its own
    grid (start + k × interval), never drifting; after a stall the engine sends one
    packet per session for the latest slot and reports the slots it skipped and how
    late it was."""
    network = MemoryNetwork()
    sink = network.plane(DataplaneConfig(port=862, source=R_ADDR))
    splane = network.plane(DataplaneConfig(port=0, source=S_ADDR))
    sink.open()
    splane.open()
    clocks = SteppedClocks()
    engine = SenderEngine(splane, clocks.wall, monotonic=clocks.mono)
    interval = 100 * MS
    starts: dict[int, int] = {}
    for ssid in range(1, 501):
        cfg = SenderConfig(ssid=ssid, interval_ns=interval, loss_timeout_ns=100 * S)
        engine.add_session(SenderSessionSpec(cfg, R_ADDR, 862))
    for ssid in range(1, 501):
        if ssid % 50 == 0:
            clocks.advance(MS)  # phases 0..9 ms: whole ms, all before the first slot
        starts[ssid] = clocks.mono()
        engine.start_session(ssid)
    for _ in range(1000):  # one second of 1 ms ticks: every slot met on time
        clocks.advance(MS)
        engine._on_tick()
    end = clocks.mono()
    for ssid, start in starts.items():
        snap = engine.snapshot(ssid)
        assert snap.counters.sent == (end - start) // interval + 1  # no drift, no loss
        assert snap.schedule == ScheduleStats(sent=snap.counters.sent)  # nothing late
    clocks.advance(350 * MS)  # the engine stalls for 350 ms
    engine._on_tick()
    for ssid, start in starts.items():
        snap = engine.snapshot(ssid)
        before, after = (end - start) // interval, (clocks.mono() - start) // interval
        assert snap.counters.sent == before + 2  # one packet for the latest slot, no burst
        assert snap.schedule.skipped == after - before - 1
        late = (clocks.mono() - start) % interval
        assert (snap.schedule.late_ns_total, snap.schedule.late_ns_max) == (late, late)
    assert engine._timeout() <= 0.1
    splane.close()
    sink.close()


def test_replies_wait_for_a_run_due_within_eight_ticks() -> None:
    """With a tick of 250 µs the data plane does not wake the loop while the next run of
    the timers is due within 2 ms (its replies are read at that run), and does when the
    run is further off."""
    network = MemoryNetwork()
    sink = network.plane(DataplaneConfig(port=862, source=R_ADDR))
    splane = network.plane(DataplaneConfig(port=0, source=S_ADDR))
    sink.open()
    splane.open()
    clocks = SteppedClocks()
    engine = SenderEngine(splane, clocks.wall, monotonic=clocks.mono, tick_ns=250_000)
    cfg = SenderConfig(ssid=1, interval_ns=10 * MS, loss_timeout_ns=10 * S)
    engine.add_session(SenderSessionSpec(cfg, R_ADDR, 862))
    engine.start_session(1)
    wait, poll = engine._wait()
    assert wait == pytest.approx(10e-3)
    assert not poll  # 10 ms off: a reply wakes the loop
    clocks.advance(8 * MS)
    wait, poll = engine._wait()
    assert wait == pytest.approx(2e-3)
    assert poll  # 2 ms off: replies wait for the run
    splane.close()
    sink.close()


@pytest.mark.parametrize("tick_us", [0, 250])
def test_timers_run_at_most_once_per_tick_and_replies_wait_for_that_run(tick_us: int) -> None:
    """Slots 50 µs apart: with a tick of 250 µs the loop runs the timers once for all the
    slots that fall within it (and, the next run being so near, reads the data plane
    then rather than when it turns readable); without a tick it wakes for every slot."""
    network = MemoryNetwork()
    sink = network.plane(DataplaneConfig(port=862, source=R_ADDR))
    splane = network.plane(DataplaneConfig(port=0, source=S_ADDR))
    sink.open()
    splane.open()
    clocks = SteppedClocks()
    tick = tick_us * 1000
    engine = SenderEngine(splane, clocks.wall, monotonic=clocks.mono, tick_ns=tick)
    for ssid in range(1, 5):
        cfg = SenderConfig(ssid=ssid, interval_ns=10 * MS, loss_timeout_ns=10 * S)
        engine.add_session(SenderSessionSpec(cfg, R_ADDR, 862))
        engine.start_session(ssid)
        clocks.advance(50_000)
    assert len(sink.receive(100)) == 4
    clocks.advance(10 * MS - 200_000)  # session 1's second slot
    engine._on_tick()
    assert len(sink.receive(100)) == 1
    wait, poll = engine._wait()
    if tick:
        assert wait == pytest.approx(250e-6)  # sessions 2-4 wait one tick
        assert poll
        clocks.advance(tick)
        engine._on_tick()
        assert len(sink.receive(100)) == 3
        assert [engine.snapshot(s).schedule.late_ns_max for s in (2, 3, 4)] == [
            200_000,
            150_000,
            100_000,
        ]
    else:
        assert wait == pytest.approx(50e-6)  # session 2's slot
        assert not poll
    wait, poll = engine._wait()
    assert not poll  # the next run is further than a tick: the plane wakes the loop
    splane.close()
    sink.close()


def _run_sessions(fast_path: bool) -> tuple[list[bytes], list[Any], list[Any]]:
    """Sessions of several kinds through an engine driven tick by tick, every third
    probe unanswered, some replies read after their loss timeout: what it sent, and
    each session's records, losses, counters and schedule."""
    clocks = SteppedClocks()
    network = MemoryNetwork(clock=clocks.wall)
    rplane = network.plane(DataplaneConfig(port=862, source=R_ADDR))
    splane = network.plane(DataplaneConfig(port=0, source=S_ADDR))
    rplane.open()
    splane.open()
    engine = SenderEngine(splane, clocks.wall, monotonic=clocks.mono, fast_path=fast_path)
    reflector = Reflector(ReflectorSessionConfig(None))
    reflector.add_session(ReflectorSessionConfig(ssid=3, mode=ReflectorMode.STATEFUL))
    reflector.add_session(ReflectorSessionConfig(ssid=4, key=b"k" * 16))
    pad = t.ExtraPadding(bytes(8)).to_tlv().encode()
    configs = [
        SenderConfig(ssid=1, interval_ns=3 * MS, loss_timeout_ns=5 * MS),
        SenderConfig(ssid=2, interval_ns=4 * MS, fmt=TimestampFormat.PTP, tlvs=pad, count=9),
        SenderConfig(ssid=3, interval_ns=5 * MS, reflector_stateful=True, duration_ns=60 * MS),
        SenderConfig(ssid=4, interval_ns=3 * MS, key=b"k" * 16),  # the reference either way
    ]
    for cfg in configs:
        engine.add_session(SenderSessionSpec(cfg, R_ADDR, 862))
        engine.start_session(cfg.ssid)
        clocks.advance(MS // 3)
    sent: list[bytes] = []
    for k in range(120):
        clocks.advance(MS)
        engine._on_tick()
        for rx in rplane.receive(100):
            sent.append(rx.payload)
            if len(sent) % 3 == 0:
                continue
            out = reflector.reflect(rx.payload, clocks.wall(), clocks.wall, 64)
            assert out is not None
            rplane.send(out.payload, S_ADDR, splane.local_port)
        if k % 7 == 0:  # replies read late now and then, some past their timeout
            engine._on_readable()
    engine._on_readable()
    records: list[Any] = []
    rest: list[Any] = []
    for cfg in configs:
        snap = engine.snapshot(cfg.ssid)
        records.append(engine.results(cfg.ssid))
        rest.append((engine.lost(cfg.ssid), snap.counters, snap.state, snap.schedule))
    assert {e.template is not None for e in engine._entries.values()} == (
        {True, False} if fast_path else {False}
    )
    splane.close()
    rplane.close()
    return sent, records, rest


def test_the_fast_path_sends_and_records_what_the_reference_does() -> None:
    """The same sessions on the engine's fast path (``send_due``, ``receive_one``, the
    plane's ``sender``) and on the core's reference: the same bytes on the wire (the
    clocks are the same), the same records, losses, counters and schedule."""
    fast = _run_sessions(fast_path=True)
    ref = _run_sessions(fast_path=False)
    assert len(ref[0]) > 100
    assert sum(len(r) for r in ref[1]) > 50
    assert fast == ref


def test_a_reply_is_late_by_its_arrival_not_by_when_the_loop_reads_it() -> None:
    """The reply came back in time but the engine read it only after the loss timeout
    (a stalled process): its kernel receive time (T4) says it arrived in time."""
    clocks = SteppedClocks()
    network = MemoryNetwork(clock=clocks.wall)  # stamps rx_ns, like a kernel timestamp
    rplane = network.plane(DataplaneConfig(port=862, source=R_ADDR))
    splane = network.plane(DataplaneConfig(port=0, source=S_ADDR))
    rplane.open()
    splane.open()
    engine = SenderEngine(splane, clocks.wall, monotonic=clocks.mono)
    cfg = SenderConfig(ssid=4, interval_ns=10 * S, loss_timeout_ns=100 * MS)
    engine.add_session(SenderSessionSpec(cfg, R_ADDR, 862))
    engine.start_session(4)
    (request,) = rplane.receive()
    reflector = Reflector()
    reflector.add_session(ReflectorSessionConfig(ssid=4))
    clocks.advance(MS)
    reply = reflector.reflect(request.payload, clocks.wall(), clocks.wall, 64)
    assert reply is not None
    rplane.send(reply.payload, S_ADDR, splane.local_port)  # arrives 1 ms after sending
    clocks.advance(500 * MS)  # the engine stalls past the loss timeout
    engine._on_readable()
    engine._on_tick()
    counters = engine.snapshot(4).counters
    assert (counters.received, counters.lost, counters.late) == (1, 0, 0)
    splane.close()
    rplane.close()


class Rfc8762Reflector(Reflector):
    """A reflector that implements RFC 8762 but not RFC 8972: the SSID field of its
    replies is MBZ, so it comes back as zero (and the HMAC covers the zeros)."""

    key = b"k"

    def reflect(self, *args: Any, **kwargs: Any) -> Reflection | None:
        out = super().reflect(*args, **kwargs)
        if out is None:
            return None
        payload = out.payload
        if stamp_auth.verify(payload, self.key):
            return out._replace(
                payload=stamp_auth.sign(payload[:26] + b"\0\0" + payload[28:], self.key)
            )
        return out._replace(payload=payload[:14] + b"\0\0" + payload[16:])


def _engines(
    reflector: Reflector, *sources: IPv6Address
) -> tuple[MemoryNetwork, list[SenderEngine], ReflectorEngine]:
    network = MemoryNetwork(hop_limit=60)
    rplane = network.plane(DataplaneConfig(port=862, source=R_ADDR))
    rplane.open()
    rengine = ReflectorEngine(rplane, reflector)
    rengine.start()
    senders = []
    for source in sources:
        plane = network.plane(DataplaneConfig(port=0, source=source))
        plane.open()
        engine = SenderEngine(plane, fifo_capacity=1000)
        engine.start()
        senders.append(engine)
    return network, senders, rengine


def _stop(senders: list[SenderEngine], rengine: ReflectorEngine) -> None:
    for engine in senders:
        engine.shutdown()
        engine.dataplane.close()
        assert engine.error is None
    rengine.shutdown()
    rengine.dataplane.close()
    assert rengine.error is None


def test_ssid_zero_replies_reach_their_sessions_by_address_port_and_seq() -> None:
    reflector = Rfc8762Reflector(ReflectorSessionConfig(ssid=None))
    _, (sender,), rengine = _engines(reflector, S_ADDR)
    # Replies are matched by address, port and Seq, not by time.
    slack = SLACK
    try:
        sender.add_session(
            SenderSessionSpec(
                SenderConfig(ssid=1, interval_ns=MS, count=10, loss_timeout_ns=slack), R_ADDR, 862
            )
        )
        sender.add_session(
            SenderSessionSpec(
                SenderConfig(ssid=3, interval_ns=MS, count=10, loss_timeout_ns=slack, key=b"k"),
                R_ADDR,
                862,
            )
        )
        reflector.add_session(ReflectorSessionConfig(ssid=3, key=b"k"))
        for ssid in (1, 3):
            sender.start_session(ssid)
        for ssid in (1, 3):
            assert sender.wait_finished(ssid, 10)
            c = sender.snapshot(ssid).counters
            assert (c.received, c.ssid_zero, c.lost) == (10, 10, 0)
            assert c.reflector_ssid_zero
            assert sorted(r.seq for r in sender.results(ssid)) == list(range(10))
        assert sender.counters.no_session == 0
    finally:
        _stop([sender], rengine)


def test_ssid_zero_replies_are_refused_by_strict_ssid() -> None:
    _, (sender,), rengine = _engines(Rfc8762Reflector(ReflectorSessionConfig(ssid=None)), S_ADDR)
    try:
        cfg = SenderConfig(
            ssid=1, interval_ns=MS, count=5, loss_timeout_ns=50 * MS, strict_ssid=True
        )
        sender.add_session(SenderSessionSpec(cfg, R_ADDR, 862))
        sender.start_session(1)
        assert sender.wait_finished(1, 10)
        c = sender.snapshot(1).counters
        assert (c.received, c.lost, c.dropped) == (0, 5, {DropReason.SSID_ZERO: 5})
    finally:
        _stop([sender], rengine)


def test_ssid_zero_reply_from_another_address_or_port_is_not_taken() -> None:
    # A hand-driven RFC 8762 reflector: the sender's packet is caught on a plain plane at
    # the reflector's address, and the replies go back from three places.
    network = MemoryNetwork(hop_limit=60)
    catcher = network.plane(DataplaneConfig(port=862, source=R_ADDR))
    other_port = network.plane(DataplaneConfig(port=863, source=R_ADDR))
    other_addr = network.plane(DataplaneConfig(port=862, source=IPv6Address("fd00::99")))
    splane = network.plane(DataplaneConfig(port=0, source=S_ADDR))
    for plane in (catcher, other_port, other_addr, splane):
        plane.open()
    sender = SenderEngine(splane, fifo_capacity=1000)
    core = Rfc8762Reflector(ReflectorSessionConfig(ssid=None))
    try:
        sender.add_session(_spec(1, 1))
        sender.start_session(1)
        (packet,) = catcher.receive()
        out = core.reflect(packet.payload, time.time_ns(), time.time_ns, 64)
        assert out is not None
        for plane in (other_port, other_addr, catcher):
            plane.send(out.payload, S_ADDR, splane.port)
        sender.start()
        assert sender.wait_finished(1, 10)
        assert sender.snapshot(1).counters.received == 1
        assert sender.counters.no_session == 2  # the two from elsewhere
    finally:
        sender.shutdown()
        for plane in (catcher, other_port, other_addr, splane):
            plane.close()


def test_ssid_zero_reply_claimed_by_two_sessions_is_not_guessed() -> None:
    # Two sessions to one reflector address and port, the same Seq at the same T1: with
    # SSID 0 nothing tells their replies apart.
    network = MemoryNetwork(hop_limit=60)
    catcher = network.plane(DataplaneConfig(port=862, source=R_ADDR))
    splane = network.plane(DataplaneConfig(port=0, source=S_ADDR))
    catcher.open()
    splane.open()
    now = 1_800_000_000 * 1_000_000_000
    sender = SenderEngine(splane, clock=lambda: now)
    core = Rfc8762Reflector(ReflectorSessionConfig(ssid=None))
    try:
        for ssid in (1, 2):
            sender.add_session(_spec(ssid, 1))
            sender.start_session(ssid)
        first, _second = catcher.receive()
        out = core.reflect(first.payload, now, lambda: now, 64)
        assert out is not None
        catcher.send(out.payload, S_ADDR, splane.port)
        sender._on_batch(splane.receive())
        assert sender.counters.no_session == 1
        assert [sender.snapshot(s).counters.received for s in (1, 2)] == [0, 0]
    finally:
        for plane in (catcher, splane):
            plane.close()


def test_two_senders_with_one_ssid_get_their_own_stateful_counts() -> None:
    # RFC 8972 §3: a session is the SSID with the addresses and ports.
    reflector = Reflector()
    reflector.add_session(ReflectorSessionConfig(ssid=7, mode=ReflectorMode.STATEFUL))
    s2 = IPv6Address("fd00::3")
    _, senders, rengine = _engines(reflector, S_ADDR, s2)
    try:
        for engine in senders:
            cfg = SenderConfig(
                ssid=7, interval_ns=MS, count=20, loss_timeout_ns=SLACK, reflector_stateful=True
            )
            engine.add_session(SenderSessionSpec(cfg, R_ADDR, 862))
        for engine in senders:
            engine.start_session(7)
        for engine in senders:
            assert engine.wait_finished(7, 10)
            records = engine.results(7)
            assert [(r.seq, r.reflector_seq) for r in records] == [(i, i) for i in range(20)]
            assert engine.snapshot(7).counters.forward_lost == 0
    finally:
        _stop(senders, rengine)


def test_class_of_service_through_the_engines() -> None:
    reflector = Reflector(ReflectorSessionConfig(ssid=None))
    _, (sender,), rengine = _engines(reflector, S_ADDR)
    try:
        cos = t.ClassOfService(dscp1=46).to_tlv().encode()
        cfg = SenderConfig(ssid=1, interval_ns=MS, count=2, loss_timeout_ns=SLACK, tlvs=cos)
        sender.add_session(SenderSessionSpec(cfg, R_ADDR, 862))
        sender.start_session(1)
        assert sender.wait_finished(1, 10)
        records = sender.results(1)
        assert len(records) == 2
        for record in records:
            (tlv,) = t.decode_tlvs(record.tlvs)
            got = t.ClassOfService.from_tlv(tlv)
            assert (tlv.flags, got.dscp1, got.dscp2, got.ecn2, got.rp) == (0, 46, 0, 0, 0)
    finally:
        _stop([sender], rengine)


# -- SR performance measurement (docs/srpm.md) -------------------------------------------


def test_flow_labelled_packets_go_through_send_labelled(
    net: tuple[MemoryNetwork, SenderEngine, ReflectorEngine, Reflector],
) -> None:
    network, sender, _rengine, reflector = net
    reflector.add_session(ReflectorSessionConfig(ssid=20))
    cfg = SenderConfig(ssid=20, interval_ns=MS, count=5, loss_timeout_ns=SLACK, flow_labels=(7, 9))
    sender.add_session(SenderSessionSpec(cfg, R_ADDR, 862))
    sender.start_session(20)
    assert sender.wait_finished(20, 10)
    assert [(label, int.from_bytes(p[:4])) for label, p in network.labels] == [
        (7, 0), (9, 1), (7, 2), (9, 3), (7, 4),
    ]  # fmt: skip
    assert [r.flow_label for r in sender.results(20)] == [7, 9, 7, 9, 7]


class _NoLabels(MemoryDataplane):
    sets_flow_label = False


def test_flow_labels_on_a_plane_that_cannot_set_them_are_refused() -> None:
    plane = _NoLabels(DataplaneConfig(port=0, source=S_ADDR), MemoryNetwork())
    engine = SenderEngine(plane)
    cfg = SenderConfig(ssid=1, flow_labels=(1,))
    with pytest.raises(SessionConfigError, match="flow_labels"):
        engine.add_session(SenderSessionSpec(cfg, R_ADDR, 862))


def test_the_first_packet_carries_the_data_count_and_a_failed_read_keeps_the_last(
    net: tuple[MemoryNetwork, SenderEngine, ReflectorEngine, Reflector],
) -> None:
    """Regression: the first packet of a direct-measurement session carried the test
    packet count (start_session did not read the source), and a failed read fell back to
    it, so S_TxC jumped by about 2^32 between two samples."""
    _network, sender, rengine, reflector = net
    readings: list[tuple[int, int] | None] = [(500, 7), None, (530, 8)]
    calls = iter(readings + [(530, 8)] * 100)

    def source() -> tuple[int, int]:
        value = next(calls)
        if value is None:
            raise OSError("netlink went away")
        return value

    rengine.add_session(ReflectorSessionConfig(ssid=21), data_counters=lambda: (90, 400))
    cfg = SenderConfig(ssid=21, interval_ns=20 * MS, count=3, direct_measurement=True)
    sender.add_session(SenderSessionSpec(cfg, R_ADDR, 862, data_counters=source))
    sender.start_session(21)
    assert sender.wait_finished(21, 10)
    records = sender.results(21)
    counts = [r.data.s_txc for r in records if r.data]
    assert counts[0] == 500  # read before the first packet
    assert len(counts) == 3
    assert set(counts) <= {500, 530}  # never the test packet count (1, 2, 3)
    assert all(r.data and (r.data.r_rxc, r.data.r_txc) == (400, 90) for r in records)
    assert sender.counters.data_counter_failed == 1
    assert reflector.counters.reflected == 3


class _Hooks(MemoryDataplane):
    """A memory plane that records the session hooks the engine calls."""

    def __init__(self, config: DataplaneConfig, network: MemoryNetwork) -> None:
        super().__init__(config, network)
        self.hooks: list[tuple[str, int]] = []

    def sender_session_added(self, ssid: int) -> None:
        self.hooks.append(("added", ssid))

    def sender_session_removed(self, ssid: int) -> None:
        self.hooks.append(("removed", ssid))


@pytest.mark.parametrize("rebuilds", [True, False])
def test_a_plane_that_rebuilds_replies_never_hears_of_a_loopback_session(rebuilds: bool) -> None:
    """The xdp plane rebuilds collected replies as reflector packets and would garble a
    looped Session-Sender packet: it never hears of a loopback session. A plane that
    hands frames over as they are (afxdp) must hear of it, or they never reach it."""
    network = MemoryNetwork()
    plane = _Hooks(DataplaneConfig(port=0, source=S_ADDR), network)
    plane.rebuilds_replies = rebuilds  # type: ignore[misc]
    plane.open()
    engine = SenderEngine(plane)
    engine.start()
    try:
        looped = SenderConfig(ssid=1, interval_ns=MS, count=3, loopback=True)
        engine.add_session(SenderSessionSpec(looped, S_ADDR, plane.local_port, (R_ADDR,)))
        engine.add_session(SenderSessionSpec(SenderConfig(ssid=2), R_ADDR, 862))
        engine.start_session(1)
        assert engine.wait_finished(1, 10)
        assert [r.rtt_ns >= 0 and r.loopback for r in engine.results(1)] == [True] * 3
        engine.remove_session(1)
        engine.remove_session(2)
    finally:
        engine.shutdown()
        plane.close()
    if rebuilds:
        assert plane.hooks == [("added", 2), ("removed", 2)]
    else:
        assert plane.hooks == [("added", 1), ("added", 2), ("removed", 1), ("removed", 2)]


def test_a_loss_report_wakes_the_waiters() -> None:
    """A probe declared lost wakes ``wait_change`` (a results stream) as a record does:
    on a path where every probe is lost no record ever comes, and the report must not
    wait for the session's next counters (docs/architecture.md, "Loss reports")."""
    network = MemoryNetwork()
    sink = network.plane(DataplaneConfig(port=862, source=R_ADDR))  # receives, never answers
    splane = network.plane(DataplaneConfig(port=0, source=S_ADDR))
    sink.open()
    splane.open()
    clocks = SteppedClocks()
    engine = SenderEngine(splane, clocks.wall, monotonic=clocks.mono)
    cfg = SenderConfig(ssid=1, interval_ns=10 * S, count=2, loss_timeout_ns=100 * MS)
    engine.add_session(SenderSessionSpec(cfg, R_ADDR, 862))
    engine.start_session(1)
    seen = engine.wait_change(-1, 0)
    clocks.advance(150 * MS)  # probe 0 expires; probe 1 is 10 s off
    engine._on_tick()
    assert engine.lost_after(1, 0)
    assert engine.snapshot(1).state is State.RUNNING
    assert engine.wait_change(seen, 0) != seen
    splane.close()
    sink.close()


def _policy_of_engine_thread(realtime_priority: int | None, setpriv: bool = False) -> str:
    """In a fresh process (the policy is per thread, and a test must not leave one):
    a sender engine's thread's scheduling policy while it serves a session, with its
    ``realtime`` and ``realtime_error``; ``setpriv``: without CAP_SYS_NICE."""
    code = f"""
import os, time
from ipaddress import IPv6Address
from sixlab.dataplane.base import DataplaneConfig
from sixlab.dataplane.engine import ReflectorEngine, SenderEngine, SenderSessionSpec
from sixlab.dataplane.memory import MemoryNetwork
from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig
net = MemoryNetwork()
r = net.plane(DataplaneConfig(port=862, source=IPv6Address("fd00::2")))
s = net.plane(DataplaneConfig(port=0, source=IPv6Address("fd00::1")))
r.open(); s.open()
re = ReflectorEngine(r, Reflector(ReflectorSessionConfig(None))); re.start()
se = SenderEngine(s, realtime_priority={realtime_priority!r}); se.start()
cfg = SenderConfig(ssid=1, interval_ns=10**6, count=20, loss_timeout_ns=5 * 10**9)
se.add_session(SenderSessionSpec(cfg, IPv6Address("fd00::2"), 862))
se.start_session(1)
assert se.wait_finished(1, 10)
policy = os.sched_getscheduler(se._thread.native_id)
print(policy == os.SCHED_FIFO, se.realtime, se.realtime_error, len(se.results(1)))
se.shutdown(); re.shutdown()
"""
    argv = [sys.executable, "-c", code]
    if setpriv:
        argv = ["setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_FIFO needs CAP_SYS_NICE")
def test_realtime_priority_puts_the_engine_thread_alone_under_sched_fifo() -> None:
    assert _policy_of_engine_thread(5) == "True True None 20"
    assert _policy_of_engine_thread(None) == "False False None 20"


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv here")
def test_a_refused_realtime_priority_is_reported_and_the_engine_runs_on() -> None:
    out = _policy_of_engine_thread(5, setpriv=True)
    assert out == "False False SCHED_FIFO priority 5: Operation not permitted 20"


@pytest.mark.parametrize("priority", [0, 100, -1])
def test_a_realtime_priority_out_of_range_is_refused(priority: int) -> None:
    plane = MemoryNetwork().plane(DataplaneConfig(port=0, source=S_ADDR))
    with pytest.raises(ValueError, match="realtime_priority"):
        SenderEngine(plane, realtime_priority=priority)


def test_a_truncated_test_packet_is_counted_and_never_reflected() -> None:
    """A test packet longer than the socket plane's receive buffer (9,000 bytes) comes
    cut by the kernel: the reflector engine counts it ``truncated`` and its core never
    sees it (it would answer the cut packet as if it were whole); a whole one is
    answered."""
    plane = create("socket", DataplaneConfig(port=0))
    plane.open()
    reflector = Reflector(ReflectorSessionConfig(None))  # answers every SSID
    engine = ReflectorEngine(plane, reflector)
    engine.start()
    client = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    client.bind(("::1", 0))
    client.settimeout(1.0)
    try:
        to = ("::1", plane.local_port)
        test = wire.SENDER_UNAUTH.pack(5, 0, 0x0101, 9)
        client.sendto(test + bytes(9100), to)
        client.sendto(test, to)
        reply = client.recv(65536)
        assert len(reply) == wire.UNAUTH_PACKET_SIZE  # the whole one's, not the cut one's
        time.sleep(0.1)
        client.settimeout(0.0)
        with pytest.raises(BlockingIOError):
            client.recv(65536)
        with engine.lock:
            assert (engine.counters.received, engine.counters.truncated) == (2, 1)
            assert (reflector.counters.received, reflector.counters.reflected) == (1, 1)
        assert engine.error is None
    finally:
        client.close()
        engine.shutdown()
        plane.close()
