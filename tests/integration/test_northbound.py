"""The controller's northbound API and ``sixlab controller`` against real agents.

Agents run in this process (gRPC on unix sockets, socket plane on ::1); the controller
runs in this process too (API tests) or as its own process (``controller serve``,
driven by CLI subprocesses, and killed with SIGKILL to show that it resumes).
"""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from sixlab.cli.controller import utc_time
from sixlab.controller._generated import controller_pb2 as pb
from sixlab.controller._generated import controller_pb2_grpc as pb_grpc
from sixlab.controller.client import ControllerClient, NorthboundError
from sixlab.controller.core import Controller, SessionSpec
from sixlab.controller.northbound import ControllerServer, serve_controller
from sixlab.controller.store import SqliteStore
from sixlab.southbound.agent import AgentServer, serve
from sixlab.southbound.client import AgentClient, SouthboundError
from tests.integration._ports import free_port

MS = 1_000_000
#: ``sixlab controller ...`` without relying on the top-level ``sixlab`` dispatcher.
CONTROLLER_CMD = [
    sys.executable,
    "-c",
    "import sys; from sixlab.cli.controller import main; "
    "sys.exit(main(['controller', *sys.argv[1:]]))",
]
Code = grpc.StatusCode


class Agents:
    """A sender and a reflector agent on unix sockets in ``tmp``."""

    def __init__(self, tmp: Path) -> None:
        self.sender_addr = f"unix:{tmp}/sender.sock"
        self.reflector_addr = f"unix:{tmp}/reflector.sock"
        self.sender: AgentServer = serve(self.sender_addr, "sender")
        self.reflector: AgentServer = serve(self.reflector_addr, "reflector")

    def close(self) -> None:
        self.sender.stop(0)
        self.reflector.stop(0)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    a = Agents(tmp_path)
    yield a
    a.close()


@dataclass
class Northbound:
    controller: Controller
    server: ControllerServer
    client: ControllerClient
    address: str

    def close(self) -> None:
        self.client.close()
        self.server.stop(0)
        self.controller.close()
        self.controller.store.close()


def _northbound(
    tmp: Path,
    supervise_interval_s: float | None = 1.0,
    client_factory: type[AgentClient] = AgentClient,
) -> Northbound:
    address = f"unix:{tmp}/controller.sock"
    controller = Controller(
        SqliteStore(tmp / "c.db"), poll_interval_s=0.05, supervise_interval_s=supervise_interval_s,
        client_factory=client_factory,
    )  # fmt: skip
    server = serve_controller(address, controller)
    return Northbound(controller, server, ControllerClient(address, timeout=15), address)


@pytest.fixture
def northbound(tmp_path: Path) -> Iterator[Northbound]:
    nb = _northbound(tmp_path)
    yield nb
    nb.close()


def _pair(client: ControllerClient, agents: Agents) -> int:
    """Register and initialise sender "s" and reflector "r"; the reflector's port."""
    client.register_node("s", agents.sender_addr, "sender")
    client.register_node("r", agents.reflector_addr, "reflector")
    client.init_node("s", source="::1", port=0)
    return client.init_node("r", source="::1", port=0)


def _spec(port: int, name: str = "p", **kw: Any) -> SessionSpec:
    base: dict[str, Any] = {
        "name": name,
        "sender": "s",
        "reflector": "r",
        "reflector_address": "::1",
        "reflector_port": port,
        "interval_ns": 10 * MS,
        "count": 40,
        "loss_timeout_ns": 500 * MS,
    }
    return SessionSpec(**(base | kw))


# ----------------------------------------------------------------------- API end to end


