"""The batch reflector against the per-packet reference, byte for byte.

The same probes go through ``Reflector.reflect`` one by one and through
``BatchReflector.reflect`` (two reflectors with the same sessions); with a clock that
always returns the T3 the batch is given, every reply, every return path and every
counter must be the same: stateless and stateful sessions, NTP and PTP, a default
session or none, unknown SSIDs, Multiplier 0, Extra Padding TLVs, other TLVs (the
reference answers those rows), short and possibly authenticated payloads.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv6Address

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.stamp.batch import BatchReflector
from sixlab.stamp.reflector import (
    PacketContext,
    Reflection,
    Reflector,
    ReflectorMode,
    ReflectorSessionConfig,
    ReturnPath,
)
from sixlab.wire import stamp_tlv as tlv
from sixlab.wire.timestamp import TimestampFormat

T3 = 1_790_000_000_123_456_789
CTX = PacketContext(IPv6Address("fd00::1"), IPv6Address("fd00::2"), 40862, 862)
RET = (IPv6Address("fc00:0:2::a"), IPv6Address("fd00::1"))


def _clock() -> int:
    return T3


def _reflector(*, default: str | None, auth: bool) -> Reflector:
    refl = Reflector()
    refl.add_session(ReflectorSessionConfig(1))
    refl.add_session(
        ReflectorSessionConfig(
            2, mode=ReflectorMode.STATEFUL, fmt=TimestampFormat.PTP, return_segments=RET
        )
    )
    refl.add_session(ReflectorSessionConfig(4, mode=ReflectorMode.STATEFUL))
    if auth:
        refl.add_session(ReflectorSessionConfig(5, key=b"k" * 16))
    if default == "stateless":
        refl.set_default(ReflectorSessionConfig(None, return_segments=RET))
    elif default == "stateful":
        refl.set_default(ReflectorSessionConfig(None, mode=ReflectorMode.STATEFUL))
    return refl


@dataclass(frozen=True)
class Probe:
    seq: int
    ts: int
    ee: int
    ssid: int
    other_tlv: bool
    t2: int
    hop: int


probes = st.builds(
    Probe,
    seq=st.integers(0, 0xFFFF_FFFF),
    ts=st.integers(0, (1 << 64) - 1),
    ee=st.sampled_from([0x0001, 0x8001, 0x0100, 0x00FF, 0x0000]),
    ssid=st.sampled_from([1, 2, 3, 4, 5, 1000]),
    other_tlv=st.booleans(),
    t2=st.integers(1_600_000_000 * 10**9, 2_000_000_000 * 10**9),
    hop=st.integers(0, 255),
)


def _payload(p: Probe, padding: list[int] | None, size: int) -> bytes:
    base = (
        p.seq.to_bytes(4, "big") + p.ts.to_bytes(8, "big") + p.ee.to_bytes(2, "big")
        + p.ssid.to_bytes(2, "big") + bytes(28)
    )  # fmt: skip
    if padding is None:
        return (base + bytes(size))[:size]
    if p.other_tlv:  # a Location TLV of the same size: the reference's to answer
        value = bytes(sum(4 + n for n in padding) - 4)
        return base + tlv.Tlv(tlv.TlvType.LOCATION, tlv.TlvFlag.U, value).encode()
    area = b"".join(tlv.ExtraPadding(bytes([7]) * n).to_tlv().encode() for n in padding)
    return base + area


def _counters(refl: Reflector) -> object:
    c = refl.counters
    per = {s: refl.session_counters(s) for s in refl.ssids}
    return (c.received, c.reflected, dict(c.dropped), per)


def _same(ref: Reflection | None, got: Reflection | None) -> None:
    assert (ref is None) == (got is None)
    if ref is not None and got is not None:
        assert got.payload == ref.payload
        assert got.return_path == ref.return_path
        assert got.ssid == ref.ssid


@settings(max_examples=300, deadline=None)
@given(
    batches=st.lists(st.lists(probes, min_size=1, max_size=24), min_size=1, max_size=3),
    layout=st.sampled_from(["base", "pad", "pad2", "short", "auth-size"]),
    default=st.sampled_from([None, "stateless", "stateful"]),
    auth=st.booleans(),
)
def test_batch_equals_reference(
    batches: list[list[Probe]], layout: str, default: str | None, auth: bool
) -> None:
    ref = _reflector(default=default, auth=auth)
    bat = _reflector(default=default, auth=auth)
    batch = BatchReflector(bat)
    padding = {"pad": [12], "pad2": [3, 0, 21], "auth-size": [64]}.get(layout)
    size = {"short": 20}.get(layout, 44)
    for probe_list in batches:
        payloads = [_payload(p, padding, size) for p in probe_list]
        assert len({len(x) for x in payloads}) == 1
        arr = np.frombuffer(b"".join(payloads), np.uint8).reshape(len(payloads), -1)
        t2 = np.array([p.t2 for p in probe_list], np.int64)
        hops = np.array([p.hop for p in probe_list], np.uint8)
        expected = [
            ref.reflect(x, p.t2, _clock, p.hop, CTX)
            for x, p in zip(payloads, probe_list, strict=True)
        ]

        def fallback(
            i: int, payloads: list[bytes] = payloads, probes: list[Probe] = probe_list
        ) -> Reflection | None:
            return bat.reflect(payloads[i], probes[i].t2, _clock, probes[i].hop, CTX)

        out = batch.reflect(arr, t2, hops, fallback)
        out.set_t3(T3)
        for i, want in enumerate(expected):
            if i in out.fallback:
                got = out.fallback[i]
            elif out.answered[i]:
                route: ReturnPath = out.routes[int(out.route_of[i])]
                got = Reflection(out.replies[i].tobytes(), probe_list[i].ssid, route)
            else:
                got = None
            _same(want, got)
        assert _counters(bat) == _counters(ref)
    if layout in ("base", "pad", "pad2"):
        # The batch really answered something itself unless every row was dropped or
        # went to the reference.
        assert ref.counters.reflected == 0 or bat.counters.reflected > 0


def test_batch_answers_base_packets_without_the_reference() -> None:
    refl = _reflector(default="stateless", auth=False)
    p = Probe(9, 1 << 40, 0x0001, 2, False, 1_700_000_000 * 10**9, 61)
    arr = np.frombuffer(_payload(p, None, 44) * 5, np.uint8).reshape(5, 44)

    def fallback(i: int) -> Reflection | None:
        raise AssertionError(f"row {i} went to the reference")

    out = BatchReflector(refl).reflect(
        arr, np.full(5, p.t2, np.int64), np.full(5, 61, np.uint8), fallback
    )
    out.set_t3(T3)
    assert out.answered.all()
    assert [int.from_bytes(r[:4].tobytes(), "big") for r in out.replies] == [0, 1, 2, 3, 4]
    assert out.routes == [ReturnPath(segments=RET)]
