"""The controller's lifecycle with real agent processes: kill -9, restart, repair.

Agents are ``sixlab stamp agent`` processes serving gRPC on unix sockets, with the
socket plane on ::1; the controller runs in this process so that the tests can read its
store and metrics. Each process is killed with SIGKILL (no clean-up at all) and started
again, as a supervisor would.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from sixlab.controller.client import ControllerClient
from sixlab.controller.core import (
    STREAM_COUNTERS_NS,
    Controller,
    SessionExistsError,
    SessionSpec,
)
from sixlab.controller.northbound import serve_controller
from sixlab.controller.store import SqliteStore
from sixlab.southbound.client import AgentClient
from tests.integration._ports import free_port

MS = 1_000_000


class AgentProcess:
    """One ``sixlab stamp agent`` process on a unix socket, killable and restartable."""

    def __init__(self, tmp: Path, role: str) -> None:
        self.role = role
        self.path = tmp / f"{role}.sock"
        self.address = f"unix:{self.path}"
        self.proc: subprocess.Popen[str] | None = None
        self.start()

    def start(self) -> None:
        # A killed agent leaves its socket file behind: the agent replaces it itself.
        argv = [sys.executable, "-m", "sixlab", "stamp", "agent", "--role", self.role]
        self.proc = subprocess.Popen(
            [*argv, "--grpc", self.address],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("stamp agent:"), line

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._close()

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._close()

    def _close(self) -> None:
        assert self.proc is not None
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None


class Lab:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sender = AgentProcess(tmp, "sender")
        self.reflector = AgentProcess(tmp, "reflector")
        #: A fixed reflector UDP port: a restarted reflector must come back on it.
        self.udp_port = free_port()

    def controller(self, db: str = "c.db", **kw: float | None) -> Controller:
        kw.setdefault("poll_interval_s", 0.05)
        kw.setdefault("supervise_interval_s", 0.2)
        return Controller(SqliteStore(self.tmp / db), **kw)  # type: ignore[arg-type]

    def setup(self, c: Controller) -> None:
        c.register_node("s", self.sender.address, "sender")
        c.register_node("r", self.reflector.address, "reflector")
        c.init_node("s", source="::1", port=0)
        c.init_node("r", source="::1", port=0)

    def spec(self, c: Controller, name: str = "p", **kw: object) -> SessionSpec:
        base = SessionSpec(
            name=name,
            sender="s",
            reflector="r",
            reflector_address="::1",
            reflector_port=c.client("r").info().port,
            interval_ns=20 * MS,
            loss_timeout_ns=300 * MS,
        )
        return replace(base, **kw)  # type: ignore[arg-type]

    def close(self) -> None:
        self.sender.stop()
        self.reflector.stop()


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    yield lab
    lab.close()


def _until(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.05)


def _metrics(c: Controller) -> str:
    return generate_latest(c.metrics.registry).decode()


def _stored(c: Controller, name: str = "p") -> int:
    return c.store.count_results(c.store.session(name).id)


@pytest.mark.parametrize("collect", ["poll", "stream"])
def test_reflector_killed_and_restarted_is_repaired(lab: Lab, collect: str) -> None:
    """kill -9 of the reflector's agent mid-session: the sender keeps sending (its
    packets are lost meanwhile); once the agent is back the controller sees its new
    epoch, initialises it on the same UDP port, creates the session again and loss
    stops, with no call of the sender's ever failing."""
    c = lab.controller()
    try:
        c.register_node("s", lab.sender.address, "sender")
        c.register_node("r", lab.reflector.address, "reflector")
        c.init_node("s", source="::1", port=0)
        c.init_node("r", source="::1", port=lab.udp_port)
        c.create_session(lab.spec(c, collect=collect))
        c.start_session("p")
        _until("results arrive", lambda: _stored(c) >= 20)
        epoch_before = c.store.node("r").agent_epoch

        lab.reflector.kill9()
        _until("the reflector is seen down", lambda: not c.store.node("r").healthy)
        assert 'sixlab_agent_up{node="r"} 0.0' in _metrics(c)
        _until("the sender declares losses", lambda: c.store.session("p").lost > 0)

        lab.reflector.start()
        # Healthy as soon as the new run answers; its epoch is recorded just after.
        _until(
            "the reflector is seen up in a new run",
            lambda: c.store.node("r").healthy and c.store.node("r").agent_epoch != epoch_before,
        )
        assert c.store.node("r").restarts == 1
        assert 'sixlab_agent_restarts_total{node="r"} 1.0' in _metrics(c)
        ssid = c.store.session("p").ssid
        with AgentClient(lab.reflector.address) as r:
            _until("the session is on the reflector again", lambda: ssid in r.info().ssids)
        stored = _stored(c)
        _until("results arrive again", lambda: _stored(c) >= stored + 20)
        # Counters (sent, lost) reach the store with every poll, and on a stream at
        # least every STREAM_COUNTERS_NS: one such interval past the loss timeout, every
        # loss of the outage is declared and stored.
        settle = STREAM_COUNTERS_NS / 1e9 + 0.5
        time.sleep(settle)
        before = c.store.session("p")
        time.sleep(settle)  # eight loss timeouts: anything still unanswered would be lost
        row = c.store.session("p")
        assert row.sent > before.sent  # fresh counters arrived meanwhile ...
        assert row.lost == before.lost  # ... and loss stopped: the reflector answers again
        assert row.epoch == 0  # the sender's session was never created again
        assert 'sixlab_agent_up{node="r"} 1.0' in _metrics(c)
        with AgentClient(lab.reflector.address) as r:
            assert list(r.info().ssids) == [row.ssid]
            assert r.info().port == lab.udp_port
        c.stop_session("p")
        assert c.wait_finished("p", 10)
    finally:
        c.close()


