"""The compiled run loop (``probeio.SendLoop``, ``sl_*`` in probeio.c) and a
``SenderEngine`` that uses it: the C schedule on its own (slots, Seq, T1, skipped slots,
bad input), then whole engines with and without it against one scripted reflector on
loopback that drops, duplicates, reorders, delays past the loss timeout, answers with
SSID 0 and with an SSID nobody has: the same counters and records by the same rules."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from ipaddress import IPv6Address
from typing import Any

import pytest

from sixlab.dataplane import probeio
from sixlab.dataplane.base import DataplaneConfig, create
from sixlab.dataplane.engine import SenderEngine, SenderSessionSpec
from sixlab.dataplane.udpsocket import SocketDataplane
from sixlab.stamp import DropReason, PacketSent, StampResult
from sixlab.stamp.batch import send_template
from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig, State
from sixlab.wire.timestamp import TimestampFormat, ns_from_ntp

LOOP = IPv6Address("::1")
MS = 10**6

pytestmark = pytest.mark.skipif(probeio.load() is None, reason="no C compiler here")


@pytest.fixture
def plane() -> Iterator[SocketDataplane]:
    dp = create("socket", DataplaneConfig(port=0))
    assert isinstance(dp, SocketDataplane)
    dp.open()
    try:
        yield dp
    finally:
        dp.close()


@pytest.fixture
def sink() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.bind(("::1", 0))
    try:
        yield sock
    finally:
        sock.close()


def _loop(plane: SocketDataplane) -> tuple[probeio.ProbeIO, probeio.SendLoop]:
    pio = plane.probe_io()
    assert pio is not None
    return pio, pio.send_loop()


def _drain(sock: socket.socket) -> list[bytes]:
    out = []
    while select.select([sock], [], [], 0.2)[0]:
        out.append(sock.recv(9000))
    return out


def _take(loop: probeio.SendLoop) -> list[tuple[int, int, int, int, int]]:
    loop.lock()
    try:
        n, failed, _ = loop.take()
    finally:
        loop.unlock()
    assert failed == 0
    return list(probeio.LOOP_OUT.iter_unpack(memoryview(loop.out)[: n * probeio.LOOP_OUT.size]))


def test_the_loop_sends_each_slot_once_with_its_seq_and_t1(
    plane: SocketDataplane, sink: socket.socket
) -> None:
    """Two sessions, 5 and 7 ms apart, for 60 ms: every packet carries the session's
    next Seq and the T1 its out record names (NTP, RFC 5905 §6), and each next slot is
    the grid's first after the run (``due_seq``'s arithmetic)."""
    pio, loop = _loop(plane)
    port = sink.getsockname()[1]
    now = time.monotonic_ns()
    for idx, (ssid, interval) in enumerate([(1, 5 * MS), (2, 7 * MS)]):
        template = send_template(SenderConfig(ssid, interval_ns=interval))
        assert template is not None
        record = pio.record(LOOP, port, template, ptp=False, tai_ns=0)
        assert record is not None
        loop.lock()
        try:
            assert loop.add(idx, record, due=now, interval=interval, seq=10, start=now, last=-1)
        finally:
            loop.unlock()
    waker_r, waker_w = socket.socketpair()
    try:
        deadline = now + 60 * MS
        while time.monotonic_ns() < deadline:
            loop.run(waker_r.fileno(), deadline, 0, 8 * MS)
    finally:
        waker_r.close()
        waker_w.close()
    out = _take(loop)
    packets = _drain(sink)
    loop.close()
    assert len(packets) == len(out)
    by_session: dict[int, list[tuple[int, int, int, int, int]]] = {0: [], 1: []}
    for rec in out:
        by_session[rec[3]].append(rec)
    assert 3 <= len(by_session[0]) <= 13
    assert 3 <= len(by_session[1]) <= 10
    for idx, interval in ((0, 5 * MS), (1, 7 * MS)):
        recs = by_session[idx]
        assert [r[4] for r in recs] == list(range(10, 10 + len(recs)))
        for _, ran, nxt, _, _ in recs:
            assert (nxt - now) % interval == 0
            assert ran < nxt <= ran + interval
        assert [r[2] for r in recs] == sorted({r[2] for r in recs})
    sent = {(int.from_bytes(p[14:16]), int.from_bytes(p[:4])): p for p in packets}
    for t1, _, _, idx, seq in out:
        payload = sent[idx + 1, seq]
        assert ns_from_ntp(int.from_bytes(payload[4:12])) == t1


def test_a_late_loop_skips_the_slots_it_missed_and_counts_them(
    plane: SocketDataplane, sink: socket.socket
) -> None:
    """A slot 10.5 intervals in the past: one packet, the next slot the grid's first
    after now (``due_seq``'s arithmetic), the slots between counted as skipped."""
    pio, loop = _loop(plane)
    template = send_template(SenderConfig(1, interval_ns=10 * MS, fmt=TimestampFormat.PTP))
    assert template is not None
    record = pio.record(LOOP, sink.getsockname()[1], template, ptp=True, tai_ns=37 * 10**9)
    assert record is not None
    now = time.monotonic_ns()
    start = now - 105 * MS
    loop.lock()
    try:
        assert loop.add(0, record, due=start, interval=10 * MS, seq=0, start=start, last=-1)
    finally:
        loop.unlock()
    r, w = socket.socketpair()
    loop.run(r.fileno(), now + MS, 0, 8 * MS)
    r.close()
    w.close()
    out = _take(loop)
    assert len(out) == 1
    t1, ran, nxt, _, seq = out[0]
    assert seq == 0
    assert nxt == start + ((ran - start) // (10 * MS) + 1) * 10 * MS
    loop.lock()
    try:
        held = loop.get(0, remove=True)
        assert loop.get(0) is None
    finally:
        loop.unlock()
    assert held is not None
    assert (held.due, held.seq, held.on_slot) == (nxt, 1, 1)
    assert held.skipped == (ran - start) // (10 * MS)
    (payload,) = _drain(sink)
    stamp = int.from_bytes(payload[4:12])  # PTP (IEEE 1588): TAI seconds, nanoseconds
    assert (stamp >> 32) * 10**9 + (stamp & 0xFFFF_FFFF) == t1 + 37 * 10**9
    loop.close()


def test_bad_input_is_refused_not_sent(plane: SocketDataplane) -> None:
    """A record too long or too short, no interval, a negative index, an index
    already scheduled: refused (the engine keeps such a session on Python); a session
    it never had has no state."""
    pio, loop = _loop(plane)
    template = send_template(SenderConfig(1, interval_ns=MS))
    assert template is not None
    record = pio.record(LOOP, 9, template, ptp=False, tai_ns=0)
    assert record is not None
    now = time.monotonic_ns()
    loop.lock()
    try:
        at = {"seq": 0, "start": now, "last": -1}
        assert not loop.add(0, bytes(probeio.LOOP_RECORD_MAX + 8), due=now, interval=MS, **at)
        assert not loop.add(0, bytes(8), due=now, interval=MS, **at)
        assert not loop.add(0, record, due=now, interval=0, **at)
        assert not loop.add(-1, record, due=now, interval=MS, **at)
        assert loop.add(5000, record, due=now + 10**9, interval=MS, **at)
        assert not loop.add(5000, record, due=now, interval=MS, **at)
        assert loop.get(3) is None
        assert loop.get(-1) is None
        assert loop.get(10**6) is None
        assert loop.get(5000) is not None
    finally:
        loop.unlock()
    loop.close()
    loop.close()  # twice: nothing


# ------------------------------------------------------------------ whole engines

INTERVAL = 20 * MS
LOSS = 200 * MS
#: Replies by Seq % 10: 1 dropped, 3 sent twice, 5 with SSID 0 (RFC 8972 §3) to
#: session 1 (``ZERO``), 7 with an SSID no session has, 8 delayed past the loss
#: timeout, 9 delayed past the next packet's reply (reordered); the rest answered at
#: once. Session 1 starts ``HEAD`` before the others: a reply with SSID 0 goes to the
#: one session that sent its Seq at its T1 (``SenderEngine._match_ssid_zero``), and
#: packets of one batched send share a T1.
DELAY = {8: 2 * LOSS, 9: 50 * MS}
NOBODY = 999
ZERO = 1
HEAD = 0.2


class ScriptedReflector:
    """A reflector core behind a socket that mangles its replies by Seq (``DELAY``)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        self.sock.bind(("::1", 0))
        self.port = self.sock.getsockname()[1]
        self.core = Reflector(ReflectorSessionConfig(None))
        self._stop = threading.Event()
        self._later: list[tuple[float, bytes, tuple[str, int]]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            if select.select([self.sock], [], [], 0.005)[0]:
                data, peer = self.sock.recvfrom(9000)
                self._answer(data, peer[:2])
            now = time.monotonic()
            due = [x for x in self._later if x[0] <= now]
            self._later = [x for x in self._later if x[0] > now]
            for _, reply, peer in due:
                self.sock.sendto(reply, peer)

    def _answer(self, data: bytes, peer: tuple[str, int]) -> None:
        out = self.core.reflect(data, time.time_ns(), time.time_ns, 64)
        if out is None:
            return
        reply = bytearray(out.payload)
        seq = int.from_bytes(data[:4])
        kind = seq % 10
        if kind == 1:
            return
        if kind == 7 or (kind == 5 and int.from_bytes(data[14:16]) == ZERO):
            reply[14:16] = (0 if kind == 5 else NOBODY).to_bytes(2)
        if kind in DELAY:
            self._later.append((time.monotonic() + DELAY[kind] / 1e9, bytes(reply), peer))
            return
        self.sock.sendto(reply, peer)
        if kind == 3:
            self.sock.sendto(reply, peer)


@pytest.fixture
def scripted() -> Iterator[ScriptedReflector]:
    refl = ScriptedReflector()
    try:
        yield refl
    finally:
        refl.close()


def _configs() -> list[SenderConfig]:
    return [
        SenderConfig(1, interval_ns=INTERVAL, loss_timeout_ns=LOSS),
        SenderConfig(2, interval_ns=INTERVAL, loss_timeout_ns=LOSS, fmt=TimestampFormat.PTP),
        SenderConfig(
            3, interval_ns=INTERVAL, loss_timeout_ns=LOSS, tlvs=b"\x00\x01\x00\x08" + bytes(8)
        ),
    ]


def _run(port: int, *, loop: bool, seconds: float = 1.2) -> tuple[SenderEngine, dict[int, Any]]:
    dp = create("socket", DataplaneConfig(port=0))
    dp.open()
    sent: list[PacketSent] = []
    engine = SenderEngine(dp, compiled_loop=loop, on_event=_keep(sent))
    out: dict[int, Any] = {}
    try:
        for cfg in _configs():
            engine.add_session(SenderSessionSpec(cfg, LOOP, port))
        engine.start()
        assert (engine.send_loop is not None) is loop
        for cfg in _configs():
            engine.start_session(cfg.ssid)
            if cfg.ssid == ZERO:
                time.sleep(HEAD)
        time.sleep(seconds / 2)
        with engine.lock:
            held = {s: e.loop_idx is not None for s, e in engine._entries.items()}
        assert held == dict.fromkeys(held, loop)
        time.sleep(seconds / 2)
        for cfg in _configs():
            engine.stop_session(cfg.ssid)
        for cfg in _configs():
            assert engine.wait_finished(cfg.ssid, 5.0)
        time.sleep(3 * LOSS / 1e9)  # the late replies: all in
        for cfg in _configs():
            snap = engine.snapshot(cfg.ssid)
            out[cfg.ssid] = (snap, engine.results(cfg.ssid), engine.lost(cfg.ssid))
        out[0] = [(e.ssid, e.seq) for e in sent]
        assert engine.error is None
    finally:
        engine.shutdown()
        dp.close()
    return engine, out


def _keep(into: list[PacketSent]) -> Any:
    def hook(event: object) -> None:
        if isinstance(event, PacketSent):
            into.append(event)

    return hook


def _check(engine: SenderEngine, out: dict[int, Any]) -> None:
    """Every counter and record as the script makes them, whatever the count sent."""
    no_session = 0
    for cfg in _configs():
        snap, results, lost = out[cfg.ssid]
        c = snap.counters
        n = c.sent
        assert n >= 20
        assert snap.state is State.FINISHED
        seqs = range(n)

        def count(kinds: set[int], seqs: range = seqs) -> int:
            return sum(1 for s in seqs if s % 10 in kinds)

        assert [r.seq for r in sorted(results, key=lambda r: r.seq)] == [
            s for s in seqs if s % 10 not in {1, 7, 8}
        ]
        assert all(isinstance(r, StampResult) and r.ssid == cfg.ssid for r in results)
        assert all(r.t1_ns <= r.t2_ns <= r.t3_ns <= r.t4_ns for r in results)
        assert sorted(x.seq for x in lost) == [s for s in seqs if s % 10 in {1, 7, 8}]
        assert c.received == len(results)
        assert c.lost == count({1, 7, 8})
        assert c.duplicates == count({3})
        assert c.ssid_zero == (count({5}) if cfg.ssid == ZERO else 0)
        # A Seq 9 reply comes after its successor's: reordered, unless it was the last.
        assert c.reordered == sum(1 for s in seqs if s % 10 == 9 and s + 1 < n)
        assert c.dropped.get(DropReason.LATE, 0) + c.dropped.get(
            DropReason.NOT_RUNNING, 0
        ) == count({8})
        assert set(c.dropped) <= {DropReason.LATE, DropReason.NOT_RUNNING}
        assert snap.schedule.sent == n
        assert sorted(s for ssid, s in out[0] if ssid == cfg.ssid) == list(seqs)
        no_session += count({7})
    assert engine.counters.no_session == no_session
    assert engine.counters.send_failed == 0


def test_an_engine_with_and_without_the_loop_counts_the_same_by_the_script(
    scripted: ScriptedReflector,
) -> None:
    looped, with_loop = _run(scripted.port, loop=True)
    plain, without = _run(scripted.port, loop=False)
    _check(looped, with_loop)
    _check(plain, without)


def _spec(ssid: int, port: int, count: int | None = None) -> SenderSessionSpec:
    cfg = SenderConfig(ssid, interval_ns=10 * MS, loss_timeout_ns=LOSS, count=count)
    return SenderSessionSpec(cfg, LOOP, port)


def test_sessions_change_while_the_loop_runs(scripted: ScriptedReflector) -> None:
    """Sessions added, started, stopped and removed while the loop serves others: each
    leaves the loop with its state (packets and Seq go on where the loop left them),
    the others keep their schedule, a removed one is gone, and a session the loop
    does not take (a count) runs beside it on Python."""
    dp = create("socket", DataplaneConfig(port=0))
    dp.open()
    engine = SenderEngine(dp)
    try:
        specs = {s: _spec(s, scripted.port) for s in (20, 21, 22)}
        for spec in specs.values():
            engine.add_session(spec)
        engine.start()
        assert engine.send_loop is not None
        for s in specs:
            engine.start_session(s)
        time.sleep(0.2)
        engine.remove_session(21)
        with pytest.raises(Exception, match="no session 21"):
            engine.snapshot(21)
        counted = _spec(23, scripted.port, count=8)
        engine.add_session(counted)
        engine.start_session(23)
        late = _spec(24, scripted.port)
        engine.add_session(late)
        engine.start_session(24)
        with engine.lock:
            assert engine._entries[23].loop_idx is None  # a count: the core ends it
            assert engine._entries[24].loop_idx is not None
        time.sleep(0.2)
        before = engine.snapshot(20).counters.sent
        engine.stop_session(20)
        after = engine.snapshot(20)
        assert after.state in (State.DRAINING, State.FINISHED)
        time.sleep(0.05)
        assert engine.snapshot(20).counters.sent == after.counters.sent >= before
        assert engine.wait_finished(23, 5.0)
        assert engine.snapshot(23).counters.sent == 8
        time.sleep(0.1)
        for s in (22, 24):
            engine.stop_session(s)
        for s in (20, 22, 23, 24):
            assert engine.wait_finished(s, 5.0)
            snap = engine.snapshot(s)
            assert snap.schedule.sent == snap.counters.sent
            seqs = sorted(r.seq for r in engine.results(s))
            assert seqs == [q for q in range(snap.counters.sent) if q % 10 not in {1, 7, 8}]
        assert engine.snapshot(22).counters.sent > engine.snapshot(24).counters.sent > 0
        assert engine.error is None
    finally:
        engine.shutdown()
        dp.close()


def test_without_the_loop_option_no_session_enters_it(scripted: ScriptedReflector) -> None:
    dp = create("socket", DataplaneConfig(port=0))
    dp.open()
    engine = SenderEngine(dp, compiled_loop=False)
    try:
        engine.add_session(_spec(1, scripted.port))
        engine.start()
        engine.start_session(1)
        assert engine.send_loop is None
        assert engine.probe_io is not None
        time.sleep(0.1)
        engine.stop_session(1)
        assert engine.wait_finished(1, 5.0)
        assert len(engine.results(1)) >= 5
    finally:
        engine.shutdown()
        dp.close()
