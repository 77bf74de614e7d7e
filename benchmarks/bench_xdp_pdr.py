"""What the xdp plane's programs cost traffic that is not STAMP: CPU per forwarded frame.

    sudo .venv/bin/python benchmarks/bench_xdp_pdr.py forward-cpu [--rounds 40] [--rate 100000]
    sudo .venv/bin/python benchmarks/bench_xdp_pdr.py pdr [bench_stamp.py paper options]
    sudo .venv/bin/python benchmarks/bench_xdp_pdr.py forward [bench_stamp.py paper options]

``pdr`` and ``forward`` measure PDRs, and there is one way to measure a PDR:
``benchmarks/bench_stamp.py paper`` (``sixlab.bench.stamp_paper``). They are that
command for the figures they used to give: ``pdr`` the reflector alone (100 % STAMP,
Fig 14b), ``forward`` forwarding with the xdp plane attached and idle against the
baseline without it (0 % STAMP, Fig 13); any other option goes to ``bench_stamp.py``.

The data traffic, as in ``bench_stamp.py``: the SUT forwards UDP to port 9 (44-byte
payload, the size of a STAMP probe) from the generator to a sink with SRv6 H.Encaps (a
``seg6`` ``encap`` route, as in the STAMP paper's baseline, docs/papers.md;
``sixlab.bench.forward``); the sink counts and drops what arrives.

``forward-cpu``: the forwarding measured so that the configurations share one receive
path and that path runs on the SUT's CPU (a PDR cannot tell 1 %):

* GRO on the SUT's ingress veth. A veth has a NAPI instance while GRO is on *or* an
  XDP program is attached; with one, frames from its peer go through its ptr_ring and
  NAPI poll (``veth_xdp_rcv``: XDP program if any, then ``napi_gro_receive``) instead
  of ``netif_rx`` on the sender's CPU. With GRO on in every configuration, attaching a
  program does not switch the receive path; it only adds the program (and, on a
  veth, the copy of each skb into a page with XDP headroom, which ``xdp-pass`` shows).
  UDP is not aggregated by GRO unless the device forwards UDP GRO (off), so each frame
  is still forwarded on its own.
* Threaded NAPI (``/sys/class/net/in0/threaded`` = 1, written in the SUT's namespace):
  the poll runs in a kthread ``napi/in0-ID`` instead of the sender's softirq, and the
  kthread is pinned to the SUT's CPU 1 (``taskset -p``) while the generator stays on
  CPU 0. No RPS on the SUT's ingress (it would queue each frame again to CPU 1's
  backlog). The sink's receive (netif_rx on CPU 1, nftables drop) runs in the softirq
  that the kthread's ``local_bh_enable`` runs, so it is charged to the kthread too.
* Checked before measuring (``where`` in the output): exactly one new kthread appears,
  it stays the same through every attach/detach; per CPU, ``softnet_stat`` shows the
  receive path on CPU 1 only; the reflector program's per-CPU ``pass-short`` counter
  (STAMP frames it parses and passes) grows on CPU 1 only; under ``bpf_stats_enabled``
  (on for that check only) the program ran once per forwarded frame, and its own
  ns/run is reported.

Configurations: ``none`` (no XDP program), ``xdp-pass`` (the plain XDP_PASS program:
what any XDP program costs a veth), ``stamp`` (the xdp plane's reflector program with a
default session: every frame goes through it and is passed on), and ``timestamps``:
no program, only the UDP socket with ``SO_TIMESTAMPNS`` that the xdp plane opens for its
user-space path (``CPU_CONFIGS``: such a socket makes the kernel time-stamp every frame
it receives, host-wide, so ``stamp`` pays that too). Interleaved
over ``--rounds`` rounds (each configuration taking each position in turn), per
configuration: attach, ``--warmup`` s of traffic, then

(a) flat out: the generator sends as fast as it can for ``--flat-seconds`` (more than
    the SUT forwards: the kthread is ~100 % busy); forwarded frames/s at the sink;
(b) a fixed rate ``--rate`` below saturation for ``--seconds``: CPU time per forwarded
    frame of the NAPI kthread (``/proc/PID/schedstat``, exact ns), of CPU 1 as a whole
    (wall time less the cpuidle states' time: exact µs, includes other jobs and the
    wake-ups) and, as the issue names it, CPU 1's softirq share from /proc/stat (sampled
    at timer ticks: coarse and, for short bursts, biased; reported, not relied on).

Each figure is given as ratios of the configurations' means (``RATIOS``: each to
``none``; stamp/xdp-pass; and that divided by timestamps/none, the program against the
empty one with the time stamping taken out) with a 95 % percentile bootstrap interval
over the paired rounds (``--resamples``, ``--seed``). Another job on the host that opens
a time-stamping socket switches the stamping on for every configuration meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from ipaddress import IPv6Address
from pathlib import Path
from typing import Any

from sixlab.bench.forward import (
    allowed_cpus,
    data_frame,
    kthreads,
    nft,
    setup_forwarding,
    softnet_processed,
    threaded_napi,
)
from sixlab.bench.generator import TrialResult, build_generator, interface_mac, run_generator
from sixlab.dataplane.base import Dataplane, DataplaneConfig
from sixlab.dataplane.udpsocket import SocketDataplane
from sixlab.dataplane.xdp_plane import Reason, XdpDataplane, attach_xdp_pass
from sixlab.linux import libbpf
from sixlab.stamp.reflector import ReflectorSessionConfig
from sixlab.testbed import BenchTestbed, entered, two_node_bench
from sixlab.wire.packet import build_udp_packet

PREFIX = "sixlab-bench-"
STAMP_PORT = 862  # RFC 8762 §4.1
#: The RFC 2544 split (docs/design-notes.md): generator on CPU 0, system under test on CPU 1.
GEN_CPU = 0
SUT_CPU = 1
#: Counter key of the reflector's ``stamp_counters`` (struct stamp_counter_key) and the
#: SSID of packets without a session (STAMP_NO_SSID), as in stamp_common.h.
_COUNTER_KEY = struct.Struct("<II")
_NO_SSID = 0xFFFFFFFF
_BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
_SETTLE_S = 0.2
#: No XDP program, the plain XDP_PASS program (what any XDP program costs a veth), our
#: reflector program with a default session.
CONFIGS = ("none", "xdp-pass", "stamp")
#: ``forward-cpu`` adds ``timestamps``: no XDP program, only the UDP socket that the xdp
#: plane's user-space path opens (``SO_TIMESTAMPNS``). Any socket asking for receive
#: timestamps turns on the kernel's global ``netstamp_needed`` switch, and from then on
#: every frame received on the host is stamped with the time of day (``__net_timestamp``
#: in the receive path), whatever namespace it is in: this separates that cost of the
#: plane from its program's.
CPU_CONFIGS = (*CONFIGS, "timestamps")
_SETTLE_MAX_S = 3.0


# --------------------------------------------------------------------------- forward


class ForwardTrials:
    """Trials of data traffic gen → SUT (H.Encaps) → sink, counted at the sink."""

    def __init__(self, tb: BenchTestbed) -> None:
        assert tb.sink is not None
        assert tb.sink_addr is not None
        self.tb = tb
        self.binary = build_generator()
        smac = interface_mac(tb, tb.gen, tb.gen_if)
        dmac = interface_mac(tb, tb.sut, tb.sut_if)
        self.frame = data_frame(smac, dmac, tb.gen_addr, tb.sink_addr, sport=40009)
        nft(
            tb,
            tb.sink,
            "table netdev sixlab_sink {\n  counter frames {}\n"
            "  chain ingress { type filter hook ingress device eth0 priority -500;\n"
            "    meta protocol ip6 counter name frames drop\n  }\n}\n",
        )

    def count(self) -> int:
        assert self.tb.sink is not None
        out = self.tb.testbed.exec_in(
            self.tb.sink, ["nft", "-j", "list", "counters", "table", "netdev", "sixlab_sink"]
        ).stdout
        for item in json.loads(out)["nftables"]:
            if "counter" in item:
                return int(item["counter"]["packets"])
        return 0

    def settle(self) -> int:
        """The sink's frame count once it has stood still (late frames included)."""
        deadline = time.monotonic() + _SETTLE_MAX_S
        last = self.count()
        while time.monotonic() < deadline:
            time.sleep(_SETTLE_S)
            now = self.count()
            if now == last:
                break
            last = now
        return last

    def trial(self, rate: float, seconds: float) -> TrialResult:
        before = self.settle()
        stats = self.generate(rate, seconds)
        return TrialResult(
            rate=rate,
            seconds=seconds,
            offered=int(stats["offered"]),
            received=self.settle() - before,
            input_drops=int(stats["input_drops"]),
            elapsed_s=float(stats["elapsed_s"]),
        )

    def generate(self, rate: float, seconds: float, frame: bytes | None = None) -> dict[str, float]:
        """Run the generator on CPU 0 (``frame``, or the data frame); its JSON summary."""
        frame = self.frame if frame is None else frame
        return run_generator(self.tb, self.binary, frame, rate, seconds, cpu=GEN_CPU)


