"""Creating and starting many sessions at once (``Controller.create_sessions`` /
``start_sessions``, what a northbound ``Apply`` runs): the work grows with the number of
sessions, not with its square, and the per-session outcomes stay what they were."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from sixlab.controller import Controller, SessionSpec
from sixlab.controller.store import SqliteStore
from sixlab.southbound import AgentClient, AgentServer
from sixlab.southbound._generated import stamp_pb2_grpc as pb_grpc
from sixlab.southbound.simagent import SimulatedAgentServicer, serve_simulated


@pytest.fixture
def agents() -> Iterator[dict[str, AgentServer]]:
    """Two simulated senders (``s2`` never initialised) and a reflector."""
    servers = {
        "s": serve_simulated("127.0.0.1:0", "sender"),
        "s2": serve_simulated("127.0.0.1:0", "sender"),
        "r": serve_simulated("127.0.0.1:0", "reflector"),
    }
    try:
        yield servers
    finally:
        for server in servers.values():
            server.stop(None)


@pytest.fixture
def ctl(agents: dict[str, AgentServer], tmp_path: Path) -> Iterator[Controller]:
    c = Controller(SqliteStore(tmp_path / "c.db"), supervise_interval_s=None)
    try:
        for name, server in agents.items():
            c.register_node(
                name, f"127.0.0.1:{server.port}", "reflector" if name == "r" else "sender"
            )
        c.init_node("s")
        c.init_node("r")
        yield c
    finally:
        c.close()
        c.store.close()


def _spec(name: str, sender: str = "s") -> SessionSpec:
    return SessionSpec(name, sender, "r", "2001:db8::2", interval_ns=1_000_000_000)


def test_creating_n_sessions_compares_no_spec_with_another(
    ctl: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, which reflector halves to undo was found by looking each session up in
    the list of those created: 300 sessions made 44,850 spec comparisons."""
    compared = 0
    eq = SessionSpec.__eq__

    def counting(self: SessionSpec, other: Any) -> Any:
        nonlocal compared
        compared += 1
        return eq(self, other)

    monkeypatch.setattr(SessionSpec, "__eq__", counting)
    rows, errors = ctl.create_sessions([_spec(f"p{i}") for i in range(300)])
    assert not errors
    assert len(rows) == 300
    assert compared < 300


def test_a_sender_refusing_part_of_a_batch_undoes_those_reflector_halves_only(
    ctl: Controller, agents: dict[str, AgentServer]
) -> None:
    specs = [_spec(f"p{i}", "s2" if i % 3 == 0 else "s") for i in range(30)]
    rows, errors = ctl.create_sessions(specs)
    refused = {s.name for s in specs if s.sender == "s2"}
    assert set(errors) == refused
    assert all("not initialised" in str(e) for e in errors.values())
    assert {r.name for r in rows} == {s.name for s in specs} - refused
    # The reflector carries the halves of the sessions created, and no other.
    info = ctl.client("r").info()
    assert sorted(info.ssids) == sorted(r.ssid for r in rows)
    assert sorted(ctl.client("s").info().ssids) == sorted(r.ssid for r in rows)
    assert not ctl.start_sessions([r.name for r in rows])
    assert {ctl.store.session(r.name).state for r in rows} == {"running"}


class _Counted:
    """An agent stub that counts the calls made through it, by method."""

    def __init__(self, stub: Any, calls: Counter[str]) -> None:
        self._stub = stub
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)
        calls = self._calls

        class _Method:
            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                calls[name] += 1
                return method(*args, **kwargs)

            def future(self, *args: Any, **kwargs: Any) -> Any:
                calls[name] += 1
                return method.future(*args, **kwargs)

        return _Method()


def test_sessions_are_created_and_started_in_batch_calls_not_one_call_each(
    agents: dict[str, AgentServer], tmp_path: Path
) -> None:
    """Before, 300 sessions took 600 CreateStampSession and 600 StartStampSession calls
    (one per session and agent); now one batch call per agent and step."""
    calls: Counter[str] = Counter()

    def factory(address: str) -> AgentClient:
        client = AgentClient(address)
        client._stub = _Counted(client._stub, calls)
        return client

    c = Controller(SqliteStore(tmp_path / "c.db"), client_factory=factory,
                   supervise_interval_s=None)  # fmt: skip
    try:
        for name in ("s", "r"):
            c.register_node(
                name, f"127.0.0.1:{agents[name].port}", "reflector" if name == "r" else "sender"
            )
            c.init_node(name)
        calls.clear()
        specs = [_spec(f"p{i}") for i in range(300)]
        _, errors = c.create_sessions(specs)
        assert not errors
        assert not c.start_sessions([s.name for s in specs])
        assert {c.store.session(s.name).state for s in specs} == {"running"}
        assert len(c.client("r").info().ssids) == 300
    finally:
        c.close()
        c.store.close()
    assert calls["CreateStampSession"] == calls["StartStampSession"] == 0
    assert calls["CreateStampSessions"] == calls["StartStampSessions"] == 2


class _WithoutBatches(SimulatedAgentServicer):
    """An agent of a version without the batch calls: they are UNIMPLEMENTED."""

    CreateStampSessions = pb_grpc.StampAgentServicer.CreateStampSessions
    StartStampSessions = pb_grpc.StampAgentServicer.StartStampSessions


def test_an_agent_without_batch_calls_gets_one_call_per_session(
    agents: dict[str, AgentServer], tmp_path: Path
) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_StampAgentServicer_to_server(_WithoutBatches("sender"), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    c = Controller(SqliteStore(tmp_path / "c.db"), supervise_interval_s=None)
    try:
        c.register_node("old", f"127.0.0.1:{port}", "sender")
        c.register_node("r", f"127.0.0.1:{agents['r'].port}", "reflector")
        c.init_node("old")
        c.init_node("r")
        specs = [_spec(f"p{i}", "old") for i in range(50)]
        rows, errors = c.create_sessions([*specs, specs[0]])
        assert list(errors) == ["p0"]  # named twice: refused as before
        assert len(rows) == 50
        assert not c.start_sessions([s.name for s in specs])
        assert {c.store.session(s.name).state for s in specs} == {"running"}
        assert sorted(c.client("old").info().ssids) == sorted(r.ssid for r in rows)
    finally:
        c.close()
        c.store.close()
        server.stop(None)
