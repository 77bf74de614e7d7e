"""What the supervisor reads each round once nothing changes, with simulated agents."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from sixlab.controller import Controller, SessionSpec
from sixlab.controller.store import SessionRow, SqliteStore
from sixlab.southbound import AgentClient
from sixlab.southbound import stamp_pb2 as pb
from sixlab.southbound.simagent import serve_simulated

SESSIONS = 300


class CountingStore(SqliteStore):
    """Counts the session rows read to compare nodes with their agents."""

    rows = 0

    def ssids_of(self, node: str, *, role: str = "sender") -> list[tuple[int, str]]:
        out = super().ssids_of(node, role=role)
        CountingStore.rows += len(out)
        return out

    def sessions_of(self, node: str, *, role: str = "sender") -> list[SessionRow]:
        out = super().sessions_of(node, role=role)
        CountingStore.rows += len(out)
        return out


class CountingClient(AgentClient):
    """Counts the GetAgentInfo calls (two a round: one node each) and the SSIDs their
    answers listed."""

    infos = 0
    ssids = 0
    lock = threading.Lock()

    def info(self, timeout: float | None = None, *, ssids: bool = True) -> pb.GetAgentInfoReply:
        reply = super().info(timeout, ssids=ssids)
        with CountingClient.lock:
            CountingClient.infos += 1
            CountingClient.ssids += len(reply.ssids)
        return reply


def _until(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _rounds(n: int) -> None:
    """Wait for ``n`` more supervisor rounds (each asks both agents)."""
    target = CountingClient.infos + 2 * n + 2  # the round under way may be half done
    _until(f"{n} rounds", lambda: CountingClient.infos >= target)


def test_steady_rounds_ask_the_agents_but_read_no_sessions(tmp_path: Path) -> None:
    """Each round asks every agent how it is; a node's sessions are read from the store
    to compare only when something changed (a lost session is still repaired at the
    next round) or every ``full_check_s`` (docs/architecture.md, "Orphan sessions")."""
    sender = serve_simulated("127.0.0.1:0", "sender")
    reflector = serve_simulated("127.0.0.1:0", "reflector")
    ctl = Controller(
        CountingStore(tmp_path / "c.db"), supervise_interval_s=0.02, client_factory=CountingClient
    )
    ctl.full_check_s = 3600.0
    probe = AgentClient(f"127.0.0.1:{reflector.port}")
    try:
        ctl.register_node("s", f"127.0.0.1:{sender.port}", "sender")
        ctl.register_node("r", f"127.0.0.1:{reflector.port}", "reflector")
        ctl.init_node("s")
        ctl.init_node("r")
        specs = [SessionSpec(f"p{i}", "s", "r", "2001:db8::2") for i in range(SESSIONS)]
        rows, errors = ctl.create_sessions(specs)
        assert errors == {}
        assert ctl.start_sessions([s.name for s in specs]) == {}
        _rounds(3)  # each node compared once since the last change

        CountingStore.rows = CountingClient.ssids = 0
        _rounds(20)
        # Before: 2 x 300 rows every round. At most one comparison of each node here,
        # should a notice of the store land in the window (none is expected).
        assert CountingStore.rows <= 2 * SESSIONS
        # Nor do the answers list the SSIDs (each listed 300 before): their count and
        # digest tell that nothing changed. A comparison asks for the list.
        assert CountingClient.ssids <= 2 * SESSIONS
        assert ctl.store.node("r").healthy  # the rounds still tell the health
        assert ctl.store.node("s").healthy

        # The agent's answer changed (a session lost): compared, and repaired, at once.
        lost = rows[7].ssid
        probe.destroy_session(lost)
        _until("the lost session repaired", lambda: lost in probe.info().ssids)

        # Every full_check_s the store is read whatever the answers.
        ctl.full_check_s = 0.0
        CountingStore.rows = 0
        _rounds(3)
        assert CountingStore.rows >= 2 * SESSIONS
    finally:
        probe.close()
        ctl.close()
        sender.stop(None)
        reflector.stop(None)
