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

Stored rows hold signed 64-bit integers (both stores' columns). A value of a row that
does not fit is stored saturated at the column's limit (``saturate``), which then reads
"at least this" (or "at most" at the negative limit): an error bound can claim up to
2 × 255 × 2^31 s (a Multiplier of 255 at Scale 63, RFC 4656 §4.1.2, in each of the two
Error Estimates of RFC 8762 §4.1.1), past 2^63 ns from Scale 57 on, which means an
unknown, unbounded error; delays, their sums and IPDVs leave the range only with
timestamps decades apart (clocks that are not set). A mean computed from a saturated
sum is likewise a bound, not the mean.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from sixlab.stamp import StampResult
from sixlab.stamp.stats import DelaySummary, PathStats
from sixlab.wire.timestamp import ErrorEstimate

__all__ = [
    "ALPHA",
    "DIRECTIONS",
    "I64_MAX",
    "I64_MIN",
    "MINUTE_NS",
    "ROW_COLUMNS",
    "DelayHistogram",
    "DirectionRollup",
    "Fold",
    "MinuteRollup",
    "fold_columns",
    "merged_stats",
    "roll_up",
    "roll_up_columns",
    "saturate",
]

#: The histogram's relative accuracy: a percentile read from it is within 1 % of a
#: value that was measured.
ALPHA = 0.01
_GAMMA = (1 + ALPHA) / (1 - ALPHA)
_LN_GAMMA = math.log(_GAMMA)
MINUTE_NS = 60_000_000_000
#: Directions of a rollup, in the order of the store's columns.
DIRECTIONS = ("direct", "return", "rtt")
#: The columns of a stored rollup (the store's ``rollups`` table), in order: what
#: ``Fold.rows`` gives.
ROW_COLUMNS = (
    "session_id", "epoch", "minute_ns", "count", "lost",
    *(f"{d}_{k}" for d in DIRECTIONS for k in ("min", "mean", "p50", "p99", "max", "sum", "hist")),
    "direct_ipdv_abs", "direct_ipdv_pairs", "return_ipdv_abs", "return_ipdv_pairs",
    "max_error_ns", "last_record",
)  # fmt: skip


#: The limits of a stored integer (SQLite INTEGER, PostgreSQL BIGINT).
I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def saturate(value: int) -> int:
    """``value`` inside the signed 64-bit range, at its limit if beyond: what a stored
    row holds of it ("at least"/"at most" at a limit; module docstring)."""
    return I64_MIN if value < I64_MIN else I64_MAX if value > I64_MAX else value


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


#: Rows a vectorized pass folds with int64 sums: delays (and IPDVs, twice as large) this
#: far below 2^63 ÷ rows cannot overflow; larger ones go through ``roll_up``.
_INT64_SAFE = 2**62


def roll_up_columns(
    columns: Sequence[Sequence[int]], highest_seq: Mapping[tuple[int, int], int | None]
) -> tuple[dict[tuple[int, int, int], MinuteRollup], dict[tuple[int, int], int | None]]:
    """``roll_up`` of many epochs at once, from the stored columns, with NumPy.

    ``columns`` are ten: session, epoch, record id, Seq, T1, T2, T3, T4, and the sender's
    and the reflector's Error Estimates as 16-bit ints (RFC 8762 §4.1.1), the rows of
    any number of (session, epoch) groups, each group's rows together and in record id
    order (the order ``roll_up`` is given them). ``highest_seq`` holds each group's
    highest Seq rolled up before (as for ``roll_up``; absent: None). Returns the
    rollups by (session, epoch, minute) and each group's new highest Seq: exactly what
    ``roll_up`` returns for each group.
    """
    fold = fold_columns(columns, highest_seq)
    if fold is None:
        return _roll_up_each(columns, highest_seq)
    return fold.minutes(), fold.tops


def _roll_up_each(
    columns: Sequence[Sequence[int]], highest_seq: Mapping[tuple[int, int], int | None]
) -> tuple[dict[tuple[int, int, int], MinuteRollup], dict[tuple[int, int], int | None]]:
    """``roll_up_columns`` by ``roll_up`` (values too large for int64 sums), on Python
    ints: columns given as NumPy arrays would make each delay, sum and error bound an
    int64 that wraps around."""
    ints = [c.tolist() if isinstance(c, np.ndarray) else c for c in columns]
    groups: dict[tuple[int, int], list[tuple[int, StampResult]]] = {}
    for sid, ep, rid, seq, t1, t2, t3, t4, se, re in zip(*ints, strict=True):
        r = StampResult(0, seq, t1, t2, t3, t4, ErrorEstimate.from_int(se),
                        ErrorEstimate.from_int(re), 0, 0)  # fmt: skip
        groups.setdefault((sid, ep), []).append((rid, r))
    out: dict[tuple[int, int, int], MinuteRollup] = {}
    tops: dict[tuple[int, int], int | None] = {}
    for (s, e), recs in groups.items():
        minutes, tops[s, e] = roll_up(recs, highest_seq.get((s, e)))
        for minute, m in minutes.items():
            out[s, e, minute] = m
    return out, tops


def _buckets(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``_bucket`` of each value; the few whose log lands next to a bucket edge (where
    NumPy's log and the C library's may round apart) by ``_bucket`` itself."""
    mag = np.abs(values).astype(np.float64)
    nonzero = values != 0
    q = np.log(np.where(nonzero, mag, 1.0)) / _LN_GAMMA
    keys = np.ceil(q).astype(np.int64) + 1
    keys = np.where(values > 0, keys, np.where(nonzero, -keys, 0))
    edge = np.flatnonzero(nonzero & (np.abs(q - np.rint(q)) < 1e-6))
    for i in edge.tolist():
        keys[i] = _bucket(int(values[i]))
    return keys


Int64s = npt.NDArray[np.int64]


@dataclass
class _Entries:
    """Histogram buckets of many minutes: each one's minute (an index), key and count,
    by minute then key, one entry per distinct (minute, key)."""

    minute: Int64s
    key: Int64s
    count: Int64s


@dataclass
class _Direction:
    """One direction of many minutes: exact minimum, maximum and sum; histograms."""

    min: Int64s
    max: Int64s
    sum: Int64s
    hist: _Entries


@dataclass
class Fold:
    """The rollups of one read of records as arrays, element ``i`` of each that of the
    (session, epoch, minute) ``keys[i]``; ``tops``: each epoch's new highest Seq.

    ``minutes`` makes them the ``MinuteRollup``s ``roll_up_columns`` returns; ``rows``
    makes them, merged with the rows stored for some of them, the rows to store, with
    no object per minute."""

    keys: list[tuple[int, int, int]]
    tops: dict[tuple[int, int], int | None]
    count: Int64s
    lost: Int64s
    ipdv_direct: Int64s
    ipdv_return: Int64s
    pairs: Int64s
    #: Python ints: a bound can be past int64 (RFC 8762 §4.1.1).
    max_error: list[int]
    last_record: Int64s
    directions: dict[str, _Direction]

    def minutes(self) -> dict[tuple[int, int, int], MinuteRollup]:
        """What ``roll_up_columns`` returns: a ``MinuteRollup`` per key."""
        stats = {name: (d.min.tolist(), d.max.tolist(), d.sum.tolist(),
                        _histograms(d.hist, len(self.keys)))
                 for name, d in self.directions.items()}  # fmt: skip
        columns = zip(
            self.keys, self.count.tolist(), self.lost.tolist(), self.ipdv_direct.tolist(),
            self.pairs.tolist(), self.ipdv_return.tolist(), self.max_error,
            self.last_record.tolist(), strict=True,
        )  # fmt: skip
        out: dict[tuple[int, int, int], MinuteRollup] = {}
        for i, (key, count, ls, ipd, npairs, ipb, err, lr) in enumerate(columns):
            out[key] = MinuteRollup(
                key[2], count, ls,
                {name: DirectionRollup(count, lo[i], hi[i], total[i], hists[i])
                 for name, (lo, hi, total, hists) in stats.items()},
                {"direct": ipd, "return": ipb}, {"direct": npairs, "return": npairs}, err, lr,
            )  # fmt: skip
        return out

    def rows(self, stored: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]] | None:
        """The rows to store (``ROW_COLUMNS``) of these minutes, each merged with the row
        stored for it if ``stored`` holds one (rows as read, ``ROW_COLUMNS`` order):
        what the store's reference gives (each stored row's ``MinuteRollup``, ``merge``
        of the fresh one into it, its row), computed on the arrays.

        None if a stored row holds what the arrays do not take (a value near the int64
        limits or NULL, a missing, empty or malformed histogram, a key not among
        ``keys``): the caller then merges the reference way."""
        n = len(self.keys)
        count, lost, last = self.count.copy(), self.lost.copy(), self.last_record.copy()
        ipdv = {"direct": self.ipdv_direct.copy(), "return": self.ipdv_return.copy()}
        pairs = {"direct": self.pairs.copy(), "return": self.pairs.copy()}
        err = list(self.max_error)
        dirs = {name: _Direction(d.min.copy(), d.max.copy(), d.sum.copy(), d.hist)
                for name, d in self.directions.items()}  # fmt: skip
        if stored:
            index = {key: i for i, key in enumerate(self.keys)}
            try:
                at = np.array([index[r[0], r[1], r[2]] for r in stored], dtype=np.int64)
                columns = list(zip(*stored, strict=True))

                def ints(c: int) -> Int64s:
                    a = np.array(columns[c], dtype=np.int64)
                    if not bool(((a > -_INT64_SAFE) & (a < _INT64_SAFE)).all()):
                        raise OverflowError  # noqa: TRY301 - the arrays' one way out
                    return a

                count[at] += ints(3)
                lost[at] += ints(4)
                base = 5 + 7 * len(DIRECTIONS)
                for c, name in enumerate(("direct", "return")):
                    ipdv[name][at] += ints(base + 2 * c)
                    pairs[name][at] += ints(base + 2 * c + 1)
                for i, e in zip(at.tolist(), columns[base + 4], strict=True):
                    if e is not None and e > err[i]:  # NULL: the fresh bound, as ``merge``
                        err[i] = e
                last[at] = np.maximum(last[at], ints(base + 5))
                for c, d in enumerate(dirs.values()):
                    lo, hi, total = ints(5 + 7 * c), ints(9 + 7 * c), ints(10 + 7 * c)
                    old = _decode(columns[11 + 7 * c], at)
                    if old is None:
                        return None
                    d.min[at] = np.minimum(d.min[at], lo)
                    d.max[at] = np.maximum(d.max[at], hi)
                    d.sum[at] += total
                    d.hist = _combine(d.hist, old)
            except (KeyError, TypeError, ValueError, OverflowError):
                return None
        table = _representatives()
        out: list[Any] = [*zip(*self.keys, strict=True), count.tolist(), lost.tolist()]
        for d in dirs.values():
            h = d.hist
            starts = np.flatnonzero(_firsts(h.minute))
            n_dir = np.add.reduceat(h.count, starts)
            if int(n_dir.max()) >= _COUNT_LIMIT:
                return None
            cum = np.cumsum(h.count)
            before = cum[starts] - h.count[starts]
            reps = table[h.key + _KEY_LIMIT]
            p50, p99 = (np.minimum(np.maximum(reps[np.searchsorted(cum, before + rank)], d.min),
                                   d.max).tolist()
                        for rank in (_rank(50, n_dir), _rank(99, n_dir)))  # fmt: skip
            out += [d.min.tolist(), _means(d.sum, n_dir), p50, p99, d.max.tolist(),
                    d.sum.tolist(), _encode(h, n)]  # fmt: skip
        # The arrays hold values below 2^62; an error bound may be past int64.
        out += [ipdv["direct"].tolist(), pairs["direct"].tolist(), ipdv["return"].tolist(),
                pairs["return"].tolist(), [saturate(e) for e in err], last.tolist()]  # fmt: skip
        return list(zip(*out, strict=True))


#: Histogram keys the arrays take: those of every delay below 2^62 (all that a fold
#: holds), each with a representative that fits in int64.
_KEY_LIMIT = 2180
#: Bucket counts the arrays take (a nearest rank computed exactly as ``percentile`` does).
_COUNT_LIMIT = 2**36


@functools.cache
def _representatives() -> Int64s:
    """``_representative`` of each key from −_KEY_LIMIT to _KEY_LIMIT, by key + limit."""
    return np.array([_representative(k) for k in range(-_KEY_LIMIT, _KEY_LIMIT + 1)],
                    dtype=np.int64)  # fmt: skip


def _firsts(a: Int64s) -> npt.NDArray[np.bool_]:
    """Where each run of equal values begins."""
    first = np.ones(len(a), dtype=bool)
    first[1:] = a[1:] != a[:-1]
    return first


def _rank(p: int, n: Int64s) -> Int64s:
    """``DelayHistogram.percentile``'s nearest rank, ceil(p/100 · n), at least 1."""
    return np.maximum(1, -(-(p * 1000 * n) // 100_000))


def _means(total: Int64s, n: Int64s) -> list[int]:
    """round(total / n) of each, as Python's float division and ``round`` give it."""
    means: list[int] = np.rint(total / n).astype(np.int64).tolist()
    for i in np.flatnonzero(np.abs(total) >= 2**53).tolist():  # not exact in a float
        means[i] = round(int(total[i]) / int(n[i]))
    return means


def _combine(a: _Entries, b: _Entries) -> _Entries:
    """The buckets of both, counts of a key in a minute added."""
    minute = np.concatenate((a.minute, b.minute))
    key = np.concatenate((a.key, b.key))
    count = np.concatenate((a.count, b.count))
    order = np.lexsort((key, minute))
    minute, key, count = minute[order], key[order], count[order]
    new = _firsts(minute) | _firsts(key)
    starts = np.flatnonzero(new)
    return _Entries(minute[starts], key[starts], np.add.reduceat(count, starts))


def _encode(h: _Entries, size: int) -> list[bytes]:
    """``DelayHistogram.to_bytes`` of each of ``size`` minutes (each has buckets)."""
    first = _firsts(h.minute)
    delta = h.key.copy()
    delta[1:] -= np.where(first[1:], 0, h.key[:-1])
    values = np.empty(2 * len(delta), dtype=np.int64)
    values[0::2] = (delta << 1) ^ (delta >> 63)  # zigzag
    values[1::2] = h.count
    length = np.ones(len(values), dtype=np.int64)
    for shift in range(7, 63, 7):
        length += values >= 1 << shift
    end = np.cumsum(length)
    start = end - length
    buf = np.empty(int(end[-1]), dtype=np.uint8)
    for j in range(int(length.max())):
        has = np.flatnonzero(length > j)
        more = (length[has] > j + 1).astype(np.int64) << 7
        buf[start[has] + j] = ((values[has] >> 7 * j) & 0x7F) | more
    data = buf.tobytes()
    bounds = [*start[2 * np.flatnonzero(first)].tolist(), len(data)]
    if len(bounds) != size + 1:
        raise AssertionError("a minute without buckets")
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def _decode(blobs: Sequence[Any], minutes: Int64s) -> _Entries | None:
    """The buckets of stored histograms (``to_bytes``), blob ``i`` those of minute
    ``minutes[i]``; None if one is empty, truncated, not key-ascending, or beyond the
    limits above (``from_bytes`` decides those)."""
    lengths = np.array([len(b) for b in blobs], dtype=np.int64)
    if not len(lengths) or not bool((lengths > 0).all()):
        return None
    data = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    ends = np.cumsum(lengths)
    last_byte = (data & 0x80) == 0
    if not bool(last_byte[ends - 1].all()):
        return None
    stop = np.flatnonzero(last_byte)
    begin = np.empty_like(stop)
    begin[0] = 0
    begin[1:] = stop[:-1] + 1
    size = stop - begin + 1
    if int(size.max()) > 9:  # past 63 bits
        return None
    position = np.arange(len(data)) - np.repeat(begin, size)
    values = np.bitwise_or.reduceat((data & 0x7F).astype(np.int64) << 7 * position, begin)
    owner = np.searchsorted(ends, begin, side="right")
    per_blob = np.bincount(owner, minlength=len(lengths))
    if bool((per_blob % 2).any()):
        return None
    zz, count, owner = values[0::2], values[1::2], owner[0::2]
    delta = (zz >> 1) ^ -(zz & 1)  # unzigzag
    if int(np.abs(delta).max()) > 2 * _KEY_LIMIT or int(count.max()) >= _COUNT_LIMIT:
        return None
    cum = np.cumsum(delta)
    first = _firsts(owner)
    at = np.flatnonzero(first)
    key = cum - np.repeat(cum[at] - delta[at], np.diff(np.append(at, len(cum))))
    if not bool((np.add.reduceat(count, at) > 0).all()):
        return None  # a direction of no records: ``merge`` takes the other's extremes
    if int(np.abs(key).max()) > _KEY_LIMIT or bool(((np.diff(key) <= 0) & ~first[1:]).any()):
        return None
    return _Entries(minutes[owner], key, count)


def fold_columns(
    columns: Sequence[Sequence[int]], highest_seq: Mapping[tuple[int, int], int | None]
) -> Fold | None:
    """``roll_up_columns`` as a ``Fold``; None where it rolls up by ``roll_up`` (values
    too large for int64 sums) or for no rows."""
    if len(columns) != 10:
        raise ValueError(f"roll_up_columns: {len(columns)} columns, not 10")
    n = len(columns[3])
    if not n:
        return None
    try:
        ints = [np.asarray(c, dtype=np.int64) for c in columns]
    except OverflowError:
        return None
    if min(int(c.min()) for c in ints[4:8]) < 0:
        return None
    t1, t2, t3, t4 = ints[4:8]
    direct = t2 - t1  # no overflow: both are in [0, 2^63)
    back = t4 - t3
    biggest = max(int(np.abs(direct).max()), int(np.abs(back).max()))
    if 4 * biggest * n >= _INT64_SAFE:
        return None
    ees = (ints[8] << 16) | ints[9]
    return _fold((*ints[:5], direct, back, ees), highest_seq)


def _fold(arrays: tuple[Int64s, ...], highest_seq: Mapping[tuple[int, int], int | None]) -> Fold:
    """``fold_columns`` of session, epoch, record id, Seq, T1, the direct and return
    delays and the two Error Estimates (sender's << 16 | reflector's) as int64 arrays."""
    sid, ep, rid, seq, t1, direct, back, ees = arrays
    n = len(seq)
    # Groups (session, epoch) in the order given; within each, rows by Seq, record id
    # order kept among equal Seqs (as ``sorted`` keeps it).
    new_group = _firsts(sid) | _firsts(ep)
    gid = np.cumsum(new_group) - 1
    starts = np.flatnonzero(new_group)
    group_keys = list(zip(sid[starts].tolist(), ep[starts].tolist(), strict=True))
    init = np.array([-1 if (t := highest_seq.get(k)) is None else t for k in group_keys],
                    dtype=np.int64)  # fmt: skip
    order = np.lexsort((seq, gid))
    gid, rid, seq, t1 = gid[order], rid[order], seq[order], t1[order]
    direct, back, ees = direct[order], back[order], ees[order]
    first = _firsts(gid)
    # Loss: the Seqs skipped above the highest one before each row (Seqs ascend in a
    # group, so that is the row before, or the cursor); a row not above it takes one back.
    before = np.where(first, init[gid], np.maximum(np.roll(seq, 1), init[gid]))
    lost = np.where(seq > before, seq - before - 1, -1)
    last = np.ones(n, dtype=bool)
    last[:-1] = first[1:]
    tops_arr = np.maximum(seq[last], init)
    tops = {k: (None if t < 0 else t) for k, t in zip(group_keys, tops_arr.tolist(), strict=True)}
    # RFC 3393 IPDV of consecutive Seqs, in the minute of the later one.
    pair = np.zeros(n, dtype=bool)
    pair[1:] = ~first[1:] & (seq[1:] == seq[:-1] + 1)
    zero = np.zeros(1, dtype=np.int64)
    ipdv_direct = np.where(pair, np.abs(direct - np.concatenate((zero, direct[:-1]))), 0)
    ipdv_back = np.where(pair, np.abs(back - np.concatenate((zero, back[:-1]))), 0)
    # Minutes: rows by (group, minute); reductions over each run.
    minute = t1 - t1 % MINUTE_NS
    by_minute = np.lexsort((minute, gid))
    gm, mm = gid[by_minute], minute[by_minute]
    new_m = _firsts(gm) | _firsts(mm)
    m_starts = np.flatnonzero(new_m)
    m_index = np.cumsum(new_m) - 1
    add = np.add.reduceat
    directions = {}
    for name, values in (("direct", direct), ("return", back), ("rtt", direct + back)):
        v = values[by_minute]
        directions[name] = _Direction(np.minimum.reduceat(v, m_starts),
                                      np.maximum.reduceat(v, m_starts), add(v, m_starts),
                                      _entries(m_index, _buckets(v)))  # fmt: skip
    # Error bounds: exact ints per distinct (sender, reflector) pair (past int64 at the
    # largest Error Estimates, RFC 8762 §4.1.1); the largest per minute found by rank.
    ee_pairs, which = np.unique(ees, return_inverse=True)
    bounds = [ErrorEstimate.from_int(p >> 16).error_ns + ErrorEstimate.from_int(p & 0xFFFF).error_ns
              for p in ee_pairs.tolist()]  # fmt: skip
    rank_order = sorted(range(len(bounds)), key=bounds.__getitem__)
    rank = np.empty(len(bounds), dtype=np.int64)
    rank[rank_order] = np.arange(len(bounds))
    max_rank = np.maximum.reduceat(rank[which.reshape(-1)][by_minute], m_starts).tolist()
    groups = gm[m_starts].tolist()
    return Fold(
        keys=[(*group_keys[g], m) for g, m in zip(groups, mm[m_starts].tolist(), strict=True)],
        tops=tops,
        count=np.diff(np.append(m_starts, n)),
        lost=add(lost[by_minute], m_starts),
        ipdv_direct=add(ipdv_direct[by_minute], m_starts),
        ipdv_return=add(ipdv_back[by_minute], m_starts),
        pairs=add(pair[by_minute].astype(np.int64), m_starts),
        max_error=[bounds[rank_order[r]] for r in max_rank],
        last_record=np.maximum.reduceat(rid[by_minute], m_starts),
        directions=directions,
    )


def _entries(m_index: Int64s, keys: Int64s) -> _Entries:
    """The buckets of each minute from each row's minute index and bucket key."""
    order = np.lexsort((keys, m_index))
    mi, k = m_index[order], keys[order]
    starts = np.flatnonzero(_firsts(mi) | _firsts(k))
    return _Entries(mi[starts], k[starts], np.diff(np.append(starts, len(k))))


def _histograms(h: _Entries, size: int) -> list[DelayHistogram]:
    """One histogram per minute from the buckets."""
    dicts: list[dict[int, int]] = [{} for _ in range(size)]
    for owner, key, n in zip(h.minute.tolist(), h.key.tolist(), h.count.tolist(), strict=True):
        dicts[owner][key] = n
    return [DelayHistogram(d) for d in dicts]
