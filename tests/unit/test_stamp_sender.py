"""The sans-I/O Session-Sender: lifecycle table, timers, matching, drops, PTP (RFC 8762 §4.2).

Time is stepped by hand; replies are made by the real ``Reflector`` or, for broken ones,
by hand with the wire codecs.
"""

from __future__ import annotations

from ipaddress import IPv6Address

import pytest

from sixlab.stamp import _events as ev
from sixlab.stamp._events import DropReason, SessionConfigError, SessionStateError
from sixlab.stamp.batch import receive_one
from sixlab.stamp.reflector import Reflector, ReflectorMode, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig, SenderSession, State
from sixlab.wire import stamp as wire
from sixlab.wire import stamp_auth
from sixlab.wire import stamp_tlv as t
from sixlab.wire.timestamp import (
    ErrorEstimate,
    TimestampFormat,
    ns_from_ntp,
    ns_from_ptp,
    ntp_from_ns,
)

MS = 1_000_000
S = 1_000_000_000
T0 = 1_800_000_000 * S  # 2027-01-15, Unix ns
KEY = b"sender-test-key"


def events(session: SenderSession) -> list[ev.Event]:
    return list(iter(session.next_event, None))


def state_of(session: SenderSession) -> State:
    """The state, read through a call (mypy would narrow ``session.state`` across calls)."""
    return session.state


def drops(session: SenderSession) -> list[DropReason]:
    return [e.reason for e in events(session) if isinstance(e, ev.PacketDropped)]


def reflector_for(config: SenderConfig, **kwargs: object) -> Reflector:
    r = Reflector()
    r.add_session(ReflectorSessionConfig(ssid=config.ssid, key=config.key, **kwargs))  # type: ignore[arg-type]
    return r


def bounce(r: Reflector, payload: bytes, t2: int, t3: int, hop_limit: int = 60) -> bytes:
    out = r.reflect(payload, t2, lambda: t3, hop_limit)
    assert out is not None
    return out.payload


def started(config: SenderConfig, now: int = T0) -> tuple[SenderSession, bytes]:
    """A started session and the first packet it sent."""
    session = SenderSession(config)
    session.start(now)
    (first,) = session.datagrams_to_send()
    return session, first


def reply_by_hand(
    request: bytes,
    *,
    ssid: int | None = None,
    seq: int | None = None,
    sender_seq: int | None = None,
    t1_wire: int | None = None,
    ee: ErrorEstimate | None = None,
    t2: int = T0 + 5 * MS,
    t3: int = T0 + 6 * MS,
) -> bytes:
    sent = wire.decode_sender(request)
    packet = wire.ReflectorPacket(
        seq=sent.seq if seq is None else seq,
        timestamp=ntp_from_ns(t3),
        error_estimate=ee or ErrorEstimate(multiplier=9),
        ssid=sent.ssid if ssid is None else ssid,
        receive_timestamp=ntp_from_ns(t2),
        sender_seq=sent.seq if sender_seq is None else sender_seq,
        sender_timestamp=sent.timestamp if t1_wire is None else t1_wire,
        sender_error_estimate=sent.error_estimate,
        ses_sender_ttl=64,
    )
    return wire.encode_reflector(packet)


# ------------------------------------------------------------------ lifecycle table


def test_start_twice_raises_and_start_after_finish_raises() -> None:
    session, _ = started(SenderConfig(ssid=1))
    assert state_of(session) is State.RUNNING
    with pytest.raises(SessionStateError, match="start"):
        session.start(T0 + 1)
    session.stop()
    events(session)
    session.receive(b"", T0)  # whatever: still no exception
    session.handle_timer(T0 + 10 * S)
    assert state_of(session) is State.FINISHED
    with pytest.raises(SessionStateError, match="FINISHED"):
        session.start(T0 + 11 * S)


def test_stop_from_idle_finishes_without_sending() -> None:
    session = SenderSession(SenderConfig(ssid=4))
    session.stop()
    assert state_of(session) is State.FINISHED
    assert events(session) == [ev.SessionFinished(4)]
    assert session.datagrams_to_send() == []
    assert session.get_timer() is None
    session.stop()  # stop is idempotent once finished
    assert events(session) == []


def test_stop_while_running_drains_then_finishes_on_the_last_reply() -> None:
    cfg = SenderConfig(ssid=2, interval_ns=10 * MS)
    r = reflector_for(cfg)
    session, first = started(cfg)
    session.handle_timer(T0 + 10 * MS)
    (second,) = session.datagrams_to_send()
    session.stop()
    assert state_of(session) is State.DRAINING
    session.handle_timer(T0 + 20 * MS)
    assert session.datagrams_to_send() == []  # draining: no more test packets
    session.receive(bounce(r, first, T0 + 21 * MS, T0 + 22 * MS), T0 + 23 * MS)
    assert state_of(session) is State.DRAINING
    session.receive(bounce(r, second, T0 + 24 * MS, T0 + 25 * MS), T0 + 26 * MS)
    assert state_of(session) is State.FINISHED
    assert isinstance(events(session)[-1], ev.SessionFinished)
    assert session.get_timer() is None


