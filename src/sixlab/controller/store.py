"""The controller's store: nodes, sessions and results in SQLite (WAL mode).

Exactly-once. Agents number the records of a session from 1 and keep each one until
the controller acknowledges it (``SenderEngine.fetch``). The controller writes a batch
of records and the session's new cursor (the highest id stored) in one transaction, and
asks the agent for "records after the cursor". Killed between the fetch and the commit,
it asks again after restart and gets the same records; killed after the commit, it
acknowledges them with its next call. The primary key (session, record id) makes a
repeated insert a no-op, so even a misbehaving agent cannot duplicate a row.

Epochs. Each time a session is created afresh on its sender (started again after it
finished, or restored on a sender agent that restarted or lost it) it begins a new
``epoch``: the agent's record ids, Seq numbers and counters start over, so results are
keyed by (session, epoch, record id), and (session, epoch, Seq) is unique too. Each
epoch has a row in ``epochs``: when it started and ended and why, the sender agent's
run, and the sender's last counters of that epoch; a session's totals are their sums.
What the store cannot say is what happened to the packets of an epoch whose agent died:
``EpochRow`` keeps what is needed to count them (``Controller.epochs``).

Schema (``SCHEMA``) is created on open; the file may be shared by a CLI reading it while
a controller writes (WAL lets readers run beside one writer).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from sixlab.controller.errors import ControllerError
from sixlab.stamp import StampResult
from sixlab.wire.timestamp import ErrorEstimate

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "AlreadyExistsError",
    "Counters",
    "EpochRow",
    "InUseError",
    "NodeRow",
    "NotFoundError",
    "ResultBatch",
    "SessionRow",
    "StaleEpochError",
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
    init        TEXT,                   -- JSON Init parameters, replayed when it restarts
    port        INTEGER,                -- the STAMP UDP port its Init bound
    agent_epoch TEXT,                   -- the agent's run (GetAgentInfo.epoch, hex) last seen
    agent_started_ns INTEGER,           -- when that run started, Unix ns
    restarts    INTEGER NOT NULL DEFAULT 0  -- times the agent was seen with a new epoch
);
CREATE TABLE IF NOT EXISTS sessions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL,          -- the path's name, e.g. "path-a" (reusable once destroyed)
    ssid        INTEGER NOT NULL,
    sender      TEXT NOT NULL REFERENCES nodes(name),
    reflector   TEXT NOT NULL REFERENCES nodes(name),
    params      TEXT NOT NULL,          -- JSON: segments, return segments, interval, ...
    state       TEXT NOT NULL,          -- created, running, stopped, destroyed
    epoch       INTEGER NOT NULL DEFAULT 0,  -- times the session was (re)created on its sender
    cursor      INTEGER NOT NULL DEFAULT 0,  -- highest agent record id stored, this epoch
    sent        INTEGER NOT NULL DEFAULT 0,  -- totals: the sums over its epochs
    lost        INTEGER NOT NULL DEFAULT 0,
    forward_lost INTEGER,
    overflow    INTEGER NOT NULL DEFAULT 0,
    created_ns  INTEGER NOT NULL,
    unclassified_lost INTEGER,          -- lost after the last reply, not placed (sum of epochs)
    ssid_zero   INTEGER NOT NULL DEFAULT 0  -- replies with SSID 0, RFC 8762-only (sum of epochs)
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
CREATE TABLE IF NOT EXISTS epochs (
    session_id  INTEGER NOT NULL REFERENCES sessions(id),
    epoch       INTEGER NOT NULL,
    started_ns  INTEGER NOT NULL,       -- when the controller started it, Unix ns
    stopped_ns  INTEGER,                -- when a user stopped it (its schedule ended)
    ended_ns    INTEGER,                -- when it ended (NULL: the current epoch, running)
    end_reason  TEXT,                   -- finished, sender-lost, reflector-lost, destroyed
    sender_agent TEXT,                  -- the sender agent's run (GetAgentInfo.epoch, hex)
    sent        INTEGER NOT NULL DEFAULT 0,  -- the sender's last counters of this epoch
    lost        INTEGER NOT NULL DEFAULT 0,
    forward_lost INTEGER,
    overflow    INTEGER NOT NULL DEFAULT 0,
    seen_ns     INTEGER,                -- when those counters were read
    skipped     INTEGER NOT NULL DEFAULT 0,  -- schedule slots the sender's engine skipped
    late_ns_total INTEGER NOT NULL DEFAULT 0,  -- how late its packets left their slots
    late_ns_max INTEGER NOT NULL DEFAULT 0,
    received    INTEGER NOT NULL DEFAULT 0,  -- results stored for this epoch
    unclassified_lost INTEGER,          -- lost after its last reply, never placed if it ended
    ssid_zero   INTEGER NOT NULL DEFAULT 0,  -- replies with SSID 0 (RFC 8762-only reflector)
    PRIMARY KEY (session_id, epoch)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS results_seq ON results(session_id, epoch, seq);
-- One live session per name; destroyed ones keep theirs (and their results).
CREATE UNIQUE INDEX IF NOT EXISTS sessions_live_name ON sessions(name) WHERE state != 'destroyed';
"""


