"""What one result row costs SQLite at thousands of sessions, outside the controller
(issue 15; benchmarks/README.md, "The SQLite store at 10,000 sessions").

Each round stores one row per session, ``--per-txn`` sessions' rows a transaction, the
sessions of a transaction spread over all of them as ten sender agents' are (session
k, k + n/per-txn, ...), after ``--warmup`` rounds (each session then holds that many
rows). Reported: wall-clock time per row, the process's user and system CPU per row,
and the wall time per row of the insert, the epochs' upsert and ``COMMIT``.

``--schema store``: the controller's schema (``open_store``) and its results insert
(``INSERT ... ON CONFLICT DO NOTHING``), or the plain insert in a savepoint as the store
ran it before (``--variant savepoint``, and ``savepoint-memory`` with
``PRAGMA temp_store=MEMORY``). ``--schema bare``: the results table and the epochs'
upsert by hand, to try what the store does not do: ``p1k``/``p8k`` (page size 1 or 8
KiB), ``noseq`` (without the (session, epoch, Seq) index), ``bgck`` (checkpoints by a
second connection in a thread every 8 commits, none by the writer), ``ck0`` (no
checkpoint at all).

    .venv/bin/python benchmarks/bench_sqlite_write.py --schema store --variant savepoint
    .venv/bin/python benchmarks/bench_sqlite_write.py --schema bare --variant p1k
"""

from __future__ import annotations

import argparse
import json
import resource
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sixlab.controller.store import RESULT_COLUMNS, SqliteStore, open_store

T0 = 1_800_000_000_000_000_000
# Built from the store's column list as the store builds its own. The
# base's insert, run in a savepoint; the store's own since, which skips a row whose keys
# are stored (docs/architecture.md, "The SQLite store's write path").
INSERT = (
    "INSERT INTO results(" + ", ".join(RESULT_COLUMNS) + ") VALUES ("
    + ",".join("?" * len(RESULT_COLUMNS)) + ")"
)  # fmt: skip
INSERT_NEW = INSERT + " ON CONFLICT DO NOTHING"
BARE_COLUMNS = (
    "session_id INTEGER NOT NULL, epoch INTEGER NOT NULL, record_id INTEGER NOT NULL,"
    " seq INTEGER NOT NULL, t1_ns INTEGER NOT NULL, t2_ns INTEGER NOT NULL,"
    " t3_ns INTEGER NOT NULL, t4_ns INTEGER NOT NULL, sender_ee INTEGER NOT NULL,"
    " reflector_ee INTEGER NOT NULL, ttl INTEGER NOT NULL, reflector_seq INTEGER NOT NULL,"
    " flow_label INTEGER, loopback INTEGER NOT NULL DEFAULT 0, s_txc INTEGER, r_rxc INTEGER,"
    " r_txc INTEGER, s_rxc INTEGER"
)
UPSERT = (
    "INSERT INTO epochs(session_id, epoch, started_ns, received, top) VALUES (?, ?, 0, ?, ?)"
    " ON CONFLICT(session_id, epoch) DO UPDATE SET received = epochs.received"
    " + excluded.received, top = CASE WHEN epochs.top > excluded.top THEN epochs.top"
    " ELSE excluded.top END"
)


def _row(sid: int, rid: int) -> tuple[Any, ...]:
    t1 = T0 + rid * 10**9 + sid
    return (sid, 0, rid, rid - 1, t1, t1 + 5000, t1 + 6000, t1 + 9000, 0x8001, 0x8001, 255,
            rid - 1, None, 0, None, None, None, None)  # fmt: skip


