"""The ``xdp`` data plane on veths in namespaces: sender — router (SRv6 End) — reflector.

::

    S (sender) s0 ──── e0 E (router, End fc00:e::1) e1 ──── r0 R (reflector)
    fd00:1::1                fd00:1::2 / fd00:2::2             fd00:2::1

The engines run in this process; a plane is opened with the thread inside its node's
namespace (its sockets stay there, its BPF objects are global). The peers of the veths
that run our programs get a plain XDP_PASS program (frames sent with XDP_TX on a veth
are lost unless the peer runs XDP too) and every veth has tx checksum offload off, so
that checksums in frames an XDP program reads are complete.

What is proved here: the kernel reflector answers a ``socket`` sender on a plain and an
SRv6 path, stateless and stateful, NTP and PTP, with sane delays and the return SRH on
the wire; its replies captured at the sender are byte-identical to what the Python core
would send, timestamps aside; ping and TCP cross the interface untouched; malformed
packets are counted and never answered, nor are packets damaged on the way (bad UDP
checksum); the collector feeds the sender engine the same
results the socket plane would; close() detaches, and a SIGKILLed owner is cleaned up
by the next open().
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv6Address
from typing import Any

import pytest

from sixlab.dataplane.base import DataplaneConfig
from sixlab.dataplane.engine import ReflectorEngine, SenderEngine, SenderSessionSpec
from sixlab.dataplane.udpsocket import SocketDataplane
from sixlab.dataplane.xdp_plane import XdpDataplane, attach_xdp_pass
from sixlab.stamp._events import StampResult
from sixlab.stamp.reflector import Reflector, ReflectorMode, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig
from sixlab.testbed import Testbed
from sixlab.testbed._netns import entered
from sixlab.testbed._topology import Node
from sixlab.wire import stamp as wire
from sixlab.wire.packet import build_udp_packet, parse_udp_packet
from sixlab.wire.timestamp import (
    NS_PER_S,
    ErrorEstimate,
    TimestampFormat,
    decode_timestamp,
    ntp_from_ns,
)

from ._tap import Tap
from .conftest import TEST_PREFIX

pytestmark = pytest.mark.root

S_ADDR = IPv6Address("fd00:1::1")
R_ADDR = IPv6Address("fd00:2::1")
END_SID = IPv6Address("fc00:e::1")
PORT = 862
SENDER_PORT = 50862
ETH_P_IPV6 = 0x86DD


@dataclass
class Chain:
    tb: Testbed
    s: Node
    e: Node
    r: Node


def _attach_pass(node: Node, ifname: str) -> None:
    with entered(node.ns):
        attach_xdp_pass(ifname)


@pytest.fixture
def chain() -> Iterator[Chain]:
    with Testbed(prefix=TEST_PREFIX) as tb:
        s = tb.add_node("s")
        e = tb.add_node("e", router=True)
        r = tb.add_node("r")
        tb.add_link(s, e, if_a="s0", if_b="e0", addr_a="fd00:1::1", addr_b="fd00:1::2")
        tb.add_link(e, r, if_a="e1", if_b="r0", addr_a="fd00:2::2", addr_b="fd00:2::1")
        s.add_route("default", via="fd00:1::2")
        r.add_route("default", via="fd00:2::2")
        e.add_seg6local(str(END_SID), "End", dev="e0")
        for node, ifs in ((s, ["s0"]), (e, ["e0", "e1"]), (r, ["r0"])):
            for ifname in ifs:
                node.sysctl(
                    {
                        f"net.ipv6.conf.{ifname}.seg6_enabled": 1,
                        f"net.ipv6.conf.{ifname}.accept_dad": 0,
                    }
                )
                node.exec(["ethtool", "-K", ifname, "tx", "off"])
        _attach_pass(e, "e0")
        _attach_pass(e, "e1")
        # Neighbours resolved before timing anything.
        assert _ping(s, R_ADDR, 1) == 1
        yield Chain(tb, s, e, r)


def _ping(node: Node, dst: IPv6Address, count: int, timeout: float = 2.0) -> int:
    """ICMPv6 Echo (RFC 4443 §4.1) from ``node``; how many replies came back with our data.

    A raw socket rather than ping(8), which this machine may not have; the kernel fills
    in the ICMPv6 checksum of a raw ICMPv6 socket itself (RFC 3542 §3.1).
    """
    sock = node.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
    sock.settimeout(timeout)
    ident = os.getpid() & 0xFFFF
    got = 0
    try:
        for seq in range(count):
            body = os.urandom(32)
            sock.sendto(struct.pack("!BBHHH", 128, 0, 0, ident, seq) + body, (str(dst), 0))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    data = sock.recv(2048)
                except TimeoutError:
                    break
                if data[0] == 129 and data[4:8] == struct.pack("!HH", ident, seq):
                    got += data[8:] == body
                    break
    finally:
        sock.close()
    return got


def _xdp_attached(node: Node, ifname: str) -> bool:
    out = node.exec(["ip", "link", "show", "dev", ifname]).stdout
    return " xdp" in out


def _capture(node: Node, ifname: str) -> Tap:
    """What left and what arrived on the sender's link (``Tap.frames``)."""
    return Tap(node, ifname)


