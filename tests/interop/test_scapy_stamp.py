"""Cross-check the STAMP codecs against scapy's independent ``scapy.contrib.stamp``.

scapy's NTP ``ts`` fields hold seconds since 1900 as a decimal number, and its TLV
``FlagsField("UMIRRRRR")`` numbers bits from the least significant one, so its "U" is
0x01 where IANA's U is 0x80: the TLV cross-check compares raw flag bytes.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.contrib import stamp as sc

from sixlab.wire import stamp as w
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat

pytestmark = pytest.mark.interop

u32 = st.integers(min_value=0, max_value=2**32 - 1)
u16 = st.integers(min_value=0, max_value=2**16 - 1)
ntp_ts = st.integers(min_value=0, max_value=2**64 - 1)
ees = st.builds(
    ErrorEstimate,
    st.booleans(),
    st.just(TimestampFormat.NTP),
    st.integers(min_value=0, max_value=63),
    st.integers(min_value=1, max_value=255),
)
tlv_lists = st.lists(
    st.tuples(st.integers(0, 255), st.integers(0, 255), st.binary(max_size=12)), max_size=3
)


def _scapy_ee(ee: ErrorEstimate) -> Any:
    return sc.ErrorEstimate(
        S=int(ee.synchronized), Z=int(ee.fmt), scale=ee.scale, multiplier=ee.multiplier
    )


def _tlv_bytes(tlvs: list[tuple[int, int, bytes]]) -> bytes:
    return b"".join(bytes([f, t]) + len(v).to_bytes(2) + v for f, t, v in tlvs)


def _scapy_tlvs(tlvs: list[tuple[int, int, bytes]]) -> list[Any]:
    return [sc.STAMPTestTLV(flags=f, type=t, len=len(v), value=v) for f, t, v in tlvs]


def _ntp_seconds(raw: int) -> float:
    return float(raw >> 32)


@settings(max_examples=100, deadline=None)
@given(u32, st.integers(0, 2**32 - 1), ees, u16, tlv_lists)
def test_sender_packets_agree_both_ways(
    seq: int, seconds: int, ee: ErrorEstimate, ssid: int, tlvs: list[tuple[int, int, bytes]]
) -> None:
    raw_ts = seconds << 32  # whole seconds: scapy's decimal field carries them exactly
    ours = w.SenderPacket(seq, raw_ts, ee, ssid, _tlv_bytes(tlvs))
    theirs = sc.STAMPSessionSenderTestUnauthenticated(
        seq=seq, ts=seconds, err_estimate=_scapy_ee(ee), ssid=ssid, tlv_objects=_scapy_tlvs(tlvs)
    )
    assert w.encode_sender(ours) == bytes(theirs)
    parsed = sc.STAMPSessionSenderTestUnauthenticated(w.encode_sender(ours))
    assert (parsed.seq, int(parsed.ts), parsed.ssid) == (seq, seconds, ssid)
    assert parsed.err_estimate.multiplier == ee.multiplier
    assert [(t.flags.value, t.type, t.value) for t in parsed.tlv_objects] == tlvs
    assert w.decode_sender(bytes(theirs)) == ours


@settings(max_examples=100, deadline=None)
@given(u32, ntp_ts, ees, u16, ntp_ts, u32, ntp_ts, ees, st.integers(0, 255))
def test_reflector_packets_agree_both_ways(
    seq: int,
    t3: int,
    ee: ErrorEstimate,
    ssid: int,
    t2: int,
    sseq: int,
    t1: int,
    see: ErrorEstimate,
    ttl: int,
) -> None:
    t3, t2, t1 = (t & ~0xFFFF_FFFF for t in (t3, t2, t1))
    ours = w.ReflectorPacket(seq, t3, ee, ssid, t2, sseq, t1, see, ttl)
    theirs = sc.STAMPSessionReflectorTestUnauthenticated(
        seq=seq,
        ts=t3 >> 32,
        err_estimate=_scapy_ee(ee),
        ssid=ssid,
        ts_rx=t2 >> 32,
        seq_sender=sseq,
        ts_sender=t1 >> 32,
        err_estimate_sender=_scapy_ee(see),
        ttl_sender=ttl,
    )
    assert w.encode_reflector(ours) == bytes(theirs)
    assert w.decode_reflector(bytes(theirs)) == ours
    parsed = sc.STAMPSessionReflectorTestUnauthenticated(w.encode_reflector(ours))
    assert (parsed.seq_sender, parsed.ttl_sender, int(parsed.ts_rx)) == (sseq, ttl, t2 >> 32)


def test_scapy_u_flag_is_ianas_low_bit() -> None:
    # The pitfall the module docstring warns of: scapy's "U" is 0x01, IANA's U is 0x80.
    assert bytes(sc.STAMPTestTLV(flags="U", type=1, len=0))[0] == 0x01
