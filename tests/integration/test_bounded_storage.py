"""Bounded storage end to end: a controller collects simulated agents' results, the
housekeeper rolls them up and deletes raw results past retention, and ``stats`` over a
long range answers from the rollups."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sixlab.controller import Controller, SessionSpec
from sixlab.controller.housekeeping import Housekeeper, Retention
from sixlab.controller.rollup import MINUTE_NS
from sixlab.controller.store import Store, open_store
from sixlab.southbound import AgentServer
from sixlab.southbound.simagent import serve_simulated


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    url = tmp_path / "c.db" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    s = open_store(url)
    yield s
    s.close()


@pytest.fixture
def agents() -> Iterator[tuple[AgentServer, AgentServer]]:
    sender = serve_simulated("127.0.0.1:0", "sender", loss_every=7)
    reflector = serve_simulated("127.0.0.1:0", "reflector")
    try:
        yield sender, reflector
    finally:
        sender.stop(None)
        reflector.stop(None)


def test_stats_from_rollups_match_raw_stats_and_survive_retention(
    store: Store, agents: tuple[AgentServer, AgentServer]
) -> None:
    sender, reflector = agents
    ctl = Controller(store, poll_interval_s=0.05, supervise_interval_s=None)
    try:
        ctl.register_node("s", f"127.0.0.1:{sender.port}", "sender")
        ctl.register_node("r", f"127.0.0.1:{reflector.port}", "reflector")
        ctl.init_node("s")
        ctl.init_node("r")
        ctl.create_session(
            SessionSpec("p", "s", "r", "2001:db8::2", interval_ns=1_000_000, count=700,
                        loss_timeout_ns=50_000_000, collect="stream")
        )  # fmt: skip
        ctl.start_session("p")
        assert ctl.wait_finished("p", 30)
        exact = ctl.stats("p")  # a short range: raw results, exact
        assert exact.received == 600  # 700 sent, every 7th lost
        assert exact.lost == 100

        keeper = Housekeeper(store, Retention(raw_s=60, rollup_s=3600))
        assert keeper.run_once() == (600, 0, 0)  # rolled up; nothing old enough to go
        ctl.raw_stats_ns = 0  # every range is "long": rollups answer
        rolled = ctl.stats("p")
        assert (rolled.received, rolled.lost) == (exact.received, exact.lost)
        assert rolled.direct is not None
        assert exact.direct is not None
        assert (rolled.direct.min_ns, rolled.direct.max_ns, rolled.direct.mean_ns) == (
            exact.direct.min_ns, exact.direct.max_ns, exact.direct.mean_ns
        )  # fmt: skip
        assert abs(rolled.direct.p99_ns - exact.direct.p99_ns) <= exact.direct.p99_ns // 100
        assert rolled.direct_jitter_ns is not None

        # Two minutes later (the housekeeper's clock), raw results are past retention:
        # deleted, and stats still answer from the rollups.
        later = Housekeeper(
            store, Retention(raw_s=60), clock=lambda: time.time_ns() + 3 * MINUTE_NS
        )
        rolled_n, deleted, _ = later.run_once()
        assert (rolled_n, deleted) == (0, 600)
        row = store.session("p")
        assert store.count_results(row.id) == 0
        ctl.raw_stats_ns = 3600 * 10**9
        after = ctl.stats("p")  # raw results went: rollups answer even a short range
        assert (after.received, after.lost) == (600, 100)
        assert after.direct == rolled.direct
    finally:
        ctl.close()
