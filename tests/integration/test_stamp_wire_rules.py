"""STAMP rules that only show on the wire, in namespaces: two nodes on a veth, IPv6 and IPv4.

``snd`` (fd00:0:1::1, 10.0.1.1, and a second "victim" address fd00:0:1::99, 10.0.1.99)
and ``ref`` (fd00:0:1::2, 10.0.1.2). The reflector is ``sixlab stamp reflector`` run in
``ref``; the sender side is either ``sixlab stamp sender`` in ``snd`` or sockets the test
opens in ``snd`` to send hand-made packets and look at what comes back.

- Authenticated mode (RFC 8972 §4.8): a Return Address TLV sends the reply to the victim
  address only when the HMAC TLV verifies; absent, wrong or misplaced, the reply comes
  back to the sender with I set. On the socket plane and on the xdp plane.
- Sessions are SSID + addresses + ports (RFC 8972 §3): two senders with one SSID against
  a stateful reflector each see their own count from 0, on both planes.
- Class of Service (RFC 8972 §4.4): DSCP2/ECN report what arrived, the reply carries
  DSCP1, over IPv6 and IPv4.
- IPv4: a whole CLI session, Ses-Sender TTL from the IPv4 TTL.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Any

import pytest

from sixlab.dataplane.xdp_plane import attach_xdp_pass
from sixlab.testbed import Testbed
from sixlab.testbed._netns import entered
from sixlab.testbed._topology import Node
from sixlab.wire import stamp as wire
from sixlab.wire import stamp_auth
from sixlab.wire import stamp_tlv as t
from sixlab.wire.timestamp import ErrorEstimate, ntp_from_ns
from tests.integration._stamp_helpers import TIMEOUT_S

from .conftest import TEST_PREFIX

pytestmark = pytest.mark.root

SIXLAB = [sys.executable, "-m", "sixlab", "stamp"]
KEY = bytes.fromhex("00112233445566778899aabbccddeeff")
PORT = 862
SPORT = 40100
ADDR = {
    6: ("fd00:0:1::1", "fd00:0:1::2", "fd00:0:1::99"),
    4: ("10.0.1.1", "10.0.1.2", "10.0.1.99"),
}
EE = ErrorEstimate.for_error_ns(1000)


@dataclass
class Pair:
    tb: Testbed
    snd: Node
    ref: Node


@pytest.fixture
def pair() -> Iterator[Pair]:
    with Testbed(prefix=TEST_PREFIX) as tb:
        snd = tb.add_node("snd")
        ref = tb.add_node("ref")
        tb.add_link(snd, ref, if_a="eth0", if_b="eth0", addr_a=ADDR[6][0], addr_b=ADDR[6][1])
        snd.add_address("eth0", ADDR[6][2])
        snd.add_address("eth0", ADDR[4][0], 24)
        snd.add_address("eth0", ADDR[4][2], 24)
        ref.add_address("eth0", ADDR[4][1], 24)
        for node in (snd, ref):
            # XDP verifies the UDP checksum: no partial (offloaded) ones on the veth.
            node.exec(["ethtool", "-K", "eth0", "tx", "off"])
        with entered(snd.ns):
            attach_xdp_pass("eth0")  # XDP_TX on a veth needs a program on the peer
        yield Pair(tb, snd, ref)


def start_reflector(p: Pair, *args: str, plane: str = "socket") -> subprocess.Popen[bytes]:
    argv = [*SIXLAB, "reflector", "--port", str(PORT), "--dataplane", plane, *args]
    if plane in ("mmap", "xdp", "afxdp"):
        argv += ["--interface", "eth0"]
    proc = p.ref.run(argv, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    line = proc.stderr.readline().decode()
    assert "reflecting on" in line, line
    return proc


def stop(proc: subprocess.Popen[bytes]) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=20)
    return err.decode()


def udp(node: Node, version: int, address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if version == 6 else socket.AF_INET
    sock = node.socket(family, socket.SOCK_DGRAM)
    sock.bind((address, port))
    return sock


def recv(sock: socket.socket, timeout: float = 2.0) -> bytes | None:
    ready, _, _ = select.select([sock], [], [], timeout)
    return sock.recv(9000) if ready else None


def auth_packet(seq: int, area: bytes) -> bytes:
    base = wire.encode_sender(
        wire.SenderPacket(seq, ntp_from_ns(time.time_ns()), EE, 5), authenticated=True
    )
    return stamp_auth.sign(base + area, KEY)


def hmac_areas(version: int, seq: int) -> dict[str, bytes]:
    victim = ip_address(ADDR[version][2])
    redirect = t.ReturnPath((t.ReturnAddress(victim),)).to_tlv().encode()
    base = wire.encode_sender(wire.SenderPacket(seq, 0, EE, 5), authenticated=True)
    return {
        "right": t.append_hmac_tlv(base, redirect, KEY),
        "absent": redirect,
        "wrong key": t.append_hmac_tlv(base, redirect, b"not the key"),
        "misplaced": t.append_hmac_tlv(base, b"", KEY) + redirect,
    }


@pytest.mark.parametrize(
    ("plane", "version"),
    [("socket", 6), ("socket", 4), ("xdp", 6)],
    ids=["socket-6", "socket-4", "xdp-6"],
)
def test_return_address_obeyed_only_with_a_verified_hmac_tlv(
    pair: Pair, plane: str, version: int
) -> None:
    me, reflector, victim = ADDR[version]
    proc = start_reflector(pair, "--ssid", "5", "--auth-key", KEY.hex(), plane=plane)
    sender = udp(pair.snd, version, me, SPORT)
    trap = udp(pair.snd, version, victim, SPORT)
    try:
        for seq, case in enumerate(("right", "absent", "wrong key", "misplaced")):
            area = hmac_areas(version, seq)[case]  # the HMAC TLV covers the Seq
            sender.sendto(auth_packet(seq, area), (reflector, PORT))
            if case == "right":
                reply = recv(trap)
                assert reply is not None, "a verified Return Address is obeyed"
                assert recv(sender, 0.3) is None
                flags = [x.flags for x in t.decode_tlvs(reply[wire.AUTH_PACKET_SIZE :])]
                assert flags == [0, 0]
            else:
                reply = recv(sender)
                assert reply is not None, f"{case}: answered along the configured path"
                assert recv(trap, 0.3) is None, f"{case}: redirected without integrity"
                scan = t.scan_tlvs(reply[wire.AUTH_PACKET_SIZE :])
                assert all(x.flags & t.TlvFlag.I for x in scan.tlvs), case
            assert stamp_auth.verify(reply, KEY)
    finally:
        sender.close()
        trap.close()
        err = stop(proc)
    assert "received 4, reflected 4" in err, err


def run_sender(p: Pair, reflector: str, *args: str, count: int = 30) -> dict[str, Any]:
    out = p.snd.exec(
        [
            *SIXLAB,
            "sender",
            reflector,
            "--json",
            "--count",
            str(count),
            "--interval",
            "0.01",
            "--timeout",
            TIMEOUT_S,
            *args,
        ],
        timeout=60,
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


@pytest.mark.parametrize("plane", ["socket", "xdp"])
def test_two_senders_with_one_ssid_have_their_own_stateful_counts(pair: Pair, plane: str) -> None:
    proc = start_reflector(pair, "--stateful", plane=plane)
    count = 40
    try:
        argv = [
            *SIXLAB, "sender", ADDR[6][1], "--json", "--count", str(count), "--interval",
            "0.01", "--timeout", TIMEOUT_S, "--ssid", "9", "--stateful-reflector",
        ]  # fmt: skip
        procs = [
            pair.snd.run([*argv, "--source", source], stdout=subprocess.PIPE)
            for source in (ADDR[6][0], ADDR[6][2])
        ]
        docs = [json.loads(proc.communicate(timeout=60)[0]) for proc in procs]
    finally:
        stop(proc)
    for doc in docs:
        assert (doc["sent"], doc["received"], doc["lost"]) == (count, count, 0)
        assert [r["reflector_seq"] for r in doc["records"]] == list(range(count))
        assert (doc["forward_lost"], doc["backward_lost"], doc["unclassified_lost"]) == (0, 0, 0)


@pytest.mark.parametrize(
    ("version", "plane"),
    [(6, "socket"), (4, "socket"), (6, "mmap"), (6, "afxdp")],
    ids=["6", "4", "6-mmap", "6-afxdp"],
)
def test_class_of_service_reports_what_arrived_and_answers_with_dscp1(
    pair: Pair, version: int, plane: str
) -> None:
    me, reflector, _ = ADDR[version]
    proc = start_reflector(pair, plane=plane)
    sock = udp(pair.snd, version, me, SPORT)
    if version == 6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, (10 << 2) | 0b01)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVTCLASS, 1)
        level, kind = socket.IPPROTO_IPV6, socket.IPV6_TCLASS
    else:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, (10 << 2) | 0b01)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        level, kind = socket.IPPROTO_IP, socket.IP_TOS
    try:
        cos = t.ClassOfService(dscp1=46).to_tlv().encode()
        pkt = wire.encode_sender(wire.SenderPacket(1, ntp_from_ns(time.time_ns()), EE, 3, cos))
        sock.sendto(pkt, (reflector, PORT))
        assert select.select([sock], [], [], 2.0)[0]
        data, anc, _, _ = sock.recvmsg(9000, socket.CMSG_SPACE(4))
    finally:
        sock.close()
        stop(proc)
    (tclass,) = [v for lvl, k, v in anc if (lvl, k) == (level, kind)]
    assert tclass[0] >> 2 == 46  # the reply carries DSCP1 (IPv6 int / IPv4 byte, first byte)
    tlv = t.decode_tlvs(data[wire.UNAUTH_PACKET_SIZE :])[0]
    got = t.ClassOfService.from_tlv(tlv)
    assert (tlv.flags, got.dscp2, got.ecn2, got.rp) == (0, 10, 1, 0)


@pytest.mark.parametrize("listen", [None, ADDR[4][1]], ids=["dual-stack", "ipv4-socket"])
def test_ipv4_session_from_the_cli(pair: Pair, listen: str | None) -> None:
    proc = start_reflector(pair, *(["--listen", listen] if listen else []), "--stateful")
    try:
        doc = run_sender(pair, ADDR[4][1], "--source", ADDR[4][0], "--stateful-reflector")
    finally:
        stop(proc)
    assert (doc["sent"], doc["received"], doc["lost"]) == (30, 30, 0)
    assert {r["ttl"] for r in doc["records"]} == {64}  # one hop, IPv4 TTL copied
    assert [r["reflector_seq"] for r in doc["records"]] == list(range(30))
    assert doc["reflector_ssid_zero"] is False


@pytest.mark.parametrize("plane", ["mmap", "afxdp"])
def test_ipv4_on_an_ipv6_only_plane_is_a_clear_error(pair: Pair, plane: str) -> None:
    out = pair.ref.exec(
        [
            *SIXLAB,
            "reflector",
            "--listen",
            ADDR[4][1],
            "--dataplane",
            plane,
            "--interface",
            "eth0",
        ],
        check=False,
    )
    assert out.returncode == 1
    assert "IPv6 only" in out.stderr
    assert "Traceback" not in out.stderr
