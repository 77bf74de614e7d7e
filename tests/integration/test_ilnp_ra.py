"""ILNPv6 hosts that learn their locators from Router Advertisements (issue 12).

The router runs Debian's ``radvd`` with a configuration file in the test's temporary
directory; renumbering is a new file and a SIGHUP. Topology as in ``test_ilnp_daemon``
(A and B behind R), except where a test builds the README's two-host setup itself.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sixlab.testbed import Node, Testbed
from tests.integration._ilnp import (
    Daemon,
    IlnpNet,
)
from tests.integration.test_ilnp_daemon import (
    ECHO_PORT,
    ID_A,
    ID_B,
    PREFIX,
    EchoServer,
    UdpFlow,
    wait_until,
)
from tests.integration.test_ilnp_field import echo_retrying

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
def net(net: IlnpNet, tmp_path: Path) -> Iterator[tuple[IlnpNet, Radvd]]:
    """The ILNP test network (tests/integration/conftest.py) and a radvd on its router."""
    radvd = Radvd(net.tb, net.r, tmp_path)
    try:
        yield net, radvd
    finally:
        net.stop_daemons()  # before radvd's last advertisements, as they always were
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
    assert da.status()["router_advertisements"]["prefixes"][0]["interface"] == "eth0"
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


README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_setup() -> tuple[str, list[str], list[list[str]]]:
    """The README's ILNP setup: radvd.conf, the dnsmasq command, the two host lines."""
    text = README.read_text()
    section = text[text.index("### ILNPv6 hosts") :]
    conf = section[
        section.index("interface ra {") : section.index("```", section.index("interface ra {"))
    ]
    lines = section.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("dnsmasq "))
    command = ""
    for line in lines[first:]:
        command += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            break
    hosts = next(line for line in lines if line.startswith("sixlab ilnp host --nid ::a"))
    return conf, command.split(), [h.split() for h in hosts.split("  ") if h.strip()]


def test_the_readme_two_host_setup_needs_nothing_but_the_nids(tmp_path: Path) -> None:
    """The README's setup as written: R advertises a prefix per link and a DNS server
    (radvd), the DNS server (dnsmasq) holds NID and L64 records; A and B run
    ``sixlab ilnp host --nid ::a`` / ``::b`` with no address, route, interface or
    locator given; ``sixlab ilnp add-peer bob.example`` on A, then an application on A
    reaches B's identifier address."""
    conf, dnsmasq, (host_a, host_b) = _readme_setup()
    assert host_a == ["sixlab", "ilnp", "host", "--nid", "::a"]
    assert host_b == ["sixlab", "ilnp", "host", "--nid", "::b"]
    cli = [sys.executable, "-m", "sixlab.cli.ilnp"]
    with Testbed(prefix=PREFIX) as tb:
        r = tb.add_node("r", router=True)
        a = tb.add_node("a")
        b = tb.add_node("b")
        tb.add_link(a, r, if_a="eth0", if_b="ra")
        tb.add_link(b, r, if_a="eth0", if_b="rb")
        r.add_address("ra", "2001:db8:a::1")
        r.add_address("rb", "2001:db8:b::1")
        r.add_address("ra", "fe80::1")
        r.add_address("rb", "fe80::1")
        (tmp_path / "radvd.conf").write_text(conf)
        tb.run_in(
            r,
            ["radvd", "-n", "-C", str(tmp_path / "radvd.conf"), "-p", str(tmp_path / "radvd.pid")],
            stderr=subprocess.DEVNULL,
        )
        extra = [
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            f"--pid-file={tmp_path / 'dm.pid'}",
        ]
        tb.run_in(r, [*dnsmasq, *extra], stderr=subprocess.DEVNULL)
        wait_until(
            lambda: bool(r.exec(["ss", "-Hlun", "sport = :53"]).stdout.strip()),
            what="dnsmasq listening",
        )
        daemons = []
        try:
            for node, argv in ((a, host_a), (b, host_b)):
                proc = tb.run_in(node, [*cli, *argv[2:]], stdout=subprocess.PIPE)
                daemons.append(proc)
                assert proc.stdout is not None
                line = proc.stdout.readline()
                assert line.startswith(b"ready"), f"{node.name}: {line!r}"
            added = a.exec([*cli, "add-peer", "bob.example"], check=False)
            assert added.stdout.strip() == "peer bob.example: NID 0:0:0:b", added.stderr
            status = json.loads(a.exec([*cli, "status", "--json"]).stdout)
            assert [e["locator"] for e in status["locators"]] == ["2001:db8:a:0"]
            assert status["router_advertisements"]["dns_servers"] == ["2001:db8:a::1"]
            echo = EchoServer(b, ID_B)
            try:
                client = a.socket(socket.AF_INET6, socket.SOCK_DGRAM)
                try:
                    client.bind((ID_A, 0))
                    client.connect((ID_B, ECHO_PORT))
                    echo_retrying(client, b"nothing but the NID", 5)
                finally:
                    client.close()
            finally:
                echo.close()
        finally:
            for proc in daemons:
                proc.terminate()
                proc.wait(timeout=10)


