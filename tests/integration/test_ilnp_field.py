"""The ILNPv6 host in the field (issue 12): restarts, moves under every policy, locators
held by the links, plain IPv6 neighbours, zero configuration.

The topology and helpers are those of ``test_ilnp_daemon``: A and B behind router R,
C beside them (here also the plain IPv6 host, which runs no daemon).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sixlab.testbed import Testbed
from tests.integration.test_ilnp_daemon import (
    ECHO_PORT,
    ID_A,
    ID_B,
    PREFIX,
    EchoServer,
    IlnpNet,
    a_client,
    wait_until,
)

pytestmark = pytest.mark.root


@pytest.fixture
def net(tmp_path: Path) -> Iterator[IlnpNet]:
    with Testbed(prefix=PREFIX) as tb:
        network = IlnpNet(tb, tmp_path)
        try:
            yield network
        finally:
            network.stop_daemons()


def echo_retrying(client: socket.socket, payload: bytes, seconds: float) -> float:
    """Send ``payload`` until it comes back (every 0.2 s); how long that took."""
    client.settimeout(0.2)
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        client.send(payload)
        try:
            while client.recv(100) != payload:
                pass
        except TimeoutError:
            continue
        return time.monotonic() - started
    raise AssertionError(f"no answer to {payload!r} in {seconds} s")


@pytest.mark.parametrize("policy", ["none", "socket"])
def test_restarted_host_reaches_its_peers_again(net: IlnpNet, policy: str) -> None:
    """Issue 12 #3: A restarts (new nonces); B still holds A's old session. Within a few
    seconds B takes A's new nonce as a new session, and the echo works again."""
    da = net.start(net.a, "0:0:0:a", ["2001:db8:a:0,10"], policy="none")
    db = net.start(net.b, "0:0:0:b", ["2001:db8:b:0"], policy=policy)
    echo = EchoServer(net.b, ID_B)
    try:
        with a_client(net) as client:
            echo_retrying(client, b"before", 5)
        if policy == "none":
            assert db.status()["ilcc_size"] == 1
        da.proc.terminate()
        da.proc.wait(timeout=10)
        net.start(net.a, "0:0:0:a", ["2001:db8:a:0,10"], policy="none")
        with a_client(net) as client:
            echo_retrying(client, b"after restart", 15)
            for i in range(5):
                client.send(b"%d" % i)
                assert client.recv(100) == b"%d" % i
        if policy == "none":
            assert db.counter("removed_peer_restarted") == 1
    finally:
        echo.close()


def test_move_is_acknowledged_by_a_peer_added_by_name_before_it_ever_answered(
    net: IlnpNet,
) -> None:
    """Issue 12 #6: A adds B with ``add-peer``, sends it one datagram B never answers
    (a socket that does not reply), then moves: B's acknowledgement completes it."""
    da = net.start(net.a, "0:0:0:a", ["2001:db8:a:0,10"], policy="none")
    db = net.start(net.b, "0:0:0:b", ["2001:db8:b:0"], policy="none")
    assert da.request("add-peer", name="bob") == {"ok": True, "nid": "0:0:0:b"}
    silent = net.b.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    silent.bind((ID_B, ECHO_PORT))
    client = net.a.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        client.bind((ID_A, 0))
        client.sendto(b"anyone?", (ID_B, ECHO_PORT))
        wait_until(lambda: db.status()["ilcc_size"] == 1, what="B adopts A")
        (entry,) = da.request("cache")["entries"]
        assert entry["peer_nonce"] is None
        net.r.add_address("ra", "2001:db8:c::1")
        net.a.add_address("eth0", "2001:db8:c::a")
        da.request("set-locators", locators=["2001:db8:c:0,0", "2001:db8:a:0,10"])
        wait_until(lambda: da.counter("lu_acked") >= 1, what="LU acknowledged")
    finally:
        client.close()
        silent.close()
    assert da.counter("lu_bad_nonce") == 0
    assert da.counter("lu_failed") == 0
