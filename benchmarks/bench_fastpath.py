"""Reflector PDR at 0.5 % loss on SRv6 probes: every plane side by side in one run.

The bench of ``bench_pdr.py`` (``two_node_bench``, C generator pinned to CPU 0, reflector
pinned to CPU 1, RPS, nftables reply counter, MLRsearch), but every probe carries an
SRH at Segments Left 0 (two segments, the last the reflector's address), as on an
SRv6 network, and the reflector answers along a configured return SID list (one
segment: the generator), so every reply carries an SRH too. Per plane: the PDR, then
one trial at the PDR during which CPU 1's busy share is read (``CpuBusy``: idle and
steal time from /proc/stat), giving the SUT's CPU per reflected packet, and the
reflector process's own user and system time per reply (/proc/PID/stat: what the
process spent, whatever else CPU 1 ran; the receive work that the kernel does outside
the process, in softirq or on the generator's CPU, is not in it). Last, one trial flat
out with the plane in place: what the generator still offers (on a veth an XDP program
and the copy into an AF_XDP socket run on the sending CPU) and how many replies come
back (the maximum receive rate, MRR). A plane whose search ends at PDR 0 (too much loss
even at the minimum rate) is reported with ``-`` in the at-PDR columns and its
reflector's counters; there is no trial at 0 frames/s.

Planes: ``scapy``, ``mmap-main`` (the ``mmap`` plane of another source tree, e.g. the
main branch exported with ``git archive``: ``--before-src``), ``mmap``, ``afxdp``,
``xdp`` (its veth peer gets the XDP_PASS program, as ``bench_xdp_pdr.py`` does).

    sudo .venv/bin/python benchmarks/bench_fastpath.py --before-src /tmp/sixlab-main/src \\
        --planes scapy,mmap-main,mmap,afxdp,xdp [--sut-napi] --json /tmp/fastpath.json

On a veth, an XDP program (the ``xdp`` plane's, and the ``afxdp`` plane's redirect with
its copy into the UMEM) runs in the NAPI poll of the CPU that *sent* the frame: the
generator's. The generator then offers less than it is asked for; the report gives
what it really offered at the PDR (``offered@PDR``). ``--sut-napi`` moves that receive
work to the SUT's CPU (GRO and threaded NAPI on the SUT's veth, the kthread pinned to
CPU 1, as ``bench_xdp_pdr.py forward-cpu`` does), for every plane: the SUT's one core
then pays for its whole receive path, as it would on a NIC.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from ipaddress import IPv6Address
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the reflector role imports from the tree under test only
    from sixlab.bench.generator import TrialResult

ROOT = Path(__file__).resolve().parents[1]
#: Any SID: the segment the probe visited before the reflector (never routed to here).
FIRST_SEGMENT = "fc00:0:99::1"


def _log(plane: str, message: str) -> None:
    print(f"  [{plane}] {message}", file=sys.stderr)


def _reflector_main(args: argparse.Namespace) -> None:
    """The SUT: a reflector with a default session and a return SID list."""
    from sixlab.dataplane.base import DataplaneConfig, create  # noqa: PLC0415
    from sixlab.dataplane.engine import ReflectorEngine  # noqa: PLC0415
    from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig  # noqa: PLC0415

    plane = create(args.plane, DataplaneConfig(port=862, interface=args.interface))
    plane.open()
    reflector = Reflector()
    engine = ReflectorEngine(plane, reflector)
    segs = tuple(IPv6Address(s) for s in args.return_segments.split(","))
    engine.set_default(ReflectorSessionConfig(None, return_segments=segs))
    engine.start()
    print("ready", flush=True)
    sys.stdin.read()
    engine.shutdown()
    counters = plane.counters()
    plane.close()
    if engine.error is not None:
        raise engine.error
    print(json.dumps({"reflected": reflector.counters.reflected, "plane": counters}), flush=True)


def _proc_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU time of process ``pid`` and its threads so far, in ns."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = 1e9 / os.sysconf("SC_CLK_TCK")
    return int(fields[11]) * tick, int(fields[12]) * tick


_AT_PDR_FIELDS = (
    "cpu_busy", "ns_per_reply", "process_user_ns", "process_sys_ns", "loss_at_pdr",
    "offered_at_pdr", "replies_at_pdr",
)  # fmt: skip


#: The table's at-PDR columns: (row field, format).
_AT_PDR_COLUMNS = (
    ("offered_at_pdr", "{:,.0f}"),
    ("replies_at_pdr", "{:,.0f}"),
    ("cpu_busy", "{:.0%}"),
    ("ns_per_reply", "{:,.0f}"),
    ("process_user_ns", "{:,.0f}"),
    ("process_sys_ns", "{:,.0f}"),
)


@dataclass(frozen=True, slots=True)
class AtPdr:
    """The trial at the PDR: what came back, CPU 1's busy share, the reflector
    process's user and system time over it (ns)."""

    trial: TrialResult
    busy: float
    user_ns: float
    system_ns: float


class _Runner(Protocol):
    def trial(self, rate: float, seconds: float) -> TrialResult: ...


