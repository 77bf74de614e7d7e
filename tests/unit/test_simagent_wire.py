"""The simulated agent's StreamResults messages encoded all at once (NumPy, straight to
the wire format) are the very bytes of the one-session-at-a-time cut with message
objects, whatever the sessions do; and the steady state takes the first way."""

from __future__ import annotations

import random

import numpy as np
import pytest

from sixlab.southbound._generated import stamp_pb2 as pb
from sixlab.southbound.budget import MIN_REPLY_BUDGET_BYTES, REPLY_BUDGET_BYTES
from sixlab.southbound.simagent import (
    _TAG_BATCHES,
    SimulatedAgentServicer,
    _fields,
    _interleave,
    _StreamState,
    _Sub,
)

T0 = 1_764_000_000_000_000_000
U64_MAX = 2**64 - 1


class _Clock:
    def __init__(self, start: int) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now


class _Counting(SimulatedAgentServicer):
    """Counts the messages cut one session after another."""

    one_by_one = 0

    def _cut(
        self, subs: dict[int, _Sub], max_batch: int, every_ns: int
    ) -> tuple[list[pb.ResultBatch], bool]:
        self.one_by_one += 1
        return super()._cut(subs, max_batch, every_ns)


def _agent(clock: _Clock, *, at_once: bool, loss_every: int, budget: int) -> _Counting:
    agent = _Counting(
        "sender", loss_every=loss_every, fifo_capacity=60, clock=clock, reply_budget=budget
    )
    agent.cuts_at_once = at_once
    agent.Init(pb.InitRequest(), None)
    return agent


def test_fields_encode_varints_as_protobuf_does() -> None:
    """Zeros left out, every varint length from 1 to 10 bytes, a constant between, each
    row framed as an embedded message: protobuf's bytes, row for row."""
    small = [0, 1, 127, 128, 16_383, 16_384, 2**21, 2**28, 2**32 - 1]
    large = [*small, 2**35, 2**42, 2**49, 2**56, 2**63, U64_MAX]
    rng = random.Random(7)
    rows = [(rng.choice(small), rng.choice(large), rng.choice(large)) for _ in range(300)]
    ssid, sent, fetched = (np.array(c, np.uint64) for c in zip(*rows, strict=True))
    constant = pb.SessionCounters(lost=5).SerializeToString()
    data, lengths = _fields(
        [(0x08, ssid), (0x18, sent), constant, (0x68, fetched)], len(rows), frame=0x3A
    )
    pieces = np.split(data, np.cumsum(lengths)[:-1])
    for piece, (a, b, c) in zip(pieces, rows, strict=True):
        counters = pb.SessionCounters(ssid=a, sent=b, lost=5, fetched=c)
        # ResultBatch.counters is field 7 (tag 0x3a): the row framed as it.
        assert piece.tobytes() == pb.ResultBatch(counters=counters).SerializeToString()


def test_framed_rows_with_extra_bytes_interleave_into_a_message() -> None:
    """A head framed to count what follows it, then that, row by row: the message
    protobuf serializes."""
    ssids = np.array([0, 5, 300, 70_000], np.uint64)
    records = [pb.StampResult(seq=i, record_id=i + 1, t1_ns=T0 + i) for i in range(len(ssids) * 2)]
    body = [
        pb.ResultBatch(results=records[2 * k : 2 * k + 2]).SerializeToString()
        for k in range(len(ssids))
    ]
    body_bytes = np.array([len(b) for b in body], np.int64)
    head, head_bytes = _fields([(0x08, ssids)], len(ssids), frame=_TAG_BATCHES, extra=body_bytes)
    message = _interleave(
        [(head, head_bytes), (np.frombuffer(b"".join(body), np.uint8), body_bytes)]
    )
    want = pb.ResultBatches(
        batches=[
            pb.ResultBatch(ssid=int(s), results=records[2 * k : 2 * k + 2])
            for k, s in enumerate(ssids.tolist())
        ]
    )
    assert message == want.SerializeToString()


