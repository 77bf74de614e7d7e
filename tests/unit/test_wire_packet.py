"""Whole IPv6[/SRH]/UDP packets: building, and the per-packet parser's header walk."""

from __future__ import annotations

from ipaddress import IPv6Address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.wire import InvalidFieldError, TruncatedError
from sixlab.wire.checksum import checksum_adjust
from sixlab.wire.ipv6 import IPV6_HEADER_SIZE, IPv6Header, NextHeader
from sixlab.wire.packet import (
    MAX_EXTENSION_HEADERS,
    ParsedUdpPacket,
    build_udp_packet,
    parse_udp_packet,
)
from sixlab.wire.srh import SegmentRoutingHeader
from sixlab.wire.udp import UdpHeader, encode_udp, verify_udp

SETTINGS = settings(max_examples=200, deadline=None)

SRC = IPv6Address("2001:db8::1")
DST = IPv6Address("2001:db8::a")
HOP1 = IPv6Address("2001:db8::c")
HOP2 = IPv6Address("2001:db8::b")
PATH = [HOP1, HOP2, DST]  # travel order, ends with the final destination
addresses = st.binary(min_size=16, max_size=16).map(IPv6Address)
ports = st.integers(0, 0xFFFF)

# 8-octet option headers (Hop-by-Hop 0 / Destination Options 60): Next Header placeholder,
# Hdr Ext Len 0, one PadN option of 4 zero bytes (RFC 8200 §4.2).
OPTIONS_8 = bytes.fromhex("0000010400000000")


def raw_packet(
    headers: list[tuple[int, bytes]],
    upper: bytes,
    *,
    upper_nh: int = NextHeader.UDP,
    dst: IPv6Address = DST,
    payload_length: int | None = None,
) -> bytes:
    """IPv6 + the given extension headers (next header bytes filled in) + ``upper``."""
    types = [t for t, _ in headers] + [upper_nh]
    chain = b"".join(bytes([types[i + 1]]) + body[1:] for i, (_, body) in enumerate(headers))
    plen = len(chain) + len(upper) if payload_length is None else payload_length
    header = IPv6Header(0, 0, plen, types[0], 64, SRC, dst)
    return header.encode() + chain + upper


def udp_to(dst: IPv6Address, payload: bytes = b"stamp") -> bytes:
    return encode_udp(50000, 862, payload, SRC, dst)


def test_plain_packet_layout() -> None:
    data = build_udp_packet(SRC, DST, 50000, 862, b"stamp", hop_limit=7)
    assert data == IPv6Header(0, 0, 13, 17, 7, SRC, DST).encode() + udp_to(DST)
    parsed = parse_udp_packet(data, verify_checksum=True)
    assert parsed.srh is None
    assert parsed.srh_offset is None
    assert parsed.src == SRC.packed
    assert parsed.dst == parsed.final_dst == DST.packed
    assert (parsed.src_port, parsed.dst_port, parsed.payload) == (50000, 862, b"stamp")
    assert (parsed.udp_offset, parsed.payload_offset) == (40, 48)
    assert parsed.hop_limit == 7


def test_srv6_packet_layout() -> None:
    data = build_udp_packet(SRC, DST, 50000, 862, b"stamp", segments=PATH)
    srh = SegmentRoutingHeader.from_path(PATH, NextHeader.UDP)
    # IPv6 goes to the first segment; the UDP checksum is over the final destination.
    ipv6 = IPv6Header(0, 0, srh.size + 13, NextHeader.ROUTING, 64, SRC, HOP1)
    assert data == ipv6.encode() + srh.encode() + udp_to(DST)

    parsed = parse_udp_packet(data, verify_checksum=True)
    assert parsed.dst == HOP1.packed
    assert parsed.destination == HOP1
    assert parsed.final_dst == DST.packed
    assert parsed.final_destination == DST
    assert parsed.srh == srh
    assert parsed.srh_offset == IPV6_HEADER_SIZE
    assert parsed.ipv6 == IPv6Header.decode(data)
    assert parsed.udp_offset == 40 + srh.size
    assert data[parsed.udp_offset : parsed.payload_offset] == parsed.udp.encode()
    assert data[parsed.payload_offset :] == parsed.payload == b"stamp"