def test_stop_while_running_finishes_on_the_last_loss_timeout() -> None:
    cfg = SenderConfig(ssid=2, loss_timeout_ns=300 * MS)
    session, _ = started(cfg)
    session.stop()
    assert session.get_timer() == T0 + 300 * MS
    session.handle_timer(T0 + 299 * MS)
    assert state_of(session) is State.DRAINING
    session.handle_timer(T0 + 300 * MS)
    assert state_of(session) is State.FINISHED
    assert [e for e in events(session) if not isinstance(e, ev.PacketSent)] == [
        ev.PacketLost(2, 0, T0),
        ev.SessionFinished(2),
    ]
    assert session.counters.lost == 1


def drive(session: SenderSession, r: Reflector, until: int) -> list[ev.Event]:
    """Run the timer loop with instant replies (1 ms each way) until FINISHED or ``until``."""
    out: list[ev.Event] = []
    now = T0
    session.start(now)
    while session.state is not State.FINISHED and now <= until:
        for payload in session.datagrams_to_send():
            session.receive(bounce(r, payload, now + MS, now + MS), now + 2 * MS)
        out += events(session)
        timer = session.get_timer()
        if timer is None:
            break
        now = timer
        session.handle_timer(now)
    out += events(session)
    return out


@pytest.mark.parametrize("count", [0, 1, 5])
def test_count_ends_the_session_by_itself(count: int) -> None:
    cfg = SenderConfig(ssid=3, interval_ns=100 * MS, count=count)
    session = SenderSession(cfg)
    out = drive(session, reflector_for(cfg), T0 + 100 * S)
    assert state_of(session) is State.FINISHED
    sent = [e for e in out if isinstance(e, ev.PacketSent)]
    assert [(e.seq, e.t1_ns) for e in sent] == [(i, T0 + i * 100 * MS) for i in range(count)]
    assert session.counters.received == count
    assert out[-1] == ev.SessionFinished(3)
    assert sum(isinstance(e, ev.SessionFinished) for e in out) == 1


def test_duration_ends_the_session_by_itself() -> None:
    cfg = SenderConfig(ssid=3, interval_ns=100 * MS, duration_ns=250 * MS)
    session = SenderSession(cfg)
    out = drive(session, reflector_for(cfg), T0 + 100 * S)
    assert state_of(session) is State.FINISHED
    assert [e.t1_ns for e in out if isinstance(e, ev.PacketSent)] == [
        T0,
        T0 + 100 * MS,
        T0 + 200 * MS,
    ]


def test_timer_keeps_the_schedule_when_called_late() -> None:
    cfg = SenderConfig(ssid=1, interval_ns=100 * MS, loss_timeout_ns=10 * S)
    session, _ = started(cfg)
    for k in range(1, 6):
        assert session.get_timer() == T0 + k * 100 * MS  # no drift from the late calls
        session.handle_timer(T0 + k * 100 * MS + 30 * MS)
        assert len(session.datagrams_to_send()) == 1
    session.handle_timer(T0 + 560 * MS)  # early: nothing due
    assert session.datagrams_to_send() == []


def test_timer_after_a_stall_sends_once_and_returns_to_the_grid() -> None:
    cfg = SenderConfig(ssid=1, interval_ns=100 * MS, loss_timeout_ns=10 * S)
    session, _ = started(cfg)
    stall = T0 + 350 * MS  # slots at 100, 200, 300 were missed
    session.handle_timer(stall)
    assert len(session.datagrams_to_send()) == 1  # one packet, no catch-up burst
    assert session.get_timer() == T0 + 400 * MS  # the next slot of the original grid
    session.handle_timer(stall + 1)
    assert session.datagrams_to_send() == []


def test_schedule_runs_on_now_and_timestamps_on_wall() -> None:
    """With ``wall`` given, the schedule and loss timeouts follow ``now`` alone: the wall
    clock stepping back an hour and forward a day changes T1 and T4, never when packets
    are sent or declared lost."""
    cfg = SenderConfig(ssid=1, interval_ns=100 * MS, loss_timeout_ns=250 * MS)
    session = SenderSession(cfg)
    mono = 5 * S  # a monotonic clock: any origin
    session.start(mono, wall=T0)
    (first,) = session.datagrams_to_send()
    assert ns_from_ntp(wire.decode_sender(first).timestamp) == T0
    assert session.get_timer() == mono + 100 * MS
    back = T0 - 3600 * S
    session.handle_timer(mono + 100 * MS, wall=back)
    (second,) = session.datagrams_to_send()
    assert ns_from_ntp(wire.decode_sender(second).timestamp) == back
    assert session.get_timer() == mono + 200 * MS  # on the grid, whatever the wall clock
    ahead = T0 + 86400 * S
    reply = reply_by_hand(second, t2=back + MS, t3=back + 2 * MS)
    session.receive(reply, mono + 150 * MS, wall=ahead)  # not late: 50 ms after sending
    (result,) = [e for e in events(session) if isinstance(e, ev.StampResult)]
    assert (result.seq, result.t1_ns, result.t4_ns) == (1, back, ahead)
    session.handle_timer(mono + 250 * MS, wall=ahead)  # seq 0's deadline: 250 ms
    lost = [e for e in events(session) if isinstance(e, ev.PacketLost)]
    assert lost == [ev.PacketLost(1, 0, T0)]  # lost on time, with its own T1
    assert len(session.datagrams_to_send()) == 1  # the 200 ms slot, sent late at 250


