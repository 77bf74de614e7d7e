"""The controller's PostgreSQL cut off by the network (no FIN, no RST: a partition): a
statement fails within the store's TCP user timeout (``pgstore.TCP_DEFAULTS``), where
TCP's retransmissions alone held it about 15 minutes, and the store works again once
the path is back.

A real server in a network namespace of its own, on TCP over the namespace's loopback;
the store connects from inside the namespace; nftables (the kernel's firewall) drops the
server's packets both ways: the connection neither closes nor resets, as over a cut
network."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
from pyroute2 import netns as pyr_netns

from sixlab.controller.pgstore import TCP_DEFAULTS, PostgresStore
from sixlab.controller.store import StoreUnavailableError
from sixlab.testbed import DEFAULT_PREFIX, LabPostgres, entered, exec_in
from sixlab.testbed._netns import make_token, remove_namespace

PORT = 5432
#: The store's limit (s) and what the test allows beyond it (a loaded host).
USER_TIMEOUT_S = int(TCP_DEFAULTS["tcp_user_timeout"]) / 1000
SLACK_S = 20.0
CUT = (
    "add table inet sixlab_cut\n"
    "add chain inet sixlab_cut input { type filter hook input priority 0; }\n"
    f"add rule inet sixlab_cut input tcp dport {PORT} drop\n"
    f"add rule inet sixlab_cut input tcp sport {PORT} drop\n"
)


@pytest.fixture
def ns() -> Iterator[str]:
    name = f"{DEFAULT_PREFIX}{make_token()}-pg"
    pyr_netns.create(name)
    try:
        exec_in(name, ["ip", "link", "set", "lo", "up"])
        yield name
    finally:
        remove_namespace(name)


def _nft(ns: str, script: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=script, text=True,
                   check=True, capture_output=True)  # fmt: skip


def test_a_statement_on_a_cut_connection_fails_in_time_and_the_store_recovers(ns: str) -> None:
    settings = {"listen_addresses": "127.0.0.1", "port": str(PORT)}
    with LabPostgres(settings=settings, netns=ns), entered(ns):
        store = PostgresStore(f"postgresql://postgres@127.0.0.1:{PORT}/postgres")
        try:
            store.add_node("s1", "h:1", "sender")
            _nft(ns, CUT)
            out: list[object] = []

            def call() -> None:
                start = time.monotonic()
                try:
                    store.nodes()
                except StoreUnavailableError as exc:
                    out.append(exc)
                out.append(time.monotonic() - start)

            # A thread made here starts in the namespace, as the store's connections are.
            t = threading.Thread(target=call, daemon=True)
            t.start()
            t.join(USER_TIMEOUT_S + SLACK_S)
            assert not t.is_alive(), "the statement still waits on the cut connection"
            failure, took = out
            assert isinstance(failure, StoreUnavailableError), failure
            assert isinstance(took, float)
            assert took >= USER_TIMEOUT_S * 0.9  # the timeout, not a quicker failure
            print(f"the cut connection failed after {took:.1f} s")

            _nft(ns, "delete table inet sixlab_cut\n")
            assert [n.name for n in store.nodes()] == ["s1"]  # connected again
        finally:
            store.close()
