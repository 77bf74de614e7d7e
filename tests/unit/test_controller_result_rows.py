"""The collector's result rows, built straight from the API's records: the same rows,
the same stored results and the same metrics as through ``StampResult``."""

from __future__ import annotations

from pathlib import Path

import pytest

from sixlab.controller.core import _batch, _rows
from sixlab.controller.metrics import ControllerMetrics
from sixlab.controller.store import ResultBatch, SqliteStore, _result_row
from sixlab.southbound import stamp_pb2 as pb
from sixlab.southbound.client import result_from_proto
from sixlab.wire import InvalidFieldError

T = 1_800_000_000_000_000_000


def _records() -> list[pb.StampResult]:
    """Two-way records, one with a flow label, a loopback one, direct-measurement ones
    with and without the last counter, a PTP error estimate."""
    out = []
    for i in range(1, 9):
        t1 = T + i * 100_000_000
        r = pb.StampResult(
            ssid=7, seq=i - 1, t1_ns=t1, t2_ns=t1 + 1_000_000 + i, t3_ns=t1 + 1_100_000,
            t4_ns=t1 + 2_200_000 + 3 * i, sender_error_estimate=0x8001,
            reflector_error_estimate=0xC10A if i == 2 else 0x0001, ses_sender_ttl=60 + i,
            reflector_seq=i + 40, record_id=i,
        )  # fmt: skip
        if i in (3, 4):
            r.flow_label = 0xABCDE + i
        if i == 5:
            r.loopback = True
            r.t2_ns = r.t3_ns = 0
        if i in (6, 7):
            r.data.s_txc, r.data.r_rxc, r.data.r_txc = 100 * i, 99 * i, 98 * i
            if i == 7:
                r.data.s_rxc = 97 * i
        out.append(r)
    return out


def test_rows_are_the_rows_of_the_converted_results() -> None:
    records = _records()
    expected = [_result_row(3, 2, r.record_id, result_from_proto(r)) for r in records]
    assert _rows(3, 2, records) == (expected, [])


def test_a_record_with_an_error_estimate_wider_than_16_bits_is_refused() -> None:
    records = _records()
    expected = [_result_row(3, 2, r.record_id, result_from_proto(r)) for r in records]
    records[4].reflector_error_estimate = 0x1_0001
    rows, bad = _rows(3, 2, records)
    assert (rows, bad) == (expected[:4] + expected[5:], [records[4]])
    with pytest.raises(InvalidFieldError):  # as the conversion refuses it
        result_from_proto(records[4])


@pytest.mark.parametrize(
    ("field", "value"),
    [("record_id", 2**63), ("ses_sender_ttl", 256), ("flow_label", 0x100000),
     ("sender_error_estimate", 0x10000)],
)  # fmt: skip
def test_each_field_past_what_a_stamp_packet_carries_refuses_the_record(
    field: str, value: int
) -> None:
    """Just past the range refused; at its edge (2^63 - 1, 255, 2^20 - 1, 0xFFFF)
    stored."""
    records = _records()
    setattr(records[1], field, value - 1)
    setattr(records[2], field, value)
    rows, bad = _rows(3, 2, records)
    assert bad == [records[2]]
    assert len(rows) == len(records) - 1
    assert [row[2] for row in rows][1] == records[1].record_id


def _state(m: ControllerMetrics) -> tuple[object, ...]:
    return (
        {k: (h.buckets, h.sum) for k, h in m._delay.items()},
        m._jitter,
        m._flow_delay,
        m._data,
        m._last_data,
        m._lag,
        m._last_read,
    )


def test_observe_rows_is_observe_and_collected() -> None:
    records = _records()
    rows, _ = _rows(3, 2, records)
    by_rows, by_results = ControllerMetrics(), ControllerMetrics()
    # Two batches: the data metrics join the second to the first.
    for part in (slice(0, 6), slice(6, None)):
        results = [result_from_proto(r) for r in records[part]]
        by_results.observe("p", results)
        by_results.collected("p", T + 10**9, results)
        by_rows.observe_rows("p", rows[part], T + 10**9)
    by_results.collected("q", T, [])
    by_rows.observe_rows("q", [], T)
    assert _state(by_rows) == _state(by_results)
    assert by_rows._flow_delay  # the records with labels and counters were seen
    assert by_rows._data


def test_a_batch_of_rows_stores_what_a_batch_of_results_stores(tmp_path: Path) -> None:
    records = _records()
    stored = {}
    for how in ("results", "rows"):
        store = SqliteStore(tmp_path / f"{how}.db")
        store.add_node("s", "127.0.0.1:1", "sender")
        store.add_node("r", "127.0.0.1:2", "reflector")
        row = store.add_session("p", 7, sender="s", reflector="r", params={}, now_ns=T)
        store.begin_epoch("p", T)
        row = store.session("p")
        counters = pb.SessionCounters(ssid=7, sent=9, lost=1, schedule_skipped=2)
        if how == "rows":
            batch, _ = _batch(row, records, counters)
        else:
            batch = ResultBatch(
                row.id,
                row.epoch,
                [(r.record_id, result_from_proto(r)) for r in records],
                _batch(row, [], counters)[0].counters,
            )
        assert store.store_many([batch], T + 5) == [len(records)]
        assert store.store_many([batch], T + 6) == [0]  # a repeat is stored once
        stored[how] = (
            store.records(row.id),
            store.session("p").cursor,
            [(e.received, e.sent, e.lost, e.skipped) for e in store.epochs(row.id)],
        )
        store.close()
    assert stored["rows"] == stored["results"]
    assert stored["rows"][1] == len(records)


def test_observe_many_is_observe_rows_of_each_batch() -> None:
    """A transaction's batches observed under one lock (``observe_many``), one-record
    batches by the short way, leave the metrics as ``observe_rows`` of each does."""
    records = _records()
    rows, _ = _rows(3, 2, records)
    # One-record batches of every kind (two-way, labelled, loopback, with data), a
    # batch of several, an empty one; two paths.
    batches = [("p", [row]) for row in rows] + [("q", rows[:4]), ("q", rows[4:]), ("r", [])]
    each, many = ControllerMetrics(), ControllerMetrics()
    for path, part in batches:
        each.observe_rows(path, part, T + 10**9)
    many.observe_many(batches, T + 10**9)
    assert _state(many) == _state(each)
    assert many._delay[("p", "direct")].buckets != [0] * len(many._delay[("p", "direct")].buckets)
