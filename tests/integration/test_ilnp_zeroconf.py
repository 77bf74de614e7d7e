"""Zero configuration of ILNPv6 hosts (issue 12): locator|NID addresses claimed on each
of a multihomed host's links, and names from DNS in the names file.

Topology and helpers of ``test_ilnp_daemon`` (A with two links to R, B behind R).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration._ilnp import (
    Daemon,
    IlnpNet,
)
from tests.integration.test_ilnp_daemon import (
    ID_A,
    ID_B,
    EchoServer,
    UdpFlow,
    a_client,
    wait_until,
)
from tests.integration.test_ilnp_field import echo_retrying

pytestmark = pytest.mark.root


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


def _in_use(daemon: Daemon) -> list[str]:
    return [e["locator"] for e in daemon.status()["locators"] if e["in_use"]]


def _peer_locators(daemon: Daemon) -> list[str]:
    (entry,) = daemon.request("cache")["entries"]
    return [p["locator"] for p in entry["locators"]]


def _up_again(net: IlnpNet, ifname: str) -> None:
    """``ip link set IF up``, and the admin's default route through it that the down
    flushed with the addresses (a Router Advertisement would give it again): the
    route is not the daemon's, the address is."""
    net.ip(net.a, "link", "set", ifname, "up")
    net.ip(net.a, "route", "replace", "default", "via", "fe80::1", "dev", ifname, "metric", "100")


def test_a_claimed_address_comes_back_after_its_link_is_downed_and_upped(
    net: IlnpNet,
) -> None:
    """Linux flushes a link's IPv6 addresses on admin down (``keep_addr_on_down`` 0).
    The daemon adds its locator|NID address again when the link is up: after ``ip link
    set eth0 down; ip link set eth0 up`` typed in one go (over before the daemon reads
    the links), and after a down long enough to withdraw the locator (B is told) and an
    up, which brings it back (B is told again). Traffic then uses eth0 once eth1 is
    gone (carrier loss); the address still goes at exit."""
    net.ip(net.a, "addr", "del", "2001:db8:a::a/64", "dev", "eth0")
    net.ip(net.a, "addr", "del", "2001:db8:d::a/64", "dev", "eth1")
    da = net.start(
        net.a,
        "::a",
        ["2001:db8:a::/64,10@eth0", "2001:db8:d::/64,20@eth1"],
        interfaces=("eth0", "eth1"),
        policy="none",
    )
    db = net.start(net.b, "::b", ["2001:db8:b::/64"], policy="none")
    echo = EchoServer(net.b, ID_B)
    flow = UdpFlow(net.a, ID_A, ID_B, gap=0.05).start()

    def back_on_eth0() -> None:
        wait_until(
            lambda: "2001:db8:a::a/64" in _addresses(net, "eth0"),
            timeout=10,
            what="the claimed address back on eth0",
        )
        wait_until(lambda: da.status()["withdrawn"] == [], what="a:0 back")
        wait_until(lambda: _in_use(da) == ["2001:db8:a:0"], what="a:0 in use again")
        answered = len(flow.answered)
        wait_until(lambda: len(flow.answered) >= answered + 10, what="flow after the up")

    try:
        wait_until(lambda: len(flow.answered) >= 10, what="flow over eth0")
        net.a.exec(["sh", "-c", "ip link set eth0 down; ip link set eth0 up"])
        _up_again(net, "eth0")
        back_on_eth0()

        net.ip(net.a, "link", "set", "eth0", "down")
        wait_until(lambda: da.status()["withdrawn"] == ["2001:db8:a:0"], what="a:0 withdrawn")
        wait_until(lambda: _peer_locators(db) == ["2001:db8:d:0"], what="B told of eth1 only")
        _up_again(net, "eth0")
        back_on_eth0()
        wait_until(
            lambda: _peer_locators(db) == ["2001:db8:a:0", "2001:db8:d:0"],
            what="B told of a:0 again",
        )

        net.ip(net.r, "link", "set", "ra2", "down")  # carrier loss on eth1: only eth0 left
        wait_until(lambda: da.status()["withdrawn"] == ["2001:db8:d:0"], what="d:0 withdrawn")
        answered = len(flow.answered)
        wait_until(lambda: len(flow.answered) >= answered + 10, what="flow over eth0 alone")
    finally:
        flow.stop()
        echo.close()
    assert da.status()["events"]["addresses_reclaimed"] == 2
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


def _rr(preference: int, value: int) -> str:
    """RFC 6742 NID and L64 RDATA, both a 16-bit preference and 64 bits, in hex."""
    return f"{preference:04x}{value:016x}"


def test_names_resolved_in_dns_are_in_the_names_file_and_reachable(net: IlnpNet) -> None:
    """R runs a DNS server (dnsmasq) with NID and L64 records (RFC 6742) for bob and
    carol; A has an empty I-LV hosts file. ``--name bob.example`` is resolved at start:
    in the names file, found by ``getent``, and an application reaches it at its
    identifier address; a name without records is reported; ``add-peer`` adds carol."""
    net.hosts.write_text("")
    dnsmasq = [
        "dnsmasq",
        "--keep-in-foreground",
        "--no-resolv",
        "--no-hosts",
        "--conf-file=/dev/null",
        "--bind-interfaces",
        "--listen-address=2001:db8:a::1",
        f"--pid-file={net.tmp / 'dnsmasq.pid'}",
        "--local-ttl=600",
        f"--dns-rr=bob.example,104,{_rr(10, 0xB)}",
        f"--dns-rr=bob.example,106,{_rr(10, 0x2001_0DB8_000B_0000)}",
        f"--dns-rr=carol.example,104,{_rr(10, 0xC)}",
        f"--dns-rr=carol.example,106,{_rr(10, 0x2001_0DB8_000E_0000)}",
    ]
    server = net.tb.run_in(net.r, dnsmasq, stderr=subprocess.DEVNULL)
    wait_until(
        lambda: bool(net.r.exec(["ss", "-Hlun", "sport = :53"]).stdout.strip()),
        what="dnsmasq listening",
    )
    etc = Path("/etc/netns") / net.a.ns
    etc.mkdir(parents=True, exist_ok=True)
    names = etc / "hosts"
    (etc / "resolv.conf").write_text("nameserver 2001:db8:a::1\n")
    try:
        extra = ("--names", str(names), "--name", "bob.example", "--name", "nobody.example")
        da = net.start(net.a, "::a", ["2001:db8:a::/64"], policy="none", extra=extra)
        net.start(net.b, "::b", ["2001:db8:b::/64"], policy="none")
        status = da.status()["names"]
        assert status["resolved"] == ["bob.example"]
        assert "nobody.example" in status["errors"]
        assert "fd00:2ff::b\tbob.example" in names.read_text()
        assert net.a.exec(["getent", "ahostsv6", "bob.example"]).stdout.split()[0] == ID_B
        echo = EchoServer(net.b, ID_B)
        try:
            with a_client(net) as client:
                echo_retrying(client, b"by DNS", 5)
        finally:
            echo.close()
        assert da.status()["events"]["resolved"] >= 1
        add_peer = [sys.executable, "-m", "sixlab.cli.ilnp", "add-peer", "carol.example"]
        added = net.a.exec([*add_peer, "--control", da.control], check=False)
        assert added.stdout.strip() == "peer carol.example: NID 0:0:0:c", added.stderr
        assert "fd00:2ff::c\tcarol.example" in names.read_text()
    finally:
        server.terminate()
        server.wait(timeout=10)
        names.unlink(missing_ok=True)
        (etc / "resolv.conf").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            etc.rmdir()
