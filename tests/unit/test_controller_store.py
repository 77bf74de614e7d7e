"""Both stores (SQLite, PostgreSQL): validation, exactly-once results, restart safety."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sixlab.controller.store import (
    SCHEMA_VERSION,
    AlreadyExistsError,
    InUseError,
    NotFoundError,
    SqliteStore,
    StaleEpochError,
    Store,
    StoreError,
    open_store,
)
from sixlab.stamp._events import StampResult
from sixlab.wire.timestamp import ErrorEstimate


def _r(seq: int) -> StampResult:
    ee = ErrorEstimate(scale=10, multiplier=3)
    return StampResult(0, seq, 100 + seq, 200 + seq, 250 + seq, 400 + seq, ee, ee, 62, seq)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Every test here runs on both stores (PostgreSQL: the lab's real server)."""
    if request.param == "sqlite":
        s = open_store(tmp_path / "c.sqlite")
    else:
        s = open_store(request.getfixturevalue("pg_url"))
    s.add_node("s1", "127.0.0.1:5001", "sender")
    s.add_node("r1", "127.0.0.1:5002", "reflector")
    yield s
    s.close()


def test_wal_mode(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "c.sqlite")
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
    assert store.begin_epoch("p", 10, sender_agent="aa") == 0  # the first start
    store.store_results(sid, [(1, _r(0)), (2, _r(1))])
    assert store.begin_epoch("p", 20, sender_agent="bb", reason="sender-lost") == 1
    assert store.session("p").cursor == 0
    # The restarted agent numbers from 1 again: new rows, not duplicates.
    assert store.store_results(sid, [(1, _r(0)), (2, _r(1))], epoch=1) == 2
    assert store.record_ids(sid) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert store.count_results(sid) == 4
    assert [(e, r.seq) for e, r in store.records(sid)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert store.session("p").cursor == 2
    # (session, epoch, Seq) is unique too: a record of a known Seq is not stored twice.
    assert store.store_results(sid, [(3, _r(1))], epoch=1) == 0
    epochs = store.epochs(sid)
    assert [(e.epoch, e.started_ns, e.ended_ns, e.end_reason, e.sender_agent) for e in epochs] == [
        (0, 10, 20, "sender-lost", "aa"),
        (1, 20, None, None, "bb"),
    ]
    assert [e.received for e in epochs] == [2, 2]


def test_counters_add_up_across_epochs(store: Store) -> None:
    sid = store.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=0).id
    store.begin_epoch("p", 1)
    store.store_results(sid, [(1, _r(0))], counters=(10, 2, 1, 0), now_ns=5)
    store.stop_epoch("p", 6)
    store.end_epoch("p", 7, "finished")
    store.begin_epoch("p", 8)
    store.store_results(sid, [(1, _r(1))], counters=(4, 1, 0, 3), epoch=1, now_ns=9)
    row = store.session("p")
    assert (row.sent, row.lost, row.forward_lost, row.overflow) == (14, 3, 1, 3)
    first, second = store.epochs(sid)
    assert (first.sent, first.lost, first.seen_ns, first.stopped_ns, first.ended_ns) == (
        10, 2, 5, 6, 7
    )  # fmt: skip
    assert (first.end_reason, second.end_reason, second.stopped_ns) == ("finished", None, None)
    assert (second.sent, second.overflow, second.received) == (4, 3, 1)
    # A late batch of the old epoch must neither overwrite the totals nor land in the
    # new epoch: it is refused whole.
    with pytest.raises(StaleEpochError, match="epoch 0, but the session is in epoch 1"):
        store.store_results(sid, [(2, _r(9))], counters=(11, 2, 1, 0), epoch=0)
    assert store.session("p").sent == 14
    assert store.record_ids(sid) == [(0, 1), (1, 1)]


