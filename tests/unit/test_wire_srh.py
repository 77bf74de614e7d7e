"""The Segment Routing Header codec (RFC 8754 §2) and its two segment orders."""

from __future__ import annotations

from ipaddress import IPv6Address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.wire import InvalidFieldError, TruncatedError
from sixlab.wire.ipv6 import NextHeader
from sixlab.wire.srh import MAX_SEGMENTS, SegmentRoutingHeader, validate_srh

SETTINGS = settings(max_examples=200, deadline=None)

A = IPv6Address("2001:db8::a")
B = IPv6Address("2001:db8::b")
C = IPv6Address("2001:db8::c")

# A packet travelling C, then B, then A (final destination), fresh from its source:
# wire order is A, B, C; Segments Left = Last Entry = 2; Hdr Ext Len = 2·3 = 6.
VECTOR = bytes.fromhex(
    "11"  # next header UDP
    "06"  # hdr ext len
    "04"  # routing type 4
    "02"  # segments left
    "02"  # last entry
    "00"  # flags
    "0000"  # tag
    "20010db800000000000000000000000a"  # Segment List[0] = final destination
    "20010db800000000000000000000000b"
    "20010db800000000000000000000000c"  # Segment List[2] = first segment
)

addresses = st.binary(min_size=16, max_size=16).map(IPv6Address)


@st.composite
def srhs(draw: st.DrawFn) -> SegmentRoutingHeader:
    segments = tuple(draw(st.lists(addresses, min_size=1, max_size=8)))
    last = len(segments) - 1
    tlv_units = draw(st.integers(0, 4))
    return SegmentRoutingHeader(
        next_header=draw(st.integers(0, 255)),
        segments_left=draw(st.integers(0, last)),
        last_entry=last,
        flags=draw(st.integers(0, 255)),
        tag=draw(st.integers(0, 0xFFFF)),
        segments=segments,
        tlvs=draw(st.binary(min_size=8 * tlv_units, max_size=8 * tlv_units)),
    )


def test_known_vector_from_travel_order() -> None:
    srh = SegmentRoutingHeader.from_path([C, B, A], NextHeader.UDP)
    assert srh.encode() == VECTOR
    assert srh.segments == (A, B, C)  # wire order: last segment first
    assert srh.segments_left == srh.last_entry == 2
    assert srh.size == len(VECTOR) == 56
    assert srh.hdr_ext_len == 6


def test_known_vector_decodes() -> None:
    srh = SegmentRoutingHeader.decode(VECTOR)
    assert srh == SegmentRoutingHeader(17, 2, 2, 0, 0, (A, B, C))
    assert validate_srh(VECTOR) == len(VECTOR)


def test_the_two_orders() -> None:
    path = [C, B, A]  # travel order: visit C first, end at A
    srh = SegmentRoutingHeader.from_path(path, NextHeader.UDP)
    assert srh.active_segment == C  # the first hop goes in the IPv6 Destination Address
    assert srh.final_destination == A
    assert list(srh.travel_order) == path
    # After two SRv6 endpoints the active segment is the final destination.
    arrived = SegmentRoutingHeader(17, 0, 2, 0, 0, srh.segments)
    assert arrived.active_segment == arrived.final_destination == A


def test_single_segment() -> None:
    srh = SegmentRoutingHeader.from_path([A], NextHeader.UDP)
    assert (srh.segments_left, srh.last_entry, srh.hdr_ext_len) == (0, 0, 2)
    assert SegmentRoutingHeader.decode(srh.encode()) == srh


def test_tlvs_are_kept_raw_and_counted_in_hdr_ext_len() -> None:
    pad_n = bytes.fromhex("0406000000000000")  # PadN TLV (RFC 8754 §2.1.1.2), 8 bytes
    srh = SegmentRoutingHeader.from_path([A], NextHeader.UDP, tlvs=pad_n, tag=0xBEEF, flags=1)
    data = srh.encode()
    assert data[1] == 3  # 2·1 + 8/8
    assert data[-8:] == pad_n
    assert SegmentRoutingHeader.decode(data) == srh


def test_decode_ignores_what_follows() -> None:
    assert SegmentRoutingHeader.decode(VECTOR + b"\x00\x01") == SegmentRoutingHeader.decode(VECTOR)