def test_timer_covers_loss_deadlines() -> None:
    cfg = SenderConfig(ssid=1, interval_ns=10 * S, loss_timeout_ns=2 * S)
    session, _ = started(cfg)
    assert session.get_timer() == T0 + 2 * S
    session.handle_timer(T0 + 2 * S)
    assert [e for e in events(session) if isinstance(e, ev.PacketLost)] == [ev.PacketLost(1, 0, T0)]
    assert session.get_timer() == T0 + 10 * S


def test_timer_skips_the_deadlines_of_answered_packets() -> None:
    """A packet answered needs no loss timer: the next timer is the next send, not the
    deadline of a packet already answered (which would call handle_timer for nothing)."""
    cfg = SenderConfig(ssid=1, interval_ns=S, loss_timeout_ns=500 * MS)
    session, first = started(cfg)
    assert session.get_timer() == T0 + 500 * MS  # seq 0 waits for its reply
    session.receive(reply_by_hand(first), T0 + 5 * MS)
    assert [e.seq for e in events(session) if isinstance(e, ev.StampResult)] == [0]
    assert session.get_timer() == T0 + S


def test_timer_skips_answered_deadlines_behind_a_lost_packet() -> None:
    """Seq 1 answered while seq 0 still waits: once seq 0 is lost, the timer is the next
    send, not seq 1's deadline."""
    cfg = SenderConfig(ssid=1, interval_ns=100 * MS, loss_timeout_ns=150 * MS)
    session, _ = started(cfg)
    session.handle_timer(T0 + 100 * MS)
    (second,) = session.datagrams_to_send()
    session.receive(reply_by_hand(second), T0 + 110 * MS)
    assert session.get_timer() == T0 + 150 * MS  # seq 0's deadline still guards it
    session.handle_timer(T0 + 150 * MS)
    assert [e.seq for e in events(session) if isinstance(e, ev.PacketLost)] == [0]
    session.handle_timer(T0 + 200 * MS)
    assert len(session.datagrams_to_send()) == 1
    assert session.get_timer() == T0 + 300 * MS  # not seq 1's deadline (250 ms)


# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"ssid": -1}, "ssid"),
        ({"ssid": 0x10000}, "ssid"),
        ({"interval_ns": 0}, "interval_ns"),
        ({"count": -1}, "count"),
        ({"duration_ns": -1}, "duration_ns"),
        ({"loss_timeout_ns": 0}, "loss_timeout_ns"),
        ({"key": b""}, "key"),
        ({"error_estimate": ErrorEstimate(fmt=TimestampFormat.PTP)}, "error_estimate"),
        ({"error_estimate": ErrorEstimate(multiplier=0)}, "error_estimate"),
    ],
)
def test_config_errors_name_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"ssid": 1, **kwargs}
    with pytest.raises(SessionConfigError, match=rf"\b{field}\b") as info:
        SenderConfig(**args)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)


def test_config_defaults() -> None:
    cfg = SenderConfig(ssid=1, fmt=TimestampFormat.PTP)
    assert not cfg.authenticated
    assert cfg.effective_error_estimate.fmt is TimestampFormat.PTP
    assert cfg.effective_error_estimate.is_valid
    assert SenderConfig(ssid=1, key=b"k").authenticated


# ------------------------------------------------------------------ packets and results


def test_packets_carry_seq_t1_ssid_and_tlvs() -> None:
    tlvs = bytes([0x80, 1, 0, 2]) + b"pp"  # an Extra Padding TLV
    cfg = SenderConfig(ssid=0xBEEF, interval_ns=MS, tlvs=tlvs)
    session, first = started(cfg)
    session.handle_timer(T0 + MS)
    (second,) = session.datagrams_to_send()
    for seq, data in enumerate((first, second)):
        pkt = wire.decode_sender(data)
        assert (pkt.seq, pkt.ssid, pkt.tlvs) == (seq, 0xBEEF, tlvs)
        assert ns_from_ntp(pkt.timestamp) == T0 + seq * MS
        assert pkt.error_estimate == cfg.effective_error_estimate