def test_srh_at_its_final_destination() -> None:
    # After the last SRv6 endpoint: Segments Left 0, DA = final destination. The receiver
    # sums over the Destination Address (RFC 8200 §8.1), which now holds it.
    srh = SegmentRoutingHeader(17, 0, 2, 0, 0, (DST, HOP2, HOP1))
    data = raw_packet([(NextHeader.ROUTING, srh.encode())], udp_to(DST))
    parsed = parse_udp_packet(data, verify_checksum=True)
    assert parsed.dst == parsed.final_dst == DST.packed
    assert parsed.srh == srh


def test_single_segment_path() -> None:
    data = build_udp_packet(SRC, DST, 1, 2, b"", segments=[DST])
    parsed = parse_udp_packet(data, verify_checksum=True)
    srh = parsed.srh
    assert srh is not None
    assert (srh.segments_left, srh.segments) == (0, (DST,))
    assert parsed.dst == parsed.final_dst == DST.packed


@pytest.mark.parametrize("segments", [[], [HOP1, HOP2], [DST, HOP1]])
def test_path_must_end_with_the_final_destination(segments: list[IPv6Address]) -> None:
    with pytest.raises(InvalidFieldError, match="final destination"):
        build_udp_packet(SRC, DST, 1, 2, b"", segments=segments)


@st.composite
def packets(draw: st.DrawFn) -> tuple[bytes, dict[str, object]]:
    dst = draw(addresses)
    path = None
    if draw(st.booleans()):
        path = [*draw(st.lists(addresses, max_size=5)), dst]
    args: dict[str, object] = {
        "src": draw(addresses),
        "dst": dst,
        "sport": draw(ports),
        "dport": draw(ports),
        "payload": draw(st.binary(max_size=200)),
        "hop_limit": draw(st.integers(0, 255)),
        "segments": path,
        "traffic_class": draw(st.integers(0, 255)),
        "flow_label": draw(st.integers(0, 0xF_FFFF)),
    }
    return build_udp_packet(**args), args  # type: ignore[arg-type]


@SETTINGS
@given(packets())
def test_build_parse_round_trip(case: tuple[bytes, dict[str, object]]) -> None:
    data, args = case
    parsed = parse_udp_packet(data, verify_checksum=True)
    assert parsed.source == args["src"]
    assert parsed.final_destination == args["dst"]
    assert (parsed.src_port, parsed.dst_port) == (args["sport"], args["dport"])
    assert parsed.payload == args["payload"]
    assert parsed.hop_limit == args["hop_limit"]
    assert parsed.traffic_class == args["traffic_class"]
    assert parsed.flow_label == args["flow_label"]
    path = args["segments"]
    if path is None:
        assert parsed.srh is None
        assert parsed.destination == args["dst"]
    else:
        assert isinstance(path, list)
        srh = parsed.srh
        assert srh is not None
        assert list(srh.travel_order) == path
        assert parsed.destination == path[0]
    assert parsed.ipv6 == IPv6Header.decode(data)
    assert data[parsed.payload_offset :] == parsed.payload
    # The same packet from any bytes-like buffer, and with a link-layer pad after it.
    assert parse_udp_packet(memoryview(data)) == parsed
    assert parse_udp_packet(bytearray(data) + bytes(6)) == parsed


def test_hop_by_hop_and_destination_options_are_skipped() -> None:
    srh = SegmentRoutingHeader.from_path(PATH, NextHeader.UDP)
    data = raw_packet(
        [
            (NextHeader.HOP_BY_HOP, OPTIONS_8),
            (NextHeader.DEST_OPTS, OPTIONS_8),
            (NextHeader.ROUTING, srh.encode()),
            (NextHeader.DEST_OPTS, OPTIONS_8),
        ],
        udp_to(DST),
        dst=HOP1,
    )
    parsed = parse_udp_packet(data, verify_checksum=True)
    assert parsed.srh_offset == 56
    assert parsed.udp_offset == 56 + srh.size + 8
    assert parsed.final_dst == DST.packed
    assert parsed.payload == b"stamp"


