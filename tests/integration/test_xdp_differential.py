"""Differential: the same recorded sender packets through the ``scapy``, ``mmap``,
``socket``, ``xdp`` and ``afxdp`` reflectors give byte-identical replies, timestamps aside.

::

    G (generator) g0 ──────── r0 R (reflector: one data plane at a time)
    fd00:7::1                     fd00:7::2

G writes whole Ethernet frames on ``g0`` with a packet socket (the recording: plain and
SRv6-delivered probes, a stateful session with a configured return SID list and the
SSID-agnostic default session, an Extra Padding TLV, a short RFC 8762 §4.6 packet and a
Return Path TLV, RFC 9503, a probe with a non-zero Traffic Class) and captures what
comes back on the same link. Every plane
gets the same frames in the same order, one at a time, with a fresh ``Reflector`` core,
so stateful sequence numbers agree too. The replies' IPv6 packets must be equal once T2,
T3 (the only fields RFC 8762 §4.3 lets differ: they are clock readings) and the UDP
checksum that covers them are zeroed; each checksum must be right on its own.

The xdp plane answers the first five kinds in the kernel and passes the short packet
and the Return Path TLV to its user-space path; the kernel counters say so.

Class of Service (RFC 8972 §4.4) is compared among the planes that set a reply's
Traffic Class (``sets_tclass``: ``socket``, ``mmap``, ``xdp``, ``afxdp``): the reply carries the
probe's DSCP and ECN in the TLV, RP 0, and leaves with DSCP1. The others report RP 1
and the received DSCP as unknown, as RFC 8972 §4.4 lets a reflector that cannot set it.

Set-up facts: the pair of tests/integration/_pair.py (each end knows the other's MAC
from the start, tx checksum offload off on both), ``g0`` runs the plain XDP_PASS
program (frames sent with XDP_TX on a veth are lost unless the peer runs XDP), and R has
``net.ipv6.auto_flowlabels = 0`` so that replies sent through kernel sockets carry Flow
Label 0 like those built in user space and in XDP (RFC 6437 lets a source choose either).
"""

from __future__ import annotations

import gc
import socket
import time
from collections.abc import Iterator
from ipaddress import IPv6Address

import pytest

from sixlab.dataplane.base import DataplaneConfig, create
from sixlab.dataplane.engine import ReflectorEngine
from sixlab.dataplane.xdp_plane import attach_xdp_pass
from sixlab.stamp.reflector import Reflector, ReflectorMode, ReflectorSessionConfig
from sixlab.testbed._netns import entered
from sixlab.wire import stamp as wire
from sixlab.wire import stamp_tlv as tlv
from sixlab.wire.packet import build_udp_packet, parse_udp_packet
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat

from ._pair import Pair, veth_pair
from ._tap import ETH_P_IPV6, Tap

pytestmark = pytest.mark.root

G_ADDR = IPv6Address("fd00:7::1")
R_ADDR = IPv6Address("fd00:7::2")
#: A SID beyond G (routed to it by R): the first hop of the configured return path.
RETURN_SID = IPv6Address("fc00:77::1")
#: A SID the probes visited on their way (it stays in the SRH they arrive with).
FORWARD_SID = IPv6Address("fc00:66::1")
PORT = 862
SENDER_PORT = 50862
PLANES = ("scapy", "mmap", "socket", "xdp", "afxdp")
#: The planes that apply a reply's Traffic Class (``Dataplane.sets_tclass``).
TCLASS_PLANES = ("socket", "mmap", "xdp", "afxdp")
#: What the Class of Service probes carry: DSCP 46 (EF), ECN 01 (ECT(1)).
PROBE_TCLASS = 46 << 2 | 1
STATEFUL_SSID = 7
DEFAULT_SSID = 8  # no session of its own: the default session answers
EE = ErrorEstimate.for_error_ns(1000, fmt=TimestampFormat.NTP)


@pytest.fixture
def pair() -> Iterator[Pair]:
    with veth_pair(str(G_ADDR), str(R_ADDR)) as p:
        p.r.add_route("fc00:77::/32", via=str(G_ADDR))
        p.r.sysctl({"net.ipv6.auto_flowlabels": 0})
        with entered(p.g.ns):
            attach_xdp_pass("g0")
        yield p