def _run_session(
    c: Chain,
    sender_plane: str,
    reflector_plane: str,
    cfg: ReflectorSessionConfig,
    *,
    segments: tuple[IPv6Address, ...] | None,
    count: int = 20,
) -> tuple[list[StampResult], dict[str, int]]:
    """One sender session S -> R; results and the XDP plane's kernel counters."""
    with entered(c.r.ns):
        rplane = (
            XdpDataplane(DataplaneConfig(PORT, interface="r0"))
            if reflector_plane == "xdp"
            else SocketDataplane(DataplaneConfig(PORT))
        )
        rplane.open()
    with entered(c.s.ns):
        splane = (
            XdpDataplane(DataplaneConfig(SENDER_PORT, interface="s0"))
            if sender_plane == "xdp"
            else SocketDataplane(DataplaneConfig(SENDER_PORT))
        )
        splane.open()
    core = Reflector()
    core.add_session(cfg)
    if isinstance(rplane, XdpDataplane):
        rplane.set_reflector_session(cfg)
    if isinstance(splane, XdpDataplane):
        assert cfg.ssid is not None
        splane.add_sender_session(cfg.ssid)
    rengine = ReflectorEngine(rplane, core)
    sengine = SenderEngine(splane)
    rengine.start()
    sengine.start()
    try:
        assert cfg.ssid is not None
        scfg = SenderConfig(
            ssid=cfg.ssid,
            interval_ns=5_000_000,
            count=count,
            fmt=cfg.fmt,
            loss_timeout_ns=500_000_000,
            reflector_stateful=cfg.mode is ReflectorMode.STATEFUL,
        )
        sengine.add_session(SenderSessionSpec(scfg, R_ADDR, PORT, segments=segments))
        sengine.start_session(cfg.ssid)
        assert sengine.wait_finished(cfg.ssid, 10)
        results = sengine.results(cfg.ssid)
        xdp = rplane if isinstance(rplane, XdpDataplane) else splane
        counters = xdp.counters() if isinstance(xdp, XdpDataplane) else {}
    finally:
        sengine.shutdown()
        rengine.shutdown()
        rplane.close()
        splane.close()
    assert sengine.error is None
    assert rengine.error is None
    return results, counters


def _check_delays(results: list[StampResult], count: int) -> None:
    assert len(results) == count
    assert sorted(r.seq for r in results) == list(range(count))
    for r in results:
        # One host clock on both sides: every delay is positive and small. The
        # reflector's residence time (T3 - T2) gets the same bound: a user-space
        # reflector descheduled between receive and send holds a reply for milliseconds
        # (a CI run saw 8.04 ms on the socket plane).
        assert 0 < r.direct_ns < 50_000_000, r
        assert 0 < r.return_ns < 50_000_000, r
        assert 0 <= r.t3_ns - r.t2_ns < 50_000_000, r
        assert 0 < r.rtt_ns < 50_000_000, r
        assert r.ses_sender_ttl == 63  # 64, less one for the router


