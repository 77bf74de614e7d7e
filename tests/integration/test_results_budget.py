"""Results larger than gRPC's 4 MiB message limit in one go (records carrying large TLVs,
RFC 8972 §4.1 Extra Padding): the agent cuts every results message at its byte budget
and the rest comes next, so everything is read exactly once.

Real agents in this process (gRPC on unix sockets or ::1, socket plane on ::1); for the
controller's polling of a session that fell behind, simulated agents whose records carry
the same padding.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sixlab.controller import core
from sixlab.controller.core import Controller, SessionSpec
from sixlab.controller.store import SqliteStore
from sixlab.southbound import (
    AgentClient,
    AgentServer,
    ReflectorSession,
    SenderSession,
    SouthboundError,
    serve,
    simagent,
)
from sixlab.southbound._generated import stamp_pb2 as pb
from sixlab.southbound.agent import MAX_RESULTS
from sixlab.southbound.budget import (
    MIN_REPLY_BUDGET_BYTES,
    RECEIVE_LIMIT_BYTES,
    REPLY_BUDGET_BYTES,
)
from sixlab.wire.stamp_tlv import ExtraPadding
from tests.integration.test_agent_grpc import _finished

MS = 1_000_000
#: An Extra Padding TLV of 8000 bytes: records of about 8 KB, the reflector copies it.
PADDING = ExtraPadding(bytes(8000 - 4)).to_tlv().encode()
#: Records queued at once: 800 × 8 KB = 6.4 MB, more than one 4 MiB message holds.
COUNT = 800


@dataclass
class Agents:
    sender: AgentClient
    reflector: AgentClient
    reflector_port: int


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    saddr, raddr = f"unix:{tmp_path}/s.sock", f"unix:{tmp_path}/r.sock"
    servers: list[AgentServer] = [serve(saddr, "sender"), serve(raddr, "reflector")]
    sender, reflector = AgentClient(saddr), AgentClient(raddr)
    try:
        sender.init(port=0, source="::1")
        rport = reflector.init(port=0, source="::1")
        yield Agents(sender, reflector, rport)
    finally:
        sender.close()
        reflector.close()
        for server in servers:
            server.stop(None)


def _run_padded(a: Agents, ssid: int = 1) -> int:
    """Run a padded session to its end; how many records it queued (a loaded machine
    may skip a send slot, so the Seqs are checked for what was sent)."""
    a.reflector.create_reflector_session(ReflectorSession(ssid))
    a.reflector.start_session(ssid)
    a.sender.create_sender_session(
        SenderSession(
            ssid, "::1", reflector_port=a.reflector_port, count=COUNT, interval_ns=MS,
            loss_timeout_ns=2000 * MS, tlvs=PADDING,
        )
    )  # fmt: skip
    a.sender.start_session(ssid)
    counters = _finished(a.sender, ssid)
    assert counters.received == counters.sent == counters.queued
    assert counters.queued * len(PADDING) > RECEIVE_LIMIT_BYTES
    return counters.queued


def test_polling_reads_more_than_4_mib_in_replies_within_the_budget(agents: Agents) -> None:
    n = _run_padded(agents)
    ids: list[int] = []
    replies = 0
    cursor = 0
    while True:
        reply = agents.sender.results(1, MAX_RESULTS, after_id=cursor)
        replies += 1
        assert reply.ByteSize() <= REPLY_BUDGET_BYTES
        if not reply.results:
            break
        assert all(len(r.tlvs) == len(PADDING) for r in reply.results)
        ids += [r.record_id for r in reply.results]
        cursor = ids[-1]
    assert ids == list(range(1, n + 1))
    assert replies >= 3  # cut by the budget, not by max_results


@pytest.mark.parametrize("max_bytes", [1, 200_000])
def test_polling_replies_within_the_asked_max_bytes(agents: Agents, max_bytes: int) -> None:
    """A request's ``max_bytes`` below the budget cuts the reply there (below 64 KiB:
    at 64 KiB); every record still comes once."""
    n = _run_padded(agents)
    limit = max(max_bytes, MIN_REPLY_BUDGET_BYTES)
    ids: list[int] = []
    cursor = 0
    while True:
        request = pb.GetStampSessionResultsRequest(
            ssid=1, max_results=MAX_RESULTS, after_id=cursor, max_bytes=max_bytes
        )
        (reply,) = agents.sender.call_many("GetStampSessionResults", [request])
        assert reply.ByteSize() <= limit
        if not reply.results:
            break
        assert reply.ByteSize() > limit - 2 * len(PADDING) or not reply.remaining
        ids += [r.record_id for r in reply.results]
        cursor = ids[-1]
    assert ids == list(range(1, n + 1))


def test_drain_mode_reads_everything_once(agents: Agents) -> None:
    n = _run_padded(agents)
    seqs: list[int] = []
    while True:
        reply = agents.sender.results(1, MAX_RESULTS)
        assert reply.ByteSize() <= REPLY_BUDGET_BYTES
        seqs += [r.seq for r in reply.results]
        if reply.remaining == 0:
            break
        assert reply.results
    assert len(seqs) == len(set(seqs)) == n
    assert seqs == sorted(seqs)


@pytest.mark.parametrize("after_id", [None, 0])
def test_one_session_stream_cuts_its_batches(agents: Agents, after_id: int | None) -> None:
    n = _run_padded(agents)
    seqs: list[int] = []
    stream = agents.sender.stream_results(1, max_batch=100_000, after_id=after_id)
    for batch in stream:
        assert batch.ByteSize() <= REPLY_BUDGET_BYTES
        seqs += [r.seq for r in batch.results]
        if batch.final:
            break
    stream.cancel()
    assert len(seqs) == len(set(seqs)) == n
    assert seqs == sorted(seqs)


def test_stream_results_cuts_its_messages(agents: Agents) -> None:
    """Two sessions of 6.4 MB each on one StreamResults: every message within the
    budget, both sessions complete, each record once."""
    n = {1: _run_padded(agents, 1), 2: _run_padded(agents, 2)}
    ids: dict[int, list[int]] = {1: [], 2: []}
    finals: set[int] = set()
    stream = agents.sender.stream_many({1: 0, 2: 0}, max_batch=100_000)
    for message in stream:
        assert message.ByteSize() <= REPLY_BUDGET_BYTES
        for batch in message.batches:
            ids[batch.ssid] += [r.record_id for r in batch.results]
            if batch.final:
                finals.add(batch.ssid)
        if finals == {1, 2}:
            break
    stream.cancel()
    assert ids == {ssid: list(range(1, n[ssid] + 1)) for ssid in (1, 2)}


def test_loss_reports_are_cut_and_all_come(tmp_path: Path) -> None:
    """No reflector: every probe is lost; the loss reports exceed half a small budget
    and come over several replies, each Seq once."""
    addr = f"unix:{tmp_path}/s.sock"
    server = serve(addr, "sender", reply_budget=64 << 10)
    client = AgentClient(addr)
    try:
        client.init(port=0, source="::1")
        count = 5000
        client.create_sender_session(
            SenderSession(1, "::1", reflector_port=9, count=count, interval_ns=20_000,
                          loss_timeout_ns=100 * MS)
        )  # fmt: skip
        client.start_session(1)
        _finished(client, 1)
        lost: list[int] = []
        replies = 0
        while True:
            reply = client.results(1)
            assert reply.ByteSize() <= 64 << 10
            if not reply.lost:
                break
            replies += 1
            lost += [p.seq for p in reply.lost]
        assert sorted(lost) == list(range(count))
        assert replies >= 3
    finally:
        client.close()
        server.stop(None)


@pytest.mark.parametrize("collect", ["poll", "stream"])
def test_controller_collects_more_than_4_mib_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collect: str
) -> None:
    """The controller (which has no TLV option of its own) sends sessions carrying 8 KB
    of padding; its collection starts once more than 4 MiB is queued."""
    real = core._sender_request

    def padded(spec: SessionSpec, ssid: int) -> pb.CreateStampSessionRequest:
        request = real(spec, ssid)
        request.tlvs = PADDING
        return request

    monkeypatch.setattr(core, "_sender_request", padded)
    saddr, raddr = f"unix:{tmp_path}/s.sock", f"unix:{tmp_path}/r.sock"
    servers = [serve(saddr, "sender"), serve(raddr, "reflector")]
    sender = AgentClient(saddr)
    db = tmp_path / "c.db"
    c1 = Controller(SqliteStore(db), poll_interval_s=60)
    # c1 collects nothing, so that the records pile up on the agent: a stream opened at
    # the start could otherwise read them all before c1 closes (seen on a loaded host).
    monkeypatch.setattr(c1, "_start_collector", lambda name: None)
    monkeypatch.setattr(c1, "_start_collectors", lambda rows: None)
    c2: Controller | None = None
    try:
        c1.register_node("s", saddr, "sender")
        c1.register_node("r", raddr, "reflector")
        c1.init_node("s", source="::1", port=0)
        c1.init_node("r", source="::1", port=0)
        spec = SessionSpec(
            name="p", sender="s", reflector="r", reflector_address="::1",
            reflector_port=c1.client("r").info().port, interval_ns=MS, count=COUNT,
            loss_timeout_ns=2000 * MS, collect=collect,
        )  # fmt: skip
        row = c1.create_session(spec)
        c1.start_session("p")
        c1.close()
        counters = _finished(sender, row.ssid)
        assert counters.queued * len(PADDING) > RECEIVE_LIMIT_BYTES
        c2 = Controller(SqliteStore(db), poll_interval_s=0.05)
        assert c2.resume() == ["p"]
        assert c2.wait_finished("p", 60)
        stored = c2.store.session("p")
        ids = sorted(c2.store.record_ids(stored.id))
        # Each once, none missing (a loaded machine may skip a send slot: what arrived).
        assert ids == [(ids[0][0], i) for i in range(1, counters.received + 1)]
        seqs = sorted(r.seq for r in c2.store.results(stored.id))
        assert len(seqs) == len(set(seqs)) == counters.received
    finally:
        if c2 is not None:
            c2.close()
        sender.close()
        for server in servers:
            server.stop(None)


#: Records of a simulated session padded like ``PADDING``: 2000 × 8 KB, about six
#: replies of the 3 MiB budget.
SIM_COUNT = 2000


@pytest.fixture
def padded_sim(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[AgentServer, AgentServer]]:
    """A simulated sender whose records carry 8 KB of padding, and a reflector."""
    plain = simagent._SimSession.result

    def padded(self: simagent._SimSession, record_id: int, loss_every: int) -> pb.StampResult:
        record = plain(self, record_id, loss_every)
        record.tlvs = PADDING
        return record

    monkeypatch.setattr(simagent._SimSession, "result", padded)
    servers = (
        simagent.serve_simulated("127.0.0.1:0", "sender"),
        simagent.serve_simulated("127.0.0.1:0", "reflector"),
    )
    try:
        yield servers
    finally:
        for server in servers:
            server.stop(None)


def _padded_session(ctl: Controller, servers: tuple[AgentServer, AgentServer]) -> int:
    """Register the simulated agents and run a padded poll-mode session; once every
    record has arrived on the sender, its store id."""
    sender, reflector = servers
    ctl.register_node("s", f"127.0.0.1:{sender.port}", "sender")
    ctl.register_node("r", f"127.0.0.1:{reflector.port}", "reflector")
    ctl.init_node("s")
    ctl.init_node("r")
    row = ctl.create_session(
        SessionSpec("p", "s", "r", "2001:db8::2", interval_ns=MS, count=SIM_COUNT,
                    loss_timeout_ns=100 * MS, collect="poll")
    )  # fmt: skip
    ctl.start_session("p")
    client = AgentClient(f"127.0.0.1:{sender.port}")
    try:
        deadline = time.monotonic() + 30
        while client.counters(row.ssid).sessions[0].received < SIM_COUNT:
            assert time.monotonic() < deadline, "the simulated session did not run"
            time.sleep(0.05)
    finally:
        client.close()
    return row.id


def _wait_stored(ctl: Controller, session_id: int, want: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while (n := ctl.store.count_results(session_id)) < want and time.monotonic() < deadline:
        time.sleep(0.1)
    return n


def test_poller_collects_a_backlog_larger_than_a_reply_in_one_round(
    tmp_path: Path, padded_sim: tuple[AgentServer, AgentServer]
) -> None:
    """A poll-mode session whose queued records take several replies (each cut at the
    byte budget, ``remaining`` > 0): the round that finds them polls it again at once
    until they are all in, rather than one reply per poll interval (60 s here)."""
    db = tmp_path / "c.db"
    c1 = Controller(SqliteStore(db), poll_interval_s=60)
    try:
        session_id = _padded_session(c1, padded_sim)
    finally:
        c1.close()  # what its first round found (hardly anything) is stored
    c2 = Controller(SqliteStore(db), poll_interval_s=60)
    try:
        assert c2.resume() == ["p"]  # its first round now: every record is waiting
        # Well within the poll interval: a single round must have collected them.
        assert _wait_stored(c2, session_id, SIM_COUNT, 30) == SIM_COUNT
        ids = c2.store.record_ids(session_id)
        assert ids == [(ids[0][0], i) for i in range(1, SIM_COUNT + 1)]
    finally:
        c2.close()


def test_destroy_stores_every_record_the_sender_held(
    tmp_path: Path, padded_sim: tuple[AgentServer, AgentServer]
) -> None:
    """A destroy's final collection drains the sender, reply after reply, until nothing
    remains: 2000 records of 8 KB, about six budget-cut replies."""
    ctl = Controller(SqliteStore(tmp_path / "c.db"), poll_interval_s=60)
    try:
        session_id = _padded_session(ctl, padded_sim)
        assert ctl.store.count_results(session_id) < SIM_COUNT  # not collected yet
        ctl.destroy_session("p")
        ids = ctl.store.record_ids(session_id)
        assert ids == [(ids[0][0], i) for i in range(1, SIM_COUNT + 1)]
    finally:
        ctl.close()


#: Sessions of one simulated sender polled in one round, each with more queued than a
#: full reply (``ROUND_COUNT`` × 8 KB ≈ 4 MB > 3 MiB); with ``ROUND_BYTES`` as the
#: controller's limit, their full replies (6 × 3 MiB) would not fit it.
ROUND_SESSIONS = 6
ROUND_COUNT = 500
ROUND_BYTES = 8 << 20


def _queued_sessions(db: Path, servers: tuple[AgentServer, AgentServer]) -> list[str]:
    """``ROUND_SESSIONS`` padded poll-mode sessions on the simulated agents, run until
    every record has arrived on the sender by a controller closed then (its rounds, a
    minute apart, found hardly anything); their names."""
    ctl = Controller(SqliteStore(db), poll_interval_s=60)
    try:
        return _padded_sessions(ctl, servers)
    finally:
        ctl.close()


def _padded_sessions(ctl: Controller, servers: tuple[AgentServer, AgentServer]) -> list[str]:
    sender, reflector = servers
    ctl.register_node("s", f"127.0.0.1:{sender.port}", "sender")
    ctl.register_node("r", f"127.0.0.1:{reflector.port}", "reflector")
    ctl.init_node("s")
    ctl.init_node("r")
    names = [f"p{i}" for i in range(ROUND_SESSIONS)]
    spec = SessionSpec(
        "", "s", "r", "2001:db8::2", interval_ns=MS, count=ROUND_COUNT,
        loss_timeout_ns=100 * MS, collect="poll",
    )  # fmt: skip
    rows = [ctl.create_session(dataclasses.replace(spec, name=name)) for name in names]
    for name in names:
        ctl.start_session(name)
    client = AgentClient(f"127.0.0.1:{sender.port}")
    try:
        deadline = time.monotonic() + 30
        for row in rows:
            while client.counters(row.ssid).sessions[0].received < ROUND_COUNT:
                assert time.monotonic() < deadline, "the simulated sessions did not run"
                time.sleep(0.05)
    finally:
        client.close()
    return names


def _collect_round(db: Path, names: list[str]) -> Controller:
    """A controller resuming ``names`` (every record queued on the sender), once it
    stored them all, each exactly once (closed by the caller). Its first round may
    begin before all are added: the others come in the next round, after a poll
    interval (short here), with their backlog whole."""
    ctl = Controller(SqliteStore(db), poll_interval_s=0.5)
    assert sorted(ctl.resume()) == names
    for name in names:
        session_id = ctl.store.session(name).id
        assert _wait_stored(ctl, session_id, ROUND_COUNT, 60) == ROUND_COUNT
        ids = ctl.store.record_ids(session_id)
        assert ids == [(ids[0][0], i) for i in range(1, ROUND_COUNT + 1)]
    return ctl


def test_a_poll_round_holds_at_most_its_byte_limit(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    padded_sim: tuple[AgentServer, AgentServer],
) -> None:
    """Sessions of large records all behind at once: each reply of a round asks for its
    part of ``POLL_ROUND_BYTES`` (stamp.proto ``max_bytes``), so the replies the round
    holds stay within it (here 8 MiB, not 6 full budgets, 18 MiB), and catch-up passes
    bring the rest, every record stored once."""
    monkeypatch.setattr(core, "POLL_ROUND_BYTES", ROUND_BYTES)
    db = tmp_path / "c.db"
    names = _queued_sessions(db, padded_sim)
    c2 = _collect_round(db, names)
    try:
        # A round held more than one full reply, so the limit was what bounded it.
        assert REPLY_BUDGET_BYTES < c2.poll_peak_bytes <= ROUND_BYTES
    finally:
        c2.close()


def test_a_poll_round_of_an_agent_ignoring_max_bytes_is_cut(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    padded_sim: tuple[AgentServer, AgentServer],
) -> None:
    """An agent that predates ``max_bytes`` (every reply up to its full budget) is still
    collected, each record once; once a reply shows it, the controller polls as many of
    its sessions a round as full budgets fit the limit (here two): after that round,
    none holds more than the limit."""
    monkeypatch.setattr(core, "POLL_ROUND_BYTES", ROUND_BYTES)
    monkeypatch.setattr(simagent, "asked_budget", lambda budget, max_bytes: budget)
    rounds: list[int] = []
    held = Controller._held

    def counted(self: Controller, p: Any, replies: Sequence[Any], max_bytes: int) -> None:
        rounds.append(sum(r.ByteSize() for r in replies if not isinstance(r, SouthboundError)))
        held(self, p, replies, max_bytes)

    monkeypatch.setattr(Controller, "_held", counted)
    db = tmp_path / "c.db"
    names = _queued_sessions(db, padded_sim)
    rounds.clear()
    c2 = _collect_round(db, names)
    try:
        assert not c2._pollers["s"].max_bytes
        # The round that showed it held full budgets; each one since, at most two.
        over = [i for i, size in enumerate(rounds) if size > ROUND_BYTES]
        assert len(over) == 1
        assert over[0] < len(rounds) - 1
    finally:
        c2.close()
