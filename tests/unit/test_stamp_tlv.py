"""STAMP TLV codecs: known answers from the RFC layouts, round trips, malformed areas, HMAC."""

from __future__ import annotations

import hashlib
import hmac
from ipaddress import IPv4Address, IPv6Address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.wire._errors import InvalidFieldError, TruncatedError, WireError
from sixlab.wire.stamp import SenderPacket, encode_sender
from sixlab.wire.stamp_tlv import (
    AccessId,
    AccessReport,
    ClassOfService,
    ControlCode,
    ControlCodeFlag,
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
    ReturnPathSubTlv,
    SrMplsLabelStack,
    Srv6SegmentList,
    SyncSource,
    TimestampInfo,
    TimestampMethod,
    Tlv,
    TlvFlag,
    TlvType,
    TlvValue,
    append_hmac_tlv,
    decode_tlvs,
    encode_tlvs,
    hmac_tlv_input,
    mark_malformed,
    parse_value,
    scan_tlvs,
    verify_hmac_tlv,
)
from sixlab.wire.timestamp import ErrorEstimate

EXAMPLES = settings(max_examples=150, deadline=None)

# ------------------------------------------------------------------ strategies

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
u64 = st.integers(0, (1 << 64) - 1)
small_bytes = st.binary(max_size=40)
ipv4 = st.builds(IPv4Address, st.integers(0, (1 << 32) - 1))
ipv6 = st.builds(IPv6Address, st.integers(0, (1 << 128) - 1))
address = st.one_of(ipv4, ipv6)

raw_tlvs = st.builds(Tlv, u8, u8, small_bytes)

location_subs = st.builds(LocationSubTlv, u8, small_bytes, u8)
return_path_subs: st.SearchStrategy[ReturnPathSubTlv] = st.one_of(
    st.builds(ControlCode, u32, u8),
    st.builds(ReturnAddress, address, u8),
    st.builds(SrMplsLabelStack, st.lists(u32, min_size=1, max_size=4).map(tuple), u8),
    st.builds(Srv6SegmentList, st.lists(ipv6, min_size=1, max_size=4).map(tuple), u8),
    st.builds(Tlv, st.integers(5, 0xFF), u8, small_bytes),
)

typed_values: st.SearchStrategy[TlvValue] = st.one_of(
    st.builds(ExtraPadding, small_bytes),
    st.builds(Location, u16, u16, st.lists(location_subs, max_size=4).map(tuple)),
    st.builds(TimestampInfo, u8, u8, u8, u8, small_bytes),
    st.builds(
        ClassOfService,
        st.integers(0, 63),
        st.integers(0, 3),
        st.integers(0, 63),
        st.integers(0, 3),
        st.integers(0, 3),
        st.integers(0, 3),
    ),
    st.builds(DirectMeasurement, u32, u32, u32),
    st.builds(AccessReport, st.integers(0, 15), u8),
    st.builds(FollowUpTelemetry, u32, u64, u8),
    st.builds(HmacTlv, st.binary(min_size=16, max_size=16)),
    st.builds(DestinationNodeAddress, address),
    st.builds(ReturnPath, st.lists(return_path_subs, max_size=4).map(tuple)),
    st.builds(MicroSessionId, u16, u16),
)


# ------------------------------------------------------------------ raw layer


def test_raw_tlv_known_answer() -> None:
    # RFC 8972 §4 Figure 3: Flags(8) Type(8) Length(16) Value; Length counts the Value only.
    tlv = Tlv(0xFE, TlvFlag.U, b"\x01\x02\x03")
    assert tlv.encode() == bytes.fromhex("80fe0003010203")
    assert tlv.size == 7
    assert decode_tlvs(bytes.fromhex("80fe0003010203")) == (tlv,)


def test_flag_and_type_values_follow_iana() -> None:
    # IANA "STAMP TLV Flags": U is bit 0 (MSB), M bit 1, I bit 2.
    assert (TlvFlag.U, TlvFlag.M, TlvFlag.I) == (0x80, 0x40, 0x20)
    assert [t.value for t in TlvType] == list(range(1, 12))