def _forward_setup(tb: BenchTestbed) -> ForwardTrials:
    """H.Encaps on the SUT, tx checksum offload off, the sink's counter; forwarding checked."""
    setup_forwarding(tb)
    trials = ForwardTrials(tb)
    check = trials.trial(1000, 0.5)
    if check.received < 0.99 * check.offered:
        raise RuntimeError(f"forwarding does not work: {check}")
    return trials


def _attach(tb: BenchTestbed, what: str) -> Dataplane | None:
    """Put configuration ``what`` (``CPU_CONFIGS``) on the SUT; the plane if any."""
    if what == "timestamps":
        with entered(tb.sut.ns):
            sock = SocketDataplane(DataplaneConfig(STAMP_PORT))
            sock.open()
        return sock
    if what == "stamp":
        with entered(tb.sut.ns):
            plane = XdpDataplane(DataplaneConfig(STAMP_PORT, interface=tb.sut_if))
            plane.open()
        try:
            plane.set_reflector_session(ReflectorSessionConfig(ssid=None))
        except BaseException:
            plane.close()
            raise
        return plane
    if what == "xdp-pass":
        with entered(tb.sut.ns):
            attach_xdp_pass(tb.sut_if)
    return None


def _detach(tb: BenchTestbed, what: str, plane: Dataplane | None) -> None:
    if plane is not None:
        plane.close()
    if what == "xdp-pass":
        tb.sut.exec(["ip", "link", "set", "dev", tb.sut_if, "xdp", "off"])


