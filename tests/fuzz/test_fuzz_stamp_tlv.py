"""Fuzz invariant for the STAMP TLV codecs.

``decode_tlvs``, every ``from_tlv``, ``parse_value`` and the HMAC check either return or
raise ``WireError``; ``scan_tlvs`` and ``mark_malformed`` never raise, and what they return
is consistent with the input (same size, prefix decodes). Fed whole and as every prefix.
"""

from __future__ import annotations

import contextlib
from ipaddress import IPv4Address, IPv6Address

from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.wire._errors import WireError
from sixlab.wire.stamp_tlv import (
    AccessReport,
    ClassOfService,
    ControlCode,
    DestinationNodeAddress,
    DirectMeasurement,
    ExtraPadding,
    FollowUpTelemetry,
    HmacTlv,
    Location,
    LocationSubTlv,
    LocationSubType,
    MicroSessionId,
    ReturnAddress,
    ReturnPath,
    SrMplsLabelStack,
    Srv6SegmentList,
    TimestampInfo,
    Tlv,
    TlvFlag,
    TlvType,
    append_hmac_tlv,
    decode_tlvs,
    encode_tlvs,
    mark_malformed,
    parse_value,
    scan_tlvs,
    verify_hmac_tlv,
)

TYPED = (
    ExtraPadding,
    Location,
    TimestampInfo,
    ClassOfService,
    DirectMeasurement,
    AccessReport,
    FollowUpTelemetry,
    HmacTlv,
    DestinationNodeAddress,
    ReturnPath,
    MicroSessionId,
)

BASE = bytes(range(44))
KEY = b"fuzz"

SEEDS = [
    encode_tlvs(
        [
            ExtraPadding(b"\0" * 6).to_tlv(),
            Location(862, 5000, (LocationSubTlv(LocationSubType.DST_IPV6, b"\0" * 16),)).to_tlv(),
            TimestampInfo(1, 2, 1, 2).to_tlv(),
            ClassOfService(46, 1, 10, 2, 1).to_tlv(),
            DirectMeasurement(1, 2, 3).to_tlv(),
            AccessReport(1, 1).to_tlv(),
            FollowUpTelemetry(9, 1 << 40, 1).to_tlv(),
        ]
    ),
    encode_tlvs(
        [
            DestinationNodeAddress(IPv6Address("2001:db8::1")).to_tlv(),
            ReturnPath(
                (
                    ControlCode(1),
                    ReturnAddress(IPv4Address("192.0.2.1")),
                    SrMplsLabelStack((16005 << 12 | 0x140,)),
                    Srv6SegmentList((IPv6Address("fc00::1"), IPv6Address("fc00::2"))),
                    Tlv(77, 0, b"??"),
                )
            ).to_tlv(),
            MicroSessionId(3, 4).to_tlv(),
            Tlv(250, TlvFlag.U, b"experimental"),
        ]
    ),
    append_hmac_tlv(BASE, ExtraPadding(b"pp").to_tlv().encode(), KEY),
]


def _check_value_decoders(tlv: Tlv) -> None:
    with contextlib.suppress(WireError):
        parse_value(tlv)
    for cls in TYPED:
        # Every decoder, also on a TLV of the right type carrying these bytes.
        for candidate in (tlv, Tlv(cls.TYPE, tlv.flags, tlv.value)):
            with contextlib.suppress(WireError):
                value = cls.from_tlv(candidate)
                assert type(value).from_tlv(value.to_tlv(candidate.flags)) == value


def _check_area(data: bytes) -> None:
    scan = scan_tlvs(data)  # must never raise
    assert encode_tlvs(scan.tlvs) == data[: scan.well_formed_size]
    marked = mark_malformed(data)  # must never raise
    assert len(marked) == len(data)
    assert marked[: scan.well_formed_size] == data[: scan.well_formed_size]
    assert verify_hmac_tlv(BASE, data, KEY) in (True, False)
    try:
        tlvs = decode_tlvs(data)
    except WireError:
        assert not scan.well_formed
        tlvs = scan.tlvs
    else:
        assert scan.well_formed
        assert tlvs == scan.tlvs
        assert encode_tlvs(tlvs) == data
    for tlv in tlvs:
        _check_value_decoders(tlv)


def _check(data: bytes) -> None:
    for end in range(len(data) + 1):
        _check_area(data[:end])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes(data: bytes) -> None:
    _check(data)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 255), st.binary(max_size=48))
def test_random_values_of_every_type(tlv_type: int, value: bytes) -> None:
    _check_value_decoders(Tlv(tlv_type, 0x80, value))


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(SEEDS),
    st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=6),
)
def test_mutated_valid_areas(seed: bytes, flips: list[tuple[int, int]]) -> None:
    data = bytearray(seed)
    for index, value in flips:
        data[index % len(data)] = value
    _check(bytes(data))


def test_seeds_are_well_formed() -> None:
    for seed in SEEDS:
        tlvs = decode_tlvs(seed)
        assert all(parse_value(t) is not None or t.type not in set(TlvType) for t in tlvs)
    assert verify_hmac_tlv(BASE, SEEDS[2], KEY)