#: Row queries, with the columns in the order of SessionRow's and NodeRow's fields.
_SELECT_SESSIONS = (
    "SELECT id, name, ssid, sender, reflector, params, state, epoch, cursor, sent, lost,"
    " forward_lost, overflow, created_ns, unclassified_lost, ssid_zero FROM sessions"
)
_SELECT_NODES = (
    "SELECT name, address, role, healthy, last_seen, last_error, init, port, agent_epoch,"
    " agent_started_ns, restarts FROM nodes"
)
#: The schema version this code writes (``PRAGMA user_version``); older files are
#: migrated on open (``_migrate``).
SCHEMA_VERSION = 1


class StoreError(ControllerError):
    """A request the store refuses; the message names the field."""


class NotFoundError(StoreError):
    """No node or session of that name."""


class AlreadyExistsError(StoreError):
    """A node or session of that name exists already."""


class InUseError(StoreError):
    """The node still carries a session that is not destroyed."""


class StaleEpochError(StoreError):
    """Results of an epoch the session has left (it was created again meanwhile)."""


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    address: str
    role: str
    healthy: bool
    last_seen: int | None
    last_error: str | None
    init: dict[str, Any] | None
    #: The STAMP UDP port the node's Init bound (None: never initialised by us).
    port: int | None = None
    #: The agent's run last seen (GetAgentInfo.epoch as 16 hex digits), and its start.
    agent_epoch: str | None = None
    agent_started_ns: int | None = None
    #: How many times the agent was seen to have restarted (a new epoch).
    restarts: int = 0


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
    #: Losses after the last reply, not placed forward or backward (stateful reflector;
    #: summed over the epochs: an ended epoch's stay unplaced for good).
    unclassified_lost: int | None = None
    #: Replies with SSID 0 (all epochs): the reflector implements RFC 8762 only.
    ssid_zero: int = 0


class Counters(NamedTuple):
    """A sender session's counters as its agent reported them (one epoch's)."""

    sent: int
    lost: int
    forward_lost: int | None
    overflow: int
    #: How the sender's engine kept the schedule (agent's SessionCounters.schedule_*).
    skipped: int = 0
    late_ns_total: int = 0
    late_ns_max: int = 0
    #: Stateful reflector: lost after the last reply, not placed yet (None: stateless).
    unclassified_lost: int | None = None
    #: Replies with SSID 0 (the reflector implements RFC 8762 but not RFC 8972).
    ssid_zero: int = 0


@dataclass(frozen=True, slots=True)
class ResultBatch:
    """What ``Store.store_many`` stores for one session: as ``store_results`` takes it."""

    session_id: int
    epoch: int
    records: Sequence[tuple[int, StampResult]]
    counters: Counters | None = None


@dataclass(frozen=True, slots=True)
class EpochRow:
    """One epoch of a session: its times, the sender's last counters, what was stored."""

    epoch: int
    started_ns: int
    stopped_ns: int | None
    ended_ns: int | None
    end_reason: str | None
    sender_agent: str | None
    sent: int
    lost: int
    forward_lost: int | None
    overflow: int
    seen_ns: int | None
    #: The sender's schedule (``Counters``).
    skipped: int
    late_ns_total: int
    late_ns_max: int
    #: Results stored for this epoch.
    received: int


