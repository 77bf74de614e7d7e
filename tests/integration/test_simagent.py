"""The simulated agent behind the real controller: exactly the records its schedule makes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from sixlab.controller import Controller, SessionSpec
from sixlab.controller.store import SqliteStore
from sixlab.southbound import AgentClient, AgentServer, SenderSession
from sixlab.southbound._generated import stamp_pb2 as pb
from sixlab.southbound._generated import stamp_pb2_grpc as pb_grpc
from sixlab.southbound.agentinfo import ssids_digest
from sixlab.southbound.simagent import SimulatedAgentServicer, record_times, serve_simulated


@pytest.fixture
def sim_pair() -> Iterator[tuple[AgentServer, AgentServer]]:
    sender = serve_simulated("127.0.0.1:0", "sender", loss_every=10)
    reflector = serve_simulated("127.0.0.1:0", "reflector")
    try:
        yield sender, reflector
    finally:
        sender.stop(None)
        reflector.stop(None)


@pytest.mark.parametrize("collect", ["stream", "poll"])
def test_controller_collects_every_simulated_record_once(
    sim_pair: tuple[AgentServer, AgentServer], tmp_path: Path, collect: str
) -> None:
    sender, reflector = sim_pair
    ctl = Controller(SqliteStore(tmp_path / "c.db"), poll_interval_s=0.05)
    try:
        ctl.register_node("s", f"127.0.0.1:{sender.port}", "sender")
        ctl.register_node("r", f"127.0.0.1:{reflector.port}", "reflector")
        ctl.init_node("s")
        ctl.init_node("r")
        names = [f"p{i}" for i in range(20)]
        for name in names:
            ctl.create_session(
                SessionSpec(name, "s", "r", "2001:db8::2", interval_ns=10_000_000, count=50,
                            loss_timeout_ns=200_000_000, collect=collect)
            )  # fmt: skip
            ctl.start_session(name)
        for name in names:
            assert ctl.wait_finished(name, 30)
        for name in names:
            row = ctl.store.session(name)
            records = ctl.store.records(row.id)
            # Seqs 9, 19, 29, 39, 49 are lost (every 10th): 45 records, in Seq order.
            assert [r.seq for _, r in records] == [s for s in range(50) if s % 10 != 9]
            assert (row.sent, row.lost) == (50, 5)
            first = records[0][1]
            assert (first.t1_ns, first.t2_ns, first.t3_ns, first.t4_ns) == record_times(
                first.t1_ns, 0
            )
            assert records[1][1].t1_ns - first.t1_ns == 10_000_000
    finally:
        ctl.close()


def _collection_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("collect-", "poll-",
                                                                         "stream-"))]  # fmt: skip


@pytest.mark.parametrize("collect", ["stream", "poll"])
def test_collection_takes_a_thread_per_sender_agent_not_per_session(
    sim_pair: tuple[AgentServer, AgentServer], tmp_path: Path, collect: str
) -> None:
    sender, reflector = sim_pair
    other = serve_simulated("127.0.0.1:0", "sender")
    ctl = Controller(SqliteStore(tmp_path / "c.db"), poll_interval_s=0.05)
    try:
        assert _collection_threads() == []
        ctl.register_node("s", f"127.0.0.1:{sender.port}", "sender")
        ctl.register_node("s2", f"127.0.0.1:{other.port}", "sender")
        ctl.register_node("r", f"127.0.0.1:{reflector.port}", "reflector")
        for node in ("s", "s2", "r"):
            ctl.init_node(node)
        specs = [
            SessionSpec(f"p{i}", "s" if i % 2 else "s2", "r", "2001:db8::2",
                        interval_ns=20_000_000, loss_timeout_ns=200_000_000, collect=collect)
            for i in range(40)
        ]  # fmt: skip
        _, errors = ctl.create_sessions(specs)
        assert not errors
        assert not ctl.start_sessions([s.name for s in specs])
        deadline = time.monotonic() + 30
        while not all(ctl.store.session(s.name).cursor > 10 for s in specs):
            assert time.monotonic() < deadline, "results not collected"
            time.sleep(0.1)
        # 40 running sessions on two sender agents: two collecting threads (a stream's
        # reader besides each).
        readers = ["stream-read-s", "stream-read-s2"] if collect == "stream" else []
        assert sorted(_collection_threads()) == sorted([*readers, f"{collect}-s", f"{collect}-s2"])
        for spec in specs:
            ctl.stop_session(spec.name)
        for spec in specs:
            assert ctl.wait_finished(spec.name, 30)
        for spec in specs:
            row = ctl.store.session(spec.name)
            seqs = [r.seq for _, r in ctl.store.records(row.id)]
            # Every record once; the first sender loses every 10th Seq (``sim_pair``).
            every = 10 if spec.sender == "s" else 0
            assert seqs == [s for s in range(row.sent) if not every or s % every != every - 1]
    finally:
        ctl.close()
        other.stop(None)
    assert _collection_threads() == []


def test_simulated_agent_counts_overflow_past_its_fifo() -> None:
    server = serve_simulated("127.0.0.1:0", "sender", fifo_capacity=10)
    client = AgentClient(f"127.0.0.1:{server.port}")
    try:
        client.init()
        client.create_sender_session(SenderSession(1, "2001:db8::2", interval_ns=1_000_000))
        client.start_session(1)
        time.sleep(0.1)
        reply = client.results(1, 5, after_id=0)
        assert len(reply.results) == 5
        assert reply.overflow > 0
        assert reply.results[0].record_id == reply.overflow + 1
        assert reply.counters.overflow == reply.overflow
    finally:
        client.close()
        server.stop(None)


def test_simulated_agent_answers_without_ssids_and_acknowledges_without_counts() -> None:
    """As the agent does: GetAgentInfo without the list (count and digest only), and an
    acknowledgement not asked for its counts removes the records with an empty reply."""
    server = serve_simulated("127.0.0.1:0", "sender")
    client = AgentClient(f"127.0.0.1:{server.port}")
    try:
        client.init()
        for ssid in (2, 1):
            client.create_sender_session(SenderSession(ssid, "2001:db8::2", interval_ns=10**6))
        short = client.info(ssids=False)
        assert list(short.ssids) == []
        assert (short.ssid_count, short.ssids_digest) == (2, ssids_digest([1, 2]))
        assert list(client.info().ssids) == [1, 2]
        client.start_session(1)
        time.sleep(0.05)
        top = client.results(1, 5, after_id=0).results[-1].record_id
        assert client.acknowledge_many({1: top}, counts=False) == {}
        assert client.results(1, 1, after_id=0).results[0].record_id == top + 1
    finally:
        client.close()
        server.stop(None)


def test_sessions_are_created_and_started_in_batches(
    sim_pair: tuple[AgentServer, AgentServer], tmp_path: Path
) -> None:
    sender, reflector = sim_pair
    ctl = Controller(SqliteStore(tmp_path / "c.db"), supervise_interval_s=None)
    try:
        ctl.register_node("s", f"127.0.0.1:{sender.port}", "sender")
        ctl.register_node("r", f"127.0.0.1:{reflector.port}", "reflector")
        ctl.init_node("s")
        ctl.init_node("r")
        ctl.create_session(SessionSpec("old", "s", "r", "2001:db8::2"))

        def spec(name: str, **kw: Any) -> SessionSpec:
            return SessionSpec(name, kw.pop("sender", "s"), "r", "2001:db8::2",
                               interval_ns=kw.pop("interval_ns", 20_000_000), count=10,
                               loss_timeout_ns=100_000_000, collect="stream", **kw)  # fmt: skip

        specs = [spec(f"p{i}") for i in range(300)]
        specs += [
            spec("old"),  # taken
            spec("p7"),  # listed twice
            spec("nowhere", sender="r"),  # a reflector as sender
            spec("too-fast", interval_ns=10),  # the agent refuses it: its reflector half goes
        ]
        rows, errors = ctl.create_sessions(specs)
        assert [r.name for r in rows] == [f"p{i}" for i in range(300)]
        assert sorted(errors) == ["nowhere", "old", "p7", "too-fast"]
        assert "already exists" in str(errors["old"])
        assert "is a reflector" in str(errors["nowhere"])
        ssids = {r.ssid for r in rows} | {ctl.store.session("old").ssid}
        assert len(ssids) == 301  # every SSID distinct on the pair of nodes
        info = AgentClient(f"127.0.0.1:{reflector.port}")
        try:
            assert set(info.info().ssids) == ssids  # not the refused session's
        finally:
            info.close()

        errors = ctl.start_sessions([*(f"p{i}" for i in range(300)), "missing"])
        assert list(errors) == ["missing"]
        for i in range(300):
            assert ctl.wait_finished(f"p{i}", 30)
        for row in ctl.store.sessions():
            if row.name.startswith("p"):
                assert ctl.store.count_results(row.id) == 9  # Seq 9 lost (loss_every=10)
                assert [e.epoch for e in ctl.store.epochs(row.id)] == [0]
    finally:
        ctl.close()


def test_simulated_agent_cuts_its_messages_at_the_byte_budget() -> None:
    """As the real agent: 30 sessions × 2000 records queued, a 64 KiB budget; every
    message within it, every record once, sessions left out by one message first in
    the next."""
    budget = 64 << 10
    server = serve_simulated("127.0.0.1:0", "sender", reply_budget=budget)
    client = AgentClient(f"127.0.0.1:{server.port}")
    try:
        client.init()
        ssids = range(1, 31)
        for ssid in ssids:
            client.create_sender_session(
                SenderSession(ssid, "2001:db8::2", interval_ns=10_000, count=2000)
            )
            client.start_session(ssid)
        time.sleep(0.2)  # the simulated delay is a few ms: every record has arrived
        reply = client.results(1, 10_000, after_id=0)
        assert 0 < len(reply.results) < 2000
        assert reply.ByteSize() <= budget
        ids: dict[int, list[int]] = {ssid: [] for ssid in ssids}
        finals: set[int] = set()
        stream = client.stream_many(dict.fromkeys(ssids, 0), max_batch=100_000)
        for message in stream:
            assert message.ByteSize() <= budget
            for batch in message.batches:
                ids[batch.ssid] += [r.record_id for r in batch.results]
                if batch.final:
                    finals.add(batch.ssid)
            if finals == set(ssids):
                break
        stream.cancel()
        assert ids == {ssid: list(range(1, 2001)) for ssid in ssids}
    finally:
        client.close()
        server.stop(None)


def test_a_stream_sent_as_bytes_carries_what_message_objects_carry() -> None:
    """``serve_simulated`` sends StreamResults messages as the servicer serialized
    them; the same servicer registered the generated way sends message objects: over
    gRPC both streams carry every record of each session once, as its schedule makes
    them, in order (open-ended sessions: the messages encoded all at once)."""
    as_bytes = serve_simulated("127.0.0.1:0", "sender", loss_every=5)
    servicer = SimulatedAgentServicer("sender", loss_every=5)
    plain = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_StampAgentServicer_to_server(servicer, plain)  # type: ignore[no-untyped-call]
    port = plain.add_insecure_port("127.0.0.1:0")
    plain.start()
    assert as_bytes.servicer.sends_bytes  # type: ignore[attr-defined]
    assert not servicer.sends_bytes
    try:
        for address in (f"127.0.0.1:{as_bytes.port}", f"127.0.0.1:{port}"):
            client = AgentClient(address)
            try:
                client.init()
                for ssid in range(1, 41):
                    client.create_sender_session(
                        SenderSession(ssid, "2001:db8::2", interval_ns=1_000_000)
                    )
                    client.start_session(ssid)
                records: dict[int, list[pb.StampResult]] = {ssid: [] for ssid in range(1, 41)}
                stream = client.stream_many(dict.fromkeys(records, 0), batch_window_ns=10**7)
                for message in stream:
                    assert isinstance(message, pb.ResultBatches)
                    for batch in message.batches:
                        records[batch.ssid] += batch.results
                    if min(len(got) for got in records.values()) >= 240:
                        break
                stream.cancel()
                for ssid, got in records.items():
                    # Every 5th Seq lost: ids 1, 2, ... in Seq order.
                    assert [r.record_id for r in got] == list(range(1, len(got) + 1)), address
                    assert [r.seq for r in got[:240]] == [s for s in range(300) if s % 5 != 4]
                    for r in got:
                        assert r.ssid == ssid
                        assert (r.t1_ns, r.t2_ns, r.t3_ns, r.t4_ns) == record_times(r.t1_ns, r.seq)
                        assert (r.reflector_seq, r.ses_sender_ttl) == (r.seq, 255)
            finally:
                client.close()
    finally:
        as_bytes.stop(None)
        plain.stop(None)
