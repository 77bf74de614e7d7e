"""Notices across the stores of one SQLite file (``Store.subscribe``): what one store
commits, another store on the file hears (its ``notices`` table, read by a listening
thread), its own subscribers once; a listener that fell behind the table's pruning
hears ``RESYNC``; results announce nothing (docs/architecture.md, "Notices").

Two ``SqliteStore`` objects on one file are two connections, as two replicas' processes
are: the store tells them apart by the writer recorded with each notice, not by the
process."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sixlab.controller.store import (
    CHANGED,
    DESTROYED,
    DESTROYING,
    RESYNC,
    SCHEMA_VERSION,
    Counters,
    ResultBatch,
    SqliteStore,
)
from tests.integration._simagents import wait_for

#: How long a notice may take to reach the other store in these tests (s): generous
#: (the listener looks every ``notice_poll_s``, a fraction of a second).
HEARD_S = 10.0
#: The listeners' poll in these tests (s).
POLL_S = 0.05


def _wait(what: str, check: Callable[[], object]) -> None:
    wait_for(what, check, HEARD_S)


class _Heard:
    """A subscriber that records what it hears."""

    def __init__(self) -> None:
        self.notices: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, kind: str, arg: str) -> None:
        with self._lock:
            self.notices.append((kind, arg))

    def __contains__(self, notice: object) -> bool:
        with self._lock:
            return notice in self.notices

    def take(self) -> list[tuple[str, str]]:
        with self._lock:
            out, self.notices = self.notices, []
        return out


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[SqliteStore, SqliteStore]]:
    """Two stores on one file, as two replicas have (their listeners quick)."""
    a = SqliteStore(tmp_path / "c.sqlite")
    b = SqliteStore(tmp_path / "c.sqlite")
    for s in (a, b):
        s.notice_poll_s = POLL_S
    try:
        yield a, b
    finally:
        b.close()
        a.close()


def _listeners() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "store-listen"}


def test_a_change_through_one_store_is_heard_by_the_other(
    pair: tuple[SqliteStore, SqliteStore],
) -> None:
    a, b = pair
    heard = _Heard()
    b.subscribe(heard)
    a.add_node("s1", "h:1", "sender")
    _wait("B to hear A's change", lambda: (CHANGED, "") in heard)
    assert b.node("s1").role == "sender"  # the change is visible once it is heard


def test_destroy_notices_carry_their_sender_and_session(
    pair: tuple[SqliteStore, SqliteStore],
) -> None:
    a, b = pair
    a.add_node("s1", "h:1", "sender")
    a.add_node("r1", "h:2", "reflector")
    sid = a.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=1).id
    heard = _Heard()
    b.subscribe(heard)
    assert [r.name for r in a.mark_destroying(["p"])] == ["p"]
    _wait("DESTROYING s1", lambda: (DESTROYING, "s1") in heard)
    assert b.session("p").state == "destroying"
    assert a.finish_destroy(sid, 2)
    _wait("DESTROYED", lambda: (DESTROYED, str(sid)) in heard)
    assert b.session("p").state == "destroyed"
    # In the order they were committed, each once. Each is a transaction of its own:
    # the listener may have read DESTROYED before the CHANGED after it was committed.
    expected = [(DESTROYING, "s1"), (CHANGED, ""), (DESTROYED, str(sid)), (CHANGED, "")]
    _wait("all four", lambda: len(heard.notices) >= len(expected))
    time.sleep(POLL_S * 4)  # the listener looked again: nothing more, nothing twice
    assert heard.take() == expected


def test_a_stores_own_notices_reach_its_subscribers_once(
    pair: tuple[SqliteStore, SqliteStore],
) -> None:
    a, b = pair
    mine, theirs = _Heard(), _Heard()
    a.subscribe(mine)
    b.subscribe(theirs)
    a.add_node("s1", "h:1", "sender")
    assert mine.take() == [(CHANGED, "")]  # at once, in the caller's thread
    _wait("B to hear it", lambda: (CHANGED, "") in theirs)
    b.add_node("r1", "h:2", "reflector")
    _wait("A to hear B's", lambda: (CHANGED, "") in mine)
    time.sleep(POLL_S * 10)  # each listener looked again several times meanwhile
    assert mine.take() == [(CHANGED, "")]  # B's, once; its own not again
    assert theirs.take() == [(CHANGED, ""), (CHANGED, "")]  # A's, then its own


def test_results_announce_nothing(pair: tuple[SqliteStore, SqliteStore]) -> None:
    a, b = pair
    a.add_node("s1", "h:1", "sender")
    a.add_node("r1", "h:2", "reflector")
    sid = a.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=1).id
    a.begin_epochs([("p", None)], 2)
    heard = _Heard()
    b.subscribe(heard)
    rows = a._conn.execute("SELECT COUNT(*), MAX(id) FROM notices").fetchone()
    for i in range(20):
        a.store_many([ResultBatch(sid, 0, [], Counters(i + 1, 0, None, 0))], 3 + i)
    time.sleep(POLL_S * 10)
    assert heard.take() == []
    assert a._conn.execute("SELECT COUNT(*), MAX(id) FROM notices").fetchone() == rows
    assert b.session("p").sent == 20


def test_a_listener_that_fell_behind_the_pruning_hears_resync(
    pair: tuple[SqliteStore, SqliteStore],
) -> None:
    """B's subscriber holds its listener up while A makes more changes than the table
    keeps: the notices B had not read are gone, and B is told so (``RESYNC``), then
    hears what came after."""
    a, b = pair
    a.notices_kept = 5
    release = threading.Event()
    heard = _Heard()

    def slow(kind: str, arg: str) -> None:
        heard(kind, arg)
        if len(heard.notices) == 1:
            release.wait(HEARD_S)

    b.subscribe(slow)
    a.add_node("n0", "h:1", "sender")
    _wait("B to hear the first", lambda: len(heard.notices) == 1)
    for i in range(1, 12):
        a.add_node(f"n{i}", "h:1", "sender")
    assert a._conn.execute("SELECT COUNT(*) FROM notices").fetchone()[0] == 5
    release.set()
    _wait("RESYNC", lambda: (RESYNC, "") in heard)
    a.add_node("late", "h:1", "sender")
    _wait("the next change", lambda: len(heard.notices) >= 2 + 5 + 1)
    got = heard.take()
    assert got[:2] == [(CHANGED, ""), (RESYNC, "")]
    assert got[2:] == [(CHANGED, "")] * 6  # the five kept, then the next one


def test_closing_a_store_stops_its_listener(pair: tuple[SqliteStore, SqliteStore]) -> None:
    a, b = pair
    before = _listeners()
    heard = _Heard()
    b.subscribe(heard)
    b.subscribe(_Heard())  # one listener per store, however many subscribers
    (listener,) = _listeners() - before
    a.add_node("s1", "h:1", "sender")
    _wait("B to hear", lambda: (CHANGED, "") in heard)
    b.close()
    assert not listener.is_alive()
    heard.take()
    a.add_node("s2", "h:1", "sender")
    time.sleep(POLL_S * 10)
    assert heard.take() == []
    b.close()  # twice: nothing more to do


def test_a_store_in_memory_tells_its_own_subscribers_only() -> None:
    s = SqliteStore(":memory:")
    before = _listeners()
    try:
        heard = _Heard()
        s.subscribe(heard)
        assert _listeners() == before  # no other connection can share it
        s.add_node("s1", "h:1", "sender")
        assert heard.take() == [(CHANGED, "")]
        assert s._conn.execute("SELECT COUNT(*) FROM notices").fetchone() == (0,)
    finally:
        s.close()


def test_a_listener_whose_reads_fail_says_so_and_resyncs_once_they_work(
    pair: tuple[SqliteStore, SqliteStore], caplog: pytest.LogCaptureFixture
) -> None:
    """The table is gone for a while (a damaged file, say): the listener logs why and
    tries again, never crashing; once it reads again its subscribers are told that
    they may have missed notices."""
    a, b = pair
    heard = _Heard()
    b.subscribe(heard)
    with sqlite3.connect(a.path) as db:
        db.execute("ALTER TABLE notices RENAME TO notices_away")
    with sqlite3.connect(a.path) as db:
        db.execute("INSERT INTO nodes(name, address, role) VALUES ('x', 'h:1', 'sender')")
    _wait("the failure to be logged", lambda: "store: reading notices" in caplog.text)
    with sqlite3.connect(a.path) as db:
        db.execute("ALTER TABLE notices_away RENAME TO notices")
    _wait("RESYNC", lambda: (RESYNC, "") in heard)
    a.add_node("s1", "h:1", "sender")
    _wait("the next change", lambda: (CHANGED, "") in heard)


def test_a_version_7_file_gets_the_notices_table(tmp_path: Path) -> None:
    path = tmp_path / "v7.sqlite"
    SqliteStore(path).close()
    with sqlite3.connect(path) as db:  # version 7: no notices table
        db.execute("DROP TABLE notices")
        db.execute("PRAGMA user_version=7")
    a, b = SqliteStore(path), SqliteStore(path)
    try:
        b.notice_poll_s = POLL_S
        heard = _Heard()
        b.subscribe(heard)
        a.add_node("s1", "h:1", "sender")
        _wait("B to hear", lambda: (CHANGED, "") in heard)
    finally:
        b.close()
        a.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 8
