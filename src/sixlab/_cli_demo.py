"""``sixlab demo``: watch STAMP measure delays, live.

This first version measures over loopback inside one process (a reflector engine and a
sender engine on ::1, the ``socket`` data plane). It prints a live table of direct,
return and round-trip delay, jitter and loss, and a summary (or JSON) at the end.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from sixlab.dataplane.base import DataplaneConfig, create
from sixlab.dataplane.engine import ReflectorEngine, SenderEngine, SenderSessionSpec
from sixlab.stamp import _events as ev
from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig
from sixlab.stamp.stats import DelaySummary, PathStats, path_stats

__all__ = ["add_parsers"]

LOOPBACK = ipaddress.IPv6Address("::1")
NS_PER_S = 1_000_000_000


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("demo", help="measure delays live and show them")
    p.add_argument("--duration", type=float, default=10.0, help="seconds (default 10)")
    p.add_argument("--interval", type=float, default=0.05, help="seconds between probes")
    p.add_argument("--json", action="store_true", help="one JSON document at the end")
    p.set_defaults(handler=_run)


def _ms(s: DelaySummary | None) -> dict[str, float] | None:
    return None if s is None else {k: round(v, 4) for k, v in s.as_ms().items()}


def _table(name: str, stats: PathStats, elapsed: float, duration: float) -> Table:
    table = Table(title=f"sixlab demo — STAMP over loopback — {elapsed:4.1f}/{duration:.0f} s")
    for col in ("path", "direct ms", "return ms", "rtt ms", "jitter ms", "loss"):
        table.add_column(col, justify="right" if col != "path" else "left")

    def cell(s: DelaySummary | None) -> str:
        return "—" if s is None else f"{s.mean_ns / 1e6:.3f} (p99 {s.p99_ns / 1e6:.3f})"

    jitter = stats.direct_jitter_ns
    table.add_row(
        name,
        cell(stats.direct),
        cell(stats.backward),
        cell(stats.rtt),
        "—" if jitter is None else f"{jitter / 1e6:.3f}",
        f"{stats.loss_ratio:.1%}",
    )
    return table


def _run(args: argparse.Namespace) -> int:
    if args.duration <= 0 or args.interval <= 0:
        print("sixlab demo: --duration and --interval must be positive", file=sys.stderr)
        return 2
    reflector_plane = create("socket", DataplaneConfig(port=0, source=LOOPBACK))
    sender_plane = create("socket", DataplaneConfig(port=0, source=LOOPBACK))
    reflector_plane.open()
    sender_plane.open()
    port = reflector_plane.local_port  # type: ignore[attr-defined]
    reflector = ReflectorEngine(reflector_plane, Reflector(ReflectorSessionConfig(ssid=None)))
    sender = SenderEngine(sender_plane)
    ssid = 1
    sender.add_session(
        SenderSessionSpec(
            SenderConfig(
                ssid=ssid,
                interval_ns=round(args.interval * NS_PER_S),
                duration_ns=round(args.duration * NS_PER_S),
                loss_timeout_ns=NS_PER_S,
            ),
            LOOPBACK,
            port,
        )
    )
    records: list[ev.StampResult] = []
    lost = 0
    console = Console(stderr=args.json)
    reflector.start()
    sender.start()
    start = time.monotonic()
    try:
        sender.start_session(ssid)
        with Live(console=console, refresh_per_second=4, transient=args.json) as live:
            while not sender.wait_finished(ssid, 0.25):
                records += sender.results(ssid)
                lost += len(sender.lost(ssid))
                elapsed = time.monotonic() - start
                live.update(_table("loopback", path_stats(records, lost), elapsed, args.duration))
                if elapsed > args.duration + 5:
                    break
            records += sender.results(ssid)
            lost += len(sender.lost(ssid))
            final = path_stats(records, lost)
            live.update(_table("loopback", final, time.monotonic() - start, args.duration))
    finally:
        sender.shutdown()
        reflector.shutdown()
        sender_plane.close()
        reflector_plane.close()
    if args.json:
        doc: dict[str, Any] = {
            "paths": [
                {
                    "name": "loopback",
                    "segments": [],
                    "configured": None,
                    "measured": {
                        "direct_ms": _ms(final.direct),
                        "return_ms": _ms(final.backward),
                        "rtt_ms": _ms(final.rtt),
                        "loss": final.loss_ratio,
                    },
                }
            ]
        }
        json.dump(doc, sys.stdout, indent=2)
        print()
    return 0 if final.received else 1
