"""Simulated agents for the controller-replica tests (test_replicas, test_replica_lifecycle,
test_replica_notify): the real southbound gRPC API serving synthetic results
(``sixlab.southbound.simagent``), and a poll for a condition they bring about."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from sixlab.southbound import AgentServer
from sixlab.southbound.simagent import serve_simulated


@contextlib.contextmanager
def simulated_agents(
    senders: list[str], reflectors: list[str], *, loss_every: int
) -> Iterator[dict[str, AgentServer]]:
    """Sender and reflector agents on ephemeral ports of 127.0.0.1, by name; stopped when
    the body ends. A sender loses every ``loss_every``-th packet."""
    servers: dict[str, AgentServer] = {}
    try:
        for name in senders:
            servers[name] = serve_simulated("127.0.0.1:0", "sender", loss_every=loss_every)
        for name in reflectors:
            servers[name] = serve_simulated("127.0.0.1:0", "reflector")
        yield servers
    finally:
        for s in servers.values():
            s.stop(None)


def wait_for(what: str, check: Callable[[], object], timeout: float) -> float:
    """Poll ``check()`` until true (AssertionError naming ``what`` after ``timeout``
    seconds); the time it took."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - start