#: The schema of the first release, which had no version (user_version 0).
SCHEMA_V0 = """
CREATE TABLE IF NOT EXISTS nodes (
    name        TEXT PRIMARY KEY,
    address     TEXT NOT NULL,          -- gRPC address of the agent, host:port
    role        TEXT NOT NULL CHECK (role IN ('sender', 'reflector')),
    healthy     INTEGER NOT NULL DEFAULT 0,
    last_seen   INTEGER,                -- Unix ns of the last successful call
    last_error  TEXT,
    init        TEXT                    -- JSON Init parameters, replayed when it restarts
);
CREATE TABLE IF NOT EXISTS sessions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL UNIQUE,   -- the path's name, e.g. "path-a"
    ssid        INTEGER NOT NULL,
    sender      TEXT NOT NULL REFERENCES nodes(name),
    reflector   TEXT NOT NULL REFERENCES nodes(name),
    params      TEXT NOT NULL,          -- JSON: segments, return segments, interval, ...
    state       TEXT NOT NULL,          -- created, running, stopped, destroyed
    epoch       INTEGER NOT NULL DEFAULT 0,  -- times the session was (re)created on its sender
    cursor      INTEGER NOT NULL DEFAULT 0,  -- highest agent record id stored, this epoch
    sent        INTEGER NOT NULL DEFAULT 0,  -- totals: the agent's snapshot plus the base
    lost        INTEGER NOT NULL DEFAULT 0,
    forward_lost INTEGER,
    sent_base   INTEGER NOT NULL DEFAULT 0,  -- totals of the epochs before this one
    lost_base   INTEGER NOT NULL DEFAULT 0,
    forward_lost_base INTEGER NOT NULL DEFAULT 0,
    overflow    INTEGER NOT NULL DEFAULT 0,
    created_ns  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS results (
    session_id  INTEGER NOT NULL REFERENCES sessions(id),
    epoch       INTEGER NOT NULL,       -- an agent that restarted numbers from 1 again
    record_id   INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    t1_ns       INTEGER NOT NULL,
    t2_ns       INTEGER NOT NULL,
    t3_ns       INTEGER NOT NULL,
    t4_ns       INTEGER NOT NULL,
    sender_ee   INTEGER NOT NULL,
    reflector_ee INTEGER NOT NULL,
    ttl         INTEGER NOT NULL,
    reflector_seq INTEGER NOT NULL,
    PRIMARY KEY (session_id, epoch, record_id)
) WITHOUT ROWID;
"""


def test_migrates_a_version_0_file(tmp_path: Path) -> None:
    """A store written before the schema had a version opens with its rows kept, gains
    the new columns, and lets a destroyed session's name be used again."""
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA_V0)
        db.executescript(
            "INSERT INTO nodes(name, address, role, init) VALUES ('s1', 'h:1', 'sender', '{}');"
            "INSERT INTO nodes(name, address, role) VALUES ('r1', 'h:2', 'reflector');"
            "INSERT INTO sessions(name, ssid, sender, reflector, params, state, epoch, cursor,"
            " sent, lost, created_ns) VALUES ('p', 1, 's1', 'r1', '{}', 'destroyed', 1, 1, 3,"
            " 1, 7);"
            "INSERT INTO results VALUES (1, 1, 1, 0, 100, 200, 250, 400, 0, 0, 62, 0);"
        )
    store = SqliteStore(path)
    node = store.node("s1")
    assert (node.name, node.init, node.agent_epoch, node.restarts) == ("s1", {}, None, 0)
    assert store.observe_agent("s1", 0xFEDCBA9876543210, 5) is False  # first sight
    assert store.observe_agent("s1", 0xFEDCBA9876543210, 5) is False
    assert store.observe_agent("s1", 7, 9) is True  # a new run: a restart
    node = store.node("s1")
    assert (node.agent_epoch, node.agent_started_ns, node.restarts) == ("0000000000000007", 9, 1)
    old = store.session("p")
    assert (old.id, old.state, old.epoch, old.sent, old.lost, old.created_ns) == (
        1, "destroyed", 1, 3, 1, 7
    )  # fmt: skip
    assert store.record_ids(old.id) == [(1, 1)]
    (epoch,) = store.epochs(old.id)  # its history, as one epoch
    assert (epoch.epoch, epoch.sent, epoch.lost, epoch.received, epoch.end_reason) == (
        1, 3, 1, 1, "destroyed"
    )  # fmt: skip
    new = store.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=8)
    assert new.id == 2
    assert store.session("p").id == 2
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []


