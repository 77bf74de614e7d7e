"""Zero configuration of ILNPv6 hosts (issue 12): locator|NID addresses claimed on each
of a multihomed host's links, and names from DNS in the names file.

Topology and helpers of ``test_ilnp_daemon`` (A with two links to R, B behind R).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sixlab.testbed import Testbed
from tests.integration.test_ilnp_daemon import (
    ID_A,
    ID_B,
    PREFIX,
    EchoServer,
    IlnpNet,
    UdpFlow,
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


def _addresses(net: IlnpNet, ifname: str) -> str:
    return net.a.exec(["ip", "-6", "addr", "show", "dev", ifname]).stdout


def test_multihomed_host_claims_each_locator_on_its_own_link(net: IlnpNet) -> None:
    """A's two links have no global address: each locator's address goes on its link
    (named with ``@IF``, given in the opposite order of the interfaces), packets for
    each arrive there, a carrier loss on one moves the flow to the other, and both
    addresses go at exit."""
    net.ip(net.a, "addr", "del", "2001:db8:a::a/64", "dev", "eth0")
    net.ip(net.a, "addr", "del", "2001:db8:d::a/64", "dev", "eth1")
    da = net.start(
        net.a,
        "::a",
        ["2001:db8:d::/64,20@eth1", "2001:db8:a::/64,10@eth0"],
        interfaces=("eth0", "eth1"),
        policy="none",
    )
    net.start(net.b, "::b", ["2001:db8:b::/64"], policy="none")
    assert "2001:db8:a::a/64" in _addresses(net, "eth0")
    assert "2001:db8:d::a/64" in _addresses(net, "eth1")
    assert "2001:db8:d::a" not in _addresses(net, "eth0")
    echo = EchoServer(net.b, ID_B)
    flow = UdpFlow(net.a, ID_A, ID_B, gap=0.05).start()
    try:
        wait_until(lambda: len(flow.answered) >= 10, what="flow over eth0")
        net.ip(net.r, "link", "set", "ra", "down")  # carrier loss on A's eth0
        wait_until(lambda: da.status()["withdrawn"] == ["2001:db8:a:0"], what="a:0 withdrawn")
        answered = len(flow.answered)
        wait_until(lambda: len(flow.answered) >= answered + 10, what="flow over eth1")
    finally:
        flow.stop()
        echo.close()
    da.proc.terminate()
    da.proc.wait(timeout=10)
    assert "2001:db8:a::a" not in _addresses(net, "eth0")
    assert "2001:db8:d::a" not in _addresses(net, "eth1")


def test_a_locator_named_with_a_link_the_host_does_not_serve_is_refused(net: IlnpNet) -> None:
    argv = [sys.executable, "-m", "sixlab.cli.ilnp", "host", "--nid", "::a"]
    argv += ["--locator", "2001:db8:d::/64@eth1", "--interface", "eth0"]
    done = net.a.exec([*argv, "--control", str(net.tmp / "x.sock")], check=False)
    assert done.returncode == 2
    assert "locator @eth1: not an --interface link" in done.stderr
