"""Fuzz invariant: any bytes given to a STAMP decoder parse or raise WireError."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.wire import WireError
from sixlab.wire import stamp as w
from sixlab.wire.timestamp import ErrorEstimate

DECODERS: list[Callable[[bytes], object]] = [
    w.decode_sender,
    lambda b: w.decode_sender(b, authenticated=True),
    w.decode_reflector,
    lambda b: w.decode_reflector(b, authenticated=True),
]


def _check(data: bytes) -> None:
    for decode in DECODERS:
        with contextlib.suppress(WireError):
            decode(data)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    _check(data)


def test_mutated_valid_packets_whole_and_every_prefix() -> None:
    rng = random.Random(8762)
    seeds = [
        w.encode_sender(w.SenderPacket(1, 2, ErrorEstimate(), 3, b"\x80\x01\x00\x02ab")),
        w.encode_sender(w.SenderPacket(1, 2, ErrorEstimate(), 3), authenticated=True),
    ]
    for _ in range(200):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        for end in range(len(data) + 1):
            _check(bytes(data[:end]))