# ----------------------------------------------------------------------- forward-cpu

#: Fields of a ``cpuN`` line of /proc/stat (proc(5)), in USER_HZ ticks.
_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
#: Fields that are the CPU doing work (guest time is already inside user).
_BUSY = ("user", "nice", "system", "irq", "softirq")
_USER_HZ = os.sysconf("SC_CLK_TCK")
#: The metrics of a configuration in a round, and which way is better.
METRICS = {
    "flat_fwd_pps": "forwarded frames/s, generator flat out (SUT CPU saturated)",
    "napi_ns_per_frame": "NAPI kthread CPU ns per forwarded frame at the fixed rate",
    "cpu1_ns_per_frame": "CPU 1 busy ns (wall - cpuidle) per forwarded frame at the fixed rate",
    "stat_busy_ns_per_frame": "CPU 1 busy ns (/proc/stat ticks) per forwarded frame, fixed rate",
    "softirq_ns_per_frame": "CPU 1 softirq ns (/proc/stat ticks) per forwarded frame, fixed rate",
}


def _task_ns(pid: int) -> int:
    """CPU time of task ``pid`` so far in ns (/proc/PID/schedstat, first field: exact,
    unlike the tick-sampled utime/stime)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def _cpu_stat(cpu: int) -> dict[str, int]:
    """The ``cpuN`` line of /proc/stat (ticks, sampled at each timer tick)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            return dict(zip(_STAT_FIELDS, map(int, line.split()[1:]), strict=False))
    raise RuntimeError(f"/proc/stat has no cpu{cpu}")


