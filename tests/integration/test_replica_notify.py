"""Controller replicas told of each other's changes (``Store.subscribe``: LISTEN/NOTIFY on
PostgreSQL, the ``notices`` table on one SQLite file), orphan sessions on agents, and
``/metrics`` served from memory (docs/architecture.md, "Session lifecycle across
replicas", "Notices").

The agents are simulated (``sixlab.southbound.simagent``): the real southbound gRPC API.
Times are compared with the supervisor's round, set long here: what a replica does "at
once" must not wait for it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sixlab.controller import Controller, ReplicaManager, SessionSpec, core
from sixlab.controller.store import (
    Counters,
    EpochRow,
    ResultBatch,
    SqliteStore,
    Store,
    open_store,
)
from sixlab.southbound import AgentServer
from sixlab.southbound.client import (
    AgentClient,
    ReflectorSession,
    SenderSession,
    SouthboundError,
)
from tests.integration._simagents import simulated_agents, wait_for

INTERVAL_NS = 50_000_000  # 20 packets/s per session
LOSS_EVERY = 25
TTL_S, TICK_S = 3.0, 0.5
#: The supervisor's round in these tests (s): long, so that waiting for it shows.
ROUND_S = 20.0


@pytest.fixture
def agents() -> Iterator[dict[str, AgentServer]]:
    with simulated_agents(["s1"], ["r1"], loss_every=LOSS_EVERY) as servers:
        yield servers


def _spec(name: str) -> SessionSpec:
    return SessionSpec(
        name, "s1", "r1", "2001:db8::2", interval_ns=INTERVAL_NS,
        loss_timeout_ns=200_000_000, collect="stream",
    )  # fmt: skip


def _carried(agents: dict[str, AgentServer], node: str) -> set[int]:
    client = AgentClient(f"127.0.0.1:{agents[node].port}")
    try:
        return set(client.info(5).ssids)
    finally:
        client.close()


def _owner(store: Store, agents: dict[str, AgentServer], **kwargs: Any) -> Controller:
    """A controller with the nodes registered and initialised."""
    c = Controller(store, commit_interval_s=0.0, **kwargs)
    for name, server in agents.items():
        role = "reflector" if name.startswith("r") else "sender"
        c.register_node(name, f"127.0.0.1:{server.port}", role)
        c.init_node(name)
    return c


def _running(c: Controller, names: list[str]) -> None:
    _, errors = c.create_sessions([_spec(n) for n in names])
    assert not errors
    assert not c.start_sessions(names)
    wait_for("results", lambda: all(c.store.session(n).cursor > 0 for n in names), 30)


@pytest.fixture(params=["postgresql", "sqlite"])
def shared_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """What two replicas share: a database on the lab's PostgreSQL, or one SQLite file
    (each replica's store a connection of its own, as in two processes)."""
    if request.param == "sqlite":
        return str(tmp_path / "controller.sqlite")
    return str(request.getfixturevalue("pg_url"))


def _replicas(
    db: str, agents: dict[str, AgentServer], round_s: float
) -> tuple[Controller, ReplicaManager, Controller, ReplicaManager]:
    """A, holding every lease, and B, holding none, with supervisor rounds of ``round_s``
    (``db``: a PostgreSQL URL or an SQLite file; each replica has a store of its own)."""
    a = _owner(open_store(db), agents, supervise_interval_s=round_s)
    ra = ReplicaManager(a, "A", ttl_s=TTL_S, tick_s=TICK_S)
    ra.start()
    assert ra.owned == {*agents, "housekeeping"}
    b = Controller(open_store(db), supervise_interval_s=round_s, commit_interval_s=0.0)
    rb = ReplicaManager(b, "B", ttl_s=TTL_S, tick_s=TICK_S)
    rb.start()
    assert rb.owned == frozenset()
    return a, ra, b, rb


def _close(*items: Controller | ReplicaManager) -> None:
    for item in items:
        if isinstance(item, ReplicaManager):
            item.close()
    for item in items:
        if isinstance(item, Controller):
            item.close()
            item.store.close()


def _destroyed_at_once(
    owner: Controller, other: Controller, agents: dict[str, AgentServer], name: str
) -> None:
    """``other`` destroys ``name``, whose sender ``owner`` holds: carried out, and the
    caller told, within a fraction of a round (neither waits for one)."""
    row = owner.store.session(name)
    other.destroy_session(name, wait_s=ROUND_S / 4)  # DestroyPendingError if it waits
    assert other.store.session(name).state == "destroyed"
    assert row.ssid not in _carried(agents, "s1")
    assert row.ssid not in _carried(agents, "r1")
    assert [e.end_reason for e in owner.store.epochs(row.id)] == ["destroyed"]


def test_a_destroy_through_a_replica_that_does_not_own_the_sender_is_carried_out_at_once(
    shared_db: str, agents: dict[str, AgentServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """B records the destroy; A, the sender's owner, hears of it (NOTIFY; the notices
    table on SQLite) and carries it out at once rather than at its next round; B hears
    it is done rather than at its next look at the store (set to a round here)."""
    monkeypatch.setattr(core, "DESTROY_POLL_S", ROUND_S)
    a, ra, b, rb = _replicas(shared_db, agents, ROUND_S)
    try:
        names = [f"p{i}" for i in range(3)]
        _running(a, names)
        _destroyed_at_once(a, b, agents, "p0")
        # A second one: the owner still listens after carrying one out.
        _destroyed_at_once(a, b, agents, "p1")
        assert a.store.session("p2").state == "running"
    finally:
        _close(rb, ra, b, a)


def test_a_session_created_through_one_replica_is_in_the_owners_metrics_at_once(
    shared_db: str, agents: dict[str, AgentServer]
) -> None:
    """A exports the totals of the sessions of the sender it owns from memory, read
    again when the store tells it something changed: a session created through B is in
    A's next scrape, not only once A happens to read again (never, for a session that
    stores no result)."""
    a, ra, b, rb = _replicas(shared_db, agents, ROUND_S)
    try:
        _running(a, ["p0"])
        assert {p for p, _ in _packets(a)} == {"p0"}
        _, errors = b.create_sessions([_spec("p1")])
        assert not errors
        took = wait_for("p1 in A's scrape", lambda: ("p1", "sent") in _packets(a), ROUND_S / 4)
        assert _packets(b) == {}  # B owns no sender: it exports none of their sessions
        print(f"a session created through B is in A's scrape after {took:.2f} s")
    finally:
        _close(rb, ra, b, a)


def test_a_destroy_through_a_controller_that_does_not_own_the_sender_wakes_the_owner_in_process(
    tmp_path: Path, agents: dict[str, AgentServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two controllers in one process on one SQLite store: the owner is woken directly."""
    monkeypatch.setattr(core, "DESTROY_POLL_S", ROUND_S)
    store = SqliteStore(tmp_path / "c.db")
    a = _owner(store, agents, supervise_interval_s=ROUND_S)
    b = Controller(store, supervise_interval_s=None)
    b.set_ownership(lambda _node: False)
    try:
        _running(a, ["p0", "p1"])
        _destroyed_at_once(a, b, agents, "p0")
        assert a.store.session("p1").state == "running"
    finally:
        b.close()
        a.close()
        store.close()


#: The orphan grace of these tests (s).
GRACE_S = 3.0


def _orphan(agents: dict[str, AgentServer], ssid: int) -> None:
    """Create a session on both agents, as a replica that died before storing its row
    would have left it."""
    for node, request in (
        ("r1", ReflectorSession(ssid).request()),
        ("s1", SenderSession(ssid, "2001:db8::2", interval_ns=INTERVAL_NS).request()),
    ):
        client = AgentClient(f"127.0.0.1:{agents[node].port}")
        try:
            client.create_session(request)
        finally:
            client.close()


def _check(c: Controller) -> None:
    for node in ("s1", "r1"):
        assert c.check_node(node)


def test_a_session_left_on_the_agents_without_a_row_is_destroyed_after_the_grace(
    tmp_path: Path, agents: dict[str, AgentServer]
) -> None:
    """Sessions no row refers to are left alone for the grace (a creation through another
    replica stores its row after the agents have the session), then destroyed; the
    sessions of the store stay, whatever their state."""
    c = _owner(SqliteStore(tmp_path / "c.db"), agents, supervise_interval_s=None)
    c.orphan_grace_s = GRACE_S
    try:
        _running(c, ["live", "done"])
        c.stop_session("done")
        assert c.wait_finished("done", 30)
        mine = {c.store.session(n).ssid for n in ("live", "done")}
        orphan = 1000
        _orphan(agents, orphan)
        _check(c)
        _check(c)  # within the grace: a creation may be storing its row right now
        assert orphan in _carried(agents, "s1")
        assert orphan in _carried(agents, "r1")
        time.sleep(GRACE_S * 1.2)
        _check(c)
        assert _carried(agents, "s1") == mine
        assert _carried(agents, "r1") == mine
        assert c.store.session("live").state == "running"
        assert c.store.session("done").state == "finished"
    finally:
        c.close()
        c.store.close()


def test_a_half_a_destroy_could_not_remove_is_destroyed_by_the_owners_repair(
    tmp_path: Path, agents: dict[str, AgentServer]
) -> None:
    """A destroy whose call to the reflector failed leaves the reflector's half behind
    (the row is destroyed all the same): the owner's repair removes it after the grace,
    while an SSID taken again by a new session is kept."""
    fail: list[int] = []

    class Flaky(AgentClient):
        def destroy_session(self, ssid: int) -> None:
            if ssid in fail and self.target == f"127.0.0.1:{agents['r1'].port}":
                fail.remove(ssid)
                raise SouthboundError(grpc.StatusCode.UNAVAILABLE, "cut off")
            super().destroy_session(ssid)

    c = _owner(SqliteStore(tmp_path / "c.db"), agents, supervise_interval_s=None,
               client_factory=Flaky)  # fmt: skip
    c.orphan_grace_s = GRACE_S
    try:
        _running(c, ["a", "b"])
        a = c.store.session("a")
        fail.append(a.ssid)
        c.destroy_session("a")
        assert c.store.session("a").state == "destroyed"
        assert a.ssid not in _carried(agents, "s1")
        assert a.ssid in _carried(agents, "r1")  # the orphan
        _check(c)
        time.sleep(GRACE_S * 1.2)
        _check(c)
        b = c.store.session("b")
        assert _carried(agents, "r1") == {b.ssid}
        assert _carried(agents, "s1") == {b.ssid}
        assert c.store.session("b").state == "running"
    finally:
        c.close()
        c.store.close()


def _packets(c: Controller) -> dict[tuple[str, str], float]:
    """``sixlab_stamp_packets_total`` of a scrape of the controller, by (path, outcome)."""
    text = generate_latest(c.metrics.registry).decode()
    return {
        (s.labels["path"], s.labels["outcome"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "sixlab_stamp_packets_total"
    }


def _stored_packets(c: Controller, names: list[str]) -> dict[tuple[str, str], float]:
    """The same totals, read from the store."""
    out: dict[tuple[str, str], float] = {}
    for name in names:
        stats = c.epochs(name)
        for outcome in ("sent", "received", "lost", "unknown"):
            out[(name, outcome)] = float(sum(getattr(e, outcome) for e in stats))
    return out


def test_a_scrape_reads_no_session_from_the_store(tmp_path: Path) -> None:
    """The first scrape reads every session's totals in a few queries, whatever their
    number; the next ones read nothing (no store was changed but by results)."""
    cold: list[int] = []
    for n in (300, 3000):
        store = SqliteStore(tmp_path / f"{n}.db")
        store.add_node("s1", "127.0.0.1:1", "sender")
        store.add_node("r1", "127.0.0.1:2", "reflector")
        names = [f"p{i}" for i in range(n)]
        store.add_sessions(
            [(name, i + 1, "s1", "r1", asdict(_spec(name))) for i, name in enumerate(names)],
            now_ns=time.time_ns(),
        )
        store.begin_epochs([(name, None) for name in names], time.time_ns())
        rows = store.sessions()
        store.store_many(
            [
                ResultBatch(r.id, r.epoch, [], Counters(10 + i, i % 3, None, 0))
                for i, r in enumerate(rows)
            ],
            time.time_ns(),
        )
        c = Controller(store, supervise_interval_s=None)
        try:
            statements: list[str] = []
            store._conn.set_trace_callback(statements.append)
            first = _packets(c)
            cold.append(len(statements))
            statements.clear()
            again = _packets(c)
            assert statements == []
            store._conn.set_trace_callback(None)
            assert again == first
            assert first == _stored_packets(c, names)
            assert first[("p7", "sent")] == 17
            assert first[("p7", "lost")] == 1
        finally:
            c.close()
            store.close()
    assert cold[0] == cold[1] < 10


def test_metric_totals_kept_in_memory_match_the_store_after_a_takeover(
    pg_url: str, agents: dict[str, AgentServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collects and exports its sessions' totals; A leaves, B takes the sender over,
    reads the totals once and then counts what it stores: every scrape lies between the
    store read just before and just after it, without reading the store again; and
    once the sessions finished, it equals the store."""
    a, ra, b, rb = _replicas(pg_url, agents, 1.0)
    names = [f"p{i}" for i in range(3)]
    try:
        _running(a, names)
        assert {p for p, _ in _packets(a)} == set(names)
        assert _packets(b) == {}  # B owns no sender: it exports none of their sessions
        ra.close()
        a.close()
        wait_for("the takeover", lambda: rb.owns("s1"), 10 * TTL_S)
        cursors = {n: b.store.session(n).cursor for n in names}
        wait_for(
            "B to collect", lambda: all(b.store.session(n).cursor > cursors[n] for n in names), 30
        )
        reads: list[int] = []
        live_epochs = b.store.live_epochs

        def counted() -> dict[int, list[EpochRow]]:
            reads.append(1)
            return live_epochs()

        monkeypatch.setattr(b.store, "live_epochs", counted)
        start = _packets(b)
        assert len(reads) == 1  # the totals of a node taken over are read once
        cursors = {n: b.store.session(n).cursor for n in names}
        wait_for(
            "more results",
            lambda: all(b.store.session(n).cursor > cursors[n] + 20 for n in names),
            30,
        )
        before = _stored_packets(b, names)
        time.sleep(0.1)  # what was stored by then is counted (right after its commit)
        scraped = _packets(b)
        after = _stored_packets(b, names)
        assert len(reads) == 1
        for key, value in scraped.items():
            assert before[key] <= value <= after[key], key
        for name in names:
            assert scraped[(name, "received")] > start[(name, "received")] + 20
        for name in names:
            b.stop_session(name)
        for name in names:
            assert b.wait_finished(name, 60), name
        assert _packets(b) == _stored_packets(b, names)
    finally:
        _close(rb, ra, b, a)


def test_a_destroy_whose_notices_are_lost_is_still_carried_out_and_answered(
    pg_url: str, agents: dict[str, AgentServer]
) -> None:
    """The replicas' listening connections are cut: what was notified meanwhile is lost.
    Each store listens again and tells its controller it may have missed notices: the
    owner looks at every sender it holds at once, rather than at its next round; and a
    waiter that hears nothing still looks at the store (``DESTROY_POLL_S``)."""
    a, ra, b, rb = _replicas(pg_url, agents, ROUND_S)
    try:
        _running(a, ["p0", "p1"])
        with psycopg.connect(pg_url, autocommit=True) as conn:
            cut = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND query LIKE 'LISTEN%'"
            ).fetchall()
        assert len(cut) == 2  # A's and B's
        _destroyed_at_once(a, b, agents, "p0")
        b.store.unsubscribe(b._on_notice)  # B hears nothing from now on
        _destroyed_at_once(a, b, agents, "p1")
    finally:
        _close(rb, ra, b, a)
