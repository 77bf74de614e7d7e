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
from collections.abc import Callable, Iterator
from ipaddress import IPv6Address
from typing import Any

import pytest

from sixlab.dataplane import probeio
from sixlab.dataplane.base import DataplaneConfig, create
from sixlab.dataplane.engine import SenderEngine, SenderSessionSpec
from sixlab.dataplane.udpsocket import SocketDataplane
from sixlab.stamp import DropReason, PacketLost, PacketSent, StampResult
from sixlab.stamp.batch import (
    LOOP_DROP,
    LOOP_DROPS,
    LOOP_DUP,
    LOOP_EVICT,
    LOOP_LOST,
    LOOP_RESULT,
    LOOP_SENT,
    LOOP_WINDOW_MAX,
    send_template,
)
from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig
from sixlab.stamp.sender import DUPLICATE_WINDOW, SenderConfig, State
from sixlab.wire import stamp as wire
from sixlab.wire.timestamp import TimestampFormat, ns_from_ntp, ntp_from_ns

LOOP = IPv6Address("::1")
MS = 10**6
SECOND = 10**9

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


def _drain(sock: socket.socket, wait: float = 0.2) -> list[bytes]:
    """What came to ``sock`` until ``wait`` seconds of quiet."""
    out = []
    while select.select([sock], [], [], wait)[0]:
        out.append(sock.recv(9000))
    return out


Out = tuple[int, int, int, int, int, int, int, int, int, int]
#: Answered bitmaps handed to loops in these tests, kept alive while they run.
_BITMAPS: list[bytearray] = []


