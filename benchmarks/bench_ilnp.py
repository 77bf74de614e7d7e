"""ILNP host costs: ILCC lookups by size, the host's receive path, and the daemon end to end.

    python benchmarks/bench_ilnp.py ilcc [--sizes 10,1000000] [--lookups N] [--repeat R]
    python benchmarks/bench_ilnp.py timers [--sizes 10,1000000] [--repeat R]
    python benchmarks/bench_ilnp.py memlat [--mib 1,8,16,32,128]
    python benchmarks/bench_ilnp.py cpucheck [--cpu 1] [--burst-us 30] [--gap-us 700]
    sudo python benchmarks/bench_ilnp.py daemon [--seconds S] [--window W]
    sudo python benchmarks/bench_ilnp.py echo [--policy none] [--fastpath off] [--json F]
    sudo python benchmarks/bench_ilnp.py study [--configs st-andrews,socket,sixlab] [--out DIR]

``ilcc`` (no privileges): ns per ``IlccStore.get`` of a random present NID with the
``hash`` store at each size (and ``linear`` at small sizes, for scale), the ratio of the
largest to the smallest. Two ways to make the key: ``premade`` looks up the very int
objects stored as keys (scattered over the heap: a cache miss to read the probe, none
to compare it); ``wire`` parses each NID afresh from one buffer of packet bytes, as
the receive path does (the new int is hot, the stored key is read to compare it), and
``parse`` is that parsing alone, so ``wire - parse`` is the lookup's own cost. Then ns
per ``IlnpHost.receive`` of a data packet from a known correspondent, with the ILCC at
the same sizes (the whole per-packet validation path), and the cost of one
``get_timer`` call.

``timers`` (no privileges): ms per ``IlnpHost.get_timer`` and per ``handle_timer`` with
nothing due, ILCC at each size. To compare with an older commit, run it once more with
that commit's sources first on the path (README.md, "ILNP host").

``study`` (root): the ILCC study of "Performance Analysis of Identifier Locator
Communication Cache Effects on ILNPv6 Stack" (docs/papers.md) rerun
(``sixlab.bench.ilnp_study``): for each configuration (policy, store, fast path) and
test rank K (0..10), a fresh daemon, the echo flow at 1,280 requests/s plus K x 66/s
from random new correspondents for 60 s (the paper's figures; ``--seconds``,
``--base-rate``, ``--per-process`` change them); per test the ILCC size, the echo flow's
and the crowd's service, the SUT CPU's busy share, the daemon's per-packet time p50/p99
and drops. Writes ``study.json`` and ``study.png`` (the paper's views, and CPU) to
``--out``.

``cpucheck`` (no privileges): a thread working ``--burst-us`` then sleeping
``--gap-us`` on one CPU, its share seen by its own CPU clock, by ``/proc/stat``'s
tick-sampled busy fields and by ``CpuBusy`` (idle-based, what ``study`` reports).

``memlat`` (no privileges, gcc): the latency of one dependent random read from a block
of each size (``benchmarks/memlat.c``, a pointer chase over huge-page-advised memory)
next to the ``hash`` lookup at 10 entries, and the least ratio that follows for a table
of 1M entries: such a table spans at least 16 MiB (an 8-byte key and an 8-byte
reference per entry), so a lookup of a random entry makes at least one read from a
16 MiB block that a 10-entry lookup does not, whatever the data structure or language.

``daemon`` (root): two namespaces joined by a veth pair, one ``sixlab ilnp host`` daemon
each (policy ``socket``); a UDP client in one keeps ``W`` requests in flight to an echo
server in the other for ``S`` seconds. Reports echoes per second and each daemon's
per-packet processing latency (ring read to TUN write, p50/p99 from its status). The
Python client and server cap this near 10k echoes/s: it cannot show more.

``echo`` (root): the RFC 2544 PDR (0.5 % loss, MLRsearch) of UDP echo over ILNPv6
through one ``sixlab ilnp host`` daemon (``sixlab.bench.ilnp_echo``): on
``two_node_bench()``, the C generator (CPU 0) offers whole ILNPv6 frames (nonce
Destination Option, NID-only UDP checksum) to the SUT, where the daemon and a batched C
UDP echo server bound to the SUT's identifier address port 7 share CPU 1; the echoes
are counted and dropped by nftables at the generator's ingress. One run measures the
generator's ceiling first (nothing answering), then checks that one frame's echo comes
back (fails loudly otherwise), then searches. Prints the PDR next to the ceiling, the
daemon's status after the search (host counters, drops, ring drops, latency, and the
fast path's counters when the daemon has one), udpecho's counters and the SUT kernel's
drop counters; ``--json FILE`` keeps every trial. ``--fastpath`` is passed to the
daemon (``sixlab ilnp host --fastpath``) when it has that option; ``off`` works with
any daemon.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sixlab.bench.ilnp_study import SEED_BASE_RATE, SEED_PER_PROCESS_RATE, SEED_SECONDS
from sixlab.ilnp import HostConfig, IlccEntry, IlnpHost, create_store
from sixlab.ilnp.daemon import control_request
from sixlab.testbed import Testbed
from sixlab.wire.ilnp import ILV, IlnpPacket, LocatorEntry, Nonce, encode_packet

LOC_A, LOC_B = 0x2001_0DB8_000A_0000, 0x2001_0DB8_000B_0000
NONCE = Nonce(b"\x01\x02\x03\x04")


def _entry(nid: int) -> IlccEntry:
    return IlccEntry(peer_nid=nid, local_nid=0xB, local_locator=LOC_B, local_nonce=NONCE)


def _best_ns(run: Any, n: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        run()
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def bench_lookup(store_name: str, size: int, lookups: int, repeat: int) -> float:
    store = create_store(store_name)
    rng = random.Random(size)
    nids = [rng.getrandbits(64) for _ in range(size)]
    for nid in nids:
        store.add(_entry(nid))
    probe = [nids[rng.randrange(size)] for _ in range(lookups)]
    get = store.get

    def run() -> None:
        for nid in probe:
            get(nid)

    return _best_ns(run, lookups, repeat)


_NID = struct.Struct("!Q")


def bench_hash_keys(size: int, lookups: int, repeat: int) -> dict[str, float]:
    """ns per ``hash`` store lookup: premade key objects, NIDs parsed from bytes, parse only."""
    store = create_store("hash")
    rng = random.Random(size)
    nids = [rng.getrandbits(64) for _ in range(size)]
    for nid in nids:
        store.add(_entry(nid))
    probe = [nids[rng.randrange(size)] for _ in range(lookups)]
    wire = b"".join(_NID.pack(nid) for nid in probe)  # the NIDs as packets carry them
    get, unpack = store.get, _NID.unpack_from

    def premade() -> None:
        for nid in probe:
            get(nid)

    def from_wire() -> None:
        for offset in range(0, len(wire), 8):
            get(unpack(wire, offset)[0])

    def parse() -> None:
        for offset in range(0, len(wire), 8):
            unpack(wire, offset)[0]

    runs = {"premade": premade, "wire": from_wire, "parse": parse}
    return {name: _best_ns(run, lookups, repeat) for name, run in runs.items()}


def bench_receive(size: int, packets: int, repeat: int) -> tuple[float, float]:
    """ns per receive() of a known peer's data packet, and ms per get_timer() walk."""
    host = IlnpHost(HostConfig(nid=0xB, locators=(LocatorEntry(LOC_B),)))
    rng = random.Random(size)
    for _ in range(size - 1):
        host.add_correspondent(rng.getrandbits(64) | 1 << 63, (LocatorEntry(LOC_A),), 0.0)
    host.add_correspondent(0xA, (LocatorEntry(LOC_A),), 0.0)
    udp = struct.pack("!HHHH", 4000, 7, 72, 0) + bytes(64)
    wire = encode_packet(IlnpPacket(ILV(LOC_A, 0xA), ILV(LOC_B, 0xB), 17, udp, NONCE))
    receive, next_event = host.receive, host.next_event

    def run() -> None:
        for _ in range(packets):
            receive(wire, 1.0)
            next_event()

    per_packet = _best_ns(run, packets, repeat)
    t0 = time.perf_counter()
    host.get_timer()
    return per_packet, (time.perf_counter() - t0) * 1000


