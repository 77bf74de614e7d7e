"""When the controller stores a sender's stream messages (group commit), and what it
measures of their collection lag (``sixlab_collection_stage_seconds``), against a
simulated sender agent over real gRPC."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from sixlab.controller import Controller, SessionSpec
from sixlab.controller.metrics import STAGES
from sixlab.controller.store import Fence, ResultBatch, SqliteStore
from sixlab.southbound import AgentClient, AgentServer
from sixlab.southbound import stamp_pb2 as pb
from sixlab.southbound.client import ResultStream
from sixlab.southbound.simagent import serve_simulated


class _Gated(ResultStream[pb.ResultBatches]):
    """A results stream that counts the messages its reader took and, once ``hold`` is
    set, hands over no message after the current one until ``hold`` is cleared."""

    def __init__(self, inner: ResultStream[pb.ResultBatches], owner: _GatedClient) -> None:
        super().__init__(inner)
        self.owner = owner

    def __iter__(self) -> Iterator[pb.ResultBatches]:
        for message in super().__iter__():
            if any(b.results for b in message.batches):
                with self.owner.cond:
                    self.owner.messages.append(message)
                    self.owner.cond.notify_all()
            yield message
            if any(b.results for b in message.batches):
                with self.owner.cond:
                    self.owner.cond.wait_for(lambda: not self.owner.hold or self.owner.closed)

    def cancel(self) -> None:
        with self.owner.cond:
            self.owner.closed = True
            self.owner.cond.notify_all()
        super().cancel()


class _GatedClient(AgentClient):
    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.cond = threading.Condition()
        self.messages: list[pb.ResultBatches] = []
        self.hold = False
        self.closed = False

    def stream_many(self, after_ids: Any, **kw: Any) -> ResultStream[pb.ResultBatches]:
        with self.cond:
            self.closed = False
        return _Gated(super().stream_many(after_ids, **kw), self)


class _SlowStore(SqliteStore):
    """Records each transaction's results (record ids per session); a transaction with
    results of a session in ``blocked`` waits until it is emptied."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.cond = threading.Condition()
        self.blocked: set[int] = set()
        self.waiting = False
        self.calls: list[dict[int, list[int]]] = []

    def store_many(
        self,
        batches: Sequence[ResultBatch],
        now_ns: int | None = None,
        *,
        fence: Fence | None = None,
    ) -> list[int | None]:
        if any(b.result_rows() and b.session_id in self.blocked for b in batches):
            with self.cond:
                self.waiting = True
                self.cond.notify_all()
                self.cond.wait_for(lambda: not self.blocked, timeout=60)
                self.waiting = False
        out = super().store_many(batches, now_ns, fence=fence)
        if any(b.result_rows() for b in batches):
            with self.cond:
                self.calls.append(
                    {
                        b.session_id: [row[2] for row in b.result_rows()]  # record ids
                        for b in batches
                        if b.result_rows()
                    }
                )
                self.cond.notify_all()
        return out

    def unblock(self) -> None:
        with self.cond:
            self.blocked.clear()
            self.cond.notify_all()


@pytest.fixture
def sim() -> Iterator[tuple[AgentServer, AgentServer]]:
    sender = serve_simulated("127.0.0.1:0", "sender")
    reflector = serve_simulated("127.0.0.1:0", "reflector")
    try:
        yield sender, reflector
    finally:
        sender.stop(None)
        reflector.stop(None)


def _controller(
    sim: tuple[AgentServer, AgentServer], store: SqliteStore, **kw: Any
) -> tuple[Controller, list[_GatedClient]]:
    clients: list[_GatedClient] = []

    def factory(address: str) -> AgentClient:
        clients.append(_GatedClient(address))
        return clients[-1]

    ctl = Controller(store, client_factory=factory, supervise_interval_s=None, **kw)
    ctl.register_node("s", f"127.0.0.1:{sim[0].port}", "sender")
    ctl.register_node("r", f"127.0.0.1:{sim[1].port}", "reflector")
    ctl.init_node("s")
    ctl.init_node("r")
    return ctl, clients


def _wait(cond: threading.Condition, pred: Any, what: str, timeout: float = 20) -> None:
    with cond:
        assert cond.wait_for(pred, timeout=timeout), what


