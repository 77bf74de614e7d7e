"""The controller's roll-up of one read of results, side by side (issue 15): the rows
folded by ``StampResult`` each and ``roll_up`` per epoch (the reference) and by
``roll_up_columns`` (NumPy, all epochs at once), CPU µs per record, best of
``--repeat``. The rows are what ``Store.roll_up`` reads (``RESULT_COLUMNS`` order,
by session, epoch, record id), synthetic: ``--rows`` rows of each of ``--sessions``
settings, a packet a second with a few lost, delays of some µs.

    .venv/bin/python benchmarks/bench_rollup.py --rows 20000 --sessions 10000 100
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from sixlab.controller.rollup import MINUTE_NS, MinuteRollup, roll_up, roll_up_columns
from sixlab.stamp import StampResult
from sixlab.wire.timestamp import ErrorEstimate

T0 = 1_700_000_000 * 10**9 // MINUTE_NS * MINUTE_NS
EE = (
    ErrorEstimate(scale=10, multiplier=3).to_int(),
    ErrorEstimate(scale=12, multiplier=1).to_int(),
)


def _rows(total: int, sessions: int) -> list[tuple[Any, ...]]:
    rng = random.Random(1)
    per = total // sessions
    rows = []
    for sid in range(1, sessions + 1):
        seqs = [s for s in range(2 * per + 2) if rng.random() > 0.05][:per]
        for rid, seq in enumerate(seqs, 1):
            t1 = T0 + seq * 10**9 + sid * 1000
            d, b = rng.randint(-500, 40_000), rng.randint(20_000, 40_000)
            t3 = t1 + d + 3000
            rows.append((sid, 0, rid, seq, t1, t1 + d, t3, t3 + b, EE[0], EE[sid % 2], 255, seq,
                         None, 0, None, None, None, None))  # fmt: skip
    return rows


def reference(rows: list[tuple[Any, ...]]) -> dict[tuple[int, int, int], MinuteRollup]:
    """What ``Store.roll_up`` did per read before: a ``StampResult`` per row, then
    ``roll_up`` per epoch."""
    pending: dict[tuple[int, int], list[tuple[int, StampResult]]] = {}
    for r in rows:
        ee = ErrorEstimate.from_int
        res = StampResult(0, r[3], r[4], r[5], r[6], r[7], ee(r[8]), ee(r[9]), r[10], r[11],
                          r[12], bool(r[13]))  # fmt: skip
        pending.setdefault((r[0], r[1]), []).append((r[2], res))
    out = {}
    for (sid, ep), recs in pending.items():
        for minute, m in roll_up(recs, None)[0].items():
            out[sid, ep, minute] = m
    return out


def vectorized(rows: list[tuple[Any, ...]]) -> dict[tuple[int, int, int], MinuteRollup]:
    """``Store.roll_up`` now: the columns, then ``roll_up_columns``."""
    columns = list(zip(*rows, strict=True))
    return roll_up_columns(columns[:10], {})[0]


def _best(fn: Any, rows: list[tuple[Any, ...]], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn(rows)
        best = min(best, time.process_time() - start)
    return best * 1e6 / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--sessions", type=int, nargs="+", default=[10_000, 100])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print("sessions  rows/session  reference µs/record  vectorized µs/record  ratio")
    for sessions in args.sessions:
        rows = _rows(args.rows, sessions)
        if vectorized(rows) != reference(rows):
            raise SystemExit("the two roll-ups differ")
        ref = _best(reference, rows, args.repeat)
        vec = _best(vectorized, rows, args.repeat)
        print(
            f"{sessions:8}  {len(rows) // sessions:12}  {ref:19.2f}  {vec:20.2f}  {ref / vec:5.1f}"
        )


if __name__ == "__main__":
    main()
