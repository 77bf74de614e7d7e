"""Session lifecycle across controller replicas on one PostgreSQL: a destroy through a
replica that does not own the session's sender, and ``apply --prune`` while results of
a pruned session are in flight (docs/architecture.md, "Session lifecycle across
replicas").

Two Controllers in one process share a real PostgreSQL (the lab's server), each with
its ReplicaManager: A holds every lease (it came first), B holds none and answers
requests. The agents are simulated (``sixlab.southbound.simagent``): the real
southbound gRPC API.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace

import grpc
import pytest
from prometheus_client import generate_latest

from sixlab.controller import (
    Controller,
    ReplicaManager,
    SessionExistsError,
    SessionSpec,
    WrongStateError,
)
from sixlab.controller.apply import WantedNode, WantedSession, execute, plan
from sixlab.controller.pgstore import PostgresStore
from sixlab.controller.store import AlreadyExistsError, SessionRow, Store, open_store
from sixlab.southbound import AgentServer
from sixlab.southbound import stamp_pb2 as pb
from sixlab.southbound.client import AgentClient, ResultStream, SouthboundError
from tests.integration._simagents import simulated_agents, wait_for

INTERVAL_NS = 50_000_000  # 20 packets/s per session
LOSS_EVERY = 25
TTL_S, TICK_S = 3.0, 0.5


@pytest.fixture
def agents() -> Iterator[dict[str, AgentServer]]:
    with simulated_agents(["s1"], ["r1", "r2"], loss_every=LOSS_EVERY) as servers:
        yield servers


def _in_thread(call: Callable[[], object], outcome: list[BaseException | None]) -> threading.Thread:
    """``call`` on a started daemon thread; what it raised (or None) goes into ``outcome``."""

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            outcome.append(exc)
        else:
            outcome.append(None)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _spec(name: str, reflector: str = "r1") -> SessionSpec:
    return SessionSpec(
        name, "s1", reflector, "2001:db8::2", interval_ns=INTERVAL_NS,
        loss_timeout_ns=200_000_000, collect="stream",
    )  # fmt: skip


def _carried(agents: dict[str, AgentServer], node: str) -> set[int]:
    """The SSIDs the node's agent carries now."""
    client = AgentClient(f"127.0.0.1:{agents[node].port}")
    try:
        return set(client.info(5).ssids)
    finally:
        client.close()


def _replicas(
    pg_url: str,
    agents: dict[str, AgentServer],
    a_client: type[AgentClient] = AgentClient,
    b_client: type[AgentClient] = AgentClient,
    b_store: Store | None = None,
) -> tuple[Controller, ReplicaManager, Controller, ReplicaManager]:
    """A, holding every lease (nodes registered and initialised), and B, holding none."""
    # Every stream message is stored as it comes (no gathering): a message held by a
    # test is stored right after it is let go.
    a = Controller(
        open_store(pg_url), supervise_interval_s=0.2, client_factory=a_client,
        commit_interval_s=0.0,
    )  # fmt: skip
    for name, server in agents.items():
        role = "reflector" if name.startswith("r") else "sender"
        a.register_node(name, f"127.0.0.1:{server.port}", role)
        a.init_node(name)
    ra = ReplicaManager(a, "A", ttl_s=TTL_S, tick_s=TICK_S)
    ra.start()
    assert ra.owned == {*agents, "housekeeping"}
    b = Controller(
        b_store or open_store(pg_url), supervise_interval_s=0.2, client_factory=b_client,
        commit_interval_s=0.0,
    )  # fmt: skip
    rb = ReplicaManager(b, "B", ttl_s=TTL_S, tick_s=TICK_S)
    rb.start()
    assert rb.owned == frozenset()
    return a, ra, b, rb


def _close(*items: Controller | ReplicaManager | None) -> None:
    for item in items:
        if isinstance(item, ReplicaManager):
            item.close()
    for item in items:
        if isinstance(item, Controller):
            item.close()
            item.store.close()


def _exactly_once(c: Controller, names: list[str]) -> None:
    for name in names:
        c.stop_session(name)
    for name in names:
        assert c.wait_finished(name, 60), name
    for name in names:
        row = c.store.session(name)
        seqs = [r.seq for _, r in c.store.records(row.id)]
        assert seqs == [s for s in range(row.sent) if s % LOSS_EVERY != LOSS_EVERY - 1], name


