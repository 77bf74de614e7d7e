"""Split a controller's CPU by what it did, from ``bench_controller.py --py-spy FILE``.

Each thread's CPU over the window (``FILE.threads.json``, from ``/proc``) is shared
among that thread's py-spy samples that were not waiting (a lock, a condition, a
queue, a gRPC read), by the first matching part of the stack below, so that the
figures are CPU seconds, not samples (py-spy counts a thread blocked on a lock as
active). Printed: seconds and share of the process's CPU per part.

    .venv/bin/python benchmarks/spy_split.py FILE [--window 20] [--results N]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path

#: A sample whose innermost frames include one of these waited rather than ran.
WAITS = (
    "Condition.wait",
    "Event.wait",
    "Queue.get",
    "_wait_once",
    "Lock.acquire",
    "_try_session_locks",
    "Controller._session_lock",
    "SqliteStore._locked",
    "select (selectors",
    "sleep",
    "Connection.wait",  # psycopg waiting for the server
)

#: (part, a frame that marks it), first match from the innermost frame outward.
PARTS = (
    ("stream: acknowledge", "acknowledge_many"),
    ("stream: metrics", "ControllerMetrics."),
    ("stream: commit", "_GeneratorContextManager.__exit__"),
    ("stream: insert results", "_insert_results"),
    ("stream: counters", "_set_counters"),
    ("stream: received counts", "_add_received"),
    ("stream: cursors", "_set_cursors"),
    ("stream: store (rest)", "Store.store_many"),
    ("stream: rows from protobuf", "_rows"),
    ("stream: judge (thresholds)", "Controller._judge"),
    ("stream: gather/merge", "Controller._gather"),
    ("stream: gather/merge", "_merge"),
    ("stream: store batches (rest)", "Controller._store_batches"),
    ("stream: store messages (rest)", "Controller._store_messages"),
    ("stream: read (gRPC, parse)", "_read_stream"),
    ("supervisor: GetAgentInfo", "AgentClient.info"),
    ("supervisor: store reads (ssids_of, ...)", "Store.ssids_of"),
    ("supervisor: health write", "set_health"),
    ("supervisor: rest", "Controller._supervise"),
    ("housekeeping", "_housekeep"),
    ("rollups", "rollup"),
    ("metrics scrape", "collect"),
    ("notices", "_on_notice"),
)


def _part(frames: list[str]) -> str:
    for name, mark in PARTS:
        if any(mark in f for f in frames):
            return name
    return "other: " + re.sub(r"\d+", "N", frames[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--results", type=int, default=0, help="results stored in the window")
    args = ap.parse_args()
    cpu = {int(k): v for k, v in json.loads(Path(args.file + ".threads.json").read_text()).items()}
    samples: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in Path(args.file).read_text().splitlines():
        stack, count = line.rsplit(" ", 1)
        frames = stack.split(";")
        tid = int(re.search(r"\((\d+)\)", frames[0]).group(1))  # type: ignore[union-attr]
        inner = frames[-3:]
        if any(w in f for f in inner for w in WAITS):
            continue
        samples[tid][_part([frames[0].split(": ", 1)[-1], *reversed(frames[1:])])] += int(count)
    parts: collections.Counter[str] = collections.Counter()
    for tid, seconds in cpu.items():
        got = samples.get(tid)
        if not got:
            parts["(threads never sampled running)"] += seconds
            continue
        n = sum(got.values())
        for part, k in got.items():
            parts[part] += seconds * k / n
    total = sum(parts.values())
    print(f"{'part':45} {'CPU s':>8} {'share':>7}" + ("  µs/result" if args.results else ""))
    for part, seconds in sorted(parts.items(), key=lambda kv: -kv[1]):
        per = f"  {seconds / args.results * 1e6:9.1f}" if args.results else ""
        print(f"{part:45} {seconds:8.2f} {seconds / total:7.1%}{per}")
    print(f"{'total':45} {total:8.2f}")


if __name__ == "__main__":
    main()