def _frame_header(p: Pair) -> bytes:
    """The Ethernet header of a frame from G to R."""
    return (
        bytes.fromhex(p.r.mac("r0").replace(":", ""))
        + bytes.fromhex(p.g.mac("g0").replace(":", ""))
        + ETH_P_IPV6.to_bytes(2, "big")
    )


def _probe(seq: int, ssid: int, tlvs: bytes = b"") -> bytes:
    t1 = (3_900_000_000 << 32) | seq  # any NTP time: the reflector only echoes it
    return wire.encode_sender(wire.SenderPacket(seq, t1, EE, ssid, tlvs))


def _ip(payload: bytes, *, srv6: bool = False, tclass: int = 0) -> bytes:
    """G → R, plain or as an SRv6 packet at its last segment (Segments Left 0)."""
    if not srv6:
        return build_udp_packet(G_ADDR, R_ADDR, SENDER_PORT, PORT, payload, traffic_class=tclass)
    pkt = bytearray(
        build_udp_packet(
            G_ADDR,
            R_ADDR,
            SENDER_PORT,
            PORT,
            payload,
            segments=(FORWARD_SID, R_ADDR),
            traffic_class=tclass,
        )
    )
    pkt[24:40] = R_ADDR.packed  # as FORWARD_SID's End leaves it
    pkt[43] = 0
    return bytes(pkt)


def _recording() -> list[tuple[str, bytes]]:
    padding = tlv.ExtraPadding(bytes(range(24))).to_tlv().encode()
    back = tlv.ReturnPath((tlv.Srv6SegmentList((RETURN_SID, G_ADDR)),)).to_tlv().encode()
    short = wire.SENDER_SHORT.pack(9, (3_900_000_000 << 32) | 9, EE.to_int())
    return [
        ("stateful plain", _ip(_probe(0, STATEFUL_SSID))),
        ("stateful padding tlv", _ip(_probe(1, STATEFUL_SSID, padding))),
        ("stateful srv6", _ip(_probe(2, STATEFUL_SSID), srv6=True)),
        ("default plain", _ip(_probe(3, DEFAULT_SSID))),
        ("default srv6", _ip(_probe(4, DEFAULT_SSID), srv6=True)),
        ("default short", _ip(short)),
        ("default return path tlv", _ip(_probe(5, DEFAULT_SSID, back))),
        ("default plain dscp", _ip(_probe(6, DEFAULT_SSID), tclass=PROBE_TCLASS)),
    ]


def _cos_recording() -> list[tuple[str, bytes]]:
    cos = tlv.ClassOfService(dscp1=10, ecn1=2).to_tlv().encode()
    return [
        ("stateful cos", _ip(_probe(0, STATEFUL_SSID, cos), tclass=PROBE_TCLASS)),
        ("default cos srv6", _ip(_probe(1, DEFAULT_SSID, cos), srv6=True, tclass=PROBE_TCLASS)),
        ("default cos dscp 0", _ip(_probe(2, DEFAULT_SSID, cos))),
    ]


def _replies(
    p: Pair, plane_name: str, frames: list[tuple[str, bytes]]
) -> tuple[list[bytes], dict[str, int]]:
    """Each recorded frame sent to a fresh reflector on ``plane_name``; the replies and
    the plane's counters."""
    with entered(p.r.ns):
        plane = create(plane_name, DataplaneConfig(PORT, interface="r0"))
        plane.open()
    engine = ReflectorEngine(plane, Reflector())
    engine.add_session(
        ReflectorSessionConfig(
            ssid=STATEFUL_SSID,
            mode=ReflectorMode.STATEFUL,
            return_segments=(RETURN_SID, G_ADDR),
        )
    )
    engine.set_default(ReflectorSessionConfig(ssid=None))
    # A UDP socket on the sender port keeps G from answering replies with unreachables.
    sink = p.g.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sink.bind((str(G_ADDR), SENDER_PORT))
    header = _frame_header(p)
    engine.start()
    out: list[bytes] = []
    tx = Tap(p.g, "g0", protocol=ETH_P_IPV6)
    try:
        time.sleep(0.1)  # the planes' capture sockets are bound; let them settle
        for name, ip in frames:
            tx.send(header + ip)
            replies = tx.wait(
                lambda f: not f.outgoing and _dst_port(f.data[14:]) == SENDER_PORT, timeout=3
            )
            assert replies, (plane_name, name)
            out.append(replies[0].data[14:])
    finally:
        engine.shutdown()
        counters = plane.counters()  # the engine's thread counts after it sends
        with entered(p.r.ns):  # the capture planes remove their nftables table: nft(8)
            plane.close()
        gc.collect()
        tx.close()
        sink.close()
    assert engine.error is None
    return out, counters