def test_a_session_destroyed_through_a_replica_that_does_not_own_its_sender_stays_destroyed(
    pg_url: str, agents: dict[str, AgentServer]
) -> None:
    """B destroys a running session whose sender A owns. A's repair runs at the worst
    moment: right after the session left the sender agent (A's stream is told it is
    gone and wakes A's supervisor), while the session's row is not yet destroyed. A
    must not take it for a session its agent lost and create it again: the session is
    destroyed on both agents, no new epoch begins, and the other sessions go on."""
    a: Controller | None = None
    fired: list[str] = []

    class Hooked(AgentClient):
        """The client of both controllers: once the sender half of the session is
        destroyed, whoever did it, the owner checks the sender node (in a thread of its
        own, as its supervisor would) before the destroyer goes on."""

        victim = 0

        def destroy_session(self, ssid: int) -> None:
            super().destroy_session(ssid)
            s1 = f"127.0.0.1:{agents['s1'].port}"
            if ssid == Hooked.victim and self.target == s1 and not fired:
                fired.append("s1")
                assert a is not None
                owner = a
                t = threading.Thread(target=lambda: owner.check_node("s1"), daemon=True)
                t.start()
                t.join(5)

    a, ra, b, rb = _replicas(pg_url, agents, Hooked, Hooked)
    try:
        names = [f"p{i}" for i in range(3)]
        _running(a, names)
        victim = a.store.session("p0")
        Hooked.victim = victim.ssid

        b.destroy_session("p0")

        assert b.store.session("p0").state == "destroyed"
        assert victim.ssid not in _carried(agents, "s1")
        assert victim.ssid not in _carried(agents, "r1")
        # The owner's next checks leave it destroyed.
        for _ in range(3):
            a.check_node("s1")
            a.check_node("r1")
        time.sleep(1.0)
        assert a.store.session("p0").state == "destroyed"
        assert victim.ssid not in _carried(agents, "s1")
        assert victim.ssid not in _carried(agents, "r1")
        assert [e.epoch for e in a.store.epochs(victim.id)] == [0]
        assert a.store.epochs(victim.id)[0].end_reason == "destroyed"
        _exactly_once(a, names[1:])
    finally:
        _close(rb, ra, b, a)


def test_apply_prune_through_another_replica_with_results_in_flight(
    pg_url: str, agents: dict[str, AgentServer], caplog: pytest.LogCaptureFixture
) -> None:
    """``apply --prune`` through B drops a session (and its reflector node, with the
    session's history) while A's stream holds a message with results of that session
    and of the sessions that stay. The message is stored without the pruned session's
    results, which are dropped and counted; the stream goes on (no failed transaction),
    nothing is stored for the deleted row, and the other sessions' results are stored
    exactly once."""
    a: Controller | None = None
    b: Controller | None = None
    pruned: list[int] = []

    class Hooked(AgentClient):
        """A's client: the first stream message carrying results of the session to
        prune is held until B's apply --prune has run."""

        victim = 0

        def stream_many(
            self,
            after_ids: Mapping[int, int],
            *,
            max_batch: int = 0,
            batch_window_ns: int = 0,
            counters_interval_ns: int = 0,
            after_loss_ids: Mapping[int, int] | None = None,
        ) -> ResultStream[pb.ResultBatches]:
            inner = super().stream_many(
                after_ids, max_batch=max_batch, batch_window_ns=batch_window_ns,
                counters_interval_ns=counters_interval_ns, after_loss_ids=after_loss_ids,
            )  # fmt: skip
            return Held(inner)

    class Held(ResultStream[pb.ResultBatches]):
        """The stream, its first message with results of the victim held for the prune."""

        def __init__(self, inner: ResultStream[pb.ResultBatches]) -> None:
            self.inner = inner

        def cancel(self) -> None:
            self.inner.cancel()

        def __iter__(self) -> Iterator[pb.ResultBatches]:
            for message in self.inner:
                if (
                    Hooked.victim
                    and not pruned
                    and any(m.ssid == Hooked.victim and len(m.results) for m in message.batches)
                ):
                    pruned.append(Hooked.victim)
                    prune()
                yield message

    def prune() -> None:
        assert b is not None
        nodes = [
            WantedNode("s1", f"127.0.0.1:{agents['s1'].port}", "sender", None),
            WantedNode("r1", f"127.0.0.1:{agents['r1'].port}", "reflector", None),
        ]
        wanted = [WantedSession(_spec(f"k{i}"), "", running=True) for i in range(3)]
        steps = plan(b, nodes, wanted, prune=True)
        assert [(s.action, s.name) for s in steps] == [("destroy", "gone"), ("remove", "r2")]
        execute(steps, b)

    a, ra, b, rb = _replicas(pg_url, agents, a_client=Hooked)
    try:
        keep = [f"k{i}" for i in range(3)]
        _, errors = a.create_sessions([*(_spec(n) for n in keep), _spec("gone", "r2")])
        assert not errors
        gone = a.store.session("gone")
        with caplog.at_level(logging.WARNING, logger="sixlab.controller.core"):
            Hooked.victim = gone.ssid
            assert not a.start_sessions([*keep, "gone"])
            wait_for("the prune", lambda: bool(pruned), 30)
            cursors = {n: a.store.session(n).cursor for n in keep}
            wait_for(
                "the stream to go on",
                lambda: all(a.store.session(n).cursor > c + 10 for n, c in cursors.items()),
                30,
            )
        failed = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert failed == []
        assert "r2" not in {n.name for n in a.store.nodes()}
        assert a.store.count_results(gone.id) == 0
        exposed = generate_latest(a.metrics.registry).decode()
        assert 'sixlab_dropped_results_total{node="s1"}' in exposed
        _exactly_once(a, keep)
    finally:
        _close(rb, ra, b, a)


