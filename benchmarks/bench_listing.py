"""The cost of reading sessions' rows at 10,000 sessions (issue 15): the statements
behind ``Store.sessions`` (the northbound ListSessions and Export, ``apply``, the
controller's metrics and ``resume``), ``Store.session`` (one session by name: every
request on one), ``Store.sessions_named`` (a poll round's 256 sessions, the stops
completed in a supervisor round) and ``Store.sessions_of`` (a sender's sessions: its
result stream reopened, an agent's sessions repaired); and the listing's statement
alone, its rows fetched but not made ``SessionRow``s (``sessions() SQL only``).

``--sessions`` sessions over ``--nodes`` sender and reflector pairs, each with
``--epochs`` epochs, ``--records`` results and counters in each, on SQLite (a
temporary file) or PostgreSQL (a throwaway lab server, ``LabPostgres``, analysed
after the fill). Only the store's public API is used, so that the same file measures
another tree (``PYTHONPATH=/tmp/base/src``). Reported per statement: the median and
the fastest wall-clock time of ``--repeat`` reads (ms), after a warm-up read, and the
median CPU time of the reading thread (``cpu_ms``: SQLite's whole work, PostgreSQL's
client side only); ``--explain`` prints each statement's plan (``EXPLAIN QUERY PLAN``
/ ``EXPLAIN (ANALYZE)``, with PostgreSQL's JIT compilation time) on stderr.

    .venv/bin/python benchmarks/bench_listing.py --db sqlite --sessions 10000 --epochs 3
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sixlab.controller.store as store_module
from sixlab.controller.store import Counters, ResultBatch, SessionRow, Store, open_store
from sixlab.stamp import StampResult
from sixlab.wire.timestamp import ErrorEstimate

BASE_NS = 1_800_000_000_000_000_000
INTERVAL_NS = 1_000_000_000
EE = ErrorEstimate(scale=10, multiplier=3)


def _result(seq: int) -> StampResult:
    t1 = BASE_NS + seq * INTERVAL_NS
    return StampResult(0, seq, t1, t1 + 100, t1 + 150, t1 + 300, EE, EE, 62, seq)


def fill(store: Store, sessions: int, nodes: int, epochs: int, records: int) -> list[str]:
    """``sessions`` running sessions, each through ``epochs`` epochs with ``records``
    results and counters in each (sent = 10 x the epoch + 10, lost 1)."""
    for k in range(nodes):
        store.add_node(f"s{k}", f"127.0.0.1:{2 * k + 1}", "sender")
        store.add_node(f"r{k}", f"127.0.0.1:{2 * k + 2}", "reflector")
    params = {"reflector_address": "2001:db8::2", "interval_ns": INTERVAL_NS}
    names = [f"p{i}" for i in range(sessions)]
    store.add_sessions(
        [(n, i // nodes + 1, f"s{i % nodes}", f"r{i % nodes}", params)
         for i, n in enumerate(names)],
        now_ns=1,
    )  # fmt: skip
    store.set_states(names, "running")
    for epoch in range(epochs):
        store.begin_epochs([(n, None) for n in names], BASE_NS + epoch)
        ids = {r.name: r.id for r in store.sessions()}
        batches = [
            ResultBatch(
                ids[n], epoch, [(rid, _result(rid - 1)) for rid in range(1, records + 1)],
                Counters(10 * epoch + 10, 1, 0, 0),
            )
            for n in names
        ]  # fmt: skip
        for i in range(0, len(batches), 2000):
            store.store_many(batches[i : i + 2000], now_ns=BASE_NS + epoch)
    return names


def _check(rows: list[SessionRow], epochs: int, records: int) -> None:
    """What every tree must read back: the cursor of the current epoch, the sums."""
    sent = sum(10 * e + 10 for e in range(epochs))
    for r in rows:
        got = (r.epoch, r.cursor, r.sent, r.lost, r.forward_lost, r.overflow)
        if got != (epochs - 1, records, sent, epochs, 0, 0):
            raise SystemExit(f"session {r.name}: read {got}")


def _time(fn: Callable[[], object], repeat: int) -> dict[str, float]:
    fn()
    laps, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        laps.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return {"median_ms": round(statistics.median(laps) * 1e3, 3),
            "min_ms": round(min(laps) * 1e3, 3),
            "cpu_ms": round(statistics.median(cpu) * 1e3, 3)}  # fmt: skip


def _statement(store: Store, where: str, tail: str) -> str:
    """The store's statement for these rows, as the tree measured builds it."""
    build = getattr(store, "_select_sessions", None)
    if build is not None:
        return str(build(where, tail))
    # A tree before this method: one query text (the store's own, or the module's),
    # the WHERE clause appended.
    select = getattr(store, "_sessions_sql", None) or vars(store_module)["_SELECT_SESSIONS"]
    return f"{select} WHERE {where} {tail}"