def test_a_killed_daemons_token_is_cleared_by_the_next_one(net: tuple[IlnpNet, Radvd]) -> None:
    """SIGKILL leaves the NID as eth0's token; the next daemon takes it for a leftover
    and clears it when it stops, rather than putting it back as if it were the user's."""
    network, radvd = net
    network.ip(network.a, "addr", "del", "2001:db8:a::a/64", "dev", "eth0")
    radvd.configure({"ra": [("2001:db8:a::/64", 600, 300)]})
    first = network.start(network.a, "::a", [], policy="none")
    first.proc.kill()
    first.proc.wait(timeout=10)
    token = network.a.exec(["ip", "-6", "token", "get", "dev", "eth0"]).stdout.split()[1]
    assert token == "::a"
    second = network.start(network.a, "::a", [], policy="none")
    second.proc.terminate()
    second.proc.wait(timeout=10)
    assert network.a.exec(["ip", "-6", "token", "get", "dev", "eth0"]).stdout.split()[1] == "::"


def test_a_learned_locator_comes_back_after_its_link_is_downed_and_upped(
    net: tuple[IlnpNet, Radvd],
) -> None:
    """The admin down flushes the kernel's autoconfigured address as any other; on up
    the kernel solicits, the router answers, the kernel forms prefix|NID again (the
    token survives the down) and the locator returns to the set, B is told, and the
    flow goes back to it."""
    network, radvd = net
    network.ip(network.a, "addr", "del", "2001:db8:a::a/64", "dev", "eth0")
    network.ip(network.a, "addr", "del", "2001:db8:d::a/64", "dev", "eth1")
    radvd.configure({"ra": [("2001:db8:a::/64", 600, 300)], "ra2": [("2001:db8:d::/64", 600, 300)]})
    da = network.start(network.a, "::a", [], interfaces=("eth0", "eth1"), policy="none")
    db = network.start(network.b, "::b", ["2001:db8:b::/64"], policy="none")
    wait_until(lambda: len(_locators(da)) == 2, timeout=10, what="both prefixes learned")
    echo = EchoServer(network.b, ID_B)
    flow = UdpFlow(network.a, ID_A, ID_B, gap=0.05).start()
    try:
        wait_until(lambda: len(flow.answered) >= 10, what="flow over eth0")
        network.a.exec(["sh", "-c", "ip link set eth0 down; ip link set eth0 up"])
        network.ip(
            network.a,
            "route",
            "replace",
            "default",
            "via",
            "fe80::1",
            "dev",
            "eth0",
            "metric",
            "100",
        )
        wait_until(
            lambda: (
                [loc for loc, _ in _locators(da)] == ["2001:db8:a:0", "2001:db8:d:0"]
                and _in_use(da) == "2001:db8:a:0"
            ),
            timeout=15,
            what="a:0 learned again and in use",
        )
        wait_until(lambda: "2001:db8:a:0" in _peer_locators(db), what="B told of a:0 again")
        network.ip(network.r, "link", "set", "ra2", "down")  # only eth0 left
        answered = len(flow.answered)
        wait_until(lambda: len(flow.answered) >= answered + 10, what="flow over eth0 again")
    finally:
        flow.stop()
        echo.close()