def test_longer_options_header_is_skipped_by_its_length() -> None:
    # Hdr Ext Len 1: 16 octets (RFC 8200 §4.3, units of 8 after the first 8).
    options_16 = bytes([0, 1, 1, 12]) + bytes(12)  # one PadN option of 12 zero bytes
    data = raw_packet([(NextHeader.DEST_OPTS, options_16)], udp_to(DST))
    assert parse_udp_packet(data, verify_checksum=True).udp_offset == 56


def test_hop_by_hop_only_first() -> None:
    data = raw_packet(
        [(NextHeader.DEST_OPTS, OPTIONS_8), (NextHeader.HOP_BY_HOP, OPTIONS_8)], udp_to(DST)
    )
    with pytest.raises(InvalidFieldError, match="Hop-by-Hop"):
        parse_udp_packet(data)


@pytest.mark.parametrize(
    "nh",
    [
        NextHeader.FRAGMENT,
        NextHeader.ESP,
        NextHeader.AH,
        NextHeader.NO_NEXT,
        NextHeader.TCP,
        NextHeader.ICMPV6,
        NextHeader.IPV6,
        200,
    ],
)
def test_headers_not_walked_are_refused(nh: int) -> None:
    data = raw_packet([], udp_to(DST), upper_nh=nh)
    with pytest.raises(InvalidFieldError, match="not UDP"):
        parse_udp_packet(data)
    # Also when reached after an extension header.
    data = raw_packet([(NextHeader.DEST_OPTS, OPTIONS_8)], udp_to(DST), upper_nh=nh)
    with pytest.raises(InvalidFieldError, match="not UDP"):
        parse_udp_packet(data)


def test_extension_header_limit() -> None:
    at_limit = [(int(NextHeader.DEST_OPTS), OPTIONS_8)] * MAX_EXTENSION_HEADERS
    parsed = parse_udp_packet(raw_packet(at_limit, udp_to(DST)))
    assert parsed.udp_offset == 40 + 8 * MAX_EXTENSION_HEADERS
    over = [*at_limit, (int(NextHeader.DEST_OPTS), OPTIONS_8)]
    with pytest.raises(InvalidFieldError, match="extension headers"):
        parse_udp_packet(raw_packet(over, udp_to(DST)))


def test_other_routing_types() -> None:
    # RFC 8200 §4.4: an unrecognised Routing Type with Segments Left 0 is ignored.
    other = bytes([0, 0, 253, 0, 0, 0, 0, 0])
    parsed = parse_udp_packet(raw_packet([(NextHeader.ROUTING, other)], udp_to(DST)))
    assert parsed.srh is None
    assert parsed.final_dst == DST.packed
    moving = bytes([0, 0, 253, 1, 0, 0, 0, 0])
    with pytest.raises(InvalidFieldError, match="Routing Type"):
        parse_udp_packet(raw_packet([(NextHeader.ROUTING, moving)], udp_to(DST)))


def test_second_routing_header_is_refused() -> None:
    srh = SegmentRoutingHeader.from_path([DST], NextHeader.UDP).encode()
    data = raw_packet([(NextHeader.ROUTING, srh), (NextHeader.ROUTING, srh)], udp_to(DST))
    with pytest.raises(InvalidFieldError, match="Routing"):
        parse_udp_packet(data)


def test_malformed_srh_is_refused() -> None:
    srh = bytearray(SegmentRoutingHeader.from_path(PATH, NextHeader.UDP).encode())
    srh[3] = 5  # Segments Left > Last Entry
    data = raw_packet([(NextHeader.ROUTING, bytes(srh))], udp_to(DST))
    with pytest.raises(InvalidFieldError, match="Segments Left"):
        parse_udp_packet(data)


def test_payload_length_beyond_the_buffer_is_truncated() -> None:
    data = build_udp_packet(SRC, DST, 1, 2, b"abcd")
    with pytest.raises(TruncatedError):
        parse_udp_packet(data[:-1])
    long_claim = raw_packet([], udp_to(DST), payload_length=len(udp_to(DST)) + 1)
    with pytest.raises(TruncatedError):
        parse_udp_packet(long_claim)