def _idle_ns(cpu: int) -> int | None:
    """Time ``cpu`` spent idle so far, ns: the sum over its cpuidle states (exact, in µs;
    None without cpuidle)."""
    states = sorted(Path(f"/sys/devices/system/cpu/cpu{cpu}/cpuidle").glob("state*/time"))
    return sum(int(t.read_text()) for t in states) * 1000 if states else None


def _percpu_counter(prog_id: int, map_name: str, key: bytes) -> list[int]:
    """Per-CPU values of ``key`` in map ``map_name`` of program ``prog_id``, via bpftool
    (an independent reader of the kernel's maps)."""
    prog = json.loads(
        subprocess.run(["bpftool", "-j", "prog", "show", "id", str(prog_id)],
                       check=True, capture_output=True, text=True).stdout
    )  # fmt: skip
    for map_id in prog.get("map_ids", []):
        info = json.loads(
            subprocess.run(["bpftool", "-j", "map", "show", "id", str(map_id)],
                           check=True, capture_output=True, text=True).stdout
        )  # fmt: skip
        if info.get("name") != map_name:
            continue
        dump = json.loads(
            subprocess.run(["bpftool", "-j", "map", "dump", "id", str(map_id)],
                           check=True, capture_output=True, text=True).stdout
        )  # fmt: skip
        for entry in dump:
            raw = entry.get("key")
            if isinstance(raw, list) and bytes(int(b, 16) for b in raw) == key:
                return [
                    int.from_bytes(bytes(int(b, 16) for b in v["value"]), "little")
                    for v in entry["values"]
                ]
        return []
    raise RuntimeError(f"program {prog_id} has no map {map_name}")


class CpuProbe:
    """CPU time spent on the SUT's side of a trial: the NAPI kthread, ksoftirqd, CPU 1."""

    def __init__(self, napi_pid: int, cpu: int) -> None:
        self.napi_pid = napi_pid
        self.cpu = cpu
        softirqd = [p for p, n in kthreads(f"ksoftirqd/{cpu}").items() if n == f"ksoftirqd/{cpu}"]
        self.ksoftirqd_pid = softirqd[0]

    def snapshot(self) -> tuple[int, int]:
        """Run time of the NAPI kthread and of ksoftirqd, ns."""
        return _task_ns(self.napi_pid), _task_ns(self.ksoftirqd_pid)

    def cpu_times(self) -> tuple[int, int | None, dict[str, int]]:
        """Wall clock, the CPU's idle time (cpuidle) and its /proc/stat line.

        A cpuidle state's time grows when the CPU leaves it, so an idle period still
        going on is not in it yet; this process moves to the CPU for the reading (which
        ends any idle period there) and back.
        """
        home = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {self.cpu})
        try:
            return time.monotonic_ns(), _idle_ns(self.cpu), _cpu_stat(self.cpu)
        finally:
            os.sched_setaffinity(0, home)


def _measure(
    trials: ForwardTrials, probe: CpuProbe, rate: float, seconds: float
) -> dict[str, float]:
    """One trial at ``rate`` with the SUT's CPU time around it.

    The kthread's and ksoftirqd's times are exact and taken until the sink's count has
    settled (what drains after the generator stops is the trial's work; the two are
    idle otherwise); /proc/stat is read just around the generator (other jobs on CPU 1
    count there too, so the shortest window).
    """
    before = trials.settle()
    napi0, soft0 = probe.snapshot()
    wall0, idle0, stat0 = probe.cpu_times()
    gen = trials.generate(rate, seconds)
    wall1, idle1, stat1 = probe.cpu_times()
    received = trials.settle() - before
    napi1, soft1 = probe.snapshot()
    busy = None if idle0 is None or idle1 is None else (wall1 - wall0) - (idle1 - idle0)
    tick_ns = 1e9 / _USER_HZ
    return {
        "offered": gen["offered"],
        "input_drops": gen["input_drops"],
        "elapsed_s": gen["elapsed_s"],
        "received": received,
        "napi_ns": napi1 - napi0,
        "ksoftirqd_ns": soft1 - soft0,
        "cpu_busy_ns": float("nan") if busy is None else busy,
        "stat_busy_ns": sum(stat1[f] - stat0[f] for f in _BUSY) * tick_ns,
        "stat_steal_ns": (stat1["steal"] - stat0["steal"]) * tick_ns,
        "cpu_softirq_ns": (stat1["softirq"] - stat0["softirq"]) * tick_ns,
    }


