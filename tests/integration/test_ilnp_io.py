"""The ILNP host daemon's I/O in the field: link flaps, carrier loss, crowded links,
shared control paths, every loss counted, and nothing left behind.

Same topology as ``test_ilnp_daemon.py`` (whose helpers this module uses)::

    A eth0 ── ra  R  rb ── eth0 B
    A eth1 ── ra2 R  rc ── eth0 C

Carrier loss is made the way a cable pull shows on a host: the router's end of the
veth goes down, so A's end loses its carrier while staying administratively up.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sixlab.wire.ilnp import ILV, IlnpPacket, Nonce, encode_packet
from tests.integration._ilnp import Daemon, IlnpNet
from tests.integration._tap import Capture, capture
from tests.integration.test_ilnp_daemon import (
    ECHO_PORT,
    ID_A,
    ID_B,
    LOC_A,
    LOC_B,
    LOC_FLOOD,
    NID_A,
    NID_B,
    EchoServer,
    TcpFlow,
    UdpFlow,
    _udp,
    a_client,
    echo_each,
    wait_until,
)

pytestmark = pytest.mark.root

MULTIHOMED = ["2001:db8:a:0,10", "2001:db8:d:0,20"]
LOC_D_BYTES = bytes.fromhex("20010db8000d0000")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_multihomed(net: IlnpNet, policy: str = "socket") -> Daemon:
    return net.start(net.a, "0:0:0:a", MULTIHOMED, interfaces=("eth0", "eth1"), policy=policy)


def test_link_flap_leaves_the_daemon_idle_and_the_link_served(net: IlnpNet) -> None:
    """A's second link goes down and up. The kernel sets ENETDOWN on that link's ring
    socket; read or not, it makes epoll report the socket for ever: the daemon must
    clear it and go back to sleep, and keep serving the link afterwards."""
    da = start_multihomed(net)
    net.start(net.b, "0:0:0:b", ["2001:db8:b:0"])
    net.ip(net.a, "link", "set", "eth1", "down")
    net.ip(net.a, "link", "set", "eth1", "up")
    wait_until(
        lambda: da.status()["rings"]["eth1"]["errors"].get("ENETDOWN") == 1,
        what="the ring's error read and counted",
    )
    # Idle, the daemon wakes about a hundred times a second and uses a few per cent of
    # a CPU; spinning on the error it used all it could get (93 % in the field).
    before, started = cpu_seconds(da.proc.pid), time.monotonic()
    time.sleep(2.0)
    used = cpu_seconds(da.proc.pid) - before
    assert used < 0.25 * (time.monotonic() - started), f"{used:.2f} s of CPU while idle"
    # The flapped link still carries traffic: take the preferred one away. (Down
    # flushed the link's static address and route; in the field SLAAC restores them.)
    net.a.add_address("eth1", "2001:db8:d::a")
    net.ip(net.a, "route", "add", "default", "via", "fe80::2", "dev", "eth1", "metric", "200")
    wait_until(lambda: not da.status()["withdrawn"], what="eth1's locator back")
    net.ip(net.a, "link", "set", "eth0", "down")
    wait_until(lambda: da.status()["withdrawn"] == ["2001:db8:a:0"], what="failover")
    echo = EchoServer(net.b, ID_B)
    try:
        with a_client(net) as client:
            echo_each(client, [b"over eth1 %d" % i for i in range(5)])
    finally:
        echo.close()
    assert da.status()["rings"]["eth1"]["packets"] >= 1


def _outgoing(net: IlnpNet, ifname: str) -> Capture:
    """Frames A sends on its own ``ifname`` (a tap sees them even without carrier)."""
    return capture(net.a, ifname)


@pytest.mark.parametrize("fastpath", ["on", "off"])
def test_carrier_loss_fails_over_out_of_the_surviving_link(net: IlnpNet, fastpath: str) -> None:
    """The router's end of A's preferred link goes down: A's eth0 stays up without
    carrier. A withdraws that locator, and the Locator Update and both flows leave
    out of eth1, the link that holds the new locator; nothing more goes into eth0.

    The router is a static neighbour on eth0: the kernel never finds it unreachable,
    so a packet routed by destination alone keeps going into the dead link for good
    (with a learnt neighbour it would stop after Neighbour Unreachability Detection
    gives up, seconds later, RFC 4861 §7.3)."""
    net.fastpath = fastpath
    mac = net.r.mac("ra")
    net.ip(net.a, "neigh", "replace", "fe80::1", "lladdr", mac, "dev", "eth0", "nud", "permanent")
    da = start_multihomed(net)
    db = net.start(net.b, "0:0:0:b", ["2001:db8:b:0"])
    echo = EchoServer(net.b, ID_B)
    udp = UdpFlow(net.a, ID_A, ID_B).start()
    tcp = TcpFlow(net.a, net.b, ID_A, ID_B).start()
    try:
        wait_until(lambda: db.status()["ilcc_size"] == 1, what="B adopts A")
        wait_until(lambda: len(udp.answered) > 5, what="the echo flow")
        dead = _outgoing(net, "eth0")
        net.ip(net.r, "link", "set", "ra", "down")
        wait_until(lambda: da.status()["withdrawn"] == ["2001:db8:a:0"], what="withdrawal")
        wait_until(lambda: da.counter("lu_acked") >= 1, what="failover LU acknowledged")
        at_udp, at_tcp = len(udp.answered), tcp.received
        wait_until(lambda: len(udp.answered) > at_udp + 20, what="UDP after failover")
        wait_until(lambda: tcp.received > at_tcp + 100_000, what="TCP after failover")
        sent_dead = [f for f in dead.stop() if f[12:14] == b"\x86\xdd"]
    finally:
        udp.stop()
        tcp.finish()
        echo.close()
    assert not udp.errors
    assert not tcp.errors
    assert udp.answered == set(range(udp.sent))
    assert tcp.received == tcp.sent
    assert tcp.recv_hash.digest() == tcp.sent_hash.digest()
    # Nothing from eth1's locator went into eth0, the dead link: not the Locator
    # Update, not its retransmissions, not the data that followed.
    misrouted = [f for f in sent_dead if f[14 + 8 : 14 + 16] == LOC_D_BYTES]
    assert misrouted == [], [f[14 : 14 + 48].hex() for f in misrouted[:3]]
    status = da.status()
    assert status["links"]["eth0"]["carrier"] is False
    assert status["links"]["eth0"]["admin_up"] is True
    assert [loc["locator"] for loc in status["locators"]] == ["2001:db8:d:0"]
    (entry,) = db.request("cache")["entries"]
    assert [p["locator"] for p in entry["locators"]] == ["2001:db8:d:0"]


def test_ring_overflow_shows_in_drops_and_in_the_text_status(net: IlnpNet) -> None:
    """Packets lost because the receive ring was full are a loss like any other: the
    JSON ``drops`` and the text ``status`` show them, not only ``rings``."""
    da = net.start(net.a, "0:0:0:a", ["2001:db8:a:0,10"])
    raw = net.c.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
    a_addr = ILV(LOC_A, NID_A)
    rng = random.Random(12)
    da.proc.send_signal(signal.SIGSTOP)  # the ring fills while nobody reads it
    try:
        # 256 blocks retire after 1 ms each however few packets they hold: spread
        # 3,000 packets over about 0.6 s and the ring is full well before the end.
        for i in range(3000):
            nid = rng.getrandbits(64) | 0x100
            packet = IlnpPacket(
                ILV(LOC_FLOOD, nid),
                a_addr,
                17,
                _udp(nid, NID_A, 40000, ECHO_PORT, b"fill"),
                Nonce(rng.randbytes(4)),
            )
            raw.sendto(encode_packet(packet), (str(a_addr.address), 0))
            if i % 5 == 4:
                time.sleep(0.001)
    finally:
        da.proc.send_signal(signal.SIGCONT)
        raw.close()
    status = da.status()
    lost = status["rings"]["eth0"]["drops"]
    assert lost > 0
    assert status["drops"]["ring_overflow"] == lost
    text = net.tb.exec_in(
        net.a, [sys.executable, "-m", "sixlab.cli.ilnp", "status", "--control", da.control]
    ).stdout
    (line,) = [x for x in text.splitlines() if x.startswith("drops:")]
    assert f"ring_overflow={lost}" in line


def _host_argv(nid: str, locator: str, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "sixlab.cli.ilnp", "host", "--nid", nid]
    return [*argv, "--locator", locator, "--interface", "eth0", "--fastpath", "off", *extra]


def test_second_daemon_on_a_live_control_path_refuses_and_leaves_it(net: IlnpNet) -> None:
    """Two namespaces, one ``--control`` path: the second daemon must not take the
    first's socket (it used to unlink it and serve there, and its exit deleted it)."""
    da = net.start(net.a, "0:0:0:a", ["2001:db8:a:0,10"])
    out = net.tb.exec_in(
        net.b,
        _host_argv("0:0:0:b", "2001:db8:b:0", "--control", da.control),
        check=False,
        timeout=10,  # (it used to start, take the socket and serve)
    )
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1, out.stderr
    assert "a running daemon answers there" in out.stderr
    assert da.status()["nid"] == "0:0:0:a"  # still A's, still served
    tun = net.tb.exec_in(net.b, ["ip", "link", "show", "ilnp0"], check=False)
    assert tun.returncode != 0  # refused before anything was made


