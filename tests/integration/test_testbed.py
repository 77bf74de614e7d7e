"""The testbeds in real namespaces: SRv6 paths deliver, delays match, nothing is left over."""

from __future__ import annotations

import ipaddress
import os
import socket
import statistics
import struct
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from pyroute2 import netns

from sixlab.testbed import (
    BenchTestbed,
    LinkEmulation,
    SRv6Path,
    SRv6TwoPaths,
    Testbed,
    TestbedError,
    ping6,
    sweep,
)
from sixlab.testbed._netns import NETNS_DIR

from .conftest import TEST_PREFIX

pytestmark = pytest.mark.root

#: Probes per direction for the delay check: the median of 50, which a few late probes
#: cannot move.
PROBES = 50
#: Required accuracy of the emulated one-way delay, ms: the median of the probes. The
#: emulator holds frames in user space on a shared VM, whose wake-ups were measured
#: 0.2-0.4 ms late for whole runs while the host was busy (steal time).
TOLERANCE_MS = 0.5
_TIMESPEC = struct.Struct("=qq")
SO_TIMESTAMPNS = 35


def srh(travel: Sequence[str]) -> bytes:
    """A type-4 routing header (RFC 8754 §2) for IPV6_RTHDR, segments in travel order.

    Built by hand so these tests do not depend on sixlab.wire. The kernel overwrites
    Next Header and puts the socket's destination into Segment List[0].
    """
    n = len(travel)
    head = struct.pack("!BBBBBBH", 0, 2 * n, 4, n - 1, n - 1, 0, 0)
    return head + b"".join(ipaddress.IPv6Address(s).packed for s in reversed(travel))


def parse_srh(data: bytes) -> tuple[int, list[str]]:
    """(Segments Left, segments in travel order) of a received routing header."""
    assert data[2] == 4, "not a segment routing header"
    n = data[4] + 1
    segs = [str(ipaddress.IPv6Address(data[8 + 16 * i : 24 + 16 * i])) for i in range(n)]
    return data[3], list(reversed(segs))


def _rx_ns(ancdata: list[tuple[int, int, bytes]]) -> int:
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = _TIMESPEC.unpack(data[: _TIMESPEC.size])
            return int(sec) * 1_000_000_000 + int(nsec)
    raise AssertionError("no SO_TIMESTAMPNS")


def _rthdr(ancdata: list[tuple[int, int, bytes]]) -> bytes | None:
    for level, kind, data in ancdata:
        if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_RTHDR:
            return data
    return None


class Endpoint:
    """A UDP socket in a node, with receive timestamps and routing-header reporting."""

    def __init__(self, tb: SRv6TwoPaths, which: str, port: int) -> None:
        node = tb.sender if which == "sender" else tb.reflector
        self.sock = node.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVRTHDR, 1)
        self.sock.bind(("::", port))
        self.sock.settimeout(2.0)

    def route_via(self, segments: Sequence[str]) -> None:
        """Sticky SRH for every datagram sent from now on (RFC 3542 §7)."""
        self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RTHDR, srh(segments))

    def send_via(self, segments: Sequence[str], dst: str, port: int, payload: bytes) -> None:
        self.route_via(segments)
        self.sock.sendto(payload, (dst, port))

    def recv(self) -> tuple[bytes, int, bytes | None]:
        data, anc, _, _ = self.sock.recvmsg(2048, 256)
        return data, _rx_ns(anc), _rthdr(anc)

    def close(self) -> None:
        self.sock.close()


def one_way_delays(
    tx: Endpoint, rx: Endpoint, segments: Sequence[str], dst: str, port: int
) -> list[float]:
    """Send PROBES datagrams over ``segments``; one-way delays in ms (one shared clock)."""
    tx.send_via(segments, dst, port, b"warm-up")  # neighbour discovery on the way
    tx_warm = rx.recv()
    assert tx_warm[0] == b"warm-up"
    delays = []
    for seq in range(PROBES):
        # The SRH is already set (sticky): the timestamp is taken right before sendto.
        tx.sock.sendto(struct.pack("!IQ", seq, time.time_ns()), (dst, port))
        data, rx_ns, _ = rx.recv()
        got_seq, sent_ns = struct.unpack("!IQ", data)
        assert got_seq == seq
        delays.append((rx_ns - sent_ns) / 1e6)
        time.sleep(0.005)
    return delays