class Store:
    """Thread-safe access to one SQLite file (one connection, serialised)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable at commit
            _migrate(self._db)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection inside one write transaction: committed, or rolled back on error."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

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

    def set_init(self, name: str, init: dict[str, Any], port: int | None = None) -> None:
        """Remember a node's Init parameters (replayed after a restart) and the port bound."""
        with self._lock:
            self._db.execute(
                "UPDATE nodes SET init=?, port=? WHERE name=?",
                (json.dumps(init, sort_keys=True), port, name),
            )

    def observe_agent(self, name: str, epoch: int, started_ns: int) -> bool:
        """Record the run of the node's agent seen now; True if it differs from the run
        seen before (the agent restarted), which also counts a restart."""
        text = f"{epoch:016x}"
        with self._lock:
            row = self._db.execute("SELECT agent_epoch FROM nodes WHERE name=?", (name,)).fetchone()
            if row is None:
                raise NotFoundError(f"node: no node named {name!r}")
            if row[0] == text:
                return False
            restarted = row[0] is not None
            self._db.execute(
                "UPDATE nodes SET agent_epoch=?, agent_started_ns=?, restarts=restarts+?"
                " WHERE name=?",
                (text, started_ns, int(restarted), name),
            )
        return restarted

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
        """The session of that name: the live one, else the last one destroyed."""
        with self._lock:
            row = self._db.execute(
                _SELECT_SESSIONS + " WHERE name=? ORDER BY state = 'destroyed', id DESC LIMIT 1",
                (name,),
            ).fetchone()
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
        """Set the state of the live session of that name (a destroyed one keeps its own)."""
        with self._lock:
            self._db.execute(
                "UPDATE sessions SET state=? WHERE name=? AND state != 'destroyed'", (state, name)
            )

    def begin_epoch(
        self, name: str, now_ns: int, *, sender_agent: str | None = None, reason: str = ""
    ) -> int:
        """The live session starts on its sender: in its current epoch if that never
        started (a created session), else in a new one (ids, cursor and counters start
        over). A current epoch still open ends now with ``reason``. Returns the epoch.
        """
        with self._transaction() as db:
            row = db.execute(
                "SELECT id, epoch FROM sessions WHERE name=? AND state != 'destroyed'", (name,)
            ).fetchone()
            if row is None:
                raise NotFoundError(f"session: no session named {name!r}")
            sid, epoch = row
            if db.execute(
                "SELECT 1 FROM epochs WHERE session_id=? AND epoch=?", (sid, epoch)
            ).fetchone():
                _end_epoch(db, sid, epoch, now_ns, reason)
                epoch += 1
                db.execute("UPDATE sessions SET epoch=?, cursor=0 WHERE id=?", (epoch, sid))
            db.execute(
                "INSERT INTO epochs(session_id, epoch, started_ns, sender_agent)"
                " VALUES (?, ?, ?, ?)",
                (sid, epoch, now_ns, sender_agent),
            )
        result: int = epoch
        return result

    def end_epoch(self, name: str, now_ns: int, reason: str) -> None:
        """The live session's current epoch ends (if it is open)."""
        with self._transaction() as db:
            row = db.execute(
                "SELECT id, epoch FROM sessions WHERE name=? AND state != 'destroyed'", (name,)
            ).fetchone()
            if row is not None:
                _end_epoch(db, row[0], row[1], now_ns, reason)

    def stop_epoch(self, name: str, now_ns: int) -> None:
        """A user stopped the live session: its current epoch's schedule ends now."""
        with self._lock:
            self._db.execute(
                "UPDATE epochs SET stopped_ns=? WHERE stopped_ns IS NULL AND (session_id, epoch)"
                " = (SELECT id, epoch FROM sessions WHERE name=? AND state != 'destroyed')",
                (now_ns, name),
            )

    def epochs(self, session_id: int) -> list[EpochRow]:
        """Every epoch of the session that started, oldest first, with its result count."""
        with self._lock:
            rows = self._db.execute(
                "SELECT e.epoch, started_ns, stopped_ns, ended_ns, end_reason, sender_agent,"
                " sent, lost, forward_lost, overflow, seen_ns, skipped, late_ns_total,"
                " late_ns_max, received FROM epochs e WHERE session_id=? ORDER BY e.epoch",
                (session_id,),
            ).fetchall()
        return [EpochRow(*r) for r in rows]

    def live_epochs(self) -> dict[int, list[EpochRow]]:
        """``epochs`` of every session that is not destroyed, by session id (one query)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT e.session_id, e.epoch, started_ns, stopped_ns, ended_ns, end_reason,"
                " sender_agent, e.sent, e.lost, e.forward_lost, e.overflow, seen_ns, skipped,"
                " late_ns_total, late_ns_max, received FROM epochs e JOIN sessions s"
                " ON s.id = e.session_id WHERE s.state != 'destroyed'"
                " ORDER BY e.session_id, e.epoch"
            ).fetchall()
        out: dict[int, list[EpochRow]] = {}
        for r in rows:
            out.setdefault(r[0], []).append(EpochRow(*r[1:]))
        return out

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
        counters: Counters | tuple[int, int, int | None, int] | None = None,
        *,
        epoch: int = 0,
        now_ns: int | None = None,
        unclassified_lost: int | None = None,
        ssid_zero: int | None = None,
    ) -> int:
        """Insert records (agent id, result) and advance the cursor, atomically.

        ``counters`` is the agent's snapshot for this epoch (``Counters``, or its first
        four fields), read at ``now_ns``; the session's totals are the sums over epochs.
        ``unclassified_lost`` and ``ssid_zero``, if given, replace the snapshot's.
        Returns how many rows were new. Raises StaleEpochError, storing nothing, if the
        session is no longer in ``epoch`` (records of the agent's earlier session must not
        land in the new epoch, nor its counters overwrite the new totals) or was
        destroyed.
        """
        c = None if counters is None else Counters(*counters)
        if c is not None and unclassified_lost is not None:
            c = c._replace(unclassified_lost=unclassified_lost)
        if c is not None and ssid_zero is not None:
            c = c._replace(ssid_zero=ssid_zero)
        with self._transaction() as db:
            return _store(db, ResultBatch(session_id, epoch, records, c), now_ns)

    def store_many(
        self, batches: Sequence[ResultBatch], now_ns: int | None = None
    ) -> list[int | None]:
        """``store_results`` for many sessions in one transaction (one commit, not one
        per session). Per batch: how many rows were new, or None for a stale one (its
        session left that epoch or was destroyed), which stores nothing."""
        out: list[int | None] = []
        with self._transaction() as db:
            for b in batches:
                try:
                    out.append(_store(db, b, now_ns))
                except StaleEpochError:
                    out.append(None)
        return out

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

    def records(
        self, session_id: int, *, since_ns: int | None = None, limit: int | None = None
    ) -> list[tuple[int, StampResult]]:
        """Like ``results``, each with its epoch: (epoch, result)."""
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
        return [(r[1], _result(session_id, r)) for r in rows]

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
    return NodeRow(
        r[0], r[1], r[2], bool(r[3]), r[4], r[5], json.loads(r[6]) if r[6] else None,
        r[7], r[8], r[9], r[10],
    )  # fmt: skip


def _store(db: sqlite3.Connection, batch: ResultBatch, now_ns: int | None) -> int:
    """The body of ``Store.store_results`` (in the caller's transaction)."""
    session_id, epoch, records, counters = (
        batch.session_id, batch.epoch, batch.records, batch.counters
    )  # fmt: skip
    _check_epoch(db, session_id, epoch)
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
    before = db.total_changes
    db.executemany(
        # Only a repeated (session, epoch, record id) or (session, epoch, Seq) is
        # skipped: OR IGNORE would also swallow a NOT NULL violation.
        "INSERT INTO results VALUES (?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
        rows,
    )
    new: int = db.total_changes - before
    if rows:
        db.execute(
            "UPDATE sessions SET cursor=MAX(cursor, ?) WHERE id=? AND epoch=?",
            (max(r[2] for r in rows), session_id, epoch),
        )
    if new:
        db.execute(
            "INSERT INTO epochs(session_id, epoch, started_ns, received)"
            " VALUES (?, ?, COALESCE(?, 0), ?) ON CONFLICT(session_id, epoch)"
            " DO UPDATE SET received = received + excluded.received",
            (session_id, epoch, now_ns, new),
        )
    if counters is not None:
        c = counters
        db.execute(
            "INSERT INTO epochs(session_id, epoch, started_ns, sent, lost, forward_lost,"
            " overflow, seen_ns, skipped, late_ns_total, late_ns_max, unclassified_lost,"
            " ssid_zero) VALUES (?, ?, COALESCE(?, 0), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT(session_id, epoch) DO UPDATE SET sent=excluded.sent,"
            " lost=excluded.lost, forward_lost=excluded.forward_lost,"
            " overflow=excluded.overflow, seen_ns=excluded.seen_ns,"
            " skipped=excluded.skipped, late_ns_total=excluded.late_ns_total,"
            " late_ns_max=excluded.late_ns_max, unclassified_lost=excluded.unclassified_lost,"
            " ssid_zero=excluded.ssid_zero",
            (session_id, epoch, now_ns, *c[:4], now_ns, *c[4:]),
        )
        db.execute(
            "UPDATE sessions SET (sent, lost, forward_lost, overflow, unclassified_lost,"
            " ssid_zero) = (SELECT SUM(sent), SUM(lost), SUM(forward_lost), SUM(overflow),"
            " SUM(unclassified_lost), SUM(ssid_zero) FROM epochs WHERE session_id=?)"
            " WHERE id=?",
            (session_id, session_id),
        )
    return new


def _end_epoch(db: sqlite3.Connection, sid: int, epoch: int, now_ns: int, reason: str) -> None:
    db.execute(
        "UPDATE epochs SET ended_ns=?, end_reason=? WHERE session_id=? AND epoch=?"
        " AND ended_ns IS NULL",
        (now_ns, reason, sid, epoch),
    )


def _check_epoch(db: sqlite3.Connection, session_id: int, epoch: int) -> None:
    now = db.execute("SELECT epoch, state FROM sessions WHERE id=?", (session_id,)).fetchone()
    if now is None:
        raise NotFoundError(f"session: no session with id {session_id}")
    if now[1] == "destroyed":
        raise StaleEpochError(f"session {session_id}: results of epoch {epoch}, but destroyed")
    if now[0] != epoch:
        raise StaleEpochError(
            f"session {session_id}: results of epoch {epoch}, but the session is in epoch {now[0]}"
        )


def _check_references(db: sqlite3.Connection) -> None:
    if db.execute("PRAGMA foreign_key_check").fetchone() is not None:
        raise StoreError("store: the migrated file has dangling references")


def _statements(script: str) -> Iterator[str]:
    """The statements of an SQL script, one by one (comments may hold semicolons)."""
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            yield statement
            statement = ""


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in db.execute(f"PRAGMA table_info({table})")}


