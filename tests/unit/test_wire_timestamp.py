"""Timestamps and Error Estimate: exact conversions over the whole range (RFC 8762 §4.2.1)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sixlab.wire import WireError
from sixlab.wire.timestamp import (
    NTP_MAX_NS,
    NTP_MIN_NS,
    NTP_UNIX_OFFSET_S,
    PTP_MAX_NS,
    ErrorEstimate,
    TimestampFormat,
    decode_timestamp,
    encode_timestamp,
    ns_from_ntp,
    ns_from_ptp,
    ntp_from_ns,
    ptp_from_ns,
)

NS = 1_000_000_000


def test_ntp_epoch_and_unix_epoch() -> None:
    assert ntp_from_ns(0) == NTP_UNIX_OFFSET_S << 32
    assert ns_from_ntp(NTP_UNIX_OFFSET_S << 32) == 0


def test_ntp_fraction_scales_by_two_to_the_32_not_0xffffffff() -> None:
    # Half a second is exactly 2^31 fraction units; ×0xFFFFFFFF would give 2^31 - 1/2.
    assert ntp_from_ns(NS // 2) & 0xFFFF_FFFF == 1 << 31
    # 1 ns = 4.294967296 units, rounded to nearest: 4.
    assert ntp_from_ns(1) & 0xFFFF_FFFF == 4
    assert ntp_from_ns(NS - 1) & 0xFFFF_FFFF == 4294967292


def test_ntp_era_pivot_rfc4330() -> None:
    # 2036-02-07T06:28:16Z is NTP second 2^32, i.e. era 1 second 0.
    era1_start_ns = ((1 << 32) - NTP_UNIX_OFFSET_S) * NS
    assert ntp_from_ns(era1_start_ns) == 0
    assert ns_from_ntp(0) == era1_start_ns
    assert ns_from_ntp(ntp_from_ns(era1_start_ns - 1)) == era1_start_ns - 1


@settings(max_examples=500)
@given(st.integers(min_value=NTP_MIN_NS, max_value=NTP_MAX_NS - 1))
def test_ntp_round_trip_is_exact(ns: int) -> None:
    assert ns_from_ntp(ntp_from_ns(ns)) == ns


@settings(max_examples=500)
@given(st.integers(min_value=0, max_value=PTP_MAX_NS - 1))
def test_ptp_round_trip_is_exact(ns: int) -> None:
    assert ns_from_ptp(ptp_from_ns(ns)) == ns
    assert ptp_from_ns(ns) >> 32 == ns // NS


@pytest.mark.parametrize("ns", [NTP_MIN_NS, NTP_MAX_NS - 1, 0, -1, NTP_MIN_NS + 1])
def test_ntp_range_edges_round_trip(ns: int) -> None:
    assert ns_from_ntp(ntp_from_ns(ns)) == ns


@pytest.mark.parametrize("ns", [NTP_MIN_NS - 1, NTP_MAX_NS])
def test_ntp_outside_range_is_refused(ns: int) -> None:
    with pytest.raises(WireError, match="NTP"):
        ntp_from_ns(ns)


@pytest.mark.parametrize("ns", [-1, PTP_MAX_NS])
def test_ptp_outside_range_is_refused(ns: int) -> None:
    with pytest.raises(WireError, match="PTP"):
        ptp_from_ns(ns)


def test_ptp_nanoseconds_field_must_be_below_one_second() -> None:
    with pytest.raises(WireError, match="10\\^9"):
        ns_from_ptp((5 << 32) | NS)


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
@example(0x7FFF_FFFF_FFFF_FFFE)  # the NTP window's last second, rounded up past its end
def test_any_64_bit_value_decodes_or_raises_wire_error(raw: int) -> None:
    for fmt in TimestampFormat:
        try:
            ns = decode_timestamp(raw, fmt)
        except WireError:
            continue
        back = encode_timestamp(ns, fmt)
        if fmt is TimestampFormat.PTP:
            assert back == raw
        else:  # within the rounding of 1 ns (4.29 fraction units) either side of the carry
            diff = (back - raw) % (1 << 64)
            # The window's last nanosecond is held inside it rather than carried past it.
            slack = 5 if ns == NTP_MAX_NS - 1 else 3
            assert min(diff, (1 << 64) - diff) <= slack


def test_decode_refuses_more_than_64_bits() -> None:
    with pytest.raises(WireError):
        ns_from_ntp(1 << 64)


@given(
    st.booleans(),
    st.sampled_from(TimestampFormat),
    st.integers(min_value=0, max_value=63),
    st.integers(min_value=0, max_value=255),
)
def test_error_estimate_round_trip(sync: bool, fmt: TimestampFormat, scale: int, mult: int) -> None:
    ee = ErrorEstimate(sync, fmt, scale, mult)
    assert ErrorEstimate.from_int(ee.to_int()) == ee
    assert 0 <= ee.to_int() <= 0xFFFF


def test_error_estimate_bit_layout() -> None:
    # S=1, Z=0, Scale 0x12, Multiplier 0x34 -> 0x9234 (scapy's STAMP test vector).
    assert ErrorEstimate(True, TimestampFormat.NTP, 0x12, 0x34).to_int() == 0x9234
    assert ErrorEstimate.from_int(0x4000 | 0x0101).fmt is TimestampFormat.PTP


def test_error_estimate_value() -> None:
    # Multiplier × 2^(Scale−32) s: scale 32, multiplier 3 is exactly 3 s.
    assert ErrorEstimate(scale=32, multiplier=3).error_ns == 3 * NS
    # scale 0, multiplier 1: 2^-32 s = 0.23 ns, rounded up to 1 ns.
    assert ErrorEstimate(scale=0, multiplier=1).error_ns == 1


@given(st.integers(min_value=0, max_value=10**12))
def test_for_error_ns_is_a_tight_upper_bound(error_ns: int) -> None:
    ee = ErrorEstimate.for_error_ns(error_ns)
    assert ee.error_ns >= error_ns
    assert ee.is_valid
    if ee.multiplier > 1:  # one unit less would not cover the error
        smaller = ErrorEstimate(scale=ee.scale, multiplier=ee.multiplier - 1)
        assert smaller.error * NS < error_ns


def test_multiplier_zero_decodes_but_is_invalid() -> None:
    assert not ErrorEstimate.from_int(0x8000).is_valid


@pytest.mark.parametrize(("scale", "mult"), [(64, 1), (-1, 1), (0, 256), (0, -1)])
def test_error_estimate_fields_out_of_range(scale: int, mult: int) -> None:
    with pytest.raises(WireError):
        ErrorEstimate(scale=scale, multiplier=mult)