def _ms_per_call(call: Any, repeat: int) -> float:
    """Best of ``repeat`` runs, each of as many calls as fit in about 0.2 s (at least 1)."""
    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    calls = max(1, min(100_000, int(0.2 / max(first, 1e-9))))

    def run() -> None:
        for _ in range(calls):
            call()

    return _best_ns(run, calls, repeat) / 1e6


def bench_timers(size: int, repeat: int) -> tuple[float, float]:
    """ms per get_timer() and per handle_timer() with nothing due, ``size`` entries."""
    host = IlnpHost(HostConfig(nid=0xB, locators=(LocatorEntry(LOC_B),)))
    rng = random.Random(size)
    for _ in range(size):
        host.add_correspondent(rng.getrandbits(64) | 1 << 63, (LocatorEntry(LOC_A),), 0.0)
    deadline = host.get_timer()
    assert deadline is not None
    assert deadline > 1.0  # nothing is due at 1.0: the default lifetime is 65535 s
    get_ms = _ms_per_call(host.get_timer, repeat)
    handle_ms = _ms_per_call(lambda: host.handle_timer(1.0), repeat)
    assert len(host.ilcc) == size
    return get_ms, handle_ms


def run_timers(args: argparse.Namespace) -> None:
    import sixlab  # noqa: PLC0415 (which sources: this tree's or an older commit's)

    print(f"sixlab from {Path(sixlab.__file__).parent}")
    print(f"{'entries':>9} {'ms/get_timer':>13} {'ms/handle_timer':>16}")
    for size in (int(s) for s in args.sizes.split(",")):
        get_ms, handle_ms = bench_timers(size, args.repeat)
        print(f"{size:>9} {get_ms:>13.5f} {handle_ms:>16.5f}", flush=True)