def measure_at_pdr(runner: _Runner, pid: int, pdr: float, seconds: float) -> AtPdr | None:
    """One trial of ``seconds`` at ``pdr`` with CPU 1's busy share and the process's
    CPU time; None when the PDR is 0: a search whose minimum rate already lost too much
    has no rate to re-check (and a generator asked for 0 frames/s refuses to run)."""
    from sixlab.bench.ilnp_study import CpuBusy  # noqa: PLC0415

    if pdr <= 0:
        return None
    before = _proc_cpu(pid)
    with CpuBusy(1) as cpu:
        trial = runner.trial(pdr, seconds)
    user, system = (b - a for a, b in zip(before, _proc_cpu(pid), strict=True))
    return AtPdr(trial, cpu.busy or 0.0, user, system)


def plane_row(
    name: str, pdr: float, at: AtPdr | None, flat: TrialResult, counters: dict[str, Any]
) -> dict[str, Any]:
    """The JSON row of one plane; the at-PDR fields are None when the PDR is 0."""
    row: dict[str, Any] = {"plane": name, "pdr": pdr}
    if at is None:
        row.update(dict.fromkeys(_AT_PDR_FIELDS))
    else:
        t = at.trial
        replies = max(t.received, 1)
        row.update(
            {
                "cpu_busy": at.busy,
                "ns_per_reply": at.busy * 1e9 * t.elapsed_s / replies,
                "process_user_ns": at.user_ns / replies,
                "process_sys_ns": at.system_ns / replies,
                "loss_at_pdr": t.loss_ratio,
                # What the generator really sent when asked for the PDR: on a veth the
                # plane's XDP work shares its CPU, and it may fall short.
                "offered_at_pdr": t.offered_rate,
                "replies_at_pdr": t.received / t.elapsed_s if t.elapsed_s else 0,
            }
        )
    row["flat_out_offered"] = flat.offered_rate
    row["flat_out_replies"] = flat.received / flat.elapsed_s if flat.elapsed_s else 0
    row["reflector"] = counters
    return row


def summary_line(row: dict[str, Any], seconds: float) -> str:
    """One line per plane as it finishes."""
    name, pdr = row["plane"], row["pdr"]
    if row["cpu_busy"] is None:
        return (f"{name}: PDR 0 (loss above the target at the search's minimum rate); "
                f"reflector {json.dumps(row['reflector'])} ({seconds:.0f} s)")  # fmt: skip
    return (f"{name}: PDR {pdr:,.0f}/s, CPU 1 busy {row['cpu_busy']:.0%} at it, "
            f"{row['ns_per_reply']:,.0f} ns per reply; reflector process user "
            f"{row['process_user_ns']:,.0f} + system {row['process_sys_ns']:,.0f} ns per "
            f"reply ({seconds:.0f} s)")  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    """The side-by-side table; a plane whose PDR is 0 shows ``-`` for the at-PDR columns."""
    base = next((r["pdr"] for r in rows if r["plane"] == "mmap-main"), 0.0)
    heads = ("PDR pps", "vs mmap-main", "offered@PDR", "replies@PDR", "CPU1 busy", "ns/reply",
             "proc user", "proc sys", "flat offered", "flat replies")  # fmt: skip
    widths = (10, 13, 12, 12, 10, 9, 10, 9, 13, 13)
    lines = [f"{'plane':10} " + " ".join(f"{h:>{w}}" for h, w in zip(heads, widths, strict=True))]
    for r in rows:
        cells = [
            f"{r['pdr']:,.0f}",
            f"{r['pdr'] / base:.2f}" if base else "-",
            *("-" if r[k] is None else fmt.format(r[k]) for k, fmt in _AT_PDR_COLUMNS),
            f"{r['flat_out_offered']:,.0f}",
            f"{r['flat_out_replies']:,.0f}",
        ]
        lines.append(
            f"{r['plane']:10} " + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True))
        )
    return "".join(line + "\n" for line in lines)


