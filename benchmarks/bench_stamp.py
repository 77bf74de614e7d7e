"""The STAMP paper's evaluation (§VIII, Figs 12–16) on the two-node bench, one command.

    sudo .venv/bin/python benchmarks/bench_stamp.py paper [--repeat 10] [--out DIR]
    sudo .venv/bin/python benchmarks/bench_stamp.py paper --quick
    .venv/bin/python benchmarks/bench_stamp.py report DIR

``paper`` (root): for each role (Session-Sender/Collector, Session-Reflector), each
implementation (the baseline without any STAMP process, sixlab's ``scapy``, ``mmap``,
``socket``, ``xdp`` and ``afxdp`` planes, and each ``--external``) and each STAMP share of the
traffic (the paper's 0, 0.05, 0.1, 0.5, 1, 5, 10, 20, 50, 100 %), the PDR at 0.5 % loss
(MLRsearch) of the total traffic the SUT handles: data it forwards with SRv6 H.Encaps
plus STAMP packets it reflects or collects (a collected packet counts only when the
collector stored its record). How, in ``sixlab.bench.stamp_paper``'s module doc.
Writes to ``--out`` (default ``stamp-paper-DATE``): ``stamp-paper.json`` (every trial,
rewritten after each point), ``stamp-paper.md`` (one table per figure and the ratios
next to the paper's) and ``fig12.png`` … ``fig16.png``.

``--quick``: one short repetition at 0, 1 and 100 % STAMP, short trials, a coarse
search below 100 kframes/s, then the harness's invariants (``check``): every
configuration has a PDR, every trial's counts add up and agree with the SUT's own
counters, the xdp plane's STAMP work was done by its kernel program. It runs in CI
(``tests/integration/test_bench_stamp.py``) and asserts no speed; a full run also
checks that the xdp plane at 100 % STAMP does not trail the user-space planes.

``--external NAME=COMMAND`` adds another implementation to every figure, started in the
SUT's namespace pinned to the SUT's CPU; ``{interface}``, ``{address}``, ``{port}`` (the
SUT's) and ``{ssid}`` are replaced. It takes the reflector figures; it takes the
collector figures too when ``--external-records NAME=COMMAND`` gives a command that
prints how many records it has stored so far (its STAMP frames then all carry SSID
``{ssid}``). Example, sixlab's own CLI as if it were someone else's reflector:

    --external 'cli=python -m sixlab stamp reflector --listen {address} --port {port}'

Where the work runs. On a veth an XDP program runs in the NAPI poll of the CPU that
sent the frame, the generator's. ``--rx-path napi`` (the default) makes that poll a
kthread pinned to the SUT's CPU (``bench_xdp_pdr.py forward-cpu``'s method), so the
SUT's forwarding and the xdp and afxdp planes' programs are charged to the SUT's CPU
for every implementation alike; ``--rx-path rps`` is the older benchmarks' receive
path, and the run then prints that the XDP-based planes' figures are partly the
generator's. The run prints where the receive path ran (frames per CPU).

``report DIR``: the table and the PNGs again from ``DIR/stamp-paper.json``.

Before a run that is meant to be read: the machine quiet (load below 0.5, no test run
going on); the load at the start and the end is in the JSON and the table.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal, cast

from sixlab.bench.stamp_paper import (
    NAPI_FIFO_PRIORITY,
    PAPER_FRACTIONS,
    PLANES,
    QUICK_FRACTIONS,
    RESIDUAL_S,
    ROLES,
    Implementation,
    PaperPoint,
    Role,
    SearchSettings,
    check,
    load_points,
    machine_state,
    parse_external,
    run_paper,
    sixlab_planes,
    write_results,
)
from sixlab.bench.stamp_report import markdown, plot_figures

#: --quick: a short, coarse search below this rate (the CI test checks invariants only).
QUICK_MAX_RATE = 100_000.0


def _commit() -> str:
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip

    try:
        sha = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "src")
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return f"{sha}{' (modified src)' if dirty else ''}"


def _percent_list(text: str) -> list[float]:
    return [float(v) / 100 for v in text.split(",")]


def _pairs(values: list[str]) -> dict[str, str]:
    out = {}
    for text in values:
        name, sep, command = text.partition("=")
        if not sep:
            raise SystemExit(f"expected NAME=COMMAND, got {text!r}")
        out[name.strip()] = command.strip()
    return out


def _render(points: list[PaperPoint], meta: dict[str, Any], out: Path) -> None:
    (out / "stamp-paper.md").write_text(markdown(points, meta))
    written = plot_figures(points, meta, out)
    print(f"wrote {out / 'stamp-paper.md'} and {', '.join(p.name for p in written.values())}")


def run(args: argparse.Namespace) -> int:
    planes = [p for p in args.planes.split(",") if p]
    unknown = [p for p in planes if p not in PLANES]
    if unknown:
        raise SystemExit(f"unknown plane(s) {unknown}: choose from {list(PLANES)}")
    roles = [cast(Role, r) for r in args.roles.split(",")]
    if any(r not in ROLES for r in roles):
        raise SystemExit(f"--roles: choose from {list(ROLES)}")
    records = _pairs(args.external_records)
    impls: list[Implementation] = sixlab_planes(planes)
    impls += [parse_external(text, records) for text in args.external]
    settings = SearchSettings(
        loss_ratio=args.loss,
        precision=args.precision,
        trial_seconds=args.trial,
        final_seconds=args.final,
        min_rate=args.min_rate,
        max_rate=args.max_rate,
        method=args.method,
    )
    fractions = _percent_list(args.fractions) if args.fractions else list(PAPER_FRACTIONS)
    repeat = args.repeat
    if args.quick:
        fractions = _percent_list(args.fractions) if args.fractions else list(QUICK_FRACTIONS)
        repeat = 1
        settings = SearchSettings(loss_ratio=args.loss, precision=0.2, trial_seconds=0.3,
                                  final_seconds=0.5, min_rate=args.min_rate,
                                  max_rate=args.max_rate or QUICK_MAX_RATE,
                                  method=args.method)  # fmt: skip
    out = args.out or Path(f"stamp-paper-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "command": shlex.join(["benchmarks/bench_stamp.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": _commit(),
        "machine": machine_state(),
        "roles": roles,
        "implementations": [vars_of(i) for i in impls],
        "fractions": fractions,
        "repeat": repeat,
        "settings": vars_of(settings),
        "residual_s": args.residual,
        "quick": args.quick,
    }
    points: list[PaperPoint] = []
    json_path = out / "stamp-paper.json"

    def on_point(point: PaperPoint) -> None:
        points.append(point)
        write_results(points, meta, json_path)

    from sixlab.testbed import two_node_bench  # noqa: PLC0415

    def search_log(message: str) -> None:
        if args.verbose:
            print(f"    {message}", file=sys.stderr, flush=True)

    with two_node_bench(forward=True, prefix=args.netns_prefix) as tb:
        _, info = run_paper(
            tb,
            impls,
            roles=roles,
            fractions=fractions,
            repeat=repeat,
            settings=settings,
            rx_path=cast(Literal["napi", "rps"], args.rx_path),
            napi_priority=args.napi_priority,
            residual_s=args.residual,
            on_point=on_point,
            log=lambda m: print(m, flush=True),
            search_log=search_log,
            out=out,
        )
    meta.update(info)
    meta["machine_end"] = machine_state()
    meta["date_end"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    # A speed is asserted only on a full run (check's module doc): --quick runs in CI.
    problems = check(points, meta, impls, roles, fractions, compare_speed=not args.quick)
    meta["invariants"] = problems or "all hold"
    write_results(points, meta, json_path)
    _render(points, meta, out)
    print(markdown(points, meta))
    if problems:
        print("INVARIANTS VIOLATED:\n  " + "\n  ".join(problems))
        return 1
    print("invariants: all hold")
    return 0


def vars_of(obj: object) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in getattr(obj, "__slots__", ())}


def report(args: argparse.Namespace) -> int:
    points, meta = load_points(args.dir / "stamp-paper.json")
    _render(points, meta, args.dir)
    return 0


def _stop(signum: int, _frame: object) -> None:
    """SIGTERM: unwind (the testbed's ``with`` removes the namespaces), exit 128 + n."""
    raise SystemExit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("paper", help="measure Figs 12-16")
    p.add_argument("--planes", default=",".join(PLANES))
    p.add_argument("--roles", default=",".join(ROLES))
    p.add_argument("--fractions", help="STAMP shares in %% (default: the paper's)")
    p.add_argument("--repeat", type=int, default=3, help="repetitions per point (paper: 10)")
    p.add_argument("--quick", action="store_true", help="short CI run, then the invariants")
    p.add_argument("--external", action="append", default=[], metavar="NAME=COMMAND")
    p.add_argument("--external-records", action="append", default=[], metavar="NAME=COMMAND")
    p.add_argument("--rx-path", choices=["napi", "rps"], default="napi")
    p.add_argument("--napi-priority", type=int, default=NAPI_FIFO_PRIORITY,
                   help="SCHED_FIFO priority of the SUT's NAPI kthread (0: none)")  # fmt: skip
    p.add_argument("--loss", type=float, default=0.005, help="PDR loss ratio")
    p.add_argument("--precision", type=float, default=0.02, help="relative width")
    p.add_argument("--trial", type=float, default=1.0, help="initial trial seconds")
    p.add_argument("--final", type=float, default=5.0, help="final trial seconds")
    p.add_argument("--residual", type=float, default=RESIDUAL_S,
                   help="seconds after a trial in which answers still count")  # fmt: skip
    p.add_argument("--min-rate", type=float, default=SearchSettings().min_rate,
                   help="lowest rate searched (a PDR of 0: lost more already there)")  # fmt: skip
    p.add_argument("--max-rate", type=float, default=0.0, help="0: the generator's ceiling")
    p.add_argument("--method", choices=["mlrsearch", "bisect"], default="mlrsearch")
    p.add_argument("--out", type=Path)
    p.add_argument("--netns-prefix", default="sixlab-", help="name prefix of the namespaces")
    p.add_argument("-v", "--verbose", action="store_true", help="log every search step")
    r = sub.add_parser("report", help="table and plots again from a run's JSON")
    r.add_argument("dir", type=Path)
    args = parser.parse_args()
    sys.exit(run(args) if args.what == "paper" else report(args))


if __name__ == "__main__":
    main()
