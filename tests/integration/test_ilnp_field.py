"""The ILNPv6 host in the field (issue 12): restarts, moves under every policy, locators
held by the links, plain IPv6 neighbours, zero configuration.

The topology and helpers are those of ``test_ilnp_daemon``: A and B behind router R,
C beside them (here also the plain IPv6 host, which runs no daemon).
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sixlab.testbed import Node
from sixlab.wire.ilnp import ILV, IlnpPacket, Nonce, encode_packet
from tests.integration._ilnp import (
    IlnpNet,
)
from tests.integration.test_ilnp_daemon import (
    ECHO_PORT,
    ID_A,
    ID_B,
    LOC_B,
    LOC_FLOOD,
    NID_B,
    EchoServer,
    UdpFlow,
    _udp,
    a_client,
    wait_until,
)

pytestmark = pytest.mark.root


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
        # One datagram, never resent: the first packet over the fast path, while A has
        # not resolved its router yet, must arrive (the kernel record names a next hop
        # only once its neighbour is usable, sixlab.ilnp.egress).
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


def test_bounded_flood_never_evicts_the_fast_path_correspondent(net: IlnpNet) -> None:
    """Issue 12 #7: under a random-NID flood against a cap of 50, the echo client
    whose traffic the kernel carries (activity reported once a second) keeps its entry
    on B: never evicted and adopted again, and its echo never stops."""
    net.start(net.a, "0:0:0:a", ["2001:db8:a:0,10"], policy="none")
    db = net.start(net.b, "0:0:0:b", ["2001:db8:b:0"], policy="bounded", extra=("--capacity", "50"))
    echo = EchoServer(net.b, ID_B)
    udp = UdpFlow(net.a, ID_A, ID_B, gap=0.01).start()
    raw = net.c.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
    rng = random.Random(12)
    b_addr = ILV(LOC_B, NID_B)
    try:
        wait_until(lambda: len(udp.answered) > 20, what="echo answering")
        wait_until(lambda: db.status()["fastpath"]["entries"] == 1, what="A in B's kernel")
        (before,) = db.request("cache")["entries"]
        started = time.monotonic()
        sent = 0
        while time.monotonic() - started < 6.0:
            nid = rng.getrandbits(64) | 0x100
            packet = IlnpPacket(
                ILV(LOC_FLOOD, nid),
                b_addr,
                17,
                _udp(nid, NID_B, 40000, ECHO_PORT, b"load"),
                Nonce(rng.randbytes(4)),
            )
            raw.sendto(encode_packet(packet), (str(b_addr.address), 0))
            sent += 1
            if sent % 20 == 0:
                time.sleep(0.02)  # ~1,000 newcomers a second
        answered_during = len(udp.answered)
        time.sleep(0.5)
        assert len(udp.answered) > answered_during
    finally:
        udp.stop()
        raw.close()
        echo.close()
    status = db.status()
    assert status["ilcc_size"] == 50
    assert status["counters"].get("removed_evicted", 0) > 0  # the flood churned
    entries = {e["peer_nid"]: e for e in db.request("cache")["entries"]}
    assert entries["0:0:0:a"]["created"] == before["created"]  # never evicted
    assert not udp.errors


def test_server_with_a_non_connected_socket_moves_and_its_clients_follow(net: IlnpNet) -> None:
    """Issue 12 #4: A serves a UDP echo from a non-connected socket (policy socket: B is
    answered through A's reply table, never adopted) and moves; B's flow follows."""
    da = net.start(net.a, "0:0:0:a", ["2001:db8:a:0,10"])
    db = net.start(net.b, "0:0:0:b", ["2001:db8:b:0"])
    echo = EchoServer(net.a, ID_A)
    udp = UdpFlow(net.b, ID_B, ID_A).start()
    try:
        wait_until(lambda: len(udp.answered) > 20, what="echo answering")
        assert da.status()["ilcc_size"] == 0
        net.r.add_address("ra", "2001:db8:c::1")
        net.a.add_address("eth0", "2001:db8:c::a")
        da.request("set-locators", locators=["2001:db8:c:0,0", "2001:db8:a:0,10"])
        wait_until(lambda: da.counter("lu_acked") >= 1, what="first LU acknowledged")
        da.request("set-locators", locators=["2001:db8:c:0,0"])
        wait_until(lambda: da.counter("lu_acked") >= 2, what="second LU acknowledged")
        net.ip(net.a, "addr", "del", "2001:db8:a::a/64", "dev", "eth0")
        moved_at = len(udp.answered)
        time.sleep(1.5)
        assert len(udp.answered) > moved_at + 20
    finally:
        udp.stop()
        echo.close()
    assert not udp.errors
    assert udp.answered == set(range(udp.sent))
    (entry,) = db.request("cache")["entries"]
    assert [p["locator"] for p in entry["locators"]] == ["2001:db8:c:0"]


def test_locators_are_the_l64s_the_links_hold(net: IlnpNet) -> None:
    """Issue 12 #5: a move to an L64 no interface holds is refused; a locator whose
    address goes away is withdrawn (its link still up) and comes back with the address;
    a configured locator no link held at start got its address from the daemon."""
    da = net.start(
        net.a,
        "0:0:0:a",
        ["2001:db8:a:0,10", "2001:db8:d:0,20", "2001:db8:9:0,30"],
        interfaces=("eth0", "eth1"),
    )
    assert "2001:db8:9::a/64" in net.a.exec(["ip", "-6", "addr", "show", "dev", "eth0"]).stdout
    in_use = [loc["locator"] for loc in da.status()["locators"] if loc["in_use"]]
    assert in_use == ["2001:db8:a:0"]
    reply = da.request("set-locators", locators=["2001:db8:c:0,0", "2001:db8:a:0,10"])
    assert reply["ok"] is False
    assert "2001:db8:c:0" in reply["error"]
    net.ip(net.a, "addr", "del", "2001:db8:9::a/64", "dev", "eth0")
    wait_until(lambda: da.status()["withdrawn"] == ["2001:db8:9:0"], what="9 withdrawn")
    net.ip(net.a, "addr", "del", "2001:db8:d::a/64", "dev", "eth1")
    wait_until(
        lambda: da.status()["withdrawn"] == ["2001:db8:9:0", "2001:db8:d:0"],
        what="locator withdrawn with its address",
    )
    net.a.add_address("eth1", "2001:db8:d::a")
    wait_until(lambda: da.status()["withdrawn"] == ["2001:db8:9:0"], what="locator back")


PLAIN = "2001:db8:e::c"  # C: a kernel-stack IPv6 host, no daemon
ID_PLAIN = "fd00:2ff::c"  # how A's applications name it (identifier prefix + its IID)


def _tcp_echo_server(node: Node, address: str, port: int) -> tuple[socket.socket, threading.Thread]:
    listener = node.socket(socket.AF_INET6, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, port))
    listener.listen(4)
    listener.settimeout(20)

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def _tcp_exchange(node: Node, address: str, port: int, size: int = 200_000) -> None:
    payload = random.Random(port).randbytes(size)
    with node.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        sock.settimeout(15)
        sock.connect((address, port))
        sender = threading.Thread(target=sock.sendall, args=(payload,), daemon=True)
        sender.start()
        got = bytearray()
        while len(got) < size:
            chunk = sock.recv(65536)
            assert chunk, "connection closed early"
            got += chunk
        sender.join()
    assert bytes(got) == payload


def _ping(node: Node, address: str, count: int = 3, seconds: float = 10.0) -> int:
    """ICMPv6 echo from ``node`` (a raw socket: the kernel fills in the checksum, RFC
    3542 §3.1); requests every 0.2 s until ``count`` were answered. Echoes answered."""
    ident = random.Random(address).getrandbits(16)
    answered: set[int] = set()
    with node.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6) as sock:
        sock.settimeout(0.2)
        started, seq = time.monotonic(), 0
        while len(answered) < count and time.monotonic() - started < seconds:
            seq += 1
            sock.sendto(struct.pack("!BBHHH", 128, 0, 0, ident, seq) + b"sixlab", (address, 0))
            with contextlib.suppress(TimeoutError):
                while True:
                    reply = sock.recv(2048)
                    kind, _code, _sum, rid, rseq = struct.unpack_from("!BBHHH", reply)
                    if kind == 129 and rid == ident:
                        answered.add(rseq)
                        break
    assert len(answered) >= count, f"{len(answered)} of {seq} echoes to {address} answered"
    return len(answered)


def _udp_echo_from(node: Node, address: str, port: int) -> None:
    with node.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
        sock.connect((address, port))
        for i in range(5):
            echo_retrying(sock, b"plain %d" % i, 10)


@pytest.mark.parametrize("policy", ["socket", "none"])
def test_plain_ipv6_host_and_ilnp_host_talk_both_ways(net: IlnpNet, policy: str) -> None:
    """RFC 6740 incremental deployment: C runs no ILNP. C reaches A at A's interface
    address (its locator|NID) and A reaches C by C's identifier address (resolved from
    the hosts file to C's real address): ping, UDP and TCP, both directions."""
    with net.hosts.open("a") as hosts:
        hosts.write("2001:db8:e:0/0:0:0:c  carol\n")
    # A veth passes C's TSO packets on whole (a NIC would cut them before the wire),
    # and A's ring takes them whole, as it does GRO aggregates; the veth also leaves
    # C's transport checksums unfinished (CHECKSUM_PARTIAL), which A's daemon finishes.
    da = net.start(net.a, "0:0:0:a", ["2001:db8:a:0,10"], policy=policy)
    echo_a = EchoServer(net.a, ID_A)
    echo_c = EchoServer(net.c, "::")
    listener_a, served_a = _tcp_echo_server(net.a, ID_A, 5001)
    listener_c, served_c = _tcp_echo_server(net.c, "::", 5002)
    try:
        # A -> C, by identifier address; C's first answer is a Parameter Problem
        _udp_echo_from(net.a, ID_PLAIN, ECHO_PORT)
        _ping(net.a, ID_PLAIN)
        _tcp_exchange(net.a, ID_PLAIN, 5002)
        # C -> A, at A's interface address
        _ping(net.c, "2001:db8:a::a")
        _udp_echo_from(net.c, "2001:db8:a::a", ECHO_PORT)
        _tcp_exchange(net.c, "2001:db8:a::a", 5001)
    finally:
        for sock in (listener_a, listener_c):
            sock.close()
        echo_a.close()
        echo_c.close()
    served_a.join(timeout=5)
    served_c.join(timeout=5)
    status = da.status()
    assert status["drops"].get("no_nonce", 0) == 0
    assert status["drops"].get("malformed", 0) == 0  # nothing cut short on the way
    assert status["counters"]["peer_not_ilnp"] == 1
    assert status["wire"]["rx_checksum_finished"] > 0  # C's TCP, unfinished on the veth
    assert status["wire"]["rx_aggregate"] > 0  # C's TSO packets, delivered whole
    assert not status["drops"].get("ring_truncated")


