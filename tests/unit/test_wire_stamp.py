"""STAMP base packets (RFC 8762 §4.2–4.3) and HMAC (RFC 8762 §4.4)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.wire import TruncatedError, WireError, stamp_auth
from sixlab.wire import stamp as w
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat

# scapy's STAMP test vector (docs/protocols.md): seq 0x1234, NTP 1234.5678, S=1,
# Scale 0x12, Multiplier 0x34, SSID 1357.
SCAPY_VECTOR = bytes.fromhex("00001234000004D2915B573E9234054D") + bytes(28)
VECTOR_PACKET = w.SenderPacket(
    seq=0x1234,
    timestamp=(1234 << 32) | 0x915B573E,
    error_estimate=ErrorEstimate(True, TimestampFormat.NTP, 0x12, 0x34),
    ssid=1357,
)

u32 = st.integers(min_value=0, max_value=2**32 - 1)
u64 = st.integers(min_value=0, max_value=2**64 - 1)
u16 = st.integers(min_value=0, max_value=2**16 - 1)
error_estimates = st.builds(
    ErrorEstimate,
    st.booleans(),
    st.sampled_from(TimestampFormat),
    st.integers(min_value=0, max_value=63),
    st.integers(min_value=0, max_value=255),
)
tlv_areas = st.binary(max_size=64)
sender_packets = st.builds(w.SenderPacket, u32, u64, error_estimates, u16, tlv_areas)
reflector_packets = st.builds(
    w.ReflectorPacket,
    u32,
    u64,
    error_estimates,
    u16,
    u64,
    u32,
    u64,
    error_estimates,
    st.integers(min_value=0, max_value=255),
    tlv_areas,
)


def test_scapy_vector_encodes() -> None:
    assert w.encode_sender(VECTOR_PACKET) == SCAPY_VECTOR


def test_scapy_vector_decodes() -> None:
    assert w.decode_sender(SCAPY_VECTOR) == VECTOR_PACKET


def test_struct_sizes_match_rfc_layouts() -> None:
    assert w.SENDER_UNAUTH.size == w.REFLECTOR_UNAUTH.size == 44
    assert w.SENDER_AUTH.size == w.REFLECTOR_AUTH.size == 112


def test_authenticated_sender_offsets() -> None:
    # RFC 8762 §4.2.2: Seq 0:4, MBZ 4:16, Timestamp 16:24, Error Estimate 24:26, SSID 26:28.
    data = w.encode_sender(VECTOR_PACKET, authenticated=True)
    assert len(data) == 112
    assert data[0:4] == bytes.fromhex("00001234")
    assert data[4:16] == bytes(12)
    assert data[16:24] == bytes.fromhex("000004D2915B573E")
    assert data[24:26] == bytes.fromhex("9234")
    assert data[26:28] == (1357).to_bytes(2)
    assert data[28:112] == bytes(84)


def test_reflector_offsets_unauthenticated_and_authenticated() -> None:
    ee = ErrorEstimate(False, TimestampFormat.PTP, 1, 2)
    see = ErrorEstimate(True, TimestampFormat.NTP, 3, 4)
    pkt = w.ReflectorPacket(7, 0x1111, ee, 9, 0x2222, 5, 0x3333, see, 63)
    data = w.encode_reflector(pkt)
    assert data[0:4] == (7).to_bytes(4)
    assert data[4:12] == (0x1111).to_bytes(8)
    assert data[12:14] == ee.to_int().to_bytes(2)
    assert data[14:16] == (9).to_bytes(2)
    assert data[16:24] == (0x2222).to_bytes(8)
    assert data[24:28] == (5).to_bytes(4)
    assert data[28:36] == (0x3333).to_bytes(8)
    assert data[36:38] == see.to_int().to_bytes(2)
    assert data[40] == 63
    auth = w.encode_reflector(pkt, authenticated=True)
    # RFC 8762 §4.3.2: Timestamp 16, Error Est 24, SSID 26, Receive TS 32, Sender Seq 48,
    # Sender TS 64, Sender Error Est 72, Ses-Sender TTL 80, HMAC 96.
    assert auth[16:24] == (0x1111).to_bytes(8)
    assert auth[24:26] == ee.to_int().to_bytes(2)
    assert auth[26:28] == (9).to_bytes(2)
    assert auth[32:40] == (0x2222).to_bytes(8)
    assert auth[48:52] == (5).to_bytes(4)
    assert auth[64:72] == (0x3333).to_bytes(8)
    assert auth[72:74] == see.to_int().to_bytes(2)
    assert auth[80] == 63


@given(sender_packets, st.booleans())
def test_sender_round_trip(pkt: w.SenderPacket, authenticated: bool) -> None:
    assert (
        w.decode_sender(
            w.encode_sender(pkt, authenticated=authenticated), authenticated=authenticated
        )
        == pkt
    )


@given(reflector_packets, st.booleans())
def test_reflector_round_trip(pkt: w.ReflectorPacket, authenticated: bool) -> None:
    data = w.encode_reflector(pkt, authenticated=authenticated)
    assert w.decode_reflector(data, authenticated=authenticated) == pkt


def test_mbz_ignored_on_receipt() -> None:
    data = bytearray(SCAPY_VECTOR)
    data[20] = 0xFF
    assert w.decode_sender(bytes(data)) == VECTOR_PACKET


def test_twamp_light_short_sender_packets() -> None:
    # RFC 8762 §4.6: 14 bytes hold Seq, Timestamp and Error Estimate.
    short = w.decode_sender(SCAPY_VECTOR[:14])
    assert (short.seq, short.timestamp, short.ssid) == (0x1234, VECTOR_PACKET.timestamp, 0)
    assert w.decode_sender(SCAPY_VECTOR[:16]).ssid == 1357
    with pytest.raises(TruncatedError):
        w.decode_sender(SCAPY_VECTOR[:13])


@pytest.mark.parametrize("authenticated", [False, True])
def test_reflector_packet_too_short(authenticated: bool) -> None:
    with pytest.raises(WireError):
        w.decode_reflector(
            bytes(w.base_size(authenticated=authenticated) - 1), authenticated=authenticated
        )


@pytest.mark.parametrize(
    ("field", "value"),
    [("seq", 2**32), ("timestamp", 2**64), ("ssid", 2**16), ("seq", -1)],
)
def test_encoder_refuses_unrepresentable_values(field: str, value: int) -> None:
    kwargs = {"seq": 0, "timestamp": 0, "error_estimate": ErrorEstimate(), "ssid": 0, field: value}
    with pytest.raises(WireError, match="bits"):
        w.SenderPacket(**kwargs)  # type: ignore[arg-type]


# RFC 4231 §4.2 and §4.3, HMAC-SHA-256 truncated to the 16 bytes STAMP uses.
@pytest.mark.parametrize(
    ("key", "data", "expected"),
    [
        (bytes([0x0B] * 20), b"Hi There", "b0344c61d8db38535ca8afceaf0bf12b"),
        (b"Jefe", b"what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c7"),
        (bytes([0xAA] * 20), bytes([0xDD] * 50), "773ea91e36800e46854db8ebd09181a7"),
    ],
)
def test_hmac_rfc4231_vectors(key: bytes, data: bytes, expected: str) -> None:
    assert stamp_auth.hmac16(key, data) == bytes.fromhex(expected)


# RFC 4231 §4.7 test case 6: a key longer than the block size.
def test_hmac_rfc4231_long_key() -> None:
    key = bytes([0xAA] * 131)
    data = b"Test Using Larger Than Block-Size Key - Hash Key First"
    assert stamp_auth.hmac16(key, data) == bytes.fromhex("60e431591ee0b67f0d8a26aacbf5b77f")


@settings(max_examples=100)
@given(sender_packets, st.binary(min_size=1, max_size=64), st.integers(min_value=0, max_value=111))
def test_sign_verify_and_any_flipped_byte_fails(pkt: w.SenderPacket, key: bytes, flip: int) -> None:
    signed = stamp_auth.sign(w.encode_sender(pkt, authenticated=True), key)
    assert stamp_auth.verify(signed, key)
    tampered = bytearray(signed)
    tampered[flip] ^= 0x01
    assert not stamp_auth.verify(bytes(tampered), key)
    assert not stamp_auth.verify(signed, key + b"x")


def test_hmac_covers_bytes_0_to_95() -> None:
    key = b"k"
    signed = stamp_auth.sign(w.encode_sender(VECTOR_PACKET, authenticated=True), key)
    assert signed[96:112] == stamp_auth.hmac16(key, signed[:96])


def test_verify_short_packet_is_false_not_an_error() -> None:
    assert not stamp_auth.verify(bytes(50), b"k")
    with pytest.raises(WireError):
        stamp_auth.sign(bytes(50), b"k")
