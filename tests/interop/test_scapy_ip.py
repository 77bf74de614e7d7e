"""Cross-check the IPv6/SRH/UDP codecs against scapy, an independent implementation.

scapy's ``IPv6ExtHdrSegmentRouting(addresses=[...])`` lists segments in WIRE order
(``addresses[0]`` is the final destination), its Segments Left defaults to n − 1, and it
does not set the IPv6 Destination Address from the SRH: tests set ``dst`` to the first
segment themselves. Its UDP checksum (``in6_chksum``) uses ``addresses[0]`` as the
pseudo-header destination while Segments Left > 0, and the IPv6 Destination Address once
it is 0, as RFC 8200 §8.1 asks.
"""

from __future__ import annotations

from ipaddress import IPv6Address
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import UDP
from scapy.layers.inet6 import (
    IPv6,
    IPv6ExtHdrDestOpt,
    IPv6ExtHdrHopByHop,
    IPv6ExtHdrSegmentRouting,
    IPv6ExtHdrSegmentRoutingTLVPadN,
)
from scapy.packet import Raw

from sixlab.wire.ipv6 import IPv6Header, NextHeader
from sixlab.wire.packet import build_udp_packet, parse_udp_packet
from sixlab.wire.srh import SegmentRoutingHeader
from sixlab.wire.udp import encode_udp

pytestmark = pytest.mark.interop

SRC = IPv6Address("2001:db8::1")
DST = IPv6Address("2001:db8::a")
PATH = [IPv6Address("2001:db8::c"), IPv6Address("2001:db8::b"), DST]  # travel order
addresses = st.binary(min_size=16, max_size=16).map(IPv6Address)
ports = st.integers(0, 0xFFFF)


def scapy_packet(
    src: IPv6Address,
    dst: IPv6Address,
    sport: int,
    dport: int,
    payload: bytes,
    *,
    path: list[IPv6Address] | None = None,
    hop_limit: int = 64,
    traffic_class: int = 0,
    flow_label: int = 0,
) -> bytes:
    """The same packet built by scapy: its SRH wants wire order, so reverse the path."""
    ip = IPv6(
        src=str(src),
        dst=str(path[0] if path else dst),
        hlim=hop_limit,
        tc=traffic_class,
        fl=flow_label,
    )
    udp = UDP(sport=sport, dport=dport) / Raw(payload)
    if path is None:
        packet: Any = ip / udp
    else:
        wire_order = [str(a) for a in reversed(path)]
        packet = ip / IPv6ExtHdrSegmentRouting(addresses=wire_order) / udp
    return bytes(packet)


def test_plain_packet_matches_scapy() -> None:
    ours = build_udp_packet(SRC, DST, 50000, 862, b"stamp" * 9)
    assert ours == scapy_packet(SRC, DST, 50000, 862, b"stamp" * 9)


def test_srv6_packet_matches_scapy_both_ways() -> None:
    ours = build_udp_packet(SRC, DST, 50000, 862, b"stamp", segments=PATH)
    theirs = scapy_packet(SRC, DST, 50000, 862, b"stamp", path=PATH)
    assert ours == theirs

    parsed = parse_udp_packet(theirs, verify_checksum=True)
    srh = parsed.srh
    assert srh is not None
    assert list(srh.travel_order) == PATH
    assert parsed.final_destination == DST

    decoded = IPv6(ours)
    assert (
        tuple(IPv6Address(a) for a in decoded[IPv6ExtHdrSegmentRouting].addresses) == srh.segments
    )
    assert decoded[IPv6ExtHdrSegmentRouting].segleft == srh.segments_left == 2
    assert decoded[IPv6ExtHdrSegmentRouting].lastentry == srh.last_entry == 2


def test_udp_checksum_with_srh_uses_the_final_destination_like_scapy() -> None:
    theirs = IPv6(scapy_packet(SRC, DST, 1, 862, b"hello", path=PATH))
    scapy_checksum = theirs[UDP].chksum
    ours = parse_udp_packet(build_udp_packet(SRC, DST, 1, 862, b"hello", segments=PATH))
    assert ours.udp.checksum == scapy_checksum
    # And it is not the checksum over the first segment the IPv6 header is sent to.
    over_first_hop = encode_udp(1, 862, b"hello", SRC, PATH[0])
    assert int.from_bytes(over_first_hop[6:8], "big") != scapy_checksum


