"""The controller against real agents (in-process gRPC servers, socket plane on ::1)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sixlab.controller.core import (
    Controller,
    ControllerError,
    SessionExistsError,
    SessionSpec,
    WrongStateError,
)
from sixlab.controller.store import NotFoundError, SqliteStore
from sixlab.southbound.agent import AgentServer, serve

MS = 1_000_000
#: The loss timeout of sessions whose every probe is to be answered (``_check_complete``):
#: a session ends when its last reply comes, so a long one costs a passing run nothing;
#: a short one would count a reply lost that the loaded machine held past it.
ANSWERED_LOSS_TIMEOUT_NS = 10_000 * MS


class Agents:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sender_addr = f"unix:{tmp}/sender.sock"
        self.reflector_addr = f"unix:{tmp}/reflector.sock"
        self.sender: AgentServer = serve(self.sender_addr, "sender")
        self.reflector: AgentServer = serve(self.reflector_addr, "reflector")

    def restart_sender(self) -> None:
        self.sender.stop(0)
        self.sender = serve(self.sender_addr, "sender")

    def close(self) -> None:
        self.sender.stop(0)
        self.reflector.stop(0)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    a = Agents(tmp_path)
    yield a
    a.close()


def _controller(agents: Agents, db: Path, *, init: bool = True) -> Controller:
    c = Controller(SqliteStore(db), poll_interval_s=0.05)
    if init:
        c.register_node("s", agents.sender_addr, "sender")
        c.register_node("r", agents.reflector_addr, "reflector")
        c.init_node("s", source="::1", port=0)
        c.init_node("r", source="::1", port=0)
    return c


def _reflector_port(c: Controller) -> int:
    return c.client("r").info().port


def _spec(c: Controller, name: str = "p", **kw: object) -> SessionSpec:
    base = SessionSpec(
        name=name,
        sender="s",
        reflector="r",
        reflector_address="::1",
        reflector_port=_reflector_port(c),
        interval_ns=10 * MS,
        count=40,
        loss_timeout_ns=ANSWERED_LOSS_TIMEOUT_NS,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def _check_complete(c: Controller, name: str, count: int) -> None:
    row = c.store.session(name)
    ids = c.store.record_ids(row.id)
    assert len(ids) == len(set(ids))  # no duplicate
    seqs = sorted(r.seq for r in c.store.results(row.id))
    assert seqs == list(range(count))  # no gap
    assert (row.sent, row.lost) == (count, 0)


@pytest.mark.parametrize("collect", ["poll", "stream"])
def test_session_end_to_end(agents: Agents, tmp_path: Path, collect: str) -> None:
    c = _controller(agents, tmp_path / "c.db")
    try:
        row = c.create_session(_spec(c, collect=collect, stateful=True))
        assert row.ssid == 1
        c.start_session("p")
        assert c.wait_finished("p", 20)
        assert c.store.session("p").state == "finished"
        _check_complete(c, "p", 40)
        stats = c.stats("p")
        assert stats.direct is not None
        assert stats.rtt is not None
        assert 0 < stats.rtt.p50_ns < 50 * MS
        assert stats.loss_ratio == 0
        assert c.store.session("p").forward_lost == 0
        assert all(n.healthy for n in c.store.nodes())
        text = _metrics_text(c)
        assert 'sixlab_stamp_delay_seconds_count{direction="direct",path="p"} 40.0' in text
        assert 'sixlab_agent_up{node="s"} 1.0' in text
    finally:
        c.close()


def _metrics_text(c: Controller) -> str:
    from prometheus_client import generate_latest  # noqa: PLC0415

    return generate_latest(c.metrics.registry).decode()


def test_many_sessions_get_distinct_ssids(agents: Agents, tmp_path: Path) -> None:
    c = _controller(agents, tmp_path / "c.db")
    try:
        rows = [c.create_session(_spec(c, name=f"p{i}", count=10)) for i in range(3)]
        assert [r.ssid for r in rows] == [1, 2, 3]
        for r in rows:
            c.start_session(r.name)
        for r in rows:
            assert c.wait_finished(r.name, 20)
            _check_complete(c, r.name, 10)
    finally:
        c.close()


def test_controller_restart_mid_session_no_gap_no_duplicate(agents: Agents, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    c1 = _controller(agents, db)
    c1.create_session(_spec(c1, count=150, interval_ns=10 * MS))
    c1.start_session("p")
    time.sleep(0.4)
    c1.close()  # the collector stops wherever it was; agents keep unfetched records
    stored_before = len(c1.store.results(c1.store.session("p").id))
    assert 0 < stored_before < 150
    time.sleep(0.4)  # results pile up on the agent meanwhile
    c2 = Controller(SqliteStore(db), poll_interval_s=0.05)
    try:
        assert c2.resume() == ["p"]
        assert c2.wait_finished("p", 20)
        _check_complete(c2, "p", 150)
    finally:
        c2.close()


# The simulated kill ends the collector thread with an exception, on purpose.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_kill_between_read_and_store_loses_nothing(agents: Agents, tmp_path: Path) -> None:
    """The collector reads a batch, then dies before storing it: the records stay on the
    agent (not acknowledged) and the next controller stores them."""
    db = tmp_path / "c.db"
    c1 = _controller(agents, db)
    c1.create_session(_spec(c1, count=30))
    real = c1.store.store_many  # every collection path stores through it
    calls = {"n": 0}

    def dying(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise SystemExit("controller killed")  # ends the collector thread abruptly
        return real(*args, **kwargs)

    c1.store.store_many = dying  # type: ignore[method-assign]
    c1.start_session("p")
    deadline = time.monotonic() + 10
    while calls["n"] < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert calls["n"] >= 2  # the collector did die between reading and storing
    c1.close()
    c2 = Controller(SqliteStore(db), poll_interval_s=0.05)
    try:
        c2.resume()
        assert c2.wait_finished("p", 20)
        _check_complete(c2, "p", 30)
    finally:
        c2.close()


def test_agent_restart_is_reported_and_the_session_resumes(agents: Agents, tmp_path: Path) -> None:
    c = _controller(agents, tmp_path / "c.db")
    try:
        # Not every probe is checked here, and a probe left unanswered when the sender
        # stops holds the session's end for its loss timeout: a short one.
        c.create_session(
            _spec(c, count=0, duration_ns=0, interval_ns=10 * MS, loss_timeout_ns=500 * MS)
        )
        c.start_session("p")
        time.sleep(0.5)
        agents.sender.stop(0)  # the sender's agent goes away (its sessions with it)
        deadline = time.monotonic() + 10
        while c.store.node("s").healthy and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not c.store.node("s").healthy
        assert 'sixlab_agent_up{node="s"} 0.0' in _metrics_text(c)
        agents.sender = serve(agents.sender_addr, "sender")  # it comes back, empty
        deadline = time.monotonic() + 15
        while c.store.session("p").epoch == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        row = c.store.session("p")
        assert row.epoch == 1  # re-initialised and the session created again
        n_before = len(c.store.results(row.id))
        deadline = time.monotonic() + 10
        while len(c.store.results(row.id)) < n_before + 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(c.store.results(row.id)) >= n_before + 20  # measuring again
        assert c.store.node("s").healthy
        epochs = {e for e, _ in c.store.record_ids(row.id)}
        assert epochs == {0, 1}
        c.stop_session("p")
        assert c.wait_finished("p", 10)
    finally:
        c.close()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": ""}, "name"),
        ({"reflector_address": "10.0.0.300"}, "reflector_address"),
        ({"segments": ("nope",)}, "segments"),
        ({"interval_ns": 0}, "interval_ns"),
        ({"collect": "push"}, "collect"),
        ({"key_hex": "zz"}, "key_hex"),
        ({"return_path_tlv": True}, "return_segments"),
        ({"sender": "r"}, "sender"),
        ({"reflector": "s"}, "reflector"),
    ],
)
def test_bad_session_requests_change_nothing(
    agents: Agents, tmp_path: Path, change: dict[str, object], field: str
) -> None:
    c = _controller(agents, tmp_path / "c.db")
    try:
        spec = replace(_spec(c), **change)  # type: ignore[arg-type]
        with pytest.raises(ControllerError, match=field):
            c.create_session(spec)
        assert c.store.sessions() == []
        assert list(c.client("r").info().ssids) == []
        assert list(c.client("s").info().ssids) == []
    finally:
        c.close()


def test_duplicate_and_unknown_names(agents: Agents, tmp_path: Path) -> None:
    c = _controller(agents, tmp_path / "c.db")
    try:
        c.create_session(_spec(c, count=1))
        with pytest.raises(SessionExistsError, match="already exists"):
            c.create_session(_spec(c, count=1))
        with pytest.raises(NotFoundError, match="no session named 'x'"):
            c.start_session("x")
        with pytest.raises(NotFoundError, match="no node named 'q'"):
            c.create_session(_spec(c, name="q", sender="q"))
        with pytest.raises(WrongStateError, match="not running"):
            c.stop_session("p")
        assert list(c.client("r").info().ssids) == [1]
    finally:
        c.close()


def test_supervisor_never_repairs_a_session_created_while_it_looked(
    agents: Agents, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The supervisor checking every few ms while sessions are created: an answer read
    before a session existed must not read as the session missing (which would create
    it again in a new epoch)."""
    caplog.set_level("WARNING", logger="sixlab.controller.core")
    c = Controller(SqliteStore(tmp_path / "c.db"), poll_interval_s=0.05, supervise_interval_s=0.002)
    try:
        c.register_node("s", agents.sender_addr, "sender")
        c.register_node("r", agents.reflector_addr, "reflector")
        c.init_node("s", source="::1", port=0)
        c.init_node("r", source="::1", port=0)
        names = [f"p{i}" for i in range(30)]
        for name in names:
            c.create_session(_spec(c, name=name, count=5))
            c.start_session(name)
        for name in names:
            assert c.wait_finished(name, 20)
            _check_complete(c, name, 5)
        assert [c.store.session(n).epoch for n in names] == [0] * len(names)
        assert not [r for r in caplog.records if "creating it again" in r.getMessage()]
    finally:
        c.close()
