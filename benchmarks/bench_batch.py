"""Cost of the batch reflector per reply, by batch size, next to the per-packet reference.

    python benchmarks/bench_batch.py [--sizes 1,16,64,256,1024] [--repeat 5]

``BatchReflector.reflect`` + ``set_t3`` on a batch of identical unauthenticated 44-byte
Session-Sender packets (a default stateless session, NTP), and ``Reflector.reflect``
called once per packet on the same packets; the clock is a constant. Reported: the best
of R runs, ns per reply. The batch figure is the NumPy share of the ``afxdp`` plane's
per-packet cost; the plane adds the frame classification, the checksums and the ring
work around it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sixlab.stamp.batch import BatchReflector
from sixlab.stamp.reflector import Reflection, Reflector, ReflectorMode, ReflectorSessionConfig
from sixlab.wire import stamp as wire
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat, encode_timestamp

T_NS = 1_800_000_000_000_000_000


def _clock() -> int:
    return T_NS


def _reflector(mode: ReflectorMode) -> Reflector:
    return Reflector(ReflectorSessionConfig(None, mode=mode))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,16,64,256,1024")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--packets", type=int, default=100_000)
    args = parser.parse_args()
    ee = ErrorEstimate(fmt=TimestampFormat.NTP, scale=10, multiplier=1)
    probe = wire.encode_sender(
        wire.SenderPacket(7, encode_timestamp(T_NS, TimestampFormat.NTP), ee, 5)
    )

    def fallback(i: int) -> Reflection | None:
        raise AssertionError(i)

    print(f"{'mode':9} {'batch':>6} {'ns/reply batch':>15} {'ns/reply reference':>19}")
    for mode in (ReflectorMode.STATELESS, ReflectorMode.STATEFUL):
        ref = _reflector(mode)
        best_ref = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter_ns()
            for _ in range(args.packets):
                ref.reflect(probe, T_NS, _clock, 64)
            best_ref = min(best_ref, (time.perf_counter_ns() - t0) / args.packets)
        for size in (int(s) for s in args.sizes.split(",")):
            batch = BatchReflector(_reflector(mode))
            payloads = np.frombuffer(probe * size, np.uint8).reshape(size, -1)
            t2 = np.full(size, T_NS, np.int64)
            hops = np.full(size, 64, np.uint8)
            rounds = max(1, args.packets // size)
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.perf_counter_ns()
                for _ in range(rounds):
                    batch.reflect(payloads, t2, hops, fallback).set_t3(T_NS)
                best = min(best, (time.perf_counter_ns() - t0) / (rounds * size))
            print(f"{mode.value:9} {size:6} {best:15,.0f} {best_ref:19,.0f}")


if __name__ == "__main__":
    main()