@pytest.mark.parametrize("loss_every", [0, 7])
@pytest.mark.parametrize("budget", [MIN_REPLY_BUDGET_BYTES, REPLY_BUDGET_BYTES])
def test_messages_cut_at_once_are_the_one_by_one_bytes(loss_every: int, budget: int) -> None:
    """Sessions at several rates, started at different times, a FIFO that overflows,
    cursors behind and ahead of the acknowledgements, a small max_batch, one session
    stopped and one destroyed on the way, backlogs past the budget: message for
    message, the same bytes both ways."""
    rng = random.Random(loss_every * 1000 + budget)
    clock = _Clock(T0)
    fast, slow = agents = [
        _agent(clock, at_once=once, loss_every=loss_every, budget=budget) for once in (True, False)
    ]
    intervals = [5_000_000, 7_000_000, 100_000_000, 250_000_000]
    for ssid in range(1, 121):
        for agent in agents:
            request = pb.CreateStampSessionRequest(ssid=ssid, interval_ns=intervals[ssid % 4])
            agent.CreateStampSession(request, None)
            agent.StartStampSession(pb.StartStampSessionRequest(ssid=ssid), None)
        clock.now += 3_000_000
    after = {ssid: rng.choice([0, 0, 5]) for ssid in range(1, 121)}
    streams = [_StreamState({s: _Sub(a._sessions[s], c) for s, c in after.items()}) for a in agents]
    sent = 0
    for step in range(160):
        clock.now += rng.choice([20_000_000, 250_000_000, 900_000_000])
        if step == 40:
            for agent in agents:
                agent.StopStampSession(pb.StopStampSessionRequest(ssid=3), None)
        if step == 90:
            for agent in agents:
                agent.DestroyStampSession(pb.DestroyStampSessionRequest(ssid=4), None)
        got = [a._message(s, 40, 1_000_000_000) for a, s in zip(agents, streams, strict=True)]
        assert got[0] == got[1], f"step {step}"
        data, _ = got[0]
        assert len(data) <= budget
        sent += len(data)
        # Acknowledge all, part, or nothing of what came.
        acks = {}
        for batch in pb.ResultBatches.FromString(data).batches:
            if batch.results and rng.random() < 0.8:
                ids = [r.record_id for r in batch.results]
                acks[batch.ssid] = rng.choice([ids[-1], ids[len(ids) // 2]])
        for agent in agents:
            agent.AcknowledgeResults(pb.AcknowledgeResultsRequest(through_ids=acks), None)
        session = fast._sessions.get(7)
        assert session is not None
        assert (session.acked, session.overflow, session.fetched) == (
            slow._sessions[7].acked, slow._sessions[7].overflow, slow._sessions[7].fetched,
        )  # fmt: skip
    assert sent > 0
    # Both ways were taken by the first agent; the second cut every message one by one.
    assert 0 < fast.one_by_one < slow.one_by_one
    assert 3 not in streams[0].subs  # final
    assert 4 not in streams[0].subs  # gone


def test_the_steady_state_is_cut_at_once() -> None:
    """1,000 open-ended sessions at 5 pps, read every 250 ms and acknowledged: no
    message is cut one session after another."""
    clock = _Clock(T0)
    agent = _agent(clock, at_once=True, loss_every=0, budget=REPLY_BUDGET_BYTES)
    for ssid in range(1, 1001):
        request = pb.CreateStampSessionRequest(ssid=ssid, interval_ns=200_000_000)
        agent.CreateStampSession(request, None)
        agent.StartStampSession(pb.StartStampSessionRequest(ssid=ssid), None)
        clock.now += 200_000
    stream = _StreamState({ssid: _Sub(agent._sessions[ssid], 0) for ssid in agent._sessions})
    records = 0
    for _ in range(40):
        clock.now += 250_000_000
        data, more = agent._message(stream, 5000, 2_000_000_000)
        assert not more
        acks = {}
        for batch in pb.ResultBatches.FromString(data).batches:
            records += len(batch.results)
            if batch.results:
                acks[batch.ssid] = batch.results[-1].record_id
        agent.AcknowledgeResults(pb.AcknowledgeResultsRequest(through_ids=acks), None)
    assert records > 45_000
    assert agent.one_by_one == 0