def test_plain_hosts_udp_segmentation_offload_packet_is_a_counted_drop(net: IlnpNet) -> None:
    """C sends four UDP datagrams as one segmentation offload packet (``UDP_SEGMENT``);
    the veths pass it on whole, as they do TSO packets. A's ring takes it whole, but
    the datagrams' boundaries are gone from it: A's daemon counts it as a drop
    (``ring_aggregate_not_tcp``) and delivers no run-together datagram. Datagrams sent
    one by one still get their echo."""
    with net.hosts.open("a") as hosts:
        hosts.write("2001:db8:e:0/0:0:0:c  carol\n")
    da = net.start(net.a, "0:0:0:a", ["2001:db8:a:0,10"], policy="none")
    echo_a = EchoServer(net.a, ID_A)
    try:
        _udp_echo_from(net.c, "2001:db8:a::a", ECHO_PORT)
        with net.c.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
            sock.setsockopt(socket.IPPROTO_UDP, 103, 500)  # UDP_SEGMENT: 500-byte datagrams
            sock.sendto(bytes(2000), ("2001:db8:a::a", ECHO_PORT))
        wait_until(
            lambda: da.status()["drops"].get("ring_aggregate_not_tcp", 0) == 1,
            what="the UDP aggregate counted",
        )
        _udp_echo_from(net.c, "2001:db8:a::a", ECHO_PORT)
    finally:
        echo_a.close()
    assert echo_a.answered == 10  # the two echo rounds, nothing of the aggregate
    assert not da.status()["drops"].get("malformed")


