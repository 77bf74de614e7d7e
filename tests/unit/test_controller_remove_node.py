"""Removing a node on which sessions ran, in both stores (SQLite and a real PostgreSQL):
refused with the sessions named, or pruned with their history; never a raw constraint
error (which the northbound API would answer as UNKNOWN)."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest

from sixlab.controller.core import Controller
from sixlab.controller.events import EventKind, EventState, SessionEvent
from sixlab.controller.pgstore import SCHEMA as PG_SCHEMA
from sixlab.controller.store import (
    _SESSION_TABLES,
    SCHEMA,
    InUseError,
    NotFoundError,
    SqliteStore,
    Store,
)
from tests.unit.test_controller_store_backends import _r, store

__all__ = ["store"]  # the fixture of both stores, with nodes s1 and r1


def _measured(store: Store, name: str, ssid: int, reflector: str) -> int:
    """A session on s1 → reflector with an epoch, results, an event and rollups."""
    if reflector not in {n.name for n in store.nodes()}:
        store.add_node(reflector, "127.0.0.1:5003", "reflector")
    sid = store.add_session(name, ssid, sender="s1", reflector=reflector, params={}, now_ns=0).id
    store.begin_epoch(name, 1)
    assert store.store_results(sid, [(k + 1, _r(k)) for k in range(3)]) == 3
    store.add_event(sid, SessionEvent(name, EventKind.DELAY, EventState.RAISED, 1.0, 0.5, 0))
    store.roll_up()
    assert len(store.rollups(sid)) == 1
    return sid


def test_a_node_with_history_is_refused_naming_its_sessions(store: Store) -> None:
    sid = _measured(store, "old", 1, "r1")
    with pytest.raises(InUseError, match="still carries session 'old'"):
        store.remove_node("r1")
    store.set_state("old", "destroyed")
    store.add_session("old", 2, sender="s1", reflector="r1", params={}, now_ns=1)
    store.set_state("old", "destroyed")  # the same name, destroyed twice
    with pytest.raises(InUseError, match=r"'r1' is named by the stored history of destroyed "
                       r"sessions 'old', 'old'; prune"):  # fmt: skip
        store.remove_node("r1")
    assert "r1" in {n.name for n in store.nodes()}
    assert store.count_results(sid) == 3  # nothing removed


def test_prune_removes_the_node_with_its_sessions_history_only(store: Store) -> None:
    gone = _measured(store, "old", 1, "r1")
    kept = _measured(store, "other", 2, "r2")
    store.set_state("old", "destroyed")
    with pytest.raises(InUseError, match="still carries session 'other'"):
        store.remove_node("r2", prune=True)  # prune never touches a live session
    store.remove_node("r1", prune=True)
    assert {n.name for n in store.nodes()} == {"s1", "r2"}
    assert [s.name for s in store.sessions(include_destroyed=True)] == ["other"]
    assert store.count_results(gone) == 0
    assert store.epochs(gone) == []
    assert store.event_counts(gone) == {}
    assert store.rollups(gone) == []
    assert store.count_results(kept) == 3
    assert len(store.epochs(kept)) == 1
    assert store.event_counts(kept) == {("delay", "raised"): 1}
    assert len(store.rollups(kept)) == 1
    with pytest.raises(NotFoundError, match="no node named 'r1'"):
        store.remove_node("r1", prune=True)


@pytest.mark.parametrize("schema", [SCHEMA, PG_SCHEMA], ids=["sqlite", "postgresql"])
def test_prune_knows_every_table_of_a_session(schema: str) -> None:
    """Every table whose rows reference a session is one prune deletes from."""
    tables = re.findall(
        r"CREATE TABLE (?:IF NOT EXISTS )?(\w+) \(([^;]*?)\n\s*\)", schema, flags=re.S
    )
    referencing = {name for name, body in tables if "REFERENCES sessions(id)" in body}
    assert referencing == set(_SESSION_TABLES)


def test_a_node_removed_during_the_supervisors_round_is_skipped_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The supervisor reads the node list, then checks each node in turn; another replica
    may remove a node (``apply --prune``) in between. That node's check then finds no
    node: it is skipped, not logged as a failed check (an ERROR)."""
    sqlite = SqliteStore(tmp_path / "c.db")
    sqlite.add_node("s1", "127.0.0.1:1", "sender")
    listing = sqlite.nodes()  # what the round read before the removal
    sqlite.remove_node("s1")
    checked: list[str] = []

    class Late(Controller):
        def check_node(self, name: str) -> bool:
            checked.append(name)
            return super().check_node(name)

    caplog.set_level(logging.WARNING, logger="sixlab.controller.core")
    c = Late(sqlite, supervise_interval_s=0.005)
    c.store.nodes = lambda: listing  # type: ignore[method-assign]
    try:
        deadline = time.monotonic() + 10
        while len(checked) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        c.close()
    assert checked[:3] == ["s1"] * 3
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
