"""Fuzz invariant for the IPv6/SRH/UDP decoders: a value or a WireError, nothing else.

Every input is fed whole and as every prefix. Three sources: random bytes, valid
packets with bytes overwritten, and random extension-header chains whose lengths are
kept consistent (so the parser's walk goes deep instead of stopping at the first length
check).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from ipaddress import IPv6Address

from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.wire import WireError
from sixlab.wire.ipv6 import IPv6Header, NextHeader, addresses_of, hop_limit_of
from sixlab.wire.packet import build_udp_packet, parse_udp_packet
from sixlab.wire.srh import SegmentRoutingHeader, validate_srh
from sixlab.wire.udp import UdpHeader, verify_udp

SETTINGS = settings(max_examples=200, deadline=None)

SRC = IPv6Address("2001:db8::1")
DST = IPv6Address("2001:db8::a")
PATH = [IPv6Address("2001:db8::c"), IPv6Address("2001:db8::b"), DST]


def _parse_checked(data: bytes) -> object:
    return parse_udp_packet(data, verify_checksum=True)


def _srh_of_parsed(data: bytes) -> object:
    parsed = parse_udp_packet(data)
    return (parsed.srh, parsed.ipv6, parsed.final_destination)


def _srh_after_ipv6(data: bytes) -> object:
    return SegmentRoutingHeader.decode(data[40:])


DECODERS: list[Callable[[bytes], object]] = [
    IPv6Header.decode,
    SegmentRoutingHeader.decode,
    _srh_after_ipv6,
    validate_srh,
    UdpHeader.decode,
    parse_udp_packet,
    _parse_checked,
    _srh_of_parsed,
    hop_limit_of,
    addresses_of,
]

SEEDS = [
    build_udp_packet(SRC, DST, 50000, 862, bytes(44)),
    build_udp_packet(SRC, DST, 50000, 862, bytes(44), segments=PATH),
    build_udp_packet(SRC, DST, 1, 2, b"", segments=[DST], traffic_class=0xB8, flow_label=7),
    # An SRH carrying an 8-octet TLV area, behind a Hop-by-Hop header.
    IPv6Header(0, 0, 8 + 48 + 8 + 1, NextHeader.HOP_BY_HOP, 64, SRC, PATH[0]).encode()
    + bytes.fromhex("2b00010400000000")
    + SegmentRoutingHeader.from_path(PATH[1:], NextHeader.UDP, tlvs=bytes(8)).encode()
    + UdpHeader(1, 2, 9, 0).encode()
    + b"z",
]


def _check(data: bytes) -> None:
    for end in range(len(data) + 1):
        prefix = data[:end]
        for decode in DECODERS:
            with contextlib.suppress(WireError):
                decode(prefix)
        assert verify_udp(SRC.packed, DST.packed, prefix) in (True, False)


def test_seeds_are_valid() -> None:
    for seed in SEEDS:
        assert parse_udp_packet(seed).udp.length >= 8


@SETTINGS
@given(st.binary(max_size=160))
def test_random_bytes(data: bytes) -> None:
    _check(data)


@SETTINGS
@given(
    st.sampled_from(SEEDS),
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=6),
)
def test_mutated_valid_packets(seed: bytes, writes: list[tuple[int, int]]) -> None:
    data = bytearray(seed)
    for index, value in writes:
        data[index % len(data)] = value
    _check(bytes(data))


@st.composite
def header_chains(draw: st.DrawFn) -> bytes:
    """IPv6 + random extension headers with lengths that fit + a UDP-ish tail."""
    walked = [0, 43, 60]
    types = [*walked, 17, 44, 50, 59, draw(st.integers(0, 255))]
    count = draw(st.integers(0, 10))
    # Mostly headers the parser walks, so that it gets deep; sometimes anything.
    # Hop-by-Hop is only allowed first, so later picks avoid it most of the time.
    chain = [
        draw(
            st.sampled_from(
                (walked if i == 0 else walked[1:]) if draw(st.integers(0, 9)) else types
            )
        )
        for i in range(count)
    ]
    body = bytearray()
    for i, nh in enumerate(chain):
        nxt = chain[i + 1] if i + 1 < len(chain) else draw(st.sampled_from([17, 17, 17, *types]))
        ext_len = draw(st.integers(0, 7))
        header = bytearray(draw(st.binary(min_size=8 * (ext_len + 1), max_size=8 * (ext_len + 1))))
        header[0], header[1] = nxt, ext_len
        if nh == NextHeader.ROUTING and draw(st.booleans()):
            header[2] = 4  # an SRH, with Last Entry and Segments Left drawn small
            header[4] = draw(st.integers(0, 4))  # Last Entry
            header[3] = draw(st.integers(0, header[4] + 1))  # Segments Left
        body += header
    if draw(st.booleans()):
        payload = draw(st.binary(max_size=16))
        body += UdpHeader(1, 2, 8 + len(payload), 0).encode() + payload
    else:
        body += draw(st.binary(max_size=24))
    first = chain[0] if chain else draw(st.sampled_from([17, 17, *types]))
    slack = draw(st.sampled_from([0, 0, 0, -8, -3, -1, 1, 3, 8]))
    plen = max(0, min(0xFFFF, len(body) + slack))
    return IPv6Header(0, 0, plen, first, 64, SRC, DST).encode() + bytes(body)


@SETTINGS
@given(header_chains())
def test_random_extension_header_chains(data: bytes) -> None:
    _check(data)


def test_seeded_byte_mutations() -> None:
    # A deterministic sweep besides hypothesis's: every seed, many single-byte writes at
    # every position of the headers, fed whole (prefixes are covered above).
    rng = random.Random(20240862)
    for seed in SEEDS:
        for position in range(min(len(seed), 120)):
            for value in (0, 1, 4, 17, 43, 60, 0xFF, rng.randrange(256)):
                data = bytearray(seed)
                data[position] = value
                for decode in DECODERS:
                    with contextlib.suppress(WireError):
                        decode(bytes(data))
