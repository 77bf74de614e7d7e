"""Reflector throughput of the data planes side by side (MRR-style: offered load vs replies).

For each plane, in one run on one bench testbed (``two_node_bench``): a reflector process
with that plane in the SUT namespace pinned to CPU 1, and a generator in the generator
namespace pinned to CPU 0 that sends unauthenticated STAMP probes on a kernel UDP socket
at a fixed offered rate for a few seconds and counts the replies. Reported: offered and
achieved send rate, replies per second, and each plane's rate relative to ``mmap``.
Absolute numbers drift on shared machines (docs/design-notes.md): compare the ratios.

    sudo .venv/bin/python benchmarks/bench_dataplanes.py [--rate 20000] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORT = 862
GEN_PORT = 40862


def _reflector(plane: str, interface: str) -> None:
    from sixlab.dataplane.base import DataplaneConfig, create  # noqa: PLC0415
    from sixlab.dataplane.engine import ReflectorEngine  # noqa: PLC0415
    from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig  # noqa: PLC0415

    dp = create(plane, DataplaneConfig(port=PORT, interface=interface))
    dp.open()
    engine = ReflectorEngine(dp, Reflector(ReflectorSessionConfig(None)))
    engine.start()
    print("ready", flush=True)
    sys.stdin.read()
    engine.shutdown()
    dp.close()
    print(json.dumps({"received": engine.counters.received}), flush=True)


def _generator(target: str, rate: int, seconds: float) -> None:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.bind(("::", GEN_PORT))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.setblocking(False)
    probe = bytes(12) + b"\x00\x01" + bytes(30)  # Multiplier 1: a valid Error Estimate
    addr = (target, PORT)
    sent = replies = 0
    start = time.monotonic()
    end = start + seconds
    burst = max(1, rate // 1000)  # send in 1 ms bursts
    next_burst = start
    while (now := time.monotonic()) < end:
        if now >= next_burst:
            for _ in range(burst):
                try:
                    sock.sendto(probe, addr)
                    sent += 1
                except BlockingIOError:
                    break
            next_burst += burst / rate
        try:
            while True:
                sock.recv(2048)
                replies += 1
        except BlockingIOError:
            pass
    elapsed = time.monotonic() - start
    drain_end = time.monotonic() + 0.5  # late replies of the last bursts
    while time.monotonic() < drain_end:
        if select.select([sock], [], [], 0.05)[0]:
            try:
                while True:
                    sock.recv(2048)
                    replies += 1
            except BlockingIOError:
                pass
    print(json.dumps({"sent": sent, "replies": replies, "elapsed": elapsed}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=20000, help="offered probes/s")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--planes", default="scapy,mmap,socket")
    parser.add_argument("--role", choices=["reflector", "generator"], help=argparse.SUPPRESS)
    parser.add_argument("--plane", help=argparse.SUPPRESS)
    parser.add_argument("--interface", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "reflector":
        _reflector(args.plane, args.interface)
        return
    if args.role == "generator":
        _generator(args.target, args.rate, args.seconds)
        return

    from sixlab.testbed import two_node_bench  # noqa: PLC0415

    me = [sys.executable, str(Path(__file__).resolve())]
    rows = []
    with two_node_bench() as tb:
        for plane in args.planes.split(","):
            refl = tb.run_pinned(
                tb.sut, [*me, "--role", "reflector", "--plane", plane, "--interface", tb.sut_if],
                1, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            )  # fmt: skip
            assert refl.stdout is not None
            if refl.stdout.readline().strip() != b"ready":
                raise SystemExit(f"{plane}: reflector did not start")
            gen = tb.run_pinned(
                tb.gen,
                [*me, "--role", "generator", "--target", tb.sut_addr,
                 "--rate", str(args.rate), "--seconds", str(args.seconds)],
                0, cwd=ROOT, stdout=subprocess.PIPE,
            )  # fmt: skip
            out, _ = gen.communicate(timeout=args.seconds + 60)
            result = json.loads(out.splitlines()[-1])
            refl_out, _ = refl.communicate(timeout=30)
            result["reflector_received"] = json.loads(refl_out.splitlines()[-1])["received"]
            result["plane"] = plane
            rows.append(result)
    base = next((r for r in rows if r["plane"] == "mmap"), rows[0])
    base_rate = base["replies"] / base["elapsed"] or 1.0
    print(json.dumps(rows))
    print(f"offered {args.rate} probes/s for {args.seconds} s; generator CPU 0, reflector CPU 1")
    print(f"{'plane':8} {'sent/s':>10} {'replies/s':>10} {'loss %':>7} {'vs mmap':>8}")
    for r in rows:
        rate = r["replies"] / r["elapsed"]
        loss = 100.0 * (1 - r["replies"] / r["sent"]) if r["sent"] else 0.0
        print(
            f"{r['plane']:8} {r['sent'] / r['elapsed']:10.0f} {rate:10.0f} {loss:7.2f} "
            f"{rate / base_rate:8.3f}"
        )


if __name__ == "__main__":
    main()
