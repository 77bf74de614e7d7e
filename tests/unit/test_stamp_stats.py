"""Delay maths: nearest-rank percentiles, summaries, RFC 3393 IPDV, path statistics.

Every expected value here is worked out by hand in the comment beside it.
"""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from sixlab.stamp._events import StampResult
from sixlab.stamp.stats import DelaySummary, ipdv, path_stats, percentile, summarize
from sixlab.wire.timestamp import ErrorEstimate

EE_1NS = ErrorEstimate(scale=0, multiplier=1)  # 2^-32 s = 0.23 ns, rounds up to 1 ns


def record(
    seq: int,
    t1: int,
    t2: int,
    t3: int,
    t4: int,
    *,
    sender_error: ErrorEstimate = EE_1NS,
    reflector_error: ErrorEstimate = EE_1NS,
) -> StampResult:
    return StampResult(
        ssid=1,
        seq=seq,
        t1_ns=t1,
        t2_ns=t2,
        t3_ns=t3,
        t4_ns=t4,
        sender_error=sender_error,
        reflector_error=reflector_error,
        ses_sender_ttl=64,
        reflector_seq=seq,
    )


def delays(seq: int, direct: int, back: int, *, residence: int = 100) -> StampResult:
    """A record with the given one-way delays, T1 at ``seq`` seconds."""
    t1 = seq * 1_000_000_000
    return record(seq, t1, t1 + direct, t1 + direct + residence, t1 + direct + residence + back)


# ------------------------------------------------------------------ StampResult


def test_result_delays_on_a_hand_built_record() -> None:
    r = record(
        0,
        t1=1_000,
        t2=5_000,
        t3=5_600,
        t4=9_000,
        sender_error=ErrorEstimate(scale=10, multiplier=3),  # 3·2^-22 s = 715.26 ns -> 716
        reflector_error=ErrorEstimate(scale=0, multiplier=1),  # 0.23 ns -> 1
    )
    assert r.direct_ns == 4_000  # T2 - T1
    assert r.return_ns == 3_400  # T4 - T3
    assert r.rtt_ns == 7_400  # (9000 - 1000) - (5600 - 5000)
    assert r.error_bound_ns == 717


def test_one_way_delays_may_be_negative_with_unsynchronised_clocks() -> None:
    r = record(0, t1=10_000, t2=9_000, t3=9_500, t4=12_000)  # reflector clock 3 µs behind
    assert (r.direct_ns, r.return_ns, r.rtt_ns) == (-1_000, 2_500, 1_500)


# ------------------------------------------------------------------ percentile


@pytest.mark.parametrize(
    ("p", "expected"),
    # Nearest rank of [15, 20, 35, 40, 50]: rank = ceil(p/100 · 5).
    [(5, 15), (20, 15), (20.001, 20), (30, 20), (40, 20), (50, 35), (80, 40), (81, 50), (100, 50)],
)
def test_percentile_nearest_rank(p: float, expected: int) -> None:
    assert percentile([15, 20, 35, 40, 50], p) == expected


def test_percentile_on_1_to_1000() -> None:
    values = list(range(1, 1001))
    assert percentile(values, 99.9) == 999  # rank ceil(999.0) = 999
    assert percentile(values, 99.95) == 1000  # rank ceil(999.5)
    assert percentile(values, 0.1) == 1
    assert percentile(values, 0.15) == 2  # rank ceil(1.5)
    assert percentile(values, 12.5) == 125


@pytest.mark.parametrize("p", [0, -1, 100.5, 1000])
def test_percentile_outside_0_100_is_an_error(p: float) -> None:
    with pytest.raises(ValueError, match="percentile"):
        percentile([1, 2, 3], p)


def test_percentile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)


def test_percentile_agrees_with_the_definition() -> None:
    """Smallest value with at least p% of the sample at or below it, by brute force."""
    rng = random.Random(3393)
    for _ in range(300):
        values = sorted(rng.randrange(-50, 50) for _ in range(rng.randrange(1, 40)))
        p = Fraction(rng.randrange(1, 100_001), 1000)  # to 0.001, as documented
        n = len(values)
        expected = min(v for v in values if 100 * sum(x <= v for x in values) >= p * n)
        assert percentile(values, float(p)) == expected, (values, p)


# ------------------------------------------------------------------ summarize


