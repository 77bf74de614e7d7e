"""``sixlab demo``: STAMP delay monitoring of an SRv6 network you can watch.

What it does, in order:

1. builds the two-path SRv6 testbed in network namespaces (sender — R1 — R2 —
   reflector; R1 and R2 joined by two links with different emulated delays; SRv6 End.X
   on the routers pins each path to its link, in both directions; and a host *far*
   behind R2 that runs no agent at all);
2. starts a STAMP agent as its own process inside the sender's and the reflector's
   namespace (gRPC on Unix sockets, which cross namespaces);
3. runs the controller (SQLite store, Prometheus metrics if asked), registers and
   initialises the agents, and measures both paths at once: path A with its return path
   configured on the reflector (the design of "High Performance Delay Monitoring for
   SRv6 Based SD-WANs", docs/papers.md), path B asking for it with the RFC 9503
   Return Path TLV, and a third path, L, in loopback mode (docs/srpm.md): out over link
   B, around far (End), back over link A, to the sender itself, measured with no
   reflector (round trip only);
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
import math
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
from sixlab.cli import _argtypes as argtypes
from sixlab.cli.controller import parse_metrics_address
from sixlab.dataplane.base import DataplaneConfig, DataplaneError, available, create
from sixlab.dataplane.engine import ReflectorEngine, SenderEngine, SenderSessionSpec
from sixlab.southbound.rpcclient import RpcError
from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig
from sixlab.stamp.stats import DelaySummary, PathStats, path_stats

__all__ = ["add_parsers"]

NS_PER_S = 1_000_000_000
#: How long agents get to start listening (Python start-up inside a namespace).
AGENT_START_TIMEOUT_S = 20.0


#: Longest demo run (s) and emulated one-way delay (ms): a day, and ten seconds.
MAX_DEMO_S = 86_400.0
MAX_DELAY_MS = 10_000.0
#: The STAMP UDP ports in the testbed: the reflector's is RFC 8762's (§4.1); the
#: sender's is fixed too, because capture planes (scapy, mmap, xdp) filter on a port.
REFLECTOR_PORT = 862
SENDER_PORT = 40862
#: The testbed's host interface on the sender and the reflector (``srv6_two_paths``),
#: where capture planes capture.
HOST_INTERFACE = "eth0"


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "demo", help="measure the delays of three SRv6 paths (one in loopback mode), live"
    )
    p.add_argument(
        "--duration",
        type=argtypes.seconds_in(0.1, MAX_DEMO_S),
        default=20.0,
        help="seconds (default 20)",
    )
    p.add_argument(
        "--interval",
        type=argtypes.seconds_in(argtypes.MIN_INTERVAL_S, 60.0),
        default=0.05,
        help="seconds between probes (default 0.05)",
    )
    p.add_argument(
        "--timeout",
        type=argtypes.timeout,
        default=1.0,
        help="loss timeout: seconds a reply may take before its probe counts lost (default 1)",
    )
    p.add_argument("--path-a", type=_pair, default=(5.0, 12.0), help="FWD,RET ms (5,12)")
    p.add_argument("--path-b", type=_pair, default=(20.0, 3.0), help="FWD,RET ms (20,3)")
    p.add_argument(
        "--far-link",
        type=_pair,
        default=(2.0, 4.0),
        help="R2->far,far->R2 ms of the loopback path's far link (2,4)",
    )
    p.add_argument(
        "--dataplane",
        choices=available(),
        default="socket",
        help="data plane of both agents (default socket)",
    )
    p.add_argument("--collect", choices=("poll", "stream"), default="stream")
    p.add_argument("--out", type=Path, default=Path("sixlab-demo"), help="results folder")
    p.add_argument(
        "--metrics",
        default=None,
        type=parse_metrics_address,
        metavar="ADDR:PORT",
        help="serve /metrics",
    )
    p.add_argument("--json", action="store_true", help="one JSON document at the end")
    p.add_argument("--loopback", action="store_true", help="over ::1, no namespaces")
    p.set_defaults(handler=_run)


def _pair(text: str) -> tuple[float, float]:
    try:
        fwd, ret = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected FORWARD_MS,RETURN_MS") from None
    for value in (fwd, ret):
        if math.isnan(value):
            raise argparse.ArgumentTypeError(f"{text!r}: not a number of ms")
        if not 0 <= value <= MAX_DELAY_MS:
            raise argparse.ArgumentTypeError(
                f"{text!r}: each delay must be in 0..{MAX_DELAY_MS:g} ms"
            )
    return fwd, ret


@dataclass
class _Path:
    name: str
    segments: tuple[str, ...]
    configured: tuple[float, float] | None
    #: A loopback path's configured round trip (the sum of its legs' delays), ms.
    loop_ms: float | None = None

    @property
    def configured_rtt_ms(self) -> float | None:
        if self.loop_ms is not None:
            return self.loop_ms
        return None if self.configured is None else sum(self.configured)


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
        if p.loop_ms is not None:
            conf = f"{p.loop_ms:g} loop"
        if st is None:
            table.add_row(p.name, conf, "—", "—", "—", "—", "—")
            continue
        fwd, ret = st.direct_jitter_ns, st.return_jitter_ns
        jitter = "—" if fwd is None or ret is None else f"{fwd / 1e3:.0f}/{ret / 1e3:.0f}"
        if p.loop_ms is not None and fwd is not None:  # a loop's jitter is its round trip's
            jitter = f"{fwd / 1e3:.0f} rt"
        loss = f"{st.loss_ratio:.1%}"
        table.add_row(p.name, conf, cell(st.direct), cell(st.backward), cell(st.rtt), jitter, loss)
    return table


class _StopError(Exception):
    """SIGTERM, turned into an exception so every cleanup runs."""


def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise _StopError


def _run(args: argparse.Namespace) -> int:
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
    except (RpcError, ValueError, DataplaneError, OSError) as exc:
        # An agent that cannot open the chosen plane here (no BPF support, no scapy), a
        # refused session: one line; what was built is gone already.
        print(f"sixlab demo: {exc}", file=sys.stderr)
        return 1
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
                "mode": "two-way" if p.loop_ms is None else "loopback",
                "segments": list(p.segments),
                "configured": _configured(p),
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


def _configured(p: _Path) -> dict[str, float] | None:
    if p.loop_ms is not None:
        return {"rtt_ms": p.loop_ms}
    if p.configured is None:
        return None
    return {"direct_ms": p.configured[0], "return_ms": p.configured[1]}


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
        srv6_two_paths(
            path_a_ms=args.path_a,
            path_b_ms=args.path_b,
            far_ms=args.far_link,
            prefix="sixlab-demo-",
        ) as tb,
    ):
        if args.dataplane == "xdp":
            _prepare_xdp(tb)
        with _agents(tb, Path(tmp), args.dataplane) as (saddr, raddr):
            return _measure(args, console, tb, db, (saddr, raddr))


def _prepare_xdp(tb: Any) -> None:
    """What the xdp plane needs of the veths it runs on (see ``test_xdp_srv6``).

    Frames an XDP program sends with XDP_TX on a veth are lost unless the peer runs an
    XDP program too: R2's end towards the reflector gets the plain XDP_PASS program.
    Transmit checksum offload goes off on the veths of the end nodes, so the frames the
    programs read carry complete checksums.
    """
    for node, ifname in (
        (tb.sender, HOST_INTERFACE),
        (tb.r1, "to_snd"),
        (tb.r2, "to_rfl"),
        (tb.reflector, HOST_INTERFACE),
    ):
        node.exec(["ethtool", "-K", ifname, "tx", "off"])
    code = "from sixlab.dataplane.xdp_plane import attach_xdp_pass; attach_xdp_pass('to_rfl')"
    tb.r2.exec([sys.executable, "-c", code], timeout=120)


def _measure(
    args: argparse.Namespace, console: Console, tb: Any, db: Path, agents: tuple[str, str]
) -> tuple[list[_Path], dict[str, list[ev.StampResult]], dict[str, PathStats], Path]:
    from sixlab.controller.core import Controller, SessionSpec  # noqa: PLC0415
    from sixlab.controller.metrics import ControllerMetrics  # noqa: PLC0415
    from sixlab.controller.store import open_store  # noqa: PLC0415

    saddr, raddr = agents
    metrics = ControllerMetrics()
    if args.metrics:
        host, port = args.metrics
        metrics.serve(port, host)
    controller = Controller(open_store(db), metrics, poll_interval_s=0.25)
    try:
        controller.register_node("sender", saddr, "sender")
        controller.register_node("reflector", raddr, "reflector")
        for node, source, port in (
            ("sender", tb.sender_addr, SENDER_PORT),
            ("reflector", tb.reflector_addr, REFLECTOR_PORT),
        ):
            controller.init_node(
                node,
                source=source,
                port=port,
                interface=HOST_INTERFACE,
                dataplane=args.dataplane,
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
                    reflector_port=REFLECTOR_PORT,
                    interval_ns=round(args.interval * NS_PER_S),
                    duration_ns=round(args.duration * NS_PER_S),
                    loss_timeout_ns=round(args.timeout * NS_PER_S),
                    collect=args.collect,
                )
            )
        # The third path: loopback mode, no reflector (docs/srpm.md). Out over link B,
        # around far (its End SID; far runs no agent), back over link A to the sender.
        loop = tb.loopback_paths["F"]
        paths.append(_Path("path-L", tuple(loop.segments), None, loop.round_trip_delay_ms))
        controller.create_session(
            SessionSpec(
                name="path-L",
                sender="sender",
                reflector="",
                reflector_address="",
                loopback=True,
                segments=tuple(loop.segments),
                source_address=tb.sender_addr,
                interval_ns=round(args.interval * NS_PER_S),
                duration_ns=round(args.duration * NS_PER_S),
                loss_timeout_ns=round(args.timeout * NS_PER_S),
                collect=args.collect,
            )
        )
        for path in paths:
            controller.start_session(path.name)
        names = ", ".join(q.name for q in paths)
        console.print(f"measuring {names} for {args.duration:g} s (Ctrl-C stops) ...")
        progress, task = _progress(args.duration)
        start = time.monotonic()
        stats: dict[str, PathStats] = {}
        with Live(console=console, refresh_per_second=4, transient=args.json) as live:
            while True:
                elapsed = time.monotonic() - start
                progress.update(task, completed=min(elapsed, args.duration))
                stats = {p.name: controller.stats(p.name) for p in paths}
                live.update(Group(progress, _table(paths, stats, "sixlab demo — STAMP over SRv6")))
                if all(controller.wait_finished(p.name, 0) for p in paths):
                    break
                if elapsed > args.duration + args.timeout + 10:
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

    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    t0 = min((r.t1_ns for recs in records.values() for r in recs), default=0)
    for ax, (label, attr, idx) in zip(
        axes,
        (
            ("direct (T2−T1)", "direct_ns", 0),
            ("return (T4−T3)", "return_ns", 1),
            ("round trip", "rtt_ns", 2),
        ),
        strict=True,
    ):
        for p in paths:
            if idx < 2 and p.loop_ms is not None:
                continue  # a loopback path has no one-way delays
            recs = records.get(p.name, [])
            xs = [(r.t1_ns - t0) / 1e9 for r in recs]
            ys = [getattr(r, attr) / 1e6 for r in recs]
            (line,) = ax.plot(xs, ys, ".-", markersize=3, linewidth=0.8, label=p.name)
            want = p.configured_rtt_ms if idx == 2 else None
            if idx < 2 and p.configured is not None:
                want = p.configured[idx]
            if want is not None:
                ax.axhline(want, color=line.get_color(), linestyle="--", linewidth=0.8)
        ax.set_ylabel(f"{label} ms")
        ax.grid(visible=True, alpha=0.3)
        ax.legend(loc="upper right")
    axes[-1].set_xlabel("time since first probe (s); dashed: configured delay")
    fig.suptitle("sixlab demo — STAMP delays per SRv6 path (path-L: loopback mode)")
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
        loss_timeout_ns=round(args.timeout * NS_PER_S),
    )
    sender.add_session(SenderSessionSpec(config, lo, rplane.local_port))
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
                if elapsed > args.duration + args.timeout + 5:
                    break
            records += sender.results(1)
            lost += len(sender.lost(1))
    finally:
        sender.shutdown()
        reflector.shutdown()
        splane.close()
        rplane.close()
    return paths, {"loopback": records}, {"loopback": path_stats(records, lost)}