def test_empty_area_decodes_to_nothing() -> None:
    assert decode_tlvs(b"") == ()
    assert encode_tlvs(()) == b""
    assert scan_tlvs(b"").well_formed


@EXAMPLES
@given(st.lists(raw_tlvs, max_size=6))
def test_any_tlv_list_round_trips_byte_for_byte(tlvs: list[Tlv]) -> None:
    area = encode_tlvs(tlvs)
    assert decode_tlvs(area) == tuple(tlvs)
    assert encode_tlvs(decode_tlvs(area)) == area
    scan = scan_tlvs(area)
    assert scan.well_formed
    assert scan.tlvs == tuple(tlvs)
    assert mark_malformed(area) == area


@EXAMPLES
@given(st.binary(max_size=64))
def test_decode_then_encode_is_identity_on_whatever_decodes(data: bytes) -> None:
    try:
        tlvs = decode_tlvs(data)
    except TruncatedError:
        return
    assert encode_tlvs(tlvs) == data


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"type": 256, "flags": 0, "value": b""}, "Type"),
        ({"type": 1, "flags": -1, "value": b""}, "Flags"),
        ({"type": 1, "flags": 0, "value": b"\0" * 0x10000}, "16-bit"),
    ],
)
def test_raw_tlv_rejects_what_the_wire_cannot_hold(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidFieldError, match=field):
        Tlv(**kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------ malformed areas


def test_length_past_end_is_truncated_strictly_and_marked_leniently() -> None:
    good = Tlv(TlvType.EXTRA_PADDING, TlvFlag.U, b"ab").encode()
    # Second TLV claims 9 value bytes but only 3 follow (RFC 8972 §4: malformed).
    bad = bytes.fromhex("80010009") + b"abc"
    area = good + bad
    with pytest.raises(TruncatedError, match="Length 9"):
        decode_tlvs(area)
    scan = scan_tlvs(area)
    assert scan.tlvs == (Tlv(1, 0x80, b"ab"),)
    assert scan.malformed_at == len(good)
    assert scan.well_formed_size == len(good)
    reflected = mark_malformed(area)
    assert len(reflected) == len(area)  # symmetric size
    assert reflected[: len(good)] == good
    assert reflected[len(good)] == 0x80 | 0x40  # U kept, M set
    assert reflected[len(good) + 1 :] == bad[1:]


@pytest.mark.parametrize("stray", [b"\x80", b"\x80\x01", b"\x00\x01\x00"])
def test_one_to_three_trailing_bytes(stray: bytes) -> None:
    good = Tlv(TlvType.EXTRA_PADDING, 0, b"").encode()
    area = good + stray
    with pytest.raises(TruncatedError, match="header"):
        decode_tlvs(area)
    scan = scan_tlvs(area)
    assert scan.tlvs == (Tlv(1, 0, b""),)
    assert scan.malformed_at == 4
    reflected = mark_malformed(area)
    assert reflected == good + bytes([stray[0] | 0x40]) + stray[1:]


def test_malformed_first_tlv() -> None:
    area = bytes.fromhex("0008ffff") + b"\0" * 16
    scan = scan_tlvs(area)
    assert scan.tlvs == ()
    assert scan.malformed_at == 0
    assert mark_malformed(area)[0] == 0x40


def test_mark_malformed_is_idempotent() -> None:
    area = bytes.fromhex("80010005aabb")
    once = mark_malformed(area)
    assert mark_malformed(once) == once


# ------------------------------------------------------------------ typed values


@EXAMPLES
@given(typed_values, u8)
def test_typed_values_round_trip(value: TlvValue, flags: int) -> None:
    tlv = value.to_tlv(flags)
    assert tlv.flags == flags
    assert type(value).from_tlv(tlv) == value
    assert parse_value(tlv) == value
    wire = tlv.encode()
    assert decode_tlvs(wire) == (tlv,)
    assert parse_value(decode_tlvs(wire)[0]) == value


def test_default_flags_are_those_of_a_session_sender() -> None:
    # RFC 8972 §4: the Session-Sender sets U in every TLV it sends.
    assert ExtraPadding(b"").to_tlv().flags == TlvFlag.U


def test_extra_padding_known_answer() -> None:
    # RFC 8972 §4.1: type 1, the value is the padding itself.
    assert ExtraPadding(b"\0\0\0").to_tlv(0).encode() == bytes.fromhex("00010003000000")


def test_location_known_answer() -> None:
    # RFC 8972 §4.2: Destination Port(2) Source Port(2) then sub-TLVs in the TLV format;
    # the Reflector answers a Destination IP (type 4) request with Destination IPv4 (5).
    wire = bytes.fromhex("00020010035ec35000050008c000020100000000")
    loc = Location.from_tlv(decode_tlvs(wire)[0])
    assert (loc.dest_port, loc.src_port) == (862, 50000)
    (sub,) = loc.sub_tlvs
    assert sub.type == LocationSubType.DST_IPV4
    assert sub.address == IPv4Address("192.0.2.1")
    assert loc.to_tlv(0).encode() == wire


def test_location_sub_types_follow_iana() -> None:
    assert [t.value for t in LocationSubType] == list(range(1, 10))
    mac = LocationSubTlv(LocationSubType.SRC_EUI48, bytes.fromhex("020000000001") + b"\0\0")
    assert mac.mac == bytes.fromhex("020000000001")
    v6 = LocationSubTlv(LocationSubType.SRC_IPV6, IPv6Address("2001:db8::1").packed)
    assert v6.address == IPv6Address("2001:db8::1")
    assert LocationSubTlv(LocationSubType.SRC_IP, b"\0" * 16).address is None


def test_location_too_short_or_bad_sub_tlv() -> None:
    with pytest.raises(InvalidFieldError):
        Location.from_tlv(Tlv(TlvType.LOCATION, 0, b"\0\0\0"))
    with pytest.raises(InvalidFieldError, match="sub-TLV"):
        Location.from_tlv(Tlv(TlvType.LOCATION, 0, b"\0\0\0\0" + bytes.fromhex("000500ff")))


def test_timestamp_info_known_answer() -> None:
    # RFC 8972 §4.3: Sync Src In, Timestamp In, Sync Src Out, Timestamp Out (1 byte each).
    info = TimestampInfo(SyncSource.NTP, TimestampMethod.SW_LOCAL, SyncSource.PTP, 1)
    assert info.to_tlv(0).encode() == bytes.fromhex("0003000401020201")
    back = TimestampInfo.from_tlv(decode_tlvs(bytes.fromhex("0003000401020201"))[0])
    assert back.ts_method_out is TimestampMethod.HW_ASSIST
    odd = TimestampInfo.from_tlv(Tlv(3, 0, bytes([200, 0, 0, 0])))
    assert odd.sync_src_in == 200  # outside the registry: kept as an int


def test_class_of_service_known_answer() -> None:
    # RFC 8972 §4.4: DSCP1(6) DSCP2(6) ECN(2) RP(2) | 16 bits; ECN1 and RPE take the top
    # 4 of those 16. DSCP1 = EF (46), DSCP2 = AF11 (10), ECN2 = CE (3), RP = 1, ECN1 = 2.
    cos = ClassOfService(dscp1=46, ecn1=2, dscp2=10, ecn2=3, rp=1)
    word = 46 << 26 | 10 << 20 | 3 << 18 | 1 << 16 | 2 << 14
    assert cos.to_tlv(0).value == word.to_bytes(4, "big") == bytes.fromhex("b8ad8000")
    # Reserved bits set by a peer are ignored on receipt.
    assert ClassOfService.from_tlv(Tlv(4, 0, bytes.fromhex("b8ad8fff"))) == cos


def test_direct_measurement_known_answer() -> None:
    # RFC 8972 §4.5: S_TxC, R_RxC, R_TxC, 32 bits each.
    dm = DirectMeasurement(1, 2, 0xFFFFFFFF)
    assert dm.to_tlv(0).encode() == bytes.fromhex("0005000c0000000100000002ffffffff")


def test_access_report_known_answer() -> None:
    # RFC 8972 §4.6: ID(4 bits) Resv(4) Return Code(8) Reserved(16).
    report = AccessReport(AccessId.NON_THREE_GPP, 1)
    assert report.to_tlv(0).encode() == bytes.fromhex("0006000420010000")
    assert AccessReport.from_tlv(Tlv(6, 0, bytes.fromhex("1f00ffff"))) == AccessReport(1, 0)


def test_follow_up_telemetry_known_answer() -> None:
    # RFC 8972 §4.7: Sequence Number(4) Follow-up Timestamp(8) Timestamp M(1) Reserved(3).
    fut = FollowUpTelemetry(7, 0x0102030405060708, TimestampMethod.HW_ASSIST)
    assert fut.to_tlv(0).encode() == bytes.fromhex("0007001000000007010203040506070801000000")


def test_hmac_tlv_value_must_be_16_bytes() -> None:
    with pytest.raises(InvalidFieldError):
        HmacTlv(b"\0" * 15)
    with pytest.raises(InvalidFieldError):
        HmacTlv.from_tlv(Tlv(TlvType.HMAC, 0, b"\0" * 17))


def test_destination_node_address_known_answer() -> None:
    # RFC 9503 §3: type 9, the address itself (4 or 16 bytes).
    v4 = DestinationNodeAddress(IPv4Address("198.51.100.7"))
    assert v4.to_tlv(0).encode() == bytes.fromhex("00090004c6336407")
    v6 = DestinationNodeAddress(IPv6Address("2001:db8::2"))
    assert v6.to_tlv(0).encode() == bytes.fromhex("0009001020010db8" + "00" * 11 + "02")
    with pytest.raises(InvalidFieldError, match="neither"):
        DestinationNodeAddress.from_tlv(Tlv(9, 0, b"\0" * 5))


def test_return_path_known_answer() -> None:
    # RFC 9503 §4: type 10 holding sub-TLVs: Control Code (1, Length 4, LSB = Reply
    # Request) and an SRv6 Segment List (4), segments in travel order.
    seg1, seg2 = IPv6Address("fc00:1::1"), IPv6Address("fc00:2::1")
    rp = ReturnPath((ControlCode(ControlCodeFlag.REPLY_REQUEST), Srv6SegmentList((seg1, seg2))))
    wire = (
        bytes.fromhex("000a002c")
        + bytes.fromhex("0001000400000001")
        + bytes.fromhex("00040020")
        + seg1.packed
        + seg2.packed
    )
    assert rp.to_tlv(0).encode() == wire
    back = ReturnPath.from_tlv(decode_tlvs(wire)[0])
    assert back == rp
    assert back.control_code is not None
    assert back.control_code.reply_request
    assert back.segment_list is not None
    assert back.segment_list.segments == (seg1, seg2)
    assert back.return_address is None


def test_return_path_other_sub_tlvs() -> None:
    # RFC 9503 §4.2–4.3: Return Address (2) and SR-MPLS Label Stack (3, 32-bit LSEs).
    lse = 16005 << 12 | 0 << 9 | 1 << 8 | 64
    rp = ReturnPath((ReturnAddress(IPv4Address("192.0.2.9")), SrMplsLabelStack((lse,))))
    wire = rp.to_tlv(0).encode()
    assert wire == bytes.fromhex("000a001000020004c000020900030004") + lse.to_bytes(4, "big")
    back = ReturnPath.from_tlv(decode_tlvs(wire)[0])
    assert back.return_address == ReturnAddress(IPv4Address("192.0.2.9"))
    stack = back.sub_tlvs[1]
    assert isinstance(stack, SrMplsLabelStack)
    assert stack.label_values == (16005,)


@pytest.mark.parametrize(
    "value",
    [
        bytes.fromhex("00010003000000"),  # Control Code of 3 bytes
        bytes.fromhex("0004000f") + b"\0" * 15,  # segment list not a multiple of 16
        bytes.fromhex("00040000"),  # empty segment list
        bytes.fromhex("00030006") + b"\0" * 6,  # label stack not a multiple of 4
        bytes.fromhex("00020005") + b"\0" * 5,  # return address neither v4 nor v6
        bytes.fromhex("000100"),  # truncated sub-TLV header
    ],
)
def test_return_path_rejects_bad_sub_tlvs(value: bytes) -> None:
    with pytest.raises(InvalidFieldError):
        ReturnPath.from_tlv(Tlv(TlvType.RETURN_PATH, 0, value))


def test_return_path_refuses_raw_known_sub_type() -> None:
    with pytest.raises(InvalidFieldError, match="typed form"):
        ReturnPath((Tlv(1, 0, b"\0\0\0\0"),))


def test_micro_session_id_known_answer() -> None:
    # RFC 9534: type 11, Length 4, Sender Micro-session ID(16) Reflector Micro-session ID(16).
    assert MicroSessionId(0x1234, 0xABCD).to_tlv(0).encode() == bytes.fromhex("000b00041234abcd")


@pytest.mark.parametrize(
    ("cls", "size"),
    [
        (ClassOfService, 4),
        (DirectMeasurement, 12),
        (AccessReport, 4),
        (FollowUpTelemetry, 16),
        (HmacTlv, 16),
        (MicroSessionId, 4),
    ],
)
def test_fixed_size_values_reject_other_lengths(cls: type[TlvValue], size: int) -> None:
    for length in (0, size - 1, size + 1):
        with pytest.raises(InvalidFieldError):
            cls.from_tlv(Tlv(cls.TYPE, 0, b"\0" * length))


def test_from_tlv_checks_the_type() -> None:
    with pytest.raises(InvalidFieldError, match="expected"):
        DirectMeasurement.from_tlv(Tlv(TlvType.MICRO_SESSION_ID, 0, b"\0" * 12))


def test_parse_value_tells_understood_from_not() -> None:
    assert parse_value(Tlv(0, 0x80, b"")) is None  # type 0 is reserved
    assert parse_value(Tlv(200, 0x80, b"whatever")) is None
    assert parse_value(Tlv(11, 0x80, b"\0\1\0\2")) == MicroSessionId(1, 2)
    with pytest.raises(InvalidFieldError):
        parse_value(Tlv(11, 0x80, b"\0"))


@pytest.mark.parametrize(
    "build",
    [
        lambda: ClassOfService(dscp1=64),
        lambda: AccessReport(16, 0),
        lambda: DirectMeasurement(s_txc=1 << 32),
        lambda: MicroSessionId(1 << 16, 0),
        lambda: ControlCode(1 << 32),
        lambda: SrMplsLabelStack(()),
        lambda: Srv6SegmentList(()),
        lambda: Location(dest_port=-1),
        lambda: FollowUpTelemetry(ts_mode=256),
    ],
)
def test_encoders_refuse_values_the_wire_cannot_hold(build: object) -> None:
    with pytest.raises(WireError):
        build()  # type: ignore[operator]


# ------------------------------------------------------------------ HMAC TLV

KEY = b"stamp-tlv-key"


def _base(seq: int = 0x01020304) -> bytes:
    return encode_sender(SenderPacket(seq, 0, ErrorEstimate.from_int(0x0001), ssid=7))


def test_hmac_tlv_input_is_seq_then_preceding_tlvs() -> None:
    # RFC 8972 §4.8: Sequence Number field of the base packet + all preceding TLVs.
    before = ExtraPadding(b"pad").to_tlv().encode()
    assert hmac_tlv_input(_base(), before) == bytes.fromhex("01020304") + before
    with pytest.raises(TruncatedError):
        hmac_tlv_input(b"\0\0\0", b"")


def test_append_hmac_tlv_known_answer() -> None:
    before = encode_tlvs([ExtraPadding(b"\0" * 4).to_tlv(), MicroSessionId(1, 2).to_tlv()])
    area = append_hmac_tlv(_base(), before, KEY)
    mac = hmac.new(KEY, bytes.fromhex("01020304") + before, hashlib.sha256).digest()[:16]
    assert area == before + bytes.fromhex("80080010") + mac
    assert verify_hmac_tlv(_base(), area, KEY)


@EXAMPLES
@given(st.lists(typed_values.filter(lambda v: not isinstance(v, HmacTlv)), max_size=4), u32)
def test_hmac_sign_verify_and_every_tampered_byte_fails(values: list[TlvValue], seq: int) -> None:
    base = _base(seq)
    area = append_hmac_tlv(base, encode_tlvs(v.to_tlv() for v in values), KEY)
    assert verify_hmac_tlv(base, area, KEY)
    assert not verify_hmac_tlv(base, area, KEY + b"x")
    own_flags = len(area) - 20  # the HMAC TLV's own Flags byte is not covered (§4.8)
    for i in range(len(area)):
        if i == own_flags:
            continue
        tampered = bytearray(area)
        tampered[i] ^= 0x01
        assert not verify_hmac_tlv(base, bytes(tampered), KEY)
    for i in range(4):  # the Sequence Number is covered too
        other = bytearray(base)
        other[i] ^= 0x80
        assert not verify_hmac_tlv(bytes(other), area, KEY)


def test_hmac_does_not_cover_the_rest_of_the_base_packet() -> None:
    # RFC 8972 §4.8 covers only the Sequence Number of the base packet (the base HMAC
    # of RFC 8762 §4.4 protects the rest in authenticated mode).
    area = append_hmac_tlv(_base(), b"", KEY)
    other_ssid = encode_sender(SenderPacket(0x01020304, 99, ErrorEstimate.from_int(1), ssid=8))
    assert verify_hmac_tlv(other_ssid, area, KEY)


def test_the_hmac_tlv_own_flags_are_not_covered() -> None:
    # RFC 8972 §4.8 covers the TLVs *preceding* the HMAC TLV: a Reflector setting U/M/I
    # in the HMAC TLV itself does not invalidate it.
    area = bytearray(append_hmac_tlv(_base(), b"", KEY))
    area[0] |= TlvFlag.I
    assert verify_hmac_tlv(_base(), bytes(area), KEY)


def test_extra_padding_may_follow_the_hmac_tlv_uncovered() -> None:
    area = append_hmac_tlv(_base(), MicroSessionId(1, 1).to_tlv().encode(), KEY)
    padded = area + ExtraPadding(b"\xaa" * 8).to_tlv().encode()
    assert verify_hmac_tlv(_base(), padded, KEY)
    changed = area + ExtraPadding(b"\xbb" * 8).to_tlv().encode()
    assert verify_hmac_tlv(_base(), changed, KEY)


def test_hmac_tlv_in_the_wrong_place_fails() -> None:
    area = append_hmac_tlv(_base(), b"", KEY)
    assert not verify_hmac_tlv(_base(), area + MicroSessionId(1, 1).to_tlv().encode(), KEY)
    assert not verify_hmac_tlv(_base(), area + area, KEY)  # two HMAC TLVs


def test_verify_refuses_without_raising() -> None:
    assert not verify_hmac_tlv(_base(), b"", KEY)  # no HMAC TLV at all
    assert not verify_hmac_tlv(_base(), b"\x80\x08\x00", KEY)  # truncated
    assert not verify_hmac_tlv(_base(), Tlv(8, 0, b"\0" * 8).encode(), KEY)  # short HMAC
    assert not verify_hmac_tlv(b"\0", append_hmac_tlv(_base(), b"", KEY), KEY)


def test_append_refuses_a_malformed_area() -> None:
    with pytest.raises(TruncatedError):
        append_hmac_tlv(_base(), b"\x80\x01\x00\x05", KEY)


def test_reflector_flags_on_the_hmac_tlv() -> None:
    area = append_hmac_tlv(_base(), b"", KEY, flags=0)
    assert area[0] == 0
    assert verify_hmac_tlv(_base(), area, KEY)