def _running(a: Controller, names: list[str]) -> None:
    """Create and start the sessions, until each stored results."""
    _, errors = a.create_sessions([_spec(n) for n in names])
    assert not errors
    assert not a.start_sessions(names)
    wait_for("results", lambda: all(a.store.session(n).cursor > 0 for n in names), 30)


def _finished(a: Controller, names: list[str]) -> None:
    """Run the sessions until they stored results, then stop them until finished."""
    _running(a, names)
    for name in names:
        a.stop_session(name)
    for name in names:
        assert a.wait_finished(name, 30), name


def test_a_restart_through_another_replica_is_not_taken_for_a_lost_reflector_session(
    pg_url: str, agents: dict[str, AgentServer]
) -> None:
    """B starts again a finished session whose nodes A owns: B destroys the session on
    both agents and creates it afresh. A checks the reflector right after B destroyed
    the reflector's half: A must not take the half for lost and create it again under
    B (whose creation would then meet ALREADY_EXISTS)."""
    a: Controller | None = None
    fired: list[int] = []

    class Hooked(AgentClient):
        victim = 0

        def destroy_session(self, ssid: int) -> None:
            super().destroy_session(ssid)
            r1 = f"127.0.0.1:{agents['r1'].port}"
            if ssid == Hooked.victim and self.target == r1 and not fired:
                fired.append(ssid)
                assert a is not None
                owner = a
                t = threading.Thread(target=lambda: owner.check_node("r1"), daemon=True)
                t.start()
                t.join(5)

    a, ra, b, rb = _replicas(pg_url, agents, AgentClient, Hooked)
    try:
        _finished(a, ["p0"])
        row = a.store.session("p0")
        Hooked.victim = row.ssid

        b.start_session("p0")

        assert fired
        assert b.store.session("p0").state == "running"
        assert row.ssid in _carried(agents, "s1")
        assert row.ssid in _carried(agents, "r1")
        wait_for("results of the new epoch", lambda: a.store.session("p0").cursor > 0, 30)
        assert [e.epoch for e in a.store.epochs(row.id)] == [0, 1]
    finally:
        _close(rb, ra, b, a)


def test_a_destroy_during_a_restart_through_another_replica_leaves_nothing_on_the_agents(
    pg_url: str, agents: dict[str, AgentServer]
) -> None:
    """B starts again a finished session; A (the owner) destroys it while B is between
    its calls to the agents (the reflector's half created again, the sender's not yet).
    Whatever each call answers, in the end the session is destroyed and neither agent
    carries it: B's creations after A's destroy are undone."""
    a: Controller | None = None
    fired: list[int] = []
    outcome: list[BaseException | None] = []

    class Hooked(AgentClient):
        victim = 0

        def create_session(self, request: pb.CreateStampSessionRequest) -> None:
            s1 = f"127.0.0.1:{agents['s1'].port}"
            if request.ssid == Hooked.victim and self.target == s1 and not fired:
                fired.append(request.ssid)
                assert a is not None
                owner = a

                t = _in_thread(lambda: owner.destroy_session("p0", wait_s=10), outcome)
                t.join(15)
            super().create_session(request)

    a, ra, b, rb = _replicas(pg_url, agents, AgentClient, Hooked)
    try:
        _finished(a, ["p0", "p1"])
        row = a.store.session("p0")
        Hooked.victim = row.ssid

        with contextlib.suppress(Exception):  # refused, or done and destroyed after
            b.start_session("p0")

        assert fired
        assert outcome == [None]
        assert a.store.session("p0").state == "destroyed"
        for _ in range(3):
            a.check_node("s1")
            a.check_node("r1")
        assert row.ssid not in _carried(agents, "s1")
        assert row.ssid not in _carried(agents, "r1")
        # The other session is untouched, and starts again.
        b.start_session("p1")
        wait_for("p1's new epoch", lambda: a.store.session("p1").cursor > 0, 30)
    finally:
        _close(rb, ra, b, a)


class RacingStore(PostgresStore):
    """B's store: when B reads the SSIDs in use on r1 (the last node it reads) with a
    name in ``race``, the other controller creates a session of that name just before
    that read or, ``after``, just after it (B's read is then stale)."""

    def __init__(self, url: str, *, after: bool) -> None:
        super().__init__(url)
        self.after = after
        self.race: list[str] = []
        self.other: Controller | None = None

    def used_ssids(self, node: str) -> set[int]:
        if not self.race or node != "r1":
            return super().used_ssids(node)
        assert self.other is not None
        if self.after:
            used = super().used_ssids(node)
            self.other.create_session(_spec(self.race.pop()))
            return used
        self.other.create_session(_spec(self.race.pop()))
        return super().used_ssids(node)