def test_srv6_paths_deliver_with_srh(srv6_testbed: SRv6TwoPaths) -> None:
    tb = srv6_testbed
    snd, rfl = Endpoint(tb, "sender", 8620), Endpoint(tb, "reflector", 862)
    try:
        for path in tb.paths.values():
            snd.send_via(
                path.forward_segments, tb.reflector_addr, 862, b"fwd " + path.name.encode()
            )
            data, _, rthdr = rfl.recv()
            assert data == b"fwd " + path.name.encode()
            assert rthdr is not None, "the reflector must see the SRH"
            assert parse_srh(rthdr) == (0, list(path.forward_segments))
            rfl.send_via(path.return_segments, tb.sender_addr, 8620, b"ret " + path.name.encode())
            data, _, rthdr = snd.recv()
            assert data == b"ret " + path.name.encode()
            assert rthdr is not None
            assert parse_srh(rthdr) == (0, list(path.return_segments))
        stats = {name: link.stats() for name, link in tb.links.items()}
    finally:
        snd.close()
        rfl.close()
    # Each path used its own link, both ways: B's emulator forwarded datagrams too.
    for name in ("A", "B"):
        assert stats[name]["ab"]["forwarded"] >= 1
        assert stats[name]["ba"]["forwarded"] >= 1


def test_plain_ipv6_ping(srv6_testbed: SRv6TwoPaths) -> None:
    tb = srv6_testbed
    result = ping6(tb.sender.ns, tb.reflector_addr, count=3)
    assert result.received == 3
    # The plain path is link A both ways: at least its configured round trip.
    assert min(result.rtts_ms) >= tb.paths["A"].round_trip_delay_ms


def _check_path(tb: SRv6TwoPaths, path: SRv6Path) -> dict[str, float]:
    snd, rfl = Endpoint(tb, "sender", 8620), Endpoint(tb, "reflector", 862)
    try:
        fwd = statistics.median(
            one_way_delays(snd, rfl, path.forward_segments, tb.reflector_addr, 862)
        )
        ret = statistics.median(
            one_way_delays(rfl, snd, path.return_segments, tb.sender_addr, 8620)
        )
    finally:
        snd.close()
        rfl.close()
    return {"forward": fwd, "return": ret}


def test_srv6_one_way_delays_match_configuration(srv6_testbed: SRv6TwoPaths) -> None:
    tb = srv6_testbed
    measured = {name: _check_path(tb, path) for name, path in tb.paths.items()}
    for name, path in tb.paths.items():
        got = measured[name]
        assert abs(got["forward"] - path.forward_delay_ms) <= TOLERANCE_MS, (name, measured)
        assert abs(got["return"] - path.return_delay_ms) <= TOLERANCE_MS, (name, measured)


def test_cleanup_even_when_body_raises() -> None:
    names: list[str] = []
    pid = 0

    def build_and_fail() -> None:
        nonlocal names, pid
        with Testbed(prefix=TEST_PREFIX) as tb:
            a, b = tb.add_node("a"), tb.add_node("b", router=True)
            tb.add_link(a, b, if_a="eth0", if_b="eth0", addr_a="fd00::1", addr_b="fd00::2")
            pid = tb.run_in(a, ["sleep", "60"]).pid
            names = list(tb.namespaces)
            assert all((NETNS_DIR / n).exists() for n in names)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        build_and_fail()
    assert len(names) == 2
    assert not any((NETNS_DIR / n).exists() for n in names)
    assert not Path(f"/proc/{pid}").exists()


