"""The byte budget of the agent's results messages (``sixlab.southbound.budget``): the
sizes it computes are the protobuf encoding's, and a message is cut exactly at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sixlab.southbound._generated import stamp_pb2 as pb
from sixlab.southbound.budget import (
    LOST_MAX_BYTES,
    REPLY_BUDGET_BYTES,
    Batches,
    fit,
    framed,
    inner_budget,
    lost_fitting,
)

U64_MAX = 2**64 - 1


def _record(record_id: int, tlv_bytes: int) -> pb.StampResult:
    return pb.StampResult(
        ssid=7, seq=record_id - 1, t1_ns=1_700_000_000_000_000_000 + record_id,
        t2_ns=1_700_000_000_000_100_000, t3_ns=1_700_000_000_000_120_000,
        t4_ns=1_700_000_000_000_220_000, record_id=record_id, tlvs=bytes(tlv_bytes),
    )  # fmt: skip


def _head() -> pb.GetStampSessionResultsReply:
    return pb.GetStampSessionResultsReply(
        overflow=3,
        state=pb.SESSION_STATE_RUNNING,
        remaining=U64_MAX,
        counters=pb.SessionCounters(ssid=7, sent=1000, received=990, lost=10),
    )


@pytest.mark.parametrize("tlv_bytes", [0, 1, 120, 125, 126, 16_370, 16_380, 2_097_140, 2_097_150])
def test_framed_is_the_encoded_size_of_an_embedded_message(tlv_bytes: int) -> None:
    """Around the lengths where the varint length prefix grows (128, 16384, 2^21)."""
    record = pb.StampResult(tlvs=bytes(tlv_bytes)) if tlv_bytes else pb.StampResult(ssid=1)
    reply = pb.GetStampSessionResultsReply()
    reply.results.append(record)
    assert len(reply.SerializeToString()) == framed(record.ByteSize())


def test_inner_budget_is_the_largest_message_that_fits() -> None:
    rooms = list(range(130)) + [
        r + d for r in (16_386, 2_097_156, REPLY_BUDGET_BYTES) for d in range(-6, 7)
    ]
    for room in rooms:
        inner = inner_budget(room)
        assert inner == 0 or framed(inner) <= room, room
        assert framed(inner + 1) > room, room


@pytest.mark.parametrize("tlv_bytes", [0, 100, 8888])
def test_a_reply_is_cut_exactly_at_the_budget(tlv_bytes: int) -> None:
    """At the budget the record goes in; one byte less and it waits: the reply as sent
    is never larger than the budget, and the first record left out is the cursor's
    next."""
    records = [_record(i, tlv_bytes) for i in range(1, 60)]
    head = _head()
    whole = pb.GetStampSessionResultsReply()
    whole.CopyFrom(head)
    whole.results.extend(records[:40])
    exact = whole.ByteSize()

    taken, size = fit(iter(records), head.ByteSize(), exact)
    assert [r.record_id for r in taken] == list(range(1, 41))
    reply = pb.GetStampSessionResultsReply()
    reply.CopyFrom(head)
    reply.results.extend(taken)
    assert size == len(reply.SerializeToString()) == exact

    taken, size = fit(iter(records), head.ByteSize(), exact - 1)
    assert [r.record_id for r in taken] == list(range(1, 40))
    reply.ClearField("results")
    reply.results.extend(taken)
    assert size == len(reply.SerializeToString()) < exact


def test_fit_asks_a_lazy_source_for_one_record_past_the_cut() -> None:
    asked: list[int] = []

    def source() -> Iterator[pb.StampResult]:
        for i in range(1, 1000):
            asked.append(i)
            yield _record(i, 1000)

    ten = sum(framed(_record(i, 1000).ByteSize()) for i in range(1, 11))
    taken, _ = fit(source(), 0, ten)
    assert len(taken) == 10
    assert asked == list(range(1, 12))


def test_a_nested_batch_is_cut_within_its_parents_budget() -> None:
    """StreamResults: the records of a session's batch fit what the message has left,
    the batch's own tag and length counted."""
    message = pb.ResultBatches()
    message.batches.append(pb.ResultBatch(ssid=1, results=[_record(1, 5000)]))
    budget = 64 << 10
    used = message.ByteSize()
    batch = pb.ResultBatch(ssid=2, state=pb.SESSION_STATE_RUNNING, final=True)
    records = [_record(i, 3000) for i in range(1, 40)]
    taken, size = fit(iter(records), batch.ByteSize(), inner_budget(budget - used))
    added = message.batches.add()
    added.CopyFrom(batch)
    added.results.extend(taken)
    assert added.ByteSize() == size
    assert len(message.SerializeToString()) <= budget
    added.results.append(records[len(taken)])
    assert len(message.SerializeToString()) > budget


