"""Delay maths over STAMP result records (RFC 8762 §4, RFC 3393, RFC 7679/7680).

- Direct (forward) delay T2 − T1, return delay T4 − T3, round trip (T4 − T1) − (T3 − T2):
  properties of ``StampResult``.
- ``summarize`` gives min / mean / percentiles / max of a series in integer nanoseconds.
  Percentiles use the nearest-rank method (the smallest value with at least p% of the
  sample at or below it), so every reported figure is a value that was measured.
- Jitter is IPDV as RFC 3393 defines it: for each pair of packets with consecutive
  sequence numbers that both arrived (the §4.1 selection function), the difference of
  their one-way delays. ``PathStats.direct_jitter_ns`` and ``return_jitter_ns`` are the
  mean absolute IPDV of each direction.
- Loss is the ratio of packets declared lost to packets whose fate is known.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from sixlab.stamp._events import StampResult

__all__ = ["DelaySummary", "PathStats", "ipdv", "path_stats", "percentile", "summarize"]


@dataclass(frozen=True, slots=True)
class DelaySummary:
    count: int
    min_ns: int
    mean_ns: int
    p50_ns: int
    p90_ns: int
    p99_ns: int
    max_ns: int

    def as_ms(self) -> dict[str, float]:
        return {
            "min": self.min_ns / 1e6,
            "mean": self.mean_ns / 1e6,
            "p50": self.p50_ns / 1e6,
            "p90": self.p90_ns / 1e6,
            "p99": self.p99_ns / 1e6,
            "max": self.max_ns / 1e6,
        }


def percentile(sorted_values: Sequence[int], p: float) -> int:
    """Nearest-rank percentile of an ascending, non-empty sequence (0 < p <= 100)."""
    if not sorted_values:
        raise ValueError("percentile of an empty sample")
    if not 0 < p <= 100:
        raise ValueError(f"percentile {p} is not in (0, 100]")
    n = len(sorted_values)
    rank = -(-int(p * n * 1000) // 100_000)  # ceil(p/100 * n), exact for p to 0.001
    return sorted_values[max(rank, 1) - 1]


def summarize(values: Iterable[int]) -> DelaySummary | None:
    """Summary of a series of delays in ns, or None for an empty one."""
    data = sorted(values)
    if not data:
        return None
    n = len(data)
    return DelaySummary(
        count=n,
        min_ns=data[0],
        mean_ns=round(sum(data) / n),
        p50_ns=percentile(data, 50),
        p90_ns=percentile(data, 90),
        p99_ns=percentile(data, 99),
        max_ns=data[-1],
    )


def ipdv(
    records: Iterable[StampResult], delay: Callable[[StampResult], int] = lambda r: r.direct_ns
) -> list[int]:
    """RFC 3393 IPDV of each consecutive-sequence pair that both arrived, in Seq order."""
    by_seq = sorted(records, key=lambda r: r.seq)
    return [delay(b) - delay(a) for a, b in itertools.pairwise(by_seq) if b.seq == a.seq + 1]


@dataclass(frozen=True, slots=True)
class PathStats:
    """Everything a user asks of one path: delays each way, round trip, jitter, loss."""

    direct: DelaySummary | None
    backward: DelaySummary | None
    rtt: DelaySummary | None
    direct_jitter_ns: int | None
    return_jitter_ns: int | None
    received: int
    lost: int
    max_error_bound_ns: int | None

    @property
    def loss_ratio(self) -> float:
        total = self.received + self.lost
        return self.lost / total if total else 0.0


def path_stats(records: Sequence[StampResult], lost: int = 0) -> PathStats:
    """Statistics of one path. Loopback records (docs/srpm.md) have no one-way delays:
    they count in the round trip and in its jitter (``direct_jitter_ns``, the mean
    |IPDV| of T4 − T1), never in ``direct`` or ``backward``."""

    def mean_abs(values: list[int]) -> int | None:
        return round(sum(map(abs, values)) / len(values)) if values else None

    two_way = [r for r in records if not r.loopback]
    looped = [r for r in records if r.loopback]
    direct_jitter = mean_abs(ipdv(two_way))
    if not two_way and looped:
        direct_jitter = mean_abs(ipdv(looped, lambda r: r.rtt_ns))
    return PathStats(
        direct=summarize(r.direct_ns for r in two_way),
        backward=summarize(r.return_ns for r in two_way),
        rtt=summarize(r.rtt_ns for r in records),
        direct_jitter_ns=direct_jitter,
        return_jitter_ns=mean_abs(ipdv(two_way, lambda r: r.return_ns)),
        received=len(records),
        lost=lost,
        max_error_bound_ns=max((r.error_bound_ns for r in records), default=None),
    )