def test_srh_at_final_destination_decodes_scapys_bytes() -> None:
    # Segments Left 0: scapy sums over the Destination Address, and so do we.
    packet = (
        IPv6(src=str(SRC), dst=str(DST))
        / IPv6ExtHdrSegmentRouting(addresses=[str(DST), str(PATH[1])], segleft=0)
        / UDP(sport=862, dport=50000)
        / Raw(b"reply")
    )
    parsed = parse_udp_packet(bytes(packet), verify_checksum=True)
    assert parsed.final_dst == DST.packed
    srh = parsed.srh
    assert srh is not None
    assert (srh.segments_left, srh.last_entry) == (0, 1)


def test_srh_tlvs_from_scapy_are_kept_raw() -> None:
    pad = IPv6ExtHdrSegmentRoutingTLVPadN(len=6, padding=b"\x00" * 6)
    srh_layer = IPv6ExtHdrSegmentRouting(addresses=[str(DST)], tlv_objects=[pad], tag=0x1234)
    packet = IPv6(src=str(SRC), dst=str(DST)) / srh_layer / UDP(sport=1, dport=2) / Raw(b"x")
    data = bytes(packet)
    parsed = parse_udp_packet(data, verify_checksum=True)
    srh = parsed.srh
    assert srh is not None
    assert srh.tlvs == bytes(pad)
    assert srh.tag == 0x1234
    assert srh.encode() == data[40 : 40 + srh.size]
    assert srh == SegmentRoutingHeader.decode(data[40:])


def test_extension_headers_from_scapy_are_walked() -> None:
    packet = (
        IPv6(src=str(SRC), dst=str(DST))
        / IPv6ExtHdrHopByHop()
        / IPv6ExtHdrDestOpt()
        / UDP(sport=5, dport=6)
        / Raw(b"abc")
    )
    parsed = parse_udp_packet(bytes(packet), verify_checksum=True)
    assert (parsed.udp_offset, parsed.payload) == (56, b"abc")


def test_zero_checksum_becomes_ffff_like_scapy() -> None:
    # Choose a payload word that makes the computed checksum 0.
    base = encode_udp(1, 2, b"\x00\x00", SRC, DST)
    word = (0xFFFF - (~int.from_bytes(base[6:8], "big") & 0xFFFF)) % 0xFFFF
    payload = word.to_bytes(2, "big")
    ours = build_udp_packet(SRC, DST, 1, 2, payload)
    assert ours[46:48] == b"\xff\xff"
    assert ours == scapy_packet(SRC, DST, 1, 2, payload)


@settings(max_examples=100, deadline=None)
@given(
    src=addresses,
    dst=addresses,
    sport=ports,
    dport=ports,
    payload=st.binary(max_size=120),
    waypoints=st.none() | st.lists(addresses, max_size=4),
    hop_limit=st.integers(0, 255),
    traffic_class=st.integers(0, 255),
    flow_label=st.integers(0, 0xF_FFFF),
)
def test_random_packets_match_scapy_both_ways(
    src: IPv6Address,
    dst: IPv6Address,
    sport: int,
    dport: int,
    payload: bytes,
    waypoints: list[IPv6Address] | None,
    hop_limit: int,
    traffic_class: int,
    flow_label: int,
) -> None:
    path = None if waypoints is None else [*waypoints, dst]
    options = {"hop_limit": hop_limit, "traffic_class": traffic_class, "flow_label": flow_label}
    ours = build_udp_packet(src, dst, sport, dport, payload, segments=path, **options)
    theirs = scapy_packet(src, dst, sport, dport, payload, path=path, **options)
    assert ours == theirs
    parsed = parse_udp_packet(theirs, verify_checksum=True)
    assert parsed.ipv6 == IPv6Header.decode(ours)
    assert parsed.final_destination == dst
    assert parsed.payload == payload
    assert parsed.ipv6.next_header == (NextHeader.UDP if path is None else NextHeader.ROUTING)