def _cli(node: Node, *argv: str) -> subprocess.CompletedProcess[str]:
    return node.exec([sys.executable, "-m", "sixlab.cli.ilnp", *argv], check=False)


def test_cli_moves_and_adds_peers_in_the_notation_people_write(net: IlnpNet) -> None:
    """``--nid ::a --locator 2001:db8:a::/64``; ``sixlab ilnp add-peer`` and
    ``sixlab ilnp move`` are CLI commands; a move to a locator no link holds fails."""
    da = net.start(net.a, "::a", ["2001:db8:a::/64,10"], policy="none")
    db = net.start(net.b, "::b", ["2001:db8:b::"], policy="none")
    assert da.status()["nid"] == "0:0:0:a"
    done = _cli(net.a, "add-peer", "bob", "--control", da.control)
    assert (done.returncode, done.stdout.strip()) == (0, "peer bob: NID 0:0:0:b")
    refused = _cli(net.a, "move", "2001:db8:c::/64", "--control", da.control)
    assert refused.returncode == 1
    assert "no interface holds an address under 2001:db8:c:0" in refused.stdout
    echo = EchoServer(net.b, ID_B)
    try:
        with a_client(net) as client:
            echo_retrying(client, b"before", 5)
            net.r.add_address("ra", "2001:db8:c::1")
            net.a.add_address("eth0", "2001:db8:c::a")
            moved = _cli(
                net.a, "move", "2001:db8:c::/64,0", "2001:db8:a::,10", "--control", da.control
            )
            assert moved.returncode == 0, moved.stderr
            assert "* locator 2001:db8:c:0" in moved.stdout
            wait_until(lambda: da.counter("lu_acked") >= 1, what="LU acknowledged")
            echo_retrying(client, b"after", 5)
    finally:
        echo.close()
    (entry,) = db.request("cache")["entries"]
    assert [p["locator"] for p in entry["locators"]] == ["2001:db8:c:0", "2001:db8:a:0"]