@pytest.mark.parametrize("collect", ["poll", "stream"])
def test_stateful_session_restarts_afresh_when_its_reflector_restarts(
    lab: Lab, collect: str
) -> None:
    """A restarted stateful reflector counts from 0 again while the sender's Seq goes on,
    which reads as forward loss: the controller drains the sender's epoch and starts
    both halves afresh in a new one, so the forward/backward split stays true."""
    c = lab.controller()
    try:
        lab.setup(c)
        # A loss timeout of 1 s, not 0.3: "second.lost == 0" is about the new epoch not
        # inheriting the old one's losses, not about a reply the host held 0.3 s (seen
        # once at load average 8, the sender 30 slots behind).
        c.create_session(lab.spec(c, collect=collect, stateful=True, loss_timeout_ns=1000 * MS))
        c.start_session("p")
        _until("results arrive", lambda: _stored(c) >= 50)
        lab.reflector.kill9()
        _until("the sender declares losses", lambda: c.store.session("p").lost > 0)
        lab.reflector.start()
        _until("a new epoch", lambda: c.store.session("p").epoch == 1)
        row = c.store.session("p")
        _until("results of the new epoch", lambda: (1, 20) in c.store.record_ids(row.id))
        c.stop_session("p")
        assert c.wait_finished("p", 10)
        row = c.store.session("p")
        first, second = c.epochs("p")
        assert (first.end_reason, second.end_reason) == ("reflector-lost", "finished")
        assert (first.unknown, second.unknown) == (0, 0)  # drained: nothing unaccounted
        assert row.forward_lost is not None
        assert row.forward_lost <= row.lost  # not the reflector's restarted count
        assert second.lost == 0
        assert 'reason="reflector-lost"} 1.0' in _metrics(c)
    finally:
        c.close()


def test_reflector_on_port_zero_comes_back_on_the_port_it_had(lab: Lab) -> None:
    c = lab.controller()
    try:
        lab.setup(c)  # the reflector's Init asked for any free port
        port = c.client("r").info().port
        c.create_session(lab.spec(c))
        c.start_session("p")
        _until("results arrive", lambda: _stored(c) >= 10)
        lab.reflector.kill9()
        lab.reflector.start()
        _until("the reflector is repaired", lambda: c.store.node("r").restarts == 1)
        stored = _stored(c)
        _until("results arrive again", lambda: _stored(c) >= stored + 10)
        assert c.client("r").info().port == port
    finally:
        c.close()


