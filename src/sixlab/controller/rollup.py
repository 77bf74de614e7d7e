"""Per-minute rollups of STAMP results, mergeable, for storage kept longer than raw results.

Raw results are kept for a configurable retention; a rollup row per session, epoch and
minute (by T1) is kept longer. A row holds, for each direction (direct T2 − T1, return
T4 − T3, round trip), the count, exact minimum, maximum and sum (so the exact mean), the
nearest-rank p50 and p99 read from a histogram, and the histogram itself; plus the
packets lost in the minute, RFC 3393 IPDV sums for the mean jitter of each one-way
direction, and the largest error bound.

The histogram is logarithmic with relative accuracy ``ALPHA`` (the bucket scheme of
"DDSketch: A Fast and Fully-Mergeable Quantile Sketch with Relative-Error Guarantees",
Masson, Rim and Lee, VLDB 2019): a value ``v`` with ``|v| >= 1`` ns goes to bucket
``ceil(log_gamma |v|)`` with ``gamma = (1 + ALPHA) / (1 - ALPHA)``, signed (one-way
delays are negative when the clocks disagree); the value reported for a bucket is within
``ALPHA`` of every value in it. Histograms add bucket by bucket, so the rollups of many
minutes merge into exact counts, sums and extremes and percentiles within ``ALPHA``:
``stats`` over a month reads rollups, not a month of raw rows.

Loss per minute is counted from Seq gaps: a received record whose Seq is more than one
above the highest Seq rolled up before it in its epoch counts the Seqs in between as
lost, in the record's minute; a record that arrives below that highest Seq (reordered
past a rollup) takes one back. Packets lost after the last record received are counted
when a later one arrives. The agent's counters stay the authority for a session's
totals; rollups say in which minute the loss happened.

IPDV (RFC 3393 §4.1: consecutive Seqs that both arrived) is summed over pairs inside one
rollup pass; a pair split across two passes is not counted.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from sixlab.stamp import StampResult
from sixlab.stamp.stats import DelaySummary, PathStats

__all__ = [
    "ALPHA",
    "DIRECTIONS",
    "MINUTE_NS",
    "DelayHistogram",
    "DirectionRollup",
    "MinuteRollup",
    "merged_stats",
    "roll_up",
]

#: The histogram's relative accuracy: a percentile read from it is within 1 % of a
#: value that was measured.
ALPHA = 0.01
_GAMMA = (1 + ALPHA) / (1 - ALPHA)
_LN_GAMMA = math.log(_GAMMA)
MINUTE_NS = 60_000_000_000
#: Directions of a rollup, in the order of the store's columns.
DIRECTIONS = ("direct", "return", "rtt")


def _bucket(value: int) -> int:
    """The signed bucket key of a delay in ns (0: |v| < 1 ns)."""
    if value == 0:
        return 0
    magnitude = math.ceil(math.log(abs(value)) / _LN_GAMMA) + 1
    return magnitude if value > 0 else -magnitude


def _representative(key: int) -> int:
    """The value a bucket stands for (within ALPHA of all of its values)."""
    if key == 0:
        return 0
    upper = _GAMMA ** (abs(key) - 1)
    value = round(2 * upper / (_GAMMA + 1))
    return value if key > 0 else -value


@dataclass
class DelayHistogram:
    """Counts by signed logarithmic bucket; adds bucket by bucket."""

    counts: dict[int, int] = field(default_factory=dict)

    def add(self, value: int) -> None:
        key = _bucket(value)
        self.counts[key] = self.counts.get(key, 0) + 1

    def merge(self, other: DelayHistogram) -> None:
        for key, n in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + n

    @property
    def count(self) -> int:
        return sum(self.counts.values())

    def percentile(self, p: float) -> int:
        """Nearest rank: the bucket holding the ceil(p/100 · n)-th smallest value."""
        n = self.count
        if not n:
            raise ValueError("percentile of an empty histogram")
        rank = max(1, -(-int(p * n * 1000) // 100_000))
        seen = 0
        for key in sorted(self.counts):  # ascending keys are ascending values
            seen += self.counts[key]
            if seen >= rank:
                return _representative(key)
        raise AssertionError("rank beyond the count")

    def to_bytes(self) -> bytes:
        """Sorted buckets as zigzag varints: key delta, count (a few bytes per bucket)."""
        out = bytearray()
        previous = 0
        for key in sorted(self.counts):
            _varint(out, _zigzag(key - previous))
            _varint(out, self.counts[key])
            previous = key
        return bytes(out)

    @classmethod
    def from_bytes(cls, data: bytes) -> DelayHistogram:
        values = _read_varints(data)
        counts: dict[int, int] = {}
        key = 0
        for delta, n in itertools.zip_longest(values, values, fillvalue=None):
            if delta is None or n is None:
                raise ValueError("histogram: odd number of varints")
            key += _unzigzag(delta)
            counts[key] = n
        return cls(counts)


def _zigzag(v: int) -> int:
    return v * 2 if v >= 0 else -v * 2 - 1


def _unzigzag(v: int) -> int:
    return v // 2 if v % 2 == 0 else -(v + 1) // 2


def _varint(out: bytearray, v: int) -> None:
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _read_varints(data: bytes) -> Iterator[int]:
    v = shift = 0
    for byte in data:
        v |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            continue
        yield v
        v = shift = 0
    if shift:
        raise ValueError("histogram: truncated varint")


@dataclass
class DirectionRollup:
    """One direction's delays in one rollup: exact count, min, max, sum; histogram."""

    count: int = 0
    min_ns: int = 0
    max_ns: int = 0
    sum_ns: int = 0
    hist: DelayHistogram = field(default_factory=DelayHistogram)

    def add(self, value: int) -> None:
        if not self.count:
            self.min_ns = self.max_ns = value
        else:
            self.min_ns = min(self.min_ns, value)
            self.max_ns = max(self.max_ns, value)
        self.count += 1
        self.sum_ns += value
        self.hist.add(value)

    def merge(self, other: DirectionRollup) -> None:
        if not other.count:
            return
        if not self.count:
            self.min_ns, self.max_ns = other.min_ns, other.max_ns
        else:
            self.min_ns = min(self.min_ns, other.min_ns)
            self.max_ns = max(self.max_ns, other.max_ns)
        self.count += other.count
        self.sum_ns += other.sum_ns
        self.hist.merge(other.hist)

    def percentile(self, p: float) -> int:
        """From the histogram, kept inside the exact extremes."""
        return min(max(self.hist.percentile(p), self.min_ns), self.max_ns)

    def summary(self) -> DelaySummary | None:
        if not self.count:
            return None
        return DelaySummary(
            count=self.count,
            min_ns=self.min_ns,
            mean_ns=round(self.sum_ns / self.count),
            p50_ns=self.percentile(50),
            p90_ns=self.percentile(90),
            p99_ns=self.percentile(99),
            max_ns=self.max_ns,
        )


