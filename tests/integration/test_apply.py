"""``sixlab controller apply`` and ``export``: declarative configuration, end to end.

Two agents and the controller run in this process (gRPC on unix sockets, socket plane
on ::1); ``apply`` and ``export`` run as the CLI, in subprocesses, as an operator would.
The 500-path case goes through ``ControllerClient.apply``: one call for all of them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sixlab.cli._declarative import dump, loads
from sixlab.controller.client import ControllerClient
from sixlab.controller.core import Controller
from sixlab.controller.northbound import ControllerServer, serve_controller
from sixlab.controller.store import SqliteStore
from sixlab.southbound.agent import AgentServer, serve
from tests.integration._ports import free_port

pytestmark = pytest.mark.root

CLI = [sys.executable, "-m", "sixlab", "controller"]


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sender_addr = f"unix:{tmp}/s.sock"
        self.reflector_addr = f"unix:{tmp}/r.sock"
        self.agents: list[AgentServer] = [
            serve(self.sender_addr, "sender"),
            serve(self.reflector_addr, "reflector"),
        ]
        #: The reflector's STAMP port on ::1, ephemeral: a fixed one collides when two
        #: test runs share the machine. Configurations name it ``REFLECTOR_PORT``.
        self.reflector_port = free_port()
        self.address = f"unix:{tmp}/ctl.sock"
        self.controller = Controller(SqliteStore(tmp / "c.db"), poll_interval_s=0.05)
        self.server: ControllerServer = serve_controller(self.address, self.controller)
        self.client = ControllerClient(self.address, timeout=120)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args, "--controller", self.address],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def ok(self, *args: str) -> str:
        out = self.cli(*args)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def close(self) -> None:
        self.client.close()
        self.server.stop(0)
        self.controller.close()
        self.controller.store.close()
        for agent in self.agents:
            agent.stop(0)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.close()


def _config(w: World, sessions: str) -> str:
    text = textwrap.dedent(f"""\
        [nodes.s]
        address = "{w.sender_addr}"
        role = "sender"
        [nodes.s.init]
        source = "::1"
        port = 0

        [nodes.r]
        address = "{w.reflector_addr}"
        role = "reflector"
        [nodes.r.init]
        source = "::1"
        port = REFLECTOR_PORT
        """) + textwrap.dedent(sessions)
    return text.replace("REFLECTOR_PORT", str(w.reflector_port))


SESSIONS = """
    [sessions.a]
    sender = "s"
    reflector = "r"
    reflector-address = "::1"
    port = REFLECTOR_PORT
    interval = 0.01
    count = 20
    stateful = true
    auth-key = "00112233445566778899aabbccddeeff"
    collect = "stream"

    [sessions.b]
    sender = "s"
    reflector = "r"
    reflector-address = "::1"
    port = REFLECTOR_PORT
    state = "stopped"
