"""The store's SR performance-measurement columns and threshold events (docs/srpm.md)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sixlab.controller.events import EventKind, EventState, SessionEvent
from sixlab.controller.store import SCHEMA, SCHEMA_VERSION, SqliteStore, Store
from sixlab.stamp import DataCounters, StampResult
from sixlab.wire.timestamp import ErrorEstimate

EE = ErrorEstimate(scale=10, multiplier=3)


def _r(seq: int, **kw: object) -> StampResult:
    return StampResult(0, seq, 100 + seq, 200 + seq, 250 + seq, 400 + seq, EE, EE, 62, seq, **kw)  # type: ignore[arg-type]


def _store(path: Path) -> Store:
    s = SqliteStore(path)
    s.add_node("s1", "127.0.0.1:5001", "sender")
    s.add_node("r1", "127.0.0.1:5002", "reflector")
    return s


def test_flow_label_loopback_and_data_counters_round_trip(tmp_path: Path) -> None:
    s = _store(tmp_path / "c.sqlite")
    row = s.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=1)
    records = [
        (1, _r(0, flow_label=5)),
        (2, _r(1, loopback=True)),
        (3, _r(2, data=DataCounters(10, 9, 3, None))),
        (4, _r(3, data=DataCounters(20, 19, 4, 7))),
    ]
    s.store_results(row.id, records)
    got = s.results(row.id)
    assert [(r.flow_label, r.loopback, r.data) for r in got] == [
        (5, False, None),
        (None, True, None),
        (None, False, DataCounters(10, 9, 3, None)),
        (None, False, DataCounters(20, 19, 4, 7)),
    ]
    s.close()


def test_events_are_kept_in_order_and_say_what_is_raised(tmp_path: Path) -> None:
    s = _store(tmp_path / "c.sqlite")
    p = s.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=1)
    q = s.add_session("q", 2, sender="s1", reflector="r1", params={}, now_ns=1)
    for sid, kind, state, at in (
        (p.id, EventKind.DELAY, EventState.RAISED, 10),
        (p.id, EventKind.LOSS, EventState.RAISED, 11),
        (q.id, EventKind.JITTER, EventState.RAISED, 12),
        (p.id, EventKind.DELAY, EventState.CLEARED, 13),
    ):
        s.add_event(sid, SessionEvent("x", kind, state, 1.5, 1.0, at))
    assert [(e.session, e.kind, e.state, e.at_ns) for e in s.events()] == [
        ("p", "delay", "raised", 10),
        ("p", "loss", "raised", 11),
        ("q", "jitter", "raised", 12),
        ("p", "delay", "cleared", 13),
    ]
    assert [e.at_ns for e in s.events("p", since_ns=11)] == [11, 13]
    assert [e.at_ns for e in s.events(limit=2)] == [12, 13]  # the newest, oldest first
    assert s.raised(p.id) == ["loss"]
    assert s.raised(q.id) == ["jitter"]
    assert s.event_counts(p.id) == {("delay", "raised"): 1, ("delay", "cleared"): 1,
                                    ("loss", "raised"): 1}  # fmt: skip
    s.close()


def test_a_version_1_file_gets_the_new_columns_and_keeps_its_results(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite"
    new_columns = ("flow_label", "loopback", "s_txc", "r_rxc", "r_txc", "s_rxc")
    # Version 1: the schema without the new result columns and without the events table
    # (nor its index).
    lines = [
        ln
        for ln in SCHEMA.splitlines()
        if ln.strip().split(" ")[0] not in new_columns and " ON events(" not in ln
    ]
    v1 = "\n".join(lines)
    v1 = (
        v1[: v1.index("CREATE TABLE IF NOT EXISTS events")]
        + v1[v1.index("CREATE TABLE IF NOT EXISTS epochs") :]
    )
    with sqlite3.connect(path) as db:
        db.executescript(v1)
        db.execute("PRAGMA user_version=1")
        db.execute("INSERT INTO nodes (name, address, role) VALUES ('s', 'h:1', 'sender')")
        db.execute("INSERT INTO nodes (name, address, role) VALUES ('r', 'h:2', 'reflector')")
        db.execute(
            "INSERT INTO sessions (name, ssid, sender, reflector, params, state, created_ns)"
            " VALUES ('p', 1, 's', 'r', '{}', 'running', 5)"
        )
        db.execute("INSERT INTO results VALUES (1, 0, 1, 0, 1, 2, 3, 4, 5, 5, 60, 0)")
    s = SqliteStore(path)
    row = s.session("p")
    (old,) = s.results(row.id)
    assert (old.t4_ns, old.flow_label, old.loopback, old.data) == (4, None, False, None)
    s.store_results(row.id, [(2, _r(1, flow_label=3))])
    assert [r.flow_label for r in s.results(row.id)] == [None, 3]
    s.add_event(row.id, SessionEvent("p", EventKind.LOSS, EventState.RAISED, 0.5, 0.1, 9))
    assert s.raised(row.id) == ["loss"]
    s.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 8