def _racing(
    pg_url: str, agents: dict[str, AgentServer], *, after: bool
) -> tuple[Controller, ReplicaManager, Controller, ReplicaManager, list[str]]:
    """``_replicas`` with B on a RacingStore whose other controller is A; its race list."""
    store = RacingStore(pg_url, after=after)
    a, ra, b, rb = _replicas(pg_url, agents, b_store=store)
    store.other = a
    return a, ra, b, rb, store.race


def _one_each(c: Controller, agents: dict[str, AgentServer], sessions: int) -> None:
    """The store has ``sessions`` live sessions, and the agents carry their SSIDs only."""
    live = {r.ssid for r in c.store.sessions()}
    assert len(live) == sessions
    assert _carried(agents, "s1") == live
    assert _carried(agents, "r1") == live


def test_two_replicas_creating_one_name_at_once_leave_one_session_on_the_agents(
    pg_url: str, agents: dict[str, AgentServer]
) -> None:
    """apply (or create) through A and B at once with the same new session: B finds
    the name free, A creates the session meanwhile, B picks another SSID and creates
    its halves on the agents, and the store keeps A's row. B's halves must not stay on
    the agents (sending probes no row accounts for, holding an SSID the store thinks
    free): B destroys them and says the name is taken. Once for one session, once for
    a batch of two (one of which is taken)."""
    a, ra, b, rb, race = _racing(pg_url, agents, after=False)
    try:
        race.append("p0")
        with pytest.raises((SessionExistsError, AlreadyExistsError)):
            b.create_session(_spec("p0"))
        assert not race
        _one_each(a, agents, 1)

        race.append("p2")
        rows, errors = b.create_sessions([_spec("p1"), _spec("p2")])
        assert not race
        assert [r.name for r in rows] == ["p1"]
        assert set(errors) == {"p2"}
        assert isinstance(errors["p2"], SessionExistsError | AlreadyExistsError)
        _one_each(a, agents, 3)
    finally:
        _close(rb, ra, b, a)


def test_two_replicas_picking_one_ssid_at_once_both_create_their_sessions(
    pg_url: str, agents: dict[str, AgentServer]
) -> None:
    """B reads the SSIDs in use on its nodes, then A creates another session there
    (B's read is stale): B picks the SSID A took, and the agent refuses it
    (ALREADY_EXISTS). B tries the next free one rather than fail the request (or the
    apply); every session ends with halves of its own SSID on the agents."""
    a, ra, b, rb, race = _racing(pg_url, agents, after=True)
    try:
        race.append("a0")
        b.create_session(_spec("b0"))
        assert not race
        race.append("a1")
        rows, errors = b.create_sessions([_spec("b1"), _spec("b2")])
        assert not race
        assert errors == {}
        assert sorted(r.name for r in rows) == ["b1", "b2"]
        _one_each(a, agents, 5)
    finally:
        _close(rb, ra, b, a)


def _sender_state(agents: dict[str, AgentServer], ssid: int) -> int:
    """The sender agent's state of the session (``pb.SessionState``)."""
    client = AgentClient(f"127.0.0.1:{agents['s1'].port}")
    try:
        return client.results(ssid, 1, after_id=0).state
    finally:
        client.close()


def _lose(agents: dict[str, AgentServer], node: str, ssid: int) -> None:
    """The node's agent loses the session (as a Reset or a restart would)."""
    client = AgentClient(f"127.0.0.1:{agents[node].port}")
    try:
        client.destroy_session(ssid)
    finally:
        client.close()


def _each_epoch_once(c: Controller, name: str) -> None:
    """Stop the session through ``c`` (its sender's owner) until finished; every epoch's
    results are stored exactly once, all of those its sender sent."""
    c.stop_session(name)
    assert c.wait_finished(name, 60), name
    _sent_once(c, name)


