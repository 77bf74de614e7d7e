"""A sender agent that sends records out of range (an Error Estimate wider than 16
bits, a TTL past 255) among good ones, over real gRPC to the real controller: every
good record of every session is stored, the bad ones are counted and not stored, and
collection goes on to each session's end (docs/architecture.md, "Records out of
range"), streamed or polled, on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from sixlab.controller import Controller, SessionSpec
from sixlab.controller.store import Store, open_store
from sixlab.southbound import AgentServer
from sixlab.southbound._generated import stamp_pb2 as pb
from sixlab.southbound.simagent import (
    SimulatedAgentServicer,
    add_simulated_to_server,
    serve_simulated,
)

COUNT = 40


def _spoil(r: pb.StampResult) -> None:
    """Records 7 (Error Estimate of 17 bits) and 20 (TTL past 255, and past
    PostgreSQL's SMALLINT) of each session; the last, 40 (both), of odd SSIDs."""
    if r.record_id == 7 or (r.record_id == COUNT and r.ssid % 2):
        r.sender_error_estimate = 0x1_8001
    if r.record_id == 20 or (r.record_id == COUNT and r.ssid % 2):
        r.ses_sender_ttl = 40_000


def _bad(ssid: int) -> set[int]:
    return {7, 20, COUNT} if ssid % 2 else {7, 20}


class _Spoiling(SimulatedAgentServicer):
    """The simulated sender, its records spoiled (``_spoil``) as it sends them."""

    def _stream(self, request: pb.StreamResultsRequest, context: Any) -> Iterator[bytes]:
        for message in super()._stream(request, context):
            m = pb.ResultBatches.FromString(message)
            for b in m.batches:
                for r in b.results:
                    _spoil(r)
            yield m.SerializeToString()

    def GetStampSessionResults(
        self, request: pb.GetStampSessionResultsRequest, context: Any
    ) -> pb.GetStampSessionResultsReply:
        reply: pb.GetStampSessionResultsReply = super().GetStampSessionResults(request, context)
        for r in reply.results:
            _spoil(r)
        return reply


def _serve_spoiling() -> AgentServer:
    servicer = _Spoiling("sender")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    add_simulated_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return AgentServer(server, servicer, int(port))  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    url = str(tmp_path / "c.db") if request.param == "sqlite" else request.getfixturevalue("pg_url")
    s = open_store(url)
    yield s
    s.close()


@pytest.mark.parametrize("collect", ["stream", "poll"])
def test_records_out_of_range_are_refused_and_collection_goes_on(
    store: Store, collect: str
) -> None:
    sender, reflector = _serve_spoiling(), serve_simulated("127.0.0.1:0", "reflector")
    ctl = Controller(store, poll_interval_s=0.05)
    try:
        ctl.register_node("s", f"127.0.0.1:{sender.port}", "sender")
        ctl.register_node("r", f"127.0.0.1:{reflector.port}", "reflector")
        ctl.init_node("s")
        ctl.init_node("r")
        names = [f"p{i}" for i in range(4)]
        for name in names:
            ctl.create_session(
                SessionSpec(name, "s", "r", "2001:db8::2", interval_ns=10_000_000, count=COUNT,
                            loss_timeout_ns=200_000_000, collect=collect)
            )  # fmt: skip
            ctl.start_session(name)
        for name in names:
            assert ctl.wait_finished(name, 30), name
        refused = 0
        for name in names:
            row = ctl.store.session(name)
            bad = _bad(row.ssid)
            refused += len(bad)
            # The simulated sender loses nothing: record id n carries Seq n - 1.
            got = [r.seq for _, r in ctl.store.records(row.id)]
            assert got == [i - 1 for i in range(1, COUNT + 1) if i not in bad], name
            assert row.cursor == COUNT, name  # past the refused last record too
        assert ctl.metrics._refused == {"s": refused}
    finally:
        ctl.close()
        sender.stop(None)
        reflector.stop(None)