def _fetch(store: Store, sql: str) -> None:
    """The statement's rows fetched as the store fetches them, not made SessionRows."""
    with store._lock:
        store._db.execute(sql).fetchall()


def _explain(url: str, statements: dict[str, tuple[str, list[Any]]]) -> None:
    for label, (sql, params) in statements.items():
        if url.startswith("postgresql"):
            import psycopg  # noqa: PLC0415

            with psycopg.connect(url, autocommit=True) as db:
                text = sql.replace("?", "%s")
                plan = [r[0] for r in db.execute("EXPLAIN (ANALYZE) " + text, params).fetchall()]
        else:
            import sqlite3  # noqa: PLC0415

            with sqlite3.connect(url) as db:
                plan = [r[3] for r in db.execute("EXPLAIN QUERY PLAN " + sql, params)]
        print(f"-- {label}: {sql}\n" + "\n".join(plan) + "\n", file=sys.stderr)


def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    store = open_store(url)
    t0 = time.monotonic()
    names = fill(store, args.sessions, args.nodes, args.epochs, args.records)
    fill_s = time.monotonic() - t0
    if url.startswith("postgresql"):
        import psycopg  # noqa: PLC0415

        with psycopg.connect(url, autocommit=True) as db:
            db.execute("ANALYZE")
    _check(store.sessions(), args.epochs, args.records)
    listing = _statement(store, "state != 'destroyed'", "ORDER BY id")
    rng = random.Random(1)
    named = rng.sample(names, 256)
    out: dict[str, Any] = {
        "db": args.db,
        "sessions": args.sessions,
        "epochs": args.epochs,
        "records": args.records,
        "nodes": args.nodes,
        "fill_s": round(fill_s, 1),
        "sessions()": _time(store.sessions, args.repeat),
        "session(name)": _time(lambda: store.session(rng.choice(names)), args.repeat * 20),
        "sessions_named(256)": _time(lambda: store.sessions_named(named), args.repeat * 4),
        "sessions_of(sender)": _time(lambda: store.sessions_of("s0"), args.repeat * 4),
        "sessions() SQL only": _time(lambda: _fetch(store, listing), args.repeat),
    }
    store.close()
    if args.explain:
        _explain(url, {
            "sessions()": (_statement(store, "state != 'destroyed'", "ORDER BY id"), []),
            "session(name)": (
                _statement(store, "name=?", "ORDER BY state = 'destroyed', id DESC LIMIT 1"),
                [names[7]],
            ),
            "sessions_of(sender)": (
                _statement(store, "sender=? AND state != 'destroyed'", "ORDER BY id"), ["s0"]
            ),
        })  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=10, help="sender/reflector pairs")
    ap.add_argument("--epochs", type=int, default=3, help="epochs per session")
    ap.add_argument("--records", type=int, default=2, help="results per epoch")
    ap.add_argument("--repeat", type=int, default=10, help="reads of all (x20 of one)")
    ap.add_argument("--explain", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.db == "sqlite":
            out = run(args, str(Path(tmp) / "bench.db"))
        else:
            from sixlab.testbed.postgres import LabPostgres  # noqa: PLC0415

            with LabPostgres() as pg:
                out = run(args, pg.create_database("bench"))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