@pytest.mark.parametrize("collect", ["poll", "stream"])
def test_api_end_to_end(agents: Agents, northbound: Northbound, collect: str) -> None:
    c = northbound.client
    port = _pair(c, agents)
    nodes = c.nodes()
    assert [(n.name, n.role, n.healthy, n.initialized) for n in nodes] == [
        ("r", "reflector", True, True),
        ("s", "sender", True, True),
    ]
    assert all(n.last_seen_ns and n.last_error == "" for n in nodes)
    created = c.create_session(_spec(port, collect=collect, stateful=True))
    assert (created.name, created.ssid, created.state, created.collect) == (
        "p",
        1,
        "created",
        collect,
    )
    assert (created.reflector_port, created.interval_ns, created.count) == (port, 10 * MS, 40)
    assert created.stateful
    assert not created.authenticated
    c.start_session("p")
    done = c.wait_state("p", ("finished",), timeout=20)
    assert (done.sent, done.lost, done.forward_lost, done.stored) == (40, 0, 0, 40)

    page = c.results("p")
    assert not page.more
    assert [r.seq for r in page.records] == list(range(40))
    assert all(0 < r.rtt_ns < 50 * MS for r in page.records)
    assert all(r.t1_ns <= r.t4_ns for r in page.records)

    stats = c.stats("p")
    assert (stats.received, stats.lost, stats.sent, stats.loss_ratio) == (40, 0, 40, 0.0)
    assert (stats.forward_lost, stats.backward_lost) == (0, 0)
    assert stats.rtt is not None
    assert stats.direct is not None
    assert stats.backward is not None
    rtts = sorted(r.rtt_ns for r in page.records)
    assert (stats.rtt.count, stats.rtt.min_ns, stats.rtt.max_ns) == (40, rtts[0], rtts[-1])
    assert stats.direct_jitter_ns is not None
    assert stats.max_error_bound_ns is not None

    c.destroy_session("p")
    assert c.sessions() == []
    assert [s.state for s in c.sessions(include_destroyed=True)] == ["destroyed"]
    assert c.results("p").records == page.records  # results outlive the session
    with AgentClient(agents.sender_addr) as s:
        assert list(s.info().ssids) == []


def test_results_pages_and_since(agents: Agents, northbound: Northbound) -> None:
    c = northbound.client
    port = _pair(c, agents)
    c.create_session(_spec(port, count=30, interval_ns=5 * MS))
    c.start_session("p")
    c.wait_state("p", ("finished",), timeout=20)
    first = c.results("p", limit=10)
    assert first.more
    assert [r.seq for r in first.records] == list(range(10))
    rest = c.results("p", since_ns=first.records[-1].t1_ns + 1)
    assert not rest.more
    assert [r.seq for r in rest.records] == list(range(10, 30))
    later = c.stats("p", since_ns=rest.records[0].t1_ns)
    assert later.received == 20
    assert later.forward_lost is None  # loss is only known for the whole session


def test_stop_then_finish_and_state_errors(agents: Agents, northbound: Northbound) -> None:
    c = northbound.client
    port = _pair(c, agents)
    c.create_session(_spec(port, count=0, interval_ns=10 * MS, collect="stream"))
    c.start_session("p")
    with pytest.raises(NorthboundError) as err:
        c.start_session("p")
    assert err.value.code is Code.FAILED_PRECONDITION
    assert "name" in err.value.details
    with pytest.raises(NorthboundError, match="is running, not finished") as err:
        c.wait_state("p", ("finished",), timeout=0.3)  # runs until stopped
    assert err.value.code is Code.DEADLINE_EXCEEDED
    c.stop_session("p")
    info = c.wait_state("p", ("finished",), timeout=10)
    assert info.stored == info.sent > 0
    assert [r.seq for r in c.results("p").records] == list(range(info.sent))