@pytest.mark.parametrize(
    "dies", ["before-sender-created", "after-reflector-started", "after-sender-started"]
)
def test_a_start_left_unfinished_by_a_dead_replica_is_finished_by_the_senders_owner(
    pg_url: str, agents: dict[str, AgentServer], dies: str
) -> None:
    """B starts again a finished session whose sender A owns, and dies in the middle:
    with the reflector's half created again and the sender's not yet, with the new
    epoch begun and the reflector started but not the sender (nothing sent in either
    case), or with the sender started in the new epoch. The row is left
    ``starting``; once B is no longer a live replica, A finishes the start: the session
    runs (in the epoch B began if the sender was started there, so nothing it sent is
    lost; else in a new one), and every result of each epoch is stored exactly once."""
    fired = threading.Event()
    never = threading.Event()

    class Dying(AgentClient):
        """B's client: B stops (as if killed) at the chosen call of the start."""

        victim = 0

        def create_session(self, request: pb.CreateStampSessionRequest) -> None:
            s1 = f"127.0.0.1:{agents['s1'].port}"
            if (
                dies == "before-sender-created"
                and request.ssid == Dying.victim
                and (self.target == s1)
            ):
                fired.set()
                never.wait()
            super().create_session(request)

        def start_session(self, ssid: int) -> None:
            super().start_session(ssid)
            node = "s1" if dies == "after-sender-started" else "r1"
            if (
                dies.startswith("after-")
                and ssid == Dying.victim
                and (self.target == f"127.0.0.1:{agents[node].port}")
            ):
                fired.set()
                never.wait()

    a, ra, b, rb = _replicas(pg_url, agents, AgentClient, Dying)
    try:
        _finished(a, ["p0"])
        row = a.store.session("p0")
        Dying.victim = row.ssid
        threading.Thread(target=lambda: b.start_session("p0"), daemon=True).start()
        assert fired.wait(15)
        assert a.store.session("p0").state == "starting"
        time.sleep(1.0)  # A's supervisor leaves a live replica's start alone
        assert a.store.session("p0").state == "starting"

        rb.close()  # B's heartbeats end: it is no longer a live replica

        wait_for(
            "the owner to finish the start", lambda: a.store.session("p0").state == "running", 15
        )
        assert row.ssid in _carried(agents, "s1")
        assert row.ssid in _carried(agents, "r1")
        wait_for("results of the new epoch", lambda: a.store.session("p0").cursor > 0, 30)
        epochs = a.store.epochs(row.id)
        assert epochs[0].end_reason == "finished"
        if dies == "after-reflector-started":
            # B began epoch 1 but its sender never sent: it ends, and the start is
            # carried out again in epoch 2.
            assert [e.epoch for e in epochs] == [0, 1, 2]
            assert (epochs[1].end_reason, epochs[1].sent) == ("start-interrupted", 0)
        else:
            assert [e.epoch for e in epochs] == [0, 1]
        _each_epoch_once(a, "p0")
    finally:
        _close(rb, ra, b, a)


def test_a_replica_paused_past_its_heartbeat_does_not_go_on_with_a_start_taken_over(
    pg_url: str, agents: dict[str, AgentServer]
) -> None:
    """B starts again a finished session and is paused (not killed) once it created the
    sender's half again; its heartbeat lapses and A, the sender's owner, finishes the
    start. When B resumes, it goes no further: it begins no epoch (which would end the
    one A's collector stores), its start fails, and the session runs on in A's epoch
    with every result stored exactly once."""
    fired = threading.Event()
    resume = threading.Event()
    outcome: list[BaseException | None] = []

    class Paused(AgentClient):
        victim = 0

        def create_session(self, request: pb.CreateStampSessionRequest) -> None:
            super().create_session(request)
            s1 = f"127.0.0.1:{agents['s1'].port}"
            if request.ssid == Paused.victim and self.target == s1 and not fired.is_set():
                fired.set()
                resume.wait(60)

    a, ra, b, rb = _replicas(pg_url, agents, AgentClient, Paused)
    try:
        _finished(a, ["p0"])
        row = a.store.session("p0")
        Paused.victim = row.ssid

        assert b is not None
        other = b
        t = _in_thread(lambda: other.start_session("p0"), outcome)
        assert fired.wait(15)
        rb.close()  # its heartbeats stop (B itself goes on, paused)
        wait_for(
            "the owner to finish the start", lambda: a.store.session("p0").state == "running", 15
        )
        wait_for("results of the new epoch", lambda: a.store.session("p0").cursor > 0, 30)

        resume.set()
        t.join(15)

        assert len(outcome) == 1
        assert outcome[0] is not None
        assert a.store.session("p0").state == "running"
        assert [e.epoch for e in a.store.epochs(row.id)] == [0, 1]
        cursor = a.store.session("p0").cursor
        wait_for("results to go on", lambda: a.store.session("p0").cursor > cursor + 5, 30)
        _each_epoch_once(a, "p0")
    finally:
        resume.set()
        _close(rb, ra, b, a)


def test_a_session_its_sender_lost_is_collected_again_in_its_new_epoch(
    pg_url: str, agents: dict[str, AgentServer]
) -> None:
    """The sender agent loses a running stream-mode session (without restarting: its
    stream goes on for the others). The owner creates it again in a new epoch and
    collects it there: its stream reopens with the session."""
    a, ra, b, rb = _replicas(pg_url, agents)
    try:
        names = ["p0", "p1"]
        _running(a, names)
        row = a.store.session("p0")

        _lose(agents, "s1", row.ssid)

        wait_for("the new epoch", lambda: a.store.session("p0").epoch == 1, 15)
        wait_for("results of the new epoch", lambda: a.store.session("p0").cursor > 0, 15)
        assert a.store.epochs(row.id)[0].end_reason == "sender-lost"
        _exactly_once(a, ["p1"])
    finally:
        _close(rb, ra, b, a)