@dataclass
class MinuteRollup:
    """Everything stored for one session, epoch and minute of T1."""

    minute_ns: int
    count: int = 0
    lost: int = 0
    directions: dict[str, DirectionRollup] = field(
        default_factory=lambda: {d: DirectionRollup() for d in DIRECTIONS}
    )
    #: RFC 3393 IPDV: sum of |IPDV| and number of pairs, per one-way direction.
    ipdv_sum_abs: dict[str, int] = field(default_factory=lambda: {"direct": 0, "return": 0})
    ipdv_pairs: dict[str, int] = field(default_factory=lambda: {"direct": 0, "return": 0})
    max_error_ns: int | None = None
    #: The highest agent record id rolled into this minute (the raw rows' deletion bound).
    last_record: int = 0

    def add(self, record_id: int, r: StampResult) -> None:
        self.count += 1
        self.directions["direct"].add(r.direct_ns)
        self.directions["return"].add(r.return_ns)
        self.directions["rtt"].add(r.rtt_ns)
        bound = r.error_bound_ns
        self.max_error_ns = bound if self.max_error_ns is None else max(self.max_error_ns, bound)
        self.last_record = max(self.last_record, record_id)

    def merge(self, other: MinuteRollup) -> None:
        self.count += other.count
        self.lost += other.lost
        for d in DIRECTIONS:
            self.directions[d].merge(other.directions[d])
        for d in ("direct", "return"):
            self.ipdv_sum_abs[d] += other.ipdv_sum_abs[d]
            self.ipdv_pairs[d] += other.ipdv_pairs[d]
        if other.max_error_ns is not None:
            self.max_error_ns = (
                other.max_error_ns
                if self.max_error_ns is None
                else max(self.max_error_ns, other.max_error_ns)
            )
        self.last_record = max(self.last_record, other.last_record)


def roll_up(
    records: Iterable[tuple[int, StampResult]], highest_seq: int | None
) -> tuple[dict[int, MinuteRollup], int | None]:
    """Roll up one epoch's records (agent record id, result) not rolled up before.

    ``highest_seq`` is the highest Seq rolled up earlier in the epoch (None: none yet,
    so the Seqs from 0 up to the first one received were lost). Returns the rollups by
    minute start (ns) and the new highest Seq.
    """
    out: dict[int, MinuteRollup] = {}
    by_seq = sorted(records, key=lambda rec: rec[1].seq)
    top = -1 if highest_seq is None else highest_seq
    for rid, r in by_seq:
        minute = r.t1_ns - r.t1_ns % MINUTE_NS
        m = out.get(minute)
        if m is None:
            m = out[minute] = MinuteRollup(minute)
        m.add(rid, r)
        if r.seq > top:
            m.lost += r.seq - top - 1
            top = r.seq
        else:
            m.lost -= 1  # counted in a gap before it arrived
    for a, b in itertools.pairwise(by_seq):
        if b[1].seq == a[1].seq + 1:
            m = out[b[1].t1_ns - b[1].t1_ns % MINUTE_NS]
            for d, delay in (("direct", "direct_ns"), ("return", "return_ns")):
                m.ipdv_sum_abs[d] += abs(getattr(b[1], delay) - getattr(a[1], delay))
                m.ipdv_pairs[d] += 1
    return out, (None if top < 0 else top)


def merged_stats(minutes: Sequence[MinuteRollup], *, lost: int | None = None) -> PathStats:
    """``PathStats`` of many rollups merged (percentiles within ALPHA; the rest exact).

    ``lost`` replaces the rollups' own loss count (the agent's counters, for a session's
    whole life).
    """
    total = MinuteRollup(0)
    for m in minutes:
        total.merge(m)

    def jitter(d: str) -> int | None:
        n = total.ipdv_pairs[d]
        return round(total.ipdv_sum_abs[d] / n) if n else None

    return PathStats(
        direct=total.directions["direct"].summary(),
        backward=total.directions["return"].summary(),
        rtt=total.directions["rtt"].summary(),
        direct_jitter_ns=jitter("direct"),
        return_jitter_ns=jitter("return"),
        received=total.count,
        lost=max(0, total.lost) if lost is None else lost,
        max_error_bound_ns=total.max_error_ns,
    )