def test_zero_configuration_host_adds_its_address_and_names_its_peers(net: IlnpNet) -> None:
    """A's link has no global address: ``--locator 2001:db8:a::/64`` makes the daemon add
    2001:db8:a::a itself (and remove it at exit), and ``--names`` gives applications
    the identifier addresses of the hosts file's names, here through the
    ``/etc/netns/NS/hosts`` that ``ip netns exec`` mounts over ``/etc/hosts``."""
    net.ip(net.a, "addr", "del", "2001:db8:a::a/64", "dev", "eth0")
    etc = Path("/etc/netns") / net.a.ns
    names = etc / "hosts"
    try:
        da = net.start(
            net.a, "::a", ["2001:db8:a::/64"], policy="none", extra=("--names", str(names))
        )
        net.start(net.b, "::b", ["2001:db8:b::/64"], policy="none")
        addrs = net.a.exec(["ip", "-6", "addr", "show", "dev", "eth0"]).stdout
        assert "2001:db8:a::a/64" in addrs
        assert "fd00:2ff::b\tbob" in names.read_text()
        assert net.a.exec(["getent", "ahostsv6", "bob"]).stdout.split()[0] == ID_B
        assert net.a.exec(["getent", "ahostsv6", "alice"]).stdout.split()[0] == ID_A
        echo = EchoServer(net.b, ID_B)
        try:
            with a_client(net) as client:
                echo_retrying(client, b"zero conf", 5)
        finally:
            echo.close()
        da.proc.terminate()
        da.proc.wait(timeout=10)
        assert "2001:db8:a::a" not in net.a.exec(["ip", "-6", "addr", "show", "dev", "eth0"]).stdout
        assert not names.exists()
    finally:
        names.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            etc.rmdir()


def test_one_packet_senders_cost_no_kernel_map_write(net: IlnpNet) -> None:
    """The kernel fast path takes a correspondent from its second packet: a crowd of
    300 one-packet senders is adopted (policy none) without one map write each, while
    the echo client, which sends many, is carried by the kernel."""
    net.start(net.a, "0:0:0:a", ["2001:db8:a:0,10"], policy="none")
    db = net.start(net.b, "0:0:0:b", ["2001:db8:b:0"], policy="none")
    echo = EchoServer(net.b, ID_B)
    raw = net.c.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
    rng = random.Random(2)
    b_addr = ILV(LOC_B, NID_B)
    try:
        with a_client(net) as client:
            for i in range(5):
                echo_retrying(client, b"%d" % i, 5)
        for _ in range(300):
            nid = rng.getrandbits(64) | 0x100
            packet = IlnpPacket(
                ILV(LOC_FLOOD, nid),
                b_addr,
                17,
                _udp(nid, NID_B, 40000, ECHO_PORT, b"once"),
                Nonce(rng.randbytes(4)),
            )
            raw.sendto(encode_packet(packet), (str(b_addr.address), 0))
            time.sleep(0.001)
        wait_until(lambda: db.status()["ilcc_size"] >= 280, what="crowd adopted")
    finally:
        raw.close()
        echo.close()
    fast = db.status()["fastpath"]
    assert fast["entries"] == 1  # A alone
    assert fast["sync"].get("installed", 0) <= 3  # A's copy, rewritten as it settled