def test_a_stop_through_another_replica_during_the_owners_sender_repair_wins(
    pg_url: str, agents: dict[str, AgentServer]
) -> None:
    """The sender agent loses a running session; A (its owner) creates it again in a new
    epoch, and B stops the session between A's creating and starting the sender's half.
    The stop wins: it succeeds, the sender's session does not go on sending, the row
    and its last epoch end finished, and every result is stored once."""
    fired: list[int] = []
    outcome: list[BaseException | None] = []
    b: Controller | None = None

    class Hooked(AgentClient):
        """A's client: B's stop runs just before A starts the sender's half again."""

        victim = 0

        def start_session(self, ssid: int) -> None:
            s1 = f"127.0.0.1:{agents['s1'].port}"
            if ssid == Hooked.victim and self.target == s1 and not fired:
                fired.append(ssid)
                assert b is not None
                other = b

                t = _in_thread(lambda: other.stop_session("p0"), outcome)
                t.join(15)
            super().start_session(ssid)

    a, ra, b, rb = _replicas(pg_url, agents, Hooked, AgentClient)
    try:
        names = ["p0", "p1"]
        _running(a, names)
        row = a.store.session("p0")
        Hooked.victim = row.ssid

        _lose(agents, "s1", row.ssid)

        wait_for("the repair", lambda: bool(outcome), 30)
        assert outcome == [None]
        assert a.wait_finished("p0", 30)
        assert a.store.session("p0").state == "finished"
        assert _sender_state(agents, row.ssid) == pb.SESSION_STATE_FINISHED
        epochs = a.store.epochs(row.id)
        assert [e.epoch for e in epochs] == [0, 1]
        assert epochs[0].end_reason == "sender-lost"
        assert epochs[1].end_reason == "finished"
        assert epochs[1].stopped_ns is not None
        time.sleep(1.0)  # later checks leave it finished
        assert a.store.session("p0").state == "finished"
        assert _sender_state(agents, row.ssid) == pb.SESSION_STATE_FINISHED
        _exactly_once(a, ["p1"])
    finally:
        _close(rb, ra, b, a)


def _stateful(name: str) -> SessionSpec:
    return replace(_spec(name), stateful=True)


def test_a_stop_through_another_replica_during_a_drain_to_restart_wins(
    pg_url: str, agents: dict[str, AgentServer]
) -> None:
    """A stateful session's reflector loses it: A (the owner) stops the sender to drain
    it, then would start it afresh. B stops the session meanwhile: the stop wins (it
    succeeds, and the session finishes and stays finished, not started again)."""
    fired: list[int] = []
    outcome: list[BaseException | None] = []
    b: Controller | None = None

    class Hooked(AgentClient):
        """A's client: B's stop runs when A creates the reflector's half again."""

        victim = 0

        def create_session(self, request: pb.CreateStampSessionRequest) -> None:
            r1 = f"127.0.0.1:{agents['r1'].port}"
            if request.ssid == Hooked.victim and self.target == r1 and not fired:
                fired.append(request.ssid)
                assert b is not None
                other = b

                t = _in_thread(lambda: other.stop_session("p0"), outcome)
                t.join(15)
            super().create_session(request)

    a, ra, b, rb = _replicas(pg_url, agents, Hooked, AgentClient)
    try:
        _, errors = a.create_sessions([_stateful("p0")])
        assert not errors
        assert not a.start_sessions(["p0"])
        wait_for("results", lambda: a.store.session("p0").cursor > 0, 30)
        row = a.store.session("p0")
        Hooked.victim = row.ssid

        _lose(agents, "r1", row.ssid)

        wait_for("the repair", lambda: bool(outcome), 30)
        assert outcome == [None]
        assert a.wait_finished("p0", 30)
        time.sleep(1.5)  # the owner's supervisor rounds (0.2 s) do not start it again
        assert a.store.session("p0").state == "finished"
        assert [e.epoch for e in a.store.epochs(row.id)] == [0]
        assert _sender_state(agents, row.ssid) == pb.SESSION_STATE_FINISHED
    finally:
        _close(rb, ra, b, a)


def test_a_drain_to_restart_is_completed_by_the_replica_that_takes_the_sender_over(
    pg_url: str, agents: dict[str, AgentServer]
) -> None:
    """A stateful session's reflector loses it; A (the owner) stops the sender to drain
    it and start it afresh, and dies during the drain. B takes the nodes over and
    carries the restart out: the first epoch ends ``reflector-lost``, the session runs
    in a new one, and every result of both is stored exactly once."""
    fired = threading.Event()
    over = threading.Event()

    class Dying(AgentClient):
        """A's client: A dies when it creates the reflector's half again (the session is
        draining by then): its supervisor never returns from the call, and its leases
        are given up; the call fails only once the test is over."""

        victim = 0

        def create_session(self, request: pb.CreateStampSessionRequest) -> None:
            r1 = f"127.0.0.1:{agents['r1'].port}"
            if request.ssid == Dying.victim and self.target == r1 and not fired.is_set():
                fired.set()
                over.wait()
                raise SouthboundError(grpc.StatusCode.UNAVAILABLE, "this replica is dead")
            super().create_session(request)

    a, ra, b, rb = _replicas(pg_url, agents, Dying, AgentClient)
    try:
        _, errors = a.create_sessions([_stateful("p0")])
        assert not errors
        assert not a.start_sessions(["p0"])
        wait_for("results", lambda: a.store.session("p0").cursor > 0, 30)
        row = a.store.session("p0")
        Dying.victim = row.ssid

        _lose(agents, "r1", row.ssid)

        assert fired.wait(15)
        ra.close()  # A dies: it stops collecting and its leases go to B
        wait_for("B to own the nodes", lambda: rb.owned >= {"s1", "r1"}, 15)
        wait_for(
            "the restart",
            lambda: (
                [e.epoch for e in b.store.epochs(row.id)] == [0, 1]
                and b.store.session("p0").state == "running"
            ),
            30,
        )
        assert b.store.epochs(row.id)[0].end_reason == "reflector-lost"
        wait_for("results of the new epoch", lambda: b.store.session("p0").cursor > 0, 30)
        _each_epoch_once(b, "p0")
    finally:
        over.set()
        _close(rb, ra, b, a)