@pytest.mark.parametrize("fmt", list(TimestampFormat))
@pytest.mark.parametrize("mode", list(ReflectorMode))
@pytest.mark.parametrize("srv6", [False, True], ids=["plain", "srv6"])
def test_xdp_reflector_answers_socket_sender(
    chain: Chain, fmt: TimestampFormat, mode: ReflectorMode, srv6: bool
) -> None:
    cfg = ReflectorSessionConfig(
        ssid=11, mode=mode, fmt=fmt, return_segments=(END_SID,) if srv6 else None
    )
    cap = _capture(chain.s, "s0")
    results, counters = _run_session(
        chain, "socket", "xdp", cfg, segments=(END_SID, R_ADDR) if srv6 else None
    )
    _check_delays(results, 20)
    assert counters == {"reflected": 20}
    if mode is ReflectorMode.STATEFUL:
        assert sorted(r.reflector_seq for r in results) == list(range(20))
    else:
        assert all(r.reflector_seq == r.seq for r in results)
    replies = [
        parse_udp_packet(f.data[14:])
        for f in cap.frames()
        if not f.outgoing and f.data[12:14] == b"\x86\xdd" and _is_stamp(f.data, SENDER_PORT)
    ]
    assert len(replies) == 20
    for rx in replies:
        if srv6:
            assert rx.srh is not None
            assert rx.srh.travel_order == (END_SID, S_ADDR)
        else:
            assert rx.srh is None
    cap.close()


def _is_stamp(frame: bytes, dport: int) -> bool:
    try:
        return parse_udp_packet(frame[14:]).dst_port == dport
    except ValueError:
        return False


@pytest.mark.parametrize("srv6", [False, True], ids=["plain", "srv6"])
def test_xdp_replies_on_the_wire_equal_the_python_core(chain: Chain, srv6: bool) -> None:
    """Captured request/reply pairs: the XDP reply is the core's, timestamps aside."""
    cfg = ReflectorSessionConfig(
        ssid=12, mode=ReflectorMode.STATEFUL, return_segments=(END_SID,) if srv6 else None
    )
    cap = _capture(chain.s, "s0")
    results, _ = _run_session(
        chain, "socket", "xdp", cfg, segments=(END_SID, R_ADDR) if srv6 else None, count=10
    )
    _check_delays(results, 10)
    frames = cap.frames()
    cap.close()
    sent = [parse_udp_packet(f.data[14:]) for f in frames if f.outgoing and _is_stamp(f.data, PORT)]
    got = [f.data for f in frames if not f.outgoing and _is_stamp(f.data, SENDER_PORT)]
    assert len(sent) == len(got) == 10
    core = Reflector()
    core.add_session(cfg)
    for req, reply in zip(sent, got, strict=True):
        refl = core.reflect(bytes(req.payload), time.time_ns(), time.time_ns, 63)
        assert refl is not None
        path = (END_SID, S_ADDR) if srv6 else None
        exp = bytearray(
            build_udp_packet(
                R_ADDR, S_ADDR, PORT, SENDER_PORT, refl.payload, hop_limit=63, segments=path
            )
        )
        if srv6:  # as the End on the router leaves it
            exp[24:40] = S_ADDR.packed
            exp[43] = 0
        ip = reply[14:]
        assert _masked(ip) == _masked(bytes(exp))
        parse_udp_packet(ip, verify_checksum=True)


def _masked(ip: bytes) -> bytes:
    rx = parse_udp_packet(ip)
    b = bytearray(ip)
    pl = len(ip) - len(rx.payload)
    b[pl - 2 : pl] = b"\0\0"  # UDP checksum
    b[pl + 4 : pl + 12] = bytes(8)  # T3
    b[pl + 16 : pl + 24] = bytes(8)  # T2
    return bytes(b)


