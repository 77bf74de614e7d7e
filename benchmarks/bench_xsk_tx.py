"""What one reply costs the ``afxdp`` plane to transmit in copy mode, by frames per kick.

    sudo .venv/bin/python benchmarks/bench_xsk_tx.py [--sizes 1,4,32,256,1024] [--frames 200000]

The two-node veth bench (``two_node_bench``, RPS as in the PDR benches: the generator's
receive work on CPU 0). A process pinned to CPU 1 in the SUT's namespace opens the
``afxdp`` plane on the SUT's veth and pushes the same 122-byte reply frame (Ethernet,
IPv6, an SRH of one segment, UDP, a 44-byte STAMP payload) through the plane's own
transmit path (``_frames``, ``_transmit``: the TX ring, then ``sendto`` until the kernel
has taken every descriptor, 32 per call in copy mode, then ``_reap``), ``size`` frames
per ``_transmit``, as a reflector batch of that size does. The generator's nftables
ingress rule counts and drops them. A device that refuses a frame (the veth peer's
input backlog full: ``sendto`` fails with EBUSY) ends that kick; the frames left in the
TX ring go with the next one, as in the plane. Reported per frame: the process's user and system
time (``os.times``), the ``sendto`` calls, and the rate, best of ``--repeat``. Nothing
is received: this is the transmit half of a reply alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from ipaddress import IPv6Address
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tx_main(args: argparse.Namespace) -> None:
    import numpy as np  # noqa: PLC0415

    from sixlab.bench.generator import GEN_PORT, STAMP_PORT  # noqa: PLC0415
    from sixlab.dataplane.afxdp_plane import FRAME_SIZE, AfXdpDataplane  # noqa: PLC0415
    from sixlab.dataplane.base import DataplaneConfig  # noqa: PLC0415
    from sixlab.wire.packet import build_udp_packet  # noqa: PLC0415

    plane = AfXdpDataplane(DataplaneConfig(port=STAMP_PORT, interface=args.interface))
    plane.open()
    try:
        gen, sut = IPv6Address(args.gen), IPv6Address(args.sut)
        payload = bytes(14) + (1).to_bytes(2, "big") + bytes(28)
        packet = build_udp_packet(sut, gen, STAMP_PORT, GEN_PORT, payload, segments=[gen])
        frame = bytes.fromhex(args.gen_mac) + bytes.fromhex(args.sut_mac) + b"\x86\xdd" + packet
        rows = []
        for size in (int(s) for s in args.sizes.split(",")):
            best = None
            for _ in range(args.repeat):
                plane._reap()
                kicks0 = plane.stats.kicks
                full0 = plane.stats.tx_full
                t0, w0 = os.times(), time.perf_counter()
                sent = 0
                while sent < args.frames:
                    addrs = plane._frames(size)
                    plane._umem_().frames[addrs // FRAME_SIZE, : len(frame)] = np.frombuffer(
                        frame, np.uint8
                    )
                    plane._transmit(addrs, len(frame))
                    sent += len(addrs)
                    plane._reap()
                t1, w1 = os.times(), time.perf_counter()
                row = {
                    "size": size,
                    "user_ns": (t1.user - t0.user) * 1e9 / sent,
                    "sys_ns": (t1.system - t0.system) * 1e9 / sent,
                    "kicks_per_frame": (plane.stats.kicks - kicks0) / sent,
                    "rate": sent / (w1 - w0),
                    "tx_full": plane.stats.tx_full - full0,
                }
                if (
                    best is None
                    or row["user_ns"] + row["sys_ns"] < best["user_ns"] + best["sys_ns"]
                ):
                    best = row
            rows.append(best)
        print(json.dumps({"rows": rows, "zero_copy": plane.zero_copy()}), flush=True)
    finally:
        plane.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,32,256,1024")
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--role", choices=["tx"], help=argparse.SUPPRESS)
    for name in ("interface", "gen", "sut", "gen-mac", "sut-mac"):
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "tx":
        _tx_main(args)
        return

    from sixlab.bench.generator import (  # noqa: PLC0415
        GEN_PORT,
        StampTrialRunner,
        interface_mac,
        prepare_bench,
    )
    from sixlab.testbed import two_node_bench  # noqa: PLC0415

    class SrhReplies(StampTrialRunner):
        def reply_matches(self, tag: int | None) -> list[str]:
            # IPv6 + an SRH of one segment: Next Header 43, the UDP destination port at
            # 40 + 24 + 2, the SSID at 40 + 24 + 8 + 14 (as bench_fastpath.py).
            match = f"@nh,48,8 43 @nh,528,16 {GEN_PORT}"
            return [match if tag is None else f"{match} @nh,688,16 {tag}"]

    with two_node_bench() as tb:
        prepare_bench(tb)
        runner = SrhReplies(tb)
        runner._arm(1)  # count and drop the frames (SSID 1) at the generator's ingress
        argv = [
            sys.executable, str(Path(__file__).resolve()), "--role", "tx",
            "--sizes", args.sizes, "--frames", str(args.frames), "--repeat", str(args.repeat),
            "--interface", tb.sut_if, "--gen", tb.gen_addr, "--sut", tb.sut_addr,
            "--gen-mac", interface_mac(tb, tb.gen, tb.gen_if).hex(),
            "--sut-mac", interface_mac(tb, tb.sut, tb.sut_if).hex(),
        ]  # fmt: skip
        proc = tb.run_pinned(tb.sut, argv, 1, cwd=ROOT, stdout=subprocess.PIPE)
        out, _ = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"transmit process failed ({proc.returncode})")
        doc = json.loads(out.splitlines()[-1])
        counted, _ = runner.counters()
    load = os.getloadavg()
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"afxdp transmit, copy mode={not doc['zero_copy']}, {stamp}, load average "
          f"{load[0]:.1f}; frames counted at the generator: {counted:,}")  # fmt: skip
    print(f"{'frames/kick':>11} {'user ns':>8} {'sys ns':>7} {'sendto/frame':>13} {'frames/s':>10}")
    for r in doc["rows"]:
        print(f"{r['size']:>11} {r['user_ns']:8,.0f} {r['sys_ns']:7,.0f} "
              f"{r['kicks_per_frame']:13.3f} {r['rate']:10,.0f}")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps({"date": stamp, "load": load, **doc}, indent=1))


if __name__ == "__main__":
    main()