@pytest.mark.parametrize("commit_interval_s", [None, 0.2])
def test_a_stream_message_is_stored_without_waiting_for_the_next(
    sim: tuple[AgentServer, AgentServer], tmp_path: Path, commit_interval_s: float | None
) -> None:
    """By default (group commit) at once, with a commit interval once it has passed:
    never held until another message comes."""
    store = _SlowStore(tmp_path / "c.db")
    kw = {} if commit_interval_s is None else {"commit_interval_s": commit_interval_s}
    ctl, _ = _controller(sim, store, stream_window_s=0.05, **kw)
    sender = ctl.client("s")
    assert isinstance(sender, _GatedClient)
    try:
        ctl.create_session(SessionSpec("p", "s", "r", "2001:db8::2", interval_ns=10_000_000,
                                       collect="stream"))  # fmt: skip
        with sender.cond:
            sender.hold = True  # the stream hands over its first message with records only
        ctl.start_session("p")
        _wait(sender.cond, lambda: sender.messages, "no message came")
        first = sender.messages[0]
        top = max(r.record_id for b in first.batches for r in b.results)
        _wait(store.cond, lambda: any(top in ids for c in store.calls for ids in c.values()),
              "the message was not stored while the stream held the next one back")  # fmt: skip
        assert len(sender.messages) == 1
    finally:
        with sender.cond:
            sender.hold = False
            sender.cond.notify_all()
        ctl.close()


def test_messages_that_came_during_a_transaction_are_stored_in_the_next_one(
    sim: tuple[AgentServer, AgentServer], tmp_path: Path
) -> None:
    store = _SlowStore(tmp_path / "c.db")
    ctl, _ = _controller(sim, store, stream_window_s=0.05)
    sender = ctl.client("s")
    assert isinstance(sender, _GatedClient)
    try:
        ctl.create_session(SessionSpec("p", "s", "r", "2001:db8::2", interval_ns=10_000_000,
                                       collect="stream"))  # fmt: skip
        with store.cond:
            store.blocked.add(ctl.store.session("p").id)
        ctl.start_session("p")
        _wait(store.cond, lambda: store.waiting, "no transaction began")
        with sender.cond:
            seen = len(sender.messages)
        # The transaction of the first message(s) runs (blocked); more messages come. When
        # the third is read, the reader has handed over the two before it.
        _wait(sender.cond, lambda: len(sender.messages) >= seen + 3, "the stream was not read")
        with sender.cond:
            came = sender.messages[seen : seen + 2]
        store.unblock()
        ids = [r.record_id for m in came for b in m.batches for r in b.results]
        _wait(store.cond, lambda: len(store.calls) >= 2, "nothing more was stored")
        with store.cond:
            second = [i for c in store.calls[1:2] for i in next(iter(c.values()))]
        # Every record of the messages that came meanwhile is in the one next transaction.
        assert set(ids) <= set(second)
    finally:
        store.unblock()
        ctl.close()


def test_a_senders_messages_wait_for_anothers_transaction_and_go_in_one(
    sim: tuple[AgentServer, AgentServer], tmp_path: Path
) -> None:
    """Stream transactions run one at a time: while one sender's runs, another's
    messages pile up and are stored together in its next one."""
    other = serve_simulated("127.0.0.1:0", "sender")
    store = _SlowStore(tmp_path / "c.db")
    ctl, _ = _controller(sim, store, stream_window_s=0.05)
    try:
        ctl.register_node("s2", f"127.0.0.1:{other.port}", "sender")
        ctl.init_node("s2")
        for name, sender in (("a", "s"), ("b", "s2")):
            ctl.create_session(SessionSpec(name, sender, "r", "2001:db8::2",
                                           interval_ns=10_000_000, collect="stream"))  # fmt: skip
        b_id = ctl.store.session("b").id
        client = ctl.client("s2")
        assert isinstance(client, _GatedClient)
        with store.cond:
            store.blocked.add(ctl.store.session("a").id)
        ctl.start_session("a")
        _wait(store.cond, lambda: store.waiting, "no transaction of a began")
        ctl.start_session("b")
        # b's messages come while a's transaction runs; when the third is read, the
        # reader has handed over the two before it.
        _wait(client.cond, lambda: len(client.messages) >= 3, "b's stream was not read")
        with client.cond:
            came = client.messages[:2]
        with store.cond:
            assert not any(b_id in c for c in store.calls)  # b waited for a's transaction
        store.unblock()
        ids = [r.record_id for m in came for b in m.batches for r in b.results]
        _wait(store.cond, lambda: any(b_id in c for c in store.calls), "b was not stored")
        with store.cond:
            first_b = next(c[b_id] for c in store.calls if b_id in c)
        assert set(ids) <= set(first_b)
    finally:
        store.unblock()
        ctl.close()
        other.stop(None)


