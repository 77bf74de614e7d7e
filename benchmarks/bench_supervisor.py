"""The supervisor's round with many sessions: CPU and store rows per round (issue 15).

One controller (SQLite, no supervisor thread) and two simulated agents in this process
(``sixlab.southbound.simagent``), a sender and a reflector holding ``--sessions``
sessions each (created, not started: a round compares them all the same). A round is
what the supervisor does for the two nodes (``Controller.check_node``): with ``full``
(the comparison of every node's sessions in the store with its agent's, each round)
and without (compared only when something changed, or every ``FULL_CHECK_S``),
alternately, ``--rounds`` rounds each time. Reported per round: the calling thread's
CPU (``time.thread_time``: the GetAgentInfo answers parsed, the store read, the
comparison; not the agents' serving threads) and the session rows read from the store.

    .venv/bin/python benchmarks/bench_supervisor.py --sessions 10000 --rounds 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sixlab.controller import Controller, SessionSpec
from sixlab.controller.store import SessionRow, SqliteStore
from sixlab.southbound.simagent import serve_simulated


class _CountingStore(SqliteStore):
    """Counts the session rows read to compare nodes with their agents."""

    rows = 0

    def ssids_of(self, node: str, *, role: str = "sender") -> list[tuple[int, str]]:
        out = super().ssids_of(node, role=role)
        _CountingStore.rows += len(out)
        return out

    def sessions_of(self, node: str, *, role: str = "sender") -> list[SessionRow]:
        out = super().sessions_of(node, role=role)
        _CountingStore.rows += len(out)
        return out


def _rounds(ctl: Controller, n: int, *, full: bool) -> tuple[float, float]:
    """CPU (ms) and store rows per round, over ``n`` rounds."""
    _CountingStore.rows = 0
    cpu0 = time.thread_time()
    for _ in range(n):
        for node in ("s", "r"):
            ctl.check_node(node, full=full)
    cpu = time.thread_time() - cpu0
    return cpu * 1000 / n, _CountingStore.rows / n


def run(args: argparse.Namespace) -> dict[str, Any]:
    sender = serve_simulated("127.0.0.1:0", "sender")
    reflector = serve_simulated("127.0.0.1:0", "reflector")
    with tempfile.TemporaryDirectory() as tmp:
        ctl = Controller(_CountingStore(Path(tmp) / "c.db"), supervise_interval_s=None)
        try:
            ctl.register_node("s", f"127.0.0.1:{sender.port}", "sender")
            ctl.register_node("r", f"127.0.0.1:{reflector.port}", "reflector")
            ctl.init_node("s")
            ctl.init_node("r")
            specs = [SessionSpec(f"p{i}", "s", "r", "2001:db8::2") for i in range(args.sessions)]
            _, errors = ctl.create_sessions(specs)
            assert not errors, errors
            out: dict[str, list[tuple[float, float]]] = {"full": [], "changed_only": []}
            for _ in range(args.repeats):
                out["full"].append(_rounds(ctl, args.rounds, full=True))
                out["changed_only"].append(_rounds(ctl, args.rounds, full=False))
        finally:
            ctl.close()
            sender.stop(None)
            reflector.stop(None)
    return {
        "sessions": args.sessions,
        "rounds": args.rounds,
        "repeats": args.repeats,
        **{
            f"{k}_cpu_ms_per_round": round(statistics.median(c for c, _ in v), 2)
            for k, v in out.items()
        },
        **{
            f"{k}_rows_per_round": round(statistics.median(r for _, r in v)) for k, v in out.items()
        },
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="alternations of the two")
    print(json.dumps(run(parser.parse_args())), flush=True)


if __name__ == "__main__":
    main()