def test_result_record_from_a_reflected_packet() -> None:
    cfg = SenderConfig(ssid=6)
    mine = ErrorEstimate(synchronized=True, scale=3, multiplier=2)
    r = reflector_for(cfg, error_estimate=mine, mode=ReflectorMode.STATEFUL)
    session, first = started(cfg)
    session.receive(bounce(r, first, T0 + 7 * MS, T0 + 8 * MS, hop_limit=17), T0 + 20 * MS)
    (result,) = [e for e in events(session) if isinstance(e, ev.StampResult)]
    assert (result.t1_ns, result.t2_ns, result.t3_ns, result.t4_ns) == (
        T0,
        T0 + 7 * MS,
        T0 + 8 * MS,
        T0 + 20 * MS,
    )
    assert (result.seq, result.reflector_seq, result.ses_sender_ttl) == (0, 0, 17)
    assert result.sender_error == cfg.effective_error_estimate
    assert result.reflector_error == mine
    assert session.counters.received == 1


def test_duplicate_reply_is_reported_not_recorded_twice() -> None:
    cfg = SenderConfig(ssid=6)
    r = reflector_for(cfg)
    session, first = started(cfg)
    reply = bounce(r, first, T0 + MS, T0 + MS)
    session.receive(reply, T0 + 2 * MS)
    session.receive(reply, T0 + 3 * MS)
    got = [e for e in events(session) if not isinstance(e, ev.PacketSent)]
    assert [type(e) for e in got] == [ev.StampResult, ev.DuplicateReceived]
    assert (session.counters.received, session.counters.duplicates) == (1, 1)


def test_authenticated_session_signs_and_accepts_signed_replies() -> None:
    cfg = SenderConfig(ssid=9, key=KEY)
    r = reflector_for(cfg)
    session, first = started(cfg)
    assert len(first) == wire.AUTH_PACKET_SIZE
    assert stamp_auth.verify(first, KEY)
    assert wire.decode_sender(first, authenticated=True).ssid == 9
    session.receive(bounce(r, first, T0 + MS, T0 + 2 * MS), T0 + 3 * MS)
    assert session.counters.received == 1


# ------------------------------------------------------------------ bad reflected packets


def assert_dropped_then_still_matchable(
    session: SenderSession, bad: bytes, reason: DropReason, good: bytes
) -> None:
    session.receive(bad, T0 + 10 * MS)
    assert drops(session) == [reason]
    assert session.counters.dropped == {reason: 1}
    assert session.counters.received == 0
    # The packet is still outstanding: its real reply is a result.
    session.receive(good, T0 + 11 * MS)
    assert [type(e) for e in events(session)] == [ev.StampResult]


def test_wrong_ssid_is_dropped() -> None:
    session, first = started(SenderConfig(ssid=6))
    bad = reply_by_hand(first, ssid=7)
    assert_dropped_then_still_matchable(session, bad, DropReason.NO_SESSION, reply_by_hand(first))


@pytest.mark.parametrize("size", [0, 13, 14, 43])
def test_too_short_is_dropped(size: int) -> None:
    session, first = started(SenderConfig(ssid=6))
    good = reply_by_hand(first)
    assert_dropped_then_still_matchable(session, good[:size], DropReason.TOO_SHORT, good)


def test_multiplier_zero_is_dropped() -> None:
    session, first = started(SenderConfig(ssid=6))
    bad = reply_by_hand(first, ee=ErrorEstimate(synchronized=True, multiplier=0))
    good = reply_by_hand(first)
    assert_dropped_then_still_matchable(session, bad, DropReason.MULTIPLIER_ZERO, good)


def test_t1_echo_that_was_not_sent_is_dropped() -> None:
    session, first = started(SenderConfig(ssid=6))
    bad = reply_by_hand(first, t1_wire=ntp_from_ns(T0 + 1000))
    good = reply_by_hand(first)
    assert_dropped_then_still_matchable(session, bad, DropReason.BAD_TIMESTAMP, good)


def test_unknown_seq_is_dropped() -> None:
    session, first = started(SenderConfig(ssid=6))
    bad = reply_by_hand(first, sender_seq=5)
    assert_dropped_then_still_matchable(session, bad, DropReason.UNKNOWN_SEQ, reply_by_hand(first))


@pytest.mark.parametrize("index", [0, 30, 95, 100])
def test_bad_hmac_in_authenticated_mode_is_dropped(index: int) -> None:
    cfg = SenderConfig(ssid=9, key=KEY)
    r = reflector_for(cfg)
    session, first = started(cfg)
    good = bounce(r, first, T0 + MS, T0 + 2 * MS)
    bad = bytearray(good)
    bad[index] ^= 0x40
    assert_dropped_then_still_matchable(session, bytes(bad), DropReason.HMAC_FAILED, good)


