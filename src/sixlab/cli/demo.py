"""``sixlab demo``: STAMP delay monitoring of an SRv6 network you can watch.

What it does, in order:

1. builds the two-path SRv6 testbed in network namespaces (sender — R1 — R2 —
   reflector; R1 and R2 joined by two links with different emulated delays; SRv6 End.X
   on the routers pins each path to its link, in both directions);
2. starts a STAMP agent as its own process inside the sender's and the reflector's
   namespace (gRPC on Unix sockets, which cross namespaces);
3. runs the controller (SQLite store, Prometheus metrics if asked), registers and
   initialises the agents, and measures both paths at once: path A with its return path
   configured on the reflector (the design of "High Performance Delay Monitoring for
   SRv6 Based SD-WANs", docs/papers.md), path B asking for it with the RFC 9503
   Return Path TLV;
4. shows a live table of direct / return / round-trip delay, jitter and loss per path,
   with a progress bar, then a summary table, the SQLite file and a PNG plot of delay
   over time (or, with ``--json``, one JSON document).

Everything it made (namespaces, processes, sockets) is removed on exit and on Ctrl-C;
the results (SQLite, PNG) stay in ``--out``. ``--loopback`` measures over ::1 in this
process instead, without root or namespaces.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from sixlab import stamp as ev
from sixlab.dataplane.base import DataplaneConfig, available, create
from sixlab.dataplane.engine import ReflectorEngine, SenderEngine, SenderSessionSpec
from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig
from sixlab.stamp.stats import DelaySummary, PathStats, path_stats

__all__ = ["add_parsers"]

NS_PER_S = 1_000_000_000
#: How long agents get to start listening (Python start-up inside a namespace).
AGENT_START_TIMEOUT_S = 20.0


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("demo", help="measure the delays of two SRv6 paths, live")
    p.add_argument("--duration", type=float, default=20.0, help="seconds (default 20)")
    p.add_argument("--interval", type=float, default=0.05, help="seconds between probes")
    p.add_argument("--path-a", type=_pair, default=(5.0, 12.0), help="FWD,RET ms (5,12)")
    p.add_argument("--path-b", type=_pair, default=(20.0, 3.0), help="FWD,RET ms (20,3)")
    p.add_argument("--dataplane", choices=available(), default="socket")
    p.add_argument("--collect", choices=("poll", "stream"), default="stream")
    p.add_argument("--out", type=Path, default=Path("sixlab-demo"), help="results folder")
    p.add_argument("--metrics", default=None, metavar="ADDR:PORT", help="serve /metrics")
    p.add_argument("--json", action="store_true", help="one JSON document at the end")
    p.add_argument("--loopback", action="store_true", help="over ::1, no namespaces")
    p.set_defaults(handler=_run)


def _pair(text: str) -> tuple[float, float]:
    try:
        fwd, ret = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected FORWARD_MS,RETURN_MS") from None
    if fwd < 0 or ret < 0:
        raise argparse.ArgumentTypeError("delays cannot be negative")
    return fwd, ret


@dataclass
class _Path:
    name: str
    segments: tuple[str, ...]
    configured: tuple[float, float] | None


def _ms(s: DelaySummary | None) -> dict[str, float] | None:
    if s is None:
        return None
    return {k: round(v, 4) for k, v in s.as_ms().items() if k != "p90"}


def _table(paths: list[_Path], stats: dict[str, PathStats], title: str) -> Table:
    table = Table(
        title=title,
        caption="delays: mean/p99 ms; jitter: direct/return mean |IPDV| µs",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
    )
    for col in ("path", "set ms", "direct", "return", "round trip", "jitter", "loss"):
        table.add_column(col, justify="left" if col == "path" else "right", no_wrap=True)

    def cell(s: DelaySummary | None) -> str:
        return "—" if s is None else f"{s.mean_ns / 1e6:.2f}/{s.p99_ns / 1e6:.2f}"

    for p in paths:
        st = stats.get(p.name)
        conf = "—" if p.configured is None else f"{p.configured[0]:g}/{p.configured[1]:g}"
        if st is None:
            table.add_row(p.name, conf, "—", "—", "—", "—", "—")
            continue
        fwd, ret = st.direct_jitter_ns, st.return_jitter_ns
        jitter = "—" if fwd is None or ret is None else f"{fwd / 1e3:.0f}/{ret / 1e3:.0f}"
        loss = f"{st.loss_ratio:.1%}"
        table.add_row(p.name, conf, cell(st.direct), cell(st.backward), cell(st.rtt), jitter, loss)
    return table


class _StopError(Exception):
    """SIGTERM, turned into an exception so every cleanup runs."""


def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise _StopError


def _run(args: argparse.Namespace) -> int:
    if args.duration <= 0 or args.interval <= 0:
        print("sixlab demo: --duration and --interval must be positive", file=sys.stderr)
        return 2
    if not args.loopback and os.geteuid() != 0:
        print(
            "sixlab demo: building the SRv6 testbed needs root (network namespaces); "
            "run it as root, or add --loopback to measure over ::1",
            file=sys.stderr,
        )
        return 2
    signal.signal(signal.SIGTERM, _on_sigterm)
    # Also when started with SIGINT ignored (a shell's background job): Ctrl-C must clean.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    console = Console(stderr=args.json)
    try:
        if args.loopback:
            paths, records, stats = _loopback(args, console)
            db = png = None
        else:
            paths, records, stats, db = _testbed(args, console)
            png = _plot(paths, records, db.with_suffix(".png"))
    except (KeyboardInterrupt, _StopError):
        print("sixlab demo: interrupted; everything it made was removed", file=sys.stderr)
        return 130
    console.print(_table(paths, stats, "sixlab demo — summary"))
    if db is not None and png is not None:  # plain print: paths must not be wrapped
        print(f"results: {db}\nplot:    {png}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        json.dump(_document(paths, stats), sys.stdout, indent=2)
        print()
    return 0 if all(s.received for s in stats.values()) else 1


def _document(paths: list[_Path], stats: dict[str, PathStats]) -> dict[str, Any]:
    out = []
    for p in paths:
        st = stats[p.name]
        out.append(
            {
                "name": p.name,
                "segments": list(p.segments),
                "configured": None
                if p.configured is None
                else {"direct_ms": p.configured[0], "return_ms": p.configured[1]},
                "measured": {
                    "direct_ms": _ms(st.direct),
                    "return_ms": _ms(st.backward),
                    "rtt_ms": _ms(st.rtt),
                    "jitter_ms": {
                        "direct": None
                        if st.direct_jitter_ns is None
                        else round(st.direct_jitter_ns / 1e6, 4),
                        "return": None
                        if st.return_jitter_ns is None
                        else round(st.return_jitter_ns / 1e6, 4),
                    },
                    "loss": st.loss_ratio,
                    "received": st.received,
                    "lost": st.lost,
                },
            }
        )
    return {"paths": out}


def _progress(duration: float) -> tuple[Progress, Any]:
    progress = Progress(
        TextColumn("measuring"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeRemainingColumn(),
    )
    task = progress.add_task("measuring", total=duration)
    return progress, task


# ------------------------------------------------------------------------------ testbed


@contextmanager
def _agents(tb: Any, tmp: Path, dataplane: str) -> Iterator[tuple[str, str]]:
    """Start one agent per end node, as its own process in the node's namespace."""
    from sixlab.southbound.client import AgentClient  # noqa: PLC0415

    addrs = (f"unix:{tmp}/sender.sock", f"unix:{tmp}/reflector.sock")
    procs = []
    for node, role, addr in (
        (tb.sender, "sender", addrs[0]),
        (tb.reflector, "reflector", addrs[1]),
    ):
        argv = [sys.executable, "-m", "sixlab", "stamp", "agent", "--role", role]
        argv += ["--grpc", addr, "--dataplane", dataplane]
        procs.append(tb.testbed.run_in(node, argv, stdout=subprocess.DEVNULL))
    try:
        for addr in addrs:
            with AgentClient(addr) as client:
                client.wait_ready(AGENT_START_TIMEOUT_S)
        yield addrs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _testbed(
    args: argparse.Namespace, console: Console
) -> tuple[list[_Path], dict[str, list[ev.StampResult]], dict[str, PathStats], Path]:
    from sixlab.controller.core import Controller, SessionSpec  # noqa: PLC0415
    from sixlab.controller.metrics import ControllerMetrics  # noqa: PLC0415
    from sixlab.controller.store import Store  # noqa: PLC0415
    from sixlab.testbed import srv6_two_paths, sweep  # noqa: PLC0415

    args.out.mkdir(parents=True, exist_ok=True)
    # A demo killed with SIGKILL could not clean up: remove what such runs left behind
    # (only namespaces whose owner process is gone).
    sweep("sixlab-demo-")
    stamp = datetime.datetime.now(tz=datetime.UTC).strftime("%Y%m%d-%H%M%S")
    db = (args.out / f"demo-{stamp}.sqlite").resolve()
    console.print("building the SRv6 testbed (namespaces, links, SRv6 End.X) ...")
    with (
        tempfile.TemporaryDirectory(prefix="sixlab-demo-") as tmp,
        srv6_two_paths(path_a_ms=args.path_a, path_b_ms=args.path_b, prefix="sixlab-demo-") as tb,
        _agents(tb, Path(tmp), args.dataplane) as (saddr, raddr),
    ):
        metrics = ControllerMetrics()
        if args.metrics:
            host, _, port = args.metrics.rpartition(":")
            metrics.serve(int(port), host.strip("[]") or "127.0.0.1")
        controller = Controller(Store(db), metrics, poll_interval_s=0.25)
        try:
            controller.register_node("sender", saddr, "sender")
            controller.register_node("reflector", raddr, "reflector")
            controller.init_node("sender", source=tb.sender_addr, port=0, dataplane=args.dataplane)
            controller.init_node(
                "reflector", source=tb.reflector_addr, port=862, dataplane=args.dataplane
            )
            paths = []
            for name, via_tlv in (("A", False), ("B", True)):
                p = tb.paths[name]
                paths.append(
                    _Path(
                        f"path-{name}",
                        tuple(p.forward_segments),
                        (p.forward_delay_ms, p.return_delay_ms),
                    )
                )
                controller.create_session(
                    SessionSpec(
                        name=f"path-{name}",
                        sender="sender",
                        reflector="reflector",
                        reflector_address=tb.reflector_addr,
                        segments=tuple(p.forward_segments),
                        return_segments=tuple(p.return_segments),
                        return_path_tlv=via_tlv,
                        source_address=tb.sender_addr,
                        interval_ns=round(args.interval * NS_PER_S),
                        duration_ns=round(args.duration * NS_PER_S),
                        loss_timeout_ns=NS_PER_S,
                        collect=args.collect,
                    )
                )
            for path in paths:
                controller.start_session(path.name)
            names = " and ".join(q.name for q in paths)
            console.print(f"measuring {names} for {args.duration:g} s (Ctrl-C stops) ...")
            progress, task = _progress(args.duration)
            start = time.monotonic()
            stats: dict[str, PathStats] = {}
            with Live(console=console, refresh_per_second=4, transient=args.json) as live:
                while True:
                    elapsed = time.monotonic() - start
                    progress.update(task, completed=min(elapsed, args.duration))
                    stats = {p.name: controller.stats(p.name) for p in paths}
                    live.update(
                        Group(progress, _table(paths, stats, "sixlab demo — STAMP over SRv6"))
                    )
                    if all(controller.wait_finished(p.name, 0) for p in paths):
                        break
                    if elapsed > args.duration + 10:
                        break
                    time.sleep(0.25)
            stats = {p.name: controller.stats(p.name) for p in paths}
            records = {
                p.name: controller.store.results(controller.store.session(p.name).id) for p in paths
            }
        finally:
            controller.close()
            controller.store.close()
    return paths, records, stats, db


