"""Fuzz invariant for the Session-Sender's reply path (RFC 8762 §4.2, RFC 8972 §3, §4.8).

Replies from a real reflector (authenticated with an HMAC TLV, and unauthenticated; SSID
kept or zeroed as an RFC 8762-only reflector would), mutated byte by byte and cut at
every length, are handed to sessions in default and strict SSID modes. ``receive`` and
``claims`` never raise; every reply is a result, a duplicate or one counted drop; a result
in authenticated mode always came with an HMAC TLV that verifies; with ``strict_ssid`` no
reply with SSID 0 is ever a result.
"""

from __future__ import annotations

from ipaddress import IPv6Address

from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.stamp import _events as ev
from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig, SenderSession
from sixlab.wire import stamp as wire
from sixlab.wire import stamp_auth
from sixlab.wire import stamp_tlv as t

KEY = b"fuzz-sender-key"
T0 = 1_800_000_000 * 1_000_000_000
MS = 1_000_000
RP = t.ReturnPath((t.Srv6SegmentList((IPv6Address("fc00::1"),)),)).to_tlv().encode()


def _session(key: bytes | None, strict: bool) -> tuple[SenderSession, list[bytes]]:
    cfg = SenderConfig(
        ssid=9, interval_ns=MS, count=4, key=key, tlvs=RP if key else b"", strict_ssid=strict
    )
    session = SenderSession(cfg)
    session.start(T0)
    for i in range(1, 4):
        session.handle_timer(T0 + i * MS)
    return session, session.datagrams_to_send()


def _replies(key: bytes | None, sent: list[bytes], zero_ssid: bool) -> list[bytes]:
    r = Reflector()
    r.add_session(ReflectorSessionConfig(ssid=9, key=key))
    out = []
    for packet in sent:
        reply = r.reflect(packet, T0 + 5 * MS, lambda: T0 + 6 * MS, 64)
        assert reply is not None
        data = reply.payload
        if zero_ssid:
            at = 26 if key else 14
            data = data[:at] + b"\0\0" + data[at + 2 :]
            if key:
                data = stamp_auth.sign(data, key)
        out.append(data)
    return out


@settings(max_examples=150, deadline=None)
@given(
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4),
)
def test_any_reply_is_a_result_a_duplicate_or_a_counted_drop(
    authenticated: bool, strict: bool, zero_ssid: bool, flips: list[tuple[int, int]]
) -> None:
    key = KEY if authenticated else None
    session, sent = _session(key, strict)
    list(iter(session.next_event, None))
    for good in _replies(key, sent, zero_ssid):
        bad = bytearray(good)
        for index, value in flips:
            bad[index % len(bad)] = value
        for data in (bytes(bad), good, *(bytes(bad[:end]) for end in range(0, len(bad), 7))):
            session.claims(data)
            before = (
                session.counters.received,
                session.counters.duplicates,
                sum(session.counters.dropped.values()),
            )
            session.receive(data, T0 + 7 * MS)
            after = (
                session.counters.received,
                session.counters.duplicates,
                sum(session.counters.dropped.values()),
            )
            assert sum(after) == sum(before) + 1
            for event in iter(session.next_event, None):
                if not isinstance(event, ev.StampResult):
                    continue
                ssid = data[26:28] if authenticated else data[14:16]
                assert not (strict and ssid == b"\0\0")
                if authenticated:
                    assert stamp_auth.verify(data, KEY)
                    area = data[wire.AUTH_PACKET_SIZE :]
                    assert t.verify_hmac_tlv(data[:4], area, KEY)
