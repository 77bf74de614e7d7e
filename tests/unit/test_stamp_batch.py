"""The batch paths against the per-packet references: reflector and sender.

The same probes go through ``Reflector.reflect`` one by one and through
``BatchReflector.reflect`` (two reflectors with the same sessions); with a clock that
always returns the T3 the batch is given, every reply, every return path and every
counter must be the same: stateless and stateful sessions, NTP and PTP, a default
session or none, unknown SSIDs, Multiplier 0, Extra Padding TLVs, other TLVs (the
reference answers those rows), short and possibly authenticated payloads. On the sender
side, ``receive_batch`` against ``SenderSession.receive``: the same events and counters
for good, duplicate, unknown, late, wrong-SSID, Multiplier-0, mismatched-T1 and bad-PTP
replies, NTP and PTP, a stateless and a stateful reflector.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from ipaddress import IPv6Address
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.stamp._events import PacketSent
from sixlab.stamp.batch import (
    BatchReflector,
    loop_handback,
    loop_hold,
    loop_state,
    receive_batch,
    receive_one,
    send_due,
    send_template,
)
from sixlab.stamp.reflector import (
    PacketContext,
    Reflection,
    Reflector,
    ReflectorMode,
    ReflectorSessionConfig,
    ReturnPath,
)
from sixlab.stamp.sender import SenderConfig, SenderSession
from sixlab.wire import stamp as wire
from sixlab.wire import stamp_tlv as tlv
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat, encode_timestamp

T3 = 1_790_000_000_123_456_789
CTX = PacketContext(IPv6Address("fd00::1"), IPv6Address("fd00::2"), 40862, 862)
RET = (IPv6Address("fc00:0:2::a"), IPv6Address("fd00::1"))


def _clock() -> int:
    return T3


def _reflector(*, default: str | None, auth: bool) -> Reflector:
    refl = Reflector()
    refl.add_session(ReflectorSessionConfig(1))
    refl.add_session(
        ReflectorSessionConfig(
            2, mode=ReflectorMode.STATEFUL, fmt=TimestampFormat.PTP, return_segments=RET
        )
    )
    refl.add_session(ReflectorSessionConfig(4, mode=ReflectorMode.STATEFUL))
    if auth:
        refl.add_session(ReflectorSessionConfig(5, key=b"k" * 16))
    if default == "stateless":
        refl.set_default(ReflectorSessionConfig(None, return_segments=RET))
    elif default == "stateful":
        refl.set_default(ReflectorSessionConfig(None, mode=ReflectorMode.STATEFUL))
    return refl


@dataclass(frozen=True)
class Probe:
    seq: int
    ts: int
    ee: int
    ssid: int
    other_tlv: bool
    t2: int
    hop: int
    flow: int  # which of FLOWS the packet belongs to


probes = st.builds(
    Probe,
    seq=st.integers(0, 0xFFFF_FFFF),
    ts=st.integers(0, (1 << 64) - 1),
    ee=st.sampled_from([0x0001, 0x8001, 0x0100, 0x00FF, 0x0000]),
    ssid=st.sampled_from([1, 2, 3, 4, 5, 1000]),
    other_tlv=st.booleans(),
    t2=st.integers(1_600_000_000 * 10**9, 2_000_000_000 * 10**9),
    hop=st.integers(0, 255),
    flow=st.integers(0, 2),
)
#: Flow keys as planes give them (``Received.flow``: addresses, then ports).
FLOWS = [
    IPv6Address(f"fd00::{n}").packed + IPv6Address("fd00::ff").packed + bytes([0x9F, n, 3, 94])
    for n in (1, 2, 3)
]


def _payload(p: Probe, padding: list[int] | None, size: int) -> bytes:
    base = (
        p.seq.to_bytes(4, "big") + p.ts.to_bytes(8, "big") + p.ee.to_bytes(2, "big")
        + p.ssid.to_bytes(2, "big") + bytes(28)
    )  # fmt: skip
    if padding is None:
        return (base + bytes(size))[:size]
    if p.other_tlv:  # a Location TLV of the same size: the reference's to answer
        value = bytes(sum(4 + n for n in padding) - 4)
        return base + tlv.Tlv(tlv.TlvType.LOCATION, tlv.TlvFlag.U, value).encode()
    area = b"".join(tlv.ExtraPadding(bytes([7]) * n).to_tlv().encode() for n in padding)
    return base + area


def _counters(refl: Reflector) -> object:
    c = refl.counters
    per = {s: refl.session_counters(s) for s in refl.ssids}
    sessions = [*refl._unauth.values(), *refl._auth.values()]
    if refl._default is not None:
        sessions.append(refl._default)
    flows = [
        {k: (f.next_seq, f.received, f.transmitted) for k, f in sess.flows.items()}
        for sess in sessions
    ]
    return (c.received, c.reflected, dict(c.dropped), per, flows)


def _same(ref: Reflection | None, got: Reflection | None) -> None:
    assert (ref is None) == (got is None)
    if ref is not None and got is not None:
        assert got.payload == ref.payload
        assert got.return_path == ref.return_path
        assert got.ssid == ref.ssid


@settings(max_examples=300, deadline=None)
@given(
    batches=st.lists(st.lists(probes, min_size=1, max_size=24), min_size=1, max_size=3),
    layout=st.sampled_from(["base", "pad", "pad2", "short", "auth-size"]),
    default=st.sampled_from([None, "stateless", "stateful"]),
    auth=st.booleans(),
)
def test_batch_equals_reference(
    batches: list[list[Probe]], layout: str, default: str | None, auth: bool
) -> None:
    ref = _reflector(default=default, auth=auth)
    bat = _reflector(default=default, auth=auth)
    batch = BatchReflector(bat)
    padding = {"pad": [12], "pad2": [3, 0, 21], "auth-size": [64]}.get(layout)
    size = {"short": 20}.get(layout, 44)
    for probe_list in batches:
        payloads = [_payload(p, padding, size) for p in probe_list]
        assert len({len(x) for x in payloads}) == 1
        arr = np.frombuffer(b"".join(payloads), np.uint8).reshape(len(payloads), -1)
        t2 = np.array([p.t2 for p in probe_list], np.int64)
        hops = np.array([p.hop for p in probe_list], np.uint8)
        expected = [
            ref.reflect(x, p.t2, _clock, p.hop, CTX, flow=FLOWS[p.flow])
            for x, p in zip(payloads, probe_list, strict=True)
        ]

        def fallback(
            i: int, payloads: list[bytes] = payloads, probes: list[Probe] = probe_list
        ) -> Reflection | None:
            return bat.reflect(
                payloads[i], probes[i].t2, _clock, probes[i].hop, CTX, flow=FLOWS[probes[i].flow]
            )

        flows = np.frombuffer(b"".join(FLOWS[p.flow] for p in probe_list), np.uint8)
        out = batch.reflect(arr, t2, hops, fallback, flows.reshape(len(probe_list), -1))
        out.set_t3(T3)
        for i, want in enumerate(expected):
            if i in out.fallback:
                got = out.fallback[i]
            elif out.answered[i]:
                route: ReturnPath = out.routes[int(out.route_of[i])]
                got = Reflection(out.replies[i].tobytes(), probe_list[i].ssid, route)
            else:
                got = None
            _same(want, got)
        assert _counters(bat) == _counters(ref)
    if layout in ("base", "pad", "pad2"):
        # The batch really answered something itself unless every row was dropped or
        # went to the reference.
        assert ref.counters.reflected == 0 or bat.counters.reflected > 0


def test_batch_answers_base_packets_without_the_reference() -> None:
    refl = _reflector(default="stateless", auth=False)
    p = Probe(9, 1 << 40, 0x0001, 2, False, 1_700_000_000 * 10**9, 61, 0)
    arr = np.frombuffer(_payload(p, None, 44) * 5, np.uint8).reshape(5, 44)

    def fallback(i: int) -> Reflection | None:
        raise AssertionError(f"row {i} went to the reference")

    out = BatchReflector(refl).reflect(
        arr, np.full(5, p.t2, np.int64), np.full(5, 61, np.uint8), fallback
    )
    out.set_t3(T3)
    assert out.answered.all()
    assert [int.from_bytes(r[:4].tobytes(), "big") for r in out.replies] == [0, 1, 2, 3, 4]
    assert out.routes == [ReturnPath(segments=RET)]


# ------------------------------------------------------------------------ sender side


@dataclass(frozen=True)
class Reply:
    seq: int  # the sender Seq it echoes (may be one never sent)
    mangle: str  # what is wrong with it, if anything
    delay_ns: int  # T4 after the probe's T1


replies = st.builds(
    Reply,
    seq=st.integers(0, 12),
    mangle=st.sampled_from(["", "", "", "ssid", "ssid0", "mult", "t1", "ptp-bad", "ptp", "rseq"]),
    delay_ns=st.sampled_from([1_000, 500_000, 3 * 10**9]),  # the last one: past the timeout
)

T0 = 1_700_000_000 * 10**9
INTERVAL = 1_000_000


#: The sessions' timer clock starts here (monotonic, not the wall clock of T0).
M0 = 10**9


def _sender(
    fmt: TimestampFormat, *, stateful: bool, strict: bool
) -> tuple[SenderSession, list[bytes]]:
    session = SenderSession(
        SenderConfig(
            ssid=9,
            interval_ns=INTERVAL,
            count=10,
            fmt=fmt,
            reflector_stateful=stateful,
            strict_ssid=strict,
        )
    )
    session.start(M0, T0)
    for i in range(1, 10):  # one probe per timer, as the engine drives it
        session.handle_timer(M0 + i * INTERVAL, T0 + i * INTERVAL)
    probes = session.datagrams_to_send()
    assert len(probes) == 10
    return session, probes


def _reply(probe: bytes, r: Reply, fmt: TimestampFormat, tlv_area: bytes) -> bytes:
    sender = wire.decode_sender(probe)
    ee = ErrorEstimate.for_error_ns(1000, fmt=fmt)
    if r.mangle == "mult":
        ee = ErrorEstimate(fmt=fmt, scale=1, multiplier=0)
    t2 = encode_timestamp(T0 + 10**6, fmt)
    if r.mangle == "ptp-bad":
        ee = ErrorEstimate.for_error_ns(1000, fmt=TimestampFormat.PTP)
        t2 = (5 << 32) | 1_500_000_000  # nanoseconds >= 10^9
    elif r.mangle == "ptp":  # the reflector answers in PTP whatever the sender used
        ee = ErrorEstimate.for_error_ns(1000, fmt=TimestampFormat.PTP)
        t2 = encode_timestamp(T0 + 37 * 10**9, TimestampFormat.PTP)
    sts = sender.timestamp + (1 if r.mangle == "t1" else 0)
    packet = wire.ReflectorPacket(
        seq=(r.seq // 2) if r.mangle == "rseq" else r.seq,  # a stateful reflector's own count
        timestamp=t2 + 5,
        error_estimate=ee,
        ssid={"ssid": 7, "ssid0": 0}.get(r.mangle, 9),
        receive_timestamp=t2,
        sender_seq=r.seq,
        sender_timestamp=sts,
        sender_error_estimate=sender.error_estimate,
        ses_sender_ttl=61,
        tlvs=tlv_area,
    )
    return wire.encode_reflector(packet)


def _state(session: SenderSession) -> object:
    events = []
    while (event := session.next_event()) is not None:
        events.append(event)
    return (events, dataclasses.asdict(session.counters), session.state)


@settings(max_examples=200, deadline=None)
@given(
    batch=st.lists(replies, min_size=1, max_size=30),
    fmt=st.sampled_from([TimestampFormat.NTP, TimestampFormat.PTP]),
    stateful=st.booleans(),
    padding=st.booleans(),
    strict=st.booleans(),
)
def test_receive_batch_equals_reference(
    batch: list[Reply], fmt: TimestampFormat, stateful: bool, padding: bool, strict: bool
) -> None:
    ref, probes = _sender(fmt, stateful=stateful, strict=strict)
    bat, probes_b = _sender(fmt, stateful=stateful, strict=strict)
    assert probes == probes_b
    area = tlv.ExtraPadding(bytes(6)).to_tlv(flags=0).encode() if padding else b""
    payloads, t4s = [], []
    for r in batch:
        probe = probes[r.seq] if r.seq < len(probes) else probes[0][:0] + _unknown(r.seq, fmt)
        payloads.append(_reply(probe, r, fmt, area))
        t4s.append(T0 + r.seq * INTERVAL + r.delay_ns)
    t4s.sort()  # arrival order: time moves forward
    for data, t4 in zip(payloads, t4s, strict=True):
        ref.receive(data, M0 + t4 - T0, t4)
    arr = np.frombuffer(b"".join(payloads), np.uint8).reshape(len(payloads), -1)
    wall = np.array(t4s, np.int64)
    receive_batch(bat, arr, wall, wall - T0 + M0)
    assert _state(bat) == _state(ref)


def _unknown(seq: int, fmt: TimestampFormat) -> bytes:
    """A probe this session never sent (Seq past the count)."""
    ee = ErrorEstimate.for_error_ns(1000, fmt=fmt)
    return wire.encode_sender(wire.SenderPacket(seq, encode_timestamp(T0, fmt), ee, 9))


# ---------------------------------------------------- the sender, packet by packet


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.one_of(  # whole slots often, so that a timer meets a deadline exactly
            st.sampled_from([INTERVAL // 2, INTERVAL, 3 * INTERVAL]), st.integers(1, 5 * INTERVAL)
        ),
        min_size=1,
        max_size=40,
    ),
    fmt=st.sampled_from([TimestampFormat.NTP, TimestampFormat.PTP]),
    count=st.sampled_from([None, 0, 3, 25]),
    duration=st.sampled_from([None, 7 * INTERVAL]),
    padding=st.booleans(),
    answer=st.lists(st.booleans(), min_size=40, max_size=40),
)
def test_send_due_equals_handle_timer(
    steps: list[int],
    fmt: TimestampFormat,
    count: int | None,
    duration: int | None,
    padding: bool,
    answer: list[bool],
) -> None:
    """``send_due`` against ``handle_timer`` (timers early, on time and late by several
    slots; a count and a duration that end the session; some packets answered, the
    rest expiring): the same bytes, state, counters and events but ``PacketSent``."""
    area = tlv.ExtraPadding(bytes(6)).to_tlv().encode() if padding else b""
    config = SenderConfig(
        ssid=9,
        interval_ns=INTERVAL,
        count=count,
        duration_ns=duration,
        fmt=fmt,
        tlvs=area,
        loss_timeout_ns=3 * INTERVAL,
    )
    template = send_template(config)
    assert template is not None
    ref, fast = SenderSession(config), SenderSession(config)
    ref.start(M0, T0)
    fast.start(M0, T0)  # the first packet goes out through start, as the engine does it
    assert fast.datagrams_to_send() == ref.datagrams_to_send()
    assert _state(fast) == _state(ref)
    now = M0
    for step, reply in zip(steps, answer, strict=False):
        now += step
        wall = T0 + now - M0 + 17  # T1 off the monotonic grid
        ref.handle_timer(now, wall)
        sent = send_due(fast, template, now, wall)
        want = ref.datagrams_to_send()
        assert want == ([sent] if sent is not None else [])
        assert fast.datagrams_to_send() == []
        ref_state = _state(ref)
        assert isinstance(ref_state, tuple)
        events, counters, state = ref_state
        assert _state(fast) == (
            [e for e in events if not isinstance(e, PacketSent)],
            counters,
            state,
        )
        assert [e.seq for e in events if isinstance(e, PacketSent)] == (
            [int.from_bytes(sent[:4])] if sent is not None else []
        )
        assert fast.get_timer() == ref.get_timer()
        if sent is not None and reply:  # answered at once: the same reply to both
            refl = Reflector(ReflectorSessionConfig(None))
            back = refl.reflect(sent, wall + 5, itertools.repeat(wall + 6).__next__, 64)
            assert back is not None
            ref.receive(back.payload, now + 1, wall + 9)
            receive_one(fast, back.payload, now + 1, wall + 9)
            assert _state(fast) == _state(ref)


@settings(max_examples=200, deadline=None)
@given(
    batch=st.lists(replies, min_size=1, max_size=30),
    fmt=st.sampled_from([TimestampFormat.NTP, TimestampFormat.PTP]),
    stateful=st.booleans(),
    padding=st.booleans(),
    strict=st.booleans(),
    cut=st.sampled_from([None, 0, 14, 43]),
    t3_units=st.integers(0, (1 << 32) - 1),
)
def test_receive_one_equals_receive(
    batch: list[Reply],
    fmt: TimestampFormat,
    stateful: bool,
    padding: bool,
    strict: bool,
    cut: int | None,
    t3_units: int,
) -> None:
    """``receive_one`` against ``receive``, reply by reply, with the replies of
    ``test_receive_batch_equals_reference`` (and one cut short, when ``cut``); T3 moved
    by any number of timestamp units, so that it is no round trip of a nanosecond."""
    ref, probes = _sender(fmt, stateful=stateful, strict=strict)
    fast, _ = _sender(fmt, stateful=stateful, strict=strict)
    area = tlv.ExtraPadding(bytes(6)).to_tlv(flags=0).encode() if padding else b""
    arrivals = []
    for r in batch:
        probe = probes[r.seq] if r.seq < len(probes) else _unknown(r.seq, fmt)
        data = _reply(probe, r, fmt, area)
        t3 = (int.from_bytes(data[4:12]) + t3_units) & ((1 << 64) - 1)
        data = data[:4] + t3.to_bytes(8) + data[12:]
        arrivals.append((T0 + r.seq * INTERVAL + r.delay_ns, data))
    arrivals.sort(key=lambda item: item[0])
    if cut is not None:
        t4, data = arrivals[-1]
        arrivals[-1] = (t4, data[:cut])
    for t4, data in arrivals:
        ref.receive(data, M0 + t4 - T0, t4)
        receive_one(fast, data, M0 + t4 - T0, t4)
        assert _state(fast) == _state(ref)
    fast.stop()
    ref.stop()
    receive_one(fast, arrivals[0][1], M0 + 10**12, T0 + 10**12)  # after the end: dropped
    ref.receive(arrivals[0][1], M0 + 10**12, T0 + 10**12)
    assert _state(fast) == _state(ref)


def test_a_session_handed_to_a_run_loop_and_back_answers_as_before() -> None:
    """``loop_state`` then ``loop_hold`` then ``loop_handback`` with what the loop kept:
    the session answers the same replies as a twin that never left the core (packets
    outstanding, highest Seq, next slot and Seq); sessions a loop cannot run get no
    state (a count, a duration, TLVs, a stateful reflector, a loss timeout beyond the
    window, not running)."""
    config = SenderConfig(ssid=9, interval_ns=INTERVAL, loss_timeout_ns=3 * INTERVAL)
    ref, moved = SenderSession(config), SenderSession(config)
    for session in (ref, moved):
        session.start(M0, T0)
        for k in (1, 2, 3):
            session.handle_timer(M0 + k * INTERVAL, T0 + k * INTERVAL)
    probes = {int.from_bytes(p[:4]): p for p in ref.datagrams_to_send()}
    moved.datagrams_to_send()
    refl = Reflector(ReflectorSessionConfig(None))
    back = refl.reflect(probes[2], T0 + 5, itertools.repeat(T0 + 6).__next__, 64)
    assert back is not None
    for session in (ref, moved):
        session.receive(back.payload, M0 + 3 * INTERVAL, T0 + 3 * INTERVAL)
    assert _state(moved) == _state(ref)
    state = loop_state(moved)
    assert state is not None
    assert (state.next_send, state.next_seq, state.highest) == (M0 + 4 * INTERVAL, 4, 2)
    assert [seq for seq, _, _ in state.outstanding] == [1, 3]  # Seq 0 lost, 2 answered
    assert state.window == 8  # 3 intervals of loss + 3, to a power of two
    assert state.answered is moved._answered
    loop_hold(moved)
    assert moved._outstanding == {}
    loop_handback(moved, state.next_send, state.next_seq, state.outstanding, state.highest)
    assert moved.get_timer() == ref.get_timer()
    for seq in (1, 2, 0):  # a result (reordered), a duplicate, a late one
        reply = refl.reflect(probes[seq], T0 + 5, itertools.repeat(T0 + 6).__next__, 64)
        assert reply is not None
        for session in (ref, moved):
            session.receive(reply.payload, M0 + 3 * INTERVAL + 1, T0 + 3 * INTERVAL + 1)
        assert _state(moved) == _state(ref)
    for session in (ref, moved):
        session.handle_timer(M0 + 9 * INTERVAL, T0 + 9 * INTERVAL)
    assert _state(moved) == _state(ref)  # Seq 3 lost on both, Seq 4 sent
    assert moved.datagrams_to_send() == ref.datagrams_to_send()
    for other in (
        dataclasses.replace(config, count=5),
        dataclasses.replace(config, duration_ns=10**9),
        dataclasses.replace(config, tlvs=tlv.ExtraPadding(bytes(4)).to_tlv().encode()),
        dataclasses.replace(config, reflector_stateful=True),
        dataclasses.replace(config, loss_timeout_ns=5000 * INTERVAL),
    ):
        session = SenderSession(other)
        session.start(M0, T0)
        assert loop_state(session) is None
    assert loop_state(SenderSession(config)) is None  # not started


def test_send_template_refuses_what_changes_per_packet() -> None:
    """Authenticated (HMAC), loopback, flow-labelled and Direct Measurement sessions
    keep the reference: their packets or records are not the template's."""
    assert send_template(SenderConfig(ssid=1)) is not None
    changes: list[dict[str, Any]] = [
        {"key": b"k" * 16},
        {"loopback": True},
        {"flow_labels": (1, 2)},
        {"direct_measurement": True},
    ]
    for changed in changes:
        assert send_template(SenderConfig(ssid=1, **changed)) is None