def _plot(paths: list[_Path], records: dict[str, list[ev.StampResult]], png: Path) -> Path:
    import matplotlib as mpl  # noqa: PLC0415

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    t0 = min((r.t1_ns for recs in records.values() for r in recs), default=0)
    for ax, (label, attr, idx) in zip(
        axes, (("direct (T2−T1)", "direct_ns", 0), ("return (T4−T3)", "return_ns", 1)), strict=True
    ):
        for p in paths:
            recs = records.get(p.name, [])
            xs = [(r.t1_ns - t0) / 1e9 for r in recs]
            ys = [getattr(r, attr) / 1e6 for r in recs]
            (line,) = ax.plot(xs, ys, ".-", markersize=3, linewidth=0.8, label=p.name)
            if p.configured is not None:
                ax.axhline(p.configured[idx], color=line.get_color(), linestyle="--", linewidth=0.8)
        ax.set_ylabel(f"{label} ms")
        ax.grid(visible=True, alpha=0.3)
        ax.legend(loc="upper right")
    axes[-1].set_xlabel("time since first probe (s); dashed: configured delay")
    fig.suptitle("sixlab demo — STAMP one-way delays per SRv6 path")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


# ----------------------------------------------------------------------------- loopback


def _loopback(
    args: argparse.Namespace, console: Console
) -> tuple[list[_Path], dict[str, list[ev.StampResult]], dict[str, PathStats]]:
    lo = ipaddress.IPv6Address("::1")
    rplane = create("socket", DataplaneConfig(port=0, source=lo))
    splane = create("socket", DataplaneConfig(port=0, source=lo))
    rplane.open()
    splane.open()
    reflector = ReflectorEngine(rplane, Reflector(ReflectorSessionConfig(ssid=None)))
    sender = SenderEngine(splane)
    config = SenderConfig(
        ssid=1,
        interval_ns=round(args.interval * NS_PER_S),
        duration_ns=round(args.duration * NS_PER_S),
        loss_timeout_ns=NS_PER_S,
    )
    sender.add_session(SenderSessionSpec(config, lo, rplane.local_port))  # type: ignore[attr-defined]
    paths = [_Path("loopback", (), None)]
    records: list[ev.StampResult] = []
    lost = 0
    reflector.start()
    sender.start()
    progress, task = _progress(args.duration)
    start = time.monotonic()
    try:
        sender.start_session(1)
        with Live(console=console, refresh_per_second=4, transient=args.json) as live:
            while not sender.wait_finished(1, 0.25):
                records += sender.results(1)
                lost += len(sender.lost(1))
                elapsed = time.monotonic() - start
                progress.update(task, completed=min(elapsed, args.duration))
                stats = {"loopback": path_stats(records, lost)}
                live.update(Group(progress, _table(paths, stats, "sixlab demo — loopback")))
                if elapsed > args.duration + 5:
                    break
            records += sender.results(1)
            lost += len(sender.lost(1))
    finally:
        sender.shutdown()
        reflector.shutdown()
        splane.close()
        rplane.close()
    return paths, {"loopback": records}, {"loopback": path_stats(records, lost)}