def test_xdp_leaves_ping_and_tcp_alone(chain: Chain) -> None:
    with entered(chain.r.ns):
        plane = XdpDataplane(DataplaneConfig(PORT, interface="r0"))
        plane.open()
    try:
        plane.set_reflector_session(ReflectorSessionConfig(ssid=None))
        assert _xdp_attached(chain.r, "r0")
        assert _ping(chain.s, R_ADDR, 3) == 3
        data = os.urandom(1 << 20)
        server = chain.r.socket(socket.AF_INET6, socket.SOCK_STREAM)
        server.bind((str(R_ADDR), 5001))
        server.listen(1)
        got = hashlib.sha256()

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                while chunk := conn.recv(65536):
                    got.update(chunk)

        t = threading.Thread(target=serve)
        t.start()
        client = chain.s.socket(socket.AF_INET6, socket.SOCK_STREAM)
        client.settimeout(10)
        client.connect((str(R_ADDR), 5001))
        client.sendall(data)
        client.close()
        t.join(10)
        server.close()
        assert got.digest() == hashlib.sha256(data).digest()
        assert plane.counters() == {}  # nothing of that was STAMP
    finally:
        plane.close()


def test_xdp_malformed_packets_are_counted_never_answered(chain: Chain) -> None:
    with entered(chain.r.ns):
        plane = XdpDataplane(DataplaneConfig(PORT, interface="r0"))
        plane.open()
    try:
        plane.set_reflector_session(ReflectorSessionConfig(ssid=None))
        sock = chain.s.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        sock.bind((str(S_ADDR), SENDER_PORT))
        sock.settimeout(0.5)
        good = struct.pack("!IQHH", 1, 0, 0x0001, 5) + bytes(28)
        zero_mult = good[:12] + b"\0\0" + good[14:]
        for n in (0, 1, 13):
            sock.sendto(good[:n], (str(R_ADDR), PORT))
        sock.sendto(zero_mult, (str(R_ADDR), PORT))
        with pytest.raises(TimeoutError):
            sock.recv(2048)
        sock.close()
        counters = plane.counters()
        assert counters == {"drop-too-short": 3, "drop-multiplier-zero": 1}
    finally:
        plane.close()


def _udp6_csum_errors(node: Node) -> int:
    """Udp6InCsumErrors of the node's namespace (/proc/net/snmp6)."""
    for line in node.exec(["cat", "/proc/net/snmp6"]).stdout.splitlines():
        name, _, value = line.partition(" ")
        if name == "Udp6InCsumErrors":
            return int(value)
    raise AssertionError("no Udp6InCsumErrors in /proc/net/snmp6")


def test_xdp_damaged_sender_packet_gets_no_reply(chain: Chain) -> None:
    """A sender packet damaged on the way (one Seq bit flipped, checksum as sent): the
    kernel program passes it, the kernel drops it as a checksum error, nobody answers.
    The same packet intact, sent the same way, is answered in the kernel."""
    with entered(chain.r.ns):
        plane = XdpDataplane(DataplaneConfig(PORT, interface="r0"))
        plane.open()
    engine = ReflectorEngine(plane, Reflector())  # the user-space path answers too
    engine.set_default(ReflectorSessionConfig(ssid=None))
    engine.start()
    # A raw UDP socket sends the datagram as given: the kernel leaves its checksum alone.
    raw = chain.s.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_UDP)
    rx = chain.s.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        raw.bind((str(S_ADDR), 0))
        rx.bind((str(S_ADDR), SENDER_PORT))
        rx.settimeout(2)
        payload = wire.encode_sender(
            wire.SenderPacket(7, ntp_from_ns(time.time_ns()), ErrorEstimate.for_error_ns(1000), 5)
        )
        good = build_udp_packet(S_ADDR, R_ADDR, SENDER_PORT, PORT, payload)[40:]
        damaged = bytearray(good)
        damaged[8 + 3] ^= 0x04  # Seq 7 -> 3
        errors = _udp6_csum_errors(chain.r)
        raw.sendto(bytes(damaged), (str(R_ADDR), 0))
        raw.sendto(good, (str(R_ADDR), 0))
        reply = wire.decode_reflector(rx.recv(2048))
        assert (reply.sender_seq, reply.seq) == (7, 7)  # the intact one, and only it
        rx.settimeout(0.5)
        with pytest.raises(TimeoutError):
            rx.recv(2048)
        assert plane.counters() == {"reflected": 1, "pass-bad-checksum": 1}
        assert _udp6_csum_errors(chain.r) == errors + 1
        assert engine.counters.received == 0
    finally:
        raw.close()
        rx.close()
        engine.shutdown()
        plane.close()
    assert engine.error is None