def test_a_stop_the_sender_cannot_get_now_is_accepted_and_completed_later(
    agents: Agents, tmp_path: Path
) -> None:
    """StopSession while the controller cannot reach the sender (its stop request is
    cut off; the sender is reachable again for the next calls): the stop is accepted
    with a reply that says the sender was not told yet, the session shows ``stopping``
    (not ``running`` again), and the controller tells the sender at a later round: the
    session finishes with every result stored."""

    class Cut(AgentClient):
        def stop_session(self, ssid: int) -> None:
            raise SouthboundError(Code.UNAVAILABLE, "cut off from the sender")

    nb = _northbound(tmp_path, supervise_interval_s=0.2, client_factory=Cut)
    try:
        c = nb.client
        port = _pair(c, agents)
        for name in ("p", "q"):
            c.create_session(_spec(port, name, count=0, interval_ns=50 * MS, collect="stream"))
            c.start_session(name)
        time.sleep(0.2)

        pending = c.stop_session("p")
        printed = _cli(nb.address, "session", "stop", "q")

        assert "'s' not told yet" in pending
        assert "cut off from the sender" in pending
        assert printed.returncode == 0, printed.stderr
        assert printed.stdout.startswith("session q stopping: sender 's' not told yet")
        assert {s.name: s.state for s in c.sessions()} == {"p": "stopping", "q": "stopping"}
        for name in ("p", "q"):
            info = c.wait_state(name, ("finished",), timeout=30)
            assert info.stored == info.sent > 0
            assert [r.seq for r in c.results(name).records] == list(range(info.sent))
    finally:
        nb.close()


# --------------------------------------------------------------------- bad requests


@dataclass
class World:
    """Agents and a controller with nodes and a created session, for refused requests."""

    nb: Northbound
    stub: Any
    agents: dict[str, AgentClient]
    reflector_port: int


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("nb")
    agents = Agents(tmp)
    spare_addr = f"unix:{tmp}/spare.sock"
    spare = serve(spare_addr, "sender")  # up, never initialised
    # No supervisor: its health checks would refresh last_seen under the snapshots.
    nb = _northbound(tmp, supervise_interval_s=None)
    port = _pair(nb.client, agents)
    nb.client.register_node("s2", spare_addr, "sender")
    nb.client.register_node("gone", f"unix:{tmp}/nobody.sock", "sender")
    nb.client.create_session(_spec(port))
    channel = grpc.insecure_channel(nb.address)
    clients = {
        name: AgentClient(addr)
        for name, addr in (
            ("s", agents.sender_addr),
            ("r", agents.reflector_addr),
            ("s2", spare_addr),
        )
    }
    try:
        yield World(nb, pb_grpc.ControllerStub(channel), clients, port)  # type: ignore[no-untyped-call]
    finally:
        for client in clients.values():
            client.close()
        channel.close()
        nb.close()
        spare.stop(0)
        agents.close()


def _snapshot(w: World, *, exact: bool) -> tuple[Any, ...]:
    """Everything a refused request must leave alone: nodes, sessions, the agents.

    ``exact=False`` leaves out health observations (last seen, last error), which a call
    that reached an agent refreshes even when it is refused.
    """
    nodes = w.stub.ListNodes(pb.ListNodesRequest()).nodes
    if not exact:
        nodes = [
            pb.Node(name=n.name, address=n.address, role=n.role, initialized=n.initialized)
            for n in nodes
        ]
    sessions = w.stub.ListSessions(pb.ListSessionsRequest(include_destroyed=True)).sessions
    agent_state = {
        name: (info.initialized, list(info.ssids), info.port)
        for name, client in w.agents.items()
        for info in [client.info()]
    }
    return list(nodes), list(sessions), agent_state


def _create(**kw: Any) -> Callable[[World], pb.CreateSessionRequest]:
    def build(w: World) -> pb.CreateSessionRequest:
        fields: dict[str, Any] = {
            "name": "q",
            "sender": "s",
            "reflector": "r",
            "reflector_address": "::1",
            "reflector_port": w.reflector_port,
            "count": 5,
        }
        return pb.CreateSessionRequest(**(fields | kw))

    return build


def _req(message: Any) -> Callable[[World], Any]:
    return lambda _w: message


def _reg(**kw: Any) -> Callable[[World], Any]:
    fields: dict[str, Any] = {"name": "x", "address": "[::1]:1", "role": pb.NODE_ROLE_SENDER}
    return _req(pb.RegisterNodeRequest(**(fields | kw)))


def _init(**kw: Any) -> Callable[[World], Any]:
    return _req(pb.InitNodeRequest(**kw))


