"""Fuzz invariant for the Session-Reflector (RFC 8762 §4.3, RFC 8972 §4).

Random bytes, and Session-Sender packets (unauthenticated and authenticated, with random
TLV areas) mutated byte by byte, are fed whole and as every prefix to reflectors holding
a mix of sessions. ``reflect`` must never raise; every reply has the request's size (a
full 44-byte base packet for a 14..43-byte request), echoes the request's Seq, carries
T2 as given and T3 as the one clock reading it took; and the counters always balance:
received == reflected + the drops by reason. In an authenticated session the reply leaves
by the configured path unless the request's HMAC TLV verifies (RFC 8972 §4.8): no
mutation of a TLV area makes the reflector obey a Return Path it could not verify.
"""

from __future__ import annotations

import contextlib
from ipaddress import IPv4Address, IPv6Address

from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.stamp.reflector import (
    PacketContext,
    Reflection,
    Reflector,
    ReflectorMode,
    ReflectorSessionConfig,
    ReturnPath,
)
from sixlab.wire import stamp as wire
from sixlab.wire import stamp_auth
from sixlab.wire import stamp_tlv as t
from sixlab.wire._errors import WireError
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat, ns_from_ntp, ns_from_ptp

T2 = 1_800_000_000 * 1_000_000_000
T3 = T2 + 12_345
KEY_A = b"fuzz-key-a"
KEY_B = b"fuzz-key-b"
CONTEXT = PacketContext(IPv6Address("2001:db8::1"), IPv6Address("2001:db8::2"), 40_000, 862)
SEGMENTS = (IPv6Address("fc00::1"), IPv6Address("fc00::2"))

SESSIONS = (
    ReflectorSessionConfig(ssid=1, fmt=TimestampFormat.PTP),
    ReflectorSessionConfig(ssid=2, mode=ReflectorMode.STATEFUL, return_segments=SEGMENTS),
    ReflectorSessionConfig(ssid=3, key=KEY_A),
    ReflectorSessionConfig(ssid=4, key=KEY_B, mode=ReflectorMode.STATEFUL),
    ReflectorSessionConfig(ssid=0),
)
DEFAULTS = (
    None,
    ReflectorSessionConfig(ssid=None, mode=ReflectorMode.STATEFUL),
    ReflectorSessionConfig(ssid=None, key=KEY_A),
)
KEYS = {3: KEY_A, 4: KEY_B}

L = t.LocationSubType
TYPED_TLVS = [
    t.ExtraPadding(b"\0" * 5).to_tlv(),
    t.Location(
        0,
        0,
        (
            t.LocationSubTlv(L.DST_IP, b"\0" * 16, t.TlvFlag.U),
            t.LocationSubTlv(L.SRC_IPV4, b"\0" * 4, t.TlvFlag.U),
            t.LocationSubTlv(L.SRC_IPV6, b"\0" * 16, t.TlvFlag.U),
        ),
    ).to_tlv(),
    t.TimestampInfo(sub_tlvs=b"\x80\x01\x00\x00").to_tlv(),
    t.TimestampInfo().to_tlv(),
    t.ClassOfService(46, 1, 0, 0, 0).to_tlv(),
    t.DirectMeasurement(7, 0, 0).to_tlv(),
    t.AccessReport(1, 1).to_tlv(),
    t.FollowUpTelemetry().to_tlv(),
    t.DestinationNodeAddress(IPv6Address("2001:db8::2")).to_tlv(),
    t.DestinationNodeAddress(IPv4Address("192.0.2.9")).to_tlv(),
    t.ReturnPath((t.ControlCode(1), t.Srv6SegmentList((IPv6Address("fc00::9"),)))).to_tlv(),
    t.ReturnPath((t.ControlCode(0),)).to_tlv(),
    t.ReturnPath((t.ReturnAddress(IPv4Address("192.0.2.1")), t.Tlv(99, 0, b"x"))).to_tlv(),
    t.MicroSessionId(1, 2).to_tlv(),
    t.HmacTlv(b"\0" * 16).to_tlv(),
]

raw_tlvs = st.builds(
    t.Tlv,
    st.integers(0, 255),
    st.integers(0, 255),
    st.binary(max_size=24),
)
tlv_areas = st.tuples(
    st.lists(st.one_of(st.sampled_from(TYPED_TLVS), raw_tlvs), max_size=4),
    st.binary(max_size=6),  # junk after the TLVs: stray bytes or a runaway Length
).map(lambda parts: t.encode_tlvs(parts[0]) + parts[1])

sender_fields = st.tuples(
    st.integers(0, 0xFFFF_FFFF),  # Seq
    st.integers(0, (1 << 64) - 1),  # Timestamp
    st.integers(0, 0xFFFF),  # Error Estimate, Multiplier 0 included
    st.sampled_from([0, 1, 2, 3, 4, 5, 0xFFFF]),  # SSID: sessions and strangers
)