def _dst_port(ip: bytes) -> int | None:
    try:
        return parse_udp_packet(ip).dst_port
    except ValueError:
        return None


def _masked(ip: bytes) -> bytes:
    """``ip`` with the UDP checksum, T3 and T2 zeroed (RFC 8762 §4.3 offsets)."""
    rx = parse_udp_packet(ip, verify_checksum=True)
    b = bytearray(ip)
    at = len(ip) - len(rx.payload)
    b[at - 2 : at] = bytes(2)
    b[at + 4 : at + 12] = bytes(8)
    b[at + 16 : at + 24] = bytes(8)
    return bytes(b)


def test_planes_give_byte_identical_replies_but_timestamps(pair: Pair) -> None:
    frames = _recording()
    got: dict[str, list[bytes]] = {}
    for name in PLANES:
        got[name], counters = _replies(pair, name, frames)
        if name == "xdp":
            assert counters == {"reflected": 6, "pass-short": 1, "pass-tlv": 1}
        if name == "afxdp":  # everything but the short packet and the TLV took the batch path
            assert counters["fast_replies"] == 6, counters
    reference = got["scapy"]
    for name in PLANES[1:]:
        for (kind, _), want, have in zip(frames, reference, got[name], strict=True):
            assert _masked(have).hex() == _masked(want).hex(), (name, kind)
    # And the reference itself is what RFC 8762 asks for: a few spot checks.
    for (kind, _), ip in zip(frames, reference, strict=True):
        rx = parse_udp_packet(ip)
        assert rx.source == R_ADDR, kind
        reply = wire.decode_reflector(bytes(rx.payload[: wire.UNAUTH_PACKET_SIZE]))
        if kind.startswith("stateful"):
            assert rx.srh is not None
            assert rx.srh.travel_order == (RETURN_SID, G_ADDR), kind
            assert reply.ssid == STATEFUL_SSID
        elif kind == "default return path tlv":
            assert rx.srh is not None
            assert rx.srh.travel_order == (RETURN_SID, G_ADDR), kind
        else:
            assert rx.srh is None, kind
        assert rx.traffic_class == 0, kind  # no Class of Service TLV: the default
    stateful = [wire.decode_reflector(bytes(parse_udp_packet(ip).payload[:44])) for ip in reference]
    assert [r.seq for r in stateful[:3]] == [0, 1, 2]  # the reflector's own count


def test_class_of_service_where_the_plane_sets_the_traffic_class(pair: Pair) -> None:
    frames = _cos_recording()
    got = {name: _replies(pair, name, frames)[0] for name in TCLASS_PLANES}
    reference = got["socket"]
    for name in TCLASS_PLANES[1:]:
        for (kind, _), want, have in zip(frames, reference, got[name], strict=True):
            assert _masked(have).hex() == _masked(want).hex(), (name, kind)
    for (kind, ip), reply in zip(frames, reference, strict=True):
        sent, rx = parse_udp_packet(ip), parse_udp_packet(reply)
        assert rx.traffic_class == 10 << 2, kind  # DSCP1, ECN 0 (RFC 8972 §4.4)
        (cos,) = tlv.decode_tlvs(bytes(rx.payload[wire.UNAUTH_PACKET_SIZE :]))
        value = tlv.ClassOfService.from_tlv(cos)
        assert (value.dscp2, value.ecn2) == (sent.traffic_class >> 2, sent.traffic_class & 3)
        assert value.rp == 0, kind
