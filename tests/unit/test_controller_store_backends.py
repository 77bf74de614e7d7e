"""Both stores, SQLite and PostgreSQL (a real server): bulk insert, rollups, retention,
migrations, bytes per result."""

from __future__ import annotations

import contextlib
import logging
import random
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

import sixlab.controller.core as core
import sixlab.controller.rollup as rollup_module
import sixlab.controller.store as store_module
from sixlab.controller.events import EventKind, EventState, SessionEvent
from sixlab.controller.housekeeping import Housekeeper, Retention
from sixlab.controller.pgstore import _STEPS, PostgresStore, _PgDb
from sixlab.controller.pgstore import SCHEMA as PG_SCHEMA
from sixlab.controller.rollup import MINUTE_NS, Fold, merged_stats
from sixlab.controller.store import (
    SCHEMA_VERSION,
    AlreadyExistsError,
    Counters,
    Fence,
    FencedError,
    ResultBatch,
    SessionRow,
    SqliteStore,
    StaleEpochError,
    Store,
    StoreError,
    StoreUnavailableError,
    open_store,
)
from sixlab.southbound import stamp_pb2 as pb
from sixlab.stamp import DataCounters, StampResult
from sixlab.stamp.stats import path_stats
from sixlab.wire.timestamp import ErrorEstimate
from tests.unit.test_controller_rollup_rows import fill_and_roll_up, random_reads

EE = ErrorEstimate(scale=10, multiplier=3)
T0 = 1_700_000_000 * 10**9 // MINUTE_NS * MINUTE_NS


def _r(seq: int, t1: int | None = None, direct: int = 100, back: int = 150) -> StampResult:
    t1 = T0 + seq * 10**9 if t1 is None else t1
    return StampResult(0, seq, t1, t1 + direct, t1 + direct + 50, t1 + direct + 50 + back,
                       EE, EE, 62, seq)  # fmt: skip


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        s: Store = open_store(tmp_path / "c.sqlite")
        assert isinstance(s, SqliteStore)
    else:
        s = open_store(request.getfixturevalue("pg_url"))
        assert isinstance(s, PostgresStore)
    s.add_node("s1", "127.0.0.1:5001", "sender")
    s.add_node("r1", "127.0.0.1:5002", "reflector")
    yield s
    s.close()


def _sessions(store: Store, n: int) -> list[int]:
    ids = []
    for i in range(n):
        ids.append(
            store.add_session(f"p{i}", i + 1, sender="s1", reflector="r1", params={}, now_ns=0).id
        )
        store.begin_epoch(f"p{i}", 1)
    return ids


def test_store_many_stores_each_session_once_and_skips_stale_batches(store: Store) -> None:
    ids = _sessions(store, 30)
    batches = [ResultBatch(sid, 0, [(k + 1, _r(k)) for k in range(20)]) for sid in ids]
    assert store.store_many(batches, now_ns=5) == [20] * 30
    # Again, with one more record each: only that one is new (the COPY of PostgreSQL
    # meets the stored rows and falls back to skipping them).
    again = [ResultBatch(sid, 0, [(k + 1, _r(k)) for k in range(21)]) for sid in ids]
    assert store.store_many(again, now_ns=6) == [1] * 30
    stale = ResultBatch(ids[0], 7, [(99, _r(99))])
    assert store.store_many([stale, ResultBatch(ids[1], 0, [(22, _r(21))])]) == [None, 1]
    with pytest.raises(StaleEpochError, match="epoch 7"):
        store.store_results(ids[0], [(99, _r(99))], epoch=7)
    for sid in ids:
        assert store.record_ids(sid) == [(0, k) for k in range(1, 22 + (sid == ids[1]))]
    assert store.session("p0").cursor == 21
    assert [e.received for e in store.epochs(ids[1])] == [22]


def test_a_repeated_seq_under_a_new_record_id_is_skipped(store: Store) -> None:
    (sid,) = _sessions(store, 1)
    assert store.store_results(sid, [(1, _r(0)), (2, _r(1))]) == 2
    assert store.store_results(sid, [(3, _r(1)), (4, _r(2))]) == 1
    assert [r.seq for r in store.results(sid)] == [0, 1, 2]


def test_a_repeated_record_id_with_another_seq_is_skipped(store: Store) -> None:
    (sid,) = _sessions(store, 1)
    assert store.store_results(sid, [(1, _r(0)), (2, _r(1))]) == 2
    # Only the primary key (session, epoch, record id) is repeated here.
    assert store.store_results(sid, [(2, _r(7)), (3, _r(8))]) == 1
    assert [
        (rid, r.seq) for (_, rid), r in zip(store.record_ids(sid), store.results(sid), strict=True)
    ] == [(1, 0), (2, 1), (3, 8)]


def test_counters_and_totals_in_bulk(store: Store) -> None:
    a, b = _sessions(store, 2)
    store.store_many(
        [ResultBatch(a, 0, [(1, _r(0))], counters=None),
         ResultBatch(b, 0, [], counters=Counters(10, 2, 1, 0, 3, 40, 20))],
        now_ns=9,
    )  # fmt: skip
    row = store.session("p1")
    assert (row.sent, row.lost, row.forward_lost, row.overflow) == (10, 2, 1, 0)
    (e,) = store.epochs(b)
    assert (e.seen_ns, e.skipped, e.late_ns_total, e.late_ns_max) == (9, 3, 40, 20)


def test_counters_of_many_sessions_and_epochs_sum_into_the_totals(store: Store) -> None:
    a, b = _sessions(store, 2)
    store.store_many([ResultBatch(a, 0, [], Counters(5, 1, None, 2, 0, 0, 0, None, 1))], 3)
    assert store.begin_epoch("p0", 4) == 1
    store.store_many(
        [ResultBatch(a, 1, [(1, _r(0))], Counters(7, 2, None, 0, 1, 10, 10, 4, 0)),
         ResultBatch(b, 0, [(1, _r(0))], Counters(9, 3, 2, 1, 0, 0, 0, 1, 6)),
         ResultBatch(b, 0, [(2, _r(1))], Counters(11, 3, 2, 1, 0, 0, 0, 1, 6))],
        now_ns=5,
    )  # fmt: skip
    a_row, b_row = store.session("p0"), store.session("p1")
    assert (a_row.sent, a_row.lost, a_row.forward_lost, a_row.overflow) == (12, 3, None, 2)
    assert (a_row.unclassified_lost, a_row.ssid_zero) == (4, 1)
    assert (b_row.sent, b_row.lost, b_row.forward_lost, b_row.overflow) == (11, 3, 2, 1)
    assert (b_row.unclassified_lost, b_row.ssid_zero, b_row.cursor) == (1, 6, 2)
    e0, e1 = store.epochs(a)
    assert (e0.sent, e0.seen_ns, e1.sent, e1.skipped, e1.received, e1.seen_ns) == (
        5, 3, 7, 1, 1, 5,
    )  # fmt: skip


def test_rollups_fold_each_record_once_and_answer_stats(store: Store) -> None:
    (sid,) = _sessions(store, 1)
    # 3 minutes at 1 pps with Seqs 10 and 100 lost; delays vary.
    recs = [(i + 1, _r(s, direct=1000 + 37 * (s % 11), back=2000 + s)) for i, s in
            enumerate(s for s in range(180) if s not in (10, 100))]  # fmt: skip
    store.store_results(sid, recs[:100])
    assert store.roll_up() == 100
    assert store.roll_up() == 0
    assert len(store.unrolled(sid)) == 0
    store.store_results(sid, recs[100:])
    assert len(store.unrolled(sid)) == len(recs) - 100
    assert store.roll_up(limit=30) == 30  # in pieces: the same result
    while store.roll_up(limit=30):
        pass
    minutes = store.rollups(sid)
    assert [m.minute_ns for _, m in minutes] == [T0, T0 + MINUTE_NS, T0 + 2 * MINUTE_NS]
    assert [m.count for _, m in minutes] == [59, 59, 60]
    assert [m.lost for _, m in minutes] == [1, 1, 0]
    got = merged_stats([m for _, m in minutes])
    exact = path_stats([r for _, r in recs])
    assert got.received == exact.received == 178
    assert got.lost == 2
    assert got.direct is not None
    assert exact.direct is not None
    assert (got.direct.min_ns, got.direct.max_ns, got.direct.mean_ns) == (
        exact.direct.min_ns, exact.direct.max_ns, exact.direct.mean_ns
    )  # fmt: skip
    assert abs(got.direct.p99_ns - exact.direct.p99_ns) <= 0.01 * exact.direct.p99_ns
    # Only the minutes that overlap the range.
    assert len(store.rollups(sid, since_ns=T0 + MINUTE_NS + 1)) == 2
    assert len(store.rollups(sid, until_ns=T0 + MINUTE_NS)) == 1