@st.composite
def unauth_packets(draw: st.DrawFn) -> bytes:
    seq, ts, ee, ssid = draw(sender_fields)
    return wire.SENDER_UNAUTH.pack(seq, ts, ee, ssid) + draw(tlv_areas)


@st.composite
def auth_packets(draw: st.DrawFn) -> bytes:
    seq, ts, ee, ssid = draw(sender_fields)
    base = wire.SENDER_AUTH.pack(seq, ts, ee, ssid)
    area = draw(tlv_areas)
    key = draw(st.sampled_from([KEY_A, KEY_B, b"wrong"]))
    if draw(st.booleans()):
        with contextlib.suppress(WireError):  # an area that does not decode stays as it is
            area = t.append_hmac_tlv(base, area, key)
    return stamp_auth.sign(base + area, key)


def mutate(data: bytes, flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for index, value in flips:
        out[index % len(out)] = value
    return bytes(out)


class Clock:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return T3


def check_reply(r: Reflector, data: bytes, hop_limit: int) -> Reflection | None:
    before = r.counters.reflected
    clock = Clock()
    out = r.reflect(data, T2, clock, hop_limit, CONTEXT)  # must never raise
    if out is None:
        assert clock.calls == 0
        assert r.counters.reflected == before
        return None
    assert clock.calls == 1
    assert r.counters.reflected == before + 1
    size = len(data)
    assert len(out.payload) == (size if size >= wire.UNAUTH_PACKET_SIZE else 44)
    authenticated = size >= wire.AUTH_PACKET_SIZE and any(
        stamp_auth.verify(out.payload, key) for key in (KEY_A, KEY_B)
    )
    if authenticated:
        assert any(stamp_auth.verify(data, key) for key in (KEY_A, KEY_B))
        if out.return_path != ReturnPath():  # the authenticated sessions configure none
            key = next(k for k in (KEY_A, KEY_B) if stamp_auth.verify(out.payload, k))
            assert t.verify_hmac_tlv(data[:4], data[wire.AUTH_PACKET_SIZE :], key)
    rep = wire.decode_reflector(out.payload, authenticated=authenticated)
    assert rep.sender_seq == int.from_bytes(data[:4])
    assert rep.ses_sender_ttl == hop_limit
    assert rep.ssid == out.ssid
    assert rep.error_estimate.is_valid
    decode = ns_from_ptp if rep.error_estimate.fmt is TimestampFormat.PTP else ns_from_ntp
    offset = decode(rep.receive_timestamp) - T2  # 0 for NTP, TAI - UTC for PTP
    assert decode(rep.timestamp) - offset == T3
    if out.return_path.segments is not None:
        assert all(isinstance(s, IPv6Address) for s in out.return_path.segments)
    return out


def run(data: bytes, default_index: int, hop_limit: int) -> None:
    r = Reflector(DEFAULTS[default_index])
    for config in SESSIONS:
        r.add_session(config)
    for end in range(len(data) + 1):
        check_reply(r, data[:end], hop_limit)
    c = r.counters
    assert c.received == len(data) + 1
    assert c.received == c.reflected + sum(c.dropped.values())
    per_session = [r.session_counters(s) for s in r.ssids]
    if DEFAULTS[default_index] is not None:
        per_session.append(r.session_counters(None))
    assert sum(sent for sent, _ in per_session) == c.reflected
    for reason, count in c.dropped.items():
        assert sum(d.get(reason, 0) for _, d in per_session) <= count


defaults = st.integers(0, len(DEFAULTS) - 1)
hop_limits = st.integers(0, 255)
flips = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 255)), max_size=4)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=140), defaults, hop_limits)
def test_random_bytes(data: bytes, default_index: int, hop_limit: int) -> None:
    run(data, default_index, hop_limit)


@settings(max_examples=100, deadline=None)
@given(unauth_packets(), flips, defaults, hop_limits)
def test_mutated_unauthenticated_packets(
    data: bytes, changes: list[tuple[int, int]], default_index: int, hop_limit: int
) -> None:
    run(mutate(data, changes), default_index, hop_limit)


@settings(max_examples=100, deadline=None)
@given(auth_packets(), flips, defaults, hop_limits)
def test_mutated_authenticated_packets(
    data: bytes, changes: list[tuple[int, int]], default_index: int, hop_limit: int
) -> None:
    run(mutate(data, changes), default_index, hop_limit)


@settings(max_examples=100, deadline=None)
@given(st.one_of(unauth_packets(), auth_packets()), defaults, hop_limits)
def test_whole_packets_are_answered_at_full_size(
    data: bytes, default_index: int, hop_limit: int
) -> None:
    """Unmutated: a packet for a known session with a valid Multiplier gets its reply."""
    run(data, default_index, hop_limit)
    r = Reflector(DEFAULTS[default_index])
    for config in SESSIONS:
        r.add_session(config)
    out = r.reflect(data, T2, Clock(), hop_limit, CONTEXT)
    if out is not None:
        assert len(out.payload) == len(data)