def _add(
    loop: probeio.SendLoop,
    idx: int,
    record: bytes,
    *,
    ssid: int,
    due: int,
    interval: int,
    seq: int = 0,
    loss: int = 10**9,
    tai: int = 0,
    window: int = 8,
    outstanding: tuple[tuple[int, int, int], ...] = (),
    highest: int = -1,
    echoed: bool = False,
) -> bool:
    bitmap = bytearray(DUPLICATE_WINDOW // 8)
    _BITMAPS.append(bitmap)
    loop.lock()
    try:
        return loop.add(
            idx,
            record,
            ssid=ssid,
            timing=(due, interval, due, -1, loss, tai),
            seq=seq,
            highest=highest,
            window=window,
            outstanding=list(outstanding),
            answered=bitmap,
            echoed=echoed,
        )
    finally:
        loop.unlock()


def _take(loop: probeio.SendLoop) -> tuple[list[Out], probeio.LoopTake]:
    loop.lock()
    try:
        took = loop.take()
    finally:
        loop.unlock()
    assert took.failed == 0
    out = memoryview(loop.out)[: took.records * probeio.LOOP_OUT.size]
    return list(probeio.LOOP_OUT.iter_unpack(out)), took


def _serve(loop: probeio.SendLoop, ms: float, tick: int = 0) -> None:
    """Run the loop for ``ms`` milliseconds."""
    waker_r, waker_w = socket.socketpair()
    try:
        deadline = time.monotonic_ns() + int(ms * MS)
        while time.monotonic_ns() < deadline:
            loop.run(waker_r.fileno(), deadline, tick, 8 * MS)
            loop.lock()
            try:
                if loop.take().left:
                    loop.left_done()
            finally:
                loop.unlock()
    finally:
        waker_r.close()
        waker_w.close()


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
        assert _add(loop, idx, record, ssid=ssid, due=now, interval=interval, seq=10, window=64)
    # 60 ms at least, and until each has sent 3: a loaded machine may keep the loop
    # from the CPU for longer, and a late loop skips the slots it missed.
    out: list[Out] = []
    packets: list[bytes] = []
    waker_r, waker_w = socket.socketpair()
    try:
        deadline, give_up = now + 60 * MS, now + 30 * 10**9
        while time.monotonic_ns() < deadline or (
            min(sum(1 for r in out if r[4] == i) for i in (0, 1)) < 3
            and time.monotonic_ns() < give_up
        ):
            loop.run(waker_r.fileno(), time.monotonic_ns() + 20 * MS, 0, 8 * MS)
            out += _take(loop)[0]
            packets += _drain(sink, 0)
        ended = time.monotonic_ns()
    finally:
        waker_r.close()
        waker_w.close()
    loop.close()
    assert {r[8] for r in out} == {LOOP_SENT}
    assert len(packets) == len(out)
    by_session: dict[int, list[Out]] = {0: [], 1: []}
    for rec in out:
        by_session[rec[4]].append(rec)
    for idx, interval in ((0, 5 * MS), (1, 7 * MS)):  # no slot twice
        assert 3 <= len(by_session[idx]) <= (ended - now) // interval + 1
    for idx, interval in ((0, 5 * MS), (1, 7 * MS)):
        recs = by_session[idx]
        assert [r[5] for r in recs] == list(range(10, 10 + len(recs)))
        for rec in recs:
            ran, nxt = rec[1], rec[2]
            assert (nxt - now) % interval == 0
            assert ran < nxt <= ran + interval
        assert [r[2] for r in recs] == sorted({r[2] for r in recs})
    sent = {(int.from_bytes(p[14:16]), int.from_bytes(p[:4])): p for p in packets}
    for rec in out:
        payload = sent[rec[4] + 1, rec[5]]
        assert ns_from_ntp(int.from_bytes(payload[4:12])) == rec[0]


def test_a_late_loop_skips_the_slots_it_missed_and_counts_them(
    plane: SocketDataplane, sink: socket.socket
) -> None:
    """A slot 10.5 intervals in the past: one packet, the next slot the grid's first
    after now (``due_seq``'s arithmetic), the slots between counted as skipped.

    The interval is 1 s so that the next slot, half an interval after ``now``, cannot
    come due inside the run however late a loaded machine starts it (with 10 ms, a run
    that began 5 ms late sent that slot too)."""
    pio, loop = _loop(plane)
    template = send_template(SenderConfig(1, interval_ns=SECOND, fmt=TimestampFormat.PTP))
    assert template is not None
    record = pio.record(LOOP, sink.getsockname()[1], template, ptp=True, tai_ns=37 * 10**9)
    assert record is not None
    now = time.monotonic_ns()
    start = now - 10 * SECOND - SECOND // 2
    assert _add(loop, 0, record, ssid=1, due=start, interval=SECOND)
    r, w = socket.socketpair()
    loop.run(r.fileno(), now + MS, 0, 8 * MS)
    r.close()
    w.close()
    out, _ = _take(loop)
    assert len(out) == 1
    t1, ran, nxt, seq = out[0][0], out[0][1], out[0][2], out[0][5]
    assert seq == 0
    assert nxt == start + ((ran - start) // SECOND + 1) * SECOND
    loop.lock()
    try:
        held = loop.get(0, remove=True)
        assert loop.get(0) is None
    finally:
        loop.unlock()
    assert held is not None
    assert (held.due, held.seq, held.on_slot, held.highest, held.held) == (nxt, 1, 1, -1, True)
    assert held.skipped == (ran - start) // SECOND
    assert held.outstanding == [(0, t1, ran + 10**9)]
    (payload,) = _drain(sink)
    stamp = int.from_bytes(payload[4:12])  # PTP (IEEE 1588): TAI seconds, nanoseconds
    assert (stamp >> 32) * 10**9 + (stamp & 0xFFFF_FFFF) == t1 + 37 * 10**9
    loop.close()


def _reply(seq: int, t1: int, *, ssid: int = 7, r_ee: int = 0x0101, rseq: int = 0) -> bytes:
    """A 44-byte reflected packet (RFC 8762 §4.3.1) with NTP times, T2 = T3 = T1 + 1 µs."""
    t2 = ntp_from_ns(t1 + 1000)
    return wire.REFLECTOR_UNAUTH.pack(rseq, t2, r_ee, ssid, t2, seq, ntp_from_ns(t1), 0x0101, 64)


def _held_now(loop: probeio.SendLoop, indexes: range) -> list[bool]:
    loop.lock()
    try:
        got = [loop.get(i) for i in indexes]
    finally:
        loop.unlock()
    return [g is not None and g.held for g in got]


def _record(pio: probeio.ProbeIO, ssid: int, port: int, interval: int = 10**9) -> bytes:
    """The send record of a plain NTP session to ``[::1]:port``."""
    template = send_template(SenderConfig(ssid, interval_ns=interval))
    assert template is not None
    record = pio.record(LOOP, port, template, ptp=False, tai_ns=0)
    assert record is not None
    return record


def _run_once(loop: probeio.SendLoop, ms: int = 20, tick: int = 0) -> int:
    """One call of the loop, ``ms`` milliseconds at most: why it returned."""
    waker_r, waker_w = socket.socketpair()
    try:
        return loop.run(waker_r.fileno(), time.monotonic_ns() + ms * MS, tick, 8 * MS)
    finally:
        waker_r.close()
        waker_w.close()


def test_the_loop_answers_replies_as_the_core_does(plane: SocketDataplane) -> None:
    """Replies to a session the loop holds, with packets outstanding that it never
    sent (its slot is far off): a result, a duplicate, one reordered, a zero
    Multiplier (RFC 4656 §4.1.2), an echoed T1 that differs, a Seq never sent, a Seq
    sent before and no longer outstanding (late), a loss whose deadline passed (found
    at the first reply), a reply with TLVs that answers no packet (dropped as the core
    drops it); then a reply with TLVs that answers one takes the session out of the
    loop and is left, with everything after it, for the engine."""
    pio, loop = _loop(plane)
    template = send_template(SenderConfig(7, interval_ns=10**9))
    assert template is not None
    record = pio.record(LOOP, 9, template, ptp=False, tai_ns=0)
    assert record is not None
    now = time.monotonic_ns()
    wall = time.time_ns()
    far, t1 = now + 10**12, {s: wall - 10**6 * s for s in range(10)}
    outstanding = ((3, t1[3], now - 1), *((s, t1[s], far) for s in (4, 5, 6, 7, 8)))
    assert _add(loop, 0, record, ssid=7, due=far, interval=10**9, seq=10, outstanding=outstanding)
    client = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    client.bind(("::1", 0))
    to = ("::1", plane.local_port)
    replies = [
        _reply(5, t1[5], rseq=50),
        _reply(5, t1[5]),  # duplicate
        _reply(7, t1[7]),
        _reply(6, t1[6]),  # reordered: below 7
        _reply(4, t1[4], r_ee=0x0100),  # Multiplier zero
        _reply(8, t1[8] + 10**6),  # T1 not the one sent
        _reply(77, t1[0]),  # never sent
        _reply(2, t1[2]),  # sent before, not outstanding: late
        _reply(78, t1[0]) + b"\x00\x01\x00\x04" + bytes(4),  # TLVs, never sent
        _reply(4, t1[4]) + b"\x00\x01\x00\x04" + bytes(4),  # TLVs: the engine's
        _reply(4, t1[4]),  # after it: the engine's too
    ]
    for data in replies:
        client.sendto(data, to)
    client.close()
    time.sleep(0.05)
    assert _run_once(loop) == probeio.LOOP_SOCKET
    out, took = _take(loop)
    assert (took.received, took.left) == (len(replies), 2)
    kinds = [(r[8], r[5]) for r in out]
    assert kinds == [
        (LOOP_LOST, 3),
        (LOOP_RESULT, 5),
        (LOOP_DUP, 5),
        (LOOP_RESULT, 7),
        (LOOP_RESULT | 0x80, 6),
        (LOOP_DROP, 4),
        (LOOP_DROP, 8),
        (LOOP_DROP, 77),
        (LOOP_DROP, 2),
        (LOOP_DROP, 78),
        (LOOP_EVICT, 10),
    ]
    drops = {r[5]: LOOP_DROPS[r[6]] for r in out if r[8] == LOOP_DROP}
    assert drops == {
        4: DropReason.MULTIPLIER_ZERO,
        8: DropReason.BAD_TIMESTAMP,
        77: DropReason.UNKNOWN_SEQ,
        2: DropReason.LATE,
        78: DropReason.UNKNOWN_SEQ,
    }
    result = next(r for r in out if r[8] == LOOP_RESULT)
    assert result[:3] == (t1[5], t1[5] + 1000, t1[5] + 1000)
    assert (result[6], result[7], result[9]) == (50, 0x0101, 64)
    left = [probeio.RECORD.unpack_from(pio.records, i * probeio.RECORD.size) for i in range(2)]
    assert [rec[4] for rec in left] == [52, 44]
    loop.lock()
    try:
        held = loop.get(0, remove=True)
    finally:
        loop.unlock()
    assert held is not None
    assert not held.held
    assert (held.seq, held.highest) == (10, 7)
    assert held.outstanding == [(4, t1[4], far), (8, t1[8], far)]
    loop.close()


def test_an_ssid_zero_reply_concerns_only_the_sessions_that_claim_it(
    plane: SocketDataplane,
) -> None:
    """Four held sessions with Seq 4 outstanding, three to one reflector (one whose
    reflector returned its SSID before: ``echoed``), one to another. Replies with
    SSID 0 (RFC 8972 §3) from the first reflector: one that no session claims (T1
    nobody sent) is left for the engine and takes no session out; one claiming the
    echoed session's packet is a stray, dropped in the loop (``SSID_ZERO_STRAY``),
    the packet still outstanding; one with the T1 of the session of the other
    reflector is left and takes nothing out; one claiming a session without an echo
    takes that session, and only it, out of the loop and is left for its core."""
    pio, loop = _loop(plane)
    client = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    client.bind(("::1", 0))
    other = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    other.bind(("::1", 0))
    now = time.monotonic_ns()
    wall = time.time_ns()
    far = now + 10**12
    t1 = {i: wall - (i + 1) * MS for i in range(5)}
    ports = [client.getsockname()[1]] * 3 + [other.getsockname()[1]]
    for idx, port in enumerate(ports):
        assert _add(
            loop, idx, _record(pio, idx + 1, port), ssid=idx + 1, due=far, interval=10**9, seq=5,
            outstanding=((4, t1[idx], far),), echoed=idx == 1,
        )  # fmt: skip
    replies = [
        _reply(4, t1[4], ssid=0),  # nobody's T1
        _reply(4, t1[1], ssid=0),  # the echoed session's: a stray
        _reply(4, t1[3], ssid=0),  # the other reflector's session's T1
        _reply(4, t1[2], ssid=0),  # session 3's (no echo): it leaves the loop
    ]
    for data in replies:
        client.sendto(data, ("::1", plane.local_port))
    client.close()
    other.close()
    time.sleep(0.05)
    assert _run_once(loop) == probeio.LOOP_SOCKET
    out, took = _take(loop)
    assert (took.received, took.left) == (4, 3)
    assert [(r[8], r[4], r[5]) for r in out] == [(LOOP_DROP, 1, 4), (LOOP_EVICT, 2, 5)]
    assert LOOP_DROPS[out[0][6]] is DropReason.SSID_ZERO_STRAY
    assert _held_now(loop, range(4)) == [True, True, False, True]
    left = [probeio.RECORD.unpack_from(pio.records, i * probeio.RECORD.size) for i in range(3)]
    assert [rec[1] for rec in left] == [t1[4], t1[3], t1[2]]  # T1, Unix ns (NTP)
    loop.lock()
    try:
        held = loop.get(1)
    finally:
        loop.unlock()
    assert held is not None
    assert held.outstanding == [(4, t1[1], far)]  # the stray did not answer it
    loop.close()


def test_an_ssid_zero_reply_with_more_held_sessions_than_out_records(
    plane: SocketDataplane,
) -> None:
    """More held sessions than the loop has out records (``LOOP_OUT_CAP``): a reply
    with SSID 0 that none of them claims is left for the engine at once, and the loop
    goes on receiving (it once asked for a record of room per held session, which
    never came: the loop stopped receiving and sending)."""
    pio, loop = _loop(plane)
    client = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    client.bind(("::1", 0))
    port = client.getsockname()[1]
    far = time.monotonic_ns() + 10**12
    n = probeio.LOOP_OUT_CAP + 10
    for idx in range(n):
        record = _record(pio, idx + 1, port)
        assert _add(loop, idx, record, ssid=idx + 1, due=far, interval=10**9, seq=5)
    client.sendto(_reply(4, time.time_ns(), ssid=0), ("::1", plane.local_port))
    client.sendto(_reply(4, time.time_ns(), ssid=1), ("::1", plane.local_port))
    client.close()
    time.sleep(0.05)
    assert _run_once(loop) == probeio.LOOP_SOCKET
    out, took = _take(loop)
    assert (took.received, took.left) == (2, 1)
    assert [(r[8], r[4]) for r in out] == [(LOOP_DROP, 0)]  # Seq 4 never sent: unknown
    assert all(_held_now(loop, range(n)))
    loop.close()


def test_a_session_with_the_widest_window_is_served(
    plane: SocketDataplane, sink: socket.socket
) -> None:
    """A session whose window is ``LOOP_WINDOW_MAX`` slots (a loss timeout of about
    4,000 intervals, e.g. 3 s at 1 ms) is sent and answered: the loop keeps room in its
    out records for a whole window of losses (it once asked for more room than it
    had, and sent nothing for any session while such a one was due)."""
    pio, loop = _loop(plane)
    port = sink.getsockname()[1]
    now = time.monotonic_ns()
    for idx, window in enumerate((LOOP_WINDOW_MAX, 8)):
        record = _record(pio, idx + 1, port, MS)
        assert _add(loop, idx, record, ssid=idx + 1, due=now, interval=MS, window=window)
    # Until each has sent 5 (30 ms on an idle machine; a loaded one may keep the loop
    # from the CPU for longer, and a late loop skips the slots it missed).
    sent: list[int] = []
    packets: list[bytes] = []
    give_up = now + 30 * 10**9
    while min(sent.count(0), sent.count(1)) < 5 and time.monotonic_ns() < give_up:
        _run_once(loop, 30)
        out, _ = _take(loop)
        packets += _drain(sink, 0)
        sent += [r[4] for r in out if r[8] == LOOP_SENT]
    assert sent.count(0) >= 5
    assert sent.count(1) >= 5
    assert len(packets) == len(sent)
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    # The last: the longest before its loss timeout (1 s) passes.
    reply = [p for p in packets if int.from_bytes(p[14:16]) == 1][-1]
    t1 = ns_from_ntp(int.from_bytes(reply[4:12]))
    sock.sendto(_reply(int.from_bytes(reply[:4]), t1, ssid=1), ("::1", plane.local_port))
    sock.close()
    time.sleep(0.05)
    _run_once(loop, 5, tick=10**9)
    out, _ = _take(loop)
    assert [(r[4], r[5]) for r in out if r[8] == LOOP_RESULT] == [(0, int.from_bytes(reply[:4]))]
    loop.close()


def test_bad_input_is_refused_not_sent(plane: SocketDataplane) -> None:
    """A record too long or too short, no interval or loss timeout, SSID 0, a window that is not a
    power of two, too wide for the out records or holds fewer than the packets
    outstanding, a negative index, an
    index or SSID already held: refused (the engine keeps such a session on Python);
    a session it never had has no state."""
    pio, loop = _loop(plane)
    template = send_template(SenderConfig(1, interval_ns=MS))
    assert template is not None
    record = pio.record(LOOP, 9, template, ptp=False, tai_ns=0)
    assert record is not None
    now = time.monotonic_ns()
    three = ((0, 1, now), (1, 1, now), (2, 1, now))
    assert not _add(loop, 0, bytes(probeio.LOOP_RECORD_MAX + 8), ssid=1, due=now, interval=MS)
    assert not _add(loop, 0, bytes(8), ssid=1, due=now, interval=MS)
    assert not _add(loop, 0, record, ssid=1, due=now, interval=0)
    assert not _add(loop, 0, record, ssid=1, due=now, interval=MS, loss=0)
    assert not _add(loop, 0, record, ssid=0, due=now, interval=MS)
    assert not _add(loop, 0, record, ssid=1, due=now, interval=MS, window=6)
    too_wide = probeio.LOOP_OUT_CAP  # its losses would not fit in the out records
    assert not _add(loop, 0, record, ssid=1, due=now, interval=MS, window=too_wide)
    assert not _add(
        loop, 0, record, ssid=1, due=now, interval=MS, seq=3, window=2, outstanding=three
    )
    assert not _add(loop, 0, record, ssid=1, due=now, interval=MS, seq=2, outstanding=three)
    assert not _add(loop, -1, record, ssid=1, due=now, interval=MS)
    assert _add(loop, 5000, record, ssid=1, due=now + 10**9, interval=MS)
    assert not _add(loop, 5000, record, ssid=2, due=now, interval=MS)
    assert not _add(loop, 5001, record, ssid=1, due=now, interval=MS)
    loop.lock()
    try:
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
#: Every reply the script answers at once must come back within it, on a loaded
#: machine too, where this process's threads wait for a CPU now and then for over
#: 200 ms: the loss timeout of 200 ms these tests once had failed them so.
LOSS = 2000 * MS
#: Replies by Seq % 10: 1 dropped, 3 sent twice, 5 with SSID 0 (RFC 8972 §3) from a
#: reflector made with ``zero``, 7 with an SSID no session has, 8 held until the
#: sender reports the packet lost (past the loss timeout, however late the sender
#: runs), 9 held until the reply to the session's next packet has gone (reordered;
#: ``BEHIND_S`` at most, for a last packet); the rest answered at once. Only session
#: ``ZERO`` sends to the reflector that answers with SSID 0: its other replies carry
#: the SSID, so those are strays (an RFC 8972 reflector returns the SSID, RFC 8972
#: §3), dropped with its packet still waiting for a reply that never comes
#: (docs/stamp-interop.md, "Sessions and SSIDs").
BEHIND_S = LOSS / 2e9
NOBODY = 999
ZERO = 4

Peer = tuple[str, int]


class ScriptedReflector:
    """A reflector core behind a socket that mangles its replies by Seq (see ``LOSS``).

    ``lost`` is the senders' ``on_event`` hook: a Seq 8 reply leaves when its packet
    is reported lost, so it comes after the loss timeout by the sender's own clock,
    and a Seq 9 reply waits for the reply to its successor, so the order, not a
    delay, makes it reordered."""

    def __init__(self, *, zero: bool = False) -> None:
        self.zero = zero
        self.sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        self.sock.bind(("::1", 0))
        self.port = self.sock.getsockname()[1]
        self.core = Reflector(ReflectorSessionConfig(None))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        #: Seq 8 replies by (SSID, Seq) until reported lost; losses reported first.
        self._late: dict[tuple[int, int], tuple[bytes, Peer]] = {}
        self._reported: set[tuple[int, int]] = set()
        #: Seq 9 replies by (sender, SSID): (Seq, when it goes anyway, reply).
        self._behind: dict[tuple[Peer, int], tuple[int, float, bytes]] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()

    def lost(self, event: object) -> None:
        """A sender's event: a Seq 8 packet reported lost lets its reply go."""
        if not isinstance(event, PacketLost) or event.seq % 10 != 8:
            return
        key = (event.ssid, event.seq)
        with self._lock:
            held = self._late.pop(key, None)
            if held is None:
                self._reported.add(key)  # its packet has not come yet
        if held is not None:
            self.sock.sendto(*held)

    def _run(self) -> None:
        while not self._stop.is_set():
            if select.select([self.sock], [], [], 0.005)[0]:
                data, peer = self.sock.recvfrom(9000)
                self._answer(data, peer[:2])
            now = time.monotonic()
            for key, (_, when, reply) in list(self._behind.items()):
                if when <= now:
                    del self._behind[key]
                    self.sock.sendto(reply, key[0])

    def _answer(self, data: bytes, peer: Peer) -> None:
        out = self.core.reflect(data, time.time_ns(), time.time_ns, 64)
        if out is None:
            return
        reply = bytearray(out.payload)
        seq = int.from_bytes(data[:4])
        ssid = int.from_bytes(data[14:16])
        kind = seq % 10
        if kind == 1:
            return
        if kind == 7 or (kind == 5 and self.zero):
            reply[14:16] = (0 if kind == 5 else NOBODY).to_bytes(2)
        if kind == 8:
            with self._lock:
                if (ssid, seq) not in self._reported:
                    self._late[ssid, seq] = (bytes(reply), peer)
                    return
                self._reported.discard((ssid, seq))
        if kind == 9:
            self._behind[peer, ssid] = (seq, time.monotonic() + BEHIND_S, bytes(reply))
            return
        self.sock.sendto(reply, peer)
        if kind == 3:
            self.sock.sendto(reply, peer)
        behind = self._behind.get((peer, ssid))
        if behind is not None and behind[0] < seq:
            del self._behind[peer, ssid]
            self.sock.sendto(behind[2], peer)


@pytest.fixture
def scripted() -> Iterator[ScriptedReflector]:
    refl = ScriptedReflector()
    try:
        yield refl
    finally:
        refl.close()


@pytest.fixture
def ssid_zero() -> Iterator[ScriptedReflector]:
    refl = ScriptedReflector(zero=True)
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
        SenderConfig(ZERO, interval_ns=INTERVAL, loss_timeout_ns=LOSS),
    ]


#: Which sessions the loop holds halfway: not the one with a TLV (``loop_state``); the
#: one with stray SSID-0 replies too (the loop drops them).
HELD = {1: True, 2: True, 3: False, ZERO: True}


def _run(
    reflectors: tuple[ScriptedReflector, ScriptedReflector],
    *,
    loop: bool,
    seconds: float = 1.2,
    thread: bool = False,
) -> tuple[SenderEngine, dict[int, Any]]:
    ports = (reflectors[0].port, reflectors[1].port)
    dp = create("socket", DataplaneConfig(port=0))
    dp.open()
    sent: list[PacketSent] = []
    engine = SenderEngine(dp, compiled_loop=loop, on_event=_keep(sent, reflectors))
    engine.loop_thread = thread
    out: dict[int, Any] = {}
    try:
        for cfg in _configs():
            port = ports[cfg.ssid == ZERO]
            engine.add_session(SenderSessionSpec(cfg, LOOP, port))
        engine.start()
        assert (engine.send_loop is not None) is loop
        for cfg in _configs():
            engine.start_session(cfg.ssid)
        time.sleep(seconds / 2)
        with engine.lock:
            held = {s: e.loop_idx is not None for s, e in engine._entries.items()}
            asked = {s for peer in engine._by_peer.values() for s in peer}
        assert held == {s: loop and h for s, h in HELD.items()}
        assert asked == {s for s, h in held.items() if not h}  # for SSID 0: the unheld
        time.sleep(seconds / 2)
        for cfg in _configs():
            engine.stop_session(cfg.ssid)
        for cfg in _configs():
            assert engine.wait_finished(cfg.ssid, FINISH_S)
        _until(lambda: all(_late_in(engine, cfg.ssid) for cfg in _configs()))
        for cfg in _configs():
            snap = engine.snapshot(cfg.ssid)
            out[cfg.ssid] = (snap, engine.results(cfg.ssid), engine.lost(cfg.ssid))
        out[0] = [(e.ssid, e.seq) for e in sent]
        assert engine.error is None
    finally:
        engine.shutdown()
        dp.close()
    return engine, out


def _keep(into: list[PacketSent], reflectors: tuple[ScriptedReflector, ...]) -> Any:
    def hook(event: object) -> None:
        if isinstance(event, PacketSent):
            into.append(event)
        for reflector in reflectors:
            reflector.lost(event)

    return hook


#: How long a session stopped may take to finish (its loss timeout, and the pauses
#: of a loaded machine), and how long a condition is waited for: a bound for a test
#: that fails, never a wait of one that passes.
FINISH_S = 30.0


def _until(predicate: Callable[[], bool], timeout: float = FINISH_S) -> bool:
    """Whether ``predicate`` came true within ``timeout`` seconds (polled)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _late_in(engine: SenderEngine, ssid: int) -> bool:
    """Whether the held Seq 8 reply of every packet the session sent has come: each
    is dropped late, or as not running once the session finished."""
    c = engine.snapshot(ssid).counters
    late = c.dropped.get(DropReason.LATE, 0) + c.dropped.get(DropReason.NOT_RUNNING, 0)
    return late >= sum(1 for s in range(c.sent) if s % 10 == 8)


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

        unanswered = {1, 7, 8} | ({5} if cfg.ssid == ZERO else set())
        assert [r.seq for r in sorted(results, key=lambda r: r.seq)] == [
            s for s in seqs if s % 10 not in unanswered
        ]
        assert all(isinstance(r, StampResult) and r.ssid == cfg.ssid for r in results)
        assert all(r.t1_ns <= r.t2_ns <= r.t3_ns <= r.t4_ns for r in results)
        assert sorted(x.seq for x in lost) == [s for s in seqs if s % 10 in unanswered]
        assert c.received == len(results)
        assert c.lost == count(unanswered)
        assert c.duplicates == count({3})
        assert c.ssid_zero == 0
        strays = count({5}) if cfg.ssid == ZERO else 0
        assert c.dropped.pop(DropReason.SSID_ZERO_STRAY, 0) == strays
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


#: The run loop called from the engine's thread, and on a thread of its own.
THREAD = pytest.mark.parametrize("thread", [False, True], ids=["one-thread", "loop-thread"])


@THREAD
def test_an_engine_with_and_without_the_loop_counts_the_same_by_the_script(
    scripted: ScriptedReflector, ssid_zero: ScriptedReflector, thread: bool
) -> None:
    reflectors = (scripted, ssid_zero)
    looped, with_loop = _run(reflectors, loop=True, thread=thread)
    plain, without = _run(reflectors, loop=False)
    _check(looped, with_loop)
    _check(plain, without)


def _spec(ssid: int, port: int, count: int | None = None) -> SenderSessionSpec:
    cfg = SenderConfig(ssid, interval_ns=10 * MS, loss_timeout_ns=LOSS, count=count)
    return SenderSessionSpec(cfg, LOOP, port)


@THREAD
def test_sessions_change_while_the_loop_runs(scripted: ScriptedReflector, thread: bool) -> None:
    """Sessions added, started, stopped and removed while the loop serves others: each
    leaves the loop with its state (packets and Seq go on where the loop left them),
    the others keep their schedule, a removed one is gone, and a session the loop
    does not take (a count) runs beside it on Python."""
    dp = create("socket", DataplaneConfig(port=0))
    dp.open()
    engine = SenderEngine(dp, on_event=scripted.lost)
    engine.loop_thread = thread
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
        assert engine.wait_finished(23, FINISH_S)
        assert engine.snapshot(23).counters.sent == 8
        time.sleep(0.1)
        for s in (22, 24):
            engine.stop_session(s)
        with engine.lock:
            assert {s for peer in engine._by_peer.values() for s in peer} == {20, 22, 23, 24}
        for s in (20, 22, 23, 24):
            assert engine.wait_finished(s, FINISH_S)
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
    engine = SenderEngine(dp, compiled_loop=False, on_event=scripted.lost)
    try:
        engine.add_session(_spec(1, scripted.port))
        engine.start()
        engine.start_session(1)
        assert engine.send_loop is None
        assert engine.probe_io is not None
        _until(lambda: engine.snapshot(1).counters.sent >= 10)
        engine.stop_session(1)
        assert engine.wait_finished(1, FINISH_S)
        sent = engine.snapshot(1).counters.sent
        assert sent >= 10
        seqs = sorted(r.seq for r in engine.results(1))
        assert seqs == [q for q in range(sent) if q % 10 not in {1, 7, 8}]
    finally:
        engine.shutdown()
        dp.close()


@THREAD
def test_garbage_to_the_loop_is_counted_and_the_sessions_run_on(
    scripted: ScriptedReflector, thread: bool
) -> None:
    """Datagrams that are no reply (empty, short, 44 bytes of an SSID nobody has, a
    held session's SSID with a length no reply of it has, 9,000 bytes) while the loop
    runs two sessions: each counted by the path that takes it, the engine's thread
    alive, both sessions still in the loop (the odd one answers no packet: the loop
    counts it as the core would, a duplicate), both answered to the end."""
    dp = create("socket", DataplaneConfig(port=0))
    dp.open()
    engine = SenderEngine(dp, on_event=scripted.lost)
    engine.loop_thread = thread
    client = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        for s in (30, 31):
            engine.add_session(_spec(s, scripted.port))
        engine.start()
        for s in (30, 31):
            engine.start_session(s)
        time.sleep(0.15)
        to = ("::1", dp.local_port)
        odd = _reply(3, 0, ssid=30) + b"\x01"  # Seq 3, answered: a duplicate
        for data in (b"", bytes(10), _reply(3, 0, ssid=NOBODY), odd, bytes(9000)):
            client.sendto(data, to)
        time.sleep(0.15)
        with engine.lock:
            assert engine._entries[30].loop_idx is not None
            assert engine._entries[31].loop_idx is not None
        for s in (30, 31):
            engine.stop_session(s)
        nobody = 4  # empty, 10 bytes, SSID 999, 9,000 zero bytes (SSID 0, unclaimed)
        for s in (30, 31):
            assert engine.wait_finished(s, FINISH_S)
            c = engine.snapshot(s).counters
            seqs = sorted(r.seq for r in engine.results(s))
            assert seqs == [q for q in range(c.sent) if q % 10 not in {1, 7, 8}]
            assert c.duplicates == sum(1 for q in range(c.sent) if q % 10 == 3) + (s == 30)
            nobody += sum(1 for q in range(c.sent) if q % 10 == 7)
        assert engine.counters.no_session == nobody
        assert engine.error is None
    finally:
        client.close()
        engine.shutdown()
        dp.close()


def test_the_loop_sends_while_the_engine_files_a_long_batch(scripted: ScriptedReflector) -> None:
    """The loop sends nothing while the engine files what a call did: filing that takes
    longer than a tick (here a hook that sleeps on every ``PacketSent``) is broken by
    passes of the loop, so packets due meanwhile leave; and every session's counters
    and records are still those of the script."""
    dp = create("socket", DataplaneConfig(port=0))
    dp.open()
    engine = SenderEngine(dp, on_event=None)
    seen: list[tuple[int, int]] = []  # (takes, runs) at each PacketSent filed
    counts = [0, 0]

    def slow(event: object) -> None:
        if isinstance(event, PacketSent):
            if threading.current_thread() is engine._thread:  # not a stop's filing
                seen.append((counts[0], counts[1]))
            time.sleep(0.002)
        scripted.lost(event)

    engine.on_event = slow
    try:
        ssids = range(30, 40)
        for s in ssids:
            engine.add_session(_spec(s, scripted.port))
        engine.start()
        loop = engine.send_loop
        assert loop is not None
        run, take = loop.run, engine._take

        def counted_run(*a: Any, **k: Any) -> int:
            counts[1] += 1
            return run(*a, **k)

        def counted_take(loop: probeio.SendLoop) -> Any:
            counts[0] += 1
            return take(loop)

        loop.run = counted_run  # type: ignore[method-assign]
        engine._take = counted_take  # type: ignore[method-assign]
        for s in ssids:
            engine.start_session(s)
        time.sleep(0.5)
        for s in ssids:
            engine.stop_session(s)
        for s in ssids:
            assert engine.wait_finished(s, FINISH_S)
        _until(lambda: all(_late_in(engine, s) for s in ssids))
        by_take: dict[int, set[int]] = {}
        for took, runs in seen:
            by_take.setdefault(took, set()).add(runs)
        assert any(len(runs) > 1 for runs in by_take.values())  # a pass while filing
        for s in ssids:
            snap = engine.snapshot(s)
            assert snap.schedule.sent == snap.counters.sent > 0
            seqs = sorted(r.seq for r in engine.results(s))
            assert seqs == [q for q in range(snap.counters.sent) if q % 10 not in {1, 7, 8}]
        assert engine.error is None
    finally:
        engine.shutdown()
        dp.close()


#: The sender's receive paths: the run loop holding the session (on the engine's thread
#: or its own), recvmmsg in C without it, and the socket plane's recvmsg in Python.
PATHS = pytest.mark.parametrize(
    ("compiled", "loop", "thread"),
    [(True, True, False), (True, True, True), (True, False, False), (False, False, False)],
    ids=["loop", "loop-thread", "recvmmsg", "python"],
)


@PATHS
def test_a_truncated_datagram_is_counted_and_never_given_to_a_session(
    scripted: ScriptedReflector, compiled: bool, loop: bool, thread: bool
) -> None:
    """Datagrams longer than the receive buffer (9,000 bytes) that start as replies of a
    running session (Seq 3, answered: a duplicate; a Seq it never sent): cut by the
    kernel, malformed, so counted ``truncated`` by the engine and seen by no session,
    whichever path receives them and whether the run loop holds the session (whose
    state on the core is then stale) or not. The session's counters are the script's."""
    dp = create("socket", DataplaneConfig(port=0))
    dp.open()
    engine = SenderEngine(dp, compiled=compiled, compiled_loop=loop, on_event=scripted.lost)
    engine.loop_thread = thread
    client = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        engine.add_session(_spec(30, scripted.port))
        engine.start()
        engine.start_session(30)

        def held() -> bool:
            with engine.lock:
                return engine._entries[30].loop_idx is not None

        # Waits on conditions, not fixed sleeps: a loaded machine may take its time.
        time.sleep(0.05)
        assert _until(held) if loop else not held()
        for seq in (3, 999_999):
            client.sendto(_reply(seq, 0, ssid=30) + bytes(9100), ("::1", dp.local_port))
        assert _until(lambda: engine.counters.truncated >= 2)
        engine.stop_session(30)
        assert engine.wait_finished(30, FINISH_S)
        c = engine.snapshot(30).counters
        assert c.duplicates == sum(1 for q in range(c.sent) if q % 10 == 3)
        assert DropReason.UNKNOWN_SEQ not in c.dropped
        assert engine.counters.truncated == 2
        assert engine.counters.no_session == sum(1 for q in range(c.sent) if q % 10 == 7)
        assert engine.error is None
    finally:
        client.close()
        engine.shutdown()
        dp.close()