@SETTINGS
@given(srhs())
def test_round_trip(srh: SegmentRoutingHeader) -> None:
    data = srh.encode()
    assert len(data) == srh.size == 8 * (srh.hdr_ext_len + 1)
    assert SegmentRoutingHeader.decode(data) == srh
    assert SegmentRoutingHeader.decode(memoryview(data)) == srh
    assert validate_srh(b"\x00" * 3 + data, 3) == srh.size


@SETTINGS
@given(st.lists(addresses, min_size=1, max_size=10))
def test_from_path_reverses_into_wire_order(path: list[IPv6Address]) -> None:
    srh = SegmentRoutingHeader.from_path(path, NextHeader.UDP)
    assert srh.segments == tuple(reversed(path))
    assert srh.segments_left == len(path) - 1
    assert srh.active_segment == path[0]
    assert srh.final_destination == path[-1]


def _with(data: bytes, index: int, value: int) -> bytes:
    return data[:index] + bytes([value]) + data[index + 1 :]


def test_routing_type_must_be_4() -> None:
    with pytest.raises(InvalidFieldError, match="Routing Type"):
        SegmentRoutingHeader.decode(_with(VECTOR, 2, 0))


def test_segments_left_above_last_entry_is_refused() -> None:
    # RFC 8754 §4.3.1.1: Segments Left > Last Entry draws a Parameter Problem.
    with pytest.raises(InvalidFieldError, match="Segments Left"):
        SegmentRoutingHeader.decode(_with(VECTOR, 3, 3))


@pytest.mark.parametrize("ext_len", [0, 1, 5])
def test_segment_list_must_fit_hdr_ext_len(ext_len: int) -> None:
    # Last Entry 2 means three segments, six units of Hdr Ext Len.
    with pytest.raises(InvalidFieldError, match="Last Entry"):
        SegmentRoutingHeader.decode(_with(VECTOR, 1, ext_len))


def test_last_entry_beyond_the_header_is_refused() -> None:
    with pytest.raises(InvalidFieldError, match="Last Entry"):
        SegmentRoutingHeader.decode(_with(VECTOR, 4, 3))


def test_hdr_ext_len_larger_than_segments_means_tlvs() -> None:
    # Hdr Ext Len 7 with three segments leaves one 8-octet unit of TLVs.
    data = _with(VECTOR, 1, 7) + bytes(8)
    assert SegmentRoutingHeader.decode(data).tlvs == bytes(8)
    with pytest.raises(TruncatedError):
        SegmentRoutingHeader.decode(_with(VECTOR, 1, 7))


@pytest.mark.parametrize("size", range(len(VECTOR)))
def test_every_prefix_is_truncated(size: int) -> None:
    with pytest.raises(TruncatedError):
        SegmentRoutingHeader.decode(VECTOR[:size])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"last_entry": 1},  # three segments need Last Entry 2
        {"segments_left": 3},
        {"segments": ()},
        {"segments": (A,) * (MAX_SEGMENTS + 1), "last_entry": MAX_SEGMENTS},
        {"tlvs": bytes(4)},
        {"tlvs": bytes(8 * 250)},  # 2·3 + 250 units overflow Hdr Ext Len
        {"tag": 0x1_0000},
        {"flags": 256},
        {"next_header": -1},
    ],
)
def test_unrepresentable_values_are_refused(kwargs: dict[str, object]) -> None:
    fields: dict[str, object] = {
        "next_header": 17,
        "segments_left": 2,
        "last_entry": 2,
        "flags": 0,
        "tag": 0,
        "segments": (A, B, C),
        "tlvs": b"",
    }
    fields.update(kwargs)
    with pytest.raises(InvalidFieldError):
        SegmentRoutingHeader(**fields)  # type: ignore[arg-type]


def test_max_segments_encodes() -> None:
    path = [IPv6Address(i) for i in range(1, MAX_SEGMENTS + 1)]
    srh = SegmentRoutingHeader.from_path(path, NextHeader.UDP)
    assert srh.hdr_ext_len == 2 * MAX_SEGMENTS <= 0xFF
    assert SegmentRoutingHeader.decode(srh.encode()) == srh


def test_empty_path_is_refused() -> None:
    with pytest.raises(InvalidFieldError):
        SegmentRoutingHeader.from_path([], NextHeader.UDP)