def test_records_are_rolled_up_with_the_store_free_for_collection(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a pass rolls up what it read, collection stores more records (another
    thread, the same session): it is not held up, and what it stored is rolled up by the
    next pass, once."""
    (sid,) = _sessions(store, 1)
    store.store_results(sid, [(s + 1, _r(s)) for s in range(100)])
    stored_meanwhile: list[bool] = []
    threads: list[threading.Thread] = []
    reference = rollup_module.fold_columns

    def rolling(*args: object, **kwargs: object) -> object:
        if not stored_meanwhile:
            later = threading.Thread(
                target=store.store_results, args=(sid, [(s + 1, _r(s)) for s in range(100, 105)])
            )
            later.start()
            threads.append(later)
            later.join(5)
            stored_meanwhile.append(not later.is_alive())
        return reference(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store_module, "fold_columns", rolling)
    assert store.roll_up() == 100
    threads[0].join()
    assert stored_meanwhile == [True]
    assert store.roll_up() == 5
    assert store.roll_up() == 0
    assert sum(m.count for _, m in store.rollups(sid)) == 105


def test_roll_up_stores_what_the_reference_merge_stores(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random records of 40 sessions, several epochs each, stored in four reads and
    rolled up in passes of 97 records (each merging into minutes stored before): the
    rollups table holds the same rows, column by column, as a SQLite store that merges
    the reference way."""
    reads = random_reads(random.Random(11), 40, 50, 10**7, 4)
    calls: list[tuple[int, bool]] = []
    rows = Fold.rows

    def counted(fold: Fold, stored: Any) -> Any:
        out = rows(fold, stored)
        calls.append((len(stored), out is None))
        return out

    with monkeypatch.context() as m:
        m.setattr(Fold, "rows", counted)
        got = fill_and_roll_up(store, reads, 97)
    # The arrays' path each time, merging into stored rows most times.
    assert not any(fallback for _, fallback in calls)
    assert sum(n > 0 for n, _ in calls) > len(calls) // 2
    with monkeypatch.context() as m:
        m.setattr(store_module, "fold_columns", lambda *_a: None)
        reference = open_store(tmp_path / "reference.sqlite")
        reference.add_node("s1", "127.0.0.1:5001", "sender")
        reference.add_node("r1", "127.0.0.1:5002", "reflector")
        try:
            expected = fill_and_roll_up(reference, reads, 97)
        finally:
            reference.close()
    assert len(got) > 100
    assert got == expected


def test_a_pass_reads_the_records_while_collection_holds_a_transaction(store: Store) -> None:
    """The roll-up's read waits for no write transaction (SQLite: it reads on a
    connection of its own, in WAL mode beside the writer; PostgreSQL: another pooled
    connection)."""
    (sid,) = _sessions(store, 1)
    store.store_results(sid, [(s + 1, _r(s)) for s in range(50)])
    holding, release = threading.Event(), threading.Event()

    def collect() -> None:
        with store._transaction():
            holding.set()
            release.wait(10)

    writer = threading.Thread(target=collect)
    writer.start()
    try:
        assert holding.wait(10)
        read: list[int] = []
        reader = threading.Thread(target=lambda: read.append(len(store._read_unrolled(100))))
        reader.start()
        reader.join(5)
        assert read == [50], "the read waited for the write transaction"
    finally:
        release.set()
        writer.join()
    assert store.roll_up() == 50


def test_expire_deletes_old_raw_records_only_once_rolled_up(store: Store) -> None:
    (sid,) = _sessions(store, 1)
    recs = [(s + 1, _r(s)) for s in range(180)]  # 3 minutes
    store.store_results(sid, recs)
    now = T0 + 3 * MINUTE_NS
    # Nothing rolled up: nothing may go.
    assert store.expire(now, raw_ns=0) == (0, 0)
    assert store.count_results(sid) == 180
    store.roll_up()
    # Keep one minute of raw records: the two first minutes go.
    assert store.expire(now, raw_ns=MINUTE_NS) == (120, 0)
    assert store.record_ids(sid)[0] == (0, 121)
    assert store.expire(now, raw_ns=MINUTE_NS) == (0, 0)
    assert sum(m.count for _, m in store.rollups(sid)) == 180  # rollups stay
    assert store.expire(now + 10 * MINUTE_NS, raw_ns=MINUTE_NS, rollup_ns=5 * MINUTE_NS) == (
        60, 3
    )  # fmt: skip
    assert store.rollups(sid) == []


def test_storage_reports_bytes_per_result(store: Store) -> None:
    (sid,) = _sessions(store, 1)
    store.store_results(sid, [(s + 1, _r(s)) for s in range(2000)])
    st = store.storage()
    assert st.results == 2000
    assert st.bytes_per_result is not None
    # A result is 12 integers: tens of bytes with its two indexes, not kilobytes.
    assert 20 < st.bytes_per_result < 400


def test_bad_postgresql_urls_are_refused() -> None:
    with pytest.raises(StoreUnavailableError, match="cannot connect"):
        open_store("postgresql:///nothing?host=/nonexistent&connect_timeout=2")
    with pytest.raises(StoreError, match="not a PostgreSQL URL"):
        open_store("postgresql://[broken")


def _at_version(db: psycopg.Connection[Any], version: int) -> None:
    """Make the empty database ``db`` one of schema ``version``: its steps up to it."""
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    db.execute("INSERT INTO schema_version VALUES (%s)", (version,))
    for step in range(1, version + 1):
        for statement in _STEPS[step]:
            db.execute(statement)


def test_postgresql_migrates_a_version_1_database(lab_postgres: object, pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as db:
        _at_version(db, 1)
        db.execute("INSERT INTO nodes(name, address, role) VALUES ('s1', 'h:1', 'sender')")
        db.execute("INSERT INTO nodes(name, address, role) VALUES ('r1', 'h:2', 'reflector')")
        db.execute(
            "INSERT INTO sessions(name, ssid, sender, reflector, params, state, created_ns)"
            " VALUES ('p', 1, 's1', 'r1', '{}', 'running', 1)"
        )
        db.execute("INSERT INTO epochs(session_id, epoch, started_ns, received) VALUES (1,0,1,1)")
        db.execute(
            "INSERT INTO results(session_id, epoch, record_id, seq, t1_ns, t2_ns, t3_ns, t4_ns,"
            " sender_ee, reflector_ee, ttl, reflector_seq) VALUES (1,0,7,0,1,2,3,4,0,0,62,0)"
        )
    store = open_store(pg_url)
    try:
        assert store.record_ids(1) == [(0, 7)]
        assert store.roll_up() == 1  # the new epoch columns were filled (top = 7)
        with psycopg.connect(pg_url) as db:
            row = db.execute("SELECT version FROM schema_version").fetchone()
            assert row == (SCHEMA_VERSION,)
    finally:
        store.close()
    # A second open (another replica) finds it current and changes nothing.
    open_store(pg_url).close()


def test_postgresql_refuses_a_newer_schema(pg_url: str) -> None:
    open_store(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("UPDATE schema_version SET version = version + 1")
    with pytest.raises(StoreError, match="newer than this sixlab"):
        open_store(pg_url)


def test_postgresql_a_server_that_may_lose_commits_is_warned_of(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The lab's server runs without fsync and synchronous commits (for speed): a crash
    of it could lose results already acknowledged to their agents. A durable server is
    not warned of (test_controller_db_outage's log)."""
    with caplog.at_level(logging.WARNING, "sixlab.controller.pgstore"):
        open_store(pg_url).close()
    said = [r.getMessage() for r in caplog.records if "synchronous_commit=off" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "fsync=off" in said[0]


def test_postgresql_schema_text_creates_what_the_steps_create(pg_url: str) -> None:
    assert "CREATE TABLE rollups" in PG_SCHEMA
    store = open_store(pg_url)
    store.close()


def test_postgresql_reconnects_after_the_server_drops_the_connection(pg_url: str) -> None:
    """A pooled connection whose server ended it (here ``pg_terminate_backend``; a
    restart alike) is found gone when taken from the pool, and replaced: the call
    succeeds, where it failed once per pooled connection before."""
    store = open_store(pg_url)
    assert isinstance(store, PostgresStore)
    try:
        store.add_node("s1", "h:1", "sender")
        with psycopg.connect(pg_url, autocommit=True) as admin:
            others = (
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid != pg_backend_pid()"
            )
            ended = {r[0] for r in admin.execute(others).fetchall()}
            assert ended
            admin.execute(f"SELECT pg_terminate_backend(pid) FROM ({others}) AS o")

            def gone() -> bool:
                live = {r[0] for r in admin.execute(others).fetchall()}
                return not live & ended

            deadline = time.monotonic() + 10
            while not gone():
                assert time.monotonic() < deadline, "the backends did not end"
                time.sleep(0.02)
        assert [n.name for n in store.nodes()] == ["s1"]
    finally:
        store.close()


GROUPS = {"sender": ["s1", "s2"], "reflector": ["r1"], "housekeeping": ["housekeeping"]}
TTL = 2 * 10**9


def test_leases_are_shared_fairly_and_the_surplus_is_handed_over(store: Store) -> None:
    a = store.lease_tick("A", GROUPS, TTL)
    assert a.owned == {"s1", "s2", "r1", "housekeeping"}  # alone: everything
    assert a.surplus == frozenset()
    b = store.lease_tick("B", GROUPS, TTL)
    assert (b.live, b.owned) == (2, frozenset())  # nothing free
    a = store.lease_tick("A", GROUPS, TTL)
    assert a.surplus == {"s2"}  # one sender of two is A's share
    store.release("A", a.surplus)
    b = store.lease_tick("B", GROUPS, TTL)
    assert b.owned == {"s2"}
    owners = store.lease_owners()
    assert owners == {"s1": "A", "s2": "B", "r1": "A", "housekeeping": "A"}
    assert [r.id for r in store.replicas()] == ["A", "B"]


def test_the_lease_clock_is_unix_time_in_ns(store: Store) -> None:
    """Leases run on the database's clock: on SQLite the host's, read by each replica
    process alike (whole milliseconds), on PostgreSQL the server's (here the same host)."""
    before = time.time_ns()
    now = store.lease_tick("A", GROUPS, TTL).now_ns
    after = time.time_ns()
    assert before - 2_000_000 <= now <= after + 1_000_000


#: A lease that is to expire while a test sleeps ``SHORT_S`` more than it, and to hold
#: until then: a loaded machine may pause the test for hundreds of milliseconds
#: between two calls. Only the replica that is to lose its leases takes it.
SHORT = 10**9
SHORT_S = 1.2


def test_an_expired_replicas_leases_are_claimed_by_the_others(store: Store) -> None:
    store.lease_tick("A", GROUPS, SHORT)
    b = store.lease_tick("B", GROUPS, TTL)
    assert b.owned == frozenset()
    time.sleep(SHORT_S)  # A stops renewing: its leases expire (database clock)
    assert store.lease_owners()["s1"] is None
    b = store.lease_tick("B", GROUPS, TTL)
    assert (b.live, b.owned) == (1, frozenset({"s1", "s2", "r1", "housekeeping"}))
    # A comes back: it holds nothing and gets its share handed over by B.
    a = store.lease_tick("A", GROUPS, TTL)
    assert a.owned == frozenset()
    b = store.lease_tick("B", GROUPS, TTL)
    assert b.surplus == {"s2"}


def test_a_replica_that_leaves_frees_its_leases_at_once(store: Store) -> None:
    store.lease_tick("A", GROUPS, TTL)
    store.leave("A")
    assert set(store.lease_owners().values()) == {None}
    assert store.replicas() == []
    assert store.lease_tick("B", GROUPS, TTL).owned == {"s1", "s2", "r1", "housekeeping"}


def test_a_stale_fence_stores_nothing_once_another_replica_took_the_lease(
    store: Store,
) -> None:
    (sid,) = _sessions(store, 1)
    a = store.lease_tick("A", GROUPS, SHORT)
    fence_a = Fence("s1", "A", a.generations["s1"])
    assert store.store_many([ResultBatch(sid, 0, [(1, _r(0))], None)], 1, fence=fence_a) == [1]
    time.sleep(SHORT_S)  # A is paused past its lease; B takes s1 over
    b = store.lease_tick("B", GROUPS, TTL)
    assert "s1" in b.owned
    assert b.generations["s1"] == a.generations["s1"] + 1
    before = store.session("p0")
    counters = Counters(99, 7, None, 0)
    with pytest.raises(FencedError, match="held by B"):
        store.store_many([ResultBatch(sid, 0, [(2, _r(1))], counters)], 2, fence=fence_a)
    after = store.session("p0")
    assert store.count_results(sid) == 1  # nothing of A's went in: rows, cursor, counters
    assert (after.cursor, after.sent, after.lost) == (before.cursor, before.sent, before.lost)
    # B's token holds; A, back, holds nothing and gets a fence that never holds.
    fence_b = Fence("s1", "B", b.generations["s1"])
    assert store.store_many([ResultBatch(sid, 0, [(2, _r(1))], counters)], 3, fence=fence_b) == [1]
    assert "s1" not in store.lease_tick("A", GROUPS, TTL).generations
    with pytest.raises(FencedError):
        store.store_many([ResultBatch(sid, 0, [(3, _r(2))], None)], 4, fence=Fence("s1", "A", -1))
    assert store.count_results(sid) == 2


def test_sr_pm_columns_and_events_on_both_stores(store: Store) -> None:
    (sid,) = _sessions(store, 1)
    data = DataCounters(1, 2, 3, 4)
    r = replace(_r(0), flow_label=0xABCDE, loopback=True, data=data)
    store.store_results(sid, [(1, r), (2, _r(1))])
    first, second = store.results(sid)
    assert (first.flow_label, first.loopback, first.data) == (0xABCDE, True, data)
    assert (second.flow_label, second.loopback, second.data) == (None, False, None)
    store.add_event(sid, SessionEvent("p0", EventKind.LOSS, EventState.RAISED, 0.5, 0.1, 9))
    assert store.raised(sid) == ["loss"]
    assert [(e.session, e.value) for e in store.events("p0")] == [("p0", 0.5)]


def test_a_session_being_destroyed_keeps_that_state_until_the_destroy_is_finished(
    store: Store,
) -> None:
    """``destroying`` is left only by ``finish_destroy`` (docs/architecture.md, "Session
    lifecycle across replicas"): a collector's or a start's state change meanwhile is a
    no-op, no epoch begins, and results of the epoch are still stored until it ends."""
    sid, other = _sessions(store, 2)
    assert [r.name for r in store.mark_destroying(["p0", "nope"])] == ["p0"]
    for state in ("running", "finished", "starting"):
        store.set_state("p0", state)
        store.set_states(["p0"], state)
    assert not store.claim_state("p0", "finished", "starting")
    assert store.session("p0").state == "destroying"
    with pytest.raises(StoreError, match="being destroyed"):
        store.begin_epoch("p0", 2)
    assert store.destroying("s1") == ["p0"]
    assert store.store_many([ResultBatch(sid, 0, [(1, _r(0))], None)], 3) == [1]
    assert store.finish_destroy(sid, 4)
    assert not store.finish_destroy(sid, 5)
    assert store.states([sid, other]) == {sid: "destroyed", other: "created"}
    (epoch,) = store.epochs(sid)
    assert (epoch.ended_ns, epoch.end_reason, epoch.received) == (4, "destroyed", 1)
    assert store.store_many([ResultBatch(sid, 0, [(2, _r(1))], None)], 6) == [None]
    assert store.destroying("s1") == []
    # A start claims the session once: a second claim (another replica's) fails.
    store.set_state("p1", "finished")
    assert store.claim_state("p1", "finished", "starting")
    assert not store.claim_state("p1", "finished", "starting")


def test_a_start_claim_names_its_controller_and_can_be_taken_over(store: Store) -> None:
    """A ``starting`` row records who claimed it; only that claimer moves it on, and a
    claim of a dead one is taken over once (docs/architecture.md, "Session lifecycle
    across replicas")."""
    _sessions(store, 1)
    store.set_state("p0", "finished")
    assert store.claim_state("p0", "finished", "starting", claimer="B")
    assert store.starting("s1") == [("p0", "B")]
    assert not store.take_over_start("p0", "C", "A")  # not C's claim
    assert store.take_over_start("p0", "B", "A")
    assert not store.take_over_start("p0", "B", "A")  # taken over once
    assert not store.claim_state("p0", "starting", "running", holder="B")
    assert store.take_over_start("p0", "A", None)  # released: whoever finds it next
    assert store.starting("s1") == [("p0", None)]
    assert store.take_over_start("p0", None, "A")
    assert store.claim_state("p0", "starting", "running", holder="A")
    assert store.starting("s1") == []


def test_a_pending_restart_is_kept_with_the_row_until_claimed_or_cancelled(
    store: Store,
) -> None:
    """``mark_restart`` drains a running session to restart it; the restart survives the
    drain (``finished``), a stop cancels it, and only a pending one is claimed."""
    _sessions(store, 2)
    store.set_states(["p0", "p1"], "running")
    assert store.mark_restart("p0", "reflector-lost")
    assert not store.mark_restart("p0", "reflector-lost")  # not running any more
    assert store.session("p0").state == "stopping"
    assert store.restart_reason("p0") == "reflector-lost"
    store.set_state("p0", "finished")
    assert store.restarts() == [("p0", "s1", "finished", "reflector-lost")]
    assert store.cancel_restart("p0")
    assert not store.cancel_restart("p0")
    assert not store.claim_state("p0", "finished", "starting", restart=True)
    assert store.mark_restart("p1", "reflector-lost")
    store.set_state("p1", "finished")
    assert store.claim_state("p1", "finished", "starting", claimer="A", restart=True)
    assert store.restart_reason("p1") is None
    assert store.restarts() == []


def test_a_batch_of_epochs_leaves_out_a_session_being_destroyed(store: Store) -> None:
    ids = _sessions(store, 3)
    before = [len(store.epochs(i)) for i in ids]
    store.mark_destroying(["p1"])
    items = [("p0", None), ("p1", None), ("p2", None), ("nope", None)]
    assert store.begin_epochs(items, 1) == {"p0", "p2"}
    after = [len(store.epochs(i)) for i in ids]
    assert [n - m for n, m in zip(after, before, strict=True)] == [1, 0, 1]


def test_a_claimed_batch_of_epochs_begins_only_sessions_still_created(store: Store) -> None:
    """``begin_epochs`` with a claimer claims each session ``created`` → ``starting`` as
    its epoch begins: one started meanwhile (running, or starting under another claim)
    keeps its epoch; ``claim_states`` then moves only the claimer's own."""
    ids = _sessions(store, 3)
    store.set_states(["p1"], "running")
    assert store.claim_state("p2", "created", "starting", claimer="B")
    items = [("p0", None), ("p1", None), ("p2", None)]
    assert store.begin_epochs(items, 2, claimer="A") == {"p0"}
    assert [store.session(n).state for n in ("p0", "p1", "p2")] == [
        "starting", "running", "starting",
    ]  # fmt: skip
    assert [e.epoch for e in store.epochs(ids[0])] == [0, 1]
    for i in ids[1:]:
        assert [(e.epoch, e.ended_ns) for e in store.epochs(i)] == [(0, None)]
    assert store.starting("s1") == [("p0", "A"), ("p2", "B")]
    assert store.claim_states(["p0", "p1", "p2"], "starting", "running", holder="A") == {"p0"}
    assert store.claim_states(["p2"], "starting", "created", holder="B") == {"p2"}
    assert [store.session(n).state for n in ("p0", "p1", "p2")] == [
        "running", "running", "created",
    ]  # fmt: skip
    assert store.claim_states([], "starting", "running", holder="A") == set()
    assert store.stopping("s1") == []
    assert store.claim_state("p1", "running", "stopping")
    assert store.stopping("s1") == [("p1", 0)]


def test_a_batch_of_a_session_pruned_meanwhile_is_stale_and_the_others_are_stored(
    store: Store,
) -> None:
    """Results read before ``remove_node(prune=True)`` deleted their session's row are
    stored after it: that batch stores nothing (None), the others of the transaction go
    in."""
    (keep,) = _sessions(store, 1)
    store.add_node("r2", "127.0.0.1:5003", "reflector")
    gone = store.add_session("g", 9, sender="s1", reflector="r2", params={}, now_ns=0).id
    store.begin_epoch("g", 1)
    store.mark_destroying(["g"])
    store.finish_destroy(gone, 2)
    store.remove_node("r2", prune=True)
    batches = [ResultBatch(keep, 0, [(1, _r(0))], None), ResultBatch(gone, 0, [(1, _r(0))], None)]
    assert store.store_many(batches, 3) == [1, None]
    assert store.count_results(keep) == 1
    assert store.count_results(gone) == 0


def test_postgresql_prune_waits_for_a_transaction_storing_its_sessions_results(
    pg_url: str,
) -> None:
    """A transaction storing results holds its sessions' rows (``FOR UPDATE``) from its
    start. ``remove_node(prune=True)`` meanwhile must wait for it and delete what it
    stored with the rest, not delete first and then fail on the results it committed
    (a foreign key violation: ``apply --prune`` failing)."""
    store = open_store(pg_url)
    try:
        store.add_node("s1", "127.0.0.1:5001", "sender")
        store.add_node("r2", "127.0.0.1:5003", "reflector")
        sid = store.add_session("g", 9, sender="s1", reflector="r2", params={}, now_ns=0).id
        store.begin_epoch("g", 1)
        store.mark_destroying(["g"])
        store.finish_destroy(sid, 2)
        outcome: list[BaseException | None] = []
        with psycopg.connect(pg_url) as storing:  # a storing transaction, as _store opens
            storing.execute("SELECT id FROM sessions WHERE id = %s FOR UPDATE", (sid,))

            def prune() -> None:
                try:
                    store.remove_node("r2", prune=True)
                except BaseException as exc:  # noqa: BLE001 - reported below
                    outcome.append(exc)
                else:
                    outcome.append(None)

            t = threading.Thread(target=prune)
            t.start()
            with psycopg.connect(pg_url, autocommit=True) as watch:
                deadline = time.monotonic() + 30
                while not watch.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database()"
                ).fetchone():
                    assert time.monotonic() < deadline, "the prune never waited for a lock"
                    time.sleep(0.02)
            storing.execute(
                "INSERT INTO results (session_id, epoch, record_id, seq, t1_ns, t2_ns, t3_ns,"
                " t4_ns, sender_ee, reflector_ee, ttl, reflector_seq)"
                " VALUES (%s, 0, 1, 0, 1, 2, 3, 4, 0, 0, 64, 0)",
                (sid,),
            )
            storing.commit()
            t.join(30)
        assert outcome == [None]
        assert "r2" not in {n.name for n in store.nodes()}
        assert store.count_results(sid) == 0
    finally:
        store.close()


def test_sqlite_state_updates_by_name_use_the_live_name_index(tmp_path: Path) -> None:
    """``set_state(s)`` and ``claim_state`` find their row through ``sessions_live_name``
    (one row read, not a scan of the table per name: a stop of 10,000 sessions must not
    be quadratic). Each statement they run is traced and its plan asked of SQLite."""
    store = SqliteStore(tmp_path / "c.sqlite")
    store.add_node("s1", "127.0.0.1:5001", "sender")
    store.add_node("r1", "127.0.0.1:5002", "reflector")
    _sessions(store, 3)
    conn = store._conn  # the connection the statements run on, traced
    updates: list[str] = []
    conn.set_trace_callback(lambda sql: updates.append(sql) if sql.startswith("UPDATE") else None)
    try:
        store.set_states(["p0", "p1"], "stopping")
        store.set_state("p2", "stopping")
        assert store.claim_state("p0", "stopping", "finished")
        assert store.claim_state("p0", "finished", "starting", claimer="A")
        assert store.claim_state("p0", "starting", "running", holder="A")
    finally:
        conn.set_trace_callback(None)
    assert len(updates) == 6
    for sql in updates:
        plan = " ".join(str(row[3]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql))
        assert "USING INDEX sessions_live_name" in plan, (sql, plan)
    assert [r.state for r in store.sessions()] == ["running", "stopping", "stopping"]
    store.close()


class _Counting:
    """A store connection that counts the statements sent through it (``executemany``
    is one: PostgreSQL pipelines it, SQLite runs it without a Python call per row)."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.statements = 0
        self.sql: list[str] = []

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self.statements += 1
        self.sql.append(args[0])
        return self.db.execute(*args, **kwargs)

    def executemany(self, *args: Any) -> Any:
        self.statements += 1
        self.sql.append(args[0])
        return self.db.executemany(*args)


def _count_statements(store: Store, monkeypatch: pytest.MonkeyPatch) -> _Counting:
    """Count the statements of the store's write transactions from now on."""
    counted = _Counting(None)
    transaction = store._transaction

    @contextlib.contextmanager
    def counting() -> Iterator[Any]:
        with transaction() as db:
            counted.db = db
            yield counted

    monkeypatch.setattr(store, "_transaction", counting)
    return counted


def test_a_batch_of_sessions_is_added_and_begun_in_a_few_statements(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``add_sessions`` and a claimed ``begin_epochs`` of 1,200 sessions: before, one
    INSERT per session and three statements per epoch begun (3,600). On SQLite each
    call's notice is a transaction of two more (its row, and the oldest pruned)."""
    notice = 2 if isinstance(store, SqliteStore) else 0
    counted = _count_statements(store, monkeypatch)
    items = [(f"p{i}", i + 1, "s1", "r1", {"k": i}) for i in range(1200)]
    rows = store.add_sessions(items, now_ns=5)
    assert [(r.name, r.ssid, r.params, r.state) for r in rows] == [
        (f"p{i}", i + 1, {"k": i}, "created") for i in range(1200)
    ]
    assert counted.statements <= 3 + notice
    counted.statements = 0
    begun = store.begin_epochs([(f"p{i}", "a1") for i in range(1200)], 7, claimer="A")
    assert begun == {f"p{i}" for i in range(1200)}
    assert counted.statements <= 10 + notice
    assert [(e.epoch, e.started_ns, e.ended_ns) for e in store.epochs(rows[5].id)] == [(0, 7, None)]
    assert store.session("p5").state == "starting"


def test_a_claimed_batch_ends_the_epoch_a_failed_start_left_and_begins_the_next(
    store: Store,
) -> None:
    """A session whose start failed went back to ``created`` with its epoch begun: the
    next batch ends that epoch and begins the next one, as ``begin_epoch`` does; the
    others of the batch begin their first."""
    rows = store.add_sessions([(f"p{i}", i + 1, "s1", "r1", {}) for i in range(3)], now_ns=0)
    assert store.begin_epochs([("p0", None)], 1, claimer="A") == {"p0"}
    assert store.claim_states(["p0"], "starting", "created", holder="A") == {"p0"}
    begun = store.begin_epochs([(f"p{i}", None) for i in range(3)], 2, claimer="A")
    assert begun == {"p0", "p1", "p2"}
    assert [(e.epoch, e.started_ns, e.ended_ns) for e in store.epochs(rows[0].id)] == [
        (0, 1, 2), (1, 2, None),
    ]  # fmt: skip
    for row in rows[1:]:
        assert [(e.epoch, e.ended_ns) for e in store.epochs(row.id)] == [(0, None)]
    assert store.session("p0").epoch == 1
    assert store.session("p0").cursor == 0


def test_a_batch_with_a_taken_name_adds_none_and_names_it(store: Store) -> None:
    store.add_sessions([("p1", 1, "s1", "r1", {})], now_ns=0)
    items: list[tuple[str, int, str, str, dict[str, Any]]] = [
        (f"p{i}", i + 10, "s1", "r1", {}) for i in range(3)
    ]
    with pytest.raises(AlreadyExistsError, match="'p1'"):
        store.add_sessions(items, now_ns=0)
    assert [r.name for r in store.sessions()] == ["p1"]


def _as_postgresql(sql: str) -> str:
    """A statement SQLite was given, as the PostgreSQL store words it: the session
    rows' query is each store's own (the same columns, the same rows)."""
    if sql.startswith(SqliteStore._sessions_sql):
        rest = sql[len(SqliteStore._sessions_sql) :].replace(SqliteStore._sessions_group, "")
        return PostgresStore._sessions_sql + rest
    return sql


def _plans(store: SqliteStore, run: Callable[[], object]) -> list[tuple[str, str]]:
    """(statement, EXPLAIN QUERY PLAN) of each statement ``run`` has the store execute
    (traced with their parameters, then asked of SQLite), transaction control left out."""
    conn = store._conn
    traced: list[str] = []
    conn.set_trace_callback(traced.append)
    try:
        run()
    finally:
        conn.set_trace_callback(None)
    out = []
    for sql in traced:
        if sql.split(None, 1)[0].upper() in ("SELECT", "UPDATE", "DELETE", "INSERT"):
            plan = " | ".join(str(row[3]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql))
            out.append((sql, plan))
    return out


def test_sqlite_start_handover_and_restart_by_name_use_the_live_name_index(
    tmp_path: Path,
) -> None:
    """``take_over_start``, ``mark_restart``, ``cancel_restart`` and ``begin_epoch`` of a
    claimer find their row through ``sessions_live_name``, like ``set_state``: one row
    read, not a scan of the sessions table per session."""
    store = SqliteStore(tmp_path / "c.sqlite")
    store.add_node("s1", "127.0.0.1:5001", "sender")
    store.add_node("r1", "127.0.0.1:5002", "reflector")
    _sessions(store, 3)
    store.set_states(["p0", "p1", "p2"], "running")

    def run() -> None:
        assert store.mark_restart("p0", "sender-lost")
        assert store.cancel_restart("p0")
        assert store.claim_state("p0", "stopping", "finished")
        assert store.claim_state("p0", "finished", "starting", claimer="A")
        assert store.take_over_start("p0", "A", "B")
        assert store.begin_epoch("p0", 5, claimer="B") == 1

    plans = [(sql, plan) for sql, plan in _plans(store, run) if " WHERE name=" in sql]
    assert len(plans) == 7  # the six calls' updates and begin_epoch's read of the row
    for sql, plan in plans:
        assert "USING INDEX sessions_live_name" in plan, (sql, plan)
    assert store.session("p0").state == "starting"
    assert store.restart_reason("p0") is None
    store.close()


def _per_session_statements(store: SqliteStore) -> list[tuple[str, str]]:
    """(statement, SQLite plan) of what the store runs for one session by name or id:
    its row, its events, its state moves (on three sessions, ``p1`` with events)."""
    store.add_node("s1", "127.0.0.1:5001", "sender")
    store.add_node("r1", "127.0.0.1:5002", "reflector")
    ids = _sessions(store, 3)
    store.set_states(["p0", "p1", "p2"], "running")
    for at in range(4):
        state = EventState.RAISED if at % 2 == 0 else EventState.CLEARED
        store.add_event(ids[1], SessionEvent("p1", EventKind.LOSS, state, 0.5, 0.1, at))

    def run() -> None:
        assert store.session("p1").id == ids[1]
        assert [e.at_ns for e in store.events("p1")] == [0, 1, 2, 3]
        assert store.raised(ids[1]) == []
        assert store.event_counts(ids[1]) == {("loss", "raised"): 2, ("loss", "cleared"): 2}
        assert store.restart_reason("p0") is None
        assert store.mark_restart("p0", "sender-lost")
        assert store.cancel_restart("p0")
        assert store.claim_state("p0", "stopping", "finished")
        assert store.claim_state("p0", "finished", "starting", claimer="A")
        assert store.take_over_start("p0", "A", "B")
        store.begin_epoch("p0", 5, claimer="B")
        store.stop_epoch("p0", 6)
        store.end_epoch("p0", 7, "finished")

    return [
        (sql, plan)
        for sql, plan in _plans(store, run)
        if " sessions " in sql + " " or " events " in sql + " "
    ]


def test_sqlite_a_sessions_row_and_events_are_read_through_indexes(tmp_path: Path) -> None:
    """What runs per session by name or id reads its rows through an index: a session
    by name (the live one, else the last destroyed: ``sessions_name``), its events
    (``events_session``), its state moves (``sessions_live_name``); no statement scans
    the sessions or events table (a start, stop or listing of 10,000 sessions would be
    quadratic)."""
    store = SqliteStore(tmp_path / "c.sqlite")
    plans = _per_session_statements(store)
    assert len(plans) >= 13
    for sql, plan in plans:
        assert not re.search(r"\bSCAN (sessions|events|s|e)\b", plan), (sql, plan)
    store.close()


def test_postgresql_a_sessions_row_and_events_are_read_through_indexes(
    tmp_path: Path, pg_url: str
) -> None:
    """The same statements (PostgreSQL runs the same text, but for its own session
    rows' query: ``_as_postgresql``), explained by PostgreSQL on tables of 5,000 sessions and 5,000
    events, analysed: no sequential scan of either."""
    sqlite = SqliteStore(tmp_path / "c.sqlite")
    statements = [_as_postgresql(sql) for sql, _ in _per_session_statements(sqlite)]
    sqlite.close()
    store = open_store(pg_url)
    try:
        store.add_node("s1", "127.0.0.1:5001", "sender")
        store.add_node("r1", "127.0.0.1:5002", "reflector")
        rows = store.add_sessions([(f"p{i}", i + 1, "s1", "r1", {}) for i in range(5000)], now_ns=0)
        with psycopg.connect(pg_url, autocommit=True) as db:
            with db.cursor() as cur:
                cur.executemany(
                    "INSERT INTO events(session_id, kind, state, value, threshold, at_ns)"
                    " VALUES (%s, 'loss', 'raised', 0.5, 0.1, 0)",
                    [(r.id,) for r in rows],
                )
            db.execute("ANALYZE")
            for sql in statements:
                plan = "\n".join(r[0] for r in db.execute("EXPLAIN " + sql).fetchall())
                assert "Seq Scan on sessions" not in plan, (sql, plan)
                assert "Seq Scan on events" not in plan, (sql, plan)
    finally:
        store.close()


def test_sqlite_roll_up_reads_the_stored_rollups_it_merges_by_their_key(tmp_path: Path) -> None:
    """A pass of ``roll_up`` that adds to minutes already rolled reads those rollups by
    their primary key, not by a scan of the rollups table (which holds every minute of
    every session for the rollup retention) per chunk of keys."""
    store = SqliteStore(tmp_path / "c.sqlite")
    store.add_node("s1", "127.0.0.1:5001", "sender")
    store.add_node("r1", "127.0.0.1:5002", "reflector")
    ids = _sessions(store, 3)
    for sid in ids:
        store.store_results(sid, [(k + 1, _r(k)) for k in range(5)])
    assert store.roll_up() == 15
    for sid in ids:
        store.store_results(sid, [(k + 1, _r(k)) for k in range(5, 10)])
    plans = _plans(store, store.roll_up)
    reads = [(sql, plan) for sql, plan in plans if sql.startswith("SELECT") and "rollups" in sql]
    assert len(reads) == 1
    sql, plan = reads[0]
    assert "SEARCH r USING" in plan, (sql, plan)
    assert not re.search(r"\bSCAN (rollups|r)\b", plan), (sql, plan)
    for sid in ids:
        ((_, minute),) = store.rollups(sid)
        assert minute.count == 10
    store.close()


#: A plan's step over the sessions or epochs table (under their aliases too).
_LIVE_TABLES = re.compile(r"\b(SCAN|SEARCH) (sessions|epochs|s|e)\b(.*)")


def _partial_indexes(store: SqliteStore) -> set[str]:
    rows = store._conn.execute(
        "SELECT name FROM sqlite_master WHERE type='index' AND sql LIKE '% WHERE %'"
    ).fetchall()
    return {r[0] for r in rows}


def _per_pass_statements(store: SqliteStore) -> list[tuple[str, str]]:
    """(statement, SQLite plan) of what the controller runs per pass rather than per
    session (supervisor rounds, stream reopenings, housekeeping), over three live
    sessions (one stopping to restart, one with records) and three destroyed ones."""
    store.add_node("s1", "127.0.0.1:5001", "sender")
    store.add_node("r1", "127.0.0.1:5002", "reflector")
    ids = _sessions(store, 6)
    store.set_states(["p0", "p1", "p2"], "running")
    assert store.mark_restart("p1", "sender-lost")
    store.store_results(ids[0], [(k + 1, _r(k)) for k in range(5)])
    store.mark_destroying(["p3", "p4", "p5"])
    for sid in ids[3:]:
        assert store.finish_destroy(sid, 1)

    def run() -> None:
        assert [r[0] for r in store.restarts()] == ["p1"]
        assert [n for n, _ in store.stopping("s1")] == ["p1"]
        assert store.destroying("s1") == []
        assert store.starting("s1") == []
        assert store.collectable("s1") == ["p0", "p1", "p2"]
        assert [r.name for r in store.sessions_of("s1")] == ["p0", "p1", "p2"]
        assert len(store.ssids_of("s1")) == 3
        assert len(store.ssids_of("r1", role="reflector")) == 3
        assert store.roll_up() == 5
        store.expire(2**62, raw_ns=0)

    return [
        (sql, plan)
        for sql, plan in _plans(store, run)
        if " sessions " in sql + " " or " epochs " in sql + " "
    ]


def test_sqlite_per_pass_statements_read_the_live_rows_only(tmp_path: Path) -> None:
    """What the controller runs every supervisor round or housekeeping pass reads the
    sessions and epochs that matter through partial indexes: the live sessions of a node
    (or pending a restart), the epochs not yet rolled up or expired; never a scan of the
    table, nor every session a node ever had (destroyed history included). At 10,000
    sessions and a long history, each pass would read them all."""
    store = SqliteStore(tmp_path / "c.sqlite")
    plans = _per_pass_statements(store)
    partial = _partial_indexes(store)
    assert len(plans) >= 10
    for sql, plan in plans:
        for step in plan.split(" | "):
            m = _LIVE_TABLES.search(step)
            if m is None or (m[1] == "SEARCH" and "PRIMARY KEY" in m[3]):
                continue  # another table, or one row by its key
            index = re.search(r"USING (?:COVERING )?INDEX (\w+)", m[3])
            assert index is not None, (sql, plan)
            assert index[1] in partial, (sql, plan)
    store.close()


#: The indexes schema version 6 added (the passes' partial indexes).
_V6_INDEXES = {
    "sessions_sender_live",
    "sessions_sender_state",
    "sessions_reflector_live",
    "sessions_restart",
    "epochs_unrolled",
    "epochs_unexpired",
}


def test_postgresql_per_pass_statements_read_the_live_rows_only(
    tmp_path: Path, pg_url: str
) -> None:
    """The same statements (the sums of the sessions' totals in PostgreSQL's text),
    explained by PostgreSQL over analysed tables: 10 senders and
    10 reflectors, 10,000 live sessions (ten stopping to restart) with new records since
    the last roll-up, and 20,000 destroyed ones rolled up and expired, one epoch each.
    The sessions and epochs are read through the passes' partial indexes (or one epoch
    by its key): no sequential scan, and no index of every session ever kept."""
    sqlite = SqliteStore(tmp_path / "c.sqlite")
    statements = [_as_postgresql(sql) for sql, _ in _per_pass_statements(sqlite)]
    assert any(sql.startswith(PostgresStore._sessions_sql) for sql in statements)
    sqlite.close()
    store = open_store(pg_url)
    try:
        for i in range(1, 11):
            store.add_node(f"s{i}", f"127.0.0.1:{5000 + i}", "sender")
            store.add_node(f"r{i}", f"127.0.0.1:{6000 + i}", "reflector")
        with psycopg.connect(pg_url, autocommit=True) as db:
            db.execute(
                "INSERT INTO sessions(name, ssid, sender, reflector, params, state, created_ns,"
                " restart_reason) SELECT 'p' || i, i, 's' || (i % 10 + 1), 'r' || (i % 10 + 1),"
                " '{}', CASE WHEN i <= 20000 THEN 'destroyed' WHEN i % 1000 = 0 THEN"
                " 'stopping' ELSE 'running' END, 0, CASE WHEN i > 20000 AND i % 1000 = 0"
                " THEN 'sender-lost' END FROM generate_series(1, 30000) AS i"
            )
            db.execute(
                "INSERT INTO epochs(session_id, epoch, started_ns, top, rolled, expired)"
                " SELECT id, 0, 0, 10, CASE WHEN state = 'destroyed' THEN 10 ELSE 9 END,"
                " CASE WHEN state = 'destroyed' THEN 10 ELSE 0 END FROM sessions"
            )
            db.execute(
                "INSERT INTO results(session_id, epoch, record_id, seq, t1_ns, t2_ns, t3_ns,"
                " t4_ns, sender_ee, reflector_ee, ttl, reflector_seq) SELECT s.id, 0, k, k - 1,"
                " k, k, k, k, 0, 0, 64, k - 1 FROM sessions s CROSS JOIN generate_series(1, 10)"
                " AS k WHERE s.state != 'destroyed'"
            )
            db.execute("ANALYZE")
            for sql in statements:
                plan = "\n".join(r[0] for r in db.execute("EXPLAIN " + sql).fetchall())
                assert not re.search(r"Seq Scan on (sessions|epochs)\b", plan), (sql, plan)
                used = set(re.findall(r"(?:Scan using|Bitmap Index Scan on) (\w+)", plan))
                allowed = _V6_INDEXES | {"results_pkey", "rollups_pkey"}
                if sql.startswith("UPDATE epochs") or "e.session_id = sessions.id" in sql:
                    # One epoch by its key; or a session's epochs (its cursor, totals).
                    allowed.add("epochs_pkey")
                assert used <= allowed, (sql, plan)
    finally:
        store.close()


def test_sqlite_a_version_5_file_gets_the_passes_indexes(tmp_path: Path) -> None:
    path = tmp_path / "v5.sqlite"
    SqliteStore(path).close()
    with sqlite3.connect(path) as db:  # version 5: the schema without them
        for name in _V6_INDEXES:
            db.execute(f"DROP INDEX {name}")
        db.execute("PRAGMA user_version=5")
    SqliteStore(path).close()
    with sqlite3.connect(path) as db:
        assert {r[0] for r in db.execute("SELECT name FROM sqlite_master")} >= _V6_INDEXES
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 8


def test_postgresql_migrates_a_version_5_database(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as db:
        _at_version(db, 5)
    open_store(pg_url).close()
    with psycopg.connect(pg_url) as db:
        names = {r[0] for r in db.execute("SELECT indexname FROM pg_indexes")}
        assert names >= _V6_INDEXES
        assert db.execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)


def _written_sql(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements the store runs from now on (SQLite: each as traced, once per row
    of an ``executemany``; PostgreSQL: each sent)."""
    seen: list[str] = []
    if isinstance(store, SqliteStore):
        store._conn.set_trace_callback(seen.append)
        return seen
    for name in ("execute", "executemany"):
        method = getattr(_PgDb, name)

        def recording(self: Any, sql: str, *args: Any, _m: Any = method, **kw: Any) -> Any:
            seen.append(sql)
            return _m(self, sql, *args, **kw)

        monkeypatch.setattr(_PgDb, name, recording)
    return seen


def test_a_batch_of_results_writes_the_results_and_each_epochs_row_alone(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction of results of 300 sessions, counters with half of them: no
    ``sessions`` row is written (before: the cursors' and the totals' updates, two
    statements that rewrote each session's row, parameters and all), one row per epoch
    is (its count, top and counters in one upsert), and the cursors and totals read back
    as before: the top given, the sums over the epochs."""
    ids = _sessions(store, 300)
    store.store_results(ids[0], [(1, _r(0))], (5, 1, None, 0))
    store.begin_epoch("p0", 2)  # p0 in epoch 1 now, with epoch 0's counters kept
    seen = _written_sql(store, monkeypatch)
    batches = [
        ResultBatch(sid, 1 if i == 0 else 0, [(3, _r(2)), (4, _r(3))],
                    Counters(10, 2, 1, 0) if i % 2 == 0 else None)
        for i, sid in enumerate(ids)
    ]  # fmt: skip
    assert store.store_many(batches, now_ns=9) == [2] * 300
    assert any(re.search(r"\bINTO\s+epochs\b", sql) for sql in seen), seen
    assert not [sql for sql in seen if re.search(r"\bUPDATE\s+sessions\b", sql)], seen
    rows = {r.id: r for r in store.sessions()}
    assert (rows[ids[0]].epoch, rows[ids[0]].cursor) == (1, 4)
    assert (rows[ids[0]].sent, rows[ids[0]].lost, rows[ids[0]].forward_lost) == (15, 3, 1)
    assert [(rows[sid].cursor, rows[sid].sent, rows[sid].forward_lost) for sid in ids[1:3]] == [
        (4, 0, None), (4, 10, 1),
    ]  # fmt: skip
    assert [(e.epoch, e.received, e.sent) for e in store.epochs(ids[0])] == [(0, 1, 5), (1, 2, 10)]


def test_every_read_of_a_session_row_gives_its_current_epochs_cursor_and_sums_over_epochs(
    store: Store,
) -> None:
    """The session rows' query (one pass over each session's epochs, each store's own
    wording) on its edges, read the same through every path (all sessions, one by name,
    some by name, a node's): three epochs (the cursor is the current one's top, lower
    than an earlier epoch's; the totals their sums, a NULL counter left out of its sum);
    a session begun with nothing stored; one created and never begun (no epoch row: a
    cursor and totals of 0, the nullable sums NULL); one destroyed (listed on request
    with its totals)."""
    ids = _sessions(store, 3)
    store.store_results(ids[0], [(k, _r(k - 1)) for k in range(1, 6)],
                        Counters(5, 1, None, 1, 0, 0, 0, 2, 1), epoch=0)  # fmt: skip
    assert store.begin_epoch("p0", 2) == 1
    store.store_results(ids[0], [(k, _r(k - 1)) for k in range(1, 8)],
                        Counters(7, 2, 3, 0, 0, 0, 0, None, 0), epoch=1)  # fmt: skip
    assert store.begin_epoch("p0", 3) == 2
    store.store_results(ids[0], [(1, _r(0)), (2, _r(1))],
                        Counters(2, 0, 1, 0, 0, 0, 0, 1, 4), epoch=2)  # fmt: skip
    store.store_results(ids[2], [(1, _r(0))], Counters(3, 1, 1, 0), epoch=0)
    store.add_session("p3", 4, sender="s1", reflector="r1", params={}, now_ns=0)
    store.mark_destroying(["p2"])
    assert store.finish_destroy(ids[2], 4)

    def totals(row: SessionRow) -> tuple[Any, ...]:
        return (row.epoch, row.cursor, row.sent, row.lost, row.forward_lost, row.overflow,
                row.unclassified_lost, row.ssid_zero)  # fmt: skip

    expected = {
        "p0": (2, 2, 14, 3, 4, 1, 3, 5),
        "p1": (0, 0, 0, 0, None, 0, None, 0),
        "p2": (0, 1, 3, 1, 1, 0, None, 0),
        "p3": (0, 0, 0, 0, None, 0, None, 0),
    }
    live = ["p0", "p1", "p3"]
    assert {r.name: totals(r) for r in store.sessions(include_destroyed=True)} == expected
    assert [r.name for r in store.sessions()] == live
    assert [totals(r) for r in store.sessions()] == [expected[n] for n in live]
    assert {n: totals(store.session(n)) for n in expected} == expected
    assert {r.name: totals(r) for r in store.sessions_named([*live, "p2"])} == {
        n: expected[n] for n in live
    }
    assert [totals(r) for r in store.sessions_of("s1")] == [expected[n] for n in live]
    assert [totals(r) for r in store.sessions_of("r1", role="reflector")] == [
        expected[n] for n in live
    ]


def test_postgresql_migrates_a_version_6_database_keeping_cursors_and_totals(
    pg_url: str,
) -> None:
    """Version 6 kept each session's cursor and totals in ``sessions``; version 7 reads
    the cursor as its current epoch's ``top`` (carried over: kept if beyond it, or if
    the epoch had no row) and the totals as the sums over its epochs."""
    with psycopg.connect(pg_url, autocommit=True) as db:
        _at_version(db, 6)
        db.execute("INSERT INTO nodes(name, address, role) VALUES ('s1', 'h:1', 'sender')")
        db.execute("INSERT INTO nodes(name, address, role) VALUES ('r1', 'h:2', 'reflector')")
        for i, (name, epoch, cursor, top, counts) in enumerate(
            (("a", 0, 5, 5, ((7, 2),)), ("b", 1, 9, 7, ((12, 1), (8, 2))), ("c", 0, 3, None, ()))
        ):
            db.execute(
                "INSERT INTO sessions(name, ssid, sender, reflector, params, state, epoch,"
                " cursor, sent, lost, created_ns) VALUES (%s, %s, 's1', 'r1', '{}', 'running',"
                " %s, %s, %s, %s, 1)",
                (name, i + 1, epoch, cursor, sum(c[0] for c in counts), sum(c[1] for c in counts)),
            )
            for e, (sent, lost) in enumerate(counts):
                db.execute(
                    "INSERT INTO epochs(session_id, epoch, started_ns, received, top, sent, lost)"
                    " VALUES (%s, %s, 2, %s, %s, %s, %s)",
                    (i + 1, e, top, top, sent, lost),
                )
    store = open_store(pg_url)
    try:
        assert [(r.name, r.cursor, r.sent, r.lost) for r in store.sessions()] == [
            ("a", 5, 7, 2), ("b", 9, 20, 3), ("c", 3, 0, 0)
        ]  # fmt: skip
        b = store.session("b")
        assert store.store_results(b.id, [(10, _r(10))], (30, 4, None, 0), epoch=1) == 1
        assert (store.session("b").cursor, store.session("b").sent) == (10, 42)
        with psycopg.connect(pg_url) as db:
            assert db.execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)
            dropped = db.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name ="
                " 'sessions' AND column_name IN ('cursor', 'sent', 'lost', 'ssid_zero')"
            ).fetchall()
            assert dropped == []
    finally:
        store.close()


# -- values past the 64-bit columns ------------------------------------------------------

I64_MAX = 2**63 - 1
#: 255 × 2^(57−32) s (RFC 4656 §4.1.2): two of them are past 2^63 ns.
HUGE_EE = ErrorEstimate(scale=57, multiplier=255).to_int()


def _api_record(rid: int, seq: int, ee: int = EE.to_int(), t2: int | None = None) -> pb.StampResult:
    """An agent's record; ``t2``: the reflector's T2 and T3 (default: T1 + 100 ns)."""
    t1 = T0 + seq * 10**9
    t2 = t1 + 100 if t2 is None else t2
    return pb.StampResult(seq=seq, t1_ns=t1, t2_ns=t2, t3_ns=t2, t4_ns=t1 + 300,
                          sender_error_estimate=ee, reflector_error_estimate=ee,
                          ses_sender_ttl=64, reflector_seq=seq, record_id=rid)  # fmt: skip


def test_a_rollup_with_an_error_bound_past_int64_is_stored_and_later_passes_run(
    store: Store,
) -> None:
    """A record whose Error Estimates (Scale 57, Multiplier 255 each) bound its error
    beyond 2^63 ns: the pass stores the minute's bound as 2^63 − 1 ("at least"), by the
    arrays and by the reference merge alike, and the next passes run."""
    (sid,) = _sessions(store, 1)
    huge = ErrorEstimate.from_int(HUGE_EE)
    assert store.store_results(sid, [(1, replace(_r(0), sender_error=huge, reflector_error=huge)),
                                     (2, _r(1))]) == 2  # fmt: skip
    assert store.roll_up() == 2
    store.store_results(sid, [(3, _r(2)), (4, replace(_r(3), reflector_error=huge))])
    assert store.roll_up() == 2
    assert store.roll_up() == 0
    ((_, minute),) = store.rollups(sid)
    assert (minute.count, minute.max_error_ns) == (4, I64_MAX)


def test_a_huge_error_bound_and_absurd_values_are_stored_and_rolled_up_pass_after_pass(
    store: Store,
) -> None:
    """Records as collection builds them from an agent's messages (``core._batch``): an
    Error Estimate whose bound is past 2^63 ns, timestamps and counters past what a
    64-bit column holds. They are stored (saturated: "at least"), the housekeeping
    pass rolls them up, and later passes go on rolling up this session and another."""
    a, b = _sessions(store, 2)
    row_a, row_b = store.session("p0"), store.session("p1")
    u64 = 2**64 - 1
    counters = pb.SessionCounters(sent=u64, lost=u64 - 1, overflow=u64, schedule_late_ns_total=u64,
                                  schedule_late_ns_max=u64, schedule_skipped=u64)  # fmt: skip
    # A reflector whose clock reads past 2^64 ns (not set): delays of ~7.5e18 ns, two of
    # them a sum past 2^63.
    records = [_api_record(1, 0, HUGE_EE), _api_record(2, 1, t2=u64),
               _api_record(3, 2, t2=u64 - 9)]  # fmt: skip
    records[0].data.s_txc, records[0].data.s_rxc = 7, u64
    housekeeper = Housekeeper(store, Retention(duty=1.0))
    assert store.store_many([core._batch(row_a, records, counters)[0]], now_ns=1) == [3]
    assert housekeeper.run_once() == (3, 0, 0)
    minutes = {m.minute_ns: m for _, m in store.rollups(a)}
    assert minutes[T0].max_error_ns == I64_MAX
    assert minutes[T0].directions["direct"].sum_ns == I64_MAX
    assert minutes[T0].directions["direct"].max_ns == I64_MAX - T0 - 10**9
    stored = {r.seq: r for r in store.results(a)}
    assert (stored[1].t2_ns, stored[2].t3_ns) == (I64_MAX, I64_MAX)  # no clock gives it
    assert stored[0].data is not None
    assert stored[0].data.s_rxc == I64_MAX
    # Later passes: more records of both sessions, into the minute already stored.
    more = [_api_record(4, 3, HUGE_EE), _api_record(5, 4)]
    batches = [core._batch(row_a, more, None)[0], core._batch(row_b, [_api_record(1, 0)], None)[0]]
    assert store.store_many(batches, now_ns=2) == [2, 1]
    assert housekeeper.run_once() == (3, 0, 0)
    minutes = {m.minute_ns: m for _, m in store.rollups(a)}
    assert minutes[T0].count == 5
    assert minutes[T0].max_error_ns == I64_MAX
    assert merged_stats(list(minutes.values())).max_error_bound_ns == I64_MAX
    assert [m.count for _, m in store.rollups(b)] == [1]
    assert housekeeper.run_once() == (0, 0, 0)
    # The counters of two epochs, each saturated: the session's totals, saturated too.
    assert store.session("p0").sent == I64_MAX
    store.begin_epoch("p0", 3)
    store.store_many([core._batch(store.session("p0"), [_api_record(1, 0)], counters)[0]], now_ns=4)
    s = store.session("p0")
    assert (s.sent, s.lost, s.overflow, s.forward_lost) == (I64_MAX, I64_MAX, I64_MAX, None)
    assert [e.late_ns_max for e in store.epochs(a)] == [I64_MAX, I64_MAX]
    assert housekeeper.run_once()[0] == 1


def test_sqlite_stores_a_batch_of_new_results_without_a_savepoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All new rows, the usual case: one insert, no savepoint. With one, SQLite keeps an
    image of every page the insert changes, and at thousands of sessions (a page each)
    that copy spills to a temporary file (docs/architecture.md, "The SQLite store's
    write path")."""
    store = open_store(tmp_path / "c.sqlite")
    store.add_node("s1", "127.0.0.1:5001", "sender")
    store.add_node("r1", "127.0.0.1:5002", "reflector")
    ids = _sessions(store, 50)
    seen = _written_sql(store, monkeypatch)
    assert (
        store.store_many([ResultBatch(sid, 0, [(1, _r(0)), (2, _r(1))]) for sid in ids]) == [2] * 50
    )
    assert not [sql for sql in seen if re.search(r"\bSAVEPOINT\b", sql, re.I)], seen
    assert sum(bool(re.search(r"\bINTO\s+results\b", sql)) for sql in seen) == 100
    store.close()


def test_repeats_in_a_batch_of_many_sessions_are_counted_per_session(store: Store) -> None:
    """A batch where some sessions' records are stored already (by record id, by Seq) and
    the others' are new: each session's new rows counted exactly, each epoch's count and
    cursor as if the repeats had not come, nothing stored twice."""
    ids = _sessions(store, 6)
    assert (
        store.store_many([ResultBatch(sid, 0, [(1, _r(0)), (2, _r(1))]) for sid in ids]) == [2] * 6
    )
    batches = [
        ResultBatch(ids[0], 0, [(3, _r(2)), (4, _r(3))]),  # new
        ResultBatch(ids[1], 0, [(2, _r(9)), (3, _r(10))]),  # record id 2 repeated
        ResultBatch(ids[2], 0, [(3, _r(1)), (4, _r(5))]),  # Seq 1 repeated
        ResultBatch(ids[3], 0, [(1, _r(0)), (2, _r(1))]),  # all repeated
        ResultBatch(ids[4], 0, [(3, _r(2))]),  # new
        ResultBatch(ids[5], 0, [(5, _r(4)), (5, _r(4))]),  # repeated within the batch
    ]
    assert store.store_many(batches, now_ns=7) == [2, 1, 1, 0, 1, 1]
    assert [len(store.results(sid)) for sid in ids] == [4, 3, 3, 2, 3, 3]
    assert [store.epochs(sid)[0].received for sid in ids] == [4, 3, 3, 2, 3, 3]
    assert [store.session(f"p{i}").cursor for i in range(6)] == [4, 3, 4, 2, 3, 5]


def test_a_row_breaking_a_not_null_column_stores_nothing_of_the_batch(store: Store) -> None:
    """A repeat is skipped; any other broken constraint fails the whole transaction,
    beside new rows and beside a repeat alike (the insert meets the broken row before
    any careful second run: both runs insert the same rows)."""
    ids = _sessions(store, 2)
    assert store.store_results(ids[0], [(1, _r(0))]) == 1
    bad = ResultBatch(ids[1], 0, [(1, replace(_r(0), t1_ns=None))])  # type: ignore[arg-type]
    for first in ([(2, _r(1))], [(1, _r(0))]):  # new; a repeat
        with pytest.raises((sqlite3.IntegrityError, psycopg.errors.NotNullViolation)):
            store.store_many([ResultBatch(ids[0], 0, first), bad], now_ns=8)
        assert [r.seq for r in store.results(ids[0])] == [0]
        assert store.results(ids[1]) == []
        assert [store.epochs(sid)[0].received for sid in ids] == [1, 0]
