"""The controller's PostgreSQL goes away and comes back (a crash and its restart): the
northbound API answers UNAVAILABLE meanwhile, not a bad-argument error nor a hang; the
controller stays up and collects again by itself once the server is back; every
(session, epoch, Seq) the agent produced is stored exactly once.

A real ``sixlab controller serve`` process on a PostgreSQL server of its own (the lab's
``LabPostgres``: ``pg_ctl stop -m immediate`` drops every connection at once, as a crash
does), collecting from a simulated sender agent (the real southbound gRPC API)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from sixlab.controller import SessionSpec
from sixlab.controller.client import ControllerClient, NorthboundError
from sixlab.controller.store import open_store
from sixlab.testbed import LabPostgres
from tests.integration._simagents import simulated_agents, wait_for

SESSIONS = 20
INTERVAL_NS = 50_000_000  # 20 packets/s per session
LOSS_EVERY = 25
#: How long the server stays down (s): longer than a collector's longest wait between
#: tries (``core.RETRY_MAX_S``), so that every loop of the controller meets it again.
OUTAGE_S = 8.0


@pytest.fixture
def server() -> Iterator[LabPostgres]:
    """A durable server (PostgreSQL's defaults), not the lab's throwaway settings: with
    ``synchronous_commit=off`` a crash loses commits the agents were already told
    were stored (the exactly-once guarantee needs a commit that lasts)."""
    with LabPostgres(settings={"max_connections": "200"}) as pg:
        yield pg


def _cursors(url: str, names: list[str]) -> list[int]:
    """The sessions' stored cursors, read afresh."""
    store = open_store(url)
    try:
        return [store.session(n).cursor for n in names]
    finally:
        store.close()


def _alive(client: ControllerClient) -> bool:
    try:
        client.nodes()
    except NorthboundError:
        return False
    return True


class Controller:
    """``sixlab controller serve`` on ``url``, its log in ``tmp``; a client of it."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.address = f"unix:{tmp}/c.sock"
        self.log_path = tmp / "controller.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sixlab", "controller", "serve", "--db", url,
             "--grpc", self.address, "--verbose"],
            stdout=subprocess.PIPE, stderr=self._log, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith(f"controller: grpc={self.address}"), line
        self.api = ControllerClient(self.address)

    def close(self) -> None:
        self.api.close()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self._log.close()


def _refused_unavailable(call: Callable[[], object]) -> NorthboundError:
    with pytest.raises(NorthboundError) as refused:
        call()
    assert refused.value.code is grpc.StatusCode.UNAVAILABLE, refused.value
    return refused.value


def test_a_database_outage_is_unavailable_then_collection_resumes_exactly_once(
    server: LabPostgres, tmp_path: Path
) -> None:
    url = server.url()
    with simulated_agents(["s1"], ["r1"], loss_every=LOSS_EVERY) as agents:
        ctl = Controller(url, tmp_path)
        try:
            api = ctl.api
            for name, agent in agents.items():
                role = "reflector" if name.startswith("r") else "sender"
                api.register_node(name, f"127.0.0.1:{agent.port}", role)
                api.init_node(name)
            names = [f"p{i}" for i in range(SESSIONS)]
            for name in names:
                api.create_session(
                    SessionSpec(name, "s1", "r1", "2001:db8::2", interval_ns=INTERVAL_NS,
                                loss_timeout_ns=200_000_000, collect="stream")
                )  # fmt: skip
                api.start_session(name)
            wait_for("results of every session", lambda: all(_cursors(url, names)), 30)

            server.stop("immediate")
            down = time.monotonic()
            refused = _refused_unavailable(api.nodes)
            # The controller answered: it is its database that it could not reach.
            assert refused.details.startswith("database: "), refused
            assert "\n" not in refused.details
            assert time.monotonic() - down < 10, "the refusal took as long as a hang"
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down)))
            assert ctl.proc.poll() is None, "the controller exited while the database was down"
            _refused_unavailable(lambda: api.session("p0"))

            server.start()
            back = wait_for("the northbound API to answer again", lambda: _alive(api), 30)
            before = _cursors(url, names)

            def stored_more() -> bool:  # 2 s of results (40 a session) since the restart
                return all(c > b + 40 for c, b in zip(_cursors(url, names), before, strict=True))

            resumed = wait_for("collection to resume", stored_more, 60)
            for name in names:
                api.stop_session(name)
            for name in names:
                api.wait_state(name, ["finished"], 60)
        finally:
            ctl.close()
    watch = open_store(url)
    try:
        for name in names:
            row = watch.session(name)
            stored = watch.records(row.id)
            assert {e for e, _ in stored} == {0}, name
            seqs = [r.seq for _, r in stored]
            expected = [s for s in range(row.sent) if s % LOSS_EVERY != LOSS_EVERY - 1]
            # What the agent produced during the outage too: nothing lost, nothing twice.
            assert seqs == expected, (name, len(seqs), len(expected))
            assert row.lost == row.sent // LOSS_EVERY
    finally:
        watch.close()
    print(f"answering again {back:.1f} s after the restart, storing {resumed:.1f} s")
    # Every loop of the controller lived through it (a thread that died says "Exception
    # in thread" with its traceback), and said the outage in lines, not tracebacks.
    log = ctl.log_path.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert "database is out of reach" in log
    assert "synchronous_commit" not in log  # a durable server: no warning
