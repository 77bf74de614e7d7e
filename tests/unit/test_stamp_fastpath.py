"""The reflector's inlined timestamp arithmetic equals the codec's, exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.stamp.reflector import ReflectorSessionConfig, _Session
from sixlab.wire.timestamp import NTP_MAX_NS, NTP_MIN_NS, TimestampFormat, ntp_from_ns, ptp_from_ns


@settings(max_examples=500)
@given(st.integers(min_value=NTP_MIN_NS, max_value=NTP_MAX_NS - 1))
def test_inlined_ntp_equals_codec(ns: int) -> None:
    session = _Session.from_config(ReflectorSessionConfig(ssid=1))
    assert session.timestamp(ns) == ntp_from_ns(ns)


@given(st.integers(min_value=0, max_value=(1 << 32) * 10**9 - 38 * 10**9))
def test_ptp_adds_the_tai_offset(ns: int) -> None:
    session = _Session.from_config(
        ReflectorSessionConfig(ssid=1, fmt=TimestampFormat.PTP, tai_utc_offset_ns=37 * 10**9)
    )
    assert session.timestamp(ns) == ptp_from_ns(ns + 37 * 10**9)