"""


def _sessions(w: World) -> dict[str, tuple[str, int, int]]:
    return {s.name: (s.state, s.ssid, s.interval_ns) for s in w.client.sessions()}


def test_apply_is_declarative_and_idempotent(world: World) -> None:
    w = world
    path = w.tmp / "lab.toml"
    path.write_text(_config(w, SESSIONS))
    planned = w.ok("apply", str(path), "--dry-run")
    assert "would make 7 changes" in planned
    assert w.client.nodes() == []  # a dry run changes nothing
    out = w.ok("apply", str(path))
    assert out.splitlines() == [
        "+ node s: add (sender at " + w.sender_addr + ")",
        "+ node r: add (reflector at " + w.reflector_addr + ")",
        "~ node s: init (new node)",
        "~ node r: init (new node)",
        "+ session a: create (new session)",
        "+ session b: create (new session)",
        "> session a: start (wanted running)",
        "made 7 changes",
    ]
    w.client.wait_state("a", ("finished",), 30)
    assert w.client.stats("a").received == 20
    assert w.ok("apply", str(path)).strip() == "no changes: the controller matches the file"

    # What export writes applies as a no-op, also with the key it cannot show.
    exported = w.ok("export")
    assert "auth-key" not in exported
    assert "key-sha256 = " in exported
    (w.tmp / "exported.toml").write_text(exported)
    before = _sessions(w)
    again = w.ok("apply", str(w.tmp / "exported.toml"), "--json")
    assert json.loads(again) == {"dry_run": False, "changes": [], "error": None}
    assert _sessions(w) == before
    assert loads(exported) == w.client.export()

    # Change one field of a, drop b, add c: exactly those changes.
    changed = SESSIONS.replace("interval = 0.01", "interval = 0.02").split("[sessions.b]")[0]
    changed += '[sessions.c]\nsender = "s"\nreflector = "r"\nreflector-address = "::1"\n'
    changed += "port = REFLECTOR_PORT\ncount = 5\ninterval = 0.01\n"
    path.write_text(_config(w, changed))
    lines = w.ok("apply", str(path)).splitlines()
    assert lines == [
        "- session a: destroy (interval_ns)",
        "- session b: destroy (not in the list)",
        "~ session a: recreate (interval_ns)",
        "+ session c: create (new session)",
        "> session a: start (wanted running)",
        "> session c: start (wanted running)",
        "made 6 changes",
    ]
    states = _sessions(w)
    assert states["a"][2] == 20_000_000
    assert "b" not in states
    # The first a stays listed, destroyed, with its results.
    listed = [(s.state, s.stored) for s in w.client.sessions(include_destroyed=True)]
    assert ("destroyed", 20) in listed
    w.client.wait_state("c", ("finished",), 30)
    assert w.ok("apply", str(path)).strip() == "no changes: the controller matches the file"


def test_apply_replaces_a_node_whose_agent_moved(world: World) -> None:
    w = world
    path = w.tmp / "lab.toml"
    path.write_text(_config(w, SESSIONS))
    w.ok("apply", str(path))
    third = serve(f"unix:{w.tmp}/s2.sock", "sender")
    w.agents.append(third)
    path.write_text(_config(w, SESSIONS).replace(w.sender_addr, f"unix:{w.tmp}/s2.sock"))
    lines = w.ok("apply", str(path)).splitlines()
    assert lines[:3] == [
        "- session a: destroy (node s changes)",
        "- session b: destroy (node s changes)",
        f"~ node s: replace (address: sender at unix:{w.tmp}/s2.sock)",
    ]
    assert "~ node s: init (node replaced)" in lines
    assert {n.name: n.address for n in w.client.nodes()}["s"] == f"unix:{w.tmp}/s2.sock"
    assert third.servicer is not None
    assert w.client.wait_state("a", ("finished",), 30).sent == 20


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace('role = "reflector"', 'role = "router"'), "nodes.r.role: 'router'"),
        (lambda t: t.replace("interval = 0.01", "interval = 1e300"), "at most 86400 s"),
        (lambda t: t.replace("interval = 0.01", "interval = 0.0000000001"), "at least 1e-06"),
        (lambda t: t.replace("count = 20", "count = 18446744073709551616"), "not in 0.."),
        (lambda t: t.replace('sender = "s"', 'sender = "x"', 1), "node 'x' is not in the list"),
        (lambda t: t.replace("stateful", "statefull"), "sessions.a.statefull: unknown key"),
        (lambda t: t + "\n[oops", "not TOML"),
        (lambda t: t.replace('state = "stopped"', 'state = "paused"'), "sessions.b.state"),
    ],
)
def test_a_bad_file_changes_nothing(world: World, edit: object, message: str) -> None:
    w = world
    path = w.tmp / "lab.toml"
    path.write_text(edit(_config(w, SESSIONS)))  # type: ignore[operator]
    out = w.cli("apply", str(path))
    assert out.returncode == 1
    assert out.stdout == ""
    assert message in out.stderr
    assert len(out.stderr.splitlines()) == 1
    assert w.client.nodes() == []


def test_five_hundred_paths_in_one_call(world: World) -> None:
    w = world
    sessions = "".join(
        f'\n[sessions.p{i}]\nsender = "s"\nreflector = "r"\nreflector-address = "::1"\n'
        f'port = REFLECTOR_PORT\nsegments = ["fc00::{i:x}", "::1"]\nstate = "stopped"\n'
        for i in range(500)
    )
    config = loads(_config(w, sessions))
    reply = w.client.apply(config)
    assert reply.error == ""
    assert len(reply.changes) == 2 + 2 + 500
    assert len({s.ssid for s in w.client.sessions()}) == 500
    assert list(w.client.apply(config).changes) == []
    exported = w.client.export()
    assert list(w.client.apply(loads(dump(exported))).changes) == []
    # Destroy them all with one call too.
    empty = loads(_config(w, ""))
    assert len(w.client.apply(empty).changes) == 500
    assert w.client.sessions() == []


def test_unused_nodes_go_and_destroyed_sessions_come_back(world: World) -> None:
    w = world
    path = w.tmp / "lab.toml"
    spare = f'\n[nodes.spare]\naddress = "{w.reflector_addr}"\nrole = "reflector"\n'
    path.write_text(_config(w, spare + SESSIONS))
    w.ok("apply", str(path))
    assert "spare" in {n.name for n in w.client.nodes()}
    path.write_text(_config(w, SESSIONS))
    assert w.ok("apply", str(path)).splitlines() == [
        "- node spare: remove (not in the list)",
        "made 1 change",
    ]
    # A session destroyed by hand is created again by the next apply.
    w.client.destroy_session("b")
    assert w.ok("apply", str(path)).splitlines() == [
        "+ session b: create (new session)",
        "made 1 change",
    ]
    states = [s.state for s in w.client.sessions(include_destroyed=True) if s.name == "b"]
    assert sorted(states) == ["created", "destroyed"]


def test_a_node_that_measured_goes_only_with_prune(world: World) -> None:
    """A node left out of the list, on which a session measured: apply refuses it
    (FAILED_PRECONDITION naming the session, nothing changed) rather than keep it
    quietly; --prune removes it with the session's stored results."""
    w = world
    path = w.tmp / "lab.toml"
    spare = f'\n[nodes.spare]\naddress = "{w.reflector_addr}"\nrole = "reflector"\n'
    measured = (
        '\n[sessions.m]\nsender = "s"\nreflector = "spare"\nreflector-address = "::1"\n'
        "port = REFLECTOR_PORT\ncount = 5\ninterval = 0.01\n"
    )
    path.write_text(_config(w, spare + SESSIONS + measured))
    w.ok("apply", str(path))
    w.client.wait_state("m", ("finished",), 30)
    assert w.client.stats("m").received == 5
    m_id = w.controller.store.session("m").id
    assert w.controller.store.count_results(m_id) == 5

    path.write_text(_config(w, SESSIONS))
    for extra in ((), ("--dry-run",)):
        out = w.cli("apply", str(path), *extra)
        assert out.returncode != 0
        assert "FAILED_PRECONDITION" in out.stderr, out.stderr
        assert "'spare' is not in the list, but the stored results of session 'm'" in out.stderr
        assert "--prune" in out.stderr
    assert "m" in _sessions(w)  # refused before any change
    assert "spare" in {n.name for n in w.client.nodes()}

    assert w.ok("apply", str(path), "--prune").splitlines() == [
        "- session m: destroy (not in the list)",
        "- node spare: remove (not in the list; with the history of session 'm')",
        "made 2 changes",
    ]
    assert "spare" not in {n.name for n in w.client.nodes()}
    assert "m" not in {s.name for s in w.client.sessions(include_destroyed=True)}
    assert w.controller.store.count_results(m_id) == 0
    assert w.ok("apply", str(path)).strip() == "no changes: the controller matches the file"
