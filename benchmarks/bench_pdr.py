"""RFC 2544 PDR at 0.5 % loss of each STAMP reflector data plane, side by side in one run.

On one two-node bench (``two_node_bench``, RPS set by ``sixlab.bench.prepare_bench``):
for each plane, a reflector process with that plane in the SUT namespace pinned to
CPU 1 (SSID-agnostic stateless default session), and the C frame generator of
``sixlab.bench.generator`` pinned to CPU 0 driven by the PDR search of
``sixlab.bench.pdr`` (MLRsearch by default). First the generator's own ceiling is
measured with nothing reflecting. Prints a table of PDRs and ratios to ``scapy``, and
one JSON document with every trial (``--json FILE``). Absolute rates drift on shared
machines (docs/design-notes.md): compare the ratios of one run.

    sudo .venv/bin/python benchmarks/bench_pdr.py [--planes scapy,mmap,socket,xdp]

xdp is not in the default list: its XDP_TX replies only reach the generator when the
generator's veth has an XDP program too, which ``benchmarks/bench_xdp_pdr.py`` sets up.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path


def _log(plane: str, message: str) -> None:
    print(f"  [{plane}] {message}", file=sys.stderr)


def _planes(requested: str) -> list[str]:
    from sixlab.dataplane import PLANES  # noqa: PLC0415

    planes = requested.split(",")
    if "xdp" in planes:
        try:
            PLANES.get("xdp")
        except ImportError as exc:
            print(f"xdp: skipped ({exc})", file=sys.stderr)
            planes.remove("xdp")
    return planes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planes", default="scapy,mmap,socket")
    parser.add_argument("--method", choices=["mlrsearch", "bisect"], default="mlrsearch")
    parser.add_argument("--loss", type=float, default=0.005, help="PDR loss ratio")
    parser.add_argument("--precision", type=float, default=0.02, help="relative width")
    parser.add_argument("--trial", type=float, default=1.0, help="initial trial seconds")
    parser.add_argument("--final", type=float, default=2.0, help="final trial seconds")
    parser.add_argument("--min-rate", type=float, default=200.0)
    parser.add_argument("--max-rate", type=float, default=0.0, help="0: generator ceiling")
    parser.add_argument(
        "--tick-us", type=float, default=100.0, help="generator send interval (0: per frame)"
    )
    parser.add_argument("--json", type=Path, help="write every trial here")
    args = parser.parse_args()

    from sixlab.bench.generator import (  # noqa: PLC0415
        StampTrialRunner,
        generator_ceiling,
        prepare_bench,
    )
    from sixlab.bench.pdr import search_pdr  # noqa: PLC0415
    from sixlab.bench.reflector import ReflectorProcess  # noqa: PLC0415
    from sixlab.testbed import two_node_bench  # noqa: PLC0415

    rows: list[dict[str, object]] = []
    with two_node_bench() as tb:
        prepare_bench(tb)
        runner = StampTrialRunner(tb, tick_us=args.tick_us)
        ceiling = generator_ceiling(runner)
        print(f"generator ceiling: {ceiling:,.0f} frames/s offered (nothing reflecting)")
        max_rate = args.max_rate or ceiling
        for plane in _planes(args.planes):
            refl = ReflectorProcess(tb, plane, cpu=1)
            started = time.monotonic()
            result = search_pdr(
                runner.trial,
                min_rate=args.min_rate,
                max_rate=max_rate,
                loss_ratio=args.loss,
                precision=args.precision,
                trial_seconds=args.trial,
                final_seconds=args.final,
                method=args.method,
                log=functools.partial(_log, plane),
            )
            counters = refl.finish()
            print(f"{plane}: PDR {result.pdr:,.0f} frames/s ({len(result.trials)} trials, "
                  f"{time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
            rows.append(
                {
                    "plane": plane,
                    "pdr": result.pdr,
                    "trials": [asdict(t) for t in result.trials],
                    "reflector": counters,
                }
            )
    base = next((float(str(r["pdr"])) for r in rows if r["plane"] == "scapy"), 0.0)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"\nPDR at {args.loss:.1%} loss, {args.method}, {stamp}; generator CPU 0, "
          f"reflector CPU 1; generator ceiling {ceiling:,.0f}/s")  # fmt: skip
    print(f"{'plane':8} {'PDR pps':>12} {'vs scapy':>9}")
    for r in rows:
        pdr = float(str(r["pdr"]))
        ratio = f"{pdr / base:9.1f}" if base else f"{'-':>9}"
        print(f"{r['plane']!s:8} {pdr:12,.0f} {ratio}")
    if args.json is not None:
        document = {"date": stamp, "ceiling": ceiling, "args": sys.argv[1:], "rows": rows}
        args.json.write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
