"""The housekeeping pass's roll-up on a store, alone (issue 15): ``Store.roll_up`` called
as ``Housekeeper.run_once`` calls it (reads of ``ROLL_UP_LIMIT`` records until one comes
short), with no waits between reads and no collection beside it, wall and CPU seconds.

``--sessions`` sessions of one epoch each hold a minute of records at a packet a second
(a few lost, delays of some µs, T1 half a minute past a minute's start, so that each
session's records span two minutes); the first pass rolls them up, a second minute of
records is stored, and the second pass rolls those up, merging into the minute each
session's first pass stored (as every pass does at 1 pps and a pass a minute). SQLite
(a temporary file) or PostgreSQL (a throwaway lab server started here). Run it with
each tree's sources first on the path to compare trees:

    PYTHONPATH=<tree>/src .venv/bin/python benchmarks/bench_rollup_pass.py --db sqlite
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from sixlab.controller.housekeeping import ROLL_UP_LIMIT
from sixlab.controller.rollup import MINUTE_NS
from sixlab.controller.store import ResultBatch, Store, open_store
from sixlab.wire.timestamp import ErrorEstimate

T0 = 1_700_000_000 * 10**9 // MINUTE_NS * MINUTE_NS + 30 * 10**9
EE = ErrorEstimate(scale=10, multiplier=3).to_int()


def _store(store: Store, ids: list[int], first: int, last: int, rng: random.Random) -> None:
    """Seqs first..last-1 of every session, in batches of 5 s as collection stores them."""
    for start in range(first, last, 5):
        batches = []
        for sid in ids:
            rows: list[tuple[Any, ...]] = []
            for seq in range(start, min(start + 5, last)):
                if rng.random() < 0.01:
                    continue  # lost
                t1 = T0 + seq * 10**9 + sid * 1000
                d, b = rng.randint(20_000, 40_000), rng.randint(20_000, 40_000)
                rows.append((sid, 0, seq + 1, seq, t1, t1 + d, t1 + d + 3000,
                             t1 + d + 3000 + b, EE, EE, 255, seq, None, 0, None, None, None,
                             None))  # fmt: skip
            batches.append(ResultBatch(sid, 0, (), None, rows))
        store.store_many(batches)


def _pass(store: Store) -> tuple[int, int, float, float]:
    """(records, reads, wall s, CPU s) of one pass."""
    c0, t0 = time.process_time(), time.monotonic()
    records = reads = 0
    while True:
        n = store.roll_up(limit=ROLL_UP_LIMIT)
        records, reads = records + n, reads + 1
        if n < ROLL_UP_LIMIT:
            break
    return records, reads, time.monotonic() - t0, time.process_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--sessions", type=int, default=10_000)
    args = parser.parse_args()
    pg = None
    if args.db == "postgresql":
        from sixlab.testbed import LabPostgres  # noqa: PLC0415

        pg = LabPostgres(settings={"max_connections": "50", "shared_buffers": "256MB"})
        url = pg.create_database("bench")
    else:
        url = str(Path(tempfile.mkdtemp(prefix="bench-pass-")) / "c.sqlite")
    try:
        store = open_store(url)
        store.add_node("s1", "127.0.0.1:1", "sender")
        store.add_node("r1", "127.0.0.1:2", "reflector")
        names = [f"p{i}" for i in range(args.sessions)]
        rows = store.add_sessions([(n, i + 1, "s1", "r1", {}) for i, n in enumerate(names)],
                                  now_ns=0)  # fmt: skip
        store.begin_epochs([(n, "a") for n in names], 1)
        ids = [r.id for r in rows]
        rng = random.Random(1)
        print("pass                      records  reads  wall s  CPU s  CPU µs/record")
        for label, first in (("first (new minutes)", 0), ("second (merging)", 60)):
            _store(store, ids, first, first + 60, rng)
            records, reads, wall, cpu = _pass(store)
            print(f"{label:24} {records:8} {reads:6} {wall:7.2f} {cpu:6.2f}"
                  f" {cpu * 1e6 / max(records, 1):14.2f}", flush=True)  # fmt: skip
        store.close()
    finally:
        if pg is not None:
            pg.close()


if __name__ == "__main__":
    main()