def test_loss_reports_have_at_most_half_the_budget_counted_at_their_largest() -> None:
    largest = pb.GetStampSessionResultsReply(
        lost=[pb.LostPacket(seq=2**32 - 1, t1_ns=U64_MAX, loss_id=U64_MAX)]
    )
    assert largest.ByteSize() == LOST_MAX_BYTES
    budget = 64 << 10
    head = _head().ByteSize()
    n = lost_fitting(head, budget)
    assert n == (budget // 2) // LOST_MAX_BYTES
    reply = _head()
    reply.lost.extend(
        pb.LostPacket(seq=2**32 - 1, t1_ns=U64_MAX, loss_id=U64_MAX) for _ in range(n)
    )
    assert reply.ByteSize() <= head + budget // 2
    assert lost_fitting(budget - 100, budget) == 100 // LOST_MAX_BYTES
    assert lost_fitting(budget, budget) == 0


def test_batches_take_a_batch_only_while_the_message_fits() -> None:
    budget = 64 << 10
    out = Batches(budget)
    big = pb.ResultBatch(ssid=1, results=[_record(i, 8000) for i in range(1, 8)])
    assert out.add(big)
    rest = pb.ResultBatch(ssid=2, results=[_record(1, out.room() - 100)])
    fill = out.room() - rest.ByteSize()  # tlvs bytes more make the batch exactly `room`
    rest.results[0].tlvs = bytes(len(rest.results[0].tlvs) + fill)
    assert rest.ByteSize() == out.room()
    assert out.add(rest)
    message = pb.ResultBatches(batches=out.batches)
    assert len(message.SerializeToString()) == out.size <= budget
    assert not out.add(pb.ResultBatch(ssid=3, gone=True))  # the budget is spent
    assert out.room() == 0


def test_sessions_served_go_to_the_back() -> None:
    subs = {1: "a", 2: "b", 3: "c", 4: "d"}
    Batches.to_back(subs, [1, 2])
    assert list(subs) == [3, 4, 1, 2]
    Batches.to_back(subs, [4, 9])  # one no longer streamed
    assert list(subs) == [3, 1, 2, 4]


@pytest.mark.parametrize("tlv_bytes", [0, 120, 8888])
def test_a_batch_is_counted_from_its_head_and_what_fit_counted(tlv_bytes: int) -> None:
    """``Batches.add`` with a size: the batch without its records, encoded as sent (its
    `final` and counters settled after the cut), plus the bytes ``fit`` added, is the
    batch's encoded size; the message's size stays exact."""
    budget = 64 << 10
    out = Batches(budget)
    assert out.add(pb.ResultBatch(ssid=1, gone=True))
    batch = pb.ResultBatch(
        ssid=2, overflow=5, state=pb.SESSION_STATE_FINISHED, final=True,
        counters=pb.SessionCounters(ssid=2, sent=70, received=70),
    )  # fmt: skip
    start = batch.ByteSize()
    taken, grown = fit((_record(i, tlv_bytes) for i in range(1, 60)), start, out.room())
    assert taken
    batch.final = False  # records still waiting: settled once the cut is known
    batch.ClearField("counters")
    size = batch.ByteSize() + grown - start
    batch.results.extend(taken)
    assert size == len(batch.SerializeToString())
    assert out.add(batch, size)
    assert out.size == len(pb.ResultBatches(batches=out.batches).SerializeToString()) <= budget