def _bare(path: str, variant: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    if variant in ("p1k", "p8k"):
        db.execute(f"PRAGMA page_size={1024 if variant == 'p1k' else 8192}")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA cache_size=-262144")
    db.execute(f"PRAGMA wal_autocheckpoint={0 if variant in ('ck0', 'bgck') else 16384}")
    db.execute(f"CREATE TABLE results ({BARE_COLUMNS},"
               " PRIMARY KEY (session_id, epoch, record_id)) WITHOUT ROWID")  # fmt: skip
    if variant != "noseq":
        db.execute("CREATE UNIQUE INDEX results_seq ON results(session_id, epoch, seq)")
    db.execute(
        "CREATE TABLE epochs (session_id INTEGER NOT NULL, epoch INTEGER NOT NULL,"
        " started_ns INTEGER NOT NULL, received INTEGER NOT NULL DEFAULT 0,"
        " top INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (session_id, epoch))"
    )
    return db


def _checkpointer(path: str, wake: threading.Event) -> None:
    """``bgck``: a passive checkpoint from a connection of its own at each wake."""
    db = sqlite3.connect(path, isolation_level=None)
    while True:
        wake.wait()
        wake.clear()
        db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()


def run(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    path = str(Path(tmp) / "bench.db")
    store: SqliteStore | None = None
    if args.schema == "store":
        opened = open_store(path)
        assert isinstance(opened, SqliteStore)
        store = opened
        store.add_node("s0", "127.0.0.1:1", "sender")
        store.add_node("r0", "127.0.0.1:2", "reflector")
        names = [f"p{i}" for i in range(args.sessions)]
        store.add_sessions([(n, i + 1, "s0", "r0", {}) for i, n in enumerate(names)], now_ns=1)
        store.begin_epochs([(n, None) for n in names], T0)
        db = store._conn
        ids = [r.id for r in store.sessions_named(names)]
        if args.variant == "savepoint-memory":
            db.execute("PRAGMA temp_store=MEMORY")
    else:
        db = _bare(path, args.variant)
        ids = list(range(1, args.sessions + 1))
    savepoint = args.variant.startswith("savepoint")
    insert = INSERT_NEW if args.schema == "store" and not savepoint else INSERT
    wake = threading.Event()
    if args.variant == "bgck":
        threading.Thread(target=_checkpointer, args=(path, wake), daemon=True).start()
    step = max(1, args.sessions // args.per_txn)
    commits = 0

    def round_(rid: int, t: list[float]) -> None:
        nonlocal commits
        for k in range(step):
            sids = ids[k::step]
            rows = [_row(sid, rid) for sid in sids]
            a = time.perf_counter()
            db.execute("BEGIN IMMEDIATE")
            if savepoint:
                db.execute("SAVEPOINT results_in")
            db.executemany(insert, rows)
            if savepoint:
                db.execute("RELEASE results_in")
            b = time.perf_counter()
            db.executemany(UPSERT, [(sid, 0, 1, rid) for sid in sids])
            c = time.perf_counter()
            db.execute("COMMIT")
            t[0] += b - a
            t[1] += c - b
            t[2] += time.perf_counter() - c
            commits += 1
            if args.variant == "bgck" and commits % 8 == 0:
                wake.set()

    ignored = [0.0, 0.0, 0.0]
    for rid in range(1, args.warmup + 1):
        round_(rid, ignored)
    times = [0.0, 0.0, 0.0]
    ru0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for rid in range(args.warmup + 1, args.warmup + args.rounds + 1):
        round_(rid, times)
    ru1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    n: int = args.sessions * args.rounds
    if store is not None:
        store.close()
    else:
        db.close()

    def per(seconds: float) -> float:
        return round(seconds / n * 1e6, 1)

    return {
        "schema": args.schema, "variant": args.variant, "sessions": args.sessions,
        "per_txn": args.per_txn, "warmup": args.warmup, "rounds": args.rounds,
        "us_wall_per_row": per(w1 - w0), "us_user_per_row": per(ru1.ru_utime - ru0.ru_utime),
        "us_sys_per_row": per(ru1.ru_stime - ru0.ru_stime), "us_insert_per_row": per(times[0]),
        "us_upsert_per_row": per(times[1]), "us_commit_per_row": per(times[2]),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--schema", choices=("store", "bare"), default="store")
    ap.add_argument("--variant", default="plain",
                    help="store: plain, savepoint, savepoint-memory; bare: plain, p1k, p8k,"
                         " noseq, bgck, ck0")  # fmt: skip
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--per-txn", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    known = {"store": ("plain", "savepoint", "savepoint-memory"),
             "bare": ("plain", "p1k", "p8k", "noseq", "bgck", "ck0")}  # fmt: skip
    if args.variant not in known[args.schema]:
        ap.error(f"--variant: one of {', '.join(known[args.schema])} with --schema {args.schema}")
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        print(json.dumps(run(args, tmp)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
