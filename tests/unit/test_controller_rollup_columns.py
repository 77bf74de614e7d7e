"""``roll_up_columns`` (NumPy, many epochs at once) returns exactly what ``roll_up`` does."""

from __future__ import annotations

import random
from dataclasses import asdict

import numpy as np
import pytest

from sixlab.controller.rollup import (
    MINUTE_NS,
    MinuteRollup,
    _bucket,
    _buckets,
    roll_up,
    roll_up_columns,
)
from sixlab.stamp import StampResult
from sixlab.wire.timestamp import ErrorEstimate

T0 = 1_700_000_000 * 10**9 // MINUTE_NS * MINUTE_NS
Row = tuple[int, int, int, int, int, int, int, int, int, int]


def _reference(
    rows: list[Row], tops: dict[tuple[int, int], int | None]
) -> tuple[dict[tuple[int, int, int], MinuteRollup], dict[tuple[int, int], int | None]]:
    groups: dict[tuple[int, int], list[tuple[int, StampResult]]] = {}
    for sid, ep, rid, seq, t1, t2, t3, t4, se, re in rows:
        r = StampResult(0, seq, t1, t2, t3, t4, ErrorEstimate.from_int(se),
                        ErrorEstimate.from_int(re), 255, seq)  # fmt: skip
        groups.setdefault((sid, ep), []).append((rid, r))
    out: dict[tuple[int, int, int], MinuteRollup] = {}
    new_tops: dict[tuple[int, int], int | None] = {}
    for key, recs in groups.items():
        minutes, new_tops[key] = roll_up(recs, tops.get(key))
        for minute, m in minutes.items():
            out[(*key, minute)] = m
    return out, new_tops


def _vectorized(
    rows: list[Row], tops: dict[tuple[int, int], int | None]
) -> tuple[dict[tuple[int, int, int], MinuteRollup], dict[tuple[int, int], int | None]]:
    columns = list(zip(*rows, strict=True))
    return roll_up_columns(columns, tops)


def _assert_same(rows: list[Row], tops: dict[tuple[int, int], int | None]) -> None:
    ref, ref_tops = _reference(rows, tops)
    got, got_tops = _vectorized(rows, tops)
    assert got_tops == ref_tops
    assert sorted(got) == sorted(ref)
    for key, m in ref.items():
        # Every field, histogram dicts included; Python ints, not NumPy ones.
        assert asdict(got[key]) == asdict(m), key
        assert type(got[key].directions["rtt"].sum_ns) is int
        assert type(got[key].max_error_ns) is int


EES = [ErrorEstimate(scale=s, multiplier=m).to_int() for s, m in
       ((10, 3), (0, 1), (32, 255), (63, 255), (20, 0))]  # fmt: skip


def _random_rows(
    rng: random.Random, sessions: int, per: int, delay: int, passes: int
) -> list[list[Row]]:
    """Rows of ``sessions`` sessions (one or two epochs each), Seqs with gaps and
    duplicates, arriving out of order, split into ``passes`` reads (record id order)."""
    reads: list[list[Row]] = [[] for _ in range(passes)]
    for sid in range(1, sessions + 1):
        for ep in range(rng.randint(1, 2)):
            seqs = sorted(rng.sample(range(3 * per), per))
            seqs += rng.choices(seqs, k=per // 10)  # duplicates
            rng.shuffle(seqs)  # arrival (record id) order
            rid = 0
            for chunk, read in zip(range(passes), reads, strict=True):
                part = seqs[chunk * len(seqs) // passes : (chunk + 1) * len(seqs) // passes]
                for seq in part:
                    rid += 1
                    t1 = T0 + seq * rng.choice((10**9, 7 * 10**9, 25 * 10**9))
                    d = rng.choice((0, rng.randint(-delay, delay), delay, -delay))
                    b = rng.choice((0, rng.randint(-delay, delay)))
                    res = rng.randint(0, 1000)
                    read.append((sid, ep, rid, seq, t1, t1 + d, t1 + d + res, t1 + d + res + b,
                                 rng.choice(EES), rng.choice(EES)))  # fmt: skip
    return reads


@pytest.mark.parametrize(
    ("sessions", "per", "delay", "passes"),
    [
        (200, 2, 10**6, 1),
        (20, 60, 10**9, 3),
        (5, 300, 2**40, 4),
        (50, 20, 1, 2),
        (3, 50, 2**62, 2),
    ],
)
def test_roll_up_columns_equals_roll_up(sessions: int, per: int, delay: int, passes: int) -> None:
    """Many sessions, reads split anywhere (each pass given the highest Seqs of the
    ones before), negative, zero and huge delays (the last ones past int64 sums)."""
    rng = random.Random(sessions * 1000 + per)
    tops: dict[tuple[int, int], int | None] = {}
    for read in _random_rows(rng, sessions, per, delay, passes):
        if not read:
            continue
        read.sort(key=lambda r: (r[0], r[1], r[2]))  # the store's order
        _assert_same(read, tops)
        tops.update(_reference(read, tops)[1])


def test_roll_up_columns_with_seqs_below_the_highest_rolled_before() -> None:
    rows: list[Row] = [(1, 0, i + 1, s, T0 + s * 10**9, T0 + s * 10**9 + 50, T0 + s * 10**9 + 60,
                        T0 + s * 10**9 + 100, EES[0], EES[1])
                       for i, s in enumerate((3, 9, 4, 12, 11, 10))]  # fmt: skip
    _assert_same(rows, {(1, 0): 10})
    _assert_same(rows, {(1, 0): 0})
    _assert_same(rows, {})


def test_roll_up_columns_with_timestamps_too_large_for_int64() -> None:
    big = 2**64 - 10**6
    rows: list[Row] = [(1, 0, 1, 0, big, big + 5, big + 6, big + 9, EES[0], EES[0]),
                       (1, 0, 2, 1, 5, 2**63 + 7, 2**63 + 9, 11, EES[0], EES[0])]  # fmt: skip
    _assert_same(rows, {})


def test_buckets_match_bucket_at_every_edge() -> None:
    """The vectorized bucket keys equal ``_bucket`` next to each bucket's edges."""
    values = [0, 1, -1, 2, 2**62, -(2**62)]
    for key in range(1, 2200):
        edge = int((1.01 / 0.99) ** key)
        values += [edge - 1, edge, edge + 1, -edge]
    values = [v for v in values if abs(v) < 2**62]
    got = _buckets(np.array(values, dtype=np.int64)).tolist()
    assert got == [_bucket(v) for v in values]