INVALID, NOT_FOUND, EXISTS = Code.INVALID_ARGUMENT, Code.NOT_FOUND, Code.ALREADY_EXISTS
PRECONDITION, UNAVAILABLE = Code.FAILED_PRECONDITION, Code.UNAVAILABLE
NO_X = "no session named 'x'"

#: (RPC, request, status, text the message must contain, touches an agent).
BAD_REQUESTS: list[tuple[str, Callable[[World], Any], grpc.StatusCode, str, bool]] = [
    ("RegisterNode", _reg(name=""), INVALID, "name", False),
    ("RegisterNode", _reg(role=pb.NODE_ROLE_UNSPECIFIED), INVALID, "role", False),
    ("RegisterNode", _reg(role=pb.NodeRole.ValueType(7)), INVALID, "role", False),
    ("RegisterNode", _reg(name="a b"), INVALID, "name", False),
    ("RegisterNode", _reg(name="n" * 65), INVALID, "name", False),
    ("RegisterNode", _reg(address="nowhere"), INVALID, "address", False),
    ("RegisterNode", _reg(address="[::1]:port"), INVALID, "address", False),
    ("RegisterNode", _reg(address="[::1]:0"), INVALID, "address", False),
    ("RegisterNode", _reg(address="::1:50051"), INVALID, "brackets", False),
    ("RegisterNode", _reg(address="unix:"), INVALID, "address", False),
    ("RegisterNode", _reg(name="s"), EXISTS, "name", False),
    ("InitNode", _init(name=""), INVALID, "name", False),
    ("InitNode", _init(name="x"), NOT_FOUND, "no node named 'x'", False),
    ("InitNode", _init(name="s2", port=70000), INVALID, "port", False),
    ("InitNode", _init(name="s2", source="10.0.0.300"), INVALID, "source", False),
    ("InitNode", _init(name="s2", dataplane="nope"), INVALID, "dataplane", True),
    ("InitNode", _init(name="s2", interface="x" * 20), INVALID, "interface", True),
    ("InitNode", _init(name="s", port=0), PRECONDITION, "agent", True),
    ("InitNode", _init(name="gone"), UNAVAILABLE, "agent", True),
    ("CreateSession", _create(name=""), INVALID, "name", False),
    ("CreateSession", _create(name="p\n"), INVALID, "name", False),
    ("CreateSession", _create(sender=""), INVALID, "sender", False),
    ("CreateSession", _create(reflector_address=""), INVALID, "reflector_address", False),
    ("CreateSession", _create(reflector_address="10.0.0.300"), INVALID, "reflector_address", False),
    (
        "CreateSession",
        _create(reflector_address="10.0.0.1", segments=["fc00::1"]),
        INVALID,
        "segments",
        False,
    ),
    ("CreateSession", _create(segments=["fc00::1", "bad"]), INVALID, "segments", False),
    ("CreateSession", _create(return_segments=["bad"]), INVALID, "return_segments", False),
    ("CreateSession", _create(return_path_tlv=True), INVALID, "return_segments", False),
    ("CreateSession", _create(source_address="fc00::1::2"), INVALID, "source_address", False),
    ("CreateSession", _create(interval_ns=0), INVALID, "interval_ns", False),
    ("CreateSession", _create(reflector_port=70000), INVALID, "reflector_port", False),
    ("CreateSession", _create(reflector_port=0), INVALID, "reflector_port", False),
    ("CreateSession", _create(loss_timeout_ns=0), INVALID, "loss_timeout_ns", False),
    ("CreateSession", _create(count=2**32), INVALID, "count: 4294967296, at most", False),
    ("CreateSession", _create(collect=pb.CollectMode.ValueType(9)), INVALID, "collect", False),
    ("CreateSession", _create(sender="x"), NOT_FOUND, "no node named 'x'", False),
    ("CreateSession", _create(reflector="x"), NOT_FOUND, "no node named 'x'", False),
    ("CreateSession", _create(sender="r"), INVALID, "sender", False),
    ("CreateSession", _create(reflector="s"), INVALID, "reflector", False),
    ("CreateSession", _create(name="p"), EXISTS, "name", False),
    # The reflector accepts, the sender's agent refuses: the reflector's half is undone.
    ("CreateSession", _create(sender="s2"), PRECONDITION, "not initialised", True),
    ("CreateSession", _create(sender="gone"), UNAVAILABLE, "agent", True),
    ("StartSession", _req(pb.StartSessionRequest(name="")), INVALID, "name", False),
    ("StartSession", _req(pb.StartSessionRequest(name="x")), NOT_FOUND, NO_X, False),
    ("StopSession", _req(pb.StopSessionRequest(name="p")), PRECONDITION, "not running", False),
    ("StopSession", _req(pb.StopSessionRequest(name="x")), NOT_FOUND, NO_X, False),
    ("DestroySession", _req(pb.DestroySessionRequest(name="x")), NOT_FOUND, NO_X, False),
    ("GetResults", _req(pb.GetResultsRequest(name="x")), NOT_FOUND, NO_X, False),
    ("GetResults", _req(pb.GetResultsRequest(name="p", limit=100_001)), INVALID, "limit", False),
    ("GetPathStats", _req(pb.GetPathStatsRequest(name="")), INVALID, "name", False),
    ("GetPathStats", _req(pb.GetPathStatsRequest(name="x")), NOT_FOUND, NO_X, False),
]