def test_default_control_path_is_one_per_namespace(net: IlnpNet) -> None:
    """Without ``--control``, daemons in two namespaces each get their own socket, and
    ``sixlab ilnp status`` run in a namespace reaches that namespace's daemon."""
    procs = []
    paths = []
    try:
        for node, nid, loc in (
            (net.a, "0:0:0:a", "2001:db8:a:0"),
            (net.b, "0:0:0:b", "2001:db8:b:0"),
        ):
            proc = net.tb.run_in(node, _host_argv(nid, loc), stdout=subprocess.PIPE)
            procs.append(proc)
            assert proc.stdout is not None
            line = proc.stdout.readline().decode()
            assert line.startswith("ready "), line
            paths.append(line.split("control=")[1].strip())
        assert paths[0] != paths[1]
        for node, nid in ((net.a, "0:0:0:a"), (net.b, "0:0:0:b")):
            status = json.loads(
                net.tb.exec_in(
                    node, [sys.executable, "-m", "sixlab.cli.ilnp", "status", "--json"]
                ).stdout
            )
            assert status["nid"] == nid
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
    assert not any(Path(p).exists() for p in paths)


CROWD = 1000


def _crowd_seen(daemon: Daemon) -> int:
    counters = daemon.status()["counters"]
    return int(counters.get("adopted", 0) + counters.get("not_adopted", 0))