def test_a_batch_start_refuses_only_the_session_being_destroyed(
    pg_url: str, agents: dict[str, AgentServer]
) -> None:
    """B starts three created sessions in one batch while a destroy of one of them is
    recorded (through any replica) after B read their rows: that one is refused with
    its own error and is destroyed; the other two start."""

    class DestroyingStore(PostgresStore):
        """B's store: the destroy of ``victim`` is recorded just before B begins the
        sessions' epochs."""

        victim = ""

        def begin_epochs(
            self,
            items: Sequence[tuple[str, str | None]],
            now_ns: int,
            *,
            claimer: str | None = None,
        ) -> set[str]:
            if DestroyingStore.victim:
                self.mark_destroying([DestroyingStore.victim])
            return super().begin_epochs(items, now_ns, claimer=claimer)

    a, ra, b, rb = _replicas(pg_url, agents, b_store=DestroyingStore(pg_url))
    try:
        names = ["p0", "p1", "p2"]
        _, errors = a.create_sessions([_spec(n) for n in names])
        assert not errors
        victim = a.store.session("p1")
        DestroyingStore.victim = "p1"

        errors = b.start_sessions(names)

        assert set(errors) == {"p1"}
        assert "being destroyed" in str(errors["p1"])
        wait_for("the destroy", lambda: a.store.session("p1").state == "destroyed", 15)
        assert victim.ssid not in _carried(agents, "s1")
        assert victim.ssid not in _carried(agents, "r1")
        assert {a.store.session(n).state for n in ("p0", "p2")} == {"running"}
        wait_for("results", lambda: all(a.store.session(n).cursor > 0 for n in ("p0", "p2")), 30)
        _exactly_once(a, ["p0", "p2"])
    finally:
        _close(rb, ra, b, a)


