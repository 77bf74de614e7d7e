"""The controller's store: nodes, sessions, results and rollups in SQLite or PostgreSQL.

:class:`Store` is the interface and holds everything the two databases share (one
schema's semantics, one set of portable SQL statements); :class:`SqliteStore` (one file,
WAL mode: the embedded default) and :class:`PostgresStore`
(:mod:`sixlab.controller.pgstore`: a server several controller replicas share) supply
the connection, the schema's DDL, migrations and the bulk insert. :func:`open_store`
picks one from ``--db``: a ``postgresql://`` URL, else a file path.

Exactly-once. Agents number the records of a session from 1 and keep each one until
the controller acknowledges it (``SenderEngine.fetch``). The controller writes a batch
of records and the session's new cursor (the highest id stored) in one transaction, and
asks the agent for "records after the cursor". The cursor is ``epochs.top`` of the
session's current epoch, advanced by the same upsert of the epoch's row that counts its
results and keeps its sender's counters: a batch writes no other row than its results
and that one (a session's totals are the sums over its epochs, read, not stored; the
``sessions`` rows, which carry the JSON parameters, are not rewritten per batch).
Killed between the fetch and the commit,
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

SR performance measurement (docs/srpm.md). A result row also keeps its flow label,
whether it came back in loopback mode, and its direct-measurement counters. A loopback
session has no reflector node: its ``reflector`` column names its sender (the column
must name a node), and its ``params`` say ``loopback``. ``events`` holds every
threshold event raised or cleared (``sixlab.controller.events``).


Bounded storage. Raw results are kept for a retention the operator sets; per-minute
rollups (:mod:`sixlab.controller.rollup`) are kept longer. ``roll_up`` folds the records
stored since its last pass into the rollups, in one transaction with each epoch's rollup
cursor (``epochs.rolled``), so a record is rolled up exactly once; ``expire`` deletes raw
records of rolled-up minutes older than the retention, and rollups older than theirs.

The schema is created, or migrated from an older version, on open.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, Protocol

import numpy as np

from sixlab.controller.errors import ControllerError
from sixlab.controller.events import SessionEvent
from sixlab.controller.rollup import (
    DIRECTIONS,
    MINUTE_NS,
    ROW_COLUMNS,
    DelayHistogram,
    DirectionRollup,
    MinuteRollup,
    fold_columns,
    roll_up_columns,
    saturate,
)
from sixlab.stamp import DataCounters, StampResult
from sixlab.wire.timestamp import ErrorEstimate

__all__ = [
    "CHANGED",
    "DESTROYED",
    "DESTROYING",
    "RESYNC",
    "SCHEMA",
    "SCHEMA_VERSION",
    "AlreadyExistsError",
    "ConcurrentPassError",
    "Counters",
    "DestroyingError",
    "EpochRow",
    "EventRow",
    "Fence",
    "FencedError",
    "InUseError",
    "LeaseState",
    "NodeRow",
    "NotFoundError",
    "NoticeHandler",
    "ReplicaRow",
    "ResultBatch",
    "SessionRow",
    "SqliteStore",
    "StaleEpochError",
    "Storage",
    "Store",
    "StoreError",
    "StoreUnavailableError",
    "open_store",
]

log = logging.getLogger(__name__)

#: Notices a store gives the controllers that share it (``Store.subscribe``), once the
#: change committed: sessions of the sender node (the argument) are to be destroyed ...
DESTROYING = "destroying"
#: ... a session (its id) was destroyed ...
DESTROYED = "destroyed"
#: ... sessions, epochs, events or nodes changed otherwise (not by stored results) ...
CHANGED = "changed"
#: ... notices may have been missed (PostgreSQL: the listening connection was lost;
#: SQLite: the notices were pruned before they were read, or reading them failed).
RESYNC = "resync"
#: Called with a notice's kind and argument, in a thread of the store's (quick, no I/O).
NoticeHandler = Callable[[str, str], None]

#: Set the state of the live session of a name, unless it is being destroyed. The term
#: ``state != 'destroyed'`` is the ``sessions_live_name`` index's own condition: SQLite
#: uses a partial index only when the query's WHERE clause holds that very term (it
#: does not infer it from ``NOT IN`` or ``state = ?``), and without the index each row
#: is a scan of the whole table. Every statement that finds a live session by its name
#: carries the term for that reason.
_SET_STATE = (
    "UPDATE sessions SET state=? WHERE name=? AND state != 'destroyed'"
    " AND state NOT IN ('destroying', 'destroyed')"
)
_INSERT_SESSION = (
    "INSERT INTO sessions(name, ssid, sender, reflector, params, state, created_ns)"
    " VALUES (?, ?, ?, ?, ?, 'created', ?)"
)
#: The SQLite schema (the PostgreSQL one, ``pgstore.SCHEMA``, has the same tables and
#: columns with PostgreSQL's types).
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
    state       TEXT NOT NULL,          -- created, running, ..., destroying, destroyed
    epoch       INTEGER NOT NULL DEFAULT 0,  -- times the session was (re)created on its sender
    created_ns  INTEGER NOT NULL,
    claimed_by  TEXT,                   -- starting: the controller carrying the start out
    restart_reason TEXT                 -- stopping/finished: start afresh once drained (why)
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
    flow_label  INTEGER,                -- the IPv6 flow label it was sent with (ECMP)
    loopback    INTEGER NOT NULL DEFAULT 0,  -- came back with no reflector: T2, T3 are 0
    s_txc       INTEGER,                -- direct measurement (RFC 8972 §4.5): data counters
    r_rxc       INTEGER,
    r_txc       INTEGER,
    s_rxc       INTEGER,
    PRIMARY KEY (session_id, epoch, record_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id  INTEGER NOT NULL REFERENCES sessions(id),
    kind        TEXT NOT NULL,          -- delay, jitter, loss
    state       TEXT NOT NULL CHECK (state IN ('raised', 'cleared')),
    value       REAL NOT NULL,          -- the measure over the window (ms, or a ratio)
    threshold   REAL NOT NULL,
    at_ns       INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS epochs (
    session_id  INTEGER NOT NULL REFERENCES sessions(id),
    epoch       INTEGER NOT NULL,
    started_ns  INTEGER NOT NULL,       -- when the controller started it, Unix ns
    stopped_ns  INTEGER,                -- when a user stopped it (its schedule ended)
    ended_ns    INTEGER,                -- when it ended (NULL: the current epoch, running)
    end_reason  TEXT,                   -- finished, sender-lost, reflector-lost, destroyed,
                                        -- start-interrupted
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
    top         INTEGER NOT NULL DEFAULT 0,  -- highest record id stored: the cursor
    rolled      INTEGER NOT NULL DEFAULT 0,  -- highest record id rolled up (roll_up)
    rolled_seq  INTEGER,                -- highest Seq rolled up (NULL: none yet)
    expired     INTEGER NOT NULL DEFAULT 0,  -- raw records deleted through this id (expire)
    PRIMARY KEY (session_id, epoch)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollups (
    session_id  INTEGER NOT NULL REFERENCES sessions(id),
    epoch       INTEGER NOT NULL,
    minute_ns   INTEGER NOT NULL,       -- start of the minute of T1, Unix ns
    count       INTEGER NOT NULL,       -- results
    lost        INTEGER NOT NULL,       -- Seqs missing before them (rollup.roll_up)
    direct_min INTEGER, direct_mean INTEGER, direct_p50 INTEGER, direct_p99 INTEGER,
    direct_max INTEGER, direct_sum INTEGER, direct_hist BLOB,
    return_min INTEGER, return_mean INTEGER, return_p50 INTEGER, return_p99 INTEGER,
    return_max INTEGER, return_sum INTEGER, return_hist BLOB,
    rtt_min INTEGER, rtt_mean INTEGER, rtt_p50 INTEGER, rtt_p99 INTEGER,
    rtt_max INTEGER, rtt_sum INTEGER, rtt_hist BLOB,
    direct_ipdv_abs INTEGER NOT NULL,   -- RFC 3393 IPDV: sum of |IPDV| and pairs
    direct_ipdv_pairs INTEGER NOT NULL,
    return_ipdv_abs INTEGER NOT NULL,
    return_ipdv_pairs INTEGER NOT NULL,
    max_error_ns INTEGER,
    last_record INTEGER NOT NULL,       -- highest record id in it (raw deletion bound)
    PRIMARY KEY (session_id, epoch, minute_ns)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS replicas (
    id          TEXT PRIMARY KEY,       -- a controller replica (``serve --replica``)
    address     TEXT NOT NULL DEFAULT '',  -- its northbound address, for people
    started_ns  INTEGER NOT NULL,
    expires_ns  INTEGER NOT NULL        -- alive until then (database clock), unless renewed
);
CREATE TABLE IF NOT EXISTS leases (
    name        TEXT PRIMARY KEY,       -- what is owned: a node's name, or "housekeeping"
    grp         TEXT NOT NULL,          -- shared fairly among replicas: sender, reflector, ...
    owner       TEXT,                   -- the replica holding it (NULL: free)
    expires_ns  INTEGER NOT NULL DEFAULT 0,  -- held until then (database clock)
    generation  INTEGER NOT NULL DEFAULT 0   -- times it changed hands
);
CREATE UNIQUE INDEX IF NOT EXISTS results_seq ON results(session_id, epoch, seq);
-- Notices of committed changes for the other stores on this file, the other replicas'
-- processes (``SqliteStore``: SQLite's LISTEN/NOTIFY): the newest ``notices_kept`` rows.
-- Results announce nothing: a row per control-plane change, never per stored result.
CREATE TABLE IF NOT EXISTS notices (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,  -- in commit order, without gaps
    kind        TEXT NOT NULL,          -- changed, destroying, destroyed
    arg         TEXT NOT NULL,          -- destroying: the sender node; destroyed: the session id
    at_ns       INTEGER NOT NULL,       -- when it was written, Unix ns (for people)
    origin      TEXT NOT NULL           -- the store that wrote it (told its own at once)
);
CREATE INDEX IF NOT EXISTS rollups_minute ON rollups(minute_ns);
CREATE INDEX IF NOT EXISTS sessions_sender ON sessions(sender);
CREATE INDEX IF NOT EXISTS sessions_reflector ON sessions(reflector);
-- One live session per name; destroyed ones keep theirs (and their results).
CREATE UNIQUE INDEX IF NOT EXISTS sessions_live_name ON sessions(name) WHERE state != 'destroyed';
-- A name's sessions, destroyed ones too (Store.session: the live one, else the last).
CREATE INDEX IF NOT EXISTS sessions_name ON sessions(name);
-- A session's events (Store.raised, event_counts, events of one session).
CREATE INDEX IF NOT EXISTS events_session ON events(session_id, id);
-- What every supervisor round and housekeeping pass reads (docs/architecture.md,
-- "Indexes for the passes"): a node's live sessions, not its destroyed history (a query
-- uses these only with ``state != 'destroyed'`` among its terms), a sender's in one
-- state, those pending a restart, the epochs not yet rolled up and not yet expired
-- (unique: SQLite then keeps their order for the records joined to them).
CREATE INDEX IF NOT EXISTS sessions_sender_live ON sessions(sender) WHERE state != 'destroyed';
CREATE INDEX IF NOT EXISTS sessions_sender_state ON sessions(sender, state)
    WHERE state != 'destroyed';
CREATE INDEX IF NOT EXISTS sessions_reflector_live ON sessions(reflector)
    WHERE state != 'destroyed';
CREATE INDEX IF NOT EXISTS sessions_restart ON sessions(state) WHERE restart_reason IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS epochs_unrolled ON epochs(session_id, epoch) WHERE rolled < top;
CREATE UNIQUE INDEX IF NOT EXISTS epochs_unexpired ON epochs(session_id, epoch)
    WHERE expired < rolled;
"""

#: The schema version this code writes (SQLite: ``PRAGMA user_version``; PostgreSQL:
#: the ``schema_version`` table); older databases are migrated on open. Version 8 added
#: SQLite's ``notices`` table (nothing on PostgreSQL, whose notices are NOTIFY's).
SCHEMA_VERSION = 8