@pytest.mark.parametrize("collect", ["stream", "poll"])
def test_collection_stages_count_every_stored_result(
    sim: tuple[AgentServer, AgentServer], tmp_path: Path, collect: str
) -> None:
    store = SqliteStore(tmp_path / "c.db")
    ctl, _ = _controller(sim, store, stream_window_s=0.05, poll_interval_s=0.05)
    try:
        names = [f"p{i}" for i in range(3)]
        for name in names:
            ctl.create_session(
                SessionSpec(name, "s", "r", "2001:db8::2", interval_ns=10_000_000, count=40,
                            loss_timeout_ns=100_000_000, collect=collect)
            )  # fmt: skip
            ctl.start_session(name)
        for name in names:
            assert ctl.wait_finished(name, 30)
    finally:
        ctl.close()
    stored = sum(store.count_results(store.session(n).id) for n in names)
    assert stored == 120
    reg = ctl.metrics.registry

    def sample(what: str, stage: str) -> float:
        value = reg.get_sample_value(f"sixlab_collection_stage_seconds_{what}", {"stage": stage})
        assert value is not None
        return value

    for stage in STAGES:
        assert sample("count", stage) == stored, stage
    # Each result's total lag is the sum of its stages.
    parts = sum(sample("sum", s) for s in ("agent", "queued", "transaction"))
    assert sample("sum", "total") == pytest.approx(parts, rel=1e-6)
    assert sample("sum", "agent") > 0
    assert sample("sum", "transaction") > 0
    # A real measurement: within the buckets, far below a minute.
    assert (
        reg.get_sample_value(
            "sixlab_collection_stage_seconds_bucket", {"stage": "total", "le": "60.0"}
        )
        == stored
    )
    store.close()


def test_a_sender_waiting_for_a_session_lock_does_not_hold_up_the_others(
    tmp_path: Path,
) -> None:
    """A session's lock is held for long (as a destroy's final collection or a repair
    holds it while calling agents): its sender's stream waits for it without holding the
    commit slot, so another sender's results are stored meanwhile; then it goes on, and
    every record of both is stored once."""
    agents = {
        "s1": serve_simulated("127.0.0.1:0", "sender"),
        "s2": serve_simulated("127.0.0.1:0", "sender"),
        "r": serve_simulated("127.0.0.1:0", "reflector"),
    }
    ctl = Controller(SqliteStore(tmp_path / "c.db"), supervise_interval_s=None)
    try:
        for name, server in agents.items():
            ctl.register_node(
                name, f"127.0.0.1:{server.port}", "reflector" if name == "r" else "sender"
            )
            ctl.init_node(name)
        specs = [
            SessionSpec(name, sender, "r", "2001:db8::2", interval_ns=50_000_000, collect="stream")
            for name, sender in (("a", "s1"), ("b", "s2"))
        ]
        _, errors = ctl.create_sessions(specs)
        assert not errors
        assert not ctl.start_sessions(["a", "b"])
        deadline = time.monotonic() + 30
        while min(ctl.store.session(n).cursor for n in ("a", "b")) == 0:
            assert time.monotonic() < deadline, "no results"
            time.sleep(0.05)
        with ctl._session_lock("a"):
            time.sleep(1.0)  # s1's stream has a message of "a" by now, and waits
            before = ctl.store.session("b").cursor
            time.sleep(1.5)  # 30 records of "b" at 20 packets/s
            after = ctl.store.session("b").cursor
            held = ctl.store.session("a").cursor
        assert after >= before + 15
        while ctl.store.session("a").cursor <= held:
            assert time.monotonic() < deadline + 30, "a did not go on"
            time.sleep(0.05)
        for name in ("a", "b"):
            ctl.stop_session(name)
        for name in ("a", "b"):
            assert ctl.wait_finished(name, 30), name
            row = ctl.store.session(name)
            assert [r.seq for _, r in ctl.store.records(row.id)] == list(range(row.sent)), name
    finally:
        ctl.close()
        ctl.store.close()
        for server in agents.values():
            server.stop(None)