def run_ilcc(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"{'store':8} {'entries':>9} {'ns/lookup':>10} {'wire':>7} {'parse':>7} {'wire-parse':>10}"
    )
    hash_ns = {}
    for size in sizes:
        hash_ns[size] = ns = bench_hash_keys(size, args.lookups, args.repeat)
        own = ns["wire"] - ns["parse"]
        print(
            f"{'hash':8} {size:>9} {ns['premade']:>10.1f} {ns['wire']:>7.1f} "
            f"{ns['parse']:>7.1f} {own:>10.1f}"
        )
    for size in (10, 1000, 10000):
        linear = bench_lookup("linear", size, max(args.lookups // (size // 10 or 1), 200), 3)
        print(f"{'linear':8} {size:>9} {linear:>10.1f}")
    lo, hi = hash_ns[min(sizes)], hash_ns[max(sizes)]
    own = (hi["wire"] - hi["parse"]) / (lo["wire"] - lo["parse"])
    print(
        f"hash ratio {max(sizes)} / {min(sizes)} entries: "
        f"premade {hi['premade'] / lo['premade']:.2f}, "
        f"wire {hi['wire'] / lo['wire']:.2f}, wire-parse {own:.2f}"
    )
    print(f"\n{'entries':>9} {'ns/receive':>11} {'ms/get_timer':>13}")
    for size in sizes:
        per_packet, timer_ms = bench_receive(size, args.packets, args.repeat)
        print(f"{size:>9} {per_packet:>11.0f} {timer_ms:>13.2f}")


def run_memlat(args: argparse.Namespace) -> None:
    from sixlab.bench.generator import build_program  # noqa: PLC0415

    binary = build_program(Path(__file__).with_name("memlat.c"))
    sizes = [str(int(m)) for m in args.mib.split(",")]
    out = subprocess.run([binary, *sizes], check=True, capture_output=True, text=True).stdout
    latency = {int(m): float(ns) for m, ns, _ in (line.split() for line in out.splitlines())}
    lookup_10 = bench_hash_keys(10, args.lookups, args.repeat)["wire"]
    print(f"{'MiB':>6} {'ns per dependent random read':>30}")
    for mib, ns in latency.items():
        print(f"{mib:>6} {ns:>30.1f}")
    print(f"hash lookup at 10 entries (NID parsed from bytes): {lookup_10:.1f} ns")
    if 16 in latency:
        bound = (lookup_10 + latency[16]) / lookup_10
        print(f"least ratio 1M / 10 entries (one read from 16 MiB more): {bound:.2f}")


def run_cpucheck(args: argparse.Namespace) -> None:
    """A thread of known duty cycle on one CPU, seen three ways (CpuBusy's reason)."""
    from sixlab.bench.ilnp_study import CpuBusy  # noqa: PLC0415

    def ticks() -> list[int]:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith(f"cpu{args.cpu} "):
                return [int(v) for v in line.split()[1:]]
        raise SystemExit(f"no cpu{args.cpu} in /proc/stat")

    os.sched_setaffinity(0, {args.cpu})
    before, wall0, cpu0 = ticks(), time.monotonic(), time.thread_time()
    with CpuBusy(args.cpu) as busy:
        end = wall0 + args.seconds
        while time.monotonic() < end:
            burst = time.perf_counter()
            while time.perf_counter() - burst < args.burst_us * 1e-6:
                pass
            time.sleep(args.gap_us * 1e-6)
    after, wall, cpu = ticks(), time.monotonic() - wall0, time.thread_time() - cpu0
    d = [b - a for a, b in zip(before, after, strict=True)]
    sampled = d[0] + d[1] + d[2] + d[5] + d[6]
    print(f"thread's own CPU clock: {cpu / wall:.1%} of CPU {args.cpu}")
    print(f"/proc/stat busy fields (tick-sampled): {sampled / (sampled + d[3] + d[4]):.1%}")
    print(f"CpuBusy (1 - (idle + steal) / wall): {busy.busy or 0:.1%}")


def _ranks(text: str) -> list[int]:
    """``0-10`` or ``0,2,5``."""
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-", 1))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def run_study(args: argparse.Namespace) -> None:
    from sixlab.bench import prepare_bench  # noqa: PLC0415
    from sixlab.bench.ilnp_echo import IlnpEchoTrialRunner  # noqa: PLC0415
    from sixlab.bench.ilnp_study import (  # noqa: PLC0415
        CONFIGS,
        plot_study,
        route_crowd_via_generator,
        run_point,
        write_results,
    )
    from sixlab.testbed import two_node_bench  # noqa: PLC0415

    unknown = [c for c in args.configs.split(",") if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configuration(s) {unknown}: choose from {sorted(CONFIGS)}")
    configs = [CONFIGS[c] for c in args.configs.split(",")]
    ranks = _ranks(args.ranks)
    out = args.out or Path(f"ilnp-study-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    meta = {"date": stamp, "args": sys.argv[1:], "crowd_route": args.crowd_route,
            "configs": [c.name for c in configs],
            "ranks": ranks, "seconds": args.seconds, "base_rate": args.base_rate,
            "per_process_rate": args.per_process, "repeat": args.repeat}  # fmt: skip
    points = []
    header = (f"{'config':11} {'rank':>4} {'rep':>3} {'echo %':>7} {'crowd %':>8} "
              f"{'crowd sent':>10} {'ILCC':>7} {'p50 us':>8} {'p99 us':>9} "
              f"{'drops':>7} {'cpu %':>6} {'tx err':>7}")  # fmt: skip
    print(header, flush=True)
    os.sched_setaffinity(0, {0})  # this process is the generator's side: off the SUT's CPU
    with two_node_bench() as tb:
        prepare_bench(tb, gen_cpu=0, sut_cpu=1, gen_rps=False)
        if args.crowd_route == "via-generator":
            route_crowd_via_generator(tb)
        runner = IlnpEchoTrialRunner(tb, payload_size=args.payload)
        for config in configs:
            for rank in ranks:
                for rep in range(args.repeat):
                    point = run_point(tb, runner, config, rank, repetition=rep,
                                      seconds=args.seconds, base_rate=args.base_rate,
                                      per_process_rate=args.per_process)  # fmt: skip
                    points.append(point)
                    drops = sum(point.daemon_drops.values()) + point.ring_drops
                    drops += point.link_rx_dropped
                    print(f"{config.name:11} {rank:>4} {rep:>3} {100 * point.base_served:>7.1f} "
                          f"{100 * point.load_served:>8.1f} {point.load_sent:>10} "
                          f"{point.ilcc_size if point.ilcc_size is not None else '-':>7} "
                          f"{point.latency_p50_us or 0:>8.1f} {point.latency_p99_us or 0:>9.1f} "
                          f"{drops:>7} {100 * (point.sut_cpu_busy or 0):>6.1f} "
                          f"{point.tx_errors:>7}",
                          flush=True)  # fmt: skip
                    write_results(points, meta, out / "study.json")
    png = plot_study(points, configs, out / "study.png")
    print(f"\nwrote {out / 'study.json'} and {png}")


# --------------------------------------------------------------------- daemon

ECHO = """
import socket, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind(("fd00:2ff::b", 7))
print("ready", flush=True)
while True:
    data, peer = s.recvfrom(2048)
    s.sendto(data, peer)
"""

CLIENT = """
import socket, sys, time, json
window, seconds = int(sys.argv[1]), float(sys.argv[2])
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind(("fd00:2ff::a", 0))
s.connect(("fd00:2ff::b", 7))
s.settimeout(0.5)
payload = bytes(64)
for _ in range(window):
    s.send(payload)
got = lost = 0
start = time.perf_counter()
end = start + seconds
while time.perf_counter() < end:
    try:
        s.recv(2048)
        got += 1
    except TimeoutError:
        lost += 1
    s.send(payload)
elapsed = time.perf_counter() - start
print(json.dumps({"echoes": got, "timeouts": lost, "seconds": elapsed, "pps": got / elapsed}))
"""


def run_daemon(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="sixlab-bench-ilnp-"))
    hosts = tmp / "hosts"
    hosts.write_text("2001:db8:a:0/0:0:0:a alice\n2001:db8:b:0/0:0:0:b bob\n")
    with Testbed(prefix="sixlab-bench-") as tb:
        a, b = tb.add_node("a"), tb.add_node("b")
        tb.add_link(a, b, if_a="eth0", if_b="eth0", addr_a="2001:db8:a::a", addr_b="2001:db8:b::b")
        tb.exec_in(a, ["ip", "-6", "route", "add", "2001:db8:b::/64", "dev", "eth0"])
        tb.exec_in(b, ["ip", "-6", "route", "add", "2001:db8:a::/64", "dev", "eth0"])
        controls = {}
        for node, nid, loc in ((a, "0:0:0:a", "2001:db8:a:0"), (b, "0:0:0:b", "2001:db8:b:0")):
            control = str(tmp / f"{node.name}.sock")
            argv = [sys.executable, "-m", "sixlab.cli.ilnp", "host", "--nid", nid]
            argv += ["--locator", loc, "--interface", "eth0", "--policy", "socket"]
            argv += ["--control", control, "--hosts", str(hosts)]
            proc = tb.run_in(node, argv, stdout=subprocess.PIPE)
            assert proc.stdout is not None
            proc.stdout.readline()
            controls[node.name] = control
        echo = tb.run_in(b, [sys.executable, "-c", ECHO], stdout=subprocess.PIPE)
        assert echo.stdout is not None
        echo.stdout.readline()
        out = tb.exec_in(
            a,
            [sys.executable, "-c", CLIENT, str(args.window), str(args.seconds)],
            timeout=args.seconds + 30,
        ).stdout
        result = json.loads(out)
        print(
            f"UDP echo over ILNP, window {args.window}: {result['pps']:.0f} echoes/s "
            f"({result['echoes']} in {result['seconds']:.1f} s, {result['timeouts']} timeouts)"
        )
        for name, control in controls.items():
            status = control_request(control, {"cmd": "status"})
            lat = status["latency_us"]
            print(
                f"daemon {name}: per-packet ring->TUN p50 {lat['p50']:.1f} us, "
                f"p99 {lat['p99']:.1f} us over the last {lat['samples']} packets; "
                f"ring drops {sum(r['drops'] for r in status['rings'].values())}"
            )


# --------------------------------------------------------------------- echo

#: Issue 6's goal for UDP echo over ILNP through the daemon on the two-node bench.
TARGET_PPS = 100_000


def _log(message: str) -> None:
    print(f"  [echo] {message}", file=sys.stderr)


def _fast_path_status(status: dict[str, Any]) -> dict[str, Any]:
    """The parts of a daemon's status that describe a fast path (none before it exists)."""
    return {k: v for k, v in status.items() if "fast" in k.lower()}


def run_echo(args: argparse.Namespace) -> None:
    # Imported here: ``ilcc`` must run without root, gcc or nft.
    from dataclasses import asdict  # noqa: PLC0415

    from sixlab.bench import generator_ceiling, prepare_bench, search_pdr  # noqa: PLC0415
    from sixlab.bench.ilnp_echo import (  # noqa: PLC0415
        IlnpEchoSut,
        IlnpEchoTrialRunner,
        preflight,
    )
    from sixlab.testbed import two_node_bench  # noqa: PLC0415

    with two_node_bench() as tb:
        prepare_bench(tb, gen_cpu=0, sut_cpu=1, gen_rps=args.gen_rps == "on")
        runner = IlnpEchoTrialRunner(tb, tick_us=args.tick_us, payload_size=args.payload)
        ceiling = generator_ceiling(runner)
        print(f"generator ceiling: {ceiling:,.0f} frames/s offered (nothing answering)",
              flush=True)  # fmt: skip
        with IlnpEchoSut(tb, policy=args.policy, fastpath=args.fastpath, cpu=1) as sut:
            first = preflight(runner, sut)
            print("preflight: 1 echo request offered, 1 echo counted", flush=True)
            started = time.monotonic()
            result = search_pdr(
                runner.trial,
                min_rate=args.min_rate,
                max_rate=args.max_rate or ceiling,
                loss_ratio=args.loss,
                precision=args.precision,
                trial_seconds=args.trial,
                final_seconds=args.final,
                method=args.method,
                timeout_s=args.timeout,
                log=_log,
            )
            search_s = time.monotonic() - started
            status = sut.status()
            kernel = sut.kernel_counters()
            daemon_argv = sut.daemon_argv
            fastpath_passed = sut.fastpath_passed
        echo = sut.echo or {}
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rings = status.get("rings", {})
    ring_drops = sum(int(r.get("drops", 0)) for r in rings.values())
    lat = status.get("latency_us", {})
    fast = _fast_path_status(status)
    fastpath = args.fastpath if fastpath_passed else "off (daemon has no --fastpath)"
    print(f"\nUDP echo over ILNPv6 through `sixlab ilnp host` (policy {args.policy}, "
          f"fastpath {fastpath}); PDR at {args.loss:.1%} loss, {args.method}, {stamp}; "
          f"generator CPU 0, daemon + udpecho CPU 1, echoes received on CPU "
          f"{0 if args.gen_rps == 'on' else 1}; {args.payload}-byte payload")  # fmt: skip
    rows = [
        ("generator ceiling (frames/s)", f"{ceiling:,.0f}"),
        ("PDR (echoes/s)", f"{result.pdr:,.0f}"),
        ("PDR / ceiling", f"{result.pdr / ceiling:.1%}" if ceiling else "-"),
        (f"issue 6 target {TARGET_PPS:,}/s", "met" if result.pdr >= TARGET_PPS else "not met"),
        ("trials (search time)", f"{len(result.trials)} ({search_s:.0f} s)"),
    ]
    for name, value in rows:
        print(f"{name:32} {value:>16}")
    print(f"daemon counters: {_items(status.get('counters', {}))}")
    print(f"daemon drops: {_items(status.get('drops', {})) or '-'}")
    print(f"daemon wire: {_items(status.get('wire', {}))}; ring drops {ring_drops}")
    print(f"daemon ring->TUN latency: p50 {lat.get('p50')} us, p99 {lat.get('p99')} us "
          f"(last {lat.get('samples')} packets)")  # fmt: skip
    print(f"daemon fast path: {json.dumps(fast) if fast else 'none reported'}")
    print(f"udpecho: {_items(echo)}")
    print(f"SUT kernel: {_items(kernel)}")
    if args.json is not None:
        document = {
            "date": stamp,
            "args": sys.argv[1:],
            "daemon_argv": daemon_argv[1:],
            "gen_rps": args.gen_rps,
            "ceiling": ceiling,
            "pdr": result.pdr,
            "preflight": asdict(first),
            "trials": [asdict(t) for t in result.trials],
            "daemon_status": status,
            "udpecho": echo,
            "sut_kernel": kernel,
        }
        args.json.write_text(json.dumps(document, indent=1))


def _items(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="part", required=True)
    ilcc = sub.add_parser("ilcc")
    ilcc.add_argument("--sizes", default="10,1000000")
    ilcc.add_argument("--lookups", type=int, default=200_000)
    ilcc.add_argument("--packets", type=int, default=50_000)
    ilcc.add_argument("--repeat", type=int, default=5)
    timers = sub.add_parser("timers")
    timers.add_argument("--sizes", default="10,1000000")
    timers.add_argument("--repeat", type=int, default=5)
    study = sub.add_parser("study", help="the ILNP paper's ILCC study, per configuration")
    study.add_argument("--configs", default="st-andrews,socket,sixlab")
    study.add_argument("--ranks", default="0-10", help="test ranks: 0-10 or 0,5,10")
    study.add_argument("--seconds", type=float, default=SEED_SECONDS,
                       help="per test (ILNP paper: 60)")  # fmt: skip
    study.add_argument("--base-rate", type=float, default=SEED_BASE_RATE, help="echo flow, /s")
    study.add_argument("--per-process", type=float, default=SEED_PER_PROCESS_RATE,
                       help="crowd per rank, /s")  # fmt: skip
    study.add_argument("--repeat", type=int, default=1, help="repetitions (ILNP paper: 10)")
    study.add_argument("--payload", type=int, default=64, help="UDP payload bytes (>= 6)")
    study.add_argument("--out", type=Path, help="directory for study.json and study.png")
    study.add_argument(
        "--crowd-route",
        choices=["via-generator", "on-link"],
        default="via-generator",
        help="on-link: no route via the generator, each crowd answer needs Neighbour "
        "Discovery that nobody answers (shows the send-buffer starvation, tx err)",
    )
    cpucheck = sub.add_parser("cpucheck", help="CPU busy share: tick-sampled vs idle-based")
    cpucheck.add_argument("--cpu", type=int, default=1)
    cpucheck.add_argument("--seconds", type=float, default=5.0)
    cpucheck.add_argument("--burst-us", type=float, default=30.0)
    cpucheck.add_argument("--gap-us", type=float, default=700.0)
    memlat = sub.add_parser("memlat")
    memlat.add_argument("--mib", default="1,8,16,32,128")
    memlat.add_argument("--lookups", type=int, default=200_000)
    memlat.add_argument("--repeat", type=int, default=5)
    daemon = sub.add_parser("daemon")
    daemon.add_argument("--seconds", type=float, default=5.0)
    daemon.add_argument("--window", type=int, default=32)
    echo = sub.add_parser("echo", help="PDR of UDP echo over ILNP through the daemon")
    echo.add_argument("--policy", choices=["none", "socket", "bounded"], default="none")
    echo.add_argument(
        "--fastpath",
        choices=["auto", "on", "off"],
        default="off",
        help="passed to `sixlab ilnp host --fastpath` (when the daemon has it)",
    )
    echo.add_argument("--method", choices=["mlrsearch", "bisect"], default="mlrsearch")
    echo.add_argument("--loss", type=float, default=0.005, help="PDR loss ratio")
    echo.add_argument("--precision", type=float, default=0.02, help="relative width")
    echo.add_argument("--trial", type=float, default=1.0, help="initial trial seconds")
    echo.add_argument("--final", type=float, default=2.0, help="final trial seconds")
    echo.add_argument("--min-rate", type=float, default=200.0)
    echo.add_argument("--max-rate", type=float, default=0.0, help="0: generator ceiling")
    echo.add_argument("--tick-us", type=float, default=100.0, help="generator send interval")
    echo.add_argument("--payload", type=int, default=64, help="UDP payload bytes (>= 6)")
    echo.add_argument(
        "--gen-rps",
        choices=["on", "off"],
        default="off",
        help="RPS of the echoes to the generator's CPU; off (default): received and "
        "counted on the SUT's CPU, without an IPI per echo (sixlab.bench.generator)",
    )
    echo.add_argument("--timeout", type=float, default=420.0, help="search limit, seconds")
    echo.add_argument("--json", type=Path, help="write every trial and the status here")
    args = parser.parse_args()
    if args.part == "ilcc":
        run_ilcc(args)
    elif args.part == "timers":
        run_timers(args)
    elif args.part == "echo":
        run_echo(args)
    elif args.part == "memlat":
        run_memlat(args)
    elif args.part == "study":
        run_study(args)
    elif args.part == "cpucheck":
        run_cpucheck(args)
    else:
        if socket.has_ipv6 is False:
            raise SystemExit("IPv6 needed")
        run_daemon(args)


if __name__ == "__main__":
    main()