def test_unsigned_reply_in_authenticated_mode_is_dropped() -> None:
    cfg = SenderConfig(ssid=9, key=KEY)
    session, first = started(cfg)
    fields = wire.decode_sender(first, authenticated=True)
    reply = wire.encode_reflector(
        wire.ReflectorPacket(
            0,
            ntp_from_ns(T0),
            fields.error_estimate,
            9,
            ntp_from_ns(T0),
            0,
            fields.timestamp,
            fields.error_estimate,
            64,
        ),
        authenticated=True,
    )
    session.receive(reply, T0 + MS)  # HMAC field all zeros
    session.receive(stamp_auth.sign(reply, b"another key"), T0 + MS)
    assert drops(session) == [DropReason.HMAC_FAILED, DropReason.HMAC_FAILED]


def test_reply_after_its_loss_timeout_is_late() -> None:
    cfg = SenderConfig(ssid=6, loss_timeout_ns=100 * MS, interval_ns=10 * S)
    session, first = started(cfg)
    session.handle_timer(T0 + 100 * MS)
    session.receive(reply_by_hand(first), T0 + 150 * MS)
    got = [e for e in events(session) if not isinstance(e, ev.PacketSent)]
    assert got == [ev.PacketLost(6, 0, T0), ev.PacketDropped(6, DropReason.LATE)]
    assert (session.counters.lost, session.counters.late, session.counters.received) == (1, 1, 0)


def test_reply_after_its_loss_timeout_is_late_whatever_the_call_order() -> None:
    """The adapter may hand over a datagram before it runs an overdue timer."""
    cfg = SenderConfig(ssid=6, loss_timeout_ns=100 * MS, interval_ns=10 * S)
    session, first = started(cfg)
    session.receive(reply_by_hand(first), T0 + 150 * MS)  # no handle_timer in between
    got = [e for e in events(session) if not isinstance(e, ev.PacketSent)]
    assert got == [ev.PacketLost(6, 0, T0), ev.PacketDropped(6, DropReason.LATE)]
    assert session.counters.received == 0


def test_late_reply_while_draining_still_finishes() -> None:
    cfg = SenderConfig(ssid=6, loss_timeout_ns=100 * MS)
    session, first = started(cfg)
    session.stop()
    session.receive(reply_by_hand(first), T0 + 150 * MS)
    assert state_of(session) is State.FINISHED
    assert events(session)[-1] == ev.SessionFinished(6)


def test_reply_before_start_or_after_finish_is_not_running() -> None:
    session = SenderSession(SenderConfig(ssid=6))
    session.receive(b"\0" * 44, T0)
    session.stop()
    session.receive(b"\0" * 44, T0)
    assert session.counters.dropped == {DropReason.NOT_RUNNING: 2}


def test_ptp_reflector_nanoseconds_out_of_range_is_a_bad_timestamp() -> None:
    session, first = started(SenderConfig(ssid=6))
    good = reply_by_hand(first)
    bad = bytearray(good)
    bad[12:14] = ErrorEstimate(fmt=TimestampFormat.PTP, multiplier=1).to_int().to_bytes(2)
    bad[8:12] = (2_000_000_000).to_bytes(4)  # T3 nanoseconds >= 10^9
    assert_dropped_then_still_matchable(session, bytes(bad), DropReason.BAD_TIMESTAMP, good)


# ------------------------------------------------------------------ PTP


@pytest.mark.parametrize("offset_s", [37, 36])
@pytest.mark.parametrize("reflector_fmt", list(TimestampFormat))
def test_ptp_t1_is_tai_on_the_wire_and_results_are_utc(
    offset_s: int, reflector_fmt: TimestampFormat
) -> None:
    offset = offset_s * S
    cfg = SenderConfig(ssid=8, fmt=TimestampFormat.PTP, tai_utc_offset_ns=offset)
    r = reflector_for(cfg, fmt=reflector_fmt, tai_utc_offset_ns=offset)
    session, first = started(cfg)
    pkt = wire.decode_sender(first)
    assert pkt.error_estimate.fmt is TimestampFormat.PTP
    assert ns_from_ptp(pkt.timestamp) == T0 + offset
    session.receive(bounce(r, first, T0 + 4 * MS, T0 + 5 * MS), T0 + 9 * MS)
    (result,) = [e for e in events(session) if isinstance(e, ev.StampResult)]
    assert (result.t1_ns, result.t2_ns, result.t3_ns, result.t4_ns) == (
        T0,
        T0 + 4 * MS,
        T0 + 5 * MS,
        T0 + 9 * MS,
    )
    assert (result.direct_ns, result.return_ns) == (4 * MS, 4 * MS)


# ------------------------------------------------------------------ RFC 8762-only reflectors


