"""Per-minute rollups: exact counts and extremes, percentiles within ALPHA, loss by gaps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sixlab.controller.rollup import (
    ALPHA,
    I64_MAX,
    I64_MIN,
    MINUTE_NS,
    ROW_COLUMNS,
    DelayHistogram,
    MinuteRollup,
    fold_columns,
    merged_stats,
    roll_up,
    roll_up_columns,
    saturate,
)
from sixlab.controller.store import _rollup, _rollup_row
from sixlab.stamp import StampResult
from sixlab.stamp.stats import path_stats
from sixlab.wire.timestamp import ErrorEstimate

EE = ErrorEstimate(scale=10, multiplier=3)
T0 = 1_700_000_000 * 10**9 // MINUTE_NS * MINUTE_NS


def _r(seq: int, t1: int, direct: int, back: int) -> StampResult:
    return StampResult(0, seq, t1, t1 + direct, t1 + direct + 1000, t1 + direct + 1000 + back,
                       EE, EE, 255, seq)  # fmt: skip


def _close(approx: int, exact: int) -> bool:
    return abs(approx - exact) <= ALPHA * abs(exact) + 1


delays = st.integers(min_value=-(10**9), max_value=10**10)


@given(st.lists(delays, min_size=1, max_size=300))
def test_histogram_percentiles_are_within_alpha_of_the_exact_ones(values: list[int]) -> None:
    h = DelayHistogram()
    for v in values:
        h.add(v)
    data = sorted(values)
    for p in (1, 50, 90, 99, 100):
        rank = max(1, -(-int(p * len(data) * 1000) // 100_000))
        assert _close(h.percentile(p), data[rank - 1]), (p, h.percentile(p), data[rank - 1])


@given(st.lists(delays, max_size=200))
def test_histogram_bytes_round_trip(values: list[int]) -> None:
    h = DelayHistogram()
    for v in values:
        h.add(v)
    assert DelayHistogram.from_bytes(h.to_bytes()) == h


def test_truncated_histogram_bytes_are_refused() -> None:
    h = DelayHistogram()
    h.add(123456)
    with pytest.raises(ValueError, match="truncated"):
        DelayHistogram.from_bytes(h.to_bytes() + b"\x80")


@given(
    st.lists(
        st.tuples(st.integers(0, 500), delays, delays),
        min_size=1,
        max_size=200,
        unique_by=lambda x: x[0],
    ),
    st.integers(1, 4),
)
def test_rollups_merged_match_the_exact_stats(
    samples: list[tuple[int, int, int]], passes: int
) -> None:
    # A packet every 0.5 s: the records span a few minutes; rolled up in several passes,
    # in arrival order, then merged.
    records = [(i + 1, _r(seq, T0 + seq * 500_000_000, d, b)) for i, (seq, d, b) in
               enumerate(samples)]  # fmt: skip
    minutes: dict[int, MinuteRollup] = {}
    top = None
    size = -(-len(records) // passes)
    for start in range(0, len(records), size):
        out, top = roll_up(records[start : start + size], top)
        for k, m in out.items():
            minutes.setdefault(k, MinuteRollup(k)).merge(m)
    exact = path_stats([r for _, r in records])
    got = merged_stats(list(minutes.values()))
    assert got.received == exact.received == len(records)
    for mine, ref in ((got.direct, exact.direct), (got.backward, exact.backward),
                      (got.rtt, exact.rtt)):  # fmt: skip
        assert mine is not None
        assert ref is not None
        assert (mine.count, mine.min_ns, mine.max_ns) == (ref.count, ref.min_ns, ref.max_ns)
        assert abs(mine.mean_ns - ref.mean_ns) <= 1
        for a, b in ((mine.p50_ns, ref.p50_ns), (mine.p90_ns, ref.p90_ns),
                     (mine.p99_ns, ref.p99_ns)):  # fmt: skip
            assert _close(a, b), (a, b)
    # Every Seq below the highest received that did not arrive is lost, once.
    seqs = {s for s, _, _ in samples}
    assert got.lost == max(seqs) + 1 - len(seqs)
    assert got.max_error_bound_ns == exact.max_error_bound_ns
    assert sum(m.count for m in minutes.values()) == len(records)
    assert set(minutes) == {r.t1_ns - r.t1_ns % MINUTE_NS for _, r in records}


def test_loss_goes_to_the_minute_of_the_next_received_packet() -> None:
    recs = [(1, _r(0, T0, 10, 10)), (2, _r(5, T0 + MINUTE_NS, 10, 10))]
    out, top = roll_up(recs, None)
    assert (out[T0].lost, out[T0 + MINUTE_NS].lost, top) == (0, 4, 5)
    # Seq 3 arrives late, after the pass that counted it lost: it takes one back.
    out2, top2 = roll_up([(3, _r(3, T0 + 30 * 10**9, 10, 10))], top)
    assert (out2[T0].lost, top2) == (-1, 5)
    total = MinuteRollup(0)
    for m in (*out.values(), *out2.values()):
        total.merge(m)
    assert (total.lost, total.count) == (3, 3)


def test_jitter_is_the_mean_absolute_ipdv_of_consecutive_seqs() -> None:
    recs = [(i + 1, _r(s, T0 + s * 10**8, d, 2 * d)) for i, (s, d) in
            enumerate([(0, 100), (1, 130), (2, 110), (4, 500)])]  # fmt: skip
    out, _ = roll_up(recs, None)
    stats = merged_stats(list(out.values()))
    exact = path_stats([r for _, r in recs])
    assert stats.direct_jitter_ns == exact.direct_jitter_ns == 25
    assert stats.return_jitter_ns == exact.return_jitter_ns == 50


# -- values past the stores' 64-bit columns --------------------------------------------

#: 255 × 2^(57−32) s each (RFC 4656 §4.1.2), about 8.6e18 ns: together past 2^63 ns.
HUGE = ErrorEstimate(scale=57, multiplier=255)
LARGEST = ErrorEstimate(scale=63, multiplier=255)


def _columns(recs: list[tuple[int, StampResult]]) -> list[list[int]]:
    """``fold_columns``' ten columns of one session's epoch-0 records."""
    return [list(c) for c in zip(*[(1, 0, rid, r.seq, r.t1_ns, r.t2_ns, r.t3_ns, r.t4_ns,
                                    r.sender_error.to_int(), r.reflector_error.to_int())
                                   for rid, r in recs], strict=True)]  # fmt: skip


@pytest.mark.parametrize(("sender", "reflector"), [(HUGE, HUGE), (EE, LARGEST), (LARGEST, LARGEST)])
def test_an_error_bound_past_int64_is_kept_exact_and_stored_saturated(
    sender: ErrorEstimate, reflector: ErrorEstimate
) -> None:
    recs = [(k + 1, StampResult(0, k, T0 + k * 10**9, T0 + k * 10**9 + 100, T0 + k * 10**9 + 150,
                                T0 + k * 10**9 + 300, sender if k else EE, reflector if k else EE,
                                64, k))
            for k in range(3)]  # fmt: skip
    bound = recs[1][1].error_bound_ns
    assert bound > I64_MAX
    minutes, _ = roll_up(recs, None)
    (m,) = minutes.values()
    assert m.max_error_ns == bound  # exact in memory
    row = _rollup_row(1, 0, m)
    assert row[ROW_COLUMNS.index("max_error_ns")] == I64_MAX  # "at least"
    assert all(I64_MIN <= v <= I64_MAX for v in row if isinstance(v, int))
    # The arrays' rows are the reference's, fresh and merged with a stored row.
    fold = fold_columns(_columns(recs), {})
    assert fold is not None
    assert fold.rows([]) == [row]
    stored = _rollup_row(1, 0, roll_up(recs[:1], None)[0][T0])
    again = fold_columns(_columns(recs[1:]), {(1, 0): 0})
    assert again is not None
    merged = again.rows([stored])
    assert merged is not None
    assert merged[0][ROW_COLUMNS.index("max_error_ns")] == I64_MAX
    # Read back, merged, as stats: the saturated bound.
    assert merged_stats([_rollup(row)]).max_error_bound_ns == I64_MAX


def test_delays_and_sums_past_int64_are_stored_saturated() -> None:
    """Timestamps the columns hold (below 2^63) whose delays, sums and IPDVs do not:
    T2 and T3 at the column's limit, T1 and T4 near 0 (clocks not set)."""
    far = I64_MAX
    recs = [(k + 1, StampResult(0, k, k, far - k, far - k, 2 * k + 1, EE, EE, 64, k))
            for k in range(4)]  # fmt: skip
    minutes, _ = roll_up(recs, None)
    (m,) = minutes.values()
    assert m.directions["direct"].sum_ns > I64_MAX
    assert m.directions["return"].sum_ns < I64_MIN
    row = dict(zip(ROW_COLUMNS, _rollup_row(1, 0, m), strict=True))
    assert row["direct_sum"] == I64_MAX
    assert row["return_sum"] == I64_MIN
    assert (row["direct_min"], row["direct_max"]) == (far - 6, far)  # in range: exact
    assert all(I64_MIN <= v <= I64_MAX for v in row.values() if isinstance(v, int))
    # The arrays leave such values to the reference: the same row.
    assert roll_up_columns(_columns(recs), {})[0] == {(1, 0, 0): m}
    # Stored and merged with more: still saturated, never failing.
    total = _rollup(tuple(row.values()))
    total.merge(m)
    assert _rollup_row(1, 0, total)[ROW_COLUMNS.index("direct_sum")] == I64_MAX


def test_saturate_keeps_values_in_range_and_clamps_the_rest() -> None:
    assert [saturate(v) for v in (0, -5, I64_MAX, I64_MIN, 2**63, -(2**63) - 1, 2**80)] == [
        0, -5, I64_MAX, I64_MIN, I64_MAX, I64_MIN, I64_MAX
    ]  # fmt: skip
