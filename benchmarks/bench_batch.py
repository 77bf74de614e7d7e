"""Cost of the batch paths per packet, by batch size, next to the per-packet references.

    python benchmarks/bench_batch.py [--sizes 1,16,64,256,1024] [--repeat 5]

``BatchReflector.reflect`` + ``set_t3`` on a batch of identical unauthenticated 44-byte
Session-Sender packets (a default stateless session, NTP), and ``Reflector.reflect``
called once per packet on the same packets; the clock is a constant. Reported: the best
of R runs, ns per reply. The batch figure is the NumPy share of the ``afxdp`` plane's
per-packet cost; the plane adds the frame classification, the checksums and the ring
work around it.

Sender side: ``receive_batch`` against ``SenderSession.receive`` on the replies to a
session's probes (each matched once: a result per reply), ns per reply.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sixlab.stamp.batch import BatchReflector, receive_batch
from sixlab.stamp.reflector import Reflection, Reflector, ReflectorMode, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig, SenderSession
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
    sender_main([int(x) for x in args.sizes.split(",")], args.packets)


def _sender(count: int) -> tuple[SenderSession, list[bytes]]:
    session = SenderSession(SenderConfig(ssid=5, interval_ns=1000, count=count))
    session.start(T_NS)
    for i in range(1, count):  # one probe per timer, as the engine drives it
        session.handle_timer(T_NS + i * 1000)
    reflector = Reflector(ReflectorSessionConfig(None))
    replies = []
    for probe in session.datagrams_to_send():
        out = reflector.reflect(probe, T_NS + 10**6, _clock, 64)
        assert out is not None
        replies.append(out.payload)
    while session.next_event() is not None:
        pass
    return session, replies


def sender_main(sizes: list[int], count: int) -> None:
    print(f"{'sender':9} {'batch':>6} {'ns/reply batch':>15} {'ns/reply reference':>19}")
    ref, replies = _sender(count)
    t4 = T_NS + 2 * 10**6
    t0 = time.perf_counter_ns()
    for data in replies:
        ref.receive(data, t4)
    per_ref = (time.perf_counter_ns() - t0) / count
    for size in sizes:
        session, replies = _sender(count)
        arr = np.frombuffer(b"".join(replies), np.uint8).reshape(count, -1)
        t4s = np.full(count, t4, np.int64)
        t0 = time.perf_counter_ns()
        for lo in range(0, count, size):
            receive_batch(session, arr[lo : lo + size], t4s[lo : lo + size])
        per = (time.perf_counter_ns() - t0) / count
        assert session.counters.received == count
        print(f"{'':9} {size:6} {per:15,.0f} {per_ref:19,.0f}")


if __name__ == "__main__":
    main()