def test_xdp_collector_gives_what_the_socket_plane_gives(chain: Chain) -> None:
    cfg = ReflectorSessionConfig(ssid=21, mode=ReflectorMode.STATEFUL)
    via_xdp, counters = _run_session(chain, "xdp", "socket", cfg, segments=None)
    assert counters == {"collected": 20}
    via_sock, _ = _run_session(chain, "socket", "socket", cfg, segments=None)
    _check_delays(via_xdp, 20)
    _check_delays(via_sock, 20)

    def shape(r: StampResult) -> tuple[object, ...]:
        return (r.ssid, r.seq, r.reflector_seq, r.ses_sender_ttl, r.sender_error, r.reflector_error)

    assert [shape(r) for r in via_xdp] == [shape(r) for r in via_sock]


KILLED_OWNER = """
import sys, time
from sixlab.dataplane.base import DataplaneConfig
from sixlab.dataplane.xdp_plane import XdpDataplane, attach_xdp_pass
from sixlab.stamp.reflector import ReflectorSessionConfig
p = XdpDataplane(DataplaneConfig(862, interface="r0"))
p.open()
p.set_reflector_session(ReflectorSessionConfig(ssid=None))
print("ready", flush=True)
time.sleep(60)
"""


def test_xdp_close_detaches_and_reopen_after_sigkill(chain: Chain) -> None:
    with entered(chain.r.ns):
        plane = XdpDataplane(DataplaneConfig(PORT, interface="r0"))
        plane.open()
    plane.set_reflector_session(ReflectorSessionConfig(ssid=None))
    assert _xdp_attached(chain.r, "r0")
    plane.close()
    assert not _xdp_attached(chain.r, "r0")
    plane.close()  # twice is fine

    proc = chain.r.run([sys.executable, "-c", KILLED_OWNER], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"ready"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    assert _xdp_attached(chain.r, "r0")  # the dead owner's program is still there

    cfg = ReflectorSessionConfig(ssid=31)
    results, counters = _run_session(chain, "socket", "xdp", cfg, segments=None)
    _check_delays(results, 20)
    assert counters == {"reflected": 20}
    assert not _xdp_attached(chain.r, "r0")


# --------------------------------------------- SSID sessions beside the default session


def _kernel_reflector_state(plane: XdpDataplane) -> tuple[int, set[int]]:
    """``stamp_cfg.default_only`` and the session-map keys of the attached reflector.

    Read with bpftool from the maps of the program attached to the interface: what the
    kernel holds, not what the plane believes it wrote.
    """

    def bpftool(*args: str) -> Any:
        out = subprocess.run(["bpftool", "-j", *args], check=True, capture_output=True, text=True)
        return json.loads(out.stdout)

    prog = bpftool("prog", "show", "id", str(plane.program_stats().id))
    default_only: int | None = None
    keys: set[int] | None = None
    for map_id in prog["map_ids"]:
        name = bpftool("map", "show", "id", str(map_id))["name"]
        if name == "stamp_cfg":  # one entry, key 0: struct stamp_config (BTF-formatted)
            (entry,) = bpftool("map", "dump", "id", str(map_id))
            default_only = int(entry["formatted"]["value"]["default_only"])
        elif name == "stamp_sessions":
            keys = {int(e["formatted"]["key"]) for e in bpftool("map", "dump", "id", str(map_id))}
    assert default_only is not None, prog
    assert keys is not None, prog
    return default_only, keys


@dataclass
class Prober:
    """Sends Session-Sender packets from S to the reflector, one at a time."""

    sock: socket.socket
    seq: int = 1000

    def ask(self, ssid: int) -> tuple[bytes, bytes]:
        """(request payload, reply payload) for one packet of ``ssid``."""
        self.seq += 1
        req = wire.encode_sender(
            wire.SenderPacket(self.seq, ntp_from_ns(time.time_ns()), ErrorEstimate(), ssid)
        )
        self.sock.sendto(req, (str(R_ADDR), PORT))
        reply = self.sock.recv(2048)
        return req, reply


def _check_answers(prober: Prober, core: Reflector, ssids: list[int]) -> None:
    """Each SSID's reply is the core's (same sessions), timestamps in the session's format."""
    for ssid in ssids:
        req, reply = prober.ask(ssid)
        refl = core.reflect(req, time.time_ns(), time.time_ns, 63)
        assert refl is not None
        # T3 (bytes 4..11) and T2 (16..23) are clock readings: compared by format below.
        masked = [p[:4] + bytes(8) + p[12:16] + bytes(8) + p[24:] for p in (reply, refl.payload)]
        assert masked[0] == masked[1], (ssid, reply.hex(), refl.payload.hex())
        got = wire.decode_reflector(reply)
        fmt = got.error_estimate.fmt
        offset = 37 * NS_PER_S if fmt is TimestampFormat.PTP else 0  # TAI - UTC, PTP only
        for ts in (got.receive_timestamp, got.timestamp):
            # NTP and PTP epochs are 70 years apart: a minute tells them apart, and the
            # core's reply (same Error Estimate, Z bit included) says which was meant.
            assert abs(decode_timestamp(ts, fmt) - offset - time.time_ns()) < 60 * NS_PER_S


def test_xdp_ssid_sessions_beside_the_default_keep_default_only(chain: Chain) -> None:
    """``stamp_cfg.default_only`` follows the session map, and answers follow the sessions.

    Default session alone: the flag is set and every SSID gets the default's reply. An
    SSID session added: the flag is cleared before the session is written, its SSID gets
    that session's reply (stateful from 0, PTP, its own Error Estimate), the others the
    default's. A second one added and the first removed: the flag stays clear. The last
    one removed: the flag is set again and its SSID falls back to the default.
    """
    with entered(chain.r.ns):
        plane = XdpDataplane(DataplaneConfig(PORT, interface="r0"))
        plane.open()
    sock = chain.s.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.bind((str(S_ADDR), SENDER_PORT))
    sock.settimeout(2.0)
    prober = Prober(sock)
    default = ReflectorSessionConfig(ssid=None)  # stateless, NTP
    ee = ErrorEstimate(synchronized=True, fmt=TimestampFormat.PTP, scale=3, multiplier=7)
    seven = ReflectorSessionConfig(
        ssid=7, mode=ReflectorMode.STATEFUL, fmt=TimestampFormat.PTP, error_estimate=ee
    )
    nine = ReflectorSessionConfig(ssid=9, mode=ReflectorMode.STATEFUL)
    core = Reflector()
    core.set_default(default)
    default_key = 0x10000  # STAMP_DEFAULT_SSID
    try:
        plane.set_reflector_session(default)
        assert _kernel_reflector_state(plane) == (1, {default_key})
        _check_answers(prober, core, [7, 8])

        plane.set_reflector_session(seven)
        core.add_session(seven)
        assert _kernel_reflector_state(plane) == (0, {default_key, 7})
        _check_answers(prober, core, [7, 8, 7, 7, 8])  # 7: Seq 0, 1, 2 (stateful)

        plane.set_reflector_session(nine)
        core.add_session(nine)
        assert plane.remove_reflector_session(7)
        core.remove_session(7)
        assert _kernel_reflector_state(plane) == (0, {default_key, 9})  # 9 is still there
        _check_answers(prober, core, [9, 7, 9])

        assert not plane.remove_reflector_session(5)  # never there: nothing changes
        assert _kernel_reflector_state(plane) == (0, {default_key, 9})
        assert plane.remove_reflector_session(9)
        core.remove_session(9)
        assert _kernel_reflector_state(plane) == (1, {default_key})
        _check_answers(prober, core, [9, 7, 8])

        # Every reply came from the kernel, each counted under the session that answered.
        assert plane.counters_by_session() == {
            -1: {"reflected": 2 + 2 + 1 + 3},
            7: {"reflected": 3},
            9: {"reflected": 2},
        }
    finally:
        sock.close()
        plane.close()