def main() -> None:  # noqa: PLR0915 - the flags, then one linear run of the benchmark
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planes", default="scapy,mmap-main,mmap,afxdp,xdp")
    parser.add_argument("--before-src", type=Path, help="source tree of mmap-main")
    parser.add_argument("--loss", type=float, default=0.005)
    parser.add_argument("--precision", type=float, default=0.02)
    parser.add_argument("--trial", type=float, default=1.0)
    parser.add_argument("--final", type=float, default=2.0)
    parser.add_argument("--cpu-trial", type=float, default=3.0, help="seconds at the PDR")
    parser.add_argument(
        "--sut-napi",
        action="store_true",
        help="receive on the SUT's CPU: GRO + threaded NAPI on its veth, kthread on CPU 1",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--role", choices=["reflector"], help=argparse.SUPPRESS)
    parser.add_argument("--plane", help=argparse.SUPPRESS)
    parser.add_argument("--interface", help=argparse.SUPPRESS)
    parser.add_argument("--return-segments", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "reflector":
        _reflector_main(args)
        return

    from sixlab.bench.generator import (  # noqa: PLC0415
        GEN_PORT,
        STAMP_PORT,
        StampTrialRunner,
        generator_ceiling,
        prepare_bench,
    )
    from sixlab.bench.pdr import search_pdr  # noqa: PLC0415
    from sixlab.dataplane.xdp_plane import attach_xdp_pass  # noqa: PLC0415
    from sixlab.testbed import entered, two_node_bench  # noqa: PLC0415
    from sixlab.wire.packet import build_udp_packet  # noqa: PLC0415

    class SrhTrialRunner(StampTrialRunner):
        """STAMP probes behind an SRH at Segments Left 0; replies behind a 1-SID SRH."""

        def frame(self, tag: int) -> bytes:
            payload = bytes(12) + b"\x00\x01" + tag.to_bytes(2, "big") + bytes(28)
            path = [IPv6Address(FIRST_SEGMENT), IPv6Address(self.tb.sut_addr)]
            packet = bytearray(
                build_udp_packet(
                    IPv6Address(self.tb.gen_addr),
                    IPv6Address(self.tb.sut_addr),
                    GEN_PORT,
                    STAMP_PORT,
                    payload,
                    segments=path,
                )
            )
            # As it arrives at the last segment (RFC 8754 §4.3.1): Segments Left 0 and
            # the Destination Address is the last segment (the UDP checksum's already).
            packet[24:40] = IPv6Address(self.tb.sut_addr).packed
            packet[43] = 0
            return self._dst_mac + self._src_mac + b"\x86\xdd" + bytes(packet)

        def reply_matches(self, tag: int | None) -> list[str]:
            # IPv6 + SRH of one segment (24 bytes): Next Header 43 at byte 6, the UDP
            # destination port at 40 + 24 + 2, the SSID at 40 + 24 + 8 + 14.
            match = f"@nh,48,8 43 @nh,528,16 {GEN_PORT}"
            return [match if tag is None else f"{match} @nh,688,16 {tag}"]

    rows: list[dict[str, Any]] = []
    me = [sys.executable, str(Path(__file__).resolve())]
    with two_node_bench() as tb:
        prepare_bench(tb)
        for node, ifname in ((tb.gen, tb.gen_if), (tb.sut, tb.sut_if)):
            tb.testbed.exec_in(node, ["ethtool", "-K", ifname, "tx", "off"])
        if args.sut_napi:
            from sixlab.bench.forward import threaded_napi  # noqa: PLC0415

            napi = threaded_napi(tb, tb.sut, tb.sut_if, 1)
            print(f"threaded NAPI kthread {napi} on CPU 1")
        runner = SrhTrialRunner(tb)
        ceiling = generator_ceiling(runner)
        print(f"generator ceiling: {ceiling:,.0f} frames/s (SRH probes, nothing reflecting)")
        for name in args.planes.split(","):
            plane = "mmap" if name == "mmap-main" else name
            env = dict(os.environ)
            if name == "mmap-main":
                if args.before_src is None:
                    raise SystemExit("mmap-main needs --before-src")
                env["PYTHONPATH"] = str(args.before_src)
            if plane == "xdp":
                with entered(tb.gen.ns):
                    attach_xdp_pass(tb.gen_if)
            argv = [*me, "--role", "reflector", "--plane", plane, "--interface", tb.sut_if,
                    "--return-segments", tb.gen_addr]  # fmt: skip
            proc = tb.run_pinned(
                tb.sut, argv, 1, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != b"ready":
                raise SystemExit(f"{name}: reflector did not start")
            started, first = time.monotonic(), len(runner.trials)
            result = search_pdr(
                runner.trial, min_rate=200.0, max_rate=ceiling, loss_ratio=args.loss,
                precision=args.precision, trial_seconds=args.trial, final_seconds=args.final,
                log=functools.partial(_log, name),
            )  # fmt: skip
            runner.settle()  # the search's last backlog is drained before counting CPU
            at = measure_at_pdr(runner, proc.pid, result.pdr, args.cpu_trial)
            # Flat out with the plane in place: what the generator's CPU can still offer
            # (on a veth, XDP programs and the copy into an AF_XDP socket run there).
            flat = runner.trial(1e9, 2.0)
            out, _ = proc.communicate(b"", timeout=60)
            counters = json.loads(out.splitlines()[-1])
            if plane == "xdp":
                tb.testbed.exec_in(tb.gen, ["ip", "link", "set", "dev", tb.gen_if, "xdp", "off"])
            row = plane_row(name, result.pdr, at, flat, counters)
            row["trials"] = len(result.trials)
            row["trials_detail"] = [
                (t.rate, t.offered_rate, t.loss_ratio) for t in runner.trials[first:]
            ]
            print(summary_line(row, time.monotonic() - started), flush=True)
            rows.append(row)
    load = os.getloadavg()
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"\nSRH probes, PDR at {args.loss:.1%} loss, {stamp}; load average {load[0]:.1f}; "
          f"generator ceiling {ceiling:,.0f}/s")  # fmt: skip
    print(table(rows), end="")
    if args.json is not None:
        document = {"date": stamp, "ceiling": ceiling, "load": load, "rows": rows}
        args.json.write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
