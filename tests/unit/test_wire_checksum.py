"""The Internet checksum, its RFC 1624 update and the IPv6 pseudo-header."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sixlab.wire import InvalidFieldError
from sixlab.wire.checksum import (
    PSEUDO_HEADER_SIZE,
    checksum_adjust,
    internet_checksum,
    ipv6_pseudo_header,
    ones_complement_sum,
    udp_field,
)

SETTINGS = settings(max_examples=200, deadline=None)


def reference_sum(data: bytes) -> int:
    """A word-by-word end-around-carry adder, the way RFC 1071 §4.1 writes it."""
    if len(data) % 2:
        data += b"\x00"
    total = 0
    for i in range(0, len(data), 2):
        total += (data[i] << 8) | data[i + 1]
        while total > 0xFFFF:
            total = (total & 0xFFFF) + (total >> 16)
    return total


def test_rfc1071_numerical_example() -> None:
    # RFC 1071 §3: the words 0001 f203 f4f5 f6f7 sum to ddf2 (one's complement).
    data = bytes.fromhex("0001f203f4f5f6f7")
    assert ones_complement_sum(data) == 0xDDF2
    assert internet_checksum(data) == 0x220D


def test_odd_length_is_padded_on_the_right() -> None:
    assert ones_complement_sum(b"\x01") == 0x0100
    assert ones_complement_sum(b"\x00\x01\xf2") == 0x0001 + 0xF200


def test_the_two_zeros() -> None:
    assert ones_complement_sum(b"") == 0
    assert ones_complement_sum(bytes(6)) == 0
    # A non-zero multiple of 0xFFFF is "-0", as an end-around-carry adder produces.
    assert ones_complement_sum(b"\xff\xff") == 0xFFFF
    assert ones_complement_sum(b"\x80\x00\x7f\xff") == 0xFFFF
    assert ones_complement_sum(b"\xff\xff\x00\x01") == 0x0001


@SETTINGS
@given(st.binary(max_size=300))
def test_sum_matches_a_word_by_word_adder(data: bytes) -> None:
    assert ones_complement_sum(data) == reference_sum(data)
    assert ones_complement_sum(bytearray(data)) == reference_sum(data)
    assert ones_complement_sum(memoryview(data)) == reference_sum(data)


@SETTINGS
@given(st.binary(max_size=300).filter(lambda d: len(d) % 2 == 0))
def test_data_plus_its_checksum_sums_to_ffff(data: bytes) -> None:
    checksum = internet_checksum(data)
    assert ones_complement_sum(data + checksum.to_bytes(2, "big")) == 0xFFFF


def test_pseudo_header_layout() -> None:
    src = bytes(range(16))
    dst = bytes(range(16, 32))
    header = ipv6_pseudo_header(src, dst, 0x01020304, 17)
    assert len(header) == PSEUDO_HEADER_SIZE
    assert header == src + dst + bytes.fromhex("01020304") + bytes(3) + b"\x11"


@pytest.mark.parametrize(
    ("src", "dst", "length", "nh"),
    [
        (bytes(15), bytes(16), 8, 17),
        (bytes(16), bytes(17), 8, 17),
        (bytes(16), bytes(16), -1, 17),
        (bytes(16), bytes(16), 1 << 32, 17),
        (bytes(16), bytes(16), 8, 256),
    ],
)
def test_pseudo_header_rejects_bad_arguments(src: bytes, dst: bytes, length: int, nh: int) -> None:
    with pytest.raises(InvalidFieldError):
        ipv6_pseudo_header(src, dst, length, nh)


@st.composite
def patched(draw: st.DrawFn) -> tuple[bytes, int, bytes]:
    """Even-length data, an even offset in it, and new bytes for an even-length span."""
    data = draw(st.binary(min_size=2, max_size=200).filter(lambda d: len(d) % 2 == 0))
    start = 2 * draw(st.integers(0, len(data) // 2 - 1))
    words = draw(st.integers(1, (len(data) - start) // 2))
    new = draw(st.binary(min_size=2 * words, max_size=2 * words))
    return data, start, new


@SETTINGS
@given(patched())
def test_rfc1624_update_equals_full_recomputation(case: tuple[bytes, int, bytes]) -> None:
    data, start, new = case
    old = data[start : start + len(new)]
    patched_data = data[:start] + new + data[start + len(new) :]
    # All-zero data sums to +0, which no incremental update can tell from -0; a transport
    # checksum never meets it (the pseudo-header's Next Header is non-zero).
    assume(any(patched_data))
    updated = checksum_adjust(internet_checksum(data), old, new)
    assert updated == internet_checksum(patched_data)


@SETTINGS
@given(patched())
def test_rfc1624_update_with_the_udp_zero_rule(case: tuple[bytes, int, bytes]) -> None:
    # A UDP checksum field holds udp_field(checksum): 0xFFFF stands for a computed 0.
    data, start, new = case
    old = data[start : start + len(new)]
    patched_data = data[:start] + new + data[start + len(new) :]
    field = udp_field(internet_checksum(data))
    assert checksum_adjust(field, old, new, udp=True) == udp_field(internet_checksum(patched_data))


def test_rfc1624_update_into_and_out_of_a_zero_checksum() -> None:
    # Data summing to 0xFFFF has checksum 0, sent by UDP as 0xFFFF.
    zero_sum = bytes.fromhex("1234") + (0xFFFF - 0x1234).to_bytes(2, "big")
    assert internet_checksum(zero_sum) == 0
    other = bytes.fromhex("1234") + bytes.fromhex("0001")
    # Into a zero checksum, and out of the 0xFFFF spelling of it.
    into = checksum_adjust(internet_checksum(other), other[2:], zero_sum[2:], udp=True)
    assert into == 0xFFFF
    out = checksum_adjust(0xFFFF, zero_sum[2:], other[2:], udp=True)
    assert out == internet_checksum(other)


@pytest.mark.parametrize(
    ("checksum", "old", "new"),
    [(0, b"\x00\x01", b"\x00"), (0, b"\x00", b"\x01"), (0x10000, b"\x00\x00", b"\x00\x00")],
)
def test_rfc1624_update_rejects_misuse(checksum: int, old: bytes, new: bytes) -> None:
    with pytest.raises(ValueError):
        checksum_adjust(checksum, old, new)


def test_udp_field_zero_rule() -> None:
    assert udp_field(0) == 0xFFFF
    assert udp_field(0x1234) == 0x1234
    assert udp_field(0xFFFF) == 0xFFFF
