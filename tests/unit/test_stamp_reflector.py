"""The sans-I/O Session-Reflector, packet by packet (RFC 8762 §4.3, RFC 8972 §4, RFC 9503).

Each test builds Session-Sender packets with the wire codecs, hands them to
``Reflector.reflect`` with a recording clock, and reads the reply back with the wire
decoders: fields, sizes, TLV flags, counters.
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address

import pytest

from sixlab.stamp import reflector as reflector_module
from sixlab.stamp._events import DropReason, SessionConfigError
from sixlab.stamp.reflector import (
    PacketContext,
    Reflection,
    Reflector,
    ReflectorMode,
    ReflectorSessionConfig,
    ReturnPath,
)
from sixlab.stamp.sender import DEFAULT_TAI_UTC_OFFSET_NS
from sixlab.wire import stamp as wire
from sixlab.wire import stamp_auth
from sixlab.wire import stamp_tlv as t
from sixlab.wire.timestamp import (
    ErrorEstimate,
    TimestampFormat,
    decode_timestamp,
    encode_timestamp,
    ns_from_ntp,
    ns_from_ptp,
    ntp_from_ns,
    ptp_from_ns,
)

T1 = 1_800_000_000 * 1_000_000_000  # 2027-01-15, Unix ns
T2 = T1 + 3_000_123
T3 = T2 + 41_007
KEY = b"reflector-test-key"
OTHER_KEY = b"some-other-key"
L = t.LocationSubType
EE = ErrorEstimate(synchronized=True, scale=2, multiplier=7)


class Clock:
    """The T3 clock: returns the given readings in turn and counts its calls."""

    def __init__(self, *readings: int) -> None:
        self.readings = list(readings) or [T3]
        self.calls = 0

    def __call__(self) -> int:
        value = self.readings[min(self.calls, len(self.readings) - 1)]
        self.calls += 1
        return value


def sender(
    seq: int = 0,
    ssid: int = 1,
    *,
    tlvs: bytes = b"",
    ee: ErrorEstimate = EE,
    t1_ns: int = T1,
) -> bytes:
    ts = ptp_from_ns(t1_ns) if ee.fmt is TimestampFormat.PTP else ntp_from_ns(t1_ns)
    return wire.encode_sender(wire.SenderPacket(seq, ts, ee, ssid, tlvs))


def auth_sender(
    seq: int = 0, ssid: int = 3, *, tlvs: bytes = b"", key: bytes = KEY, ee: ErrorEstimate = EE
) -> bytes:
    pkt = wire.SenderPacket(seq, ntp_from_ns(T1), ee, ssid, tlvs)
    return stamp_auth.sign(wire.encode_sender(pkt, authenticated=True), key)


def reflect(
    r: Reflector,
    data: bytes,
    *,
    clock: Clock | None = None,
    hop_limit: int = 64,
    context: PacketContext | None = None,
) -> Reflection | None:
    return r.reflect(data, T2, clock or Clock(), hop_limit, context)


def answered(
    r: Reflector,
    data: bytes,
    *,
    authenticated: bool = False,
    clock: Clock | None = None,
    hop_limit: int = 64,
    context: PacketContext | None = None,
) -> tuple[Reflection, wire.ReflectorPacket]:
    out = reflect(r, data, clock=clock, hop_limit=hop_limit, context=context)
    assert out is not None
    return out, wire.decode_reflector(out.payload, authenticated=authenticated)


def only(area: bytes) -> t.Tlv:
    (tlv,) = t.decode_tlvs(area)
    return tlv


def make(
    *configs: ReflectorSessionConfig, default: ReflectorSessionConfig | None = None
) -> Reflector:
    r = Reflector(default)
    for config in configs:
        r.add_session(config)
    return r


def assert_balanced(r: Reflector) -> None:
    c = r.counters
    assert c.received == c.reflected + sum(c.dropped.values())


# ------------------------------------------------------------------ modes and sessions


def test_stateless_reply_seq_is_sender_seq_and_sender_fields_are_echoed() -> None:
    r = make(ReflectorSessionConfig(ssid=1))
    for seq in (7, 3, 0xFFFF_FFFF, 1000):
        out, rep = answered(r, sender(seq, 1, t1_ns=T1 + seq))
        assert rep.seq == seq
        assert rep.sender_seq == seq
        assert ns_from_ntp(rep.sender_timestamp) == T1 + seq
        assert rep.sender_error_estimate == EE
        assert rep.ssid == out.ssid == 1
        assert len(out.payload) == 44
    assert r.session_counters(1) == (4, {})


def test_stateful_counts_its_own_replies_from_zero_per_session() -> None:
    r = make(
        ReflectorSessionConfig(ssid=1, mode=ReflectorMode.STATEFUL),
        ReflectorSessionConfig(ssid=2, mode=ReflectorMode.STATEFUL),
    )
    got: dict[int, list[tuple[int, int]]] = {1: [], 2: []}
    for sender_seq, ssid in [(100, 1), (50, 2), (101, 1), (103, 1), (51, 2)]:
        _, rep = answered(r, sender(sender_seq, ssid))
        got[ssid].append((rep.seq, rep.sender_seq))
    assert got[1] == [(0, 100), (1, 101), (2, 103)]
    assert got[2] == [(0, 50), (1, 51)]


def test_stateful_counter_does_not_advance_on_drops() -> None:
    r = make(ReflectorSessionConfig(ssid=1, mode=ReflectorMode.STATEFUL))
    assert answered(r, sender(10))[1].seq == 0
    assert reflect(r, sender(11, ee=ErrorEstimate(multiplier=0))) is None
    assert answered(r, sender(12))[1].seq == 1


def test_default_session_answers_every_other_ssid() -> None:
    r = make(
        ReflectorSessionConfig(ssid=5, mode=ReflectorMode.STATEFUL),
        default=ReflectorSessionConfig(ssid=None),
    )
    out, rep = answered(r, sender(40, 5))
    assert (rep.seq, out.ssid) == (0, 5)  # the SSID's own (stateful) session wins
    for ssid in (9, 0, 0xFFFF):
        out, rep = answered(r, sender(41, ssid))
        assert (rep.seq, rep.ssid, out.ssid) == (41, ssid, ssid)  # default: stateless
    assert r.session_counters(5) == (1, {})
    assert r.session_counters(None) == (3, {})
    r.set_default(None)
    assert reflect(r, sender(42, 9)) is None
    assert r.counters.dropped == {DropReason.NO_SESSION: 1}
    assert_balanced(r)


def test_sessions_are_added_removed_and_listed() -> None:
    r = make(ReflectorSessionConfig(ssid=4, key=KEY), ReflectorSessionConfig(ssid=2))
    assert r.ssids == [2, 4]
    with pytest.raises(SessionConfigError, match="ssid"):
        r.add_session(ReflectorSessionConfig(ssid=2, key=KEY))  # auth or not, one per SSID
    with pytest.raises(SessionConfigError, match="ssid"):
        r.add_session(ReflectorSessionConfig(ssid=None))
    with pytest.raises(SessionConfigError, match="ssid"):
        r.set_default(ReflectorSessionConfig(ssid=7))
    r.remove_session(2)
    assert r.ssids == [4]
    assert reflect(r, sender(0, 2)) is None
    with pytest.raises(SessionConfigError, match="ssid"):
        r.remove_session(2)
    with pytest.raises(SessionConfigError, match="ssid"):
        r.session_counters(2)
    with pytest.raises(SessionConfigError, match="ssid"):
        r.session_counters(None)  # no default session


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"ssid": -1}, "ssid"),
        ({"ssid": 0x10000}, "ssid"),
        ({"key": b""}, "key"),
        ({"return_segments": ()}, "return_segments"),
        ({"error_estimate": ErrorEstimate(fmt=TimestampFormat.PTP)}, "error_estimate"),
        ({"error_estimate": ErrorEstimate(multiplier=0)}, "error_estimate"),
        ({"sync_source": 256}, "sync_source"),
        ({"timestamp_method": -1}, "timestamp_method"),
    ],
)
def test_session_config_errors_name_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"ssid": 1, **kwargs}
    with pytest.raises(SessionConfigError, match=field):
        ReflectorSessionConfig(**args)  # type: ignore[arg-type]


# ------------------------------------------------------------------ timestamps and TTL


def test_t2_is_given_and_t3_is_one_clock_reading_per_reply() -> None:
    r = make(ReflectorSessionConfig(ssid=1))
    clock = Clock(T3, T3 + 500_000)
    for _ in range(2):
        reflect(r, sender(ee=ErrorEstimate(multiplier=0)), clock=clock)  # dropped
        reflect(r, sender(0, 99), clock=clock)  # no session
    assert clock.calls == 0  # never read for a packet that gets no reply
    _, first = answered(r, sender(1), clock=clock)
    assert clock.calls == 1
    _, second = answered(r, sender(2), clock=clock)
    assert clock.calls == 2
    assert ns_from_ntp(first.receive_timestamp) == T2
    assert ns_from_ntp(first.timestamp) == T3
    assert ns_from_ntp(second.receive_timestamp) == T2
    assert ns_from_ntp(second.timestamp) == T3 + 500_000


def test_ptp_session_writes_tai_and_sets_z() -> None:
    offset = 36 * 1_000_000_000
    r = make(ReflectorSessionConfig(ssid=1, fmt=TimestampFormat.PTP, tai_utc_offset_ns=offset))
    _, rep = answered(r, sender(0))
    assert rep.error_estimate.fmt is TimestampFormat.PTP
    assert ns_from_ptp(rep.receive_timestamp) == T2 + offset
    assert ns_from_ptp(rep.timestamp) == T3 + offset
    default = make(ReflectorSessionConfig(ssid=1, fmt=TimestampFormat.PTP))
    _, rep = answered(default, sender(0))
    assert ns_from_ptp(rep.receive_timestamp) == T2 + DEFAULT_TAI_UTC_OFFSET_NS


def test_reply_carries_the_session_error_estimate() -> None:
    mine = ErrorEstimate(synchronized=True, scale=10, multiplier=3)
    r = make(ReflectorSessionConfig(ssid=1, error_estimate=mine), ReflectorSessionConfig(ssid=2))
    assert answered(r, sender(0, 1))[1].error_estimate == mine
    fallback = answered(r, sender(0, 2))[1].error_estimate
    assert fallback.is_valid
    assert fallback.fmt is TimestampFormat.NTP
    assert fallback.error_ns >= 1000


@pytest.mark.parametrize("hop_limit", [0, 1, 63, 255])
def test_ses_sender_ttl_is_the_hop_limit(hop_limit: int) -> None:
    r = make(ReflectorSessionConfig(ssid=1), ReflectorSessionConfig(ssid=3, key=KEY))
    assert answered(r, sender(), hop_limit=hop_limit)[1].ses_sender_ttl == hop_limit
    _, rep = answered(r, auth_sender(), authenticated=True, hop_limit=hop_limit)
    assert rep.ses_sender_ttl == hop_limit


# ------------------------------------------------------------------ sizes


def test_reply_has_the_request_size_and_copies_the_tlvs() -> None:
    r = make(ReflectorSessionConfig(ssid=1))
    pad = t.ExtraPadding(bytes(range(60))).to_tlv().encode()
    unknown = t.Tlv(200, t.TlvFlag.U, b"opaque-value").encode()
    request = sender(5, tlvs=pad + unknown)
    out, rep = answered(r, request)
    assert len(out.payload) == len(request)
    reply_pad, reply_unknown = t.decode_tlvs(rep.tlvs)
    assert reply_pad == t.Tlv(t.TlvType.EXTRA_PADDING, 0, bytes(range(60)))
    assert reply_unknown == t.Tlv(200, t.TlvFlag.U, b"opaque-value")


@pytest.mark.parametrize("size", [14, 15, 16, 17, 30, 43])
def test_short_twamp_light_packet_gets_a_full_base_packet(size: int) -> None:
    r = make(default=ReflectorSessionConfig(ssid=None))
    full = sender(0xA1B2C3D4, 0x1234)
    out, rep = answered(r, full[:size])
    assert len(out.payload) == wire.UNAUTH_PACKET_SIZE
    assert rep.tlvs == b""
    assert rep.sender_seq == rep.seq == 0xA1B2C3D4
    assert ns_from_ntp(rep.sender_timestamp) == T1
    assert rep.sender_error_estimate == EE
    # The SSID is read where the packet holds it (RFC 8972 §3), else 0.
    assert rep.ssid == (0x1234 if size >= 16 else 0)


def test_short_packet_reaches_its_ssid_session() -> None:
    r = make(ReflectorSessionConfig(ssid=0x1234, mode=ReflectorMode.STATEFUL))
    _, rep = answered(r, sender(77, 0x1234)[:20])
    assert (rep.seq, rep.sender_seq) == (0, 77)
    assert reflect(r, sender(77, 0x1234)[:15]) is None  # SSID cut off: reads as 0
    assert r.counters.dropped == {DropReason.NO_SESSION: 1}


# ------------------------------------------------------------------ TLV processing


def test_u_cleared_on_tlvs_acted_on_kept_on_the_others() -> None:
    r = make(ReflectorSessionConfig(ssid=1))
    acted_on = [t.ExtraPadding(b"\0" * 4).to_tlv(), t.TimestampInfo().to_tlv()]
    # Parsed but not acted on here: Class of Service without the received Traffic
    # Class, Follow-Up Telemetry before any transmit time is known, Access Report and
    # Micro-session ID (nothing acts on them).
    not_acted_on = [
        t.ClassOfService(dscp1=46).to_tlv(),
        t.AccessReport(1, 0).to_tlv(),
        t.FollowUpTelemetry().to_tlv(),
        t.MicroSessionId(1, 2).to_tlv(),
    ]
    unknown = [t.Tlv(176, t.TlvFlag.U, b"fcfs"), t.Tlv(252, t.TlvFlag.U | 0x01, b"")]
    request = sender(tlvs=t.encode_tlvs(acted_on + not_acted_on + unknown))
    out, rep = answered(r, request)
    got = t.decode_tlvs(rep.tlvs)
    assert len(out.payload) == len(request)
    assert [tlv.flags for tlv in got] == [0, 0] + [0x80] * len(not_acted_on) + [0x80, 0x81]
    assert [(tlv.type, tlv.value) for tlv in got[2:]] == [
        (x.type, x.value) for x in not_acted_on + unknown
    ]


def test_known_tlv_with_a_bad_value_gets_m() -> None:
    r = make(ReflectorSessionConfig(ssid=1))
    bad = t.Tlv(t.TlvType.DIRECT_MEASUREMENT, t.TlvFlag.U, b"\1" * 5)  # needs 12 bytes
    good = t.ExtraPadding(b"xy").to_tlv()
    _, rep = answered(r, sender(tlvs=t.encode_tlvs([bad, good])))
    got_bad, got_good = t.decode_tlvs(rep.tlvs)
    assert got_bad.flags & t.TlvFlag.M
    assert got_bad.value == bad.value
    assert got_good.flags == 0


def test_location_filled_from_the_packet_context_ipv6() -> None:
    r = make(ReflectorSessionConfig(ssid=1))
    ctx = PacketContext(
        src=IPv6Address("2001:db8::1"),
        dst=IPv6Address("2001:db8::2"),
        src_port=40000,
        dst_port=862,
    )
    subs = (
        t.LocationSubTlv(L.DST_IP, b"\0" * 16, t.TlvFlag.U),  # generic: answered as IPv6
        t.LocationSubTlv(L.SRC_IP, b"\0" * 16, t.TlvFlag.U),
        t.LocationSubTlv(L.DST_IPV6, b"\0" * 16, t.TlvFlag.U),  # specific, right family
        t.LocationSubTlv(L.SRC_IPV4, b"\0" * 4, t.TlvFlag.U),  # wrong family: left alone
        t.LocationSubTlv(L.DST_IP, b"\0" * 8, t.TlvFlag.U),  # too small: left alone
        t.LocationSubTlv(L.SRC_MAC, b"\0" * 8, t.TlvFlag.U),  # not an address
    )
    request = sender(tlvs=t.Location(0, 0, subs).to_tlv().encode())
    out, rep = answered(r, request, context=ctx)
    assert len(out.payload) == len(request)
    tlv = only(rep.tlvs)
    assert tlv.flags == 0
    loc = t.Location.from_tlv(tlv)
    assert (loc.dest_port, loc.src_port) == (862, 40000)
    got = [(s.type, s.address, s.flags) for s in loc.sub_tlvs]
    assert got[:3] == [
        (L.DST_IPV6, ctx.dst, 0),
        (L.SRC_IPV6, ctx.src, 0),
        (L.DST_IPV6, ctx.dst, 0),
    ]
    assert loc.sub_tlvs[3:] == subs[3:]


def test_location_filled_from_the_packet_context_ipv4() -> None:
    r = make(ReflectorSessionConfig(ssid=1))
    ctx = PacketContext(
        src=IPv4Address("192.0.2.1"), dst=IPv4Address("198.51.100.7"), src_port=1, dst_port=2
    )
    subs = (
        t.LocationSubTlv(L.DST_IP, b"\0" * 16, t.TlvFlag.U),  # room for IPv6, holds IPv4
        t.LocationSubTlv(L.SRC_IPV4, b"\0" * 4, t.TlvFlag.U),
    )
    _, rep = answered(r, sender(tlvs=t.Location(0, 0, subs).to_tlv().encode()), context=ctx)
    loc = t.Location.from_tlv(only(rep.tlvs))
    dst, src = loc.sub_tlvs
    assert (dst.type, dst.address, dst.value[4:]) == (L.DST_IPV4, ctx.dst, b"\0" * 12)
    assert (src.type, src.address) == (L.SRC_IPV4, ctx.src)
    assert (loc.dest_port, loc.src_port) == (2, 1)


def test_timestamp_information_reports_the_session_config() -> None:
    r = make(
        ReflectorSessionConfig(
            ssid=1, sync_source=t.SyncSource.PTP, timestamp_method=t.TimestampMethod.HW_ASSIST
        ),
        ReflectorSessionConfig(ssid=2),
    )
    request = t.TimestampInfo().to_tlv().encode()
    tlv = only(answered(r, sender(0, 1, tlvs=request))[1].tlvs)
    assert tlv.flags == 0
    assert tlv.value == bytes([2, 1, 2, 1])
    # The default describes what a user-space reflector is: NTP-synced, software stamps.
    info = t.TimestampInfo.from_tlv(only(answered(r, sender(0, 2, tlvs=request))[1].tlvs))
    assert (info.sync_src_in, info.ts_method_in) == (t.SyncSource.NTP, t.TimestampMethod.SW_LOCAL)
    assert (info.sync_src_out, info.ts_method_out) == (info.sync_src_in, info.ts_method_in)


def test_timestamp_information_with_sub_tlvs_keeps_the_packet_size() -> None:
    r = make(ReflectorSessionConfig(ssid=1))
    request = sender(tlvs=t.TimestampInfo(sub_tlvs=b"\x80\x01\x00\x02ab").to_tlv().encode())
    out, rep = answered(r, request)
    assert len(out.payload) == len(request)
    info = t.TimestampInfo.from_tlv(only(rep.tlvs))
    assert info.sub_tlvs == b"\x80\x01\x00\x02ab"


def test_direct_measurement_counters() -> None:
    r = make(ReflectorSessionConfig(ssid=1))

    def dm(s_txc: int, *, ee: ErrorEstimate = EE) -> bytes:
        return sender(s_txc, tlvs=t.DirectMeasurement(s_txc, 0, 0).to_tlv().encode(), ee=ee)

    # Each counter counts up to and including the packet that carries it.
    first = t.DirectMeasurement.from_tlv(only(answered(r, dm(1))[1].tlvs))
    assert (first.s_txc, first.r_rxc, first.r_txc) == (1, 1, 1)
    assert reflect(r, dm(2, ee=ErrorEstimate(multiplier=0))) is None  # received, not sent
    third = t.DirectMeasurement.from_tlv(only(answered(r, dm(3))[1].tlvs))
    assert (third.s_txc, third.r_rxc, third.r_txc) == (3, 3, 2)


def test_return_path_segment_list_and_address() -> None:
    configured = (IPv6Address("fc00::a"), IPv6Address("fc00::b"))
    r = make(
        ReflectorSessionConfig(ssid=1, return_segments=configured), ReflectorSessionConfig(ssid=2)
    )
    assert answered(r, sender(0, 1))[0].return_path.segments == configured
    assert answered(r, sender(0, 2))[0].return_path.segments is None

    asked = (IPv6Address("fc00::1"), IPv6Address("fc00::2"), IPv6Address("2001:db8::99"))
    rp = t.ReturnPath((t.ControlCode(t.ControlCodeFlag.REPLY_REQUEST), t.Srv6SegmentList(asked)))
    request = sender(0, 1, tlvs=rp.to_tlv().encode())
    out, rep = answered(r, request)
    assert out.return_path.segments == asked  # the TLV overrides the configured list
    assert out.return_path.address is None
    assert len(out.payload) == len(request)
    assert only(rep.tlvs).flags == 0

    addr = IPv6Address("2001:db8::55")
    out, _ = answered(
        r, sender(0, 2, tlvs=t.ReturnPath((t.ReturnAddress(addr),)).to_tlv().encode())
    )
    assert out.return_path.address == addr


def test_return_path_without_reply_request_gets_no_reply() -> None:
    r = make(ReflectorSessionConfig(ssid=1, mode=ReflectorMode.STATEFUL))
    clock = Clock()
    one_way = t.ReturnPath((t.ControlCode(0),)).to_tlv().encode()
    assert reflect(r, sender(0, tlvs=one_way), clock=clock) is None
    assert clock.calls == 0
    assert r.counters.dropped == {DropReason.NO_REPLY_REQUESTED: 1}
    assert r.session_counters(1) == (0, {DropReason.NO_REPLY_REQUESTED: 1})
    assert answered(r, sender(1))[1].seq == 0  # the stateful count skipped it
    assert_balanced(r)


def test_destination_node_address_understood_only_when_it_matches() -> None:
    r = make(ReflectorSessionConfig(ssid=1))
    ctx = PacketContext(IPv6Address("2001:db8::1"), IPv6Address("2001:db8::2"), 5000, 862)
    mine = t.DestinationNodeAddress(ctx.dst).to_tlv().encode()
    other = t.DestinationNodeAddress(IPv6Address("2001:db8::3")).to_tlv().encode()
    assert only(answered(r, sender(tlvs=mine), context=ctx)[1].tlvs).flags == 0
    assert only(answered(r, sender(tlvs=other), context=ctx)[1].tlvs).flags == t.TlvFlag.U


def test_tlv_running_past_the_end_gets_m_and_is_copied() -> None:
    r = make(ReflectorSessionConfig(ssid=1))
    good = t.ExtraPadding(b"\xaa" * 4).to_tlv().encode()
    runaway = bytes([t.TlvFlag.U, t.TlvType.EXTRA_PADDING]) + (100).to_bytes(2) + b"\xbb" * 6
    request = sender(tlvs=good + runaway)
    out, rep = answered(r, request)
    assert len(out.payload) == len(request)
    assert rep.tlvs[: len(good)] == bytes([0]) + good[1:]  # well formed: processed
    tail = rep.tlvs[len(good) :]
    assert tail[0] == t.TlvFlag.U | t.TlvFlag.M
    assert tail[1:] == runaway[1:]


@pytest.mark.parametrize("stray", [b"\x80", b"\x80\x01", b"\x80\x01\x00"])
def test_stray_bytes_after_the_tlvs_are_marked_and_copied(stray: bytes) -> None:
    r = make(ReflectorSessionConfig(ssid=1))
    request = sender(tlvs=stray)
    out, rep = answered(r, request)
    assert len(out.payload) == len(request)
    assert rep.tlvs == bytes([stray[0] | t.TlvFlag.M]) + stray[1:]


# ------------------------------------------------------------------ authentication


def test_authenticated_reply_is_signed_and_fields_are_right() -> None:
    r = make(ReflectorSessionConfig(ssid=3, key=KEY, mode=ReflectorMode.STATEFUL))
    out, rep = answered(r, auth_sender(900, 3), authenticated=True)
    assert len(out.payload) == wire.AUTH_PACKET_SIZE
    assert stamp_auth.verify(out.payload, KEY)
    assert not stamp_auth.verify(out.payload, OTHER_KEY)
    assert (rep.seq, rep.sender_seq, rep.ssid) == (0, 900, 3)
    assert ns_from_ntp(rep.sender_timestamp) == T1
    assert ns_from_ntp(rep.receive_timestamp) == T2
    assert ns_from_ntp(rep.timestamp) == T3


def test_hmac_tlv_is_resigned_over_the_reply_seq() -> None:
    r = make(ReflectorSessionConfig(ssid=3, key=KEY, mode=ReflectorMode.STATEFUL))
    base = wire.encode_sender(wire.SenderPacket(900, ntp_from_ns(T1), EE, 3), authenticated=True)
    area = t.append_hmac_tlv(base, t.ExtraPadding(b"pp").to_tlv().encode(), KEY)
    request = stamp_auth.sign(base + area, KEY)
    out, rep = answered(r, request, authenticated=True)
    assert len(out.payload) == len(request)
    assert stamp_auth.verify(out.payload, KEY)
    tlvs = t.decode_tlvs(rep.tlvs)
    assert [x.flags for x in tlvs] == [0, 0]  # both understood, integrity good
    assert t.verify_hmac_tlv(out.payload[:4], rep.tlvs, KEY)
    # Reply Seq 0 differs from the request's 900: an unchanged HMAC TLV would not verify.
    assert not t.verify_hmac_tlv(request[:4], rep.tlvs, KEY)


def test_bad_hmac_tlv_gets_i_in_an_authenticated_session() -> None:
    r = make(ReflectorSessionConfig(ssid=3, key=KEY))
    base = wire.encode_sender(wire.SenderPacket(1, ntp_from_ns(T1), EE, 3), authenticated=True)
    area = t.append_hmac_tlv(base, b"", OTHER_KEY)  # HMAC TLV under the wrong key
    _, rep = answered(r, stamp_auth.sign(base + area, KEY), authenticated=True)
    assert only(rep.tlvs).flags == t.TlvFlag.U | t.TlvFlag.I  # not processed: U stays


@pytest.mark.parametrize("index", [0, 5, 20, 26, 27, 60, 95, 96, 111])
def test_tampered_authenticated_packet_is_dropped(index: int) -> None:
    r = make(ReflectorSessionConfig(ssid=3, key=KEY))
    tampered = bytearray(auth_sender(1, 3))
    tampered[index] ^= 0x01
    clock = Clock()
    assert reflect(r, bytes(tampered), clock=clock) is None
    assert clock.calls == 0
    if index in (26, 27):  # the SSID itself: no session is named any more
        assert r.counters.dropped == {DropReason.NO_SESSION: 1}
        assert r.session_counters(3) == (0, {})
    else:
        assert r.counters.dropped == {DropReason.HMAC_FAILED: 1}
        assert r.session_counters(3) == (0, {DropReason.HMAC_FAILED: 1})
    assert_balanced(r)


def test_wrong_key_is_dropped_and_multiplier_zero_after_hmac() -> None:
    r = make(ReflectorSessionConfig(ssid=3, key=KEY))
    assert reflect(r, auth_sender(1, 3, key=OTHER_KEY)) is None
    assert reflect(r, auth_sender(2, 3, ee=ErrorEstimate(multiplier=0))) is None
    assert r.session_counters(3) == (
        0,
        {DropReason.HMAC_FAILED: 1, DropReason.MULTIPLIER_ZERO: 1},
    )


def test_authenticated_and_unauthenticated_sessions_side_by_side() -> None:
    r = make(
        ReflectorSessionConfig(ssid=1),
        ReflectorSessionConfig(ssid=3, key=KEY),
        ReflectorSessionConfig(ssid=4, key=OTHER_KEY, mode=ReflectorMode.STATEFUL),
    )
    out, rep = answered(r, sender(10, 1))
    assert (len(out.payload), rep.ssid, rep.sender_seq) == (44, 1, 10)
    # An unauthenticated packet as long as an authenticated one still goes to session 1.
    long_unauth = sender(11, 1, tlvs=t.ExtraPadding(b"\0" * 80).to_tlv().encode())
    out, rep = answered(r, long_unauth)
    assert (len(out.payload), rep.sender_seq) == (len(long_unauth), 11)
    for ssid, key in ((3, KEY), (4, OTHER_KEY)):
        out, rep = answered(r, auth_sender(12, ssid, key=key), authenticated=True)
        assert stamp_auth.verify(out.payload, key)
        assert (rep.ssid, rep.sender_seq) == (ssid, 12)
    # An unauthenticated packet naming an authenticated session is not answered.
    assert reflect(r, sender(13, 3)) is None
    assert r.counters.dropped == {DropReason.AUTH_REQUIRED: 1}
    assert r.session_counters(1) == (2, {})
    assert r.session_counters(3) == (1, {DropReason.AUTH_REQUIRED: 1})
    assert_balanced(r)


def test_authenticated_default_session() -> None:
    r = make(ReflectorSessionConfig(ssid=1), default=ReflectorSessionConfig(ssid=None, key=KEY))
    out, rep = answered(r, auth_sender(5, 77), authenticated=True)
    assert stamp_auth.verify(out.payload, KEY)
    assert rep.ssid == 77
    assert reflect(r, sender(6, 77)) is None  # an authenticated default answers no plain packet
    assert answered(r, sender(7, 1))[1].sender_seq == 7
    assert r.session_counters(None) == (1, {})


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("size", range(14))
def test_too_short_is_dropped(size: int) -> None:
    r = make(ReflectorSessionConfig(ssid=1), default=ReflectorSessionConfig(ssid=None))
    clock = Clock()
    assert reflect(r, sender(1, 1)[:size], clock=clock) is None
    assert clock.calls == 0
    assert r.counters.dropped == {DropReason.TOO_SHORT: 1}
    assert r.session_counters(1) == (0, {})
    assert r.session_counters(None) == (0, {})
    assert_balanced(r)


@pytest.mark.parametrize("ssid", [1, 200])
def test_multiplier_zero_is_dropped_and_counted_in_its_session(ssid: int) -> None:
    r = make(ReflectorSessionConfig(ssid=1), default=ReflectorSessionConfig(ssid=None))
    bad = ErrorEstimate(synchronized=True, scale=5, multiplier=0)
    assert reflect(r, sender(1, ssid, ee=bad)) is None
    assert reflect(r, sender(1, ssid, ee=bad)[:20]) is None  # short packets too
    assert r.counters.dropped == {DropReason.MULTIPLIER_ZERO: 2}
    assert r.session_counters(1 if ssid == 1 else None) == (0, {DropReason.MULTIPLIER_ZERO: 2})
    assert_balanced(r)


def test_packet_of_no_session_is_dropped() -> None:
    r = make(ReflectorSessionConfig(ssid=1), ReflectorSessionConfig(ssid=3, key=KEY))
    assert reflect(r, sender(1, 2)) is None
    assert reflect(r, auth_sender(1, 9)) is None
    assert r.counters.dropped == {DropReason.NO_SESSION: 2}
    assert r.session_counters(1) == (0, {})
    assert r.session_counters(3) == (0, {})
    assert_balanced(r)


def test_authenticated_session_cannot_take_ssid_zero() -> None:
    # An unauthenticated packet of 112+ bytes has MBZ zeros where the authenticated SSID
    # sits (26:28): an authenticated SSID 0 would claim it and drop it as hmac-failed.
    with pytest.raises(SessionConfigError, match="ssid: an authenticated session needs a non-zero"):
        ReflectorSessionConfig(ssid=0, key=b"k")
    ReflectorSessionConfig(ssid=0)  # unauthenticated SSID 0 stays allowed
    ReflectorSessionConfig(ssid=None, key=b"k")  # and so does an authenticated default


@pytest.mark.parametrize("key", [None, b"restamp-key"])
@pytest.mark.parametrize("fmt", list(TimestampFormat))
def test_restamp_rewrites_only_t3_and_resigns(key: bytes | None, fmt: TimestampFormat) -> None:
    reflector = Reflector()
    reflector.add_session(ReflectorSessionConfig(ssid=7, key=key, fmt=fmt))
    ee = ErrorEstimate(fmt=fmt, scale=10, multiplier=1)
    pkt = wire.SenderPacket(3, encode_timestamp(T1, fmt), ee, 7, b"\x80\x01\x00\x02ab")
    data = wire.encode_sender(pkt, authenticated=key is not None)
    if key is not None:
        data = stamp_auth.sign(data, key)
    out = reflector.reflect(data, T1 + 10, lambda: T1 + 20, 64)
    assert out is not None
    again = reflector.restamp(out.payload, T1 + 999)
    authed = key is not None
    before = wire.decode_reflector(out.payload, authenticated=authed)
    after = wire.decode_reflector(again, authenticated=authed)
    assert after.timestamp != before.timestamp
    assert decode_timestamp(after.timestamp, fmt) - decode_timestamp(before.timestamp, fmt) == 979
    # Everything else is as it was.
    assert (after.receive_timestamp, after.seq, after.sender_seq, after.tlvs) == (
        before.receive_timestamp,
        before.seq,
        before.sender_seq,
        before.tlvs,
    )
    if key is not None:
        assert stamp_auth.verify(again, key)
    else:
        assert again[:4] == out.payload[:4]
        assert again[12:] == out.payload[12:]


def test_restamp_of_an_unknown_session_changes_nothing() -> None:
    reflector = Reflector()
    payload = bytes(44)
    assert reflector.restamp(payload, T1) == payload
    assert reflector.restamp(b"short", T1) == b"short"


# ------------------------------------------------------------------ sessions are flows

A = PacketContext(IPv6Address("2001:db8::a"), IPv6Address("2001:db8::1"), 40000, 862)
B = PacketContext(IPv6Address("2001:db8::b"), IPv6Address("2001:db8::1"), 40000, 862)


def test_stateful_counter_is_per_flow_not_per_ssid() -> None:
    # RFC 8972 §3: a session is the SSID together with addresses and ports. Two senders
    # using the same SSID must each see their own count from 0.
    r = make(ReflectorSessionConfig(ssid=1, mode=ReflectorMode.STATEFUL))
    seen = []
    for ctx in (A, B, A, A, B):
        out = r.reflect(sender(100), T2, Clock(), 64, flow=ctx.flow)
        assert out is not None
        seen.append(wire.decode_reflector(out.payload).seq)
    assert seen == [0, 0, 1, 2, 1]


def test_flow_key_comes_from_the_context_when_not_given() -> None:
    r = make(ReflectorSessionConfig(ssid=1, mode=ReflectorMode.STATEFUL))
    pad = t.ExtraPadding(b"pp").to_tlv().encode()
    seqs = [answered(r, sender(5, tlvs=pad), context=c)[1].seq for c in (A, B, B)]
    assert seqs == [0, 0, 1]


def test_direct_measurement_counts_per_flow() -> None:
    r = make(ReflectorSessionConfig(ssid=1))
    dm = t.DirectMeasurement(1, 0, 0).to_tlv().encode()
    for _ in range(3):
        answered(r, sender(tlvs=dm), context=A)
    got = t.DirectMeasurement.from_tlv(only(answered(r, sender(tlvs=dm), context=B)[1].tlvs))
    assert (got.r_rxc, got.r_txc) == (1, 1)


def test_flows_are_bounded_oldest_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reflector_module, "MAX_FLOWS", 2)
    r = make(ReflectorSessionConfig(ssid=1, mode=ReflectorMode.STATEFUL))

    def seq(flow: int) -> int:
        out = r.reflect(sender(), T2, Clock(), 64, flow=flow)
        assert out is not None
        return wire.decode_reflector(out.payload).seq

    assert [seq(1), seq(1), seq(2), seq(3)] == [0, 1, 0, 0]  # 3 pushed flow 1 out
    assert seq(1) == 0
    assert seq(3) == 1


# ------------------------------------------------------------------ authenticated TLVs


def auth_with_tlvs(
    area: bytes, *, seq: int = 900, ssid: int = 3, key: bytes = KEY
) -> tuple[bytes, bytes]:
    """An authenticated sender packet carrying ``area`` (base HMAC right) and its base."""
    base = wire.encode_sender(wire.SenderPacket(seq, ntp_from_ns(T1), EE, ssid), authenticated=True)
    return stamp_auth.sign(base + area, key), base


SEGS = (IPv6Address("fc00::66"), IPv6Address("2001:db8::bad"))
REDIRECT = t.ReturnPath(
    (t.ReturnAddress(IPv6Address("2001:db8::bad")), t.Srv6SegmentList(SEGS))
).to_tlv()


def test_return_path_obeyed_when_the_hmac_tlv_verifies() -> None:
    r = make(ReflectorSessionConfig(ssid=3, key=KEY))
    base = wire.encode_sender(wire.SenderPacket(9, ntp_from_ns(T1), EE, 3), authenticated=True)
    request, _ = auth_with_tlvs(t.append_hmac_tlv(base, REDIRECT.encode(), KEY), seq=9)
    out, rep = answered(r, request, authenticated=True)
    assert out.return_path == ReturnPath(SEGS, IPv6Address("2001:db8::bad"))
    assert [x.flags for x in t.decode_tlvs(rep.tlvs)] == [0, 0]
    assert r.counters.integrity_failed == 0


def _bad_areas() -> dict[str, bytes]:
    base = wire.encode_sender(wire.SenderPacket(9, ntp_from_ns(T1), EE, 3), authenticated=True)
    good = t.append_hmac_tlv(base, REDIRECT.encode(), KEY)
    hmac_only = t.append_hmac_tlv(base, b"", KEY)
    pad = t.ExtraPadding(b"xx").to_tlv().encode()
    return {
        "absent": REDIRECT.encode(),
        "wrong key": t.append_hmac_tlv(base, REDIRECT.encode(), OTHER_KEY),
        # Misplaced: an HMAC TLV that covers only what precedes it, followed by the
        # Return Path. Its digest is right for the bytes before it.
        "misplaced": hmac_only + REDIRECT.encode(),
        "misplaced after padding": pad + hmac_only + REDIRECT.encode(),
        "twice": good + t.Tlv(t.TlvType.HMAC, t.TlvFlag.U, bytes(16)).encode(),
        "tampered": good[:-1] + bytes([good[-1] ^ 1]),
        "malformed tail": good + b"\x80\x01\x00\x09",
    }


@pytest.mark.parametrize("case", list(_bad_areas()))
def test_return_path_ignored_and_i_set_when_the_hmac_tlv_fails(case: str) -> None:
    configured = (IPv6Address("fc00::1"),)
    r = make(ReflectorSessionConfig(ssid=3, key=KEY, return_segments=configured))
    area = _bad_areas()[case]
    request, _ = auth_with_tlvs(area, seq=9)
    out, rep = answered(r, request, authenticated=True)
    assert out.return_path == ReturnPath(segments=configured)  # never the TLV's
    assert len(out.payload) == len(request)
    scan = t.scan_tlvs(rep.tlvs)
    assert scan.tlvs
    for tlv in scan.tlvs:  # every TLV came back with I, U untouched, value as sent
        assert tlv.flags & t.TlvFlag.I
        assert tlv.flags & t.TlvFlag.U
    assert stamp_auth.verify(out.payload, KEY)
    assert r.counters.integrity_failed == 1
    assert r.session_integrity_failed(3) == 1


def test_no_reply_request_is_not_obeyed_without_integrity() -> None:
    r = make(ReflectorSessionConfig(ssid=3, key=KEY))
    one_way = t.ReturnPath((t.ControlCode(0),)).to_tlv().encode()
    request, _ = auth_with_tlvs(one_way)
    out, rep = answered(r, request, authenticated=True)  # answered: the TLV was not believed
    assert only(rep.tlvs).flags & t.TlvFlag.I
    assert out.return_path == ReturnPath()


def test_only_extra_padding_needs_no_hmac_tlv() -> None:
    r = make(ReflectorSessionConfig(ssid=3, key=KEY))
    request, _ = auth_with_tlvs(t.ExtraPadding(b"abcd").to_tlv().encode())
    _, rep = answered(r, request, authenticated=True)
    assert only(rep.tlvs).flags == 0
    assert r.counters.integrity_failed == 0


def test_padding_after_the_hmac_tlv_is_allowed_and_uncovered() -> None:
    r = make(ReflectorSessionConfig(ssid=3, key=KEY))
    base = wire.encode_sender(wire.SenderPacket(9, ntp_from_ns(T1), EE, 3), authenticated=True)
    area = t.append_hmac_tlv(base, REDIRECT.encode(), KEY) + t.ExtraPadding(b"zz").to_tlv().encode()
    request, _ = auth_with_tlvs(area, seq=9)
    out, rep = answered(r, request, authenticated=True)
    assert out.return_path.address == IPv6Address("2001:db8::bad")
    assert [x.flags for x in t.decode_tlvs(rep.tlvs)] == [0, 0, 0]
    assert t.verify_hmac_tlv(out.payload[:4], rep.tlvs, KEY)


def test_unauthenticated_packet_naming_an_authenticated_session_is_dropped() -> None:
    # The unauthenticated default session must not answer (and obey the TLVs of) a
    # packet whose SSID belongs to an authenticated session.
    r = make(ReflectorSessionConfig(ssid=3, key=KEY), default=ReflectorSessionConfig(ssid=None))
    assert reflect(r, sender(1, 3, tlvs=REDIRECT.encode())) is None
    assert r.counters.dropped == {DropReason.AUTH_REQUIRED: 1}
    assert r.session_counters(3) == (0, {DropReason.AUTH_REQUIRED: 1})
    assert reflect(r, sender(1, 4)) is not None  # other SSIDs: the default answers
    assert_balanced(r)


# ------------------------------------------------------------------ Class of Service


def test_class_of_service_copies_the_received_dscp_ecn_and_asks_for_dscp1() -> None:
    r = make(ReflectorSessionConfig(ssid=1))
    ctx = PacketContext(A.src, A.dst, 1, 862, tclass=(10 << 2) | 0b01, set_tclass=True)
    out, rep = answered(r, sender(tlvs=t.ClassOfService(dscp1=46).to_tlv().encode()), context=ctx)
    cos = t.ClassOfService.from_tlv(only(rep.tlvs))
    assert (cos.dscp1, cos.dscp2, cos.ecn2, cos.rp) == (46, 10, 1, 0)
    assert only(rep.tlvs).flags == 0
    assert out.tclass == 46 << 2


def test_class_of_service_sets_rp_where_the_plane_cannot_apply_dscp1() -> None:
    r = make(ReflectorSessionConfig(ssid=1))
    ctx = PacketContext(A.src, A.dst, 1, 862, tclass=(34 << 2) | 0b10, set_tclass=False)
    out, rep = answered(r, sender(tlvs=t.ClassOfService(dscp1=46).to_tlv().encode()), context=ctx)
    cos = t.ClassOfService.from_tlv(only(rep.tlvs))
    assert (cos.dscp2, cos.ecn2, cos.rp) == (34, 2, 1)
    assert only(rep.tlvs).flags == 0
    assert out.tclass is None


# ------------------------------------------------------------------ Follow-Up Telemetry


def test_follow_up_reports_the_previous_replys_transmit_time() -> None:
    r = make(ReflectorSessionConfig(ssid=1, mode=ReflectorMode.STATEFUL))
    fu = t.FollowUpTelemetry().to_tlv().encode()
    first, rep1 = answered(r, sender(70, tlvs=fu), context=A)
    assert only(rep1.tlvs).flags == t.TlvFlag.U  # nothing transmitted before
    tx = T3 + 12_345
    r.transmitted(first, tx, t.TimestampMethod.SW_LOCAL)
    _, rep2 = answered(r, sender(71, tlvs=fu), context=A)
    got = only(rep2.tlvs)
    assert got.flags == 0
    follow = t.FollowUpTelemetry.from_tlv(got)
    assert follow.seq == 0  # the stateful reply Seq of the first reply
    assert ns_from_ntp(follow.timestamp) == tx
    assert follow.ts_mode == t.TimestampMethod.SW_LOCAL
    # Another flow has no previous reply of its own.
    _, rep3 = answered(r, sender(5, tlvs=fu), context=B)
    assert only(rep3.tlvs).flags == t.TlvFlag.U
