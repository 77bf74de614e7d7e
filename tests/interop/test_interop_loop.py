"""The compiled run loop (``SenderEngine(compiled_loop=True)``, ``sl_*`` in probeio.c)
against reflectors sixlab did not write: scapy's STAMP layers answering as an RFC 8972
reflector (the SSID returned) and as an RFC 8762-only one (SSID 0), and the Linux kernel
answering for a port nobody listens on.

Replies are dropped and duplicated by Seq (``_scapy_peers.ScapyReflector``'s ``drop``
and ``duplicate``), so every count is known whatever the number of packets sent. Which
sessions the loop holds is read from the engine (``loop_idx``): an RFC 8972 reflector's
sessions stay in the loop to the end; an RFC 8762-only reflector's go back to their
cores at its first reply (the loop answers only a reply with the session's SSID) and
finish there with the same records.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from ipaddress import ip_address
from typing import Any

import pytest

from sixlab.dataplane import probeio
from sixlab.dataplane.base import DataplaneConfig, create
from sixlab.dataplane.engine import SenderEngine, SenderSessionSpec
from sixlab.stamp import DropReason
from sixlab.stamp.sender import SenderConfig, State
from sixlab.wire.timestamp import TimestampFormat

from ._scapy_peers import ScapyReflector

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(probeio.load() is None, reason="no C compiler here"),
]

ADDRESSES = ["::1", "127.0.0.1"]
MS = 10**6
INTERVAL = 20 * MS
#: Long: scapy builds every reply in Python on a loaded machine.
LOSS = 1_000 * MS
SANE_NS = 10**9


def _ids(address: str) -> str:
    return "ipv6" if ":" in address else "ipv4"


def _dropped(seq: int) -> bool:
    return seq % 10 == 1


def _doubled(seq: int) -> bool:
    return seq % 10 == 3


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> Iterator[SenderEngine]:
    address: str = request.param
    plane = create("socket", DataplaneConfig(port=0, source=ip_address(address)))
    plane.open()
    eng = SenderEngine(plane)
    try:
        yield eng
    finally:
        eng.shutdown()
        plane.close()
        assert eng.error is None


def _held(engine: SenderEngine) -> dict[int, bool]:
    with engine.lock:
        return {ssid: e.loop_idx is not None for ssid, e in engine._entries.items()}


def _start(engine: SenderEngine, address: str, sessions: dict[int, tuple[int, bool]]) -> None:
    """``sessions``: SSID -> (reflector port, PTP)."""
    for ssid, (port, ptp) in sessions.items():
        cfg = SenderConfig(
            ssid,
            interval_ns=INTERVAL,
            loss_timeout_ns=LOSS,
            fmt=TimestampFormat.PTP if ptp else TimestampFormat.NTP,
        )
        engine.add_session(SenderSessionSpec(cfg, ip_address(address), port))
    engine.start()
    assert engine.send_loop is not None
    for ssid in sessions:
        engine.start_session(ssid)


def _finish(engine: SenderEngine, ssids: list[int]) -> None:
    for ssid in ssids:
        engine.stop_session(ssid)
    for ssid in ssids:
        assert engine.wait_finished(ssid, LOSS / 1e9 + 10)


def _check_session(
    engine: SenderEngine,
    ssid: int,
    *,
    ssid_zero: bool,
    stray: Callable[[int], bool] | None = None,
) -> int:
    """The session's records, losses, duplicates and drops as the reflector's
    ``drop``, ``duplicate`` and ``stray`` made them; the duplicates an RFC 8762-only
    reflector sent, which its sessions cannot claim (docs/stamp-interop.md), for the
    caller to count."""
    snap = engine.snapshot(ssid)
    c = snap.counters
    n = c.sent
    assert n >= 10
    assert snap.state is State.FINISHED
    answered = [s for s in range(n) if not _dropped(s)]
    doubled = sum(1 for s in answered if _doubled(s))
    records = engine.results(ssid)
    assert sorted(r.seq for r in records) == answered
    assert sorted(x.seq for x in engine.lost(ssid)) == [s for s in range(n) if _dropped(s)]
    assert (c.received, c.lost) == (len(answered), n - len(answered))
    assert c.ssid_zero == (len(answered) if ssid_zero else 0)
    assert c.duplicates == (0 if ssid_zero else doubled)
    strays = sum(1 for s in answered if stray is not None and stray(s))
    assert strays > 0 or stray is None
    assert c.dropped == ({DropReason.SSID_ZERO_STRAY: strays} if strays else {})
    assert snap.schedule.sent == n
    for r in records:
        assert r.ssid == ssid
        assert r.t1_ns <= r.t4_ns
        assert 0 <= r.rtt_ns < SANE_NS
        assert abs(r.direct_ns) < SANE_NS  # one clock, both ends
        assert r.reflector_seq == r.seq  # stateless: the sender's Seq
        assert r.ses_sender_ttl == 64
    return doubled if ssid_zero else 0


@pytest.mark.parametrize("engine", ADDRESSES, ids=_ids, indirect=True)
def test_the_loop_holds_the_sessions_of_an_rfc8972_reflector(engine: SenderEngine) -> None:
    """Two sessions (NTP and PTP) to a reflector that returns the SSID: both stay in
    the loop from the first reply to their stop, which answers every reply, lost and
    duplicated ones included, as the core would."""
    address = str(engine.dataplane.config.source)
    with ScapyReflector(address, echo_ssid=True, drop=_dropped, duplicate=_doubled) as peer:
        _start(engine, address, {1: (peer.port, False), 2: (peer.port, True)})
        for _ in range(4):
            time.sleep(0.3)
            assert _held(engine) == {1: True, 2: True}
        time.sleep(LOSS / 1e9 + 0.2)  # the first packets' losses declared in the loop
        assert _held(engine) == {1: True, 2: True}
        _finish(engine, [1, 2])
        assert not peer.errors
    for ssid in (1, 2):
        _check_session(engine, ssid, ssid_zero=False)
    assert engine.counters.no_session == 0
    assert engine.counters.send_failed == 0


@pytest.mark.parametrize("engine", ADDRESSES, ids=_ids, indirect=True)
def test_an_rfc8762_only_reflector_takes_its_sessions_out_of_the_loop(
    engine: SenderEngine,
) -> None:
    """A session to a reflector that answers SSID 0 leaves the loop at its first reply
    and finishes on its core with every record (counted ``ssid_zero``); a session of the
    same engine to an RFC 8972 reflector stays in the loop meanwhile. A duplicate from
    the RFC 8762-only reflector is claimed by no session (its packet is no longer
    outstanding: docs/stamp-interop.md) and counted ``no_session``."""
    address = str(engine.dataplane.config.source)
    with (
        ScapyReflector(address, drop=_dropped, duplicate=_doubled) as old,
        ScapyReflector(address, echo_ssid=True, drop=_dropped, duplicate=_doubled) as new,
    ):
        _start(engine, address, {5: (old.port, False), 6: (new.port, False)})
        deadline = time.monotonic() + 5
        while _held(engine)[5]:
            assert time.monotonic() < deadline, "the SSID-0 reply never took it out"
            time.sleep(0.01)
        time.sleep(1.2)
        assert _held(engine) == {5: False, 6: True}
        _finish(engine, [5, 6])
        assert not old.errors
        assert not new.errors
    unclaimed = _check_session(engine, 5, ssid_zero=True)
    assert engine.snapshot(5).counters.reflector_ssid_zero
    _check_session(engine, 6, ssid_zero=False)
    assert unclaimed > 0
    assert engine.counters.no_session == unclaimed


@pytest.mark.parametrize("engine", ADDRESSES, ids=_ids, indirect=True)
def test_the_loop_holds_sessions_whose_reflector_port_is_closed(engine: SenderEngine) -> None:
    """Nothing listens on the reflector's port: the kernel answers each packet with an
    ICMP port unreachable (the loop's socket is not connected: nothing is reported to
    it). The sessions stay in the loop, every packet is declared lost once, nothing is
    received and the engine runs on."""
    address = str(engine.dataplane.config.source)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as closed:
        closed.bind((address, 0))
        port = closed.getsockname()[1]
    _start(engine, address, {9: (port, False)})
    time.sleep(LOSS / 1e9 + 0.5)
    assert _held(engine) == {9: True}
    _finish(engine, [9])
    c = engine.snapshot(9).counters
    assert c.sent >= 10
    assert (c.received, c.lost) == (0, c.sent)
    assert sorted(x.seq for x in engine.lost(9)) == list(range(c.sent))
    assert engine.counters.received == 0


def _strayed(seq: int) -> bool:
    return seq % 10 == 5


@pytest.mark.parametrize("thread", [False, True], ids=["one-thread", "loop-thread"])
@pytest.mark.parametrize("engine", ADDRESSES, ids=_ids, indirect=True)
def test_ssid_zero_replies_do_not_push_an_rfc8972_reflectors_sessions_off_the_loop(
    engine: SenderEngine, thread: bool
) -> None:
    """From the address and port of reflectors that return the SSID come replies
    with SSID 0 besides their own (docs/stamp-interop.md, "Sessions and SSIDs"): copies
    of their replies (they claim a packet by Seq and T1) just before the real ones, and
    44-byte ones that claim nothing. The sessions stay in the loop; each copy is a
    stray dropped in the loop (``ssid-zero-stray``) and the real reply matched; the
    others are counted ``no_session``; no record is lost. The run loop on the engine's
    thread and on a thread of its own (``loop_thread``). One reflector per session:
    two sessions to one reflector that sent a Seq in one batch (one T1) would both
    claim its copy, which then is nobody's (``no_session``), as on the Python path."""
    engine.loop_thread = thread
    address = str(engine.dataplane.config.source)
    knobs: dict[str, Any] = {"drop": _dropped, "duplicate": _doubled, "stray": _strayed}
    with (
        ScapyReflector(address, echo_ssid=True, **knobs) as one,
        ScapyReflector(address, echo_ssid=True, ptp=True, **knobs) as two,
    ):
        _start(engine, address, {1: (one.port, False), 2: (two.port, True)})
        time.sleep(0.3)
        forged = bytes(14) + bytes(2) + bytes(28)  # SSID 0, Seq 0, T1 0: nobody's
        for _ in range(5):
            one.sock.sendto(forged, (address, engine.dataplane.local_port))
        for _ in range(3):
            time.sleep(0.3)
            assert _held(engine) == {1: True, 2: True}
        _finish(engine, [1, 2])
        assert not one.errors
        assert not two.errors
    for ssid in (1, 2):
        _check_session(engine, ssid, ssid_zero=False, stray=_strayed)
    assert engine.counters.no_session == 5
