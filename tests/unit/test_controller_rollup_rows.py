"""``Fold.rows`` (the rollup rows from arrays, merged with the stored ones) gives what the
reference gives: each stored row's ``MinuteRollup``, ``merge`` of the fresh one into it,
``_rollup_row`` of the result; field by field, on random reads and on both stores."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from sixlab.controller.rollup import (
    MINUTE_NS,
    DelayHistogram,
    Fold,
    _decode,
    _encode,
    _Entries,
    fold_columns,
    roll_up_columns,
)
from sixlab.controller.store import (
    _SELECT_ROLLUPS,
    ROLLUP_COLUMNS,
    ResultBatch,
    Store,
    _rollup,
    _rollup_row,
)
from sixlab.wire.timestamp import ErrorEstimate

T0 = 1_700_000_000 * 10**9 // MINUTE_NS * MINUTE_NS
Row = tuple[int, ...]
Key = tuple[int, int, int]
EES = [ErrorEstimate(scale=s, multiplier=m).to_int() for s, m in
       ((10, 3), (0, 1), (32, 255), (40, 255), (20, 0))]  # fmt: skip


def random_reads(
    rng: random.Random, sessions: int, per: int, delay: int, passes: int
) -> list[list[Row]]:
    """Records (``fold_columns``' ten columns) of ``sessions`` sessions, one or two epochs
    each, Seqs with gaps and duplicates arriving out of order, over a few minutes, split
    into ``passes`` reads in the store's order."""
    reads: list[list[Row]] = [[] for _ in range(passes)]
    for sid in range(1, sessions + 1):
        for ep in range(rng.randint(1, 2)):
            seqs = sorted(rng.sample(range(3 * per), per))
            seqs += rng.choices(seqs, k=per // 10)
            rng.shuffle(seqs)
            spacing = rng.choice((10**9, 7 * 10**9, 25 * 10**9))
            rid = 0
            for chunk, read in enumerate(reads):
                for seq in seqs[chunk * len(seqs) // passes : (chunk + 1) * len(seqs) // passes]:
                    rid += 1
                    t1 = T0 + seq * spacing
                    d = rng.choice((0, rng.randint(-delay, delay), delay, -delay))
                    b = rng.choice((0, rng.randint(-delay, delay), rng.randint(0, delay)))
                    res = rng.randint(0, 1000)
                    read.append((sid, ep, rid, seq, t1, t1 + d, t1 + d + res,
                                 t1 + d + res + b, rng.choice(EES), rng.choice(EES)))  # fmt: skip
    for read in reads:
        read.sort(key=lambda r: (r[0], r[1], r[2]))
    return reads


def _reference_rows(
    columns: list[tuple[int, ...]], tops: dict[tuple[int, int], int | None], stored: dict[Key, Row]
) -> list[Row]:
    fresh, _ = roll_up_columns(columns, tops)
    out = []
    for key, m in fresh.items():
        total = m
        if key in stored:
            total = _rollup(stored[key])
            total.merge(m)
        out.append(_rollup_row(key[0], key[1], total))
    return out


def _fold(columns: list[tuple[int, ...]], tops: dict[tuple[int, int], int | None]) -> Fold:
    fold = fold_columns(columns, tops)
    assert fold is not None
    return fold


@pytest.mark.parametrize(
    ("sessions", "per", "delay", "passes"),
    [(200, 2, 10**6, 1), (30, 60, 10**9, 3), (5, 300, 2**40, 4), (40, 20, 1, 3), (8, 90, 50, 5)],
)
def test_rows_equal_the_reference_merge_pass_after_pass(
    sessions: int, per: int, delay: int, passes: int
) -> None:
    """Every pass after the first merges into rows the passes before stored."""
    rng = random.Random(sessions * 7 + per)
    tops: dict[tuple[int, int], int | None] = {}
    stored: dict[Key, Row] = {}
    merged = 0
    for read in random_reads(rng, sessions, per, delay, passes):
        if not read:
            continue
        columns = list(zip(*read, strict=True))
        fold = _fold(columns, tops)
        expected = _reference_rows(columns, tops, stored)
        got = fold.rows([stored[k] for k in fold.keys if k in stored])
        assert got is not None
        assert got == expected
        for r in got:  # Python ints and bytes, as the reference's
            assert all(type(v) in (int, bytes) for v in r)
        merged += sum(k in stored for k in fold.keys)
        stored.update({(r[0], r[1], r[2]): r for r in got})
        tops.update(fold.tops)
    assert merged or passes == 1


Tops = dict[tuple[int, int], int | None]


def _one_read() -> tuple[list[tuple[int, ...]], Tops, Fold, dict[Key, Row]]:
    """A read of 3 sessions, and rows stored for each of its minutes (by the reference)."""
    rng = random.Random(5)
    first, second = random_reads(rng, 3, 40, 10**6, 2)
    columns = list(zip(*first, strict=True))
    tops = _fold(columns, {}).tops
    stored = {(r[0], r[1], r[2]): r for r in _reference_rows(columns, {}, {})}
    columns = list(zip(*second, strict=True))
    return columns, tops, _fold(columns, tops), stored


def _with(row: Row, column: str, value: Any) -> Row:
    i = ROLLUP_COLUMNS.index(column)
    return (*row[:i], value, *row[i + 1 :])


def test_a_stored_row_without_an_error_bound_takes_the_fresh_one() -> None:
    columns, tops, fold, stored = _one_read()
    stored = {k: _with(r, "max_error_ns", None) for k, r in stored.items()}
    got = fold.rows([stored[k] for k in fold.keys if k in stored])
    assert got == _reference_rows(columns, tops, stored)


def test_stored_histograms_with_empty_buckets_merge_as_the_reference() -> None:
    columns, tops, fold, stored = _one_read()
    for k, r in stored.items():
        h = DelayHistogram.from_bytes(bytes(r[ROLLUP_COLUMNS.index("rtt_hist")]))
        h.counts[min(h.counts) - 3] = 0
        h.counts[max(h.counts) + 2] = 0
        stored[k] = _with(r, "rtt_hist", h.to_bytes())
    got = fold.rows([stored[k] for k in fold.keys if k in stored])
    assert got == _reference_rows(columns, tops, stored)


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("direct_hist", None),  # a direction of no records
        ("direct_hist", b""),
        ("return_hist", b"\x02\x81"),  # truncated varint
        ("return_hist", b"\x02\x01\x04"),  # an odd number of varints
        ("rtt_hist", b"\x02\x00"),  # buckets of no records
        ("rtt_hist", b"\x04\x01\x00\x01"),  # a key twice
        ("rtt_hist", b"\x04\x01\x03\x01"),  # keys descending
        ("direct_hist", DelayHistogram({3000: 1}).to_bytes()),  # a key past int64
        ("direct_sum", 2**62),
        ("lost", None),
        ("count", 2**63 - 1),
    ],
)
def test_stored_rows_the_arrays_do_not_take_are_left_to_the_reference(
    column: str, value: Any
) -> None:
    _, _, fold, stored = _one_read()
    key = fold.keys[1]
    stored[key] = _with(stored[key], column, value)
    assert fold.rows([stored[k] for k in fold.keys if k in stored]) is None
    # The others alone are taken.
    assert fold.rows([stored[k] for k in fold.keys if k in stored and k != key]) is not None


def test_histograms_encode_and_decode_as_to_bytes_and_from_bytes() -> None:
    rng = random.Random(3)
    hists = [DelayHistogram({k: rng.randint(0, 2**35) for k in
                             rng.sample(range(-2180, 2181), rng.randint(1, 40))})
             for _ in range(300)]  # fmt: skip
    entries = [(i, k, n) for i, h in enumerate(hists) for k, n in sorted(h.counts.items())]
    minute, key, count = (np.array(c, dtype=np.int64) for c in zip(*entries, strict=True))
    blobs = _encode(_Entries(minute, key, count), len(hists))
    assert blobs == [h.to_bytes() for h in hists]
    at = np.arange(100, 100 + len(hists), dtype=np.int64)
    decoded = _decode(blobs, at)
    assert decoded is not None
    assert decoded.minute.tolist() == (minute + 100).tolist()
    assert decoded.key.tolist() == key.tolist()
    assert decoded.count.tolist() == count.tolist()


# -- the store's pass (tests/unit/test_controller_store_backends.py, both stores) ----------


def fill_and_roll_up(store: Store, reads: list[list[Row]], limit: int) -> list[tuple[Any, ...]]:
    """Store the reads epoch by epoch (nodes s1 and r1 added before; each session's
    epoch begun first), rolling up in passes of ``limit`` records after each read; every
    rollup row, histograms as bytes."""
    sids = sorted({r[0] for read in reads for r in read})
    rows = store.add_sessions([(f"p{s}", s, "s1", "r1", {}) for s in sids], now_ns=0)
    ids = {s: row.id for s, row in zip(sids, rows, strict=True)}
    for epoch in range(max(r[1] for read in reads for r in read) + 1):
        for s in sids:
            assert store.begin_epoch(f"p{s}", 1) == epoch
        for read in reads:
            batches: dict[int, list[tuple[Any, ...]]] = {}
            for r in read:
                if r[1] == epoch:
                    batches.setdefault(r[0], []).append(
                        (ids[r[0]], *r[1:], 64, r[3], None, 0, None, None, None, None)
                    )
            done = store.store_many([ResultBatch(ids[s], epoch, (), None, b) for s, b in
                                     batches.items()])  # fmt: skip
            assert all(n is not None for n in done)
            while store.roll_up(limit=limit) == limit:
                pass
    with store._lock:
        out = store._db.execute(_SELECT_ROLLUPS + " ORDER BY session_id, epoch, minute_ns")
        return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r)
                for r in out.fetchall()]  # fmt: skip