@pytest.mark.parametrize("collect", ["poll", "stream"])
def test_sender_killed_and_restarted_opens_a_new_epoch(lab: Lab, collect: str) -> None:
    c = lab.controller()
    try:
        lab.setup(c)
        c.create_session(lab.spec(c, collect=collect))
        c.start_session("p")
        _until("results arrive", lambda: _stored(c) >= 20)
        lab.sender.kill9()
        _until("the sender is seen down", lambda: not c.store.node("s").healthy)
        assert 'sixlab_agent_up{node="s"} 0.0' in _metrics(c)
        lab.sender.start()
        _until("a new epoch", lambda: c.store.session("p").epoch == 1)
        row = c.store.session("p")
        _until("results of the new epoch", lambda: (1, 20) in c.store.record_ids(row.id))
        assert c.store.node("s").restarts == 1
        text = _metrics(c)
        assert 'sixlab_agent_restarts_total{node="s"} 1.0' in text
        assert 'sixlab_session_recreations_total{path="p",reason="sender-lost"} 1.0' in text
        assert 'sixlab_stamp_packets_total{outcome="unknown",path="p"} 0.0' not in text
        ids = c.store.record_ids(row.id)
        assert len(ids) == len(set(ids))
        assert {e for e, _ in ids} == {0, 1}
        c.stop_session("p")
        assert c.wait_finished("p", 10)
        assert c.store.session("p").state == "finished"
    finally:
        c.close()


def test_session_missing_from_an_agent_that_did_not_restart_is_created_again(lab: Lab) -> None:
    """An agent Reset behind the controller's back keeps its epoch but has lost its Init
    and sessions: the controller sees the missing session and restores it."""
    c = lab.controller()
    try:
        c.register_node("s", lab.sender.address, "sender")
        c.register_node("r", lab.reflector.address, "reflector")
        c.init_node("s", source="::1", port=0)
        c.init_node("r", source="::1", port=lab.udp_port)
        c.create_session(lab.spec(c))
        c.start_session("p")
        _until("results arrive", lambda: _stored(c) >= 10)
        with AgentClient(lab.reflector.address) as r:
            r.reset()
            _until("the session is back", lambda: list(r.info().ssids) == [1])
        stored = _stored(c)
        _until("results arrive again", lambda: _stored(c) >= stored + 10)
        assert c.store.node("r").restarts == 0
    finally:
        c.close()


@pytest.mark.parametrize("collect", ["poll", "stream"])
def test_stopped_session_starts_again_in_a_new_epoch(lab: Lab, collect: str) -> None:
    c = lab.controller()
    try:
        lab.setup(c)
        c.create_session(lab.spec(c, collect=collect, stateful=True))
        c.start_session("p")
        _until("results arrive", lambda: _stored(c) >= 10)
        c.stop_session("p")
        assert c.wait_finished("p", 10)
        first = c.store.session("p")
        assert (first.state, first.epoch) == ("finished", 0)
        assert first.sent == c.store.count_results(first.id) > 0

        c.start_session("p")  # a stopped session is not over for good
        assert c.store.session("p").state == "running"
        _until("results of the new epoch", lambda: (1, 10) in c.store.record_ids(first.id))
        c.stop_session("p")
        assert c.wait_finished("p", 10)
        row = c.store.session("p")
        assert row.epoch == 1
        ids = c.store.record_ids(row.id)
        assert len(ids) == len(set(ids)) == row.sent  # every packet, stored once
        assert (row.lost, row.forward_lost) == (0, 0)
        with AgentClient(lab.reflector.address) as r:
            # The reflector's half was created again with the sender's: its count starts
            # over with the new epoch's Seq (else forward loss would be misread).
            assert r.counters(row.ssid).sessions[0].reflected == row.sent - first.sent
    finally:
        c.close()


def test_session_ended_by_its_count_starts_again(lab: Lab) -> None:
    c = lab.controller()
    try:
        lab.setup(c)
        c.create_session(lab.spec(c, count=15))
        for epoch in range(3):
            c.start_session("p")
            assert c.wait_finished("p", 20)
            row = c.store.session("p")
            assert (row.state, row.epoch, row.sent) == ("finished", epoch, 15 * (epoch + 1))
        seqs = sorted(r.seq for r in c.store.results(row.id))
        assert seqs == sorted(list(range(15)) * 3)  # each epoch's Seq starts at 0
    finally:
        c.close()


def test_destroyed_name_can_be_used_again(lab: Lab) -> None:
    c = lab.controller()
    try:
        lab.setup(c)
        old = c.create_session(lab.spec(c, count=10))
        c.start_session("p")
        assert c.wait_finished("p", 20)
        c.destroy_session("p")
        new = c.create_session(lab.spec(c, count=5))  # same name, once destroyed
        assert new.id != old.id
        assert new.state == "created"
        c.start_session("p")
        assert c.wait_finished("p", 20)
        assert c.store.session("p").id == new.id
        assert c.store.count_results(new.id) == 5
        assert c.store.count_results(old.id) == 10  # the old session's results stay
        assert [s.name for s in c.store.sessions(include_destroyed=True)] == ["p", "p"]
        with pytest.raises(SessionExistsError, match="already exists"):
            c.create_session(lab.spec(c))  # but not while it is live
    finally:
        c.close()


