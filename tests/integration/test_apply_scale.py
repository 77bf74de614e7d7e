"""Creating and starting many sessions at once (``Controller.create_sessions`` /
``start_sessions``, what a northbound ``Apply`` runs): the work grows with the number of
sessions, not with its square, and the per-session outcomes stay what they were."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sixlab.controller import Controller, SessionSpec
from sixlab.controller.store import SqliteStore
from sixlab.southbound import AgentServer
from sixlab.southbound.simagent import serve_simulated


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