@pytest.mark.parametrize("policy", ["socket", "none"])
def test_unresolvable_crowd_does_not_stop_the_echo_flow(net: IlnpNet, policy: str) -> None:
    """A crowd of new correspondents from a prefix that is on-link at B, where nobody
    answers Neighbour Discovery: B's answers to them cannot leave. Held in the kernel
    they filled the send socket's buffer and every send failed, the echo flow's
    answers to A too; now they wait in the daemon, are dropped and counted, and the
    echo flow goes on. (B without the fast path: every answer is the daemon's.)"""
    net.fastpath = "off"
    net.start(net.a, "0:0:0:a", ["2001:db8:a:0,10"])
    db = net.start(net.b, "0:0:0:b", ["2001:db8:b:0"], policy=policy)
    net.ip(net.b, "route", "add", "2001:db8:f::/64", "dev", "eth0")  # the crowd, on-link
    echo = EchoServer(net.b, ID_B)
    udp = UdpFlow(net.a, ID_A, ID_B).start()
    raw = net.c.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
    rng = random.Random(9)
    b_addr = ILV(LOC_B, NID_B)
    try:
        wait_until(lambda: len(udp.answered) > 5, what="the echo flow")
        resent_before = udp.resent
        answered_before = len(udp.answered)
        for i in range(CROWD):
            nid = rng.getrandbits(64) | 0x100
            packet = IlnpPacket(
                ILV(LOC_FLOOD, nid),
                b_addr,
                17,
                _udp(nid, NID_B, 40000 + i, ECHO_PORT, b"crowd"),
                Nonce(rng.randbytes(4)),
            )
            raw.sendto(encode_packet(packet), (str(b_addr.address), 0))
            if i % 10 == 9:
                time.sleep(0.01)
        # Every crowd packet reached B's host, and B answered each: the answers wait
        # for Neighbour Discovery to give up (3 s). The echo flow must go on
        # meanwhile, every request answered the first time.
        wait_until(lambda: _crowd_seen(db) >= 0.9 * CROWD, timeout=15, what="the crowd processed")
        time.sleep(3.5)
        answered_during = len(udp.answered) - answered_before
        resent_during = udp.resent - resent_before
    finally:
        udp.stop()
        raw.close()
        echo.close()
    status = db.status()
    assert status["wire"].get("tx_error", 0) == 0, status["drops"]
    assert resent_during <= 1
    assert answered_during > 100
    assert udp.answered == set(range(udp.sent))
    # The crowd's answers were not sent: held, then dropped and counted.
    wait_until(
        lambda: db.status()["drops"].get("neighbour_unresolved", 0) >= 0.9 * CROWD,
        what="the crowd's answers dropped and counted",
    )