#: Row queries, with the columns in the order of SessionRow's and NodeRow's fields. A
#: session's cursor is the ``top`` of its current epoch's row (0 before it has one), its
#: totals the sums over its epochs' counters: read, never stored, so that a batch of
#: results writes its epoch's row alone (docs/architecture.md, "The store"). The seven
#: are read in one pass over the session's epochs (``e``), not a subquery each (seven
#: index searches per session: docs/architecture.md, "Reading sessions").
def _session_totals(total: str) -> tuple[str, ...]:
    """The seven values of a session row read from its epochs (``e``), as aggregates:
    the cursor, then the totals, each epoch sum written as ``total`` (a template of its
    column, ``{}``: the sum saturated at 2^63 − 1, NULL for no value, as ``SUM``)."""

    def summed(column: str, *, zero: bool = True) -> str:
        value = total.format(f"e.{column}")
        return f"COALESCE({value}, 0)" if zero else value

    return (
        "COALESCE(MAX(CASE WHEN e.epoch = sessions.epoch THEN e.top END), 0)",
        summed("sent"), summed("lost"), summed("forward_lost", zero=False),
        summed("overflow"), summed("unclassified_lost", zero=False), summed("ssid_zero"),
    )  # fmt: skip


def _sessions_query(totals: Sequence[str], joined: str) -> str:
    """The session rows' SELECT: ``sessions``' columns and the seven ``totals`` in
    SessionRow's order, from ``sessions`` and what ``joined`` joins to it."""
    t = list(totals)
    return (
        "SELECT sessions.id, sessions.name, sessions.ssid, sessions.sender,"  # noqa: S608
        " sessions.reflector, sessions.params, sessions.state, sessions.epoch, "
        + ", ".join(t[:5]) + ", sessions.created_ns, " + ", ".join(t[5:])
        + " FROM sessions" + joined
    )  # fmt: skip


_SELECT_NODES = (
    "SELECT name, address, role, healthy, last_seen, last_error, init, port, agent_epoch,"
    " agent_started_ns, restarts FROM nodes"
)
#: The tables whose rows belong to a session (``session_id REFERENCES sessions``): what
#: ``remove_node(prune=True)`` deletes with the sessions of the node.
_SESSION_TABLES = ("results", "epochs", "events", "rollups")
#: The columns of ``results``, in the order of ``_result_row``.
RESULT_COLUMNS = (
    "session_id", "epoch", "record_id", "seq", "t1_ns", "t2_ns", "t3_ns", "t4_ns",
    "sender_ee", "reflector_ee", "ttl", "reflector_seq",
    "flow_label", "loopback", "s_txc", "r_rxc", "r_txc", "s_rxc",
)  # fmt: skip
# Statements built from the column tuples above hold no input (no injection: S608).
_SELECT_RESULTS = "SELECT " + ", ".join(RESULT_COLUMNS) + " FROM results"  # noqa: S608
_INSERT_RESULTS = (
    "INSERT INTO results(" + ", ".join(RESULT_COLUMNS) + ") VALUES ("  # noqa: S608
    + ",".join("?" * len(RESULT_COLUMNS)) + ")"
)  # fmt: skip
#: ``_INSERT_RESULTS`` skipping a row whose keys are stored (only a key's conflict).
_INSERT_RESULTS_NEW = _INSERT_RESULTS + " ON CONFLICT DO NOTHING"
#: The columns of ``rollups``, in the order of ``_rollup_row`` (and ``Fold.rows``).
ROLLUP_COLUMNS = ROW_COLUMNS
_SELECT_ROLLUPS = "SELECT " + ", ".join(ROLLUP_COLUMNS) + " FROM rollups"  # noqa: S608


class StoreError(ControllerError):
    """A request the store refuses; the message names the field."""


class _RowsRepeated(Exception):  # noqa: N818 - a signal within the store, not an error
    """Some result rows were stored already, and the fast insert cannot say whose: the
    transaction is run again, counting each session's new rows (``_store_retrying``)."""


class NotFoundError(StoreError):
    """No node or session of that name."""


class AlreadyExistsError(StoreError):
    """A node or session of that name exists already."""


class InUseError(StoreError):
    """The node still carries a session that is not destroyed."""


class StoreUnavailableError(StoreError):
    """The database could not be reached, or dropped the connection (PostgreSQL), or
    another process held the SQLite file's writer lock past the time limit."""


class _OutagesInOneLine(logging.Filter):
    """A filter for the loggers of loops that carry on after a failure (``log.exception``
    in an ``except Exception``): a record of the database out of reach
    (``StoreUnavailableError``) becomes one warning line naming it, without the
    traceback. An outage is the operator's to see, each round while it lasts, not a
    bug to debug; any other exception keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, StoreUnavailableError):
            record.msg = f"{record.getMessage()}: the database is out of reach: {exc}"
            record.args = None
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


#: Add to a logger (``log.addFilter(OUTAGES_IN_ONE_LINE)``): see ``_OutagesInOneLine``.
OUTAGES_IN_ONE_LINE = _OutagesInOneLine()


class FencedError(StoreError):
    """The replica's lease of the node changed hands since it was given its ``Fence``:
    it must not store that node's results (another replica collects them now)."""


class DestroyingError(StoreError):
    """The session is being destroyed: it cannot begin an epoch."""


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
    #: The records as ``results`` rows already (``RESULT_COLUMNS`` order, this batch's
    #: session and epoch), given instead of ``records``: a collector builds them
    #: straight from the API's records (``Controller``), with no ``StampResult`` each.
    rows: Sequence[tuple[Any, ...]] | None = None
    #: The highest id of the session's records read but not given (refused as out of
    #: range by the collector; 0: none): the cursor moves past it all the same.
    top: int = 0

    def result_rows(self) -> Sequence[tuple[Any, ...]]:
        """The batch's ``results`` rows."""
        if self.rows is not None:
            return self.rows
        sid, epoch = self.session_id, self.epoch
        return [_result_row(sid, epoch, rid, r) for rid, r in self.records]


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
    #: The highest record id stored for this epoch (``live_epochs`` only; 0 elsewhere).
    top: int = 0


@dataclass(frozen=True, slots=True)
class EventRow:
    """A threshold event of a session (``sixlab.controller.events``)."""

    id: int
    session: str
    kind: str
    state: str
    value: float
    threshold: float
    at_ns: int


@dataclass(frozen=True, slots=True)
class LeaseState:
    """What a replica holds after a heartbeat (``Store.lease_tick``)."""

    #: The database's clock at the heartbeat, Unix ns.
    now_ns: int
    #: Replicas alive, this one included.
    live: int
    owned: frozenset[str]
    #: Held beyond the fair share: to let go of, then ``release``.
    surplus: frozenset[str]
    #: The generation of each lease held (times it changed hands): its fencing token.
    generations: Mapping[str, int] = field(default_factory=dict)


class Fence(NamedTuple):
    """A fencing token: the right of ``replica`` to store the results of a node while
    it holds the node's lease in the ``generation`` it was given (``LeaseState``).

    A store that carries one checks it in the storing transaction, on the lease's row
    (locked shared on PostgreSQL, so that a claim waits for the transaction and the
    claimer then reads the cursors it committed): a replica paused or cut off past its
    lease while another took the node over stores nothing, even before it notices.
    """

    lease: str
    replica: str
    generation: int


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    id: str
    address: str
    started_ns: int
    expires_ns: int


@dataclass(frozen=True, slots=True)
class Storage:
    """What the store holds and the space it takes (``Store.storage``)."""

    results: int
    rollups: int
    #: Bytes of each table with its indexes, by table name.
    table_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def bytes_per_result(self) -> float | None:
        """Bytes of the results table and its indexes per stored result."""
        return self.table_bytes.get("results", 0) / self.results if self.results else None


class _Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class _Db(Protocol):
    """The part of a DB-API connection the shared code uses (``?`` placeholders)."""

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> _Cursor: ...
    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> _Cursor: ...


def open_store(db: str | Path) -> Store:
    """The store ``--db`` names: a ``postgresql://`` (or ``postgres://``) URL, else a
    SQLite file."""
    text = str(db)
    if text.startswith(("postgresql://", "postgres://")):
        from sixlab.controller.pgstore import PostgresStore  # noqa: PLC0415 - psycopg on demand

        return PostgresStore(text)
    return SqliteStore(text)


