"""The SR performance-measurement helpers of the STAMP core (docs/srpm.md).

Loopback decoding, flow-label spreading and per-label statistics, direct-mode loss
arithmetic: pure functions, checked against hand-made packets and counters.
"""

from __future__ import annotations

import pytest

from sixlab.stamp import (
    DataCounters,
    DropReason,
    SessionConfigError,
    StampResult,
    check_flow_labels,
    data_loss,
    data_loss_total,
    decode_looped,
    flow_label_for,
    path_stats,
    per_flow_stats,
    spread_labels,
)
from sixlab.stamp import _events as ev
from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig, SenderSession
from sixlab.wire import stamp as wire
from sixlab.wire import stamp_auth
from sixlab.wire import stamp_tlv as tlv
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat, encode_timestamp

EE = ErrorEstimate.for_error_ns(1000, fmt=TimestampFormat.NTP)
MS = 1_000_000
T0 = 1_700_000_000 * 1_000_000_000


def _sender_packet(seq: int = 7, ssid: int = 5, key: bytes | None = None, t1: int = T0) -> bytes:
    pkt = wire.SenderPacket(seq, encode_timestamp(t1, TimestampFormat.NTP), EE, ssid, b"")
    data = wire.encode_sender(pkt, authenticated=key is not None)
    return stamp_auth.sign(data, key) if key is not None else data


# -- loopback -----------------------------------------------------------------------


def test_a_looped_packet_reads_back_as_sent() -> None:
    got = decode_looped(_sender_packet(), ssid=5, key=None)
    assert not isinstance(got, DropReason)
    assert (got.seq, got.timestamp) == (7, encode_timestamp(T0, TimestampFormat.NTP))


def test_a_looped_authenticated_packet_must_verify() -> None:
    data = _sender_packet(key=b"k")
    assert not isinstance(decode_looped(data, ssid=5, key=b"k"), DropReason)
    assert decode_looped(data, ssid=5, key=b"other") is DropReason.HMAC_FAILED


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (_sender_packet()[:20], DropReason.TOO_SHORT),
        (_sender_packet(ssid=6), DropReason.NO_SESSION),
        (_sender_packet()[:12] + b"\x00\x00" + _sender_packet()[14:], DropReason.MULTIPLIER_ZERO),
    ],
)
def test_a_bad_looped_packet_is_dropped_with_its_reason(data: bytes, reason: DropReason) -> None:
    assert decode_looped(data, ssid=5, key=None) is reason


def _result(
    seq: int, rtt_ms: float, *, loopback: bool = False, label: int | None = None
) -> StampResult:
    t1 = T0 + seq * 10 * MS
    t4 = t1 + round(rtt_ms * MS)
    t2 = t3 = 0 if loopback else t1 + round(rtt_ms * MS / 2)
    return StampResult(
        ssid=1, seq=seq, t1_ns=t1, t2_ns=t2, t3_ns=t3, t4_ns=t4, sender_error=EE,
        reflector_error=EE, ses_sender_ttl=60, reflector_seq=seq, flow_label=label,
        loopback=loopback,
    )  # fmt: skip


def test_loopback_records_have_a_round_trip_and_no_one_way_delays() -> None:
    records = [_result(i, 17.0 + (i % 2), loopback=True) for i in range(10)]
    st = path_stats(records, lost=2)
    assert st.direct is None
    assert st.backward is None
    assert st.rtt is not None
    assert (st.rtt.min_ns, st.rtt.max_ns) == (17 * MS, 18 * MS)
    assert st.direct_jitter_ns == MS  # round-trip IPDV: every step is 1 ms
    assert (st.received, st.lost) == (10, 2)
    doc = records[0].as_json()
    assert doc["direct_ns"] is None
    assert doc["rtt_ns"] == 17 * MS
    assert doc["loopback"] == 1


# -- flow labels --------------------------------------------------------------------


def test_flow_labels_take_turns_by_seq() -> None:
    labels = spread_labels(3, first=16)
    assert labels == (16, 17, 18)
    assert [flow_label_for(labels, s) for s in range(7)] == [16, 17, 18, 16, 17, 18, 16]
    assert flow_label_for((), 5) is None


@pytest.mark.parametrize("labels", [(0,), (0x80000,), (1, 1), tuple(range(1, 300))])
def test_unusable_flow_labels_are_refused(labels: tuple[int, ...]) -> None:
    with pytest.raises(SessionConfigError, match="flow_labels"):
        check_flow_labels(labels)


