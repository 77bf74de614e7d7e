"""Fuzz invariant for the ILNPv6 decoders: a value or a WireError, nothing else."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.wire._errors import WireError
from sixlab.wire.ilnp import (
    ILV,
    IlnpPacket,
    LocatorEntry,
    LocatorUpdate,
    LuOperation,
    Nonce,
    decode_destination_options,
    decode_locator_update,
    decode_packet,
    encode_locator_update,
    encode_packet,
    is_ilnp_packet,
)

SRC, DST = ILV(1, 2).packed, ILV(3, 4).packed


def _nonce_of(data: bytes) -> object:
    header, _ = decode_destination_options(data)
    return header.nonce


DECODERS: list[Callable[[bytes], object]] = [
    decode_destination_options,
    _nonce_of,
    decode_packet,
    decode_locator_update,
    lambda b: decode_locator_update(b, SRC, DST),
]

SEEDS = [
    encode_packet(IlnpPacket(ILV(1, 2), ILV(3, 4), 17, b"12345678", Nonce(b"abcd"))),
    encode_packet(IlnpPacket(ILV(1, 2), ILV(3, 4), 58, b"x" * 20, Nonce(b"a" * 12))),
    encode_locator_update(
        LocatorUpdate(LuOperation.ADVERTISEMENT, (LocatorEntry(7, 1, 2), LocatorEntry(8))),
        SRC,
        DST,
    ),
]


def _check(data: bytes) -> None:
    for decode in DECODERS:
        for end in range(len(data) + 1):
            with contextlib.suppress(WireError):
                decode(data[:end])
        assert is_ilnp_packet(data) in (True, False)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=96))
def test_random_bytes(data: bytes) -> None:
    _check(data)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(SEEDS),
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=6),
)
def test_mutated_valid_messages(seed: bytes, flips: list[tuple[int, int]]) -> None:
    data = bytearray(seed)
    for index, value in flips:
        data[index % len(data)] = value
    _check(bytes(data))