def _migrate(db: sqlite3.Connection) -> None:
    """Create the schema in a new file, or bring an older file's up to SCHEMA_VERSION."""
    version: int = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"store: schema version {version} is newer than this sixlab's ({SCHEMA_VERSION})"
        )
    existing = db.execute("SELECT 1 FROM sqlite_master WHERE name='nodes'").fetchone()
    # Rebuilding a table drops the one its results refer to: no foreign key checks
    # until the migration is done (the pragma is a no-op inside a transaction).
    db.execute("PRAGMA foreign_keys=OFF")
    db.execute("BEGIN IMMEDIATE")
    try:
        if existing is not None and version < 1:
            _migrate_0_to_1(db)
        # One statement at a time: executescript would commit the transaction first.
        for statement in _statements(SCHEMA):
            db.execute(statement)
        if db.execute("SELECT 1 FROM sqlite_master WHERE name='epochs_v0'").fetchone():
            db.execute(
                "INSERT INTO epochs(session_id, epoch, started_ns, ended_ns, end_reason, sent,"
                " lost, forward_lost, overflow) SELECT id, epoch, created_ns,"
                " CASE WHEN state IN ('finished', 'destroyed') THEN created_ns END,"
                " CASE WHEN state IN ('finished', 'destroyed') THEN state END,"
                " sent, lost, forward_lost, overflow FROM epochs_v0 WHERE state != 'created'"
            )
            db.execute(
                "UPDATE epochs SET received = (SELECT COUNT(*) FROM results r WHERE"
                " r.session_id = epochs.session_id AND r.epoch = epochs.epoch)"
            )
            db.execute("DROP TABLE epochs_v0")
        _check_references(db)
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    finally:
        db.execute("PRAGMA foreign_keys=ON")


