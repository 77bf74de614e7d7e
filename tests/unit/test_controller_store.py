"""The controller's SQLite store: validation, exactly-once results, restart safety."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sixlab.controller.store import (
    AlreadyExistsError,
    InUseError,
    NotFoundError,
    Store,
    StoreError,
)
from sixlab.stamp._events import StampResult
from sixlab.wire.timestamp import ErrorEstimate


def _r(seq: int) -> StampResult:
    ee = ErrorEstimate(scale=10, multiplier=3)
    return StampResult(0, seq, 100 + seq, 200 + seq, 250 + seq, 400 + seq, ee, ee, 62, seq)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "c.sqlite")
    s.add_node("s1", "127.0.0.1:5001", "sender")
    s.add_node("r1", "127.0.0.1:5002", "reflector")
    return s


def test_wal_mode(store: Store) -> None:
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.parametrize(
    ("name", "address", "role", "field"),
    [
        ("", "h:1", "sender", "name"),
        ("x", "nohostport", "sender", "address"),
        ("x", "h:1", "collector", "role"),
        ("s1", "h:1", "sender", "already exists"),
    ],
)
def test_bad_nodes_are_refused_and_change_nothing(
    store: Store, name: str, address: str, role: str, field: str
) -> None:
    before = store.nodes()
    with pytest.raises(StoreError, match=field):
        store.add_node(name, address, role)
    assert store.nodes() == before


def test_sessions_and_duplicate_names(store: Store) -> None:
    row = store.add_session("path-a", 1, sender="s1", reflector="r1", params={"k": [1]}, now_ns=5)
    assert (row.name, row.ssid, row.state, row.cursor, row.params) == (
        "path-a",
        1,
        "created",
        0,
        {"k": [1]},
    )
    with pytest.raises(AlreadyExistsError, match="already exists"):
        store.add_session("path-a", 2, sender="s1", reflector="r1", params={}, now_ns=6)
    with pytest.raises(NotFoundError, match="unknown node"):
        store.add_session("path-b", 2, sender="nobody", reflector="r1", params={}, now_ns=6)
    assert [s.name for s in store.sessions()] == ["path-a"]
    assert store.used_ssids("s1") == {1}
    with pytest.raises(InUseError, match="still carries"):
        store.remove_node("s1")


def test_results_are_stored_exactly_once(store: Store) -> None:
    sid = store.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=0).id
    assert store.store_results(sid, [(1, _r(0)), (2, _r(1))], counters=(3, 1, None, 0)) == 2
    # The agent sends the same records again (the controller died before acking them).
    assert store.store_results(sid, [(2, _r(1)), (3, _r(2))]) == 1
    assert store.record_ids(sid) == [(0, 1), (0, 2), (0, 3)]
    assert store.count_results(sid) == 3
    assert [r.seq for r in store.results(sid)] == [0, 1, 2]
    row = store.session("p")
    assert (row.cursor, row.sent, row.lost) == (3, 3, 1)
    stored = store.results(sid)[0]
    assert (stored.direct_ns, stored.return_ns, stored.rtt_ns) == (100, 150, 250)
    assert stored.sender_error == ErrorEstimate(scale=10, multiplier=3)


def test_new_epoch_restarts_ids_without_collisions(store: Store) -> None:
    sid = store.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=0).id
    store.store_results(sid, [(1, _r(0)), (2, _r(1))])
    assert store.new_epoch("p") == 1
    assert store.session("p").cursor == 0
    # The restarted agent numbers from 1 again: new rows, not duplicates.
    assert store.store_results(sid, [(1, _r(2)), (2, _r(3))], epoch=1) == 2
    assert store.record_ids(sid) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert store.count_results(sid) == 4
    assert [r.seq for r in store.results(sid)] == [0, 1, 2, 3]
    assert store.session("p").cursor == 2


def test_counters_add_up_across_epochs(store: Store) -> None:
    sid = store.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=0).id
    store.store_results(sid, [(1, _r(0))], counters=(10, 2, 1, 0))
    store.new_epoch("p")
    store.store_results(sid, [(1, _r(1))], counters=(4, 1, 0, 0), epoch=1)
    row = store.session("p")
    assert (row.sent, row.lost, row.forward_lost) == (14, 3, 1)
    # A late snapshot of the old epoch must not overwrite the totals.
    store.store_results(sid, [], counters=(11, 2, 1, 0), epoch=0)
    assert store.session("p").sent == 14


def test_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    a = Store(path)
    a.add_node("s1", "h:1", "sender")
    a.add_node("r1", "h:2", "reflector")
    sid = a.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=0).id
    a.store_results(sid, [(1, _r(0))])
    a.close()
    b = Store(path)
    assert b.session("p").cursor == 1
    assert len(b.results(sid)) == 1


def test_failed_transaction_leaves_no_trace(store: Store) -> None:
    sid = store.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=0).id
    bad = _r(0)
    object.__setattr__(bad, "t1_ns", None)  # NOT NULL violated
    with pytest.raises(sqlite3.IntegrityError):
        store.store_results(sid, [(1, _r(5)), (2, bad)])
    assert store.record_ids(sid) == []
    assert store.count_results(sid) == 0
    assert store.session("p").cursor == 0


def test_unclassified_loss_and_ssid_zero_are_stored(store: Store) -> None:
    row = store.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=1)
    assert (row.unclassified_lost, row.ssid_zero) == (None, 0)
    store.store_results(row.id, [(1, _r(0))], (10, 4, 1, 0), unclassified_lost=2, ssid_zero=7)
    row = store.session("p")
    assert (row.lost, row.forward_lost, row.unclassified_lost, row.ssid_zero) == (4, 1, 2, 7)


def test_a_database_made_before_the_new_columns_gets_them(tmp_path: Path) -> None:
    from sixlab.controller import store as store_module  # noqa: PLC0415

    old = store_module.SCHEMA.replace(
        ",\n    unclassified_lost INTEGER,          -- this epoch: lost after the last reply,"
        " not yet placed\n    ssid_zero   INTEGER NOT NULL DEFAULT 0  -- this epoch: replies"
        " with SSID 0 (RFC 8762-only)",
        "",
    )
    assert "ssid_zero" not in old
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(old)
        db.execute("INSERT INTO nodes (name, address, role) VALUES ('s', 'h:1', 'sender')")
        db.execute("INSERT INTO nodes (name, address, role) VALUES ('r', 'h:2', 'reflector')")
        db.execute(
            "INSERT INTO sessions (name, ssid, sender, reflector, params, state, created_ns)"
            " VALUES ('p', 1, 's', 'r', '{}', 'created', 5)"
        )
    s = Store(path)
    row = s.session("p")
    assert (row.name, row.unclassified_lost, row.ssid_zero) == ("p", None, 0)
    s.store_results(row.id, [], (3, 1, 0, 0), unclassified_lost=1, ssid_zero=2)
    assert (s.session("p").unclassified_lost, s.session("p").ssid_zero) == (1, 2)
    s.close()