def test_emulated_link_cleanup_stops_the_element() -> None:
    with Testbed(prefix=TEST_PREFIX) as tb:
        a, b = tb.add_node("a"), tb.add_node("b")
        link = tb.add_link(a, b, if_a="e0", if_b="e0", emulation=LinkEmulation.symmetric(1.0))
        assert link.emulator is not None
        proc = link.emulator.proc
        names = list(tb.namespaces)
    assert len(names) == 3  # a, b and the middle namespace
    assert proc.poll() is not None
    assert not any((NETNS_DIR / n).exists() for n in names)


def test_sweep_removes_leftovers_of_dead_runs_only() -> None:
    prefix = f"{TEST_PREFIX}sw{os.urandom(2).hex()}-"
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftover = f"{prefix}{dead.pid}-abcdef-x"
    netns.create(leftover)
    squatter = subprocess.Popen(["ip", "netns", "exec", leftover, "sleep", "60"])
    mine = Testbed(prefix=prefix)
    try:
        mine.add_node("alive")
        removed = sweep(prefix)
        assert removed == [leftover]
        assert not (NETNS_DIR / leftover).exists()
        assert squatter.wait(timeout=5) != 0  # killed by the sweep
        assert (NETNS_DIR / mine.ns_name("alive")).exists()  # owner alive: kept
    finally:
        mine.close()
        squatter.kill()
        squatter.wait()
    assert sweep(prefix) == []


def test_bad_interface_name_is_refused() -> None:
    with Testbed(prefix=TEST_PREFIX) as tb:
        a, b = tb.add_node("a"), tb.add_node("b")
        with pytest.raises(TestbedError, match="longer than"):
            tb.add_link(a, b, if_a="x" * 16, if_b="e0")


def test_bench_reflect_mode(bench_testbed: BenchTestbed) -> None:
    tb = bench_testbed
    assert tb.sink is None
    assert ping6(tb.gen.ns, tb.sut_addr, count=2).received == 2
    proc = tb.run_pinned(tb.sut, ["sleep", "30"], cpu=1)
    deadline = time.monotonic() + 5
    while os.sched_getaffinity(proc.pid) != {1} and time.monotonic() < deadline:
        time.sleep(0.01)  # taskset sets the mask, then execs sleep
    assert os.sched_getaffinity(proc.pid) == {1}


@pytest.mark.parametrize("bench_testbed", [True], indirect=True)
def test_bench_forward_mode(bench_testbed: BenchTestbed) -> None:
    tb = bench_testbed
    assert tb.sink is not None
    assert tb.sink_addr is not None
    result = ping6(tb.gen.ns, tb.sink_addr, count=2)
    assert result.received == 2
    # The SUT really forwards: its forwarding counter moved.
    fwd = tb.sut.exec(["cat", "/proc/net/snmp6"]).stdout
    counters = dict(line.split() for line in fwd.splitlines() if line.strip())
    assert int(counters["Ip6OutForwDatagrams"]) >= 4


def test_seg6_encap_to_end_dt6(srv6_testbed: SRv6TwoPaths) -> None:
    """H.Encaps on the sender over link B, decapsulated by the reflector's End.DT6 SID."""
    tb = srv6_testbed
    policy = [tb.sids["r1.endx_b"], tb.sids["reflector.dt6"]]
    tb.sender.add_seg6_encap(f"{tb.reflector_addr}/128", policy, dev="eth0")
    before = tb.links["B"].stats()["ab"]["forwarded"]
    snd, rfl = Endpoint(tb, "sender", 8620), Endpoint(tb, "reflector", 862)
    try:
        for i in range(3):  # the first may wait for neighbour discovery
            snd.sock.sendto(b"encap %d" % i, (tb.reflector_addr, 862))
        got = sorted(rfl.recv()[0] for _ in range(3))
    finally:
        snd.close()
        rfl.close()
    assert got == [b"encap 0", b"encap 1", b"encap 2"]
    assert tb.links["B"].stats()["ab"]["forwarded"] >= before + 3
