"""The controller's stop check (docs/architecture.md, "A stop the sender did not get"):
sessions recorded ``stopping`` that their sender still runs are told again, their
states read ``POLL_ROUND`` at a time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from sixlab.controller import core
from sixlab.controller.core import Controller, SessionSpec
from sixlab.controller.store import SqliteStore
from sixlab.southbound import AgentClient, serve
from sixlab.southbound._generated import stamp_pb2 as pb

MS = 1_000_000


def test_a_stop_the_sender_did_not_get_is_sent_again_in_rounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saddr, raddr = f"unix:{tmp_path}/s.sock", f"unix:{tmp_path}/r.sock"
    servers = [serve(saddr, "sender"), serve(raddr, "reflector")]
    sender = AgentClient(saddr)
    ctl = Controller(SqliteStore(tmp_path / "c.db"), poll_interval_s=60)
    monkeypatch.setattr(core, "STOP_CHECK_S", 0.0)
    monkeypatch.setattr(core, "POLL_ROUND", 2)
    try:
        ctl.register_node("s", saddr, "sender")
        ctl.register_node("r", raddr, "reflector")
        ctl.init_node("s", source="::1", port=0)
        ctl.init_node("r", source="::1", port=0)
        port = ctl.client("r").info().port
        names = [f"p{i}" for i in range(5)]
        for name in names:
            ctl.create_session(
                SessionSpec(name=name, sender="s", reflector="r", reflector_address="::1",
                            reflector_port=port, interval_ns=10 * MS)
            )  # fmt: skip
            ctl.start_session(name)
        ssids = [ctl.store.session(n).ssid for n in names]
        # Recorded stopping, never told to the sender (a replica that could not reach it).
        ctl.store.set_states(names, "stopping")
        for ssid in ssids:
            (session,) = sender.counters(ssid).sessions
            assert session.state == pb.SESSION_STATE_RUNNING
        rounds: list[int] = []
        client = ctl.client("s")
        plain = client.call_many

        def counted(method: str, requests: Sequence[Any]) -> list[Any]:
            if method == "GetStampSessionResults" and all(r.max_results == 1 for r in requests):
                rounds.append(len(requests))
            return plain(method, requests)

        monkeypatch.setattr(client, "call_many", counted)
        ctl._complete_stops("s")  # first seen stopping: due after STOP_CHECK_S
        ctl._complete_stops("s")  # due: asked, and told to stop again
        assert sum(rounds) >= 5
        assert max(rounds) <= 2
        for ssid in ssids:
            (session,) = sender.counters(ssid).sessions
            assert session.state in (pb.SESSION_STATE_DRAINING, pb.SESSION_STATE_FINISHED)
    finally:
        ctl.close()
        sender.close()
        for server in servers:
            server.stop(None)