def _migrate_0_to_1(db: sqlite3.Connection) -> None:
    """Version 0 (no user_version): nodes without the agent's run and bound port, and
    session names unique even among destroyed sessions (the table is rebuilt: SQLite
    cannot drop a column's constraint)."""
    create = next(
        s for s in _statements(SCHEMA) if "CREATE TABLE IF NOT EXISTS sessions (" in s
    ).replace("IF NOT EXISTS sessions", "sessions_new")
    db.execute(create)
    common = ", ".join(sorted(_columns(db, "sessions") & _columns(db, "sessions_new")))
    # The column names come from the file's own schema, not from any input.
    db.execute(f"INSERT INTO sessions_new({common}) SELECT {common} FROM sessions")  # noqa: S608
    db.execute("DROP TABLE sessions")
    db.execute("ALTER TABLE sessions_new RENAME TO sessions")
    # Version 0 kept no history per epoch: each session gets one row for its current
    # epoch, holding its totals (and ended if the session is).
    db.execute(
        "CREATE TABLE epochs_v0 AS SELECT id, epoch, created_ns, sent, lost, forward_lost,"
        " overflow, state FROM sessions"
    )
    have = _columns(db, "nodes")
    for column, kind in (
        ("port", "INTEGER"),
        ("agent_epoch", "TEXT"),
        ("agent_started_ns", "INTEGER"),
        ("restarts", "INTEGER NOT NULL DEFAULT 0"),
    ):
        if column not in have:
            db.execute(f"ALTER TABLE nodes ADD COLUMN {column} {kind}")


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