def test_two_processes_opening_an_old_file_at_once_migrate_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicas on one SQLite file may start together: each reads the file's schema
    version, then waits for the write lock that the other's migration holds. The
    second must find the file migrated, not migrate it again from the version it read
    before (a version-0 file: its sessions table rebuilt a second time from columns it
    no longer has)."""
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA_V0)
        db.execute("INSERT INTO nodes(name, address, role) VALUES ('s1', 'h:1', 'sender')")
    # Both openers reach their BEGIN IMMEDIATE while a third connection holds the lock.
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("BEGIN IMMEDIATE")
    waiting = threading.Semaphore(0)
    connect = sqlite3.connect

    def begins(sql: str) -> None:
        if sql == "BEGIN IMMEDIATE":
            waiting.release()

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = connect(*args, **kwargs)
        conn.set_trace_callback(begins)
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced)
    opened: list[SqliteStore | Exception] = []

    def open_it() -> None:
        try:
            opened.append(SqliteStore(path))
        except Exception as exc:  # noqa: BLE001 - the test shows which failed, and how
            opened.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in threads:
        assert waiting.acquire(timeout=30)
    holder.execute("ROLLBACK")
    for t in threads:
        t.join(30)
    monkeypatch.undo()
    holder.close()
    try:
        assert [type(s) for s in opened] == [SqliteStore, SqliteStore], opened
        assert opened[0].node("s1").name == "s1"  # type: ignore[union-attr]
    finally:
        for s in opened:
            if isinstance(s, SqliteStore):
                s.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


@contextmanager
def _transaction_held(store: SqliteStore, seconds: float = 6.0) -> Iterator[None]:
    """Inside: another connection (``store``, as another process's) holds a write
    transaction of the file, having added node s1, for ``seconds`` (longer than
    SQLite's default busy timeout); on leaving, it has committed."""
    holding = threading.Event()

    def hold() -> None:
        with store._transaction() as db:
            db.execute("INSERT INTO nodes(name, address, role) VALUES ('s1', 'h:1', 'sender')")
            holding.set()
            time.sleep(seconds)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert holding.wait(10)
        yield
    finally:
        t.join()


def test_a_write_waits_out_another_processs_transaction_longer_than_the_busy_timeout(
    tmp_path: Path,
) -> None:
    """Replicas on one SQLite file queue for its write lock: a heartbeat waiting on
    another replica's long transaction (a big batch on a loaded machine) is not failed
    by SQLite's busy timeout (5 s) with "database is locked"."""
    path = tmp_path / "c.sqlite"
    a, b = SqliteStore(path), SqliteStore(path)  # two connections, as two processes have
    try:
        with _transaction_held(a):
            state = b.lease_tick("B", {"sender": ["s1"]}, 5_000_000_000)
        assert state.owned == {"s1"}
        assert b.node("s1").name == "s1"  # it waited for a's commit
    finally:
        a.close()
        b.close()


def test_a_write_outside_a_transaction_waits_out_another_processs_long_transaction(
    tmp_path: Path,
) -> None:
    """A single statement that writes (here a node added; a node's health, an event)
    does not queue with the transactions: it waits for the file's lock through SQLite's
    busy timeout, which must outlast another replica's transaction of more than
    SQLite's default 5 s."""
    path = tmp_path / "c.sqlite"
    a, b = SqliteStore(path), SqliteStore(path)
    try:
        with _transaction_held(a):
            b.add_node("r1", "h:2", "reflector")
        assert [n.name for n in b.nodes()] == ["r1", "s1"]
    finally:
        a.close()
        b.close()


def test_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    a = SqliteStore(path)
    a.add_node("s1", "h:1", "sender")
    a.add_node("r1", "h:2", "reflector")
    sid = a.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=0).id
    a.store_results(sid, [(1, _r(0))])
    a.close()
    b = SqliteStore(path)
    assert b.session("p").cursor == 1
    assert len(b.results(sid)) == 1


def test_failed_transaction_leaves_no_trace(store: Store) -> None:
    sid = store.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=0).id
    bad = _r(0)
    object.__setattr__(bad, "t1_ns", None)  # NOT NULL violated
    with pytest.raises((sqlite3.IntegrityError, psycopg.errors.IntegrityError)):
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


def test_unplaced_losses_of_an_ended_epoch_stay_unplaced(store: Store) -> None:
    """A sender agent that restarted can no longer place its earlier run's losses after
    the last reply: they stay unclassified rather than turn into backward loss."""
    row = store.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=1)
    store.begin_epoch("p", 1)
    store.store_results(row.id, [], (10, 4, 1, 0), unclassified_lost=2, ssid_zero=1)
    store.begin_epoch("p", 2, reason="sender-lost")
    store.store_results(row.id, [], (5, 1, 0, 0), epoch=1, unclassified_lost=1, ssid_zero=1)
    row = store.session("p")
    assert (row.lost, row.forward_lost, row.unclassified_lost, row.ssid_zero) == (5, 1, 3, 2)


