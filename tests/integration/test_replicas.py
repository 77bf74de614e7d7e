"""Controller replicas on one PostgreSQL, or on one SQLite file of one host: shared work,
failover after kill -9, exactly once; a replica that lost its lease (fencing).

Three ``sixlab controller serve --replica`` processes share a real PostgreSQL (the lab's
server), or one SQLite file, and collect 100 sessions from two simulated sender agents
(50 each) and one simulated reflector. The replica that holds the lease of one sender,
half of the sessions, is killed with SIGKILL: another must take its sessions over within
10 s, and in the end every (session, epoch, Seq) the agents produced is stored exactly
once.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from sixlab.controller import Controller, ReplicaManager, SessionSpec
from sixlab.controller.client import ControllerClient
from sixlab.controller.store import open_store
from sixlab.southbound import AgentServer
from sixlab.southbound import stamp_pb2 as pb
from sixlab.southbound.client import AgentClient
from tests.integration._simagents import simulated_agents, wait_for

CONTROLLER_CMD = [
    sys.executable,
    "-c",
    "import sys; from sixlab.cli.controller import main; sys.exit(main(sys.argv[1:]))",
    "controller",
]
SESSIONS = 100
INTERVAL_NS = 50_000_000  # 20 packets/s per session: 2,000 results/s in all
LOSS_EVERY = 25  # every 25th Seq is lost: loss accounting is exercised too
LEASE_TTL_S = 5.0
TAKEOVER_BOUND_S = 10.0


class Replica:
    def __init__(self, name: str, url: str, tmp: Path, *, destroy_poll_s: float = 0.0) -> None:
        """``destroy_poll_s``: how often a destroy's waiter looks at the store should no
        notice wake it (``core.DESTROY_POLL_S``; 0: as released)."""
        self.name = name
        self.address = f"unix:{tmp}/{name}.sock"
        self.log = (tmp / f"{name}.log").open("w")
        cmd = CONTROLLER_CMD
        if destroy_poll_s:
            cmd = [sys.executable, "-c",
                   "import sys; from sixlab.controller import core;"
                   " core.DESTROY_POLL_S = float(sys.argv.pop(1));"
                   " from sixlab.cli.controller import main; sys.exit(main(sys.argv[1:]))",
                   str(destroy_poll_s), "controller"]  # fmt: skip
        self.proc = subprocess.Popen(
            [*cmd, "serve", "--db", url, "--grpc", self.address,
             "--replica", name, "--lease-ttl", str(LEASE_TTL_S), "--verbose"],
            stdout=subprocess.PIPE, stderr=self.log, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith(f"controller: grpc={self.address}"), line
        assert f"replica={name}" in line, line
        self.client = ControllerClient(self.address)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.log.close()


@pytest.fixture(params=["postgresql", "sqlite"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """What the replicas share: a database on the lab's PostgreSQL, or one SQLite file
    (the replicas then all run on this host)."""
    if request.param == "sqlite":
        return str(tmp_path / "controller.sqlite")
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def agents() -> Iterator[dict[str, AgentServer]]:
    with simulated_agents(["s1", "s2"], ["r1"], loss_every=LOSS_EVERY) as servers:
        yield servers


def _register(api: ControllerClient, agents: dict[str, AgentServer]) -> None:
    """The simulated agents registered and initialised through ``api`` (a replica's)."""
    for name, server in agents.items():
        role = "reflector" if name.startswith("r") else "sender"
        api.register_node(name, f"127.0.0.1:{server.port}", role)
        api.init_node(name)


def test_a_killed_replicas_sessions_are_taken_over_and_stored_exactly_once(
    db: str, agents: dict[str, AgentServer], tmp_path: Path
) -> None:
    replicas = {n: Replica(n, db, tmp_path) for n in ("c1", "c2", "c3")}
    watch = open_store(db)
    try:
        api = replicas["c1"].client
        _register(api, agents)
        for i in range(SESSIONS):
            sender = "s1" if i < SESSIONS // 2 else "s2"
            # Requests go to every replica in turn: any of them answers.
            c = replicas[f"c{i % 3 + 1}"].client
            c.create_session(
                SessionSpec(f"p{i}", sender, "r1", "2001:db8::2", interval_ns=INTERVAL_NS,
                            loss_timeout_ns=200_000_000, collect="stream")
            )  # fmt: skip
            c.start_session(f"p{i}")

        # The leases settle: each sender node is held by one live replica, and results
        # of every session are being stored.
        owners: dict[str, str | None] = {}

        def settled() -> bool:
            owners.update(watch.lease_owners())
            # A fair share is one node of each group a replica: the senders are collected
            # by two different processes.
            return all(owners.get(n) in replicas for n in agents) and owners["s1"] != owners["s2"]

        wait_for("leases to settle", settled, 30)
        rows = {r.name: r for r in watch.sessions()}
        wait_for(
            "every session to store results",
            lambda: all(watch.session(n).cursor > 0 for n in rows),
            30,
        )
        victim = owners["s1"]
        assert victim is not None
        others = [n for n in replicas if n != victim]
        s1_sessions = [n for n, r in rows.items() if r.sender == "s1"]
        assert len(s1_sessions) == SESSIONS // 2
        before = {n: watch.session(n).cursor for n in s1_sessions}

        replicas[victim].kill()
        killed = time.monotonic()

        # The takeover: another replica holds s1's lease (the lease mechanics: lease
        # time plus a heartbeat), then stores its sessions' results again (that also
        # needs CPU for the stream's opening: bounded generously, reported).
        wait_for(
            "another replica to take s1",
            lambda: watch.lease_owners().get("s1") in others,
            TAKEOVER_BOUND_S + 5,
        )
        taken = time.monotonic() - killed
        assert taken < TAKEOVER_BOUND_S
        wait_for(
            "s1's sessions to be collected again",
            lambda: all(watch.session(n).cursor > before[n] + 20 for n in s1_sessions),
            60,
        )
        takeover = time.monotonic() - killed

        api = replicas[others[0]].client
        for name in rows:
            api.stop_session(name)
        for name in rows:
            api.wait_state(name, ["finished"], 60)

        for name, row in rows.items():
            stored = watch.records(row.id)
            epochs = {e for e, _ in stored}
            assert epochs == {0}, (name, epochs)
            seqs = [r.seq for _, r in stored]
            sent = watch.session(name).sent
            expected = [s for s in range(sent) if s % LOSS_EVERY != LOSS_EVERY - 1]
            # Every Seq the agent produced, once: nothing lost, nothing twice.
            assert seqs == expected, (name, len(seqs), len(expected))
            assert watch.record_ids(row.id) == [(0, i) for i in range(1, len(expected) + 1)]
            assert watch.session(name).lost == sent // LOSS_EVERY
        print(f"after kill -9: lease taken in {taken:.1f} s, results stored in {takeover:.1f} s")
    finally:
        watch.close()
        for r in replicas.values():
            r.close()


#: A destroy's waiter looks at the store this seldom in the test below (s): longer than
#: it waits (``core.DESTROY_WAIT_S``), so that only the owner's notice can answer it.
NO_POLL_S = 60.0
#: What a destroy through the replica that does not own the sender may take there (s):
#: generous for a loaded host, and far below the 20 s the waiter would wait otherwise.
DESTROY_BOUND_S = 5.0


def _time_destroyed(db: str, name: str, start: float, out: list[float]) -> None:
    """Append when (since ``start``) the session's row is seen destroyed, from a store
    of its own; give up after four times the bound."""
    store = open_store(db)
    try:
        while time.monotonic() - start < DESTROY_BOUND_S * 4:
            if store.session(name).state == "destroyed":
                out.append(time.monotonic() - start)
                return
            time.sleep(0.01)
    finally:
        store.close()


def test_a_destroy_through_a_replica_is_carried_out_and_answered_at_once_by_notices(
    db: str, agents: dict[str, AgentServer], tmp_path: Path
) -> None:
    """Two ``serve --replica`` processes, each holding one sender's lease. A session is
    destroyed through the replica that does not own its sender: the owner hears of it
    (the store's notice, from the other process) and carries it out, and the replica
    that was asked hears that it is done, both at once rather than at the owner's next
    round and the waiter's next look (set past its wait here)."""
    replicas = {n: Replica(n, db, tmp_path, destroy_poll_s=NO_POLL_S) for n in ("c1", "c2")}
    watch = open_store(db)
    try:
        api = replicas["c1"].client
        _register(api, agents)
        names = {"s1": ["a0", "a1"], "s2": ["b0", "b1"]}
        for sender, paths in names.items():
            for path in paths:
                api.create_session(
                    SessionSpec(path, sender, "r1", "2001:db8::2", interval_ns=INTERVAL_NS,
                                loss_timeout_ns=200_000_000, collect="stream")
                )  # fmt: skip
                api.start_session(path)
        owners: dict[str, str | None] = {}

        def settled() -> bool:
            owners.update(watch.lease_owners())
            return all(owners.get(n) in replicas for n in agents) and owners["s1"] != owners["s2"]

        wait_for("leases to settle", settled, 30)
        every = [p for paths in names.values() for p in paths]
        wait_for("results", lambda: all(watch.session(p).cursor > 0 for p in every), 30)
        for sender, (gone, kept) in names.items():
            asked = next(n for n in replicas if n != owners[sender])
            row = watch.session(gone)
            done: list[float] = []
            start = time.monotonic()
            watcher = threading.Thread(target=_time_destroyed, args=(db, gone, start, done))
            watcher.start()
            replicas[asked].client.destroy_session(gone)
            answered = time.monotonic() - start
            watcher.join()
            assert done, f"{gone} was not seen destroyed"
            print(f"destroy of {gone} through {asked}: carried out by {owners[sender]} after"
                  f" {done[0]:.2f} s, answered after {answered:.2f} s")  # fmt: skip
            assert answered < DESTROY_BOUND_S, (gone, answered)
            assert watch.session(gone).state == "destroyed"
            assert [e.end_reason for e in watch.epochs(row.id)] == ["destroyed"]
            for node in (sender, "r1"):
                carried = AgentClient(f"127.0.0.1:{agents[node].port}")
                try:
                    assert row.ssid not in carried.info(5).ssids, node
                finally:
                    carried.close()
            assert watch.session(kept).state == "running"
    finally:
        watch.close()
        for r in replicas.values():
            r.close()


def test_a_replica_that_lost_its_lease_stores_nothing_after_the_takeover(
    pg_url: str, agents: dict[str, AgentServer], caplog: pytest.LogCaptureFixture
) -> None:
    """Replica A stops heartbeating (as if paused past its lease, or cut off from the
    database) while its streams go on; B takes the senders over. A's next transaction of
    results carries a stale fencing token: refused, counted, logged, and A stops
    collecting; every record is stored once."""
    ttl, tick = 1.5, 0.5
    a = Controller(open_store(pg_url), poll_interval_s=0.05)
    b: Controller | None = None
    rb: ReplicaManager | None = None
    try:
        for name, server in agents.items():
            role = "reflector" if name.startswith("r") else "sender"
            a.register_node(name, f"127.0.0.1:{server.port}", role)
        ra = ReplicaManager(a, "A", ttl_s=ttl, tick_s=tick)
        ra.tick()  # A's one heartbeat: it holds every lease, and never renews them
        assert ra.owned == {"s1", "s2", "r1", "housekeeping"}
        for name in agents:
            a.init_node(name)
        specs = [
            SessionSpec(f"p{i}", f"s{i % 2 + 1}", "r1", "2001:db8::2", interval_ns=INTERVAL_NS,
                        loss_timeout_ns=200_000_000, collect="stream")
            for i in range(20)
        ]  # fmt: skip
        _, errors = a.create_sessions(specs)
        assert not errors
        assert not a.start_sessions([s.name for s in specs])
        wait_for("A to store", lambda: all(a.store.session(s.name).cursor > 0 for s in specs), 30)

        time.sleep(ttl + 0.2)  # A's leases expire; B claims them all
        b = Controller(open_store(pg_url), poll_interval_s=0.05)
        rb = ReplicaManager(b, "B", ttl_s=ttl, tick_s=tick)
        with caplog.at_level(logging.WARNING, logger="sixlab.controller.core"):
            rb.start()
            assert rb.owned == {"s1", "s2", "r1", "housekeeping"}
            cursors = {s.name: b.store.session(s.name).cursor for s in specs}
            wait_for(
                "B to store",
                lambda: all(b.store.session(n).cursor > c + 10 for n, c in cursors.items()),
                30,
            )
            # A's stores were refused: it stopped collecting each sender's sessions.
            wait_for("A to stop collecting", lambda: not any(a.collecting(s.name) for s in specs),
                  10)  # fmt: skip
        exposed = generate_latest(a.metrics.registry).decode()
        for node in ("s1", "s2"):
            assert f'sixlab_fenced_stores_total{{node="{node}"}}' in exposed
            assert any(
                f"node {node}: lease {node}: held by B" in r.getMessage() for r in caplog.records
            )
        assert "sixlab_fenced_stores_total{" not in generate_latest(b.metrics.registry).decode()

        for spec in specs:
            b.stop_session(spec.name)
        for spec in specs:
            assert b.wait_finished(spec.name, 60)
        for spec in specs:
            row = b.store.session(spec.name)
            seqs = [r.seq for _, r in b.store.records(row.id)]
            assert seqs == [s for s in range(row.sent) if s % LOSS_EVERY != LOSS_EVERY - 1]
            assert row.lost == row.sent // LOSS_EVERY
    finally:
        if rb is not None:
            rb.close()
        for c in (a, b):
            if c is not None:
                c.close()
                c.store.close()


def test_a_session_another_replica_creates_during_a_check_is_left_alone(
    pg_url: str, agents: dict[str, AgentServer], caplog: pytest.LogCaptureFixture
) -> None:
    """Replica B checks a node's agent while replica A creates a session on that node.
    A creates on the agents first and stores the row after; B must not take a session
    it sees in the store but not in the agent's answer it got before as lost: repaired
    (destroyed and created again) while A starts it, A's start met NOT_FOUND. Made
    deterministic: A creates a session right after each GetAgentInfo reply B gets, so
    every answer B compares predates the session and every store read follows it."""
    addresses = {f"127.0.0.1:{s.port}": name for name, s in agents.items()}
    repairs: list[tuple[str, str, int]] = []
    created: list[str] = []
    a: Controller | None = None

    def create_meanwhile() -> None:
        assert a is not None
        name = f"p{len(created)}"
        a.create_session(
            SessionSpec(name, "s1", "r1", "2001:db8::2", interval_ns=INTERVAL_NS, collect="stream")
        )
        created.append(name)

    class Hooked(AgentClient):
        """B's agent client: A's creation follows each info reply; repairs are recorded."""

        armed = False

        def info(self, timeout: float | None = None, *, ssids: bool = True) -> pb.GetAgentInfoReply:
            reply = super().info(timeout, ssids=ssids)
            if Hooked.armed:
                create_meanwhile()
            return reply

        def create_session(self, request: pb.CreateStampSessionRequest) -> None:
            repairs.append((addresses[self.target], "create", request.ssid))
            super().create_session(request)

        def destroy_session(self, ssid: int) -> None:
            repairs.append((addresses[self.target], "destroy", ssid))
            super().destroy_session(ssid)

    a = Controller(open_store(pg_url), supervise_interval_s=None)
    b = Controller(open_store(pg_url), supervise_interval_s=None, client_factory=Hooked)
    try:
        for name, server in agents.items():
            role = "reflector" if name.startswith("r") else "sender"
            a.register_node(name, f"127.0.0.1:{server.port}", role)
            a.init_node(name)
        a.create_session(SessionSpec("p-first", "s1", "r1", "2001:db8::2", collect="stream"))
        a.start_session("p-first")
        with caplog.at_level(logging.WARNING, logger="sixlab.controller.core"):
            Hooked.armed = True
            for node in ("s1", "r1"):
                b.reconcile_node(node)
            Hooked.armed = False
        assert created  # the interleaving took place
        assert repairs == []
        assert not [r for r in caplog.records if "creating it again" in r.getMessage()]
        # A starts what it created: every session is on both agents as A made it.
        assert a.start_sessions(created) == {}
        assert all(a.store.session(n).state == "running" for n in created)
    finally:
        for c in (a, b):
            c.close()
            c.store.close()