def test_ssid_zero_reply_is_accepted_and_flagged_by_default() -> None:
    # An RFC 8762-only reflector returns the SSID field as zero (MBZ to it).
    session, first = started(SenderConfig(ssid=1))
    assert session.claims(reply_by_hand(first, ssid=0))
    session.receive(reply_by_hand(first, ssid=0), T0 + 10 * MS)
    (result,) = [e for e in events(session) if isinstance(e, ev.StampResult)]
    assert result.ssid == 1
    assert session.counters.received == 1
    assert session.counters.ssid_zero == 1
    assert session.counters.reflector_ssid_zero


def test_ssid_zero_reply_is_refused_with_strict_ssid() -> None:
    session, first = started(SenderConfig(ssid=1, strict_ssid=True))
    good = reply_by_hand(first)
    assert_dropped_then_still_matchable(
        session, reply_by_hand(first, ssid=0), DropReason.SSID_ZERO, good
    )
    assert not session.counters.reflector_ssid_zero


@pytest.mark.parametrize("path", ["receive", "receive_one"])
def test_ssid_zero_reply_after_the_reflector_returned_the_ssid_is_a_stray(path: str) -> None:
    """Once the reflector returned the session's SSID (RFC 8972 §3) it is no RFC
    8762-only one: a later reply with SSID 0, even one that claims a packet, is refused
    as a stray (counted ``ssid-zero-stray``) and the packet waits for its real reply;
    before that, the same reply would be accepted (the test above)."""
    cfg = SenderConfig(ssid=1, interval_ns=MS)
    session, first = started(cfg)

    def feed(data: bytes, now: int) -> None:
        if path == "receive":
            session.receive(data, now)
        else:
            receive_one(session, data, now, now)

    feed(reply_by_hand(first), T0 + 2 * MS)
    assert session.echoed_ssid
    session.handle_timer(T0 + MS)
    (second,) = session.datagrams_to_send()
    events(session)
    stray = reply_by_hand(second, ssid=0)
    assert session.claims(stray)
    assert session.ssid_zero_refused() is DropReason.SSID_ZERO_STRAY
    feed(stray, T0 + 3 * MS)
    assert drops(session) == [DropReason.SSID_ZERO_STRAY]
    assert (session.counters.received, session.counters.ssid_zero) == (1, 0)
    feed(reply_by_hand(second), T0 + 4 * MS)
    assert [type(e) for e in events(session)] == [ev.StampResult]
    assert session.counters.dropped == {DropReason.SSID_ZERO_STRAY: 1}


def test_ssid_zero_reply_must_still_match_seq_and_t1() -> None:
    session, first = started(SenderConfig(ssid=1))
    bad_t1 = reply_by_hand(first, ssid=0, t1_wire=ntp_from_ns(T0 + 1000))
    assert not session.claims(bad_t1)
    assert not session.claims(reply_by_hand(first, ssid=0, sender_seq=9))
    assert not session.claims(b"short")
    session.receive(bad_t1, T0 + MS)
    assert session.counters.ssid_zero == 0
    assert drops(session) == [DropReason.BAD_TIMESTAMP]


def test_ssid_zero_authenticated_reply_is_accepted() -> None:
    # An RFC 8762 authenticated reflector signs its reply with zeros where the SSID is.
    cfg = SenderConfig(ssid=9, key=KEY)
    session, first = started(cfg)
    fields = wire.decode_sender(first, authenticated=True)
    reply = wire.encode_reflector(
        wire.ReflectorPacket(
            0,
            ntp_from_ns(T0 + MS),
            EE9,
            0,
            ntp_from_ns(T0),
            0,
            fields.timestamp,
            fields.error_estimate,
            64,
        ),
        authenticated=True,
    )
    session.receive(stamp_auth.sign(reply, KEY), T0 + 2 * MS)
    assert (session.counters.received, session.counters.ssid_zero) == (1, 1)


EE9 = ErrorEstimate(multiplier=9)


# ------------------------------------------------------------------ HMAC TLV


def hmac_tlv_position(area: bytes) -> int:
    return [x.type for x in t.decode_tlvs(area)].index(t.TlvType.HMAC)


def test_authenticated_sender_writes_an_hmac_tlv_per_packet() -> None:
    rp = t.ReturnPath((t.Srv6SegmentList((IPv6Address("fc00::1"),)),)).to_tlv().encode()
    pad = t.ExtraPadding(b"zz").to_tlv().encode()
    cfg = SenderConfig(ssid=9, key=KEY, interval_ns=MS, tlvs=pad + rp + pad)
    session, first = started(cfg)
    session.handle_timer(T0 + MS)
    (second,) = session.datagrams_to_send()
    macs = []
    for data in (first, second):
        assert stamp_auth.verify(data, KEY)
        area = wire.decode_sender(data, authenticated=True).tlvs
        assert t.verify_hmac_tlv(data[:4], area, KEY)
        types = [x.type for x in t.decode_tlvs(area)]
        # After every TLV but the trailing Extra Padding (RFC 8972 §4.8).
        assert types == [t.TlvType.EXTRA_PADDING, t.TlvType.RETURN_PATH, t.TlvType.HMAC, 1]
        macs.append(t.decode_tlvs(area)[hmac_tlv_position(area)].value)
    assert macs[0] != macs[1]  # it covers the Sequence Number


