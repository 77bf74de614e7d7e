"""The IPv6 fixed header codec (RFC 8200 §3) and the raw-byte fast helpers."""

from __future__ import annotations

from ipaddress import IPv6Address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.wire import InvalidFieldError, TruncatedError, WireError
from sixlab.wire.ipv6 import (
    IPV6_HEADER_SIZE,
    IPv6Header,
    NextHeader,
    addresses_of,
    hop_limit_of,
    packed_address,
)

SETTINGS = settings(max_examples=200, deadline=None)

SRC = IPv6Address("2001:db8::1")
DST = IPv6Address("2001:db8::2")

# Version 6, Traffic Class 0xb8 (DSCP EF), Flow Label 0x12345: 0x6 b8 12345.
VECTOR = bytes.fromhex(
    "6b812345"  # version | traffic class | flow label
    "0014"  # payload length 20
    "11"  # next header UDP
    "40"  # hop limit 64
    "20010db8000000000000000000000001"
    "20010db8000000000000000000000002"
)
VECTOR_HEADER = IPv6Header(0xB8, 0x12345, 20, NextHeader.UDP, 64, SRC, DST)

addresses = st.binary(min_size=16, max_size=16).map(IPv6Address)
headers = st.builds(
    IPv6Header,
    traffic_class=st.integers(0, 0xFF),
    flow_label=st.integers(0, 0xF_FFFF),
    payload_length=st.integers(0, 0xFFFF),
    next_header=st.integers(0, 0xFF),
    hop_limit=st.integers(0, 0xFF),
    src=addresses,
    dst=addresses,
)


def test_known_vector_encodes() -> None:
    assert VECTOR_HEADER.encode() == VECTOR
    assert len(VECTOR) == IPV6_HEADER_SIZE


def test_known_vector_decodes() -> None:
    assert IPv6Header.decode(VECTOR) == VECTOR_HEADER


def test_decode_reads_only_the_fixed_header() -> None:
    assert IPv6Header.decode(VECTOR + b"payload") == VECTOR_HEADER
    assert IPv6Header.decode(memoryview(VECTOR)) == VECTOR_HEADER


@SETTINGS
@given(headers)
def test_round_trip(header: IPv6Header) -> None:
    data = header.encode()
    assert len(data) == IPV6_HEADER_SIZE
    assert IPv6Header.decode(data) == header


@SETTINGS
@given(headers)
def test_fast_helpers_agree_with_decode(header: IPv6Header) -> None:
    data = header.encode()
    assert hop_limit_of(data) == header.hop_limit
    assert addresses_of(data) == (header.src.packed, header.dst.packed)
    assert addresses_of(bytearray(data)) == (header.src.packed, header.dst.packed)


@pytest.mark.parametrize("version", [0, 4, 5, 7, 15])
def test_version_must_be_6(version: int) -> None:
    data = bytes([(version << 4) | (VECTOR[0] & 0x0F)]) + VECTOR[1:]
    with pytest.raises(InvalidFieldError, match="version"):
        IPv6Header.decode(data)
    with pytest.raises(InvalidFieldError):
        hop_limit_of(data)
    with pytest.raises(InvalidFieldError):
        addresses_of(data)


@pytest.mark.parametrize("size", range(IPV6_HEADER_SIZE))
def test_every_short_buffer_is_truncated(size: int) -> None:
    with pytest.raises(TruncatedError):
        IPv6Header.decode(VECTOR[:size])
    with pytest.raises(TruncatedError):
        hop_limit_of(VECTOR[:size])
    with pytest.raises(TruncatedError):
        addresses_of(VECTOR[:size])


@pytest.mark.parametrize(
    "field",
    [
        {"traffic_class": 0x100},
        {"flow_label": 0x10_0000},
        {"payload_length": 0x1_0000},
        {"next_header": 256},
        {"hop_limit": 256},
        {"hop_limit": -1},
    ],
)
def test_out_of_range_fields_are_refused(field: dict[str, int]) -> None:
    values: dict[str, int] = {
        "traffic_class": 0,
        "flow_label": 0,
        "payload_length": 0,
        "next_header": 17,
        "hop_limit": 64,
    }
    values.update(field)
    with pytest.raises(InvalidFieldError):
        IPv6Header(src=SRC, dst=DST, **values)


def test_next_header_numbers() -> None:
    # IANA "Assigned Internet Protocol Numbers".
    expected = {
        "HOP_BY_HOP": 0,
        "TCP": 6,
        "UDP": 17,
        "IPV6": 41,
        "ROUTING": 43,
        "FRAGMENT": 44,
        "ESP": 50,
        "AH": 51,
        "ICMPV6": 58,
        "NO_NEXT": 59,
        "DEST_OPTS": 60,
    }
    assert {member.name: member.value for member in NextHeader} == expected


def test_packed_address() -> None:
    assert packed_address(SRC) == SRC.packed
    assert packed_address(SRC.packed) == SRC.packed
    with pytest.raises(WireError):
        packed_address(b"\x00" * 4)
