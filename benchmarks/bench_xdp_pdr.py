"""The xdp reflector under RFC 2544 load, and what its programs cost traffic that is not STAMP.

    sudo .venv/bin/python benchmarks/bench_xdp_pdr.py pdr [--planes mmap,xdp]
    sudo .venv/bin/python benchmarks/bench_xdp_pdr.py forward [--rounds 2]

``pdr``: PDR at 0.5 % loss of ``sixlab stamp reflector --dataplane PLANE`` on the
two-node bench (SUT process pinned to CPU 1), next to the generator's ceiling, with the
harness of ``sixlab.bench`` (C generator pinned to CPU 0, nftables reply counter, RPS,
MLRsearch). The reflector is the standalone tool, which sets its session through
``ReflectorEngine`` and so reaches the kernel program (``sixlab.bench.reflector`` sets
it on the core only). The generator's veth gets the XDP_PASS program (XDP_TX on a veth
needs XDP on its peer) and both veths tx checksum offload off, for every plane alike.

``forward``: the SUT forwards data traffic (UDP to port 9, 44-byte payload, the size of
a STAMP probe) from the generator to a sink with SRv6 H.Encaps (a ``seg6`` ``encap``
route, as in the seed); the sink counts and drops what arrives on its ingress (nftables
netdev). PDR at 0.5 % loss of that forwarding with nothing on the SUT's ingress
interface (``none``), with the plain XDP_PASS program (``xdp-pass``: what any XDP
program costs a veth, which switches to NAPI receive) and with the xdp plane's reflector
program and a default session (``stamp``: every frame goes through it and is passed
on), in turn, ``--rounds`` times. No STAMP traffic.

Where the XDP work runs: on a veth with an XDP program the frames are received in the
veth's NAPI poll on the CPU that sent them, i.e. the generator's CPU 0; RPS steers the
resulting skb to the SUT's CPU 1 only after the program (checked: the per-CPU reply
counter of the reflector program grows on the generator's CPU, whichever that is). So
on this bench the program's own cost is paid by the generator's CPU: it lowers what the
generator can offer, which ``forward`` also reports (``flat out``: offered and forwarded
rates when the generator sends as fast as it can). Read ``benchmarks/bench_xdp.py``
(per-packet run time of the program from the kernel's BPF statistics) for the program's
cost itself.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from ipaddress import IPv6Address
from pathlib import Path

from sixlab.bench import generator
from sixlab.bench.generator import (
    DEFAULT_BATCH,
    StampTrialRunner,
    TrialResult,
    build_generator,
    generator_ceiling,
    prepare_bench,
)
from sixlab.bench.pdr import search_pdr
from sixlab.dataplane.base import DataplaneConfig
from sixlab.dataplane.xdp_plane import XdpDataplane, attach_xdp_pass
from sixlab.stamp.reflector import ReflectorSessionConfig
from sixlab.testbed import BenchTestbed, Node, two_node_bench
from sixlab.testbed._netns import entered
from sixlab.wire.packet import build_udp_packet

PREFIX = "sixlab-bench-"
SID = "fc00:0:20::d6"  # the sink's SID: the outer destination of encapsulated traffic
DATA_PORT = 9  # discard (RFC 863): anything but STAMP's 862
_SETTLE_S = 0.2
#: Forwarding runs: no XDP program, the plain XDP_PASS program (what any XDP program
#: costs a veth), our reflector program with a default session.
CONFIGS = ("none", "xdp-pass", "stamp")
_SETTLE_MAX_S = 3.0


def _log(what: str, message: str) -> None:
    print(f"  [{what}] {message}", file=sys.stderr, flush=True)


def _nft(tb: BenchTestbed, node: Node, script: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".nft", delete=False) as f:
        f.write(script)
    try:
        return tb.testbed.exec_in(node, ["nft", "-f", f.name]).stdout
    finally:
        Path(f.name).unlink()


# ------------------------------------------------------------------------------- pdr


def _reflector(tb: BenchTestbed, plane: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "sixlab", "stamp", "reflector", "--dataplane", plane]
    proc = tb.run_pinned(tb.sut, [*argv, "--interface", tb.sut_if], 1, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    line = proc.stderr.readline().decode()
    if "reflecting on" not in line:
        proc.kill()
        raise RuntimeError(f"{plane}: reflector did not start: {line}")
    return proc


def run_pdr(args: argparse.Namespace) -> dict[str, object]:
    rows: list[dict[str, object]] = []
    with two_node_bench(prefix=PREFIX) as tb:
        prepare_bench(tb)
        for node, ifname in ((tb.gen, tb.gen_if), (tb.sut, tb.sut_if)):
            node.exec(["ethtool", "-K", ifname, "tx", "off"])
        with entered(tb.gen.ns):
            attach_xdp_pass(tb.gen_if)
        runner = StampTrialRunner(tb)
        ceiling = generator_ceiling(runner)
        print(f"generator ceiling: {ceiling:,.0f} frames/s offered (nothing reflecting)")
        for plane in args.planes.split(","):
            proc = _reflector(tb, plane)
            started = time.monotonic()
            result = search_pdr(
                runner.trial,
                min_rate=args.min_rate,
                max_rate=ceiling,
                loss_ratio=args.loss,
                precision=args.precision,
                trial_seconds=args.trial,
                final_seconds=args.final,
                log=lambda m, p=plane: _log(p, m),  # type: ignore[misc]
            )
            proc.terminate()
            _, err = proc.communicate(timeout=30)
            summary = err.decode().strip().splitlines()
            took = time.monotonic() - started
            print(f"{plane}: PDR {result.pdr:,.0f} frames/s = {result.pdr / ceiling:.1%} of "
                  f"the ceiling ({len(result.trials)} trials, {took:.0f} s); "
                  f"{'; '.join(summary)}", flush=True)  # fmt: skip
            rows.append(
                {
                    "plane": plane,
                    "pdr": result.pdr,
                    "summary": summary,
                    "trials": [_trial(t) for t in result.trials],
                }
            )
    return {"ceiling": ceiling, "rows": rows}


def _trial(t: TrialResult) -> dict[str, float]:
    return {
        "rate": t.rate,
        "seconds": t.seconds,
        "offered": t.offered,
        "received": t.received,
        "input_drops": t.input_drops,
        "elapsed_s": t.elapsed_s,
        "loss_ratio": t.loss_ratio,
    }


# --------------------------------------------------------------------------- forward


class ForwardTrials:
    """Trials of data traffic gen → SUT (H.Encaps) → sink, counted at the sink."""

    def __init__(self, tb: BenchTestbed) -> None:
        assert tb.sink is not None
        assert tb.sink_addr is not None
        self.tb = tb
        self.binary = build_generator()
        smac = _mac(tb, tb.gen, tb.gen_if)
        dmac = _mac(tb, tb.sut, tb.sut_if)
        packet = build_udp_packet(
            IPv6Address(tb.gen_addr), IPv6Address(tb.sink_addr), 40009, DATA_PORT, bytes(44)
        )
        self.frame = dmac + smac + b"\x86\xdd" + packet
        _nft(
            tb,
            tb.sink,
            "table netdev sixlab_sink {\n  counter frames {}\n"
            "  chain ingress { type filter hook ingress device eth0 priority -500;\n"
            "    meta protocol ip6 counter name frames drop\n  }\n}\n",
        )

    def _count(self) -> int:
        assert self.tb.sink is not None
        out = self.tb.testbed.exec_in(
            self.tb.sink, ["nft", "-j", "list", "counters", "table", "netdev", "sixlab_sink"]
        ).stdout
        for item in json.loads(out)["nftables"]:
            if "counter" in item:
                return int(item["counter"]["packets"])
        return 0

    def _settle(self) -> int:
        deadline = time.monotonic() + _SETTLE_MAX_S
        last = self._count()
        while time.monotonic() < deadline:
            time.sleep(_SETTLE_S)
            now = self._count()
            if now == last:
                break
            last = now
        return last

    def trial(self, rate: float, seconds: float) -> TrialResult:
        before = self._settle()
        argv = [str(self.binary), self.tb.gen_if, self.frame.hex(), f"{rate:.3f}", f"{seconds:.3f}"]
        # The same batch and pacing arguments as the harness's own STAMP trials.
        argv.append(str(DEFAULT_BATCH))
        tick_us = getattr(generator, "DEFAULT_TICK_US", None)
        if tick_us is not None:  # a generator that paces in ticks takes the tick too
            argv.append(f"{tick_us:.3f}")
        proc = self.tb.run_pinned(
            self.tb.gen, argv, 0, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = proc.communicate(timeout=seconds + 30)
        if proc.returncode != 0:
            raise RuntimeError(f"generator failed: {err.decode()}")
        stats = json.loads(out.decode().splitlines()[-1])
        return TrialResult(
            rate=rate,
            seconds=seconds,
            offered=int(stats["offered"]),
            received=self._settle() - before,
            input_drops=int(stats["input_drops"]),
            elapsed_s=float(stats["elapsed_s"]),
        )


def _mac(tb: BenchTestbed, node: Node, ifname: str) -> bytes:
    out = tb.testbed.exec_in(node, ["ip", "-j", "link", "show", ifname]).stdout
    return bytes.fromhex(json.loads(out)[0]["address"].replace(":", ""))


def run_forward(args: argparse.Namespace) -> dict[str, object]:
    rows: list[dict[str, object]] = []
    with two_node_bench(forward=True, prefix=PREFIX) as tb:
        assert tb.sink is not None
        assert tb.sink_addr is not None
        prepare_bench(tb)
        # H.Encaps on the SUT (RFC 8986 §5.1): traffic for the sink gets an outer IPv6
        # header + SRH towards the sink's SID, routed over out0.
        tb.testbed.exec_in(
            tb.sut, ["ip", "-6", "route", "add", "fc00:0:20::/48", "via", "fd00:0:20::1"]
        )
        tb.testbed.exec_in(
            tb.sut,
            ["ip", "-6", "route", "add", f"{tb.sink_addr}/128", "encap", "seg6", "mode",
             "encap", "segs", SID, "dev", "out0"],
        )  # fmt: skip
        for node, ifname in ((tb.gen, tb.gen_if), (tb.sut, tb.sut_if), (tb.sut, "out0")):
            node.exec(["ethtool", "-K", ifname, "tx", "off"])
        trials = ForwardTrials(tb)
        check = trials.trial(1000, 0.5)
        if check.received < 0.99 * check.offered:
            raise RuntimeError(f"forwarding does not work: {check}")
        ceiling = trials.trial(1e9, 2.0).offered_rate
        print(f"generator ceiling: {ceiling:,.0f} frames/s offered", flush=True)
        for rnd in range(args.rounds):
            for what in CONFIGS:
                plane = None
                if what == "stamp":
                    with entered(tb.sut.ns):
                        plane = XdpDataplane(DataplaneConfig(862, interface=tb.sut_if))
                        plane.open()
                    plane.set_reflector_session(ReflectorSessionConfig(ssid=None))
                elif what == "xdp-pass":
                    with entered(tb.sut.ns):
                        attach_xdp_pass(tb.sut_if)
                try:
                    result = search_pdr(
                        trials.trial,
                        min_rate=args.min_rate,
                        max_rate=ceiling,
                        loss_ratio=args.loss,
                        precision=args.precision,
                        trial_seconds=args.trial,
                        final_seconds=args.final,
                        log=lambda m, w=what: _log(w, m),  # type: ignore[misc]
                    )
                    # And flat out: on this bench the XDP program runs on the generator's
                    # CPU (module doc), so its cost shows as a lower offered rate here.
                    flat = trials.trial(1e9, 2.0)
                    counters = plane.counters() if plane is not None else {}
                finally:
                    if plane is not None:
                        plane.close()
                    if what == "xdp-pass":
                        tb.sut.exec(["ip", "link", "set", "dev", tb.sut_if, "xdp", "off"])
                fwd = flat.received / flat.elapsed_s
                print(f"round {rnd + 1}, {what}: forwarding PDR {result.pdr:,.0f} frames/s; "
                      f"flat out {flat.offered_rate:,.0f} offered, {fwd:,.0f} forwarded/s "
                      f"(kernel counters {counters})", flush=True)  # fmt: skip
                rows.append(
                    {
                        "round": rnd + 1,
                        "config": what,
                        "pdr": result.pdr,
                        "flat_offered": flat.offered_rate,
                        "flat_forwarded": fwd,
                        "counters": counters,
                    }
                )
    ratios: dict[str, float] = {}
    for key in ("pdr", "flat_forwarded"):
        mean = {
            c: sum(float(str(r[key])) for r in rows if r["config"] == c)
            / sum(1 for r in rows if r["config"] == c)
            for c in CONFIGS
        }
        for c in CONFIGS[1:]:
            ratios[f"{key} {c}/none"] = mean[c] / mean["none"]
            print(f"{key}: mean {c} / none {mean[c] / mean['none']:.3f}")
    return {"ceiling": ceiling, "rows": rows, "ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["pdr", "forward"])
    parser.add_argument("--planes", default="mmap,xdp")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--loss", type=float, default=0.005)
    parser.add_argument("--precision", type=float, default=0.02)
    parser.add_argument("--trial", type=float, default=1.0)
    parser.add_argument("--final", type=float, default=2.0)
    parser.add_argument("--min-rate", type=float, default=1000.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    doc = run_pdr(args) if args.what == "pdr" else run_forward(args)
    doc["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    doc["argv"] = sys.argv[1:]
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    main()
