"""Cost of building a Session-Reflector reply in pure Python (the sans-I/O hot path).

    python benchmarks/bench_reflector.py [--packets N] [--repeat R]

Feeds the same unauthenticated 44-byte Session-Sender packet to ``Reflector.reflect``
N times (stateless and stateful sessions, NTP and PTP) and reports the best of R runs
in ns per reply. The clock is a constant function so that only the reflector's own work
is measured; a real clock read (``time.time_ns``) is reported beside it for scale.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from sixlab.stamp.reflector import Reflector, ReflectorMode, ReflectorSessionConfig
from sixlab.wire import stamp as wire
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat, encode_timestamp

T_NS = 1_800_000_000_000_000_000


def _packet(fmt: TimestampFormat) -> bytes:
    ee = ErrorEstimate(fmt=fmt, scale=10, multiplier=1)
    return wire.encode_sender(wire.SenderPacket(7, encode_timestamp(T_NS, fmt), ee, 5))


def _per_packet_ns(run: Callable[[], None], n: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        run()
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n = args.packets

    def clock() -> int:
        return T_NS + 1000

    print(f"{'case':40} {'ns/reply':>10}")
    for mode in ReflectorMode:
        for fmt in TimestampFormat:
            reflector = Reflector()
            reflector.add_session(ReflectorSessionConfig(ssid=5, mode=mode, fmt=fmt))
            data = _packet(fmt)
            reflect = reflector.reflect

            def run(reflect: Callable[..., object] = reflect, data: bytes = data) -> None:
                for _ in range(n):
                    reflect(data, T_NS, clock, 64)

            cost = _per_packet_ns(run, n, args.repeat)
            print(f"{mode.value + ' ' + fmt.name:40} {cost:10.0f}")

    def clock_only() -> None:
        now = time.time_ns
        for _ in range(n):
            now()

    scale = _per_packet_ns(clock_only, n, args.repeat)
    print(f"{'time.time_ns() alone (for scale)':40} {scale:10.0f}")


if __name__ == "__main__":
    main()
