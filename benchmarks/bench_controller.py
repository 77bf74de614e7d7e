"""One controller against many simulated agents: create/start time, results stored per
second, collection lag, CPU and memory, on SQLite or PostgreSQL (issue 15).

The agents are simulated (``sixlab.southbound.simagent``: the real southbound gRPC API,
synthetic results at each session's rate), one process each, so that the controller is
what is measured. The controller runs as ``sixlab controller serve`` in its own process
(``--db`` a SQLite file, or a database on a throwaway lab PostgreSQL server started
here). Sessions are created and started through its northbound API, collected by
stream (one ``StreamResults`` per sender agent).

Reported, once the sessions run: results stored per second (the store's counts over
the measuring window), the controller's CPU (share of one core) and RSS (also per
1,000 sessions), collection lag, and bytes per stored result.

Collection lag is measured two ways. From outside: 50 sampled sessions are read
every ``--poll`` seconds (0.1), in one query on a connection of the benchmark's own; a
record that
appeared counts now − T4 (``lag_ms_*``, an upper bound) and, as a lower bound, the
previous look at that session − T4 (``lag_low_ms_*``: it was not stored then); the
time between looks is ``poll_gap_ms_*``. From
inside: the controller's ``sixlab_collection_stage_seconds`` histogram (every stored
result; 50 ms buckets, quantiles interpolated within a bucket) by stage: ``agent`` (T4
to the message's arrival at the controller), ``queued`` (to the transaction's start),
``transaction``, ``total`` (T4 to commit); absent from a controller without it.
``--collector none`` runs no controller: once the sessions are started, the benchmark
reads each sender agent's stream itself, acknowledging every message at once, and
reports the ``agent`` stage of an always-ready reader (the agent's batch window and
gRPC delivery alone).

    .venv/bin/python benchmarks/bench_controller.py --db sqlite --sessions 1000 --agents 10 \\
        --rate 5 --seconds 20
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _agent(role: str, loss_every: int) -> None:
    """Child process: one simulated agent; prints its port, serves until stdin closes."""
    from sixlab.southbound.simagent import serve_simulated  # noqa: PLC0415

    server = serve_simulated("127.0.0.1:0", role, loss_every=loss_every, max_workers=8)
    print(server.port, flush=True)
    sys.stdin.read()
    server.stop(None)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _threads_cpu_s(pid: int) -> dict[int, float]:
    """CPU (s) of each of the process's threads, by native thread id."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            threads[int(task.name)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
        except OSError:
            pass  # ended meanwhile
    return threads


def _write_statements(conn: Any, path: str, stored: int) -> None:
    """``--pg-statements``: the server's time per statement over the window
    (pg_stat_statements), most first, with µs per stored result, into ``path`` (JSON)."""
    rows = conn.execute(
        "SELECT query, calls, rows, total_exec_time, shared_blks_dirtied, wal_bytes"
        " FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 25"
    ).fetchall()
    out = [
        {"query": q[:300], "calls": c, "rows": r, "ms": round(t, 1),
         "us_per_result": round(t * 1e3 / max(1, stored), 2), "blocks_dirtied": d,
         "wal_bytes": int(w)}
        for q, c, r, t, d, w in rows
    ]  # fmt: skip
    Path(path).write_text(json.dumps(out, indent=1))


def _backlog(senders: list[str]) -> int:
    """Records the sender agents hold unacknowledged, all sessions together."""
    from sixlab.southbound import AgentClient  # noqa: PLC0415

    total = 0
    for address in senders:
        with AgentClient(address, timeout=30) as client:
            total += sum(s.queued for s in client.counters().sessions)
    return total


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _stored(db: Any) -> int:
    row = db.execute("SELECT COALESCE(SUM(received), 0) FROM epochs").fetchone()
    return int(row[0])