def test_configured_hmac_tlv_is_replaced_and_padding_only_needs_none() -> None:
    stale = t.Tlv(t.TlvType.HMAC, t.TlvFlag.U, bytes(16)).encode()
    dm = t.DirectMeasurement().to_tlv().encode()
    _, first = started(SenderConfig(ssid=9, key=KEY, tlvs=stale + dm))
    area = wire.decode_sender(first, authenticated=True).tlvs
    assert [x.type for x in t.decode_tlvs(area)] == [t.TlvType.DIRECT_MEASUREMENT, t.TlvType.HMAC]
    assert t.verify_hmac_tlv(first[:4], area, KEY)
    pad = t.ExtraPadding(b"abc").to_tlv().encode()
    _, first = started(SenderConfig(ssid=9, key=KEY, tlvs=pad))
    assert wire.decode_sender(first, authenticated=True).tlvs == pad


def test_malformed_tlvs_are_refused_in_authenticated_mode() -> None:
    with pytest.raises(SessionConfigError, match="tlvs"):
        SenderConfig(ssid=9, key=KEY, tlvs=b"\x80\x01\x00\x09")


def test_direct_measurement_s_txc_is_filled_per_packet() -> None:
    cfg = SenderConfig(ssid=3, interval_ns=MS, tlvs=t.DirectMeasurement().to_tlv().encode())
    session, first = started(cfg)
    session.handle_timer(T0 + MS)
    (second,) = session.datagrams_to_send()
    got = [
        t.DirectMeasurement.from_tlv(t.decode_tlvs(wire.decode_sender(d).tlvs)[0]).s_txc
        for d in (first, second)
    ]
    assert got == [1, 2]


def test_return_path_round_trip_with_hmac_tlv_is_obeyed_by_the_reflector() -> None:
    segs = (IPv6Address("fc00::1"), IPv6Address("fc00::2"))
    rp = t.ReturnPath((t.Srv6SegmentList(segs),)).to_tlv().encode()
    cfg = SenderConfig(ssid=9, key=KEY, tlvs=rp)
    r = reflector_for(cfg, mode=ReflectorMode.STATEFUL)
    session, first = started(cfg)
    out = r.reflect(first, T0 + MS, lambda: T0 + 2 * MS, 64)
    assert out is not None
    assert out.return_path.segments == segs
    session.receive(out.payload, T0 + 3 * MS)
    assert session.counters.received == 1
    assert session.counters.integrity_reported == 0


def test_reply_with_a_bad_hmac_tlv_is_dropped() -> None:
    rp = t.ReturnPath((t.Srv6SegmentList((IPv6Address("fc00::1"),)),)).to_tlv().encode()
    cfg = SenderConfig(ssid=9, key=KEY, tlvs=rp)
    r = reflector_for(cfg)
    session, first = started(cfg)
    good = bounce(r, first, T0 + MS, T0 + 2 * MS)
    # Flip a bit in the Return Path TLV value, then sign the base packet again: the base
    # HMAC is right, the HMAC TLV is not.
    bad = bytearray(good)
    bad[wire.AUTH_PACKET_SIZE + 6] ^= 0x01
    bad_signed = stamp_auth.sign(bytes(bad), KEY)
    assert_dropped_then_still_matchable(session, bad_signed, DropReason.HMAC_TLV_FAILED, good)


def test_reflector_reporting_integrity_failure_is_counted() -> None:
    cfg = SenderConfig(ssid=9, key=KEY, tlvs=t.DirectMeasurement().to_tlv().encode())
    session, first = started(cfg)
    r = reflector_for(SenderConfig(ssid=9, key=b"the reflector's other key"))
    # Same base key for both ends would be needed for the base HMAC: sign by hand.
    out = r.reflect(stamp_auth.sign(first, b"the reflector's other key"), T0, lambda: T0, 64)
    assert out is not None
    area = wire.decode_reflector(out.payload, authenticated=True).tlvs
    assert all(x.flags & t.TlvFlag.I for x in t.decode_tlvs(area))
    # Re-sign the reply (base and HMAC TLV) as the sender's key would, keeping the I flags.
    body = out.payload[: wire.AUTH_PACKET_SIZE]
    flagged = t.decode_tlvs(area)
    covered = t.encode_tlvs(x for x in flagged if x.type != t.TlvType.HMAC)
    resigned = stamp_auth.sign(body + t.append_hmac_tlv(body, covered, KEY, flags=t.TlvFlag.I), KEY)
    session.receive(resigned, T0 + MS)
    assert session.counters.received == 1
    assert session.counters.integrity_reported == 1


# ------------------------------------------------------------------ loss classification


