"""Engines over the in-memory data plane: threads, FIFOs, cursors, overflow, lifecycle."""

from __future__ import annotations

import time
from collections.abc import Iterator
from ipaddress import IPv6Address

import pytest

from sixlab.dataplane.base import DataplaneConfig, DataplaneError, create
from sixlab.dataplane.engine import ReflectorEngine, SenderEngine, SenderSessionSpec
from sixlab.dataplane.memory import MemoryDataplane, MemoryNetwork
from sixlab.stamp._events import SessionConfigError, StampResult
from sixlab.stamp.reflector import Reflector, ReflectorMode, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig, State

R_ADDR = IPv6Address("fd00::2")
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


def _spec(ssid: int, count: int, **kw: object) -> SenderSessionSpec:
    cfg = SenderConfig(ssid=ssid, interval_ns=MS, count=count, loss_timeout_ns=200 * MS)
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
        port = sender.dataplane.local_port  # type: ignore[attr-defined]
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