def _new_lags(
    db: Any, seen: dict[tuple[int, int], tuple[int, int]], placeholder: str
) -> list[tuple[float, float]]:
    """The records of the sampled sessions stored since the last look, read in one
    query: (now − T4, last look − T4) of each, ms: its collection lag lies between."""
    terms = " OR ".join(
        f"(session_id={placeholder} AND epoch={placeholder} AND record_id>{placeholder})"
        for _ in seen
    )
    params = [v for (sid, epoch), (top, _) in seen.items() for v in (sid, epoch, top)]
    rows = db.execute(
        f"SELECT session_id, epoch, record_id, t4_ns FROM results WHERE {terms}",
        params,
    ).fetchall()
    now = time.time_ns()
    out = []
    tops: dict[tuple[int, int], int] = {}
    for sid, epoch, rid, t4 in rows:
        looked = seen[sid, epoch][1]
        out.append(((now - int(t4)) / 1e6, (looked - int(t4)) / 1e6))
        tops[sid, epoch] = max(tops.get((sid, epoch), 0), int(rid))
    for key, (top, _) in seen.items():
        seen[key] = (tops.get(key, top), now)
    return out


def _stages(address: str) -> dict[str, tuple[list[tuple[float, float]], float]]:
    """The controller's ``sixlab_collection_stage_seconds``: per stage, the cumulative
    buckets (bound s, count) and the sum (s); {} if it has none."""
    from urllib.request import urlopen  # noqa: PLC0415

    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    # Only this histogram: a whole scrape reads every session's totals from the store.
    query = "&".join(
        [f"name[]=sixlab_collection_stage_seconds_{s}" for s in ("bucket", "sum", "count")]
        + [f"name[]=sixlab_collection_{n}_total" for n in ("transactions", "transaction_seconds")]
    )
    with urlopen(f"http://{address}/metrics?{query}", timeout=30) as reply:
        text = reply.read().decode()
    out: dict[str, tuple[list[tuple[float, float]], float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (
            "sixlab_collection_transactions",
            "sixlab_collection_transaction_seconds",
        ):
            # Kept as a bucketless "stage": (no buckets, the counter's value).
            out[family.name] = ([], family.samples[0].value)
            continue
        if family.name != "sixlab_collection_stage_seconds":
            continue
        for sample in family.samples:
            stage = sample.labels["stage"]
            buckets, total = out.get(stage, ([], 0.0))
            if sample.name.endswith("_bucket"):
                buckets.append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_sum"):
                total = sample.value
            out[stage] = (buckets, total)
    return out


def _merged_stages(addresses: list[str]) -> dict[str, tuple[list[tuple[float, float]], float]]:
    """``_stages`` of several controllers (replicas) added up: their buckets share
    bounds, so counts and sums add."""
    out: dict[str, tuple[list[tuple[float, float]], float]] = {}
    for address in addresses:
        for stage, (buckets, total) in _stages(address).items():
            old_b, old_total = out.get(stage, ([], 0.0))
            old = dict(old_b)
            out[stage] = ([(b, n + old.get(b, 0.0)) for b, n in buckets], old_total + total)
    return out


def _quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile of cumulative buckets, linear within its bucket (as PromQL's
    ``histogram_quantile``); None without observations."""
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    lo, below = 0.0, 0.0
    for bound, n in buckets:
        if n >= rank:
            if bound == float("inf"):
                return lo
            return lo + (bound - lo) * ((rank - below) / (n - below) if n > below else 1.0)
        lo, below = bound, n
    return lo


def _stage_figures(
    before: dict[str, tuple[list[tuple[float, float]], float]],
    after: dict[str, tuple[list[tuple[float, float]], float]],
) -> dict[str, Any]:
    """Per stage over the window: results, mean, p50, p99 (ms)."""
    out: dict[str, Any] = {}
    n0 = before.get("sixlab_collection_transactions", ([], 0.0))[1]
    s0 = before.get("sixlab_collection_transaction_seconds", ([], 0.0))[1]
    n1 = after.pop("sixlab_collection_transactions", ([], n0))[1]
    s1 = after.pop("sixlab_collection_transaction_seconds", ([], s0))[1]
    if n1 > n0:
        # The commit slot: transactions in the window, their mean, their seconds in all
        # (divided by the window: how busy one slot was).
        out["transactions"] = {
            "count": int(n1 - n0),
            "mean_ms": round((s1 - s0) / (n1 - n0) * 1e3, 1),
            "seconds": round(s1 - s0, 2),
        }
    for stage, (buckets, total) in after.items():
        old_b, old_total = before.get(stage, ([], 0.0))
        old = dict(old_b)
        delta = [(b, n - old.get(b, 0.0)) for b, n in buckets]
        count = delta[-1][1] if delta else 0.0
        p50, p99 = _quantile(delta, 0.5), _quantile(delta, 0.99)
        out[stage] = {
            "results": int(count),
            "mean_ms": round((total - old_total) / count * 1e3, 1) if count else None,
            "p50_ms": None if p50 is None else round(p50 * 1e3, 1),
            "p99_ms": None if p99 is None else round(p99 * 1e3, 1),
        }
    return out


def _pct(values: list[float], p: float) -> float:
    data = sorted(values)
    return data[min(len(data) - 1, max(0, -(-int(p * len(data)) // 100) - 1))]


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its children (a PostgreSQL server's backends)."""
    total = _cpu_s(pid)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def _spawn_agents(args: argparse.Namespace, procs: list[Any]) -> list[tuple[str, str, str]]:
    """One simulated agent process per node: (name, address, role)."""
    nodes = []
    for i, role in enumerate(["sender"] * args.agents + ["reflector"]):
        p = subprocess.Popen(
            [sys.executable, __file__, "agent", role, str(args.loss_every)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        procs.append(p)
        assert p.stdout is not None
        port = int(p.stdout.readline())
        nodes.append((f"s{i}" if role == "sender" else "r", f"127.0.0.1:{port}", role))
    return nodes


def _create_batch(url: str, nodes: list[tuple[str, str, str]], specs: list[Any]) -> list[float]:
    """Controller.create_sessions / start_sessions in this process (what a batch request
    of the northbound API runs): [create s, create + start s, CPU s]. Collection then
    moves to the serve process, which resumes every running session."""
    from sixlab.controller import Controller  # noqa: PLC0415
    from sixlab.controller.store import open_store  # noqa: PLC0415

    inproc = Controller(open_store(url), supervise_interval_s=None)
    for name, addr, role in nodes:
        inproc.register_node(name, addr, role)
        inproc.init_node(name)
    c0, t0 = time.process_time(), time.monotonic()
    _, errors = inproc.create_sessions(specs)
    created = time.monotonic() - t0
    errors |= inproc.start_sessions([s.name for s in specs])
    out = [created, time.monotonic() - t0, time.process_time() - c0]
    assert not errors, list(errors.items())[:3]
    inproc.close()
    inproc.store.close()
    return out


def _create_api(
    client: Any, pid: int, nodes: list[tuple[str, str, str]], specs: list[Any]
) -> list[float]:
    """One northbound call per session: [create s, create + start s, controller CPU s]."""
    for name, addr, role in nodes:
        client.register_node(name, addr, role)
        client.init_node(name)
    cpu0, t0 = _cpu_s(pid), time.monotonic()
    for spec in specs:
        client.create_session(spec)
    created = time.monotonic() - t0
    for spec in specs:
        client.start_session(spec.name)
    return [created, time.monotonic() - t0, _cpu_s(pid) - cpu0]


def _create_apply(
    client: Any, pid: int, nodes: list[tuple[str, str, str]], specs: list[Any]
) -> list[float]:
    """One northbound Apply of every node and session, running: [Apply s (create and
    start), the same, controller CPU s]."""
    from sixlab.controller.client import messages as cpb  # noqa: PLC0415
    from sixlab.controller.client import spec_to_proto  # noqa: PLC0415

    roles = {"sender": cpb.NODE_ROLE_SENDER, "reflector": cpb.NODE_ROLE_REFLECTOR}
    request = cpb.ApplyRequest(
        nodes=[cpb.NodeConfig(name=n, address=a, role=roles[r], init=cpb.NodeInit())
               for n, a, r in nodes],
        sessions=[cpb.SessionConfig(spec=spec_to_proto(s), running=True) for s in specs],
    )  # fmt: skip
    cpu0, t0 = _cpu_s(pid), time.monotonic()
    reply = client.apply(request)
    took = time.monotonic() - t0
    assert not reply.error, reply.error
    return [took, took, _cpu_s(pid) - cpu0]


def _measure(
    args: argparse.Namespace,
    url: str,
    pids: list[int],
    pg_pid: int | None,
    agents: list[int],
    *,
    metrics: list[str],
    senders: list[str],
) -> dict[str, Any]:
    """The measuring window: stored per second, CPU, RSS, lag, bytes per result, and the
    records the sender agents held unacknowledged (read, or not yet, by the controller)
    at its start and end: a backlog the controller has not caught up with.

    With several controller processes (``pids``, replicas), their CPU is added up
    (``controller_cpu``; each in ``controller_cpus``), their RSS too, and their stage
    histograms merged (``metrics``: each one's metrics address)."""
    pid = pids[0]
    from sixlab.controller.store import open_store  # noqa: PLC0415

    db = open_store(url)
    # The benchmark reads the tables itself, on a connection of its own.
    conn: Any
    if args.db == "postgresql":
        import psycopg  # noqa: PLC0415

        conn, placeholder = psycopg.connect(url, autocommit=True), "%s"
    else:
        import sqlite3  # noqa: PLC0415

        conn, placeholder = sqlite3.connect(url), "?"
    rows = [(r.id, r.epoch) for r in db.sessions()]
    seen = dict.fromkeys(random.Random(1).sample(rows, min(50, len(rows))), (0, 0))
    time.sleep(args.warmup)
    lags: list[tuple[float, float]] = []
    rss = []
    load0 = os.getloadavg()[0]
    import sixlab.controller.metrics  # noqa: PLC0415

    # A controller without the histogram would read the store for a restricted scrape too.
    if not hasattr(sixlab.controller.metrics, "STAGES"):
        metrics = []
    stages0 = _merged_stages(metrics)
    pg0 = _tree_cpu_s(pg_pid) if pg_pid else 0.0
    ag0 = sum(_cpu_s(a) for a in agents)
    spy = None
    if args.py_spy:
        # Sampled without pausing the controller; "raw" is one line per distinct stack
        # (thread name first) with its count: benchmarks/spy_split.py sorts them.
        spy = subprocess.Popen(
            [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid),
             "--duration", str(int(args.seconds)), "--rate", "100", "--nonblocking",
             "--threads", "--format", "raw", "--output", args.py_spy],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    if args.pg_statements:
        conn.execute("SELECT pg_stat_statements_reset()")
    backlog0 = _backlog(senders)
    threads0 = _threads_cpu_s(pid) if spy else {}
    n0, cpu0, t0 = _stored(conn), [_cpu_s(p) for p in pids], time.monotonic()
    # What was stored before the window; the first look in it is one period later (the
    # figures above were read before this, so no look waits for them).
    _new_lags(conn, seen, placeholder)
    gaps: list[float] = []
    worst: list[float] = []  # per second of the window, the largest lag seen in it
    while time.monotonic() - t0 < args.seconds:
        time.sleep(args.poll)
        before = next(iter(seen.values()))[1]
        got = _new_lags(conn, seen, placeholder)
        lags += got
        second = int(time.monotonic() - t0)
        worst += [0.0] * (second + 1 - len(worst))
        worst[second] = max([worst[second], *(hi for hi, _ in got)])
        gaps.append((next(iter(seen.values()))[1] - before) / 1e6)
        rss.append(sum(_rss_mb(p) for p in pids))
    n1, cpu1, t1 = _stored(conn), [_cpu_s(p) for p in pids], time.monotonic()
    pg1 = _tree_cpu_s(pg_pid) if pg_pid else 0.0
    ag1 = sum(_cpu_s(a) for a in agents)
    stages1 = _merged_stages(metrics)
    if args.pg_statements:
        _write_statements(conn, args.pg_statements, n1 - n0)
    backlog1 = _backlog(senders)
    if spy is not None:
        threads1 = _threads_cpu_s(pid)
        spy.wait(30)
        # Each thread's CPU over the window, for benchmarks/spy_split.py to weigh its samples.
        Path(args.py_spy + ".threads.json").write_text(
            json.dumps({t: c - threads0.get(t, 0.0) for t, c in threads1.items()})
        )
    storage = db.storage()
    db.close()
    conn.close()
    high, low = [hi for hi, _ in lags], [lo for _, lo in lags]
    return {
        "stored_per_s": round((n1 - n0) / (t1 - t0)),
        "controller_cpu": round((sum(cpu1) - sum(cpu0)) / (t1 - t0), 3),
        "controller_cpus": [round((b - a) / (t1 - t0), 3) for a, b in zip(cpu0, cpu1, strict=True)],
        "postgres_cpu": round((pg1 - pg0) / (t1 - t0), 3) if pg_pid else None,
        "agents_cpu": round((ag1 - ag0) / (t1 - t0), 3),
        "rss_mb": round(max(rss), 1),
        "rss_mb_per_1000_sessions": round(max(rss) / args.sessions * 1000, 1),
        "lag_ms_p50": round(statistics.median(high), 1) if lags else None,
        "lag_ms_p99": round(_pct(high, 99), 1) if lags else None,
        "lag_low_ms_p50": round(statistics.median(low), 1) if lags else None,
        "lag_low_ms_p99": round(_pct(low, 99), 1) if lags else None,
        "lag_samples": len(lags),
        "lag_ms_worst_by_second": [round(w) for w in worst],
        "poll_gap_ms_p50": round(statistics.median(gaps), 1) if gaps else None,
        "poll_gap_ms_max": round(max(gaps), 1) if gaps else None,
        "stages": _stage_figures(stages0, stages1),
        "bytes_per_result": (
            round(storage.bytes_per_result, 1) if storage.bytes_per_result else None
        ),
        "results_stored": storage.results,
        "load_average_start": load0,
        "_t0": t0,
        "backlog_start": backlog0,
        "backlog_end": backlog1,
    }


def _read_agents(
    args: argparse.Namespace, nodes: list[tuple[str, str, str]], url: str, agents: list[int]
) -> dict[str, Any]:
    """``--collector none``: each sender agent's stream read by a thread of the
    benchmark that acknowledges every message at once and stores nothing; the agent
    stage (message arrival − T4) of every record in the window."""
    import threading  # noqa: PLC0415

    from sixlab.controller.core import STREAM_COUNTERS_NS, STREAM_WINDOW_NS  # noqa: PLC0415
    from sixlab.controller.store import open_store  # noqa: PLC0415
    from sixlab.southbound import AgentClient  # noqa: PLC0415

    db = open_store(url)
    after: dict[str, dict[int, int]] = {}
    for r in db.sessions():
        after.setdefault(r.sender, {})[r.ssid] = r.cursor
    db.close()
    window = args.stream_window or STREAM_WINDOW_NS / 1e9
    stop = threading.Event()
    counting = threading.Event()
    lags: list[float] = []
    streams: list[Any] = []

    def read(address: str, ssids: dict[int, int]) -> None:
        client = AgentClient(address)
        stream = client.stream_many(
            ssids, max_batch=5000, batch_window_ns=round(window * 1e9),
            counters_interval_ns=STREAM_COUNTERS_NS,
        )  # fmt: skip
        streams.append(stream)
        for message in stream:
            at = time.time_ns()
            acks = {}
            for b in message.batches:
                if b.results:
                    acks[b.ssid] = b.results[-1].record_id
                    if counting.is_set():
                        lags.extend((at - r.t4_ns) / 1e6 for r in b.results)
            if acks:
                client.acknowledge_many(acks)
            if stop.is_set():
                break
        client.close()

    readers = [
        threading.Thread(target=read, args=(addr, after[name]), daemon=True)
        for name, addr, role in nodes
        if role == "sender" and name in after
    ]
    for t in readers:
        t.start()
    time.sleep(args.warmup)
    load0 = os.getloadavg()[0]
    ag0 = sum(_cpu_s(a) for a in agents)
    cpu0, t0 = time.process_time(), time.monotonic()
    counting.set()
    time.sleep(args.seconds)
    counting.clear()
    cpu1, t1 = time.process_time(), time.monotonic()
    ag1 = sum(_cpu_s(a) for a in agents)
    stop.set()
    for stream in streams:
        stream.cancel()
    return {
        "read_per_s": round(len(lags) / (t1 - t0)),
        "reader_cpu": round((cpu1 - cpu0) / (t1 - t0), 3),
        "agents_cpu": round((ag1 - ag0) / (t1 - t0), 3),
        "agent_stage_ms_mean": round(statistics.fmean(lags), 1) if lags else None,
        "agent_stage_ms_p50": round(statistics.median(lags), 1) if lags else None,
        "agent_stage_ms_p99": round(_pct(lags, 99), 1) if lags else None,
        "agent_stage_ms_max": round(max(lags), 1) if lags else None,
        "load_average_start": load0,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from sixlab.controller import SessionSpec  # noqa: PLC0415
    from sixlab.controller.client import ControllerClient  # noqa: PLC0415
    from sixlab.testbed import LabPostgres  # noqa: PLC0415

    tmp = Path(tempfile.mkdtemp(prefix="bench-ctl-"))
    pg = None
    if args.db == "postgresql":
        settings = {"max_connections": "50", "shared_buffers": "256MB"}
        if args.pg_statements:
            settings["shared_preload_libraries"] = "pg_stat_statements"
        pg = LabPostgres(settings=settings)
        url: str = pg.create_database("bench")
        if args.pg_statements:
            pg.psql("CREATE EXTENSION pg_stat_statements", "bench")
    else:
        url = str(tmp / "controller.db")
    procs: list[subprocess.Popen[str]] = []
    try:
        nodes = _spawn_agents(args, procs)
        specs = [
            SessionSpec(f"p{i}", f"s{i % args.agents}", "r", "2001:db8::2",
                        interval_ns=int(1e9 / args.rate), collect="stream")
            for i in range(args.sessions)
        ]  # fmt: skip
        if args.collector == "none":
            timing = _create_batch(url, nodes, specs)
            agents = [p.pid for p in procs]
            return {
                "db": args.db, "sessions": args.sessions, "agents": args.agents,
                "rate_per_session": args.rate, "offered_per_s": args.sessions * args.rate,
                "collector": "none", "stream_window": args.stream_window,
                **_read_agents(args, nodes, url, agents),
                "load_average": os.getloadavg()[0],
            }  # fmt: skip
        timing = _create_batch(url, nodes, specs) if args.create == "batch" else []
        # One controller, or --replicas of them on the one database or SQLite file (each
        # with its own northbound socket and metrics port; the Apply goes to the first).
        ctls: list[subprocess.Popen[str]] = []
        scrapes: list[str] = []
        socks = [f"unix:{tmp}/ctl{k}.sock" for k in range(args.replicas)]
        for k, sock in enumerate(socks):
            with socket.socket() as free:
                free.bind(("127.0.0.1", 0))
                scrapes.append(f"127.0.0.1:{free.getsockname()[1]}")
            replica = ["--replica", f"r{k}"] if args.replicas > 1 else []
            ctls.append(subprocess.Popen(
                [sys.executable, "-m", "sixlab", "controller", "serve", "--db", url,
                 "--grpc", sock, "--metrics", scrapes[-1], *replica, *args.serve_arg],
                stdout=subprocess.PIPE, stderr=(tmp / f"controller{k}.log").open("w"),
                text=True,
            ))  # fmt: skip
        procs += ctls
        for ctl in ctls:
            assert ctl.stdout is not None
            ctl.stdout.readline()
        ctl, address = ctls[0], socks[0]
        served = time.monotonic()
        # An Apply of 10,000 sessions takes a minute or more on a loaded machine.
        with ControllerClient(address, timeout=600) as client:
            if args.create == "api":
                timing = _create_api(client, ctl.pid, nodes, specs)
            elif args.create == "apply":
                timing = _create_apply(client, ctl.pid, nodes, specs)
            pg_pid = None
            if pg is not None:
                pg_pid = int((pg.data / "postmaster.pid").read_text().split()[0])
            agents = [p.pid for p in procs if p not in ctls]
            senders = [address for _, address, role in nodes if role == "sender"]
            measured = _measure(
                args, url, [c.pid for c in ctls], pg_pid, agents, metrics=scrapes,
                senders=senders,
            )  # fmt: skip
            # When the window began after the controller came up: its housekeeping pass
            # (every --housekeeping-interval, 60 s) runs at multiples of that.
            measured["window_after_serve_s"] = round(measured.pop("_t0") - served, 1)
            # Errors each controller logged by the window's end (a store error, e.g.
            # SQLite's "database is locked" after its busy timeout, fails a transaction).
            measured["controller_log_errors"] = [
                sum(" ERROR " in line for line in (tmp / f"controller{k}.log").open())
                for k in range(len(ctls))
            ]
        return {
            "db": args.db,
            "sessions": args.sessions,
            "agents": args.agents,
            "rate_per_session": args.rate,
            "offered_per_s": args.sessions * args.rate,
            "create": args.create,
            "replicas": args.replicas,
            "serve_args": args.serve_arg,
            "create_s": round(timing[0], 2),
            "create_start_s": round(timing[1], 2),
            "create_start_cpu_s": round(timing[2], 2),
            **measured,
            "load_average": os.getloadavg()[0],
        }
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
            p.terminate()
        stopping = time.monotonic()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                print(f"killed after 20 s: {p.args!r:.120}", file=sys.stderr)
        # How long the processes took to stop (SIGTERM to exit), for a process that
        # hangs on its way out (a controller replica's stream thread did, once).
        print(f"stopped in {time.monotonic() - stopping:.1f} s", file=sys.stderr)
        if pg is not None:
            pg.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "agent":
        _agent(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--rate", type=float, default=5.0, help="packets/s per session")
    parser.add_argument("--seconds", type=float, default=20.0, help="measuring window")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--loss-every", type=int, default=0)
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="controller processes (serve --replica) sharing the agents, on the one"
        " PostgreSQL database or the one SQLite file",
    )
    parser.add_argument(
        "--poll", type=float, default=0.1, help="seconds between looks at the sampled sessions"
    )
    parser.add_argument(
        "--collector",
        choices=("controller", "none"),
        default="controller",
        help="none: no controller collects; the benchmark reads the streams itself",
    )
    parser.add_argument(
        "--stream-window",
        type=float,
        default=0.0,
        help="--collector none: the agents' batch window (s; 0: the controller's default)",
    )
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        help="an argument more for the controller's serve, e.g. --serve-arg=--commit-interval=0.1",
    )
    parser.add_argument(
        "--pg-statements",
        metavar="FILE",
        default="",
        help="--db postgresql: the server's time per statement over the window"
        " (pg_stat_statements) into FILE (JSON)",
    )
    parser.add_argument(
        "--py-spy",
        metavar="FILE",
        default="",
        help="sample the controller with py-spy over the window into FILE (collapsed stacks)",
    )
    parser.add_argument(
        "--create",
        choices=("apply", "batch", "api"),
        default="apply",
        help="create and start the sessions with one northbound Apply, with"
        " Controller.create_sessions/start_sessions in the benchmark's process, or with one"
        " northbound call each",
    )
    args = parser.parse_args()
    if args.replicas < 1:
        parser.error("--replicas: at least 1")
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