class RacingStartStore(PostgresStore):
    """B's store: when B reads the rows of the sessions in ``race`` to start them, A
    starts them (whole) right after that read: B's rows say ``created``, the sessions
    run by the time B goes on."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.race: list[str] = []
        self.other: Controller | None = None

    def _race(self, names: Sequence[str]) -> None:
        if self.race and set(names) >= set(self.race):
            assert self.other is not None
            race, self.race = self.race, []
            if len(race) == 1:
                self.other.start_session(race[0])
            else:
                assert not self.other.start_sessions(race)

    def sessions_named(self, names: Sequence[str]) -> list[SessionRow]:
        rows = super().sessions_named(names)
        self._race(names)
        return rows

    def session(self, name: str) -> SessionRow:
        row = super().session(name)
        self._race([name])
        return row


@pytest.mark.parametrize("batch", [True, False], ids=["batch", "single"])
def test_two_replicas_starting_the_same_created_sessions_at_once_start_each_once(
    pg_url: str, agents: dict[str, AgentServer], batch: bool
) -> None:
    """A and B start the same created sessions at once (a batch start, as ``apply``'s,
    or one by one): B reads the rows (``created``), then A's start runs whole. B must not
    start them again (end A's epoch and begin another, whose cursor starts over while the
    sender goes on in A's): B's start of each is refused as a start of a running session
    is on one controller (``WrongStateError``, FAILED_PRECONDITION northbound), and
    every session runs on in its first epoch with every result stored exactly once."""
    store = RacingStartStore(pg_url)
    a, ra, b, rb = _replicas(pg_url, agents, b_store=store)
    store.other = a
    try:
        names = ["p0", "p1", "p2"] if batch else ["p0"]
        _, errors = a.create_sessions([_spec(n) for n in names])
        assert not errors
        rows = {n: a.store.session(n) for n in names}
        store.race = list(names)

        if batch:
            errors = b.start_sessions(names)
        else:
            errors = {}
            try:
                b.start_session("p0")
            except Exception as exc:  # noqa: BLE001 - the test asserts on it
                errors["p0"] = exc

        assert not store.race  # A's start ran in between
        assert set(errors) == set(names)
        for name, error in errors.items():
            assert isinstance(error, WrongStateError), (name, error)
            assert "running" in str(error), (name, error)
        for name in names:
            assert a.store.session(name).state == "running"
            assert [e.epoch for e in a.store.epochs(rows[name].id)] == [0], name
            assert a.store.epochs(rows[name].id)[0].ended_ns is None, name
        wait_for("results", lambda: all(a.store.session(n).cursor > 20 for n in names), 30)
        _exactly_once(a, names)
        for name in names:
            assert [e.epoch for e in a.store.epochs(rows[name].id)] == [0], name
    finally:
        _close(rb, ra, b, a)


def _sent_once(c: Controller, name: str) -> None:
    """Every result of each of the finished session's epochs is stored exactly once."""
    row = c.store.session(name)
    records = c.store.records(row.id)
    for epoch in c.store.epochs(row.id):
        seqs = [r.seq for e, r in records if e == epoch.epoch]
        expected = [s for s in range(epoch.sent) if s % LOSS_EVERY != LOSS_EVERY - 1]
        assert seqs == expected, (name, epoch.epoch)


def test_a_stop_the_sender_never_got_is_sent_again_by_the_owner(
    pg_url: str, agents: dict[str, AgentServer]
) -> None:
    """B stops a running session whose sender A owns, and the stop never reaches the
    sender (B's call returns as if it had: lost on the way, or ignored by the agent).
    The row says ``stopping`` while the sender goes on sending. A's repair finds the
    session still running on its sender and tells it again, until it stops: the
    session drains, its row and epoch end ``finished`` (the stop's time recorded), and
    every result is stored exactly once."""
    ignored: list[int] = []

    class Deaf(AgentClient):
        """B's client: the stop of the victim never reaches the sender."""

        victim = 0

        def stop_session(self, ssid: int) -> None:
            if ssid == Deaf.victim and self.target == f"127.0.0.1:{agents['s1'].port}":
                ignored.append(ssid)
                return
            super().stop_session(ssid)

    a, ra, b, rb = _replicas(pg_url, agents, AgentClient, Deaf)
    try:
        names = ["p0", "p1"]
        _running(a, names)
        row = a.store.session("p0")
        Deaf.victim = row.ssid

        b.stop_session("p0")

        assert ignored == [row.ssid]
        assert a.store.session("p0").state == "stopping"
        assert _sender_state(agents, row.ssid) == pb.SESSION_STATE_RUNNING
        wait_for("the owner to stop it", lambda: a.store.session("p0").state == "finished", 30)
        assert _sender_state(agents, row.ssid) == pb.SESSION_STATE_FINISHED
        epochs = a.store.epochs(row.id)
        assert [(e.epoch, e.end_reason) for e in epochs] == [(0, "finished")]
        assert epochs[0].stopped_ns is not None
        assert epochs[0].sent > 0
        _sent_once(a, "p0")
        _exactly_once(a, ["p1"])
    finally:
        _close(rb, ra, b, a)


def test_a_stop_through_a_replica_that_cannot_reach_the_sender_is_completed_by_the_owner(
    pg_url: str, agents: dict[str, AgentServer]
) -> None:
    """B stops a running session whose sender A owns, and B cannot reach the sender
    (A can); A's repair looks at the sender while B's call is failing (the row says
    ``stopping`` by then). The stop's intent survives: B answers that the stop is
    recorded and the sender not told yet (not an error, not a revert to ``running``),
    the row stays ``stopping``, and A tells the sender: the session drains and
    finishes, every result stored exactly once."""
    cut: list[int] = []
    a: Controller | None = None

    class Cut(AgentClient):
        """B's client: the sender is out of its reach for the victim's stop."""

        victim = 0

        def stop_session(self, ssid: int) -> None:
            if ssid == Cut.victim and self.target == f"127.0.0.1:{agents['s1'].port}":
                cut.append(ssid)
                assert a is not None
                owner = a
                t = threading.Thread(target=lambda: owner.check_node("s1"), daemon=True)
                t.start()
                t.join(5)
                raise SouthboundError(grpc.StatusCode.UNAVAILABLE, "cut off from s1")
            super().stop_session(ssid)

    a, ra, b, rb = _replicas(pg_url, agents, AgentClient, Cut)
    try:
        names = ["p0", "p1"]
        _running(a, names)
        row = a.store.session("p0")
        Cut.victim = row.ssid

        pending = b.stop_session("p0")

        assert cut == [row.ssid]
        assert "s1" in pending
        assert "cut off from s1" in pending
        assert a.store.session("p0").state == "stopping"
        wait_for("the owner to stop it", lambda: a.store.session("p0").state == "finished", 30)
        assert _sender_state(agents, row.ssid) == pb.SESSION_STATE_FINISHED
        epochs = a.store.epochs(row.id)
        assert [(e.epoch, e.end_reason) for e in epochs] == [(0, "finished")]
        assert epochs[0].stopped_ns is not None
        _sent_once(a, "p0")
        _exactly_once(a, ["p1"])
    finally:
        _close(rb, ra, b, a)