def test_per_flow_stats_separates_the_paths_and_places_losses_by_seq() -> None:
    labels = (1, 2)
    # Label 1 (even Seqs) sees 5 ms, label 2 (odd Seqs) 20 ms; Seq 5 (label 2) was lost.
    records = [_result(s, 5.0 if s % 2 == 0 else 20.0, label=labels[s % 2]) for s in range(10)]
    records = [r for r in records if r.seq != 5]
    st = per_flow_stats(records, labels, lost_seqs=[5])
    assert set(st) == {1, 2}
    one, two = st[1], st[2]
    assert one.rtt is not None
    assert two.rtt is not None
    assert one.rtt.max_ns == 5 * MS
    assert two.rtt.min_ns == 20 * MS
    assert (one.received, one.lost, two.received, two.lost) == (5, 0, 4, 1)
    # Jitter pairs packets of one label: constant delay per label means no IPDV.
    assert one.direct_jitter_ns == 0
    assert two.direct_jitter_ns == 0


def test_a_label_without_records_is_still_reported() -> None:
    st = per_flow_stats([], (3, 4), lost_seqs=[0, 1, 2])
    assert (st[3].lost, st[4].lost, st[3].received) == (2, 1, 0)


# -- direct-mode loss ---------------------------------------------------------------


def test_data_loss_per_interval_and_in_total() -> None:
    samples = [
        (0, T0, DataCounters(s_txc=100, r_rxc=90, r_txc=50, s_rxc=50)),
        (1, T0 + 1, DataCounters(s_txc=200, r_rxc=180, r_txc=60, s_rxc=58)),
        (3, T0 + 3, DataCounters(s_txc=300, r_rxc=280, r_txc=70, s_rxc=68)),
    ]
    first, second = data_loss(reversed(samples))  # any order: sorted by Seq
    assert (first.forward_sent, first.forward_lost) == (100, 10)
    assert (first.backward_sent, first.backward_lost) == (10, 2)
    assert first.forward_ratio == pytest.approx(0.1)
    assert (second.forward_lost, second.backward_lost) == (0, 0)
    total = data_loss_total(samples)
    assert total is not None
    assert (total.start_ns, total.end_ns) == (T0, T0 + 3)
    assert (total.forward_sent, total.forward_lost, total.backward_lost) == (200, 10, 2)


def test_data_loss_survives_32_bit_wrap_and_reports_in_flight_as_negative() -> None:
    top = (1 << 32) - 10
    samples = [
        (0, T0, DataCounters(s_txc=top, r_rxc=top - 5, r_txc=0)),
        # 30 sent across the wrap; 40 received (10 were in flight at the first sample).
        (1, T0 + 1, DataCounters(s_txc=20, r_rxc=25, r_txc=0)),
    ]
    (only,) = data_loss(samples)
    assert (only.forward_sent, only.forward_lost) == (30, -10)
    assert only.backward_lost is None  # the sender counts no reverse flow
    assert only.backward_ratio is None
    assert data_loss_total(samples[:1]) is None


# -- the Session-Sender in loopback, ECMP and direct-measurement sessions ------------


def _session(**kwargs: object) -> SenderSession:
    session = SenderSession(SenderConfig(ssid=9, interval_ns=10 * MS, **kwargs))  # type: ignore[arg-type]
    session.start(T0)
    return session


def _events(session: SenderSession) -> list[ev.Event]:
    return list(iter(session.next_event, None))


@pytest.mark.parametrize("key", [None, b"loop-key"])
def test_a_loopback_session_measures_its_own_packets(key: bytes | None) -> None:
    session = _session(loopback=True, key=key, count=3)
    first = session.datagrams_to_send()
    session.handle_timer(T0 + 10 * MS)
    second = session.datagrams_to_send()
    # Packets come back untouched (End/End.X do not write into the payload), any order.
    session.receive(second[0], T0 + 27 * MS)
    session.receive(first[0], T0 + 29 * MS)
    results = [e for e in _events(session) if isinstance(e, StampResult)]
    assert [(r.seq, r.rtt_ns, r.loopback) for r in results] == [
        (1, 17 * MS, True),
        (0, 29 * MS, True),
    ]
    assert (results[0].t2_ns, results[0].t3_ns) == (0, 0)
    assert session.counters.reordered == 1
    session.receive(first[0], T0 + 30 * MS)  # came back twice
    assert session.counters.duplicates == 1