def _where(
    tb: BenchTestbed, trials: ForwardTrials, probe: CpuProbe, rate: float
) -> dict[str, object]:
    """Where the XDP program and the receive path run, checked (module doc)."""
    assert tb.sink_addr is not None
    out: dict[str, object] = {}
    for what in CPU_CONFIGS:
        plane = _attach(tb, what)
        try:
            pid_now = sorted(kthreads(f"napi/{tb.sut_if}-"))
            with entered(tb.sut.ns):
                prog_id = libbpf.xdp_query_id(socket.if_nametoindex(tb.sut_if))
            # The program's own run time (kernel BPF statistics, on for this trial only:
            # they add two clock readings per run) and the receive path per CPU.
            previous = _BPF_STATS.read_text()
            _BPF_STATS.write_text("1\n")
            try:
                info0 = libbpf.prog_info_by_id(prog_id) if prog_id else None
                soft0 = softnet_processed()
                m = _measure(trials, probe, rate, 1.0)
                soft1 = softnet_processed()
                info1 = libbpf.prog_info_by_id(prog_id) if prog_id else None
            finally:
                _BPF_STATS.write_text(previous)
            row: dict[str, object] = {
                "napi_kthreads": pid_now,
                "napi_cpus_allowed": allowed_cpus(probe.napi_pid),
                "softnet_processed_per_cpu": [b - a for a, b in zip(soft0, soft1, strict=True)],
                "received": m["received"],
                "napi_ns_per_frame": round(m["napi_ns"] / max(m["received"], 1)),
            }
            if info0 is not None and info1 is not None:
                runs = info1.run_cnt - info0.run_cnt
                row["xdp_prog"] = info1.name
                row["xdp_runs"] = runs
                row["xdp_ns_per_run"] = round((info1.run_time_ns - info0.run_time_ns) / runs, 1)
            if isinstance(plane, XdpDataplane):
                # STAMP frames that the program passes (payload shorter than the base
                # packet, counted ``pass-short`` per CPU): where the program ran.
                short = build_udp_packet(
                    IPv6Address(tb.gen_addr), IPv6Address(tb.sink_addr), 40862, STAMP_PORT,
                    bytes(20),
                )  # fmt: skip
                frame = trials.frame[:14] + short
                key = _COUNTER_KEY.pack(_NO_SSID, Reason.PASS_SHORT)
                c0 = _percpu_counter(prog_id, "stamp_counters", key) or [0] * len(soft0)
                sent = trials.generate(rate, 0.5, frame)["offered"]
                trials.settle()
                c1 = _percpu_counter(prog_id, "stamp_counters", key)
                row["short_stamp_sent"] = sent
                row["pass_short_per_cpu"] = [b - a for a, b in zip(c0, c1, strict=True)]
        finally:
            _detach(tb, what, plane)
        print(f"where, {what}: {row}", flush=True)
        out[what] = row
    return out


#: Ratios reported, as functions of the configurations' means: each against ``none``,
#: our program against the empty one, and that with the time stamping taken out (the
#: xdp plane's socket is open in ``stamp`` and not in ``xdp-pass``).
RATIOS: dict[str, Callable[[dict[str, float]], float]] = {
    "xdp-pass/none": lambda m: m["xdp-pass"] / m["none"],
    "stamp/none": lambda m: m["stamp"] / m["none"],
    "timestamps/none": lambda m: m["timestamps"] / m["none"],
    "stamp/xdp-pass": lambda m: m["stamp"] / m["xdp-pass"],
    "(stamp/xdp-pass)/(timestamps/none)": lambda m: (
        m["stamp"] * m["none"] / (m["xdp-pass"] * m["timestamps"])
    ),
}


