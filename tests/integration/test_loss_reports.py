"""A sender agent's loss reports (``LostPacket``) in cursor mode: they stay queued until
acknowledged, like records, so that a retried call or a call that only wants the state
loses none (stamp.proto ``after_loss_id``). No reflector answers: every probe is lost."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sixlab.controller import core
from sixlab.controller.core import Controller, SessionSpec
from sixlab.controller.store import SqliteStore
from sixlab.southbound import AgentClient, SenderSession, serve
from sixlab.southbound._generated import stamp_pb2 as pb
from sixlab.southbound.budget import MIN_REPLY_BUDGET_BYTES
from tests.integration.test_agent_grpc import _finished

MS = 1_000_000
COUNT = 20


def _lossy_session(client: AgentClient, ssid: int, count: int, interval_ns: int = MS) -> None:
    """Run a session of ``count`` probes to a port nothing answers on, until all are
    declared lost."""
    client.create_sender_session(
        SenderSession(ssid, "::1", reflector_port=9, count=count, interval_ns=interval_ns,
                      loss_timeout_ns=100 * MS)
    )  # fmt: skip
    client.start_session(ssid)
    _finished(client, ssid)


@contextlib.contextmanager
def _sender(tmp_path: Path, **options: Any) -> Iterator[AgentClient]:
    """A sender agent (``serve``'s ``options``) and a client of it, initialised."""
    addr = f"unix:{tmp_path}/s.sock"
    server = serve(addr, "sender", **options)
    c = AgentClient(addr)
    try:
        c.init(port=0, source="::1")
        yield c
    finally:
        c.close()
        server.stop(None)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[AgentClient]:
    """A sender agent whose session 1 sent COUNT probes, all declared lost."""
    with _sender(tmp_path) as c:
        _lossy_session(c, 1, COUNT)
        assert c.counters(1).sessions[0].lost == COUNT
        yield c


def _lost(reply: pb.GetStampSessionResultsReply) -> list[tuple[int, int]]:
    return [(p.loss_id, p.seq) for p in reply.lost]


def test_loss_reports_stay_until_acknowledged(client: AgentClient) -> None:
    every = [(i + 1, i) for i in range(COUNT)]
    # Not acknowledged: a retry (the same call again) gets the same reports.
    assert _lost(client.results(1, after_id=0, after_loss_id=0)) == every
    assert _lost(client.results(1, after_id=0, after_loss_id=0)) == every
    # The controller's stop check wants the state only: it removes none.
    (reply,) = client.call_many("GetStampSessionResults", [core._stop_check_request(1)])
    assert reply.state == pb.SESSION_STATE_FINISHED
    assert _lost(reply) == every
    # Acknowledged through 5 by the next call: those go, the rest stay.
    assert _lost(client.results(1, after_id=0, after_loss_id=5)) == every[5:]
    assert _lost(client.results(1, after_id=0, after_loss_id=5)) == every[5:]
    # ... and through 12 by AcknowledgeStampSessionResults.
    ack = client._call(
        "AcknowledgeStampSessionResults",
        pb.AcknowledgeStampSessionResultsRequest(ssid=1, through_loss_id=12),
    )
    assert (ack.acknowledged, ack.acknowledged_lost) == (0, 7)
    assert _lost(client.results(1, after_id=0, after_loss_id=12)) == every[12:]
    # An id below what went (a caller behind) gets what is left, ids unchanged.
    assert _lost(client.results(1, after_id=0, after_loss_id=3)) == every[12:]
    assert _lost(client.results(1, after_id=0, after_loss_id=COUNT)) == []


def test_without_after_loss_id_the_reports_are_drained(client: AgentClient) -> None:
    """A client that predates ``after_loss_id`` gets each report once, as before, and
    without an id; it drains what cursor-mode callers left."""
    assert _lost(client.results(1, after_id=0, after_loss_id=0))[:2] == [(1, 0), (2, 1)]
    assert _lost(client.results(1, after_loss_id=2)) == [(i + 1, i) for i in range(2, COUNT)]
    assert _lost(client.results(1)) == [(0, i) for i in range(2, COUNT)]
    assert _lost(client.results(1)) == []
    assert _lost(client.results(1, after_id=0, after_loss_id=0)) == []


def _stream_lost(
    client: AgentClient, after_ids: dict[int, int], after_loss_ids: dict[int, int]
) -> dict[int, list[tuple[int, int]]]:
    """Each session's loss reports, (loss_id, seq), on one StreamResults read until every
    session's final batch; every message within the agent's budget."""
    lost: dict[int, list[tuple[int, int]]] = {ssid: [] for ssid in after_ids}
    finals: set[int] = set()
    stream = client.stream_many(after_ids, after_loss_ids=after_loss_ids)
    try:
        for message in stream:
            for batch in message.batches:
                assert batch.ssid not in finals
                lost[batch.ssid] += [(p.loss_id, p.seq) for p in batch.lost]
                if batch.final:
                    finals.add(batch.ssid)
            if finals == set(after_ids):
                break
    finally:
        stream.cancel()
    return lost


def test_stream_results_sends_loss_reports_until_acknowledged(client: AgentClient) -> None:
    every = [(i + 1, i) for i in range(COUNT)]
    _lossy_session(client, 2, 3)
    # Session 1's reports, asked for; session 2 did not ask: none (as before the field).
    assert _stream_lost(client, {1: 0, 2: 0}, {1: 0}) == {1: every, 2: []}
    # The stream removed none: another stream (a reconnect) gets them again, those
    # after the id it holds.
    assert _stream_lost(client, {1: 0}, {1: 0}) == {1: every}
    assert _stream_lost(client, {1: 0}, {1: 5}) == {1: every[5:]}
    acked = client._call(
        "AcknowledgeResults",
        pb.AcknowledgeResultsRequest(through_ids={1: 0}, through_loss_ids={1: 12, 2: 1}),
    )
    assert (dict(acked.acknowledged), dict(acked.acknowledged_lost)) == ({1: 0}, {1: 12, 2: 1})
    assert _stream_lost(client, {1: 0, 2: 0}, {1: 0, 2: 0}) == {
        1: every[12:],
        2: [(2, 1), (3, 2)],
    }
    assert client.acknowledge_many({}, {1: COUNT, 2: 3}) == {}
    assert _lost(client.results(1, after_id=0, after_loss_id=0)) == []
    assert _lost(client.results(2, after_id=0, after_loss_id=0)) == []
    # Every report acknowledged: a stream from an older id has none to wait for.
    assert _stream_lost(client, {1: 0, 2: 0}, {1: 0, 2: 0}) == {1: [], 2: []}


def test_the_stop_checks_reply_is_of_the_smallest_budget(tmp_path: Path) -> None:
    """The controller's stop check keeps the loss reports queued and reads them all the
    same: 5,000 of them (about 150 KB) would take its reply far above the 64 KiB it
    asks for; the reply stays within it, and says the state."""
    with _sender(tmp_path) as c:
        _lossy_session(c, 1, 5000, interval_ns=20_000)
        (reply,) = c.call_many("GetStampSessionResults", [core._stop_check_request(1)])
        assert reply.state == pb.SESSION_STATE_FINISHED
        assert 0 < len(reply.lost) < 5000
        assert reply.ByteSize() <= MIN_REPLY_BUDGET_BYTES
        assert len(c.results(1, after_id=0, after_loss_id=0).lost) == 5000  # none removed


def test_stream_results_cuts_loss_reports_to_its_budget(tmp_path: Path) -> None:
    """Loss reports beyond half of a small budget come over several messages, each
    report once, in order; the session's final batch comes after the last."""
    count = 5000
    sizes: list[int] = []
    lost: list[tuple[int, int]] = []
    with _sender(tmp_path, reply_budget=64 << 10) as c:
        _lossy_session(c, 1, count, interval_ns=20_000)
        stream = c.stream_many({1: 0}, after_loss_ids={1: 0})
        try:
            for message in stream:
                assert message.ByteSize() <= 64 << 10
                sizes.append(len(message.batches[0].lost))
                lost += [(p.loss_id, p.seq) for p in message.batches[0].lost]
                if message.batches[0].final:
                    break
        finally:
            stream.cancel()
    assert lost == [(i + 1, i) for i in range(count)]
    assert len([n for n in sizes if n]) >= 3


def _single_stream_lost(client: AgentClient, after_loss_id: int | None) -> list[tuple[int, int]]:
    """The loss reports a StreamStampSessionResults of session 1 (cursor mode) sends
    until its final batch."""
    lost: list[tuple[int, int]] = []
    stream = client.stream_results(1, after_id=0, after_loss_id=after_loss_id)
    try:
        for batch in stream:
            lost += [(p.loss_id, p.seq) for p in batch.lost]
            if batch.final:
                break
    finally:
        stream.cancel()
    return lost


def test_stream_stamp_session_results_keeps_loss_reports_until_acknowledged(
    client: AgentClient,
) -> None:
    every = [(i + 1, i) for i in range(COUNT)]
    assert _single_stream_lost(client, 0) == every
    assert _single_stream_lost(client, 0) == every  # a stream cut: nothing was removed
    assert _single_stream_lost(client, 5) == every[5:]
    assert client.acknowledge(1, 0, through_loss_id=12) == 0
    assert _single_stream_lost(client, 0) == every[12:]
    # Without after_loss_id, the stream removes what it sends (as before the field).
    assert _single_stream_lost(client, None) == [(0, i) for i in range(12, COUNT)]
    assert _single_stream_lost(client, 0) == []


def test_loss_ids_skip_the_reports_dropped_on_overflow(tmp_path: Path) -> None:
    """A full loss list drops its oldest report (counted in ``overflow``): the ids go
    on, so the gap shows what was dropped."""
    with _sender(tmp_path, fifo_capacity=10) as c:
        _lossy_session(c, 1, 30)
        assert c.counters(1).sessions[0].overflow == 20
        assert _lost(c.results(1, after_id=0, after_loss_id=0)) == [
            (i + 1, i) for i in range(20, 30)
        ]


@pytest.mark.parametrize("collect", ["poll", "stream"])
def test_the_controller_leaves_no_loss_reports_on_the_sender(tmp_path: Path, collect: str) -> None:
    """A controller collecting a lossy session (nothing answers its probes) takes the
    sender's loss reports off it as it goes, by either collection: more losses than the
    sender's FIFO holds pile up nowhere, so ``overflow`` stays 0 (no record was lost) and
    none are queued once the session finished."""
    count = 25
    raddr = f"unix:{tmp_path}/r.sock"
    reflector = serve(raddr, "reflector")
    ctl = Controller(SqliteStore(tmp_path / "c.db"), poll_interval_s=0.1)
    with _sender(tmp_path, fifo_capacity=10) as sender:
        try:
            ctl.register_node("s", f"unix:{tmp_path}/s.sock", "sender")  # initialised
            ctl.register_node("r", raddr, "reflector")
            ctl.init_node("r", source="::1", port=0)
            ctl.create_session(
                SessionSpec(name="p", sender="s", reflector="r", reflector_address="::1",
                            reflector_port=9, interval_ns=100 * MS, count=count,
                            loss_timeout_ns=100 * MS, collect=collect)
            )  # fmt: skip
            ctl.start_session("p")
            assert ctl.wait_finished("p", 30)
            ssid = ctl.store.session("p").ssid
            (counters,) = sender.counters(ssid).sessions
            assert (counters.lost, counters.overflow) == (count, 0)
            assert _lost(sender.results(ssid, after_id=0, after_loss_id=0)) == []
            assert ctl.store.session("p").lost == count
        finally:
            ctl.close()
            reflector.stop(None)