class Store(ABC):
    """Nodes, sessions, epochs, results and rollups; thread-safe (one connection, serialised).

    Subclasses provide ``_db`` (a connection taking ``?`` placeholders), the write
    transaction, the bulk insert of results, constraint classification and ``storage``.
    """

    #: What ``--db`` names this store by (a path or a URL without its password).
    path: str
    #: Held around each statement outside a transaction (SQLite: the one connection's
    #: lock; PostgreSQL: lends the thread a pooled connection).
    _lock: contextlib.AbstractContextManager[Any]
    #: Appended to the query that reads the epochs of the sessions a batch stores for:
    #: PostgreSQL locks their rows (SQLite's write transaction excludes every other).
    _row_lock_sql: ClassVar[str] = ""
    #: Appended to a SELECT to lock its rows against updates but not other readers.
    _share_lock_sql: ClassVar[str] = ""
    #: The driver's integrity error class(es), caught around inserts.
    _integrity_errors: ClassVar[tuple[type[Exception], ...]]
    #: An SQL expression of the database's clock, Unix ns (leases use it, so that
    #: replicas on different hosts need not agree on the time).
    _now_sql: ClassVar[str]
    #: The session rows' query (``_sessions_query``) and what follows its WHERE clause.
    #: Their totals are sums over the epochs, each of which may be a counter saturated
    #: at 2^63 − 1 (``core._counters``): summed without failing, saturated again.
    _sessions_sql: ClassVar[str]
    _sessions_group: ClassVar[str] = ""

    def __init__(self) -> None:
        self._handlers: list[NoticeHandler] = []

    @property
    @abstractmethod
    def _db(self) -> _Db:
        """The connection of the current ``_lock`` block or transaction."""

    # -- notices ------------------------------------------------------------------------

    def subscribe(self, handler: NoticeHandler) -> None:
        """Be told of changes once committed (``DESTROYING``, ``DESTROYED``, ``CHANGED``,
        ``RESYNC``): those made through this store at once, and those of the other
        replicas too: on PostgreSQL by LISTEN/NOTIFY, on an SQLite file by its
        ``notices`` table (``SqliteStore``), within a fraction of a second. Stored
        results give no notice (a notice is a control-plane change). A notice is a hint
        to look now rather than at the next round: one may be lost (a connection
        dropped, a process killed between a commit and its notice), so whoever waits on
        one polls as well, more slowly; ``RESYNC`` says some may have been."""
        self._handlers.append(handler)
        self._listen()

    def unsubscribe(self, handler: NoticeHandler) -> None:
        """Be told no more (a closed controller)."""
        with contextlib.suppress(ValueError):
            self._handlers.remove(handler)

    def _listen(self) -> None:  # noqa: B027 - a database in memory: nothing to hear
        """Start hearing the notices of the other replicas (their stores)."""

    def _announce(self, kind: str, arg: str = "") -> None:
        """Give a notice of a committed change (call after the transaction)."""
        self._deliver(kind, arg)

    def _deliver(self, kind: str, arg: str) -> None:
        for handler in list(self._handlers):
            try:
                handler(kind, arg)
            except Exception:  # a subscriber's bug must not fail the store's caller
                log.exception("store: a notice handler failed on %s %s", kind, arg)

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def _transaction(self) -> contextlib.AbstractContextManager[_Db]:
        """The connection inside one write transaction: committed, or rolled back on error
        (the caller holds no lock; the context takes the store's)."""

    @abstractmethod
    def _constraint(self, exc: Exception) -> str:
        """Which constraint an integrity error broke: ``unique``, ``foreign`` or ``other``."""

    @abstractmethod
    def _insert_results(
        self,
        db: _Db,
        rows: list[tuple[Any, ...]],
        counts: dict[tuple[int, int], int],
        careful: bool,
    ) -> dict[tuple[int, int], int]:
        """Insert result rows (``RESULT_COLUMNS``), skipping any whose (session, epoch,
        record id) or (session, epoch, Seq) is stored; inside the caller's transaction.
        ``counts``: the rows of each (session, epoch). Returns how many were new per
        (session, epoch).

        A store may take a fast path that cannot count a group's new rows when some are
        repeats: it then raises ``_RowsRepeated``, the caller rolls the transaction back
        and runs it again with ``careful``, when the store counts them group by group."""

    @abstractmethod
    def storage(self) -> Storage:
        """Row counts and bytes per table (results with their indexes, rollups, ...)."""

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
            except self._integrity_errors:
                raise AlreadyExistsError(f"name: node {name!r} already exists") from None
        self._announce(CHANGED)

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

    def update_node(self, name: str, address: str, role: str) -> None:
        """Change a node's address and role (its Init parameters are forgotten)."""
        with self._lock:
            self._db.execute(
                "UPDATE nodes SET address=?, role=?, init=NULL, healthy=0 WHERE name=?",
                (address, role, name),
            )
        self._announce(CHANGED)

    def has_history(self, name: str) -> bool:
        """Whether any session, destroyed ones included, ran on the node."""
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM sessions WHERE sender=? OR reflector=? LIMIT 1", (name, name)
            ).fetchone()
        return row is not None

    def observe_agent(self, name: str, epoch: int, started_ns: int) -> bool:
        """Record the run of the node's agent seen now; True if it differs from the run
        seen before (the agent restarted), which also counts a restart."""
        text = f"{epoch:016x}"
        with self._lock:  # the same run as last time (nearly always): no write
            row = self._db.execute("SELECT agent_epoch FROM nodes WHERE name=?", (name,)).fetchone()
        if row is not None and row[0] == text:
            return False
        with self._transaction() as db:
            row = db.execute("SELECT agent_epoch FROM nodes WHERE name=?", (name,)).fetchone()
            if row is None:
                raise NotFoundError(f"node: no node named {name!r}")
            if row[0] == text:
                return False
            restarted = row[0] is not None
            db.execute(
                "UPDATE nodes SET agent_epoch=?, agent_started_ns=?, restarts=restarts+?"
                " WHERE name=?",
                (text, started_ns, int(restarted), name),
            )
        self._announce(CHANGED)
        return restarted

    def remove_node(self, name: str, *, prune: bool = False) -> None:
        """Forget a node that carries no live session.

        Destroyed sessions that ran on it keep their results, epochs, events and
        rollups, which name the node: without ``prune`` such a node is refused
        (:class:`InUseError` naming those sessions); with it, that history goes too,
        in the same transaction.
        """
        with self._transaction() as db:
            busy = db.execute(
                "SELECT name FROM sessions WHERE (sender=? OR reflector=?) AND state!='destroyed'",
                (name, name),
            ).fetchone()
            if busy:
                raise InUseError(f"node: {name!r} still carries session {busy[0]!r}")
            ran = [
                r[0]
                for r in db.execute(
                    "SELECT name FROM sessions WHERE sender=? OR reflector=? ORDER BY id",
                    (name, name),
                ).fetchall()
            ]
            if ran and not prune:
                raise InUseError(
                    f"node: {name!r} is named by the stored history of destroyed "
                    f"session{'s' * (len(ran) > 1)} {_listing(ran)}; prune removes that "
                    "history with the node"
                )
            if ran:
                # The sessions' rows are locked first (PostgreSQL), as a transaction
                # storing their results locks them first: a store that came first
                # commits before the rows go (and its results go with them); one that
                # comes later finds no row and stores nothing (``_store``), rather
                # than inserting results for a row being deleted.
                db.execute(
                    "SELECT id FROM sessions WHERE sender=? OR reflector=? ORDER BY id"  # noqa: S608
                    + self._row_lock_sql,
                    (name, name),
                ).fetchall()
                of_node = "SELECT id FROM sessions WHERE sender=? OR reflector=?"
                for table in _SESSION_TABLES:
                    db.execute(
                        f"DELETE FROM {table} WHERE session_id IN ({of_node})",  # noqa: S608
                        (name, name),
                    )
                db.execute("DELETE FROM sessions WHERE sender=? OR reflector=?", (name, name))
            if not db.execute("DELETE FROM nodes WHERE name=?", (name,)).rowcount:
                raise NotFoundError(f"node: no node named {name!r}")
        self._announce(CHANGED)

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
                    _INSERT_SESSION,
                    (name, ssid, sender, reflector, json.dumps(params, sort_keys=True), now_ns),
                )
            except self._integrity_errors as exc:
                # The schema's two constraints: a live session's name is unique, and a
                # sender/reflector REFERENCES a node.
                if self._constraint(exc) == "unique":
                    raise AlreadyExistsError(f"name: session {name!r} already exists") from None
                raise NotFoundError("sender/reflector: unknown node") from None
        self._announce(CHANGED)
        return self.session(name)

    def add_sessions(
        self,
        items: Sequence[tuple[str, int, str, str, dict[str, Any]]],
        *,
        now_ns: int,
    ) -> list[SessionRow]:
        """``add_session`` for many (name, ssid, sender, reflector, params), in one
        transaction: all are added, or none (an error names the first refused)."""
        if not items:
            return []
        if not all(item[0] for item in items):
            raise StoreError("name: a session needs a name")
        rows = [
            (name, ssid, sender, reflector, json.dumps(params, sort_keys=True), now_ns)
            for name, ssid, sender, reflector, params in items
        ]
        with self._transaction() as db:
            # One statement for all rows (PostgreSQL pipelines it: a round trip per
            # batch, not per session), in a savepoint: if one is refused, the rows go
            # in again one by one to name the first refused.
            db.execute("SAVEPOINT sessions_in")
            try:
                db.executemany(_INSERT_SESSION, rows)
            except self._integrity_errors:
                db.execute("ROLLBACK TO SAVEPOINT sessions_in")
                for row in rows:
                    try:
                        db.execute(_INSERT_SESSION, row)
                    except self._integrity_errors as exc:
                        if self._constraint(exc) == "unique":
                            raise AlreadyExistsError(
                                f"name: session {row[0]!r} already exists"
                            ) from None
                        raise NotFoundError("sender/reflector: unknown node") from None
            db.execute("RELEASE SAVEPOINT sessions_in")
        self._announce(CHANGED)
        by_name = {r.name: r for r in self.sessions_named([i[0] for i in items])}
        return [by_name[i[0]] for i in items]

    def _select_sessions(self, where: str = "", tail: str = "") -> str:
        """The session rows' query: ``where`` (terms on ``sessions``' columns) chooses
        the rows, ``tail`` orders them (``ORDER BY``, ``LIMIT``)."""
        return (
            self._sessions_sql + (f" WHERE {where}" if where else "")
            + self._sessions_group + (f" {tail}" if tail else "")
        )  # fmt: skip

    def sessions_named(self, names: Sequence[str]) -> list[SessionRow]:
        """The live sessions of these names (those that exist), in chunks of 500."""
        out: list[SessionRow] = []
        for i in range(0, len(names), 500):
            chunk = list(names[i : i + 500])
            with self._lock:
                rows = self._db.execute(
                    self._select_sessions(
                        "state != 'destroyed' AND name IN (" + ",".join("?" * len(chunk)) + ")"
                    ),
                    chunk,
                ).fetchall()  # fmt: skip
            out += [_session_row(r) for r in rows]
        return out

    def live_names(self, names: Sequence[str]) -> set[str]:
        """Which of these names a live session has."""
        return {r.name for r in self.sessions_named(names)}

    def set_states(self, names: Sequence[str], state: str) -> None:
        """``set_state`` for many sessions, in one transaction."""
        if names:
            with self._transaction() as db:
                db.executemany(_SET_STATE, [(state, n) for n in names])
            self._announce(CHANGED)

    def begin_epochs(
        self,
        items: Sequence[tuple[str, str | None]],
        now_ns: int,
        *,
        claimer: str | None = None,
    ) -> set[str]:
        """``begin_epoch`` for many created sessions (name, sender agent), in one
        transaction. Returns the names begun: a session destroyed or being destroyed
        meanwhile (through any replica) is left out, not a failure of the others.

        ``claimer``: each session is claimed first, ``created`` → ``starting`` by that
        controller (as ``claim_state``), and begun only if the claim succeeds: a session
        another replica started (or is starting) meanwhile is left out too, its epoch
        left alone."""
        begun: set[str] = set()
        if not items:
            return begun
        with self._transaction() as db:
            if claimer is not None:
                agents = dict(items)
                claimed = _claim_created(db, list(agents), claimer)
                # The claimed sessions' epochs begin together: those whose current
                # epoch has a row (a start that failed before) end it and take the
                # next one, as ``begin_epoch`` does; the rest begin theirs as they are.
                ids = [sid for sid, _ in claimed.values()]
                again: set[int] = set()
                for i in range(0, len(ids), 500):
                    chunk = ids[i : i + 500]
                    again.update(r[0] for r in db.execute(
                        "SELECT e.session_id FROM epochs e JOIN sessions s ON s.id = e.session_id"  # noqa: S608
                        " AND s.epoch = e.epoch WHERE s.id IN (" + ",".join("?" * len(chunk))
                        + ")",
                        chunk,
                    ).fetchall())  # fmt: skip
                fresh = [(name, sid) for name, (sid, _) in claimed.items() if sid not in again]
                db.executemany(
                    "INSERT INTO epochs(session_id, epoch, started_ns, sender_agent)"
                    " VALUES (?, ?, ?, ?)",
                    [(sid, claimed[name][1], now_ns, agents[name]) for name, sid in fresh],
                )
                begun.update(name for name, _ in fresh)
                items = [(name, agents[name]) for name, (sid, _) in claimed.items() if sid in again]
            for name, agent in items:
                try:
                    _begin_epoch(db, name, now_ns, agent, "")
                except (NotFoundError, DestroyingError):
                    continue
                begun.add(name)
        self._announce(CHANGED)
        return begun

    def session(self, name: str) -> SessionRow:
        """The session of that name: the live one, else the last one destroyed."""
        with self._lock:
            row = self._db.execute(
                self._select_sessions("name=?", "ORDER BY state = 'destroyed', id DESC LIMIT 1"),
                (name,),
            ).fetchone()
        if row is None:
            raise NotFoundError(f"session: no session named {name!r}")
        return _session_row(row)

    def sessions(self, *, include_destroyed: bool = False) -> list[SessionRow]:
        query = self._select_sessions(
            "" if include_destroyed else "state != 'destroyed'", "ORDER BY id"
        )
        with self._lock:
            rows = self._db.execute(query).fetchall()
        return [_session_row(r) for r in rows]

    def set_state(self, name: str, state: str) -> None:
        """Set the state of the live session of that name; one being destroyed keeps its
        state until ``finish_destroy`` (a destroyed one keeps its own)."""
        with self._lock:
            self._db.execute(_SET_STATE, (state, name))
        self._announce(CHANGED)

    def claim_state(
        self,
        name: str,
        old: str,
        new: str,
        *,
        claimer: str | None = None,
        holder: str | None = None,
        restart: bool = False,
    ) -> bool:
        """Move the live session of that name from ``old`` to ``new`` if it is still in
        ``old`` (one replica wins a race between requests of several); True if moved.

        ``claimer`` is recorded as who carries the new state out (a ``starting`` row's
        controller, ``starting``); ``holder``: only if the row's claimer is that one (a
        start another controller took over is no longer this one's); ``restart``: only
        if a restart after a drain is pending (``mark_restart``). A pending restart is
        cleared either way."""
        sql = (
            "UPDATE sessions SET state=?, claimed_by=?, restart_reason=NULL"
            " WHERE name=? AND state != 'destroyed' AND state=?"
        )  # the first term of the live-name index's, so that it is used (_SET_STATE)
        params: list[Any] = [new, claimer, name, old]
        if holder is not None:
            sql += " AND claimed_by=?"
            params.append(holder)
        if restart:
            sql += " AND restart_reason IS NOT NULL"
        with self._lock:
            moved: int = self._db.execute(sql, params).rowcount
        if moved:
            self._announce(CHANGED)
        return moved == 1

    def claim_states(self, names: Sequence[str], old: str, new: str, *, holder: str) -> set[str]:
        """``claim_state`` with ``holder`` for many sessions, in one transaction: those
        of these names still in ``old`` claimed by ``holder`` move to ``new`` (the
        claim cleared). Returns the names moved."""
        moved: set[str] = set()
        if not names:
            return moved
        with self._transaction() as db:
            for i in range(0, len(names), 500):
                chunk = list(names[i : i + 500])
                rows = db.execute(
                    "UPDATE sessions SET state=?, claimed_by=NULL, restart_reason=NULL"  # noqa: S608
                    " WHERE state != 'destroyed' AND state=? AND claimed_by=? AND name IN ("
                    + ",".join("?" * len(chunk)) + ") RETURNING name",
                    [new, old, holder, *chunk],
                ).fetchall()  # fmt: skip
                moved.update(r[0] for r in rows)
        if moved:
            self._announce(CHANGED)
        return moved

    def starting(self, sender: str) -> list[tuple[str, str | None]]:
        """(name, claimer) of this sender node's sessions in the ``starting`` state."""
        with self._lock:
            rows = self._db.execute(
                "SELECT name, claimed_by FROM sessions WHERE sender=? AND state != 'destroyed'"
                " AND state='starting'"
                " ORDER BY id",
                (sender,),
            ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def take_over_start(self, name: str, dead: str | None, claimer: str | None) -> bool:
        """Hand a ``starting`` session claimed by ``dead`` to ``claimer`` (None: to
        whoever finds it next); True if it was still ``dead``'s."""
        with self._lock:
            moved: int = self._db.execute(
                "UPDATE sessions SET claimed_by=? WHERE name=? AND state != 'destroyed'"
                " AND state='starting' AND COALESCE(claimed_by, '')=?",
                (claimer, name, dead or ""),
            ).rowcount
        return moved == 1

    def mark_restart(self, name: str, reason: str) -> bool:
        """A running session is to drain and then start afresh in a new epoch (its
        current one ends with ``reason``): it moves to ``stopping`` with the restart
        pending, which any owner of its sender carries out; True if it was running."""
        with self._lock:
            moved: int = self._db.execute(
                "UPDATE sessions SET state='stopping', restart_reason=? WHERE name=?"
                " AND state != 'destroyed' AND state='running'",
                (reason, name),
            ).rowcount
        if moved:
            self._announce(CHANGED)
        return moved == 1

    def cancel_restart(self, name: str) -> bool:
        """A stop of a session draining to be restarted: it just finishes; True if a
        restart was pending."""
        with self._lock:
            moved: int = self._db.execute(
                "UPDATE sessions SET restart_reason=NULL WHERE name=? AND state != 'destroyed'"
                " AND restart_reason IS NOT NULL AND state IN ('stopping', 'finished')",
                (name,),
            ).rowcount
        return moved == 1

    def restart_reason(self, name: str) -> str | None:
        """Why the live session's epoch ends, if it drains to be restarted (else None)."""
        with self._lock:
            row = self._db.execute(
                "SELECT restart_reason FROM sessions WHERE name=? AND state != 'destroyed'",
                (name,),
            ).fetchone()
        return None if row is None else row[0]

    def restarts(self) -> list[tuple[str, str, str, str]]:
        """(name, sender, state, reason) of the live sessions with a restart pending."""
        with self._lock:
            rows = self._db.execute(
                "SELECT name, sender, state, restart_reason FROM sessions WHERE restart_reason"
                " IS NOT NULL AND state IN ('stopping', 'finished') ORDER BY id"
            ).fetchall()
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def mark_destroying(self, names: Sequence[str]) -> list[SessionRow]:
        """Record that the live sessions of these names are to be destroyed (any replica
        may; the owner of each one's sender carries it out: ``finish_destroy``), in one
        transaction. Returns their rows, now ``destroying`` (names without a live
        session are left out)."""
        if names:
            with self._transaction() as db:
                db.executemany(
                    "UPDATE sessions SET state='destroying' WHERE name=? AND state != 'destroyed'",
                    [(n,) for n in names],
                )
        rows = self.sessions_named(names)
        for sender in sorted({r.sender for r in rows if r.state == "destroying"}):
            self._announce(DESTROYING, sender)
        if rows:
            self._announce(CHANGED)
        return rows

    def finish_destroy(self, session_id: int, now_ns: int) -> bool:
        """The session being destroyed is gone from its agents: its current epoch ends
        and it is destroyed, in one transaction. False if it was not being destroyed."""
        with self._transaction() as db:
            row = db.execute(
                "SELECT epoch FROM sessions WHERE id=? AND state='destroying'"  # noqa: S608
                + self._row_lock_sql,
                (session_id,),
            ).fetchone()
            if row is None:
                return False
            _end_epoch(db, session_id, row[0], now_ns, "destroyed")
            db.execute("UPDATE sessions SET state='destroyed' WHERE id=?", (session_id,))
        self._announce(DESTROYED, str(session_id))
        self._announce(CHANGED)
        return True

    def stopping(self, sender: str) -> list[tuple[str, int]]:
        """(name, epoch) of the sessions of this sender node that are ``stopping``."""
        with self._lock:
            rows = self._db.execute(
                "SELECT name, epoch FROM sessions WHERE sender=? AND state != 'destroyed'"
                " AND state='stopping' ORDER BY id",
                (sender,),
            ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def destroying(self, sender: str) -> list[str]:
        """Names of the sessions of this sender node being destroyed, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT name FROM sessions WHERE sender=? AND state != 'destroyed'"
                " AND state='destroying' ORDER BY id",
                (sender,),
            ).fetchall()
        return [r[0] for r in rows]

    def states(self, session_ids: Collection[int]) -> dict[int, str]:
        """The state of each of these sessions (by id; those that exist)."""
        out: dict[int, str] = {}
        ids = sorted(session_ids)
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            with self._lock:
                rows = self._db.execute(
                    "SELECT id, state FROM sessions WHERE id IN ("  # noqa: S608 - placeholders
                    + ",".join("?" * len(chunk)) + ")",
                    chunk,
                ).fetchall()  # fmt: skip
            out.update((r[0], r[1]) for r in rows)
        return out

    def begin_epoch(
        self,
        name: str,
        now_ns: int,
        *,
        sender_agent: str | None = None,
        reason: str = "",
        claimer: str | None = None,
    ) -> int:
        """The live session starts on its sender: in its current epoch if that never
        started (a created session), else in a new one (ids, cursor and counters start
        over). A current epoch still open ends now with ``reason``. Returns the epoch.
        ``claimer``: only if the session is ``starting`` claimed by it (``claim_state``).
        """
        with self._transaction() as db:
            if (
                claimer is not None
                and not db.execute(
                    # An update, not a read: it holds the row until commit, so that a take
                    # over (``take_over_start``) comes before this or after the epoch began.
                    "UPDATE sessions SET claimed_by=claimed_by WHERE name=?"
                    " AND state != 'destroyed' AND state='starting' AND claimed_by=?",
                    (name, claimer),
                ).rowcount
            ):
                raise StoreError(f"session: {name!r} is not being started by {claimer}")
            epoch = _begin_epoch(db, name, now_ns, sender_agent, reason)
        self._announce(CHANGED)
        return epoch

    def end_epoch(self, name: str, now_ns: int, reason: str) -> None:
        """The live session's current epoch ends (if it is open)."""
        with self._transaction() as db:
            row = db.execute(
                "SELECT id, epoch FROM sessions WHERE name=? AND state != 'destroyed'", (name,)
            ).fetchone()
            if row is not None:
                _end_epoch(db, row[0], row[1], now_ns, reason)
        self._announce(CHANGED)

    def stop_epoch(self, name: str, now_ns: int) -> None:
        """A user stopped the live session: its current epoch's schedule ends now."""
        with self._lock:
            self._db.execute(
                "UPDATE epochs SET stopped_ns=? WHERE stopped_ns IS NULL AND (session_id, epoch)"
                " = (SELECT id, epoch FROM sessions WHERE name=? AND state != 'destroyed')",
                (now_ns, name),
            )
        self._announce(CHANGED)

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
                " late_ns_total, late_ns_max, received, top FROM epochs e JOIN sessions s"
                " ON s.id = e.session_id WHERE s.state != 'destroyed'"
                " ORDER BY e.session_id, e.epoch"
            ).fetchall()
        out: dict[int, list[EpochRow]] = {}
        for r in rows:
            out.setdefault(r[0], []).append(EpochRow(*r[1:]))
        return out

    def sessions_of(self, node: str, *, role: str = "sender") -> list[SessionRow]:
        """The live (not destroyed) sessions whose sender (or, with ``role="reflector"``,
        reflector) is this node, oldest first."""
        column = "reflector" if role == "reflector" else "sender"
        with self._lock:
            rows = self._db.execute(
                self._select_sessions(f"{column}=? AND state != 'destroyed'", "ORDER BY id"),
                (node,),
            ).fetchall()
        return [_session_row(r) for r in rows]

    def ssids_of(self, node: str, *, role: str = "sender") -> list[tuple[int, str]]:
        """(SSID, state) of the live sessions of this sender (or reflector) node."""
        column = "reflector" if role == "reflector" else "sender"
        with self._lock:
            rows = self._db.execute(
                f"SELECT ssid, state FROM sessions WHERE {column}=? AND state != 'destroyed'",  # noqa: S608
                (node,),
            ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def collectable(self, sender: str) -> list[str]:
        """Names of the sessions whose results are to be collected from this sender node
        (running or stopping), oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT name FROM sessions WHERE sender=? AND state != 'destroyed'"
                " AND state IN ('running', 'stopping') ORDER BY id",
                (sender,),
            ).fetchall()
        return [r[0] for r in rows]

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
        # A list: a second, careful run (``_store_retrying``) reads the records again.
        batch = ResultBatch(session_id, epoch, list(records), c)
        (new,) = self._store_retrying([batch], now_ns, True)
        assert new is not None
        return new

    def store_many(
        self,
        batches: Sequence[ResultBatch],
        now_ns: int | None = None,
        *,
        fence: Fence | None = None,
    ) -> list[int | None]:
        """``store_results`` for many sessions in one transaction (one commit and one bulk
        insert, not one per session). Per batch: how many rows were new, or None for a
        stale one (its session left that epoch, was destroyed, or its row was deleted),
        which stores nothing.

        Raises FencedError, storing nothing, if ``fence`` no longer holds."""
        return self._store_retrying(batches, now_ns, False, fence)

    def _store_retrying(
        self,
        batches: Sequence[ResultBatch],
        now_ns: int | None,
        strict: bool,
        fence: Fence | None = None,
    ) -> list[int | None]:
        """``_store`` in a transaction of its own; once more, counting each session's new
        rows apart, if the first found rows already stored (``_insert_results``)."""
        for careful in (False, True):
            try:
                with self._transaction() as db:
                    if fence is not None:
                        self._check_fence(db, fence)
                    return self._store(db, batches, now_ns, strict, careful)
            except _RowsRepeated:
                continue
        raise AssertionError("unreachable: a careful insert counts repeats")

    def _check_fence(self, db: _Db, fence: Fence) -> None:
        row = db.execute(
            "SELECT owner, generation FROM leases WHERE name=?"  # noqa: S608 - a constant
            + self._share_lock_sql,
            (fence.lease,),
        ).fetchone()
        if row is None or row[0] != fence.replica or _int(row[1]) != fence.generation:
            held = "nobody" if row is None or row[0] is None else f"{row[0]}"
            gen = "-" if row is None else _int(row[1])
            raise FencedError(
                f"lease {fence.lease}: held by {held} in generation {gen}, not by"
                f" {fence.replica} in generation {fence.generation}: not stored"
            )

    def _store(
        self,
        db: _Db,
        batches: Sequence[ResultBatch],
        now_ns: int | None,
        strict: bool,
        careful: bool,
    ) -> list[int | None]:
        """The body of ``store_many`` (in the caller's transaction)."""
        current = _current_epochs(db, {b.session_id for b in batches}, self._row_lock_sql)
        fresh: list[ResultBatch] = []
        stale: set[int] = set()
        for i, b in enumerate(batches):
            state = current.get(b.session_id)
            if state is None:
                # Its row was deleted (a node removed with its history: ``remove_node``)
                # after the batch was read: stale like a destroyed session's.
                if strict:
                    raise NotFoundError(f"session: no session with id {b.session_id}")
                stale.add(i)
                continue
            if state[1] == "destroyed" or state[0] != b.epoch:
                if strict:
                    raise StaleEpochError(
                        f"session {b.session_id}: results of epoch {b.epoch}, but "
                        + ("destroyed" if state[1] == "destroyed" else f"the session is in "
                           f"epoch {state[0]}")
                    )  # fmt: skip
                stale.add(i)
                continue
            fresh.append(b)
        # Per batch, not per row: how many rows and the highest record id of each
        # (session, epoch) (a caller may pass two batches of one session).
        rows: list[tuple[Any, ...]] = []
        counts: dict[tuple[int, int], int] = {}
        tops: dict[tuple[int, int], int] = {}
        for b in fresh:
            got = b.result_rows()
            key = (b.session_id, b.epoch)
            top = b.top
            if got:
                rows += got
                counts[key] = counts.get(key, 0) + len(got)
                top = max(top, *(row[2] for row in got))
            if top > tops.get(key, 0):
                tops[key] = top
        new = self._insert_results(db, rows, counts, careful) if rows else {}
        # One row written per (session, epoch), its epoch's: the count of new rows, the
        # top record id given (the cursor: it moves past rows given even if none was new,
        # e.g. a Seq already stored under another record id) and the sender's latest
        # counters if any came (the last given). No ``sessions`` row is written: its
        # cursor and totals are read from its epochs. Rows are updated in (session,
        # epoch) order: PostgreSQL transactions of two threads then lock them in one
        # order (no deadlock).
        latest = {(b.session_id, b.epoch): b.counters for b in fresh if b.counters is not None}
        received = [
            (sid, ep, now_ns, new.get((sid, ep), 0), top)
            for (sid, ep), top in sorted(tops.items())
            if (sid, ep) not in latest
        ]
        if received:
            self._add_received(db, received)
        counted = [
            (sid, ep, c, new.get((sid, ep), 0), tops.get((sid, ep), 0))
            for (sid, ep), c in sorted(latest.items())
        ]
        if counted:
            self._set_counters(db, now_ns, counted)
        return [
            None if i in stale else new.get((b.session_id, b.epoch), 0)
            for i, b in enumerate(batches)
        ]

    def _set_counters(
        self, db: _Db, now_ns: int | None, counted: list[tuple[int, int, Counters, int, int]]
    ) -> None:
        """Each epoch's counters as its sender last reported them, read at ``now_ns``,
        with its results counted and its top advanced: (session id, epoch, counters, new
        rows, highest record id given), one per epoch."""
        db.executemany(
            "INSERT INTO epochs(session_id, epoch, started_ns, sent, lost, forward_lost,"
            " overflow, seen_ns, skipped, late_ns_total, late_ns_max, unclassified_lost,"
            " ssid_zero, received, top) VALUES (?, ?, COALESCE(?, 0), ?, ?, ?, ?, ?, ?, ?, ?,"
            " ?, ?, ?, ?) ON CONFLICT(session_id, epoch) DO UPDATE SET sent=excluded.sent,"
            " lost=excluded.lost, forward_lost=excluded.forward_lost,"
            " overflow=excluded.overflow, seen_ns=excluded.seen_ns,"
            " skipped=excluded.skipped, late_ns_total=excluded.late_ns_total,"
            " late_ns_max=excluded.late_ns_max, unclassified_lost=excluded.unclassified_lost,"
            " ssid_zero=excluded.ssid_zero, received = epochs.received + excluded.received,"
            " top = CASE WHEN epochs.top > excluded.top THEN epochs.top ELSE excluded.top END",
            [(sid, ep, now_ns, *c[:4], now_ns, *c[4:], n, top) for sid, ep, c, n, top in counted],
        )

    def _add_received(self, db: _Db, rows: list[tuple[int, int, int | None, int, int]]) -> None:
        """Count stored results per epoch and advance its top, the cursor: (session id,
        epoch, now, new rows, highest record id given)."""
        db.executemany(
            "INSERT INTO epochs(session_id, epoch, started_ns, received, top)"
            " VALUES (?, ?, COALESCE(?, 0), ?, ?) ON CONFLICT(session_id, epoch)"
            " DO UPDATE SET received = epochs.received + excluded.received,"
            " top = CASE WHEN epochs.top > excluded.top THEN epochs.top"
            " ELSE excluded.top END",
            rows,
        )

    def results(
        self, session_id: int, *, since_ns: int | None = None, limit: int | None = None
    ) -> list[StampResult]:
        return [r for _, r in self.records(session_id, since_ns=since_ns, limit=limit)]

    def records(
        self, session_id: int, *, since_ns: int | None = None, limit: int | None = None
    ) -> list[tuple[int, StampResult]]:
        """The stored results of a session, each with its epoch: (epoch, result)."""
        query = _SELECT_RESULTS + " WHERE session_id=?"
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
        return [(r[1], _result(r)) for r in rows]

    # -- events -------------------------------------------------------------------------

    def add_event(self, session_id: int, event: SessionEvent) -> None:
        """Keep a threshold event of the session."""
        with self._lock:
            self._db.execute(
                "INSERT INTO events(session_id, kind, state, value, threshold, at_ns)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    session_id,
                    str(event.kind),
                    str(event.state),
                    event.value,
                    event.threshold,
                    event.at_ns,
                ),
            )
        self._announce(CHANGED)

    def events(
        self, session: str | None = None, *, since_ns: int | None = None, limit: int = 1000
    ) -> list[EventRow]:
        """Events, oldest first (of one live session's name, or of every session)."""
        query = (
            "SELECT e.id, s.name, e.kind, e.state, e.value, e.threshold, e.at_ns FROM events e"
            " JOIN sessions s ON s.id = e.session_id WHERE 1=1"
        )
        args: list[Any] = []
        if session is not None:
            query += " AND e.session_id = ?"
            args.append(self.session(session).id)
        if since_ns is not None:
            query += " AND e.at_ns >= ?"
            args.append(since_ns)
        query += " ORDER BY e.id DESC LIMIT ?"
        args.append(limit)
        with self._lock:
            rows = self._db.execute(query, args).fetchall()
        return [EventRow(*r) for r in reversed(rows)]

    def raised(self, session_id: int) -> list[str]:
        """The kinds of the session's events raised and not cleared since."""
        with self._lock:
            rows = self._db.execute(
                "SELECT kind, state FROM events WHERE session_id=? ORDER BY id", (session_id,)
            ).fetchall()
        state: dict[str, str] = dict(rows)  # the last state of each kind wins
        return sorted(k for k, st in state.items() if st == "raised")

    def live_events(self) -> dict[int, tuple[list[str], dict[tuple[str, str], int]]]:
        """``raised`` and ``event_counts`` of every session that is not destroyed and had
        events, by session id (one query)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT e.session_id, e.kind, e.state FROM events e JOIN sessions s"
                " ON s.id = e.session_id WHERE s.state != 'destroyed' ORDER BY e.id"
            ).fetchall()
        last: dict[int, dict[str, str]] = {}
        counts: dict[int, dict[tuple[str, str], int]] = {}
        for sid, kind, state in rows:
            last.setdefault(sid, {})[kind] = state  # the last state of each kind wins
            by_kind = counts.setdefault(sid, {})
            by_kind[(kind, state)] = by_kind.get((kind, state), 0) + 1
        return {
            sid: (sorted(k for k, st in last[sid].items() if st == "raised"), counts[sid])
            for sid in counts
        }

    def event_counts(self, session_id: int) -> dict[tuple[str, str], int]:
        """How many events of each (kind, state) the session had."""
        with self._lock:
            rows = self._db.execute(
                "SELECT kind, state, COUNT(*) FROM events WHERE session_id=? GROUP BY kind, state",
                (session_id,),
            ).fetchall()
        return {(k, st): n for k, st, n in rows}

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

    # -- rollups and retention ----------------------------------------------------------

    def roll_up(self, *, limit: int = 20_000) -> int:
        """Fold up to ``limit`` records stored since the last pass into the per-minute
        rollups, with each epoch's rollup cursor. Returns how many records it rolled
        (call again while it returns ``limit``).

        The records are read by one statement (``_read_unrolled``: SQLite's on a
        connection of its own, beside the writer), rolled up with no lock or transaction
        held (collection goes on meanwhile: it adds records past the ones read and moves
        no rollup cursor), and written in one short transaction that moves each epoch's
        cursor from the value read. A pass that finds a cursor moved since (another
        replica's pass) rolls back and rolls nothing: a record is rolled up once.
        """
        rows = self._read_unrolled(limit)
        if not rows:
            return 0
        try:
            table = np.array(rows, dtype=np.int64)
        except OverflowError:  # timestamps past int64: ``roll_up`` of each epoch
            columns: Any = list(zip(*rows, strict=True))
            starts = [i for i in range(len(rows)) if i == 0 or rows[i][2:4] != rows[i - 1][2:4]]
        else:
            columns = table.T
            new = np.ones(len(rows), dtype=bool)
            new[1:] = (table[1:, 2] != table[:-1, 2]) | (table[1:, 3] != table[:-1, 3])
            starts = np.flatnonzero(new).tolist()
        # Each epoch's cursor as read, and the last record read (its rows come by id).
        ends = [*(i - 1 for i in starts[1:]), len(rows) - 1]
        cursors = {(rows[i][2], rows[i][3]): (rows[i][0], None if rows[i][1] < 0 else rows[i][1])
                   for i in starts}  # fmt: skip
        last = {(rows[i][2], rows[i][3]): rows[i][4] for i in ends}
        seqs = {key: cursor[1] for key, cursor in cursors.items()}
        fold = fold_columns(columns[2:12], seqs)
        fresh = None
        if fold is None:  # values too large for the arrays: ``roll_up`` of each epoch
            fresh, tops = roll_up_columns(columns[2:12], seqs)
        else:
            tops = fold.tops
        with self._transaction() as db:
            out = None
            if fold is not None:
                out = fold.rows(self._rollup_rows_at(db, fold.keys))
                if out is None:  # stored rows the arrays do not take
                    fresh = fold.minutes()
            if out is None:  # the reference merge
                assert fresh is not None
                for at, old in self._rollups_at(db, list(fresh)).items():
                    old.merge(fresh[at])
                    fresh[at] = old
                out = [_rollup_row(sid, ep, m) for (sid, ep, _), m in fresh.items()]
            db.executemany(
                "INSERT INTO rollups(" + ", ".join(ROLLUP_COLUMNS) + ") VALUES ("  # noqa: S608
                + ", ".join("?" * len(ROLLUP_COLUMNS)) + ") ON CONFLICT(session_id, epoch,"
                " minute_ns) DO UPDATE SET "
                + ", ".join(f"{c}=excluded.{c}" for c in ROLLUP_COLUMNS[3:]),
                out,
            )  # fmt: skip
            moved = [(last[key], tops[key], *key, cursors[key][0]) for key in sorted(cursors)]
            done = db.executemany(
                "UPDATE epochs SET rolled=?, rolled_seq=? WHERE session_id=? AND epoch=?"
                " AND rolled=?",
                moved,
            )
            if done.rowcount != len(moved):
                raise ConcurrentPassError("roll_up: another pass moved a cursor first")
        return len(rows)

    #: The records a roll-up pass reads: each epoch's rollup cursor, then the columns
    #: ``fold_columns`` takes (no NULL: one int64 array of them all).
    _SELECT_UNROLLED = (
        "SELECT e.rolled, COALESCE(e.rolled_seq, -1), "  # noqa: S608 - column names only
        + ", ".join(f"r.{c}" for c in RESULT_COLUMNS[:10])
        # Epochs first (SQLite keeps a CROSS JOIN's order): only those with records
        # past their cursor, each read by a range of the primary key.
        + " FROM epochs e CROSS JOIN results r WHERE e.rolled < e.top"
        " AND r.session_id = e.session_id AND r.epoch = e.epoch AND r.record_id > e.rolled"
        " ORDER BY e.session_id, e.epoch, r.record_id LIMIT ?"
    )

    def _read_unrolled(self, limit: int) -> list[Any]:
        """Up to ``limit`` records past their epoch's rollup cursor, by one statement."""
        with self._lock:
            return self._db.execute(self._SELECT_UNROLLED, (limit,)).fetchall()

    def _rollup_rows_at(self, db: _Db, keys: list[tuple[int, int, int]]) -> list[Any]:
        """The stored rollup rows (``ROLLUP_COLUMNS``) of these (session, epoch, minute)
        keys that exist."""
        out: list[Any] = []
        for i in range(0, len(keys), 300):
            chunk = keys[i : i + 300]
            # The keys first, each a lookup of the primary key: SQLite keeps a CROSS JOIN's
            # order, and plans ``(session_id, epoch, minute_ns) IN (VALUES ...)`` of more
            # than one key as a scan of the whole table.
            query = (
                "SELECT " + ", ".join(f"r.{c}" for c in ROLLUP_COLUMNS)  # noqa: S608
                + " FROM (VALUES " + ", ".join(["(?, ?, ?)"] * len(chunk))
                + ") AS k CROSS JOIN rollups r WHERE r.session_id = k.column1"
                " AND r.epoch = k.column2 AND r.minute_ns = k.column3"
            )  # fmt: skip
            out += db.execute(query, [v for k in chunk for v in k]).fetchall()
        return out

    def _rollups_at(
        self, db: _Db, keys: list[tuple[int, int, int]]
    ) -> dict[tuple[int, int, int], MinuteRollup]:
        """The stored rollups of these (session, epoch, minute) keys that exist."""
        return {(r[0], r[1], r[2]): _rollup(r) for r in self._rollup_rows_at(db, keys)}

    def rollups(
        self, session_id: int, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[tuple[int, MinuteRollup]]:
        """The session's rollups, (epoch, rollup), by minute; ``since_ns``/``until_ns``
        select the minutes that overlap [since, until)."""
        query = _SELECT_ROLLUPS + " WHERE session_id=?"
        args: list[Any] = [session_id]
        if since_ns is not None:
            query += " AND minute_ns > ?"
            args.append(since_ns - MINUTE_NS)
        if until_ns is not None:
            query += " AND minute_ns < ?"
            args.append(until_ns)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY minute_ns, epoch", args).fetchall()
        return [(r[1], _rollup(r)) for r in rows]

    def unrolled(
        self, session_id: int, *, since_ns: int | None = None
    ) -> list[tuple[int, int, StampResult]]:
        """The session's stored records that no roll-up pass has folded in yet:
        (epoch, record id, result)."""
        query = (
            "SELECT " + ", ".join(f"r.{c}" for c in RESULT_COLUMNS) + " FROM results r"  # noqa: S608
            " JOIN epochs e ON e.session_id = r.session_id AND e.epoch = r.epoch"
            " WHERE r.session_id=? AND r.record_id > e.rolled"
        )
        args: list[Any] = [session_id]
        if since_ns is not None:
            query += " AND r.t1_ns >= ?"
            args.append(since_ns)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY r.epoch, r.record_id", args).fetchall()
        return [(r[1], r[2], _result(r)) for r in rows]

    def expired(self, session_id: int) -> bool:
        """Were raw results of the session deleted (``expire``)?"""
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM epochs WHERE session_id=? AND expired > 0 LIMIT 1", (session_id,)
            ).fetchone()
        return row is not None

    def expire(self, now_ns: int, *, raw_ns: int, rollup_ns: int | None = None) -> tuple[int, int]:
        """Delete raw records rolled up into minutes that ended more than ``raw_ns`` ago,
        and rollups whose minute ended more than ``rollup_ns`` ago (None: keep them).
        Returns (records, rollups) deleted.

        Per epoch, the bound is the highest record id of its last such minute (never
        beyond the rollup cursor): a record reordered across that minute's end goes with
        it, a moment early.
        """
        cutoff = now_ns - raw_ns - MINUTE_NS
        with self._transaction() as db:
            bounds = [
                (sid, ep, min(last, rolled))
                for sid, ep, rolled, last in db.execute(
                    "SELECT e.session_id, e.epoch, e.rolled, (SELECT ro.last_record FROM rollups"
                    " ro WHERE ro.session_id = e.session_id AND ro.epoch = e.epoch"
                    " AND ro.minute_ns <= ? ORDER BY ro.minute_ns DESC LIMIT 1)"
                    " FROM epochs e WHERE e.expired < e.rolled",
                    (cutoff,),
                ).fetchall()
                if last is not None
            ]
            deleted = 0
            for sid, ep, bound in bounds:
                deleted += db.execute(
                    "DELETE FROM results WHERE session_id=? AND epoch=? AND record_id<=?",
                    (sid, ep, bound),
                ).rowcount
            if bounds:
                db.executemany(
                    "UPDATE epochs SET expired=? WHERE session_id=? AND epoch=? AND expired<?",
                    [(b, sid, ep, b) for sid, ep, b in bounds],
                )
            gone = 0
            if rollup_ns is not None:
                gone = db.execute(
                    "DELETE FROM rollups WHERE minute_ns <= ?", (now_ns - rollup_ns - MINUTE_NS,)
                ).rowcount
        return deleted, gone

    # -- replicas and leases -------------------------------------------------------------

    def lease_tick(
        self, replica: str, groups: Mapping[str, Collection[str]], ttl_ns: int, address: str = ""
    ) -> LeaseState:
        """One heartbeat of a replica, in one transaction (times on the database's clock):

        1. the replica is alive for ``ttl_ns`` more;
        2. it renews the leases it holds, for ``ttl_ns``;
        3. per group (e.g. the sender nodes), a fair share is ceil(leases / live replicas):
           it claims free or expired leases of the group while it holds fewer, and reports
           as ``surplus`` those above its share (to ``release`` once it let go of them).

        Claims race safely: a lease is taken only if it is still free or expired when the
        claim runs (the row is locked by the first claimer; the second finds it taken).
        """
        with self._transaction() as db:
            now = _int(db.execute("SELECT " + self._now_sql).fetchone()[0])
            until = now + ttl_ns
            db.execute(
                "INSERT INTO replicas(id, address, started_ns, expires_ns) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(id) DO UPDATE SET expires_ns=excluded.expires_ns,"
                " address=excluded.address",
                (replica, address, now, until),
            )
            live = _int(
                db.execute("SELECT COUNT(*) FROM replicas WHERE expires_ns > ?", (now,)).fetchone()[
                    0
                ]
            )
            wanted = [(name, grp) for grp, names in groups.items() for name in names]
            if wanted:
                db.executemany(
                    "INSERT INTO leases(name, grp) VALUES (?, ?) ON CONFLICT(name) DO NOTHING",
                    wanted,
                )
            db.execute("UPDATE leases SET expires_ns=? WHERE owner=?", (until, replica))
            rows = db.execute("SELECT name, grp, owner, expires_ns FROM leases").fetchall()
            owned: set[str] = set()
            surplus: set[str] = set()
            for grp, names in groups.items():
                mine = sorted(r[0] for r in rows if r[1] == grp and r[2] == replica)
                share = -(-len(names) // max(live, 1))
                free = sorted(
                    r[0] for r in rows
                    if r[1] == grp and r[0] in names and (r[2] is None or r[3] <= now)
                )  # fmt: skip
                for name in free[: max(0, share - len(mine))]:
                    if db.execute(
                        "UPDATE leases SET owner=?, expires_ns=?, generation=generation+1"
                        " WHERE name=? AND (owner IS NULL OR expires_ns <= ?)",
                        (replica, until, name, now),
                    ).rowcount:
                        mine.append(name)
                owned.update(mine)
                surplus.update(sorted(mine)[share:])
            generations = {
                r[0]: _int(r[1])
                for r in db.execute(
                    "SELECT name, generation FROM leases WHERE owner=?", (replica,)
                ).fetchall()
                if r[0] in owned
            }
        return LeaseState(now, live, frozenset(owned), frozenset(surplus), generations)

    def release(self, replica: str, names: Collection[str]) -> None:
        """Give up leases the replica holds (it no longer acts on them)."""
        if names:
            with self._transaction() as db:
                db.executemany(
                    "UPDATE leases SET owner=NULL, expires_ns=0 WHERE name=? AND owner=?",
                    [(n, replica) for n in names],
                )

    def leave(self, replica: str) -> None:
        """A replica that stops: its leases are free at once, and it no longer counts."""
        with self._transaction() as db:
            db.execute("UPDATE leases SET owner=NULL, expires_ns=0 WHERE owner=?", (replica,))
            db.execute("DELETE FROM replicas WHERE id=?", (replica,))

    def lease_owners(self) -> dict[str, str | None]:
        """Who holds each lease now (None: free or expired), by name."""
        with self._lock:
            now = _int(self._db.execute("SELECT " + self._now_sql).fetchone()[0])
            rows = self._db.execute("SELECT name, owner, expires_ns FROM leases").fetchall()
        return {r[0]: (r[1] if r[1] is not None and r[2] > now else None) for r in rows}

    def replicas(self) -> list[ReplicaRow]:
        """The replicas alive now (database clock), by id."""
        with self._lock:
            now = _int(self._db.execute("SELECT " + self._now_sql).fetchone()[0])
            rows = self._db.execute(
                "SELECT id, address, started_ns, expires_ns FROM replicas WHERE expires_ns > ?"
                " ORDER BY id",
                (now,),
            ).fetchall()
        return [ReplicaRow(*r) for r in rows]


def _int(value: Any) -> int:
    return int(value)


#: How long an SQLite statement waits for the file's write lock held by another
#: connection (another replica's process) before it fails (s).
BUSY_TIMEOUT_S = 60.0
#: An SQLite file keeps its newest notices (``SqliteStore``), this many: a listener
#: that falls further behind than that hears ``RESYNC``. Notices come with
#: control-plane changes only (tens of bytes a row).
NOTICES_KEPT = 10_000
#: How often a listener looks whether another connection committed (s): what another
#: replica's notice may take to be heard, at most (and the time it may take
#: ``close`` to stop the listener).
NOTICE_POLL_S = 0.25


class ConcurrentPassError(StoreError):
    """Another roll-up pass (another replica's) moved a cursor first; this one rolled back."""


class _WriterLock:
    """The exclusive ``flock`` of the file beside an SQLite database that its writers in
    several processes queue on (``SqliteStore``), waited for no longer than a time limit.

    flock(2) has none of its own: a blocking call waits until the holder lets go, which
    a stopped process (SIGSTOP, a debugger) never does, and every write of every other
    replica would wait with it. A try that does not block takes the lock when it is
    free. When it is not, a thread of its own blocks on it for the caller, who waits up
    to ``timeout`` and then gives up (``StoreUnavailableError``); the thread, once it
    holds the lock, passes it to whoever waits by then, or lets go of it. Waiting stays
    the kernel's queue (a blocked flock is woken as the holder lets go), not a poll.

    One caller at a time: the lock belongs to the open file, not to a thread, so that a
    second caller of this process would be let in beside the first (``SqliteStore``
    takes it under its own lock)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self._mutex = threading.Lock()  # the fields below
        self._held = False  # a caller holds the lock
        self._waiter: threading.Event | None = None  # a caller waits for the thread
        self._blocked = False  # the thread is in flock (or about to be)
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def acquire(self, timeout: float) -> None:
        with self._mutex:
            if self._closed:
                raise StoreUnavailableError(f"store: {self.path} is closed")
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass
            else:
                self._held = True
                return
            granted = self._waiter = threading.Event()
            if not self._blocked:  # else it is in flock already, for a caller that left
                self._blocked = True
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._wait_loop, name="store-writer-lock", daemon=True
                    )
                    self._thread.start()
                self._wake.set()
        if granted.wait(timeout):
            return
        with self._mutex:
            if granted.is_set():  # given between the wait's end and the mutex
                return
            self._waiter = None
        raise StoreUnavailableError(
            f"store: another process has held {self.path} (the SQLite file's writer lock)"
            f" for {timeout:g} s; is a replica stopped?"
        )

    def release(self) -> None:
        with self._mutex:
            self._held = False
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            self._wake.set()
            if not self._blocked:
                os.close(self._fd)
            # else the thread closes it when its flock returns: closing a descriptor
            # another thread is blocked on could let a new file take its number.

    def _wait_loop(self) -> None:
        while True:
            self._wake.wait()
            with self._mutex:
                self._wake.clear()
                if self._closed:
                    return
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            with self._mutex:
                self._blocked = False
                if self._closed:
                    os.close(self._fd)
                    return
                if self._waiter is not None:  # the caller waiting now gets it
                    self._held = True
                    self._waiter.set()
                    self._waiter = None
                elif not self._held:
                    # Nobody waits any more: let go. (Unless a caller took it meanwhile
                    # with a try that does not block, which succeeds on a lock this
                    # file already holds: that caller lets go when done.)
                    fcntl.flock(self._fd, fcntl.LOCK_UN)


class SqliteStore(Store):
    """One SQLite file in WAL mode: one connection, serialised; readers (a CLI) may run
    beside the one writer. Replicas in several processes of one host share the file,
    their write transactions queued on its writer lock (``_writers``).

    Notices (``Store.subscribe``) reach the other stores of the file, in this process or
    another, as PostgreSQL's LISTEN/NOTIFY does (``pgstore``): a notice is a row of the
    ``notices`` table, written in a transaction of its own right after the change's
    commit (as ``pgstore`` sends NOTIFY right after it), so that it is only ever written
    for a committed change and read, by another connection, once that change is
    visible to it; each call that announces, announcing after its transaction on either
    store, is the same code on both. A process killed between the two loses that notice,
    as on PostgreSQL: the replicas' polling covers it. The row's write queues on the
    file's writer lock like any transaction. Stored results announce nothing: a row is
    written per control-plane change (a node, a session's state, an epoch, an event),
    never per batch of results.

    A store with subscribers hears the others' notices in a thread of its own
    (``_listen_loop``), over a connection of its own that only reads: every
    ``notice_poll_s`` it reads ``PRAGMA data_version``, which changes when another
    connection committed, and only then the notices after the last it read; it delivers
    those another store wrote (each row names its writer: a store's own were delivered
    as it made them). The table keeps the newest ``notices_kept`` rows (the writer
    deletes older ones): a listener that fell further behind, or could not read for a
    while, is told ``RESYNC``, as a PostgreSQL listener that lost its connection is. A
    database in memory has no other connection: its notices stay in the process."""

    _integrity_errors = (sqlite3.IntegrityError,)
    _now_sql = "CAST((julianday('now') - 2440587.5) * 86400000000000.0 AS INTEGER)"
    # SQLite's SUM fails past int64 ("integer overflow"); TOTAL sums as a float (exact
    # below 2^53), and CAST saturates a float past the range. Each session's epochs are
    # joined and grouped by session: a nested loop over the primary key of ``epochs``.
    _sessions_sql = _sessions_query(
        _session_totals("CASE WHEN COUNT({0}) THEN CAST(TOTAL({0}) AS INTEGER) END"),
        " LEFT JOIN epochs e ON e.session_id = sessions.id",
    )
    _sessions_group = " GROUP BY sessions.id"

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = str(path)
        # A statement that writes outside a transaction (a node's health, an event) does
        # not queue on ``_writers``: it waits through SQLite's busy timeout while other
        # replicas' transactions, queued, hold the file's lock; longer than SQLite's
        # default 5 s, so that it is not failed with "database is locked" behind them.
        self._conn = sqlite3.connect(
            self.path, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_S
        )
        self._lock = threading.Lock()
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable at commit
            # Results go in one row per session per batch, all over the table's keys: a
            # page cache of 64 MiB keeps the pages they land on in memory.
            self._conn.execute("PRAGMA cache_size=-65536")
            # A commit writes each page it changed to the WAL, and the commit that takes
            # the WAL past this many pages copies them into the database (a checkpoint):
            # the default 1,000 pages made that nearly every commit of thousands of
            # sessions' results, copying the same pages again each time. 16,384 pages
            # (64 MiB of WAL) copies a page rewritten by many commits once.
            self._conn.execute("PRAGMA wal_autocheckpoint=16384")
            _migrate(self._conn)

        #: Writers of this file in other processes (controller replicas on one host)
        #: queue for its write lock on this file beside it (``flock``), each woken as
        #: the holder lets go. SQLite's own wait for the lock (the busy timeout) polls,
        #: sleeping up to 100 ms between tries: a process whose transactions follow one
        #: another closely would keep the lock from the other nearly always. A
        #: transaction waits for it as long as a statement waits for SQLite's lock
        #: (``writer_wait_s``), then fails: a replica stopped while it held the lock
        #: must not stop every other one's writes with it.
        self._writers: _WriterLock | None = None
        self.writer_wait_s = BUSY_TIMEOUT_S
        if self.path not in ("", ":memory:"):
            self._writers = _WriterLock(self.path + "-writer")
        #: A connection of the roll-up pass's reads alone (``_read_unrolled``), opened
        #: at its first: in WAL mode it reads beside the writer, so that collection does
        #: not wait on the store's lock while a pass reads (and the GIL is free while
        #: SQLite walks the tables). None: not opened yet, or a database in memory.
        self._reader: sqlite3.Connection | None = None
        self._reader_lock = threading.Lock()
        #: Notices: how many rows the table keeps, how often a listener looks (s), who
        #: this store is in the rows it writes, and its listening thread.
        self.notices_kept = NOTICES_KEPT
        self.notice_poll_s = NOTICE_POLL_S
        self._origin = f"{os.getpid()}-{os.urandom(8).hex()}"
        self._listener: threading.Thread | None = None
        self._closing = threading.Event()
        self._listen_lock = threading.Lock()  # one listener, whoever subscribes at once

    @property
    def _db(self) -> _Db:
        return self._conn

    def close(self) -> None:
        self._closing.set()
        listener = self._listener
        if listener is not None and listener is not threading.current_thread():
            # It looks every notice_poll_s; a read in progress is short (a few rows).
            listener.join(self.notice_poll_s + BUSY_TIMEOUT_S)
        with self._lock:
            self._conn.close()
            if self._writers is not None:
                self._writers.close()
                self._writers = None
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()

    def _announce(self, kind: str, arg: str = "") -> None:
        self._deliver(kind, arg)
        if self._writers is None:
            return  # in memory: no other connection to tell
        try:
            with self._transaction() as db:
                nid = db.execute(  # read to the end: the statement is done before COMMIT
                    "INSERT INTO notices(kind, arg, at_ns, origin) VALUES (?, ?, ?, ?)"
                    " RETURNING id",
                    (kind, arg, time.time_ns(), self._origin),
                ).fetchall()[0][0]
                # The oldest beyond those kept go: a range of the key (a row, mostly).
                db.execute("DELETE FROM notices WHERE id <= ?", (nid - self.notices_kept,))
        except (sqlite3.Error, StoreUnavailableError) as exc:
            # The other replicas look at their next round instead.
            log.warning("store: notice %s %s not written for the other replicas: %s",
                        kind, arg, exc)  # fmt: skip

    def _listen(self) -> None:
        with self._listen_lock:
            if self._writers is None or self._listener is not None or self._closing.is_set():
                return
            # The last notice written so far, read now: every later one is heard, even
            # one written before the thread runs. The sequence, not MAX(id): it survives
            # pruning.
            with self._lock:
                row = self._conn.execute(
                    "SELECT seq FROM sqlite_sequence WHERE name = 'notices'"
                ).fetchone()
            self._listener = threading.Thread(
                target=self._listen_loop, args=(0 if row is None else int(row[0]),),
                name="store-listen", daemon=True,
            )  # fmt: skip
            self._listener.start()

    def _listen_loop(self, last: int) -> None:
        """Hear the notices the other stores of the file write after ``last`` (an id of
        ``notices``), until the store closes."""
        reader: sqlite3.Connection | None = None
        seen: int | None = None  # PRAGMA data_version when the notices were last read
        failing = False  # the last look failed: notices may have been missed
        try:
            while not self._closing.is_set():
                try:
                    if reader is None:
                        reader = sqlite3.connect(
                            self.path, check_same_thread=False, isolation_level=None,
                            timeout=BUSY_TIMEOUT_S,
                        )  # fmt: skip
                    version = reader.execute("PRAGMA data_version").fetchone()[0]
                    rows: list[Any] = []
                    if version != seen or failing:
                        # Read to the end (autocommit): no snapshot is held between looks.
                        rows = reader.execute(
                            "SELECT id, kind, arg, origin FROM notices WHERE id > ? ORDER BY id",
                            (last,),
                        ).fetchall()
                        seen = version
                except sqlite3.Error as exc:
                    if not failing:
                        log.warning(
                            "store: reading notices of %s: %s; trying again every %g s",
                            self.path, exc, self.notice_poll_s,
                        )  # fmt: skip
                    failing = True
                    if reader is not None:
                        reader.close()
                        reader = None
                    self._closing.wait(self.notice_poll_s)
                    continue
                # Ids run without gaps (one per committed write): the first one unread
                # gone means notices were pruned before this listener read them.
                if failing or (rows and rows[0][0] != last + 1):
                    if failing:
                        log.info("store: reading notices of %s again", self.path)
                    failing = False
                    self._deliver(RESYNC, "")
                for nid, kind, arg, origin in rows:
                    last = nid
                    if origin != self._origin:  # its own: delivered when it was made
                        self._deliver(kind, arg)
                self._closing.wait(self.notice_poll_s)
        finally:
            if reader is not None:
                reader.close()

    def _read_unrolled(self, limit: int) -> list[Any]:
        if self.path in ("", ":memory:") or "mode=memory" in self.path:
            return super()._read_unrolled(limit)  # a second connection: another database
        with self._reader_lock:
            if self._reader is None:
                self._reader = sqlite3.connect(
                    self.path, check_same_thread=False, isolation_level=None
                )
            # One statement: one snapshot of the epochs' cursors and their records.
            return self._reader.execute(self._SELECT_UNROLLED, (limit,)).fetchall()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[_Db]:
        with self._lock, self._queued():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextlib.contextmanager
    def _queued(self) -> Iterator[None]:
        """Hold the file's writer lock (``_writers``) for a write transaction."""
        writers = self._writers
        if writers is None:
            yield
            return
        writers.acquire(self.writer_wait_s)
        try:
            yield
        finally:
            writers.release()

    def _constraint(self, exc: Exception) -> str:
        # The extended result code tells the constraints apart.
        name = getattr(exc, "sqlite_errorname", "")
        if name in ("SQLITE_CONSTRAINT_UNIQUE", "SQLITE_CONSTRAINT_PRIMARYKEY"):
            return "unique"
        if name == "SQLITE_CONSTRAINT_FOREIGNKEY":
            return "foreign"
        return "other"

    def _insert_results(
        self,
        db: _Db,
        rows: list[tuple[Any, ...]],
        counts: dict[tuple[int, int], int],
        careful: bool,
    ) -> dict[tuple[int, int], int]:
        # Only a repeated (session, epoch, record id) or (session, epoch, Seq) is skipped
        # (a misbehaving agent resent a record): OR IGNORE would also swallow a NOT NULL
        # violation.
        if not careful:
            # One statement for all rows, no savepoint: rolling back to one means SQLite
            # keeps every page the insert changes as it was, and with thousands of
            # sessions' rows (a page each) that copy spills to a temporary file, which
            # more than doubled the insert's cost (docs/architecture.md, "The SQLite
            # store's write path"). All new, the usual case: the counts are the rows. A
            # repeat leaves them unknown: the caller rolls back and comes again careful.
            if db.executemany(_INSERT_RESULTS_NEW, rows).rowcount == len(rows):
                return counts
            raise _RowsRepeated
        new: dict[tuple[int, int], int] = {}
        for key, group in _by_epoch(rows):
            new[key] = db.executemany(_INSERT_RESULTS_NEW, group).rowcount
        return new

    def storage(self) -> Storage:
        with self._lock:
            counts = self._conn.execute(
                "SELECT (SELECT COUNT(*) FROM results), (SELECT COUNT(*) FROM rollups)"
            ).fetchone()
            sizes = dict(self._conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"))
            indexes = dict(
                self._conn.execute("SELECT name, tbl_name FROM sqlite_master WHERE type='index'")
            )
        tables: dict[str, int] = {}
        for name, size in sizes.items():
            table = indexes.get(name, name)
            tables[table] = tables.get(table, 0) + int(size)
        return Storage(counts[0], counts[1], tables)


def _by_epoch(
    rows: list[tuple[Any, ...]],
) -> Iterator[tuple[tuple[int, int], list[tuple[Any, ...]]]]:
    """Result rows grouped by (session, epoch), in the order they came."""
    groups: dict[tuple[int, int], list[tuple[Any, ...]]] = {}
    for row in rows:
        groups.setdefault((row[0], row[1]), []).append(row)
    yield from groups.items()


def _current_epochs(db: _Db, ids: set[int], lock: str = "") -> dict[int, tuple[int, str]]:
    """(epoch, state) of each session by id, in chunks of 500 (SQLite's variable limit);
    ``lock`` (e.g. " FOR UPDATE") locks their rows, in id order."""
    out: dict[int, tuple[int, str]] = {}
    ordered = sorted(ids)
    for i in range(0, len(ordered), 500):
        chunk = ordered[i : i + 500]
        for r in db.execute(
            "SELECT id, epoch, state FROM sessions WHERE id IN ("  # noqa: S608 - placeholders
            + ",".join("?" * len(chunk))
            + ") ORDER BY id"
            + lock,
            chunk,
        ).fetchall():
            out[r[0]] = (r[1], r[2])
    return out


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


def _listing(names: Sequence[str], most: int = 5) -> str:
    """``'a', 'b' and 3 more``: names in a message, not a page of them."""
    shown = ", ".join(repr(n) for n in names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"


def _node_row(r: Sequence[Any]) -> NodeRow:
    return NodeRow(
        r[0], r[1], r[2], bool(r[3]), r[4], r[5], json.loads(r[6]) if r[6] else None,
        r[7], r[8], r[9], r[10],
    )  # fmt: skip


def _result_row(session_id: int, epoch: int, rid: int, r: StampResult) -> tuple[Any, ...]:
    data = r.data
    return (
        session_id, epoch, rid, r.seq, r.t1_ns, r.t2_ns, r.t3_ns, r.t4_ns,
        r.sender_error.to_int(), r.reflector_error.to_int(), r.ses_sender_ttl, r.reflector_seq,
        r.flow_label, int(r.loopback),
        *((None, None, None, None) if data is None
          else (data.s_txc, data.r_rxc, data.r_txc, data.s_rxc)),
    )  # fmt: skip


def _result(r: Sequence[Any]) -> StampResult:
    data = None if r[14] is None else DataCounters(r[14], r[15], r[16], r[17])
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
        flow_label=r[12],
        loopback=bool(r[13]),
        data=data,
    )


def _rollup_row(session_id: int, epoch: int, m: MinuteRollup) -> tuple[Any, ...]:
    """The stored row of a rollup: each value saturated at the columns' 64-bit limits
    (``rollup.saturate``: an error bound past 2^63 ns is stored as "at least" that)."""
    values: list[Any] = [session_id, epoch, m.minute_ns, m.count, m.lost]
    for d in DIRECTIONS:
        s = m.directions[d]
        if s.count:
            values += [saturate(s.min_ns), saturate(round(s.sum_ns / s.count)),
                       saturate(s.percentile(50)), saturate(s.percentile(99)),
                       saturate(s.max_ns), saturate(s.sum_ns), s.hist.to_bytes()]  # fmt: skip
        else:
            values += [None] * 7
    error = None if m.max_error_ns is None else saturate(m.max_error_ns)
    values += [saturate(m.ipdv_sum_abs["direct"]), m.ipdv_pairs["direct"],
               saturate(m.ipdv_sum_abs["return"]), m.ipdv_pairs["return"], error,
               m.last_record]  # fmt: skip
    return tuple(values)


def _rollup(r: Sequence[Any]) -> MinuteRollup:
    m = MinuteRollup(r[2], count=r[3], lost=r[4])
    for i, d in enumerate(DIRECTIONS):
        mn, _mean, _p50, _p99, mx, total, hist = r[5 + 7 * i : 12 + 7 * i]
        if hist is not None:
            h = DelayHistogram.from_bytes(bytes(hist))
            m.directions[d] = DirectionRollup(h.count, mn, mx, total, h)
    base = 5 + 7 * len(DIRECTIONS)
    m.ipdv_sum_abs = {"direct": r[base], "return": r[base + 2]}
    m.ipdv_pairs = {"direct": r[base + 1], "return": r[base + 3]}
    m.max_error_ns = r[base + 4]
    m.last_record = r[base + 5]
    return m


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
    # Rebuilding a table drops the one its results refer to: no foreign key checks
    # until the migration is done (the pragma is a no-op inside a transaction).
    db.execute("PRAGMA foreign_keys=OFF")
    db.execute("BEGIN IMMEDIATE")
    try:
        _migrate_locked(db)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    finally:
        db.execute("PRAGMA foreign_keys=ON")


def _migrate_locked(db: sqlite3.Connection) -> None:
    """``_migrate``'s steps, in its transaction. The version is read under the write
    lock: replicas opening one file at once migrate it once, the later ones finding it
    done."""
    version: int = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"store: schema version {version} is newer than this sixlab's ({SCHEMA_VERSION})"
        )
    existing = db.execute("SELECT 1 FROM sqlite_master WHERE name='nodes'").fetchone()
    if existing is not None and version < 1:
        _migrate_0_to_1(db)
    if existing is not None and version < 2:
        _migrate_1_to_2(db)
    # One statement at a time: executescript would commit the transaction first.
    for statement in _statements(SCHEMA):
        db.execute(statement)
    for table, column, kind in (
        ("epochs", "unclassified_lost", "INTEGER"),
        ("epochs", "ssid_zero", "INTEGER NOT NULL DEFAULT 0"),
        ("sessions", "claimed_by", "TEXT"),
        ("sessions", "restart_reason", "TEXT"),
    ):
        if column not in _columns(db, table):
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    have = _columns(db, "epochs")
    for column in ("top", "rolled", "expired"):
        if column not in have:
            db.execute(f"ALTER TABLE epochs ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")
    if "rolled_seq" not in have:
        db.execute("ALTER TABLE epochs ADD COLUMN rolled_seq INTEGER")
    if db.execute("SELECT 1 FROM sqlite_master WHERE name='epochs_v0'").fetchone():
        extra = "".join(
            f", {c}" for c in ("unclassified_lost", "ssid_zero") if c in _columns(db, "epochs_v0")
        )
        db.execute(
            "INSERT INTO epochs(session_id, epoch, started_ns, ended_ns, end_reason, sent,"  # noqa: S608 - column names of the file's schema
            f" lost, forward_lost, overflow{extra}) SELECT id, epoch, created_ns,"
            " CASE WHEN state IN ('finished', 'destroyed') THEN created_ns END,"
            " CASE WHEN state IN ('finished', 'destroyed') THEN state END,"
            f" sent, lost, forward_lost, overflow{extra} FROM epochs_v0"
            " WHERE state != 'created'"
        )
        db.execute(
            "UPDATE epochs SET received = (SELECT COUNT(*) FROM results r WHERE"
            " r.session_id = epochs.session_id AND r.epoch = epochs.epoch)"
        )
        db.execute("DROP TABLE epochs_v0")
    if version < 3:
        db.execute(
            "UPDATE epochs SET top = COALESCE((SELECT MAX(record_id) FROM results r WHERE"
            " r.session_id = epochs.session_id AND r.epoch = epochs.epoch), 0)"
        )
    if "cursor" in _columns(db, "sessions"):
        for statement in MIGRATE_CURSOR:
            db.execute(statement)
    for column in SESSION_COLUMNS_DROPPED:
        if column in _columns(db, "sessions"):
            db.execute(f"ALTER TABLE sessions DROP COLUMN {column}")
    _check_references(db)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


#: Version 6 and older kept each session's cursor and totals in its ``sessions`` row,
#: written with every batch of results; from version 7 they are read from its epochs
#: (the cursor: its current epoch's ``top``; the totals: sums). ``MIGRATE_CURSOR`` carries
#: the cursor over (one beyond its epoch's top, or of an epoch without a row, is kept:
#: the agent was acknowledged up to it), for SQLite and PostgreSQL alike; the totals
#: were those sums already.
MIGRATE_CURSOR = (
    "INSERT INTO epochs(session_id, epoch, started_ns) SELECT s.id, s.epoch, s.created_ns"
    " FROM sessions s WHERE s.cursor > 0 AND NOT EXISTS (SELECT 1 FROM epochs e"
    " WHERE e.session_id = s.id AND e.epoch = s.epoch)",
    "UPDATE epochs SET top = (SELECT s.cursor FROM sessions s WHERE s.id = epochs.session_id)"
    " WHERE EXISTS (SELECT 1 FROM sessions s WHERE s.id = epochs.session_id"
    " AND s.epoch = epochs.epoch AND s.cursor > epochs.top)",
)
SESSION_COLUMNS_DROPPED = (
    "cursor", "sent", "lost", "forward_lost", "overflow", "unclassified_lost", "ssid_zero",
)  # fmt: skip


def _migrate_0_to_1(db: sqlite3.Connection) -> None:
    """Version 0 (no user_version): nodes without the agent's run and bound port, and
    session names unique even among destroyed sessions (the table is rebuilt: SQLite
    cannot drop a column's constraint)."""
    # Version 0 kept no history per epoch: each session gets one row for its current
    # epoch, holding its totals (and ended if the session is).
    # The loss columns some version-0 files had (added before the schema had a version)
    # go with them: a session's totals are read from its epochs.
    extra = "".join(
        f", {c}" for c in ("unclassified_lost", "ssid_zero") if c in _columns(db, "sessions")
    )
    db.execute(
        "CREATE TABLE epochs_v0 AS SELECT id, epoch, created_ns, sent, lost, forward_lost,"  # noqa: S608 - column names of the file's schema
        f" overflow, state{extra} FROM sessions"
    )
    create = next(
        s for s in _statements(SCHEMA) if "CREATE TABLE IF NOT EXISTS sessions (" in s
    ).replace("IF NOT EXISTS sessions", "sessions_new")
    db.execute(create)
    common = ", ".join(sorted(_columns(db, "sessions") & _columns(db, "sessions_new")))
    # The column names come from the file's own schema, not from any input.
    db.execute(f"INSERT INTO sessions_new({common}) SELECT {common} FROM sessions")  # noqa: S608
    db.execute("DROP TABLE sessions")
    db.execute("ALTER TABLE sessions_new RENAME TO sessions")
    have = _columns(db, "nodes")
    for column, kind in (
        ("port", "INTEGER"),
        ("agent_epoch", "TEXT"),
        ("agent_started_ns", "INTEGER"),
        ("restarts", "INTEGER NOT NULL DEFAULT 0"),
    ):
        if column not in have:
            db.execute(f"ALTER TABLE nodes ADD COLUMN {column} {kind}")


def _migrate_1_to_2(db: sqlite3.Connection) -> None:
    """Version 1: results without flow label, loopback and direct-measurement counters
    (the events table is created with the rest of the schema)."""
    have = _columns(db, "results")
    for column, kind in (
        ("flow_label", "INTEGER"),
        ("loopback", "INTEGER NOT NULL DEFAULT 0"),
        ("s_txc", "INTEGER"),
        ("r_rxc", "INTEGER"),
        ("r_txc", "INTEGER"),
        ("s_rxc", "INTEGER"),
    ):
        if column not in have:
            db.execute(f"ALTER TABLE results ADD COLUMN {column} {kind}")


def _claim_created(db: _Db, names: Sequence[str], claimer: str) -> dict[str, tuple[int, int]]:
    """Move the sessions of these names still ``created`` to ``starting`` claimed by
    ``claimer`` (in the caller's transaction), in chunks of 500; the names moved, with
    each one's (id, epoch)."""
    claimed: dict[str, tuple[int, int]] = {}
    for i in range(0, len(names), 500):
        chunk = list(names[i : i + 500])
        rows = db.execute(
            # ``state != 'destroyed'``: SQLite uses the live-name index only with its
            # very condition (a scan per chunk otherwise).
            "UPDATE sessions SET state='starting', claimed_by=?, restart_reason=NULL"  # noqa: S608
            " WHERE state != 'destroyed' AND state='created' AND name IN ("
            + ",".join("?" * len(chunk)) + ") RETURNING name, id, epoch",
            [claimer, *chunk],
        ).fetchall()  # fmt: skip
        claimed.update((r[0], (r[1], r[2])) for r in rows)
    return claimed


def _begin_epoch(db: _Db, name: str, now_ns: int, sender_agent: str | None, reason: str) -> int:
    """The body of ``Store.begin_epoch`` (in the caller's transaction)."""
    row = db.execute(
        "SELECT id, epoch, state FROM sessions WHERE name=? AND state != 'destroyed'", (name,)
    ).fetchone()
    if row is None:
        raise NotFoundError(f"session: no session named {name!r}")
    sid, epoch, state = row
    if state == "destroying":
        raise DestroyingError(f"session: {name!r} is being destroyed")
    if db.execute("SELECT 1 FROM epochs WHERE session_id=? AND epoch=?", (sid, epoch)).fetchone():
        _end_epoch(db, sid, epoch, now_ns, reason)
        epoch += 1
        db.execute("UPDATE sessions SET epoch=? WHERE id=?", (epoch, sid))
    db.execute(
        "INSERT INTO epochs(session_id, epoch, started_ns, sender_agent) VALUES (?, ?, ?, ?)",
        (sid, epoch, now_ns, sender_agent),
    )
    result: int = epoch
    return result


def _end_epoch(db: _Db, sid: int, epoch: int, now_ns: int, reason: str) -> None:
    db.execute(
        "UPDATE epochs SET ended_ns=?, end_reason=? WHERE session_id=? AND epoch=?"
        " AND ended_ns IS NULL",
        (now_ns, reason, sid, epoch),
    )