def test_sixty_stream_sessions_on_one_sender(lab: Lab) -> None:
    """Stream collection is one stream per sender agent, not one worker thread of the
    agent per session: sixty sessions running at once all start, are collected while
    they run, and are stored complete."""
    c = lab.controller()
    try:
        lab.setup(c)
        names = [f"p{i}" for i in range(60)]
        for name in names:
            c.create_session(lab.spec(c, name, collect="stream", interval_ns=100 * MS))
            c.start_session(name)
        for name in names:
            _until(f"{name} is collected", lambda name=name: _stored(c, name) >= 5)  # type: ignore[misc]
        for name in names:
            c.stop_session(name)
        for name in names:
            assert c.wait_finished(name, 30), name
        for name in names:
            row = c.store.session(name)
            seqs = sorted(r.seq for r in c.store.results(row.id))
            assert seqs == list(range(row.sent)), name
            assert (row.state, row.lost) == ("finished", 0)
    finally:
        c.close()


def test_sender_outage_is_reported_per_epoch(lab: Lab, tmp_path: Path) -> None:
    """kill -9 of the sender's agent: the results it held unacknowledged and the probes
    its schedule called for while it was down are counted unknown in the dead epoch
    (not silently gone), and every result says which epoch its Seq belongs to."""
    c = lab.controller(poll_interval_s=0.5)  # let results wait on the agent
    server = serve_controller(f"unix:{tmp_path}/ctl.sock", c)
    api = ControllerClient(f"unix:{tmp_path}/ctl.sock")
    try:
        lab.setup(c)
        c.create_session(lab.spec(c))
        c.start_session("p")
        _until("results arrive", lambda: _stored(c) >= 50)
        time.sleep(0.3)
        lab.sender.kill9()
        time.sleep(1.0)  # fifty slots of 20 ms with no agent at all
        lab.sender.start()
        row = c.store.session("p")
        _until("results of the new epoch", lambda: (1, 10) in c.store.record_ids(row.id))

        dead, current = c.epochs("p")
        assert (dead.epoch, dead.end_reason, current.epoch, current.end_reason) == (
            0, "sender-lost", 1, None
        )  # fmt: skip
        assert dead.ended_ns is not None
        assert dead.sender_agent != current.sender_agent
        due = -(-(dead.ended_ns - dead.started_ns) // (20 * MS))
        assert dead.received + dead.lost + dead.unknown == max(due, dead.sent)
        assert dead.unknown >= 50 - 5  # the outage, at least
        assert current.unknown == 0

        node = next(n for n in api.nodes() if n.name == "s")
        assert (node.restarts, node.agent_epoch) == (1, current.sender_agent)
        assert node.agent_started_ns is not None
        stats = api.stats("p")
        assert stats.unknown == dead.unknown
        assert [e.end_reason for e in stats.epochs] == ["sender-lost", ""]
        assert stats.loss_ratio == stats.lost / (stats.received + stats.lost)
        page = api.results("p", limit=100_000)
        keys = list(zip(page.epochs, (r.seq for r in page.records), strict=True))
        assert len(keys) == len(set(keys))  # (epoch, Seq) tells every record apart
        assert {e for e, _ in keys} == {0, 1}
        assert (1, 0) in keys
        assert (0, 0) in keys
    finally:
        api.close()
        server.stop(0)
        c.close()


def test_a_stalled_sender_reports_the_slots_it_skipped(
    lab: Lab, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGSTOP of the sender's agent for half a second: when it runs again it sends one
    packet for the latest slot and skips the ones it missed (no burst); the slip is
    counted by the agent and reported by the controller (stats, epochs, a warning)."""
    c = lab.controller()
    server = serve_controller(f"unix:{tmp_path}/ctl.sock", c)
    api = ControllerClient(f"unix:{tmp_path}/ctl.sock")
    try:
        lab.setup(c)
        c.create_session(lab.spec(c, interval_ns=50 * MS, loss_timeout_ns=2000 * MS))
        c.start_session("p")
        _until("results arrive", lambda: _stored(c) >= 10)
        before = api.stats("p").schedule_skipped  # 0, unless the machine is very busy
        assert lab.sender.proc is not None
        caplog.set_level("WARNING", logger="sixlab.controller.core")
        lab.sender.proc.send_signal(signal.SIGSTOP)
        time.sleep(0.5)  # ten slots of 50 ms
        lab.sender.proc.send_signal(signal.SIGCONT)
        _until("the skips are reported", lambda: api.stats("p").schedule_skipped >= before + 5)
        c.stop_session("p")
        assert c.wait_finished("p", 10)
        stats = api.stats("p")
        assert stats.epochs[0].schedule_skipped == stats.schedule_skipped
        assert stats.schedule_late_mean_ns is not None
        assert 0 <= stats.schedule_late_mean_ns <= stats.schedule_late_max_ns < 50 * MS
        assert any("skipped" in r.getMessage() for r in caplog.records)
        seqs = [r.seq for r in api.results("p", limit=100_000).records]
        assert seqs == list(range(len(seqs)))  # skipped slots cost no Seq: no gap, no loss
    finally:
        api.close()
        server.stop(0)
        c.close()


# ------------------------------------------------------------------------- metrics

CONTROLLER_CMD = [sys.executable, "-m", "sixlab", "controller"]


def _serve(tmp: Path, metrics_port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            *CONTROLLER_CMD,
            *("serve", "--db", str(tmp / "c.db"), "--grpc", f"unix:{tmp}/ctl.sock"),
            *("--poll-interval", "0.05", "--metrics", f"127.0.0.1:{metrics_port}"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("controller: grpc=")
    return proc


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text: str = reply.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_metrics_are_the_stored_totals_and_follow_the_sessions(lab: Lab, tmp_path: Path) -> None:
    """The controller as a process with /metrics: no _created series; packets by every
    outcome and loss by direction; a destroyed session's series go; after kill -9 of the
    controller, the counters go on from the stored totals instead of restarting at 0."""
    port = free_port("127.0.0.1", socket.SOCK_STREAM)
    proc = _serve(tmp_path, port)
    try:
        with ControllerClient(f"unix:{tmp_path}/ctl.sock") as api:
            api.register_node("s", lab.sender.address, "sender")
            api.register_node("r", lab.reflector.address, "reflector")
            api.init_node("s", source="::1", port=0)
            rport = api.init_node("r", source="::1", port=0)
            for name in ("keep", "drop"):
                spec = SessionSpec(
                    name, "s", "r", "::1", reflector_port=rport, interval_ns=10 * MS,
                    count=30, stateful=True,
                )  # fmt: skip
                api.create_session(spec)
                api.start_session(name)
            for name in ("keep", "drop"):
                api.wait_state(name, ("finished",), timeout=20)
            before = _scrape(port)
            for outcome, value in (("sent", 30), ("received", 30), ("lost", 0), ("unknown", 0)):
                key = f'sixlab_stamp_packets_total{{outcome="{outcome}",path="keep"}}'
                assert before[key] == value
            for direction in ("forward", "backward"):
                key = f'sixlab_stamp_lost_packets_total{{direction="{direction}",path="keep"}}'
                assert before[key] == 0
            assert before['sixlab_stamp_delay_seconds_count{direction="rtt",path="keep"}'] == 30
            assert before['sixlab_collection_lag_seconds{path="keep"}'] >= 0
            # A loaded machine may skip a 10 ms slot: the series must exist, with a count.
            assert before['sixlab_sender_schedule_skipped_total{path="keep"}'] >= 0
            assert before['sixlab_agent_restarts_total{node="s"}'] == 0
            assert before['sixlab_agent_start_time_seconds{node="r"}'] > 0
            assert not [k for k in before if "_created" in k]
            assert any('path="drop"' in k for k in before)
            api.destroy_session("drop")
            assert not [k for k in _scrape(port) if 'path="drop"' in k]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()

        proc = _serve(tmp_path, port)
        after = _scrape(port)  # at once: nothing collected by this process yet
        assert after['sixlab_stamp_packets_total{outcome="sent",path="keep"}'] == 30
        assert after['sixlab_stamp_packets_total{outcome="received",path="keep"}'] == 30
        skipped = 'sixlab_sender_schedule_skipped_total{path="keep"}'
        assert after[skipped] == before[skipped]
        assert not [k for k in after if 'path="drop"' in k]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
        if proc.stdout is not None:
            proc.stdout.close()
