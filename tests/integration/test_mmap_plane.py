"""The ``mmap`` plane opened in one namespace and driven from a thread in another, and
the Traffic Class of its replies, checked by scapy on a capture.

::

    G (generator) g0 ──────── r0 R (reflector: mmap plane on r0)
    fd00:8::1                     fd00:8::2

The plane is opened with the thread inside R's namespace; its engine thread, like the
threads that call ``send``, stays in the test's own namespace (as an agent's gRPC and
engine threads do when it opens a plane in a lab node). R knows G's MAC from the start
(the pair of tests/integration/_pair.py), so a reply whose next hop is looked up in R's
tables leaves by the packet socket on r0 without the kernel's help; looked up anywhere
else, it cannot.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv6Address

import pytest
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from sixlab.dataplane.base import DataplaneConfig, create
from sixlab.dataplane.engine import ReflectorEngine
from sixlab.dataplane.mmap_plane import MmapDataplane
from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig
from sixlab.testbed._netns import entered
from sixlab.wire import stamp as wire
from sixlab.wire import stamp_tlv as tlv
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat

from ._pair import Pair, veth_pair
from ._tap import ETH_P_IPV6, Frame, Tap

pytestmark = pytest.mark.root

G_ADDR = IPv6Address("fd00:8::1")
R_ADDR = IPv6Address("fd00:8::2")
PORT = 862
SENDER_PORT = 50862
IPV6_TCLASS = 67  # <linux/in6.h>
#: What the Class of Service probe carries: DSCP 46 (EF), ECN 01 (ECT(1)).
PROBE_TCLASS = 46 << 2 | 1
#: What it asks the reply to carry (RFC 8972 §4.4: DSCP1).
DSCP1 = 10
EE = ErrorEstimate.for_error_ns(1000, fmt=TimestampFormat.NTP)


@dataclass
class Lab(Pair):
    plane: MmapDataplane


@pytest.fixture
def lab() -> Iterator[Lab]:
    with veth_pair(str(G_ADDR), str(R_ADDR)) as p:
        with entered(p.r.ns):
            plane = create("mmap", DataplaneConfig(PORT, interface="r0", source=R_ADDR))
            plane.open()
        assert isinstance(plane, MmapDataplane)
        try:
            yield Lab(p.tb, p.g, p.r, plane)
        finally:
            with entered(p.r.ns):  # the plane removes its nftables table: nft(8)
                plane.close()


def _capture(lab: Lab) -> Tap:
    return Tap(lab.g, "g0", protocol=ETH_P_IPV6)


def _captured(tap: Tap, timeout: float = 3.0) -> Ether:
    """The next frame G received for SENDER_PORT, as scapy decodes it."""

    def reply(frame: Frame) -> bool:
        if frame.outgoing:
            return False
        decoded = Ether(frame.data)
        return UDP in decoded and decoded[UDP].dport == SENDER_PORT

    got = tap.wait(reply, timeout=timeout)
    if not got:
        pytest.fail("no frame for the sender port reached G")
    return Ether(got[0].data)


def _probe(seq: int, tlvs: bytes = b"") -> bytes:
    t1 = (3_900_000_000 << 32) | seq
    return wire.encode_sender(wire.SenderPacket(seq, t1, EE, 0, tlvs))


def test_send_resolves_the_next_hop_in_the_plane_namespace(lab: Lab) -> None:
    """``send`` from a thread outside R's namespace: the next hop is R's (G on r0), the
    frame leaves by the packet socket, and carries the Traffic Class asked for."""
    tap = _capture(lab)
    try:
        lab.plane.send(b"x" * 44, G_ADDR, SENDER_PORT, tclass=PROBE_TCLASS)
        frame = _captured(tap)
    finally:
        tap.close()
    assert lab.plane.counters()["fallback_sends"] == 0  # not through the kernel's stack
    ip = frame[IPv6]
    assert (ip.src, ip.dst, ip.tc) == (str(R_ADDR), str(G_ADDR), PROBE_TCLASS)
    assert frame.dst == lab.g.mac("g0")


def test_reflector_replies_from_another_namespace_and_with_dscp1(lab: Lab) -> None:
    """A ReflectorEngine whose thread is outside R's namespace: a plain probe is answered
    on the fast path (next hop from R's tables), and a Class of Service probe (RFC 8972
    §4.4) gets a reply with DSCP1 in its Traffic Class and the probe's DSCP and ECN in
    the TLV, RP 0."""
    engine = ReflectorEngine(lab.plane, Reflector())
    engine.set_default(ReflectorSessionConfig(ssid=None))
    tap = _capture(lab)
    udp = lab.g.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    udp.bind((str(G_ADDR), SENDER_PORT))
    engine.start()
    try:
        udp.sendto(_probe(0), (str(R_ADDR), PORT))
        plain = _captured(tap)
        cos = tlv.ClassOfService(dscp1=DSCP1, ecn1=0).to_tlv().encode()
        udp.setsockopt(socket.IPPROTO_IPV6, IPV6_TCLASS, PROBE_TCLASS)
        udp.sendto(_probe(1, cos), (str(R_ADDR), PORT))
        marked = _captured(tap)
    finally:
        engine.shutdown()
        tap.close()
        udp.close()
    assert engine.error is None
    counters = lab.plane.counters()
    assert (counters["fast_replies"], counters["fallback_sends"]) == (1, 0), counters
    assert plain[IPv6].tc == 0  # no Class of Service TLV: the default
    assert marked[IPv6].tc == DSCP1 << 2, marked[IPv6].tc
    payload = bytes(marked[UDP].payload)
    assert wire.decode_reflector(payload[: wire.UNAUTH_PACKET_SIZE]).seq == 1
    (reply_tlv,) = tlv.decode_tlvs(payload[wire.UNAUTH_PACKET_SIZE :])
    value = tlv.ClassOfService.from_tlv(reply_tlv)
    assert (value.dscp2, value.ecn2, value.rp) == (PROBE_TCLASS >> 2, PROBE_TCLASS & 3, 0)
