"""The cost of notices across the stores of one SQLite file (docs/architecture.md,
"Notices"): the time of a write that announces (``Store.update_node``: one UPDATE and
its ``changed`` notice, with the notice's row since version 8), the fastest of
``--repeat`` runs of ``--calls`` calls; and the CPU time of a process whose second store
listens (its thread reading ``PRAGMA data_version`` every ``NOTICE_POLL_S``) while
nothing changes, over ``--idle`` seconds, as a share of one core. Only the store's
public API is used, so that the same file measures another tree
(``PYTHONPATH=/tmp/base/src``).

    .venv/bin/python benchmarks/bench_notices.py --calls 2000 --idle 10
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from sixlab.controller.store import SqliteStore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="announcing writes per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the fastest is reported")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle listening")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.sqlite"
        a = SqliteStore(path)
        try:
            a.add_node("s1", "h:1", "sender")
            runs = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                for i in range(args.calls):
                    a.update_node("s1", f"h:{i % 7 + 1}", "sender")
                runs.append((time.perf_counter() - start) / args.calls)
            print(f"update_node: {min(runs) * 1e6:.0f} us a call (fastest of {args.repeat}"
                  f" x {args.calls})")  # fmt: skip
            b = SqliteStore(path)
            try:
                b.subscribe(lambda _kind, _arg: None)
                cpu, wall = time.process_time(), time.monotonic()
                time.sleep(args.idle)
                share = (time.process_time() - cpu) / (time.monotonic() - wall)
                print(f"idle with one listener: {share * 100:.2f} % of a core over {args.idle:g} s")
            finally:
                b.close()
        finally:
            a.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