@pytest.mark.parametrize(
    ("method", "build", "code", "text", "touches_agent"),
    BAD_REQUESTS,
    ids=[f"{m}-{i}" for i, (m, *_rest) in enumerate(BAD_REQUESTS)],
)
def test_bad_request_is_refused_and_changes_nothing(
    world: World,
    method: str,
    build: Callable[[World], Any],
    code: grpc.StatusCode,
    text: str,
    touches_agent: bool,
) -> None:
    before = _snapshot(world, exact=not touches_agent)
    with pytest.raises(grpc.RpcError) as err:
        getattr(world.stub, method)(build(world), timeout=15)
    assert err.value.code() is code, err.value.details()
    assert text in err.value.details()
    assert _snapshot(world, exact=not touches_agent) == before


def test_unreachable_agent_is_reported_unhealthy(world: World) -> None:
    gone = next(n for n in world.nb.client.nodes() if n.name == "gone")
    assert not gone.healthy
    assert gone.last_seen_ns is None
    assert "nobody.sock" in gone.last_error


# -------------------------------------------------------------- the controller process


def _start_controller(tmp: Path, db: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    address = f"unix:{tmp}/ctl.sock"
    proc = subprocess.Popen(
        [
            *CONTROLLER_CMD,
            *("serve", "--db", str(db), "--grpc", address, "--poll-interval", "0.05", *extra),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(f"controller: grpc={address} db={db} resumed="), line
    return proc, line


def _cli(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CONTROLLER_CMD, *args, "--controller", address],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _ok(address: str, *args: str) -> str:
    out = _cli(address, *args)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    return out.stdout


def test_cli_drives_a_controller_process(agents: Agents, tmp_path: Path) -> None:
    metrics_port = free_port("127.0.0.1", socket.SOCK_STREAM)
    proc, line = _start_controller(
        tmp_path, tmp_path / "c.db", "--metrics", f"127.0.0.1:{metrics_port}"
    )
    assert line.strip().endswith(f"resumed=0 metrics=127.0.0.1:{metrics_port}")
    address = f"unix:{tmp_path}/ctl.sock"
    try:
        assert "registered (sender" in _ok(
            address, "node", "add", "s", agents.sender_addr, "--role", "sender"
        )
        _ok(address, "node", "add", "r", agents.reflector_addr, "--role", "reflector")
        _ok(address, "node", "init", "s", "--source", "::1", "--port", "0")
        init = json.loads(
            _ok(address, "node", "init", "r", "--source", "::1", "--port", "0", "--json")
        )
        assert init["name"] == "r"
        assert init["port"] > 0
        nodes = json.loads(_ok(address, "node", "list", "--json"))
        assert [(n["name"], n["role"], n["healthy"], n["initialized"]) for n in nodes] == [
            ("r", "reflector", True, True),
            ("s", "sender", True, True),
        ]
        created = json.loads(
            _ok(
                address, "session", "create", "p", "--sender", "s", "--reflector", "r",
                "--reflector-address", "::1", "--port", str(init["port"]), "--interval", "0.01",
                "--count", "30", "--stateful", "--collect", "stream", "--json",
            )
        )  # fmt: skip
        assert (created["name"], created["ssid"], created["state"]) == ("p", 1, "created")
        assert (created["collect"], created["count"], created["interval_ns"]) == (
            "stream",
            30,
            10 * MS,
        )
        assert _ok(address, "session", "start", "p").strip() == "session p started"
        waited = _ok(address, "session", "wait", "p", "--timeout", "20")
        assert waited.strip() == "session p finished: sent 30, lost 0, stored 30"
        sessions = json.loads(_ok(address, "session", "list", "--json"))
        assert [(s["name"], s["state"], s["sent"], s["lost"], s["stored"]) for s in sessions] == [
            ("p", "finished", 30, 0, 30)
        ]
        results = json.loads(_ok(address, "results", "p", "--json"))
        assert [(r["epoch"], r["seq"]) for r in results["records"]] == [(0, i) for i in range(30)]
        assert results["more"] is False
        assert all(r["rtt_ns"] == r["direct_ns"] + r["return_ns"] for r in results["records"])
        stats = json.loads(_ok(address, "stats", "p", "--json"))
        assert (stats["received"], stats["lost"], stats["loss_ratio"]) == (30, 0, 0.0)
        assert (stats["forward_lost"], stats["backward_lost"]) == (0, 0)
        assert stats["unknown"] == 0
        assert [
            (e["epoch"], e["end_reason"], e["sent"], e["received"]) for e in stats["epochs"]
        ] == [(0, "finished", 30, 30)]
        assert stats["rtt"]["count"] == 30
        assert stats["rtt"]["min_ns"] == min(r["rtt_ns"] for r in results["records"])
        # The tables show the same session.
        table = _ok(address, "stats", "p")
        assert "rtt" in table
        assert "sent 30, received 30, lost 0 (forward 0, backward 0)" in table
        table = _ok(address, "results", "p", "--limit", "30")
        assert "29" in table
        first = utc_time(results["records"][0]["t1_ns"])
        assert first is not None
        assert first[:19] in table  # T1 as a UTC time, not raw ns
        assert str(results["records"][0]["t1_ns"]) not in table
        assert "finished" in _ok(address, "session", "list")
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            metrics = reply.read().decode()
        assert 'sixlab_stamp_delay_seconds_count{direction="rtt",path="p"} 30.0' in metrics
        assert 'sixlab_agent_up{node="s"} 1.0' in metrics
        # A refused request: one line on stderr, exit 1, no traceback.
        bad = _cli(address, "session", "start", "nope")
        assert bad.returncode == 1
        assert bad.stdout == ""
        assert bad.stderr == "sixlab controller: NOT_FOUND: session: no session named 'nope'\n"
        missing = _cli(address, "session", "wait", "nope", "--timeout", "0.1")
        assert (missing.returncode, missing.stdout) == (1, "")
        assert missing.stderr.startswith("sixlab controller: NOT_FOUND: ")
        dup = _cli(address, "node", "add", "s", "[::1]:1", "--role", "sender")
        assert dup.returncode == 1
        assert "ALREADY_EXISTS" in dup.stderr
        assert len(dup.stderr.splitlines()) == 1
        # An address alone means the agent's default port; the table shows it whole
        # (brackets are not markup), and the health column is asked now.
        added = _ok(address, "node", "add", "x", "::1", "--role", "sender")
        assert "[::1]:50051" in added
        listed = _ok(address, "node", "list")
        assert "[::1]:50051" in listed
        assert "asked now" in listed
        nodes = {n["name"]: n for n in json.loads(_ok(address, "node", "list", "--json"))}
        assert nodes["x"]["address"] == "[::1]:50051"
        assert nodes["x"]["healthy"] is False
        assert nodes["s"]["healthy"] is True
        # Stop the sender agent: a live check sees it at once (the controller's own
        # supervision records it within its period; --no-check shows that record).
        agents.sender.stop(0)
        live = {n["name"]: n for n in json.loads(_ok(address, "node", "list", "--json"))}
        assert live["s"]["healthy"] is False
        assert "last recorded" in _ok(address, "node", "list", "--no-check")
        assert _ok(address, "session", "destroy", "p").strip() == "session p destroyed"
        assert json.loads(_ok(address, "session", "list", "--json")) == []
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert proc.stdout is not None
        proc.stdout.close()
    assert not (tmp_path / "ctl.sock").exists()  # a clean stop removes its socket


def test_cli_cannot_reach_controller(tmp_path: Path) -> None:
    out = _cli(f"unix:{tmp_path}/none.sock", "node", "list")
    assert out.returncode == 1
    assert out.stderr == (
        f"sixlab controller: UNAVAILABLE: cannot reach the controller at "
        f"unix:{tmp_path}/none.sock: No such file or directory\n"
    )
    port = free_port("127.0.0.1", socket.SOCK_STREAM)
    out = _cli(f"127.0.0.1:{port}", "session", "list")
    assert out.returncode == 1
    assert out.stderr == (
        f"sixlab controller: UNAVAILABLE: cannot reach the controller at "
        f"127.0.0.1:{port}: Connection refused\n"
    )


def test_sigkill_mid_session_resumes_without_gap_or_duplicate(
    agents: Agents, tmp_path: Path
) -> None:
    db = tmp_path / "c.db"
    count = 200
    proc, _ = _start_controller(tmp_path, db)
    address = f"unix:{tmp_path}/ctl.sock"
    with ControllerClient(address, timeout=15) as c:
        port = _pair(c, agents)
        c.create_session(_spec(port, count=count, interval_ns=10 * MS, stateful=True))
        c.start_session("p")
        deadline = time.monotonic() + 10
        while c.session("p").stored < 40 and time.monotonic() < deadline:
            time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # no clean-up: mid-collection, maybe mid-transaction
    proc.wait(10)
    assert proc.stdout is not None
    proc.stdout.close()
    with sqlite3.connect(db) as con:
        stored_at_kill = con.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    assert 40 <= stored_at_kill < count  # killed mid-session
    time.sleep(0.3)  # results pile up on the sender agent meanwhile

    proc, line = _start_controller(tmp_path, db)
    try:
        assert line.strip().endswith("resumed=1")
        with ControllerClient(address, timeout=15) as c:
            info = c.wait_state("p", ("finished",), timeout=20)
            assert (info.sent, info.lost, info.stored, info.epoch) == (count, 0, count, 0)
            seqs = [r.seq for r in c.results("p", limit=count + 1).records]
            assert seqs == list(range(count))  # every seq exactly once, in order
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert proc.stdout is not None
        proc.stdout.close()
    store = SqliteStore(db)
    try:
        ids = store.record_ids(store.session("p").id)
        assert ids == [(0, i) for i in range(1, count + 1)]  # agent ids 1..N once each
    finally:
        store.close()


def test_a_live_controllers_unix_socket_is_refused_and_kept(
    northbound: Northbound, tmp_path: Path
) -> None:
    """A second controller started on the path a running one serves is refused, and the
    first keeps its socket and its clients (gRPC alone would unlink and take the path)."""
    other = Controller(SqliteStore(tmp_path / "other.db"), supervise_interval_s=None)
    try:
        with pytest.raises(OSError, match=r"controller\.sock: a server answers there"):
            serve_controller(northbound.address, other)
    finally:
        other.close()
        other.store.close()
    northbound.client.register_node("still-first", "unix:/nonexistent.sock", "sender")
    assert "still-first" in [n.name for n in northbound.client.nodes()]
