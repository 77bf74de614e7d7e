"""UDP over IPv6: header codec and checksum with the pseudo-header (RFC 768, RFC 8200 §8.1)."""

from __future__ import annotations

from ipaddress import IPv6Address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.wire import InvalidFieldError, TruncatedError
from sixlab.wire.checksum import internet_checksum, ipv6_pseudo_header
from sixlab.wire.udp import (
    MAX_UDP_PAYLOAD,
    UDP_HEADER_SIZE,
    UdpHeader,
    encode_udp,
    udp_checksum,
    verify_udp,
)

SETTINGS = settings(max_examples=200, deadline=None)

SRC = IPv6Address("2001:db8::1")
DST = IPv6Address("2001:db8::a")
ports = st.integers(0, 0xFFFF)
addresses = st.binary(min_size=16, max_size=16)


def test_header_known_vector() -> None:
    header = UdpHeader(1, 862, 13, 0x5D26)
    assert header.encode() == bytes.fromhex("0001035e000d5d26")
    assert UdpHeader.decode(bytes.fromhex("0001035e000d5d26") + b"hello") == header


@SETTINGS
@given(st.builds(UdpHeader, ports, ports, ports, ports))
def test_header_round_trip(header: UdpHeader) -> None:
    assert UdpHeader.decode(header.encode()) == header


@pytest.mark.parametrize("size", range(UDP_HEADER_SIZE))
def test_header_truncated(size: int) -> None:
    with pytest.raises(TruncatedError):
        UdpHeader.decode(bytes(size))


@pytest.mark.parametrize("fields", [(-1, 0, 8, 0), (0, 0x10000, 8, 0), (0, 0, 8, 0x10000)])
def test_header_out_of_range(fields: tuple[int, int, int, int]) -> None:
    with pytest.raises(InvalidFieldError):
        UdpHeader(*fields)


def test_encode_udp_known_answer() -> None:
    # The checksum worked by hand: pseudo-header (src, dst, length 13, next header 17)
    # + header with a zero checksum + "hello", complemented.
    segment = encode_udp(1, 862, b"hello", SRC, DST)
    expected_sum_input = (
        ipv6_pseudo_header(SRC.packed, DST.packed, 13, 17) + bytes.fromhex("0001035e000d0000")
    ) + b"hello"
    assert segment[:6] == bytes.fromhex("0001035e000d")
    assert int.from_bytes(segment[6:8], "big") == internet_checksum(expected_sum_input)
    assert segment[8:] == b"hello"


@SETTINGS
@given(ports, ports, st.binary(max_size=300), addresses, addresses)
def test_encoded_datagrams_verify(
    sport: int, dport: int, payload: bytes, src: bytes, dst: bytes
) -> None:
    segment = encode_udp(sport, dport, payload, src, dst)
    header = UdpHeader.decode(segment)
    assert (header.src_port, header.dst_port, header.length) == (sport, dport, len(segment))
    assert header.checksum != 0  # never "no checksum" over IPv6
    assert segment[UDP_HEADER_SIZE:] == payload
    assert verify_udp(src, dst, segment)
    assert udp_checksum(src, dst, segment) == header.checksum


@SETTINGS
@given(st.binary(min_size=1, max_size=100), st.data())
def test_any_single_bit_flip_fails_verification(payload: bytes, data: st.DataObject) -> None:
    segment = bytearray(encode_udp(1000, 862, payload, SRC, DST))
    bit = data.draw(st.integers(0, 8 * len(segment) - 1))
    segment[bit // 8] ^= 1 << (bit % 8)
    # One flipped bit moves the sum by ±2^k (mod 0xFFFF), never by a multiple of 0xFFFF,
    # so every single-bit error is caught.
    assert not verify_udp(SRC.packed, DST.packed, segment)


def test_checksum_field_is_ignored_when_computing() -> None:
    segment = bytearray(encode_udp(1, 2, b"abc", SRC, DST))
    expected = udp_checksum(SRC.packed, DST.packed, segment)
    segment[6:8] = b"\x12\x34"
    assert udp_checksum(SRC.packed, DST.packed, segment) == expected


def test_zero_checksum_is_sent_as_ffff_and_refused_on_receipt() -> None:
    # Pick the last payload word so that the datagram's sum is 0xFFFF: computed checksum 0.
    base = encode_udp(1, 2, b"\x00\x00", SRC, DST)
    current_sum = ~int.from_bytes(base[6:8], "big") & 0xFFFF
    word = (0xFFFF - current_sum) % 0xFFFF
    segment = encode_udp(1, 2, word.to_bytes(2, "big"), SRC, DST)
    assert segment[6:8] == b"\xff\xff"
    assert verify_udp(SRC.packed, DST.packed, segment)
    zeroed = segment[:6] + b"\x00\x00" + segment[8:]
    assert not verify_udp(SRC.packed, DST.packed, zeroed)


def test_the_pseudo_header_destination_matters() -> None:
    # With an SRH the sender must sum over the final destination (RFC 8200 §8.1).
    first_segment = IPv6Address("2001:db8::c")
    segment = encode_udp(1, 862, b"hello", SRC, DST)
    assert verify_udp(SRC.packed, DST.packed, segment)
    assert not verify_udp(SRC.packed, first_segment.packed, segment)


def test_short_segment() -> None:
    assert not verify_udp(SRC.packed, DST.packed, bytes(7))
    with pytest.raises(TruncatedError):
        udp_checksum(SRC.packed, DST.packed, bytes(7))


def test_payload_too_large() -> None:
    encode_udp(1, 2, bytes(MAX_UDP_PAYLOAD), SRC, DST)
    with pytest.raises(InvalidFieldError):
        encode_udp(1, 2, bytes(MAX_UDP_PAYLOAD + 1), SRC, DST)


def test_addresses_typed_or_packed_give_the_same_datagram() -> None:
    assert encode_udp(5, 6, b"x", SRC, DST) == encode_udp(5, 6, b"x", SRC.packed, DST.packed)
