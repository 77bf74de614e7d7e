"""The controller's store: nodes, sessions and results in SQLite (WAL mode).

Exactly-once. Agents number the records of a session from 1 and keep each one until
the controller acknowledges it (``SenderEngine.fetch``). The controller writes a batch
of records and the session's new cursor (the highest id stored) in one transaction, and
asks the agent for "records after the cursor". Killed between the fetch and the commit,
it asks again after restart and gets the same records; killed after the commit, it
acknowledges them with its next call. The primary key (session, record id) makes a
repeated insert a no-op, so even a misbehaving agent cannot duplicate a row.

An agent that restarted has lost its sessions; the controller creates the session again
on it and bumps the session's ``epoch``: ids and the agent's counters restart, so rows
are keyed by epoch too and the counters of earlier epochs are kept as a base.

Schema (``SCHEMA``) is created on open; the file may be shared by a CLI reading it while
a controller writes (WAL lets readers run beside one writer).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sixlab.controller.errors import ControllerError
from sixlab.stamp import StampResult
from sixlab.wire.timestamp import ErrorEstimate

__all__ = [
    "SCHEMA",
    "AlreadyExistsError",
    "InUseError",
    "NodeRow",
    "NotFoundError",
    "SessionRow",
    "Store",
    "StoreError",
]

SCHEMA = """
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
    created_ns  INTEGER NOT NULL,
    unclassified_lost INTEGER,          -- this epoch: lost after the last reply, not yet placed
    ssid_zero   INTEGER NOT NULL DEFAULT 0  -- this epoch: replies with SSID 0 (RFC 8762-only)
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


#: Row queries, with the columns in the order of SessionRow's and NodeRow's fields.
_SELECT_SESSIONS = (
    "SELECT id, name, ssid, sender, reflector, params, state, epoch, cursor, sent, lost,"
    " forward_lost, overflow, created_ns, unclassified_lost, ssid_zero FROM sessions"
)
#: Columns added to ``sessions`` after its first release: (name, declaration), added to a
#: database made before them.
_ADDED_SESSION_COLUMNS = (
    ("unclassified_lost", "INTEGER"),
    ("ssid_zero", "INTEGER NOT NULL DEFAULT 0"),
)
_SELECT_NODES = "SELECT name, address, role, healthy, last_seen, last_error, init FROM nodes"


class StoreError(ControllerError):
    """A request the store refuses; the message names the field."""


class NotFoundError(StoreError):
    """No node or session of that name."""


class AlreadyExistsError(StoreError):
    """A node or session of that name exists already."""


class InUseError(StoreError):
    """The node still carries a session that is not destroyed."""


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    address: str
    role: str
    healthy: bool
    last_seen: int | None
    last_error: str | None
    init: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class SessionRow:
    id: int
    name: str
    ssid: int
    sender: str
    reflector: str
    params: dict[str, Any]
    state: str
    epoch: int
    cursor: int
    sent: int
    lost: int
    forward_lost: int | None
    overflow: int
    created_ns: int
    #: Losses after the last reply, not yet placed forward or backward (stateful
    #: reflector; this epoch's agent snapshot).
    unclassified_lost: int | None = None
    #: Replies with SSID 0 this epoch: the reflector implements RFC 8762 only.
    ssid_zero: int = 0


