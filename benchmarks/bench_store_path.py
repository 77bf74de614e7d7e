"""The controller's per-result collection path alone: stream messages in, rows stored
(issue 15). No gRPC, no agents: CPU per stored result of what the controller does with
each ``StreamResults`` message once it has its bytes.

One sender node with ``--sessions`` running sessions on SQLite (a temporary file) or
PostgreSQL (a throwaway lab server, ``LabPostgres``). Each round is one stream message
(``pb.ResultBatches``) per ``--senders``, each carrying a batch of ``--records``
synthetic records (as ``sixlab.southbound.simagent`` makes them) for each of its share
of the sessions, counters with every ``--counters-every``-th round; the messages are
serialized beforehand. A round parses each message's bytes and hands it to the
controller's storer (``Controller._store_messages``: merging, the epoch check, the
transaction with the results and the cursors, the metrics, the acknowledgement to a
client that does nothing). Reported: the thread's CPU per stored result (µs) and per
session batch, over ``--rounds`` rounds after ``--warmup`` rounds, for the parse and
for the whole (and the wall-clock time, with the slowest round: a commit that
checkpoints waits for the disk); ``--profile`` prints a cProfile of the measured
rounds. ``--messages M`` stores M rounds' messages in one transaction, as group
commit gathers a backlog (each session then has M batches to join). ``--statements``
(SQLite) prints the thread's CPU per row stored spent in each SQL statement, warm-up
rounds included.

    .venv/bin/python benchmarks/bench_store_path.py --db sqlite --sessions 1000 \\
        --records 5 --rounds 20
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

from sixlab.controller import Controller
from sixlab.controller.store import SessionRow, SqliteStore, Store, open_store
from sixlab.southbound import AgentClient
from sixlab.southbound import stamp_pb2 as pb

BASE_NS = 1_800_000_000_000_000_000
INTERVAL_NS = 200_000_000


class _TimedConnection:
    """The SQLite store's connection, timing each statement (``--statements``): the
    calling thread's CPU in ``execute``/``executemany`` by the statement's first 60
    characters; everything else passed through."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def _timed(self, name: str, sql: str, args: tuple[Any, ...]) -> Any:
        key = ("many " if name == "executemany" else "") + " ".join(sql.split())[:60]
        t0 = time.thread_time()
        try:
            return getattr(self._conn, name)(sql, *args)
        finally:
            self.seconds[key] = self.seconds.get(key, 0.0) + time.thread_time() - t0
            self.calls[key] = self.calls.get(key, 0) + 1

    def execute(self, sql: str, *args: Any) -> Any:
        return self._timed("execute", sql, args)

    def executemany(self, sql: str, *args: Any) -> Any:
        return self._timed("executemany", sql, args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _NoAgent:
    """What the storer calls on a sender agent's client: nothing to do."""

    def acknowledge_many(
        self,
        acks: dict[int, int],
        through_loss_ids: dict[int, int] | None = None,
        *,
        counts: bool = True,
    ) -> None:
        del acks, through_loss_ids, counts

    def close(self) -> None:
        pass


class _Stream:
    """What the storer reads of the sender's stream: its node, its sessions' names, and
    whether they changed."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.names: set[str] = set()
        self.changed = threading.Event()


def _record(ssid: int, rid: int) -> pb.StampResult:
    seq = rid - 1
    t1 = BASE_NS + seq * INTERVAL_NS + ssid * 1000
    return pb.StampResult(
        ssid=ssid, seq=seq, t1_ns=t1, t2_ns=t1 + 1_000_000, t3_ns=t1 + 1_010_000,
        t4_ns=t1 + 2_010_000, sender_error_estimate=0x8001, sender_error_ns=1,
        reflector_error_estimate=0x8001, reflector_error_ns=1, ses_sender_ttl=255,
        reflector_seq=seq, record_id=rid,
    )  # fmt: skip


def _messages(
    rows: list[SessionRow], senders: int, records: int, round_no: int, counters: bool
) -> list[bytes]:
    """One round's stream messages, serialized: each sender's share of the sessions."""
    out = []
    for k in range(senders):
        msg = pb.ResultBatches()
        for row in rows[k::senders]:
            first = round_no * records + 1
            b = msg.batches.add(ssid=row.ssid, state=pb.SESSION_STATE_RUNNING)
            b.results.extend(_record(row.ssid, rid) for rid in range(first, first + records))
            if counters:
                top = first + records - 1
                b.counters.CopyFrom(
                    pb.SessionCounters(ssid=row.ssid, sent=top, received=top, lost=0)
                )
        out.append(msg.SerializeToString())
    return out


def _setup(store: Store, sessions: int) -> list[SessionRow]:
    store.add_node("s0", "127.0.0.1:1", "sender")
    store.add_node("r0", "127.0.0.1:2", "reflector")
    params = {"reflector_address": "2001:db8::2", "interval_ns": INTERVAL_NS}
    names = [f"p{i}" for i in range(sessions)]
    store.add_sessions([(n, i + 1, "s0", "r0", params) for i, n in enumerate(names)], now_ns=1)
    store.set_states(names, "running")
    store.begin_epochs([(n, None) for n in names], BASE_NS)
    return store.sessions_named(names)


def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    store = open_store(url)
    timed = None
    if args.statements:
        if not isinstance(store, SqliteStore):
            raise SystemExit("--statements: SQLite only")
        timed = _TimedConnection(store._conn)
        store._conn = cast(Any, timed)
    rows = _setup(store, args.sessions)
    ctl = Controller(
        store,
        supervise_interval_s=None,
        client_factory=lambda _address: cast(AgentClient, _NoAgent()),
    )
    st = cast(Any, _Stream("s0"))
    subs = {r.ssid: r for r in rows}
    inbox: queue.Queue[Any] = queue.Queue()
    total_rounds = args.warmup + args.rounds
    data = [
        _messages(rows, args.senders, args.records, n, n % args.counters_every == 0)
        for n in range(total_rounds)
    ]
    parse_s = total_s = wall_s = 0.0
    worst_s = 0.0
    profile = cProfile.Profile() if args.profile else None
    step = args.messages
    if args.warmup % step or args.rounds % step:
        raise SystemExit("--warmup and --rounds must be multiples of --messages")
    for n in range(0, total_rounds, step):
        measured = n >= args.warmup
        if measured and profile is not None:
            profile.enable()
        w0 = time.monotonic()
        t0 = time.thread_time()
        got = [
            (time.time_ns(), pb.ResultBatches.FromString(b))
            for round_data in data[n : n + step]
            for b in round_data
        ]
        t1 = time.thread_time()
        if step == 1:
            for item in got:
                ctl._store_messages(st, subs, inbox, [item])
        else:
            ctl._store_messages(st, subs, inbox, got)
        t2 = time.thread_time()
        w1 = time.monotonic()
        if profile is not None:
            profile.disable()
        if measured:
            parse_s += t1 - t0
            total_s += t2 - t0
            wall_s += w1 - w0
            worst_s = max(worst_s, w1 - w0)
    stored = args.rounds * args.sessions * args.records
    expected = total_rounds * args.sessions * args.records
    in_store = sum(store.count_results(r.id) for r in rows[:: max(1, len(rows) // 20)])
    sampled = len(rows[:: max(1, len(rows) // 20)]) * total_rounds * args.records
    ctl.close()
    store.close()
    if in_store != sampled:
        raise SystemExit(f"stored {in_store} of {sampled} sampled records")
    if profile is not None:
        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(35)
    if timed is not None:
        for key, secs in sorted(timed.seconds.items(), key=lambda kv: -kv[1])[:12]:
            per_row = secs / expected * 1e6
            print(f"{per_row:8.2f} us/row {timed.calls[key]:7d} calls  {key}", file=sys.stderr)
    return {
        "db": args.db,
        "sessions": args.sessions,
        "records_per_batch": args.records,
        "senders": args.senders,
        "rounds": args.rounds,
        "messages_per_transaction": args.messages,
        "results_total": expected,
        "us_per_result": round(total_s / stored * 1e6, 2),
        "us_parse_per_result": round(parse_s / stored * 1e6, 2),
        "us_wall_per_result": round(wall_s / stored * 1e6, 2),
        "worst_round_ms": round(worst_s * 1e3, 1),
        "us_per_session_batch": round(total_s / (args.rounds * args.sessions) * 1e6, 2),
        "results_per_cpu_s": round(stored / total_s),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--records", type=int, default=5, help="records per session batch")
    ap.add_argument("--senders", type=int, default=1, help="stream messages per round")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument(
        "--messages", type=int, default=1,
        help="rounds stored per transaction (a backlog: several messages per session)",
    )  # fmt: skip
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--counters-every", type=int, default=4)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument(
        "--statements", action="store_true",
        help="SQLite: the CPU per row stored of each SQL statement (stderr)",
    )  # fmt: skip
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