def _leavings(net: IlnpNet) -> dict[str, str]:
    """What a daemon could leave behind in A's namespace, as text to compare."""

    def run(*argv: str) -> str:
        return net.tb.exec_in(net.a, list(argv), check=False).stdout

    sysctl = "/proc/sys/net/ipv6/conf/{}/ignore_routes_with_linkdown"
    return {
        "qdiscs": run("tc", "qdisc", "show"),
        "nft": run("nft", "list", "tables"),
        "links": run("ip", "-o", "link", "show"),
        "addresses": run("ip", "-6", "-o", "addr", "show"),
        "routes": run("ip", "-6", "route", "show"),
        "sysctl": run("cat", sysctl.format("eth0"), sysctl.format("eth1")),
    }


@pytest.mark.parametrize("fastpath", ["on", "off"])
def test_start_is_quiet_and_exit_leaves_nothing(net: IlnpNet, fastpath: str) -> None:
    """``sixlab ilnp host`` writes nothing to stderr when it starts and serves; when
    it exits, the namespace is as it found it: no clsact qdisc it made (one that was
    there before stays), nft table, TUN device, address, route or changed setting."""
    net.tb.exec_in(net.a, ["tc", "qdisc", "add", "dev", "eth1", "clsact"])  # someone else's
    before = _leavings(net)
    control = str(net.tmp / "quiet.sock")
    argv = _host_argv("0:0:0:a", "2001:db8:a:0,10", "--control", control)
    argv[argv.index("--fastpath") + 1] = fastpath
    argv += ["--locator", "2001:db8:d:0,20", "--interface", "eth1"]
    proc = net.tb.run_in(net.a, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith(b"ready ")
    running = _leavings(net)
    assert "ilnp0" in running["links"]
    assert running["sysctl"].split() == ["1", "1"]
    if fastpath == "on":
        assert "qdisc clsact ffff: dev eth0" in running["qdiscs"]
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert err == b""
    assert _leavings(net) == before
    assert not Path(control).exists()


def test_fastpath_leaves_by_the_locators_link_not_the_preferred_route(net: IlnpNet) -> None:
    """A prefers its eth1 locator while its preferred default route goes through eth0.
    The kernel fast path sends out of eth1 to eth1's router: left to its own route
    lookup it took eth0's gateway and looked for it on eth1, where nobody answers,
    and every packet waited there and was lost."""
    da = net.start(
        net.a,
        "0:0:0:a",
        ["2001:db8:d:0,10", "2001:db8:a:0,20"],
        interfaces=("eth0", "eth1"),
        policy="none",
    )
    net.start(net.b, "0:0:0:b", ["2001:db8:b:0"], policy="none")
    echo = EchoServer(net.b, ID_B)
    cap = net.capture("ra2")
    try:
        with a_client(net) as client:
            echo_each(client, [b"first %d" % i for i in range(3)])
            before = da.status()["fastpath"]["counters"]
            echo_each(client, [b"kernel %d" % i for i in range(50)])
            after = da.status()["fastpath"]["counters"]
        flow = TcpFlow(net.a, net.b, ID_A, ID_B).start()
        time.sleep(1.0)
        flow.finish()
    finally:
        echo.close()
    frames = cap.stop()
    assert after["tx_fast"] >= before.get("tx_fast", 0) + 50
    assert not flow.errors
    assert flow.received == flow.sent > 100_000
    assert after.get("tx_fast_tcp", 0) == 0 < da.status()["fastpath"]["counters"]["tx_fast_tcp"]
    from_a = [f for f in frames if f[12:14] == b"\x86\xdd" and f[14 + 8 : 14 + 16] == LOC_D_BYTES]
    assert len(from_a) >= 50


@pytest.mark.parametrize("then", ["restart", "cleanup"])
def test_a_killed_daemons_leavings_are_undone(net: IlnpNet, then: str) -> None:
    """A daemon killed with SIGKILL leaves what it added: the clsact qdiscs, the
    ``ignore_routes_with_linkdown`` it set, the address it claimed, its nft table. The
    next daemon on the same TUN device (or ``sixlab ilnp cleanup``) puts the
    namespace back as the dead one found it, and a clean exit then leaves nothing."""
    before = _leavings(net)
    argv = _host_argv("0:0:0:a", "2001:db8:a:0,10", "--control", str(net.tmp / "a.sock"))
    argv[argv.index("--fastpath") + 1] = "on"
    argv += ["--locator", "2001:db8:9:0,30", "--interface", "eth1"]  # 9: no link holds it
    first = net.tb.run_in(net.a, argv, stdout=subprocess.PIPE)
    assert first.stdout is not None
    assert first.stdout.readline().startswith(b"ready ")
    first.kill()
    first.wait(timeout=10)
    crashed = _leavings(net)
    assert crashed["sysctl"].split() == ["1", "1"]
    assert "2001:db8:9::a/64" in crashed["addresses"]
    assert "clsact" in crashed["qdiscs"]
    if then == "cleanup":
        done = net.tb.exec_in(
            net.a, [sys.executable, "-m", "sixlab.cli.ilnp", "cleanup"], check=False
        )
        assert done.returncode == 0, done.stderr
        assert _leavings(net) == before
        return
    second = net.tb.run_in(net.a, argv, stdout=subprocess.PIPE)
    assert second.stdout is not None
    assert second.stdout.readline().startswith(b"ready ")
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=10) == 0
    assert _leavings(net) == before