def test_summarize_small_series() -> None:
    assert summarize([5, 1, 3, 2, 4]) == DelaySummary(
        count=5, min_ns=1, mean_ns=3, p50_ns=3, p90_ns=5, p99_ns=5, max_ns=5
    )


def test_summarize_1_to_100() -> None:
    s = summarize([*range(100, 0, -1), 51])  # any order; 5101 / 101 = 50.5049...
    assert s == DelaySummary(
        count=101, min_ns=1, mean_ns=51, p50_ns=51, p90_ns=90, p99_ns=99, max_ns=100
    )  # ranks ceil(50.5) = 51, ceil(90.9) = 91, ceil(99.99) = 100 of 1..51, 51, 52..100
    assert s.as_ms() == {
        "min": 1e-6,
        "mean": 5.1e-5,
        "p50": 5.1e-5,
        "p90": 9e-5,
        "p99": 9.9e-5,
        "max": 1e-4,
    }


def test_summarize_mean_rounds_to_the_nearest_ns() -> None:
    s = summarize([1, 2, 3, 5])  # 11 / 4 = 2.75
    assert s is not None
    assert s.mean_ns == 3
    assert summarize([7]) == DelaySummary(1, 7, 7, 7, 7, 7, 7)


def test_summarize_nothing_is_none() -> None:
    assert summarize([]) is None
    assert summarize(iter(())) is None


# ------------------------------------------------------------------ IPDV


def test_ipdv_only_across_consecutive_seqs() -> None:
    # Seq 3 is missing: the pairs are (0,1), (1,2), (4,5), (5,6); (2,4) is skipped.
    records = [
        delays(5, direct=1_700, back=900),
        delays(0, direct=1_000, back=500),
        delays(2, direct=1_100, back=800),
        delays(6, direct=1_200, back=900),
        delays(1, direct=1_400, back=600),
        delays(4, direct=9_000, back=100),
    ]
    assert ipdv(records) == [400, -300, -7_300, -500]  # 1400-1000, 1100-1400, ...
    assert ipdv(records, lambda r: r.return_ns) == [100, 200, 800, 0]


def test_ipdv_of_too_few_or_no_consecutive_records_is_empty() -> None:
    assert ipdv([]) == []
    assert ipdv([delays(0, 1, 1)]) == []
    assert ipdv([delays(0, 1, 1), delays(2, 5, 1), delays(4, 9, 1)]) == []


# ------------------------------------------------------------------ path_stats


def test_path_stats_on_a_known_series() -> None:
    records = [
        delays(0, direct=1_000, back=2_000),
        delays(1, direct=3_000, back=2_000),
        delays(2, direct=2_000, back=2_500),
        delays(4, direct=4_000, back=2_000),
    ]
    stats = path_stats(records, lost=1)
    assert stats.received == 4
    assert stats.lost == 1
    assert stats.loss_ratio == pytest.approx(0.2)
    assert stats.direct == summarize([1_000, 3_000, 2_000, 4_000])
    assert stats.direct is not None
    assert (stats.direct.min_ns, stats.direct.mean_ns, stats.direct.max_ns) == (1000, 2500, 4000)
    assert stats.backward == summarize([2_000, 2_000, 2_500, 2_000])
    assert stats.rtt == summarize([3_000, 5_000, 4_500, 6_000])
    # IPDV pairs (0,1), (1,2): direct +2000, -1000 -> mean |.| 1500; return 0, +500 -> 250.
    assert stats.direct_jitter_ns == 1_500
    assert stats.return_jitter_ns == 250
    assert stats.max_error_bound_ns == 2


def test_path_stats_error_bound_is_the_worst_record() -> None:
    wide = ErrorEstimate(scale=32, multiplier=1)  # 1 s
    a = delays(0, 10, 10)
    b = record(1, 0, 1, 2, 3, reflector_error=wide)
    assert path_stats([a, b]).max_error_bound_ns == 1_000_000_001


def test_path_stats_with_nothing_received() -> None:
    stats = path_stats([], lost=3)
    assert (stats.direct, stats.backward, stats.rtt) == (None, None, None)
    assert (stats.direct_jitter_ns, stats.return_jitter_ns) == (None, None)
    assert stats.max_error_bound_ns is None
    assert stats.loss_ratio == 1.0
    assert path_stats([]).loss_ratio == 0.0  # nothing known: no loss to report
