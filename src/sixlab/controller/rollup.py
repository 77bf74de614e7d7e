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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from sixlab.stamp import StampResult
from sixlab.stamp.stats import DelaySummary, PathStats
from sixlab.wire.timestamp import ErrorEstimate

__all__ = [
    "ALPHA",
    "DIRECTIONS",
    "MINUTE_NS",
    "DelayHistogram",
    "DirectionRollup",
    "MinuteRollup",
    "merged_stats",
    "roll_up",
    "roll_up_columns",
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
    if len(columns) != 10:
        raise ValueError(f"roll_up_columns: {len(columns)} columns, not 10")
    n = len(columns[3])
    if not n:
        return {}, {}
    try:
        ints = [np.asarray(c, dtype=np.int64) for c in columns]
    except OverflowError:
        ints = []
    if ints and min(int(c.min()) for c in ints[4:8]) >= 0:
        t1, t2, t3, t4 = ints[4:8]
        direct = t2 - t1  # no overflow: both are in [0, 2^63)
        back = t4 - t3
        biggest = max(int(np.abs(direct).max()), int(np.abs(back).max()))
        if 4 * biggest * n < _INT64_SAFE:
            ees = (ints[8] << 16) | ints[9]
            return _roll_up_np((*ints[:5], direct, back, ees), highest_seq)
    return _roll_up_each(columns, highest_seq)


def _roll_up_each(
    columns: Sequence[Sequence[int]], highest_seq: Mapping[tuple[int, int], int | None]
) -> tuple[dict[tuple[int, int, int], MinuteRollup], dict[tuple[int, int], int | None]]:
    """``roll_up_columns`` by ``roll_up`` (values too large for int64 sums)."""
    groups: dict[tuple[int, int], list[tuple[int, StampResult]]] = {}
    for sid, ep, rid, seq, t1, t2, t3, t4, se, re in zip(*columns, strict=True):
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


def _roll_up_np(
    arrays: tuple[npt.NDArray[np.int64], ...], highest_seq: Mapping[tuple[int, int], int | None]
) -> tuple[dict[tuple[int, int, int], MinuteRollup], dict[tuple[int, int], int | None]]:
    """``roll_up_columns`` of session, epoch, record id, Seq, T1, the direct and return
    delays and the two Error Estimates (sender's << 16 | reflector's) as int64 arrays."""
    sid, ep, rid, seq, t1, direct, back, ees = arrays
    n = len(seq)
    # Groups (session, epoch) in the order given; within each, rows by Seq, record id
    # order kept among equal Seqs (as ``sorted`` keeps it).
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = (sid[1:] != sid[:-1]) | (ep[1:] != ep[:-1])
    gid = np.cumsum(new_group) - 1
    starts = np.flatnonzero(new_group)
    group_keys = list(zip(sid[starts].tolist(), ep[starts].tolist(), strict=True))
    init = np.array([-1 if (t := highest_seq.get(k)) is None else t for k in group_keys],
                    dtype=np.int64)  # fmt: skip
    order = np.lexsort((seq, gid))
    gid, rid, seq, t1 = gid[order], rid[order], seq[order], t1[order]
    direct, back, ees = direct[order], back[order], ees[order]
    first = np.ones(n, dtype=bool)
    first[1:] = gid[1:] != gid[:-1]
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
    new_m = np.ones(n, dtype=bool)
    new_m[1:] = (gm[1:] != gm[:-1]) | (mm[1:] != mm[:-1])
    m_starts = np.flatnonzero(new_m)
    m_index = np.cumsum(new_m) - 1
    counts = np.diff(np.append(m_starts, n))
    rtt = direct + back
    add = np.add.reduceat
    stats = {}
    for name, values in (("direct", direct), ("return", back), ("rtt", rtt)):
        v = values[by_minute]
        stats[name] = (np.minimum.reduceat(v, m_starts).tolist(),
                       np.maximum.reduceat(v, m_starts).tolist(), add(v, m_starts).tolist(),
                       _histograms(m_index, _buckets(v), len(m_starts)))  # fmt: skip
    # Error bounds: exact ints per distinct (sender, reflector) pair; the largest per
    # minute found by rank.
    pairs, which = np.unique(ees, return_inverse=True)
    bounds = [ErrorEstimate.from_int(p >> 16).error_ns + ErrorEstimate.from_int(p & 0xFFFF).error_ns
              for p in pairs.tolist()]  # fmt: skip
    rank_order = sorted(range(len(bounds)), key=bounds.__getitem__)
    rank = np.empty(len(bounds), dtype=np.int64)
    rank[rank_order] = np.arange(len(bounds))
    max_rank = np.maximum.reduceat(rank[which.reshape(-1)][by_minute], m_starts).tolist()
    out: dict[tuple[int, int, int], MinuteRollup] = {}
    columns = zip(
        gm[m_starts].tolist(), mm[m_starts].tolist(), counts.tolist(),
        add(lost[by_minute], m_starts).tolist(),
        add(ipdv_direct[by_minute], m_starts).tolist(),
        add(pair[by_minute].astype(np.int64), m_starts).tolist(),
        add(ipdv_back[by_minute], m_starts).tolist(),
        max_rank, np.maximum.reduceat(rid[by_minute], m_starts).tolist(),
        strict=True,
    )  # fmt: skip
    for i, (g, mn, count, ls, ipd, npairs, ipb, mr, lr) in enumerate(columns):
        m = MinuteRollup(
            mn, count, ls,
            {name: DirectionRollup(count, lo[i], hi[i], total[i], hists[i])
             for name, (lo, hi, total, hists) in stats.items()},
            {"direct": ipd, "return": ipb}, {"direct": npairs, "return": npairs},
            bounds[rank_order[mr]], lr,
        )  # fmt: skip
        s, e = group_keys[g]
        out[s, e, mn] = m
    return out, tops


def _histograms(
    m_index: npt.NDArray[np.int64], keys: npt.NDArray[np.int64], size: int
) -> list[DelayHistogram]:
    """One histogram per minute from each row's minute index and bucket key."""
    order = np.lexsort((keys, m_index))
    mi, k = m_index[order], keys[order]
    new = np.ones(len(k), dtype=bool)
    new[1:] = (mi[1:] != mi[:-1]) | (k[1:] != k[:-1])
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(k))).tolist()
    dicts: list[dict[int, int]] = [{} for _ in range(size)]
    for owner, key, n in zip(mi[starts].tolist(), k[starts].tolist(), counts, strict=True):
        dicts[owner][key] = n
    return [DelayHistogram(d) for d in dicts]