def _bootstrap(
    per: dict[str, list[float]],
    stat: Callable[[dict[str, float]], float],
    resamples: int,
    rng: random.Random,
) -> tuple[float, float, float]:
    """``stat`` of the configurations' means, and its 95 % percentile bootstrap interval.

    Rounds are resampled with replacement, the same rounds for every configuration (they
    were measured side by side, so drift of the machine cancels within a round).
    """
    n = len(next(iter(per.values())))

    def means(idx: Sequence[int]) -> dict[str, float]:
        return {c: sum(v[i] for i in idx) / len(idx) for c, v in per.items()}

    stats = sorted(stat(means([rng.randrange(n) for _ in range(n)])) for _ in range(resamples))
    lo = stats[int(0.025 * resamples)]
    hi = stats[min(resamples - 1, int(0.975 * resamples))]
    return stat(means(range(n))), lo, hi


#: Rounds without visible interference from other jobs on the SUT's CPU, decided before
#: looking at the ratios: in every configuration the NAPI kthread had the CPU flat out
#: (it has it all when nothing else runs there) and the fixed rate lost (almost) nothing.
CLEAN_RULE = "every configuration: NAPI kthread >= 90 % busy flat out, fixed-rate loss < 1 %"


def _clean_rounds(rows: list[dict[str, Any]]) -> set[int]:
    dirty = set()
    for r in rows:
        flat, fixed = r["flat"], r["fixed"]
        busy = flat["napi_ns"] / (flat["elapsed_s"] * 1e9)
        loss = 1 - fixed["received"] / max(fixed["offered"], 1)
        if busy < 0.90 or loss >= 0.01:
            dirty.add(r["round"])
    return {r["round"] for r in rows} - dirty


def _metrics(fixed: dict[str, float], flat: dict[str, float]) -> dict[str, float]:
    n = max(fixed["received"], 1.0)
    return {
        "flat_fwd_pps": flat["received"] / flat["elapsed_s"],
        "napi_ns_per_frame": fixed["napi_ns"] / n,
        "cpu1_ns_per_frame": fixed["cpu_busy_ns"] / n,
        "stat_busy_ns_per_frame": fixed["stat_busy_ns"] / n,
        "softirq_ns_per_frame": fixed["cpu_softirq_ns"] / n,
    }