class Store:
    """Thread-safe access to one SQLite file (one connection, serialised)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable at commit
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(SCHEMA)
            have = {r[1] for r in self._db.execute("PRAGMA table_info(sessions)")}
            for name, decl in _ADDED_SESSION_COLUMNS:
                if name not in have:
                    self._db.execute(f"ALTER TABLE sessions ADD COLUMN {name} {decl}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- nodes --------------------------------------------------------------------------

    def add_node(self, name: str, address: str, role: str) -> None:
        if not name:
            raise StoreError("name: a node needs a name")
        if role not in ("sender", "reflector"):
            raise StoreError(f"role: {role!r} is neither 'sender' nor 'reflector'")
        if not address or ":" not in address:
            raise StoreError(f"address: {address!r} is not host:port")
        with self._lock:
            try:
                self._db.execute(
                    "INSERT INTO nodes(name, address, role) VALUES (?, ?, ?)", (name, address, role)
                )
            except sqlite3.IntegrityError:
                raise AlreadyExistsError(f"name: node {name!r} already exists") from None

    def set_health(self, name: str, healthy: bool, now_ns: int, error: str | None = None) -> None:
        with self._lock:
            if healthy:
                self._db.execute(
                    "UPDATE nodes SET healthy=1, last_seen=?, last_error=NULL WHERE name=?",
                    (now_ns, name),
                )
            else:
                self._db.execute(
                    "UPDATE nodes SET healthy=0, last_error=? WHERE name=?", (error, name)
                )

    def node(self, name: str) -> NodeRow:
        with self._lock:
            row = self._db.execute(_SELECT_NODES + " WHERE name=?", (name,)).fetchone()
        if row is None:
            raise NotFoundError(f"node: no node named {name!r}")
        return _node_row(row)

    def nodes(self) -> list[NodeRow]:
        with self._lock:
            rows = self._db.execute(_SELECT_NODES + " ORDER BY name").fetchall()
        return [_node_row(r) for r in rows]

    def set_init(self, name: str, init: dict[str, Any]) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE nodes SET init=? WHERE name=?", (json.dumps(init, sort_keys=True), name)
            )

    def remove_node(self, name: str) -> None:
        with self._lock:
            busy = self._db.execute(
                "SELECT name FROM sessions WHERE (sender=? OR reflector=?) AND state!='destroyed'",
                (name, name),
            ).fetchone()
            if busy:
                raise InUseError(f"node: {name!r} still carries session {busy[0]!r}")
            if not self._db.execute("DELETE FROM nodes WHERE name=?", (name,)).rowcount:
                raise NotFoundError(f"node: no node named {name!r}")

    # -- sessions -----------------------------------------------------------------------

    def add_session(
        self,
        name: str,
        ssid: int,
        *,
        sender: str,
        reflector: str,
        params: dict[str, Any],
        now_ns: int,
    ) -> SessionRow:
        if not name:
            raise StoreError("name: a session needs a name")
        with self._lock:
            try:
                self._db.execute(
                    "INSERT INTO sessions(name, ssid, sender, reflector, params, state, created_ns)"
                    " VALUES (?, ?, ?, ?, ?, 'created', ?)",
                    (name, ssid, sender, reflector, json.dumps(params, sort_keys=True), now_ns),
                )
            except sqlite3.IntegrityError as exc:
                # The extended result code tells the schema's two constraints apart:
                # UNIQUE(name), or a sender/reflector that REFERENCES no node.
                if exc.sqlite_errorname == "SQLITE_CONSTRAINT_UNIQUE":
                    raise AlreadyExistsError(f"name: session {name!r} already exists") from None
                raise NotFoundError("sender/reflector: unknown node") from None
        return self.session(name)

    def session(self, name: str) -> SessionRow:
        with self._lock:
            row = self._db.execute(_SELECT_SESSIONS + " WHERE name=?", (name,)).fetchone()
        if row is None:
            raise NotFoundError(f"session: no session named {name!r}")
        return _session_row(row)

    def sessions(self, *, include_destroyed: bool = False) -> list[SessionRow]:
        query = _SELECT_SESSIONS
        if not include_destroyed:
            query += " WHERE state != 'destroyed'"
        with self._lock:
            rows = self._db.execute(query + " ORDER BY id").fetchall()
        return [_session_row(r) for r in rows]

    def set_state(self, name: str, state: str) -> None:
        with self._lock:
            self._db.execute("UPDATE sessions SET state=? WHERE name=?", (state, name))

    def new_epoch(self, name: str) -> int:
        """The session was created again on its sender: ids, cursor and counters restart.

        The totals so far become the base the next epoch's agent counters add to.
        """
        with self._lock:
            self._db.execute(
                "UPDATE sessions SET epoch=epoch+1, cursor=0, sent_base=sent, lost_base=lost,"
                " forward_lost_base=COALESCE(forward_lost, 0) WHERE name=?",
                (name,),
            )
            row = self._db.execute("SELECT epoch FROM sessions WHERE name=?", (name,)).fetchone()
        if row is None:
            raise NotFoundError(f"session: no session named {name!r}")
        epoch: int = row[0]
        return epoch

    def used_ssids(self, node: str) -> set[int]:
        with self._lock:
            rows = self._db.execute(
                "SELECT ssid FROM sessions WHERE (sender=? OR reflector=?) AND state!='destroyed'",
                (node, node),
            ).fetchall()
        return {r[0] for r in rows}

    # -- results ------------------------------------------------------------------------

    def store_results(
        self,
        session_id: int,
        records: Sequence[tuple[int, StampResult]],
        counters: tuple[int, int, int | None, int] | None = None,
        *,
        epoch: int = 0,
        unclassified_lost: int | None = None,
        ssid_zero: int = 0,
    ) -> int:
        """Insert records (agent id, result) and advance the cursor, atomically.

        ``counters`` is the agent's (sent, lost, forward_lost, overflow) snapshot for this
        epoch; the stored totals add the earlier epochs' base. ``unclassified_lost`` and
        ``ssid_zero`` are stored with it as this epoch's. Returns how many rows were new.
        """
        rows = [
            (
                session_id,
                epoch,
                rid,
                r.seq,
                r.t1_ns,
                r.t2_ns,
                r.t3_ns,
                r.t4_ns,
                r.sender_error.to_int(),
                r.reflector_error.to_int(),
                r.ses_sender_ttl,
                r.reflector_seq,
            )
            for rid, r in records
        ]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                before = self._db.total_changes
                self._db.executemany(
                    # Only a repeated (session, record id) is skipped: OR IGNORE would also
                    # swallow a NOT NULL violation, silently losing a row.
                    "INSERT INTO results VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
                    " ON CONFLICT(session_id, epoch, record_id) DO NOTHING",
                    rows,
                )
                new = self._db.total_changes - before
                if rows:
                    self._db.execute(
                        "UPDATE sessions SET cursor=MAX(cursor, ?) WHERE id=? AND epoch=?",
                        (max(r[2] for r in rows), session_id, epoch),
                    )
                if counters is not None:
                    sent, lost, forward_lost, overflow = counters
                    self._db.execute(
                        "UPDATE sessions SET sent=sent_base+?, lost=lost_base+?,"
                        " forward_lost=CASE WHEN ? IS NULL THEN NULL"
                        " ELSE forward_lost_base+? END, overflow=?, unclassified_lost=?,"
                        " ssid_zero=? WHERE id=? AND epoch=?",
                        (
                            sent,
                            lost,
                            forward_lost,
                            forward_lost,
                            overflow,
                            unclassified_lost,
                            ssid_zero,
                            session_id,
                            epoch,
                        ),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return new

    def results(
        self, session_id: int, *, since_ns: int | None = None, limit: int | None = None
    ) -> list[StampResult]:
        query = "SELECT * FROM results WHERE session_id=?"
        args: list[Any] = [session_id]
        if since_ns is not None:
            query += " AND t1_ns >= ?"
            args.append(since_ns)
        query += " ORDER BY epoch, record_id"
        if limit is not None:
            query += " LIMIT ?"
            args.append(limit)
        with self._lock:
            rows = self._db.execute(query, args).fetchall()
        return [_result(session_id, r) for r in rows]

    def count_results(self, session_id: int) -> int:
        """How many records are stored for the session (all epochs)."""
        with self._lock:
            row = self._db.execute(
                "SELECT COUNT(*) FROM results WHERE session_id=?", (session_id,)
            ).fetchone()
        count: int = row[0]
        return count

    def record_ids(self, session_id: int) -> list[tuple[int, int]]:
        """(epoch, record id) of every stored record, in order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT epoch, record_id FROM results WHERE session_id=? ORDER BY epoch, record_id",
                (session_id,),
            ).fetchall()
        return [(r[0], r[1]) for r in rows]


def _session_row(row: Iterable[Any]) -> SessionRow:
    r = list(row)
    return SessionRow(
        id=r[0],
        name=r[1],
        ssid=r[2],
        sender=r[3],
        reflector=r[4],
        params=json.loads(r[5]),
        state=r[6],
        epoch=r[7],
        cursor=r[8],
        sent=r[9],
        lost=r[10],
        forward_lost=r[11],
        overflow=r[12],
        created_ns=r[13],
        unclassified_lost=r[14],
        ssid_zero=r[15],
    )


def _node_row(r: Sequence[Any]) -> NodeRow:
    return NodeRow(r[0], r[1], r[2], bool(r[3]), r[4], r[5], json.loads(r[6]) if r[6] else None)


def _result(session_id: int, r: Sequence[Any]) -> StampResult:
    del session_id
    return StampResult(
        ssid=0,
        seq=r[3],
        t1_ns=r[4],
        t2_ns=r[5],
        t3_ns=r[6],
        t4_ns=r[7],
        sender_error=ErrorEstimate.from_int(r[8]),
        reflector_error=ErrorEstimate.from_int(r[9]),
        ses_sender_ttl=r[10],
        reflector_seq=r[11],
    )