@pytest.mark.parametrize("had_columns", [False, True])
def test_a_database_made_before_the_new_columns_gets_them(
    tmp_path: Path, had_columns: bool
) -> None:
    """A version-0 file, with or without the loss columns (added to version 0 before the
    schema had a version), opens with them and keeps what they held (in its epoch's row:
    a session's totals are the sums over its epochs)."""
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA_V0)
        if had_columns:
            db.execute("ALTER TABLE sessions ADD COLUMN unclassified_lost INTEGER")
            db.execute("ALTER TABLE sessions ADD COLUMN ssid_zero INTEGER NOT NULL DEFAULT 0")
        db.execute("INSERT INTO nodes (name, address, role) VALUES ('s', 'h:1', 'sender')")
        db.execute("INSERT INTO nodes (name, address, role) VALUES ('r', 'h:2', 'reflector')")
        db.execute(
            "INSERT INTO sessions (name, ssid, sender, reflector, params, state, created_ns)"
            " VALUES ('p', 1, 's', 'r', '{}', 'running', 5)"
        )
        if had_columns:
            db.execute("UPDATE sessions SET unclassified_lost=3, ssid_zero=4")
    s = SqliteStore(path)
    row = s.session("p")
    assert (row.name, row.unclassified_lost, row.ssid_zero) == (
        ("p", 3, 4) if had_columns else ("p", None, 0)
    )
    s.store_results(row.id, [], (3, 1, 0, 0), unclassified_lost=1, ssid_zero=2)
    assert (s.session("p").unclassified_lost, s.session("p").ssid_zero) == (1, 2)
    s.close()


def test_a_seq_stored_under_another_record_id_still_moves_the_cursor(store: Store) -> None:
    """The cursor is the highest record id the store was given for the epoch, stored or
    skipped: a record refused as a repeated Seq is not asked for again."""
    sid = store.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=0).id
    assert store.store_results(sid, [(1, _r(0))]) == 1
    assert store.store_results(sid, [(2, _r(0))]) == 0
    row = store.session("p")
    assert (row.cursor, store.epochs(sid)[0].received) == (2, 1)
    assert store.record_ids(sid) == [(0, 1)]


#: Sessions of a version-6 file: (name, epoch, cursor, its current epoch row's top or
#: None for no row, each epoch's (sent, lost)). The cursors become the tops: equal (the
#: usual case), beyond the top, and an epoch without a row; the totals the file kept were
#: the sums over the epochs, and are read as those.
V6_SESSIONS = (
    ("a", 0, 5, 5, ((7, 2),)),
    ("b", 1, 9, 7, ((12, 1), (8, 2))),
    ("c", 0, 3, None, ()),
    ("d", 0, 0, None, ()),
)


def test_a_version_6_file_keeps_its_cursors_and_totals_in_the_epochs(tmp_path: Path) -> None:
    path = tmp_path / "v6.sqlite"
    SqliteStore(path).close()
    with sqlite3.connect(path) as db:  # version 6: the sessions' cursor and totals
        for column in ("cursor", "sent", "lost", "overflow", "ssid_zero"):
            db.execute(f"ALTER TABLE sessions ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")
        for column in ("forward_lost", "unclassified_lost"):
            db.execute(f"ALTER TABLE sessions ADD COLUMN {column} INTEGER")
        db.execute("PRAGMA user_version=6")
        db.execute("INSERT INTO nodes (name, address, role) VALUES ('s', 'h:1', 'sender')")
        db.execute("INSERT INTO nodes (name, address, role) VALUES ('r', 'h:2', 'reflector')")
        for i, (name, epoch, cursor, top, counts) in enumerate(V6_SESSIONS):
            db.execute(
                "INSERT INTO sessions (name, ssid, sender, reflector, params, state, epoch,"
                " cursor, sent, lost, created_ns) VALUES (?, ?, 's', 'r', '{}', 'running', ?,"
                " ?, ?, ?, 5)",
                (name, i + 1, epoch, cursor, sum(c[0] for c in counts), sum(c[1] for c in counts)),
            )
            for e, (sent, lost) in enumerate(counts):
                db.execute(
                    "INSERT INTO epochs (session_id, epoch, started_ns, received, top, sent,"
                    " lost) VALUES (?, ?, 6, ?, ?, ?, ?)",
                    (i + 1, e, top, top, sent, lost),
                )
    s = SqliteStore(path)
    try:
        got = [(r.name, r.cursor, r.sent, r.lost) for r in s.sessions()]
        assert got == [("a", 5, 7, 2), ("b", 9, 20, 3), ("c", 3, 0, 0), ("d", 0, 0, 0)]
        b = s.session("b")
        assert s.store_results(b.id, [(10, _r(10))], (30, 4, None, 0), epoch=1) == 1
        assert (s.session("b").cursor, s.session("b").sent, s.session("b").lost) == (10, 42, 5)
    finally:
        s.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 8
        columns = {r[1] for r in db.execute("PRAGMA table_info(sessions)")}
        assert not columns & {"cursor", "sent", "lost", "forward_lost", "overflow"}
