"""ILNPv6 hosts that learn their locators from Router Advertisements (issue 12).

The router runs Debian's ``radvd`` with a configuration file in the test's temporary
directory; renumbering is a new file and a SIGHUP. Topology as in ``test_ilnp_daemon``
(A and B behind R), except where a test builds the README's two-host setup itself.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sixlab.testbed import Node, Testbed
from tests.integration.test_ilnp_daemon import (
    ID_A,
    ID_B,
    PREFIX,
    Daemon,
    EchoServer,
    IlnpNet,
    UdpFlow,
    wait_until,
)

pytestmark = pytest.mark.root


class Radvd:
    """``radvd`` in a router's namespace, its configuration and pid file in ``tmp``."""

    def __init__(self, tb: Testbed, node: Node, tmp: Path) -> None:
        self.tb, self.node = tb, node
        self.conf = tmp / "radvd.conf"
        self.pid = tmp / "radvd.pid"
        self.proc: subprocess.Popen[bytes] | None = None

    def configure(self, links: dict[str, list[tuple[str, int, int]]]) -> None:
        """Interface to its prefixes as (prefix, valid lifetime, preferred lifetime);
        a running radvd reads the new file on SIGHUP."""
        text = ""
        for ifname, prefixes in links.items():
            text += f"interface {ifname} {{\n  AdvSendAdvert on;\n"
            text += "  MinRtrAdvInterval 3;\n  MaxRtrAdvInterval 4;\n"
            for prefix, valid, preferred in prefixes:
                text += (
                    f"  prefix {prefix} {{ AdvValidLifetime {valid}; "
                    f"AdvPreferredLifetime {preferred}; }};\n"
                )
            text += "};\n"
        self.conf.write_text(text)
        if self.proc is None:
            argv = ["radvd", "-n", "-C", str(self.conf), "-p", str(self.pid), "-m", "stderr"]
            self.proc = self.tb.run_in(self.node, argv, stderr=subprocess.DEVNULL)
        else:
            self.proc.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def _locators(daemon: Daemon) -> list[tuple[str, int]]:
    return [(e["locator"], e["preference"]) for e in daemon.status()["locators"]]


def _in_use(daemon: Daemon) -> str:
    (used,) = [e["locator"] for e in daemon.status()["locators"] if e["in_use"]]
    return str(used)


def _peer_locators(daemon: Daemon) -> list[str]:
    (entry,) = daemon.request("cache")["entries"]
    return [p["locator"] for p in entry["locators"]]


@pytest.fixture
def net(tmp_path: Path) -> Iterator[tuple[IlnpNet, Radvd]]:
    with Testbed(prefix=PREFIX) as tb:
        network = IlnpNet(tb, tmp_path)
        radvd = Radvd(tb, network.r, tmp_path)
        try:
            yield network, radvd
        finally:
            network.stop_daemons()
            radvd.stop()


def test_locators_come_from_router_advertisements_and_follow_renumbering(
    net: tuple[IlnpNet, Radvd],
) -> None:
    """A runs without ``--locator``: the router's prefix becomes its locator (the
    kernel forms locator|NID from the RA); the router renumbers (old prefix deprecated,
    new one advertised, then the old one no longer advertised and expired): A's locators
    follow, B is told by Locator Updates, and a flow between them keeps going."""
    network, radvd = net
    network.ip(network.a, "addr", "del", "2001:db8:a::a/64", "dev", "eth0")
    radvd.configure({"ra": [("2001:db8:a::/64", 12, 8)]})
    da = network.start(network.a, "::a", [], policy="none")
    db = network.start(network.b, "::b", ["2001:db8:b::/64"], policy="none")
    assert _locators(da) == [("2001:db8:a:0", 0)]
    assert da.status()["router_advertisements"][0]["interface"] == "eth0"
    assert "2001:db8:a::a/64" in network.a.exec(["ip", "-6", "addr", "show", "dev", "eth0"]).stdout
    echo = EchoServer(network.b, ID_B)
    flow = UdpFlow(network.a, ID_A, ID_B, gap=0.05).start()
    try:
        wait_until(lambda: len(flow.answered) >= 10, what="flow over the learned locator")
        assert _peer_locators(db) == ["2001:db8:a:0"]

        # Renumbering, step 1: the new prefix advertised, the old one deprecated.
        network.r.add_address("ra", "2001:db8:c::1")
        radvd.configure({"ra": [("2001:db8:a::/64", 12, 0), ("2001:db8:c::/64", 12, 8)]})
        wait_until(lambda: _in_use(da) == "2001:db8:c:0", timeout=10, what="new prefix used")
        assert dict(_locators(da))["2001:db8:a:0"] > dict(_locators(da))["2001:db8:c:0"]
        wait_until(
            lambda: _peer_locators(db)[0] == "2001:db8:c:0", what="B told of the new locator"
        )
        answered = len(flow.answered)
        wait_until(lambda: len(flow.answered) >= answered + 10, what="flow after renumbering")

        # Step 2: the old prefix is no longer advertised; its address expires (at most
        # the 12 s last advertised) and its locator is withdrawn.
        radvd.configure({"ra": [("2001:db8:c::/64", 12, 8)]})
        wait_until(
            lambda: [loc for loc, _ in _locators(da)] == ["2001:db8:c:0"],
            timeout=20,
            what="old locator withdrawn",
        )
        wait_until(lambda: _peer_locators(db) == ["2001:db8:c:0"], what="B told of the withdrawal")
        answered = len(flow.answered)
        wait_until(lambda: len(flow.answered) >= answered + 10, what="flow after the withdrawal")
        assert da.counter("lu_acked") >= 2
    finally:
        flow.stop()
        echo.close()
    # Learning kept going through the router's refreshes: the lifetime B holds for our
    # locator was advertised again before it ran out (12 s lifetimes, >20 s of test).
    assert da.status()["events"]["locators_learned"] >= 3
    da.proc.terminate()
    da.proc.wait(timeout=10)
    assert network.a.exec(["ip", "-6", "token", "get", "dev", "eth0"]).stdout.split()[1] == "::"
    wait_until(
        lambda: "2001:db8:c::a" not in network.a.exec(["ip", "-6", "addr"]).stdout,
        what="tokenized address removed at exit",
    )


def test_no_router_advertisement_is_a_clear_error(net: tuple[IlnpNet, Radvd]) -> None:
    network, _ = net
    argv = [sys.executable, "-m", "sixlab.cli.ilnp", "host", "--nid", "::a"]
    argv += ["--interface", "eth0", "--ra-wait", "1", "--control", str(network.tmp / "x.sock")]
    done = network.a.exec(argv, check=False)
    assert done.returncode == 1
    assert "no Router Advertisement gave a prefix on eth0 in 1 s" in done.stderr
    assert network.a.exec(["ip", "-6", "token", "get", "dev", "eth0"]).stdout.split()[1] == "::"