def test_loss_after_the_last_answer_is_unclassified_until_a_later_reply() -> None:
    cfg = SenderConfig(
        ssid=4, interval_ns=10 * MS, loss_timeout_ns=100 * MS, reflector_stateful=True
    )
    r = reflector_for(cfg, mode=ReflectorMode.STATEFUL)
    session, p0 = started(cfg)
    sent = [p0]
    for i in range(1, 4):
        session.handle_timer(T0 + i * 10 * MS)
        sent.extend(session.datagrams_to_send())
    # 0 answered; 1 lost forward (never reflected); 2 and 3 reflected, replies lost.
    session.receive(bounce(r, sent[0], T0 + MS, T0 + MS), T0 + 2 * MS)
    bounce(r, sent[2], T0 + 21 * MS, T0 + 21 * MS)
    bounce(r, sent[3], T0 + 31 * MS, T0 + 31 * MS)
    session.handle_timer(T0 + 200 * MS)  # 1, 2 and 3 time out; 4 is sent
    (p4,) = session.datagrams_to_send()
    c = session.counters
    assert (c.lost, c.forward_lost, c.unclassified_lost, c.backward_lost) == (3, 0, 3, 0)
    # A later reply (Seq 4, reflector Seq 3) places them: 1 forward, 2 backward.
    session.receive(bounce(r, p4, T0 + 211 * MS, T0 + 211 * MS), T0 + 212 * MS)
    c = session.counters
    assert (c.lost, c.forward_lost, c.unclassified_lost, c.backward_lost) == (3, 1, 0, 2)


def test_stateless_reflector_has_no_loss_split() -> None:
    c = SenderSession(SenderConfig(ssid=4)).counters
    assert (c.forward_lost, c.unclassified_lost, c.backward_lost) == (None, None, None)


def _answer_many(session: SenderSession, r: Reflector, n: int, start: int) -> list[bytes]:
    """Send and answer ``n`` packets, one per 1 ms slot from ``start`` (a running session
    with a 1 ms interval); the replies, in Seq order."""
    replies = []
    for k in range(n):
        now = start + k * MS
        session.handle_timer(now)
        for pkt in session.datagrams_to_send():
            reply = bounce(r, pkt, now, now)
            session.receive(reply, now)
            replies.append(reply)
        while session.next_event() is not None:
            pass
    return replies


def test_duplicates_are_told_from_late_replies_over_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A repeat of one of the last DUPLICATE_WINDOW Seqs sent is a duplicate; an older
    one is late (RFC 8762 §4.2 leaves duplicate detection to the implementation)."""
    from sixlab.stamp import sender as sender_module  # noqa: PLC0415

    monkeypatch.setattr(sender_module, "DUPLICATE_WINDOW", 64)
    cfg = SenderConfig(ssid=6, interval_ns=MS, loss_timeout_ns=MS // 2)
    r = reflector_for(cfg)
    session = SenderSession(cfg)
    session.start(T0)
    replies = _answer_many(session, r, 64, T0)
    assert session.counters.received == 64
    session.receive(replies[0], T0 + 100 * MS)  # Seq 0, the oldest of the last 64 sent
    assert session.counters.duplicates == 1
    _answer_many(session, r, 1, T0 + 64 * MS)  # Seq 64 takes Seq 0's place
    session.receive(replies[0], T0 + 101 * MS)
    session.receive(replies[1], T0 + 101 * MS)  # Seq 1: still in the window
    assert session.counters.duplicates == 2
    assert drops(session) == [DropReason.LATE]


def _grown_by_answers() -> tuple[int, int]:
    """Bytes a session's process holds more after 10,000 more answered packets, and the
    packets it received (run alone: ``python -c``, below)."""
    import gc  # noqa: PLC0415
    import tracemalloc  # noqa: PLC0415

    cfg = SenderConfig(ssid=6, interval_ns=MS, loss_timeout_ns=MS // 2)
    r = reflector_for(cfg)
    session = SenderSession(cfg)
    session.start(T0)
    _answer_many(session, r, 1_000, T0)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        _answer_many(session, r, 10_000, T0 + 1_000 * MS)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return grown, session.counters.received


def test_duplicate_detection_memory_does_not_grow_with_the_session() -> None:
    """10,000 sessions at 1 pps must not grow by the Seqs they answered: a session holds
    no more after 10,000 more answered packets (it held a set and a queue of the last
    65,536 Seqs: ~5 MB a session once full).

    Measured in a process of its own: tracemalloc counts every thread's allocations, and
    in the whole suite's process threads other tests left behind allocated 75 KB in the
    window once, failing the bound with nothing of the session's."""
    import json  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    code = (
        "import json; from tests.unit.test_stamp_sender import _grown_by_answers;"
        " print(json.dumps(_grown_by_answers()))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    grown, received = json.loads(out.stdout)
    assert received == 11_000
    assert grown < 64 * 1024, grown