def test_counts_are_exact_on_a_known_mix() -> None:
    """Not random: each drop reason once, so a miscount cannot hide in the fuzz."""
    r = Reflector()
    for config in SESSIONS:
        r.add_session(config)
    ee = ErrorEstimate(multiplier=1).to_int()
    good = wire.SENDER_UNAUTH.pack(1, 0, ee, 1)
    auth = stamp_auth.sign(wire.SENDER_AUTH.pack(1, 0, ee, 3), KEY_A)
    packets = [
        good,
        good[:13],  # too short
        wire.SENDER_UNAUTH.pack(1, 0, ee & ~0xFF, 2),  # Multiplier 0
        wire.SENDER_UNAUTH.pack(1, 0, ee, 77),  # no session
        mutate(auth, [(20, 1)]),  # HMAC fails
        auth,
        good + t.ReturnPath((t.ControlCode(0),)).to_tlv().encode(),  # no reply requested
    ]
    replies = [r.reflect(p, T2, Clock(), 64, CONTEXT) for p in packets]
    assert [x is not None for x in replies] == [True, False, False, False, False, True, False]
    assert r.counters.received == 7
    assert r.counters.reflected == 2
    assert {k.value: v for k, v in r.counters.dropped.items()} == {
        "too-short": 1,
        "multiplier-zero": 1,
        "no-session": 1,
        "hmac-failed": 1,
        "no-reply-requested": 1,
    }


def test_every_typed_tlv_keeps_the_size_in_every_session() -> None:
    """The seeds one by one and all together, so no TLV type depends on the draw."""
    ee = ErrorEstimate(multiplier=1).to_int()
    areas = [tlv.encode() for tlv in TYPED_TLVS] + [t.encode_tlvs(TYPED_TLVS)]
    resigned = 0
    for default_index in range(len(DEFAULTS)):
        for area in areas:
            for ssid in (0, 1, 2, 3, 4, 9):
                key = KEYS.get(ssid, KEY_A)
                unauth = wire.SENDER_UNAUTH.pack(5, 0, ee, ssid) + area
                auth = wire.SENDER_AUTH.pack(5, 0, ee, ssid)
                auth = stamp_auth.sign(auth + t.append_hmac_tlv(auth, area, key), key)
                for data in (unauth, auth):
                    r = Reflector(DEFAULTS[default_index]) if ssid == 9 else full()
                    out = check_reply(r, data, 64)
                    if data is auth and out is not None and b"\x80\x08\x00\x10" not in area:
                        # One HMAC TLV, ours: re-signed over the reply's Seq (RFC 8972 §4.8).
                        assert t.verify_hmac_tlv(out.payload[:4], out.payload[112:], key)
                        resigned += 1
    assert resigned >= 2 * len(TYPED_TLVS)  # sessions 3 and 4 answered every area


def full() -> Reflector:
    r = Reflector()
    for config in SESSIONS:
        r.add_session(config)
    return r


REDIRECT = t.ReturnPath((t.ReturnAddress(IPv6Address("2001:db8::bad")),)).to_tlv()


@st.composite
def redirecting_auth_packets(draw: st.DrawFn) -> bytes:
    """Authenticated packets for session 3 (base HMAC right) whose TLVs ask for another
    return address, with an HMAC TLV right, wrong, absent or anywhere in the area."""
    seq = draw(st.integers(0, 0xFFFF_FFFF))
    base = wire.SENDER_AUTH.pack(seq, 0, ErrorEstimate(multiplier=1).to_int(), 3)
    tlvs = draw(st.lists(st.one_of(st.sampled_from(TYPED_TLVS[:-1]), raw_tlvs), max_size=3))
    tlvs.insert(draw(st.integers(0, len(tlvs))), REDIRECT)
    area = t.encode_tlvs(tlvs)
    how = draw(st.sampled_from(["right", "wrong key", "absent", "anywhere"]))
    if how == "right":
        area = t.append_hmac_tlv(base, area, KEY_A)
    elif how == "wrong key":
        area = t.append_hmac_tlv(base, area, KEY_B)
    elif how == "anywhere":
        cut = t.encode_tlvs(tlvs[: draw(st.integers(0, len(tlvs)))])
        area = t.append_hmac_tlv(base, cut, KEY_A) + area[len(cut) :]
    return stamp_auth.sign(base + area, KEY_A)


@settings(max_examples=150, deadline=None)
@given(redirecting_auth_packets(), flips)
def test_authenticated_return_path_needs_the_hmac_tlv(
    data: bytes, changes: list[tuple[int, int]]
) -> None:
    for packet in (data, stamp_auth.sign(mutate(data, changes), KEY_A)):
        r = full()
        out = check_reply(r, packet, 64)
        authenticated = out is not None and stamp_auth.verify(out.payload, KEY_A)
        if out is not None and authenticated and out.return_path.address is not None:
            assert t.verify_hmac_tlv(packet[:4], packet[wire.AUTH_PACKET_SIZE :], KEY_A)