def run_forward_cpu(args: argparse.Namespace) -> dict[str, object]:
    # This process (and the generator, nft, ip... it starts) stays off the SUT's CPU.
    os.sched_setaffinity(0, {GEN_CPU})
    rows: list[dict[str, object]] = []
    with two_node_bench(forward=True, prefix=PREFIX) as tb:
        trials = _forward_setup(tb)
        # No RPS on the SUT's ingress: the NAPI kthread already runs on the SUT's CPU,
        # and RPS would queue every frame once more to that CPU's backlog.
        tb.sut.exec(["sh", "-c", f"echo 0 > /sys/class/net/{tb.sut_if}/queues/rx-0/rps_cpus"])
        napi = threaded_napi(tb, tb.sut, tb.sut_if, SUT_CPU)
        probe = CpuProbe(napi, SUT_CPU)
        name = kthreads("napi/")[napi]
        print(f"napi kthread {napi} ({name}) on CPU {allowed_cpus(napi)}; "
              f"ksoftirqd/{SUT_CPU} {probe.ksoftirqd_pid}", flush=True)  # fmt: skip
        where = _where(tb, trials, probe, args.rate)
        started = time.monotonic()
        for rnd in range(args.rounds):
            # Interleaved, and each configuration takes each position in turn, so that
            # neither drift nor what ran just before favours one of them.
            shift = rnd % len(CPU_CONFIGS)
            for what in CPU_CONFIGS[shift:] + CPU_CONFIGS[:shift]:
                plane = _attach(tb, what)
                try:
                    if sorted(kthreads(f"napi/{tb.sut_if}-")) != [napi]:
                        raise RuntimeError(f"{what}: the NAPI kthread changed")
                    trials.generate(args.rate, args.warmup)  # page pool, caches, routes
                    fixed = _measure(trials, probe, args.rate, args.seconds)
                    flat = _measure(trials, probe, 1e9, args.flat_seconds)
                finally:
                    _detach(tb, what, plane)
                m = _metrics(fixed, flat)
                loss = 1 - fixed["received"] / max(fixed["offered"], 1)
                print(f"round {rnd + 1}, {what:8}: flat {m['flat_fwd_pps']:,.0f} fwd/s "
                      f"(napi {flat['napi_ns'] / flat['elapsed_s'] / 1e9:.0%} busy); at "
                      f"{args.rate:,.0f}/s: napi {m['napi_ns_per_frame']:,.0f} ns/frame, "
                      f"CPU{SUT_CPU} {m['cpu1_ns_per_frame']:,.0f}, softirq "
                      f"{m['softirq_ns_per_frame']:,.0f}, loss {loss:.2%}", flush=True)  # fmt: skip
                rows.append(
                    {
                        "round": rnd + 1,
                        "config": what,
                        "loadavg": os.getloadavg()[0],
                        "fixed": fixed,
                        "flat": flat,
                        **m,
                    }
                )
        took = time.monotonic() - started
    clean = _clean_rounds(rows)
    print(f"{args.rounds} rounds in {took:.0f} s, {len(clean)} clean ({CLEAN_RULE})")
    ratios: dict[str, dict[str, dict[str, float]]] = {}
    for label, keep in (("all rounds", set(range(1, args.rounds + 1))), ("clean rounds", clean)):
        if len(keep) < 2:
            continue
        rng = random.Random(args.seed)
        print(f"{label}: ratios, 95 % bootstrap CI ({args.resamples} resamples, paired rounds)")
        ratios[label] = {}
        for key in METRICS:
            per = {
                c: [float(str(r[key])) for r in rows if r["config"] == c and r["round"] in keep]
                for c in CPU_CONFIGS
            }
            means = {c: round(sum(v) / len(v), 1) for c, v in per.items()}
            print(f"  {key}: means {means}")
            for name, stat in RATIOS.items():
                ratio, lo, hi = _bootstrap(per, stat, args.resamples, rng)
                ratios[label][f"{key} {name}"] = {"ratio": ratio, "lo": lo, "hi": hi}
                print(f"    {name:36} {ratio:.4f} [{lo:.4f}, {hi:.4f}]")
    return {
        "where": where,
        "rows": rows,
        "ratios": ratios,
        "metrics": METRICS,
        "clean_rounds": sorted(clean),
    }


def _paper(*options: str) -> None:
    """Run ``bench_stamp.py paper`` with ``options`` and this command's own arguments."""
    script = Path(__file__).with_name("bench_stamp.py")
    argv = [sys.executable, str(script), "paper", *options, *sys.argv[2:]]
    print("=", shlex.join(argv), flush=True)
    os.execv(sys.executable, argv)


def main() -> None:
    if sys.argv[1:2] == ["pdr"]:  # the reflector alone, every plane that asks
        _paper("--roles", "reflector", "--fractions", "100")
    if sys.argv[1:2] == ["forward"]:  # the xdp plane attached and idle, and the baseline
        _paper("--roles", "reflector", "--fractions", "0", "--planes", "xdp")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["forward-cpu"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--rate",
        type=float,
        default=100_000.0,
        help="forward-cpu: the fixed offered rate (below saturation)",
    )
    parser.add_argument(
        "--seconds", type=float, default=1.5, help="forward-cpu: length of a fixed-rate trial"
    )
    parser.add_argument(
        "--flat-seconds", type=float, default=1.0, help="forward-cpu: length of a flat-out trial"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=0.2,
        help="forward-cpu: traffic after each attach, not measured",
    )
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    doc = run_forward_cpu(args)
    doc["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    doc["argv"] = sys.argv[1:]
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    main()