def test_a_link_made_again_gets_a_new_ring(net: IlnpNet) -> None:
    """A's second interface is deleted and made again (a new index): the daemon's
    capture socket on the old one would never see a packet again, and the kernel fast
    path's ingress program went with the old interface. Both are made again, and the
    link carries the failover as before, through the kernel both ways."""
    da = start_multihomed(net)
    net.start(net.b, "0:0:0:b", ["2001:db8:b:0"])
    net.ip(net.a, "link", "del", "eth1")
    net.ip(net.a, "link", "add", "eth1", "type", "veth", "peer", "name", "ra2", "netns", net.r.ns)
    net.ip(net.a, "link", "set", "eth1", "up")
    net.ip(net.a, "addr", "add", "2001:db8:d::a/64", "dev", "eth1")
    net.ip(net.a, "route", "add", "default", "via", "fe80::2", "dev", "eth1", "metric", "200")
    net.ip(net.r, "link", "set", "ra2", "up")
    net.ip(net.r, "addr", "add", "2001:db8:d::1/64", "dev", "ra2")
    net.ip(net.r, "addr", "add", "fe80::2/64", "dev", "ra2")
    wait_until(lambda: da.status()["events"].get("rings_reopened") == 1, what="a new ring")
    wait_until(lambda: da.status()["events"].get("fastpath_reattached") == 1, what="program")
    filters = net.tb.exec_in(net.a, ["tc", "filter", "show", "dev", "eth1", "ingress"])
    assert "ilnp_ingress" in filters.stdout
    net.ip(net.a, "link", "set", "eth0", "down")
    wait_until(lambda: da.status()["withdrawn"] == ["2001:db8:a:0"], what="failover")
    echo = EchoServer(net.b, ID_B)
    try:
        with a_client(net) as client:
            echo_each(client, [b"over the new eth1 %d" % i for i in range(5)])
            before = da.status()["fastpath"]["counters"]
            echo_each(client, [b"in the kernel %d" % i for i in range(50)])
            after = da.status()["fastpath"]["counters"]
    finally:
        echo.close()
    status = da.status()
    assert status["rings"]["eth1"]["reopened"] == 1
    # A adopted B (its client socket is connected): its requests leave through the
    # kernel out of the new eth1, B's answers come in through the program on it.
    assert after["tx_fast"] >= before.get("tx_fast", 0) + 45
    assert after["rx_fast"] >= before.get("rx_fast", 0) + 45
    assert not status["drops"]
