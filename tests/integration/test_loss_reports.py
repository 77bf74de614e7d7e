"""A sender agent's loss reports (``LostPacket``) in cursor mode: they stay queued until
acknowledged, like records, so that a retried call or a call that only wants the state
loses none (stamp.proto ``after_loss_id``). No reflector answers: every probe is lost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sixlab.controller import core
from sixlab.southbound import AgentClient, SenderSession, serve
from sixlab.southbound._generated import stamp_pb2 as pb
from tests.integration.test_agent_grpc import _finished

MS = 1_000_000
COUNT = 20


@pytest.fixture
def client(tmp_path: Path) -> Iterator[AgentClient]:
    """A sender agent whose session 1 sent COUNT probes to a port nothing answers on,
    all declared lost."""
    addr = f"unix:{tmp_path}/s.sock"
    server = serve(addr, "sender")
    c = AgentClient(addr)
    try:
        c.init(port=0, source="::1")
        c.create_sender_session(
            SenderSession(1, "::1", reflector_port=9, count=COUNT, interval_ns=MS,
                          loss_timeout_ns=50 * MS)
        )  # fmt: skip
        c.start_session(1)
        assert _finished(c, 1).lost == COUNT
        yield c
    finally:
        c.close()
        server.stop(None)


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