def test_headers_must_fit_in_payload_length() -> None:
    # Payload Length says 4 but the buffer has more: the rest is padding, and an
    # extension header does not fit in 4 octets.
    data = raw_packet([(NextHeader.DEST_OPTS, OPTIONS_8)], udp_to(DST), payload_length=4)
    with pytest.raises(TruncatedError):
        parse_udp_packet(data)
    data = raw_packet([], udp_to(DST), payload_length=7)
    with pytest.raises(TruncatedError, match="UDP header"):
        parse_udp_packet(data)


def test_udp_length_rules() -> None:
    segment = bytearray(udp_to(DST, b"abcdef"))
    segment[4:6] = (7).to_bytes(2, "big")
    with pytest.raises(InvalidFieldError, match="UDP Length"):
        parse_udp_packet(raw_packet([], bytes(segment)))
    segment[4:6] = (len(segment) + 1).to_bytes(2, "big")
    with pytest.raises(TruncatedError, match="UDP Length"):
        parse_udp_packet(raw_packet([], bytes(segment)))
    # A shorter UDP Length trims the datagram (the kernel does the same).
    segment[4:6] = (10).to_bytes(2, "big")
    parsed = parse_udp_packet(raw_packet([], bytes(segment)))
    assert parsed.payload == b"ab"
    assert parsed.udp.length == 10


def test_version_and_size_checks() -> None:
    data = build_udp_packet(SRC, DST, 1, 2, b"")
    with pytest.raises(InvalidFieldError, match="version"):
        parse_udp_packet(b"\x40" + data[1:])
    with pytest.raises(TruncatedError):
        parse_udp_packet(data[:39])


def test_checksum_verification_is_optional() -> None:
    data = bytearray(build_udp_packet(SRC, DST, 1, 2, b"abcd", segments=PATH))
    data[-1] ^= 0xFF
    assert parse_udp_packet(data).payload == b"abc\x9b"
    with pytest.raises(InvalidFieldError, match="checksum"):
        parse_udp_packet(data, verify_checksum=True)


def test_fast_path_patch_with_incremental_checksum() -> None:
    # A reflector's fast path: patch a 64-bit timestamp into a pre-built reply at payload
    # offset 4 (STAMP Timestamp, RFC 8762 §4.3) and fix the checksum per RFC 1624.
    template = bytearray(build_udp_packet(SRC, DST, 862, 50000, bytes(44), segments=PATH))
    parsed = parse_udp_packet(template)
    start = parsed.payload_offset + 4
    assert (start - parsed.udp_offset) % 2 == 0  # the span sits on a 16-bit boundary
    for value in (0x0123_4567_89AB_CDEF, 0, 0xFFFF_FFFF_FFFF_FFFF):
        new = value.to_bytes(8, "big")
        old = bytes(template[start : start + 8])
        checksum_at = parsed.udp_offset + 6
        field = int.from_bytes(template[checksum_at : checksum_at + 2], "big")
        template[start : start + 8] = new
        fixed = checksum_adjust(field, old, new, udp=True)
        template[checksum_at : checksum_at + 2] = fixed.to_bytes(2, "big")
        reparsed = parse_udp_packet(template, verify_checksum=True)
        assert reparsed.payload[4:12] == new
        assert verify_udp(SRC.packed, DST.packed, template[parsed.udp_offset :])


def test_parsed_result_is_a_frozen_value() -> None:
    parsed = parse_udp_packet(build_udp_packet(SRC, DST, 1, 2, b""))
    assert isinstance(parsed, ParsedUdpPacket)
    assert parsed.udp == UdpHeader(1, 2, 8, parsed.udp.checksum)
    with pytest.raises(AttributeError):
        parsed.hop_limit = 1  # type: ignore[misc]


def test_oversized_payload_is_refused() -> None:
    with pytest.raises(InvalidFieldError):
        build_udp_packet(SRC, DST, 1, 2, bytes(0xFFFF - 8), segments=PATH)