def test_a_loopback_session_drops_what_is_not_its_own_packet() -> None:
    session = _session(loopback=True)
    (sent,) = session.datagrams_to_send()
    r = Reflector()
    r.add_session(ReflectorSessionConfig(ssid=9))
    reply = r.reflect(sent, T0 + MS, lambda: T0 + 2 * MS, 64)
    assert reply is not None
    session.receive(reply.payload, T0 + 3 * MS)  # a reflector's reply: T3 where T1 is
    session.receive(_sender_packet(seq=0, ssid=9, t1=T0 + MS), T0 + 3 * MS)  # wrong T1
    session.receive(_sender_packet(seq=7, ssid=9), T0 + 3 * MS)  # a Seq never sent
    assert session.counters.dropped == {
        DropReason.BAD_TIMESTAMP: 2,
        DropReason.UNKNOWN_SEQ: 1,
    }
    assert session.counters.received == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"loopback": True, "reflector_stateful": True},
        {"loopback": True, "direct_measurement": True},
    ],
)
def test_loopback_refuses_what_needs_a_reflector(kwargs: dict[str, bool]) -> None:
    with pytest.raises(SessionConfigError):
        SenderConfig(ssid=1, **kwargs)  # type: ignore[arg-type]


def test_records_carry_the_flow_label_their_seq_had() -> None:
    session = _session(flow_labels=(0x11, 0x22, 0x33), count=4)
    sent = session.datagrams_to_send()
    for k in range(1, 4):
        session.handle_timer(T0 + k * 10 * MS)
        sent += session.datagrams_to_send()
    r = Reflector()
    r.add_session(ReflectorSessionConfig(ssid=9))
    for i, payload in enumerate(sent):
        out = r.reflect(payload, T0 + (i * 10 + 1) * MS, lambda: T0 + 50 * MS, 64)
        assert out is not None
        session.receive(out.payload, T0 + 60 * MS)
    results = [e for e in _events(session) if isinstance(e, StampResult)]
    assert [r.flow_label for r in results] == [0x11, 0x22, 0x33, 0x11]
    assert [flow_label_for((0x11, 0x22, 0x33), int.from_bytes(p[:4])) for p in sent] == [
        0x11,
        0x22,
        0x33,
        0x11,
    ]


def test_direct_measurement_carries_data_counters_both_ways() -> None:
    session = _session(direct_measurement=True)
    (probe_count,) = session.datagrams_to_send()  # no data counts yet: the packet count
    assert tlv.DirectMeasurement.from_tlv(tlv.decode_tlvs(probe_count[44:])[0]).s_txc == 1
    session.set_data_counters(1000, 40)
    session.handle_timer(T0 + 10 * MS)
    (sent,) = session.datagrams_to_send()
    assert tlv.DirectMeasurement.from_tlv(tlv.decode_tlvs(sent[44:])[0]).s_txc == 1000
    r = Reflector()
    r.add_session(ReflectorSessionConfig(ssid=9))
    r.set_data_counters(9, received=990, sent=45)
    out = r.reflect(sent, T0 + 11 * MS, lambda: T0 + 12 * MS, 64)
    assert out is not None
    session.set_data_counters(1003, 44)
    session.receive(out.payload, T0 + 13 * MS)
    (result,) = [e for e in _events(session) if isinstance(e, StampResult)]
    assert result.data == DataCounters(s_txc=1000, r_rxc=990, r_txc=45, s_rxc=44)
    with pytest.raises(SessionConfigError, match="ssid"):
        r.set_data_counters(10, received=0, sent=0)


def test_the_reflector_reads_a_data_source_per_tlv_packet_and_keeps_the_last_counts() -> None:
    readings: list[tuple[int, int] | None] = [(5, 50), None, (6, 70)]
    r = Reflector()
    r.add_session(ReflectorSessionConfig(ssid=9))
    r.set_data_source(9, lambda: readings.pop(0))
    session = _session(direct_measurement=True)
    got = []
    for k in range(3):
        if k:
            session.handle_timer(T0 + k * 10 * MS)
        (sent,) = session.datagrams_to_send()
        out = r.reflect(sent, T0 + k * MS, lambda: T0, 64)
        assert out is not None
        dm = tlv.DirectMeasurement.from_tlv(tlv.decode_tlvs(out.payload[44:])[0])
        got.append((dm.r_rxc, dm.r_txc))
    assert got == [(50, 5), (50, 5), (70, 6)]  # (received, sent); a failed read keeps them
    assert readings == []
