"""The socket plane's batched C probe path (``sixlab.dataplane.probeio``) against the
pure-Python one, on loopback with a real reflector: the same records field by field, the
same drops for malformed replies, and a probe scapy decodes."""

from __future__ import annotations

import array
import select
import shutil
import socket
import time
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path

import pytest
from scapy.contrib import stamp as sc

from sixlab.dataplane import probeio
from sixlab.dataplane import udpsocket as u
from sixlab.dataplane.base import DataplaneConfig, Received, create
from sixlab.dataplane.engine import ReflectorEngine, SenderEngine, SenderSessionSpec
from sixlab.dataplane.udpsocket import SocketDataplane
from sixlab.stamp import DropReason, StampResult
from sixlab.stamp.batch import (
    due_seq,
    receive_one,
    receive_record,
    send_due,
    send_template,
    sent_at,
)
from sixlab.stamp.reflector import Reflector, ReflectorMode, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig, SenderSession
from sixlab.wire import stamp as wire
from sixlab.wire.timestamp import TimestampFormat, ns_from_ntp

LOOP = IPv6Address("::1")
KEY = b"sixteen byte key"
#: An Extra Padding TLV (RFC 8972 §4.1) of 8 bytes: the reflector copies it back.
PADDING = b"\x00\x01\x00\x08" + bytes(8)


@pytest.fixture
def reflector() -> Iterator[int]:
    """A socket-plane reflector on loopback: stateless by default, a stateful session
    for SSID 2 and a PTP one for SSID 3 (their replies exercise Seq and the Z bit)."""
    plane = create("socket", DataplaneConfig(port=0))
    plane.open()
    core = Reflector(ReflectorSessionConfig(None))
    engine = ReflectorEngine(plane, core)
    engine.add_session(ReflectorSessionConfig(2, mode=ReflectorMode.STATEFUL))
    engine.add_session(ReflectorSessionConfig(3, fmt=TimestampFormat.PTP))
    engine.add_session(ReflectorSessionConfig(5, key=KEY))
    engine.start()
    try:
        yield plane.local_port
    finally:
        engine.shutdown()
        plane.close()


def _plane() -> SocketDataplane:
    plane = create("socket", DataplaneConfig(port=0))
    assert isinstance(plane, SocketDataplane)
    plane.open()
    return plane


def _python_read(sock: socket.socket, port: int) -> Received:
    """The next datagram, left queued, as ``SocketDataplane.receive`` builds it."""
    data, anc, _, addr = sock.recvmsg(9000, u._CMSG_SPACE, socket.MSG_PEEK)
    src = u._unmap(socket.inet_pton(socket.AF_INET6, addr[0]))
    rx_ns, hop, dst, tclass = u._ancillary(anc, bytes(len(src)))
    return Received(data, src, dst, addr[1], port, hop, rx_ns, tclass)


def _configs() -> list[SenderConfig]:
    return [
        SenderConfig(1, interval_ns=10**6),
        SenderConfig(2, interval_ns=10**6, tlvs=PADDING, reflector_stateful=True),
        SenderConfig(3, interval_ns=10**6, fmt=TimestampFormat.PTP),
    ]


def test_both_paths_file_the_same_records_for_the_same_replies(reflector: int) -> None:
    """Each probe leaves through the C path (``sendmmsg``, T1 written in C); its reply
    is read first by the Python path (``recvmsg`` with MSG_PEEK, the plane's control
    message parsing, ``receive_one``) into one session, then by the C path
    (``recvmmsg``, ``receive_record``) into its twin: every record, drop and counter
    must match, and the C path's ``Received`` for the slow path must equal the plane's."""
    plane = _plane()
    pio = plane.probe_io()
    assert pio is not None, "gcc builds probeio.c on this machine"
    sock = plane._socket()
    engine = SenderEngine(plane)  # not started: only its record-to-Received rebuild
    try:
        for cfg in _configs():
            ours, theirs = SenderSession(cfg), SenderSession(cfg)
            wall = time.time_ns()
            for session in (ours, theirs):  # start sends Seq 0 itself: not sent here
                session.start(0, wall)
                assert len(session.datagrams_to_send()) == 1
            template = send_template(cfg)
            assert template is not None
            rec = pio.record(
                LOOP, reflector, template, ptp=cfg.fmt is TimestampFormat.PTP,
                tai_ns=cfg.tai_utc_offset_ns,
            )  # fmt: skip
            assert rec is not None
            for k in range(1, 13):
                now = k * cfg.interval_ns
                seq = due_seq(theirs, now, 0)
                assert seq == k
                t1, failed, _ = pio.send(bytearray(rec), array.array("I", [seq]))
                assert failed == 0
                sent_at(theirs, seq, t1)
                assert send_due(ours, template, now, t1) is not None
                assert select.select([sock], [], [], 2.0)[0], "no reply"
                rx = _python_read(sock, plane.config.port)
                assert rx.src == LOOP.packed
                receive_one(ours, rx.payload, now + 1, rx.rx_ns)
                assert pio.receive() == 1
                (fields,) = probeio.RECORD.iter_unpack(pio.records[: probeio.RECORD.size])
                assert engine._received(pio, 0, fields) == rx
                t4, f1, f2, f3, size, rseq, rs, ssid, r_ee, s_ee, *_, ttl, _flags, _, _ = fields
                assert t4 == rx.rx_ns
                tlvs = bytes(pio.data[wire.UNAUTH_PACKET_SIZE : size])
                row = (rseq, r_ee, ssid, rs, s_ee, ttl, f1, f2, f3)
                receive_record(theirs, now + 1, t4, row, tlvs)
            mine = [e for e in iter(ours.next_event, None) if isinstance(e, StampResult)]
            twin = [e for e in iter(theirs.next_event, None) if isinstance(e, StampResult)]
            assert len(mine) == 12
            assert mine == twin  # T1..T4, Seq, reflector Seq, TTL, error estimates, TLVs
            assert ours.counters == theirs.counters
            assert all(r.t1_ns <= r.t2_ns <= r.t3_ns for r in mine)
            assert [r.reflector_seq for r in mine] == (
                list(range(12)) if cfg.reflector_stateful else [r.seq for r in mine]
            )
            assert mine[0].tlvs == (PADDING if cfg.tlvs else b"")
            assert mine[0].reflector_error.fmt is cfg.fmt  # the reflector's session's
    finally:
        plane.close()


def _replies() -> list[bytes]:
    """Malformed or unexpected replies to SSID 1 Seq 0: what each path must drop."""
    base = wire.REFLECTOR_UNAUTH.pack(0, 1 << 32, 0x0001, 1, 1 << 32, 0, 1 << 32, 0x0001, 64)
    return [
        base[:20],  # shorter than the base packet
        base[:12] + b"\x00\x00" + base[14:],  # multiplier 0
        base[:14] + (9).to_bytes(2) + base[16:],  # another SSID
        base[:24] + (77).to_bytes(4) + base[28:],  # a Seq never sent
        base[:12] + b"\x40\x01" + base[14:16] + b"\xff" * 8 + base[24:],  # PTP ns >= 10^9
        base,  # T1 not the one sent
        bytes(44),  # SSID 0, all zero
    ]


def test_malformed_replies_are_counted_drops_on_both_paths() -> None:
    """The same bad replies, sent for real to the plane, through both paths: the same
    drop counts per reason, nothing raised; through the engine, no crash and every
    datagram counted."""
    plane = _plane()
    pio = plane.probe_io()
    assert pio is not None
    peer = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    peer.bind(("::1", 0))
    target = ("::1", plane.local_port)
    cfg = SenderConfig(1, interval_ns=10**6)
    ours, theirs = SenderSession(cfg), SenderSession(cfg)
    for s in (ours, theirs):
        s.start(0, 10**18)  # sends Seq 0 with T1 10^18
        assert len(s.datagrams_to_send()) == 1
    try:
        for payload in [*_replies(), bytes(9100)]:
            peer.sendto(payload, target)
            assert select.select([plane._socket()], [], [], 2.0)[0]
            rx = _python_read(plane._socket(), plane.config.port)
            if len(rx.payload) == 9000:  # truncated by both: counted, never matched
                assert pio.receive() == 1
                (rec,) = probeio.RECORD.iter_unpack(pio.records[: probeio.RECORD.size])
                assert rec[14] & probeio.TRUNCATED
                continue
            receive_one(ours, rx.payload, 1, rx.rx_ns)
            assert pio.receive() == 1
            (rec,) = probeio.RECORD.iter_unpack(pio.records[: probeio.RECORD.size])
            t4, t1, t2, t3, size, rseq, seq, ssid, r_ee, s_ee, *_, ttl, _flags, _, _ = rec
            if size < wire.UNAUTH_PACKET_SIZE:
                receive_one(theirs, bytes(pio.data[:size]), 1, t4)  # the engine's slow path
            else:
                row = (rseq, r_ee, ssid, seq, s_ee, ttl, t1, t2, t3)
                receive_record(theirs, 1, t4, row, b"")
        assert ours.counters == theirs.counters
        dropped = ours.counters.dropped
        for reason in (
            DropReason.TOO_SHORT, DropReason.MULTIPLIER_ZERO, DropReason.NO_SESSION,
            DropReason.UNKNOWN_SEQ, DropReason.BAD_TIMESTAMP,
        ):  # fmt: skip
            assert dropped.get(reason), reason
        # The engine: the same datagrams to a running compiled engine.
        engine = SenderEngine(plane)
        engine.add_session(SenderSessionSpec(cfg, LOOP, peer.getsockname()[1]))
        engine.start()
        assert engine.probe_io is not None
        engine.start_session(1)
        for payload in [*_replies(), bytes(9100)]:
            peer.sendto(payload, target)
        deadline = time.monotonic() + 5
        while engine.counters.received < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.counters.received == 8
        assert engine.error is None
        assert engine.running
        engine.shutdown()
    finally:
        peer.close()
        plane.close()


def test_a_probe_from_the_c_path_decodes_in_scapy() -> None:
    """scapy's independent STAMP layer (scapy.contrib.stamp) reads the C path's probe:
    Seq, SSID, Error Estimate and T1 the one ``send`` reported (NTP, RFC 8762 §4.2.1)."""
    plane = _plane()
    pio = plane.probe_io()
    assert pio is not None
    peer = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    peer.bind(("::1", 0))
    cfg = SenderConfig(4321, interval_ns=10**6, tlvs=PADDING)
    template = send_template(cfg)
    assert template is not None
    try:
        rec = pio.record(LOOP, peer.getsockname()[1], template, ptp=False, tai_ns=0)
        assert rec is not None
        t1, failed, _ = pio.send(bytearray(rec + rec), array.array("I", [7, 8]))
        assert failed == 0
        for seq in (7, 8):
            data, _ = peer.recvfrom(2000)
            probe = sc.STAMPSessionSenderTestUnauthenticated(data)
            assert probe.seq == seq
            assert probe.ssid == 4321
            assert probe.err_estimate.multiplier == cfg.effective_error_estimate.multiplier
            assert data[44:] == PADDING
            ts = int.from_bytes(data[4:12])
            assert ns_from_ntp(ts) == t1
            assert abs(float(probe.ts) - (t1 / 1e9 + 2208988800)) < 1e-3
    finally:
        peer.close()
        plane.close()


def _run_engine(port: int, compiled: bool) -> tuple[SenderEngine, dict[int, list[StampResult]]]:
    plane = _plane()
    engine = SenderEngine(plane, compiled=compiled)
    specs = [
        SenderSessionSpec(SenderConfig(s, interval_ns=5 * 10**6, count=6), LOOP, port)
        for s in range(10, 40)
    ]
    specs.append(
        SenderSessionSpec(
            SenderConfig(2, interval_ns=5 * 10**6, count=6, tlvs=PADDING, reflector_stateful=True),
            LOOP,
            port,
        )
    )
    # Integrity (HMAC, RFC 8762 §4.4) and a source address keep a session on the
    # Python path even when compiled; its replies reach it through the C receive.
    cfg = SenderConfig(5, interval_ns=5 * 10**6, count=6, key=KEY)
    specs.append(SenderSessionSpec(cfg, LOOP, port))
    specs.append(
        SenderSessionSpec(SenderConfig(50, interval_ns=5 * 10**6, count=6), LOOP, port, source=LOOP)
    )
    for spec in specs:
        engine.add_session(spec)
    engine.start()
    for spec in specs:
        engine.start_session(spec.config.ssid)
    out = {}
    for spec in specs:
        assert engine.wait_finished(spec.config.ssid, 10.0)
        out[spec.config.ssid] = engine.results(spec.config.ssid)
    engine.shutdown()
    plane.close()
    return engine, out


def test_an_engine_files_the_same_records_with_and_without_the_c_path(reflector: int) -> None:
    """A whole engine, compiled and not, against the same reflector: every probe
    answered, and the records agree in everything but the times."""
    compiled, with_c = _run_engine(reflector, True)
    python, without = _run_engine(reflector, False)
    assert compiled.probe_io is not None
    assert python.probe_io is None
    assert with_c.keys() == without.keys()
    for ssid, records in with_c.items():
        assert len(records) == 6, ssid
        for a, b in zip(records, without[ssid], strict=True):
            assert (a.ssid, a.seq, a.reflector_seq, a.ses_sender_ttl, a.tlvs) == (
                b.ssid,
                b.seq,
                b.reflector_seq,
                b.ses_sender_ttl,
                b.tlvs,
            )
            assert (a.sender_error, a.reflector_error) == (b.sender_error, b.reflector_error)
            assert a.t1_ns <= a.t2_ns <= a.t3_ns <= a.t4_ns
    assert compiled.counters.send_failed == python.counters.send_failed == 0


def test_without_a_compiler_the_helper_is_not_built_and_the_engine_runs_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reflector: int
) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    assert probeio.build(tmp_path) is None
    assert not list(tmp_path.iterdir())
    monkeypatch.setattr(probeio, "load", lambda: None)
    engine, records = _run_engine(reflector, True)
    assert engine.probe_io is None
    assert all(len(r) == 6 for r in records.values())


@pytest.mark.parametrize("bound", [None, IPv4Address("127.0.0.1")], ids=["dual-stack", "ipv4"])
def test_ipv4_reflectors_through_the_c_path(bound: IPv4Address | None) -> None:
    """An IPv4 reflector, from a dual-stack socket (IPv4-mapped addresses) and from an
    IPv4 socket: every probe answered through ``sendmmsg``/``recvmmsg``."""
    rplane = create("socket", DataplaneConfig(port=0, source=IPv4Address("127.0.0.1")))
    rplane.open()
    refl = ReflectorEngine(rplane, Reflector(ReflectorSessionConfig(None)))
    refl.start()
    plane = create("socket", DataplaneConfig(port=0, source=bound))
    plane.open()
    engine = SenderEngine(plane)
    try:
        target = IPv4Address("127.0.0.1")
        for ssid in (1, 2):
            cfg = SenderConfig(ssid, interval_ns=5 * 10**6, count=5)
            engine.add_session(SenderSessionSpec(cfg, target, rplane.local_port))
        engine.start()
        assert engine.probe_io is not None
        for ssid in (1, 2):
            engine.start_session(ssid)
        for ssid in (1, 2):
            assert engine.wait_finished(ssid, 10.0)
            records = engine.results(ssid)
            assert [r.seq for r in records] == list(range(5))
            assert all(r.t1_ns <= r.t2_ns <= r.t3_ns <= r.t4_ns for r in records)
        assert engine.counters.no_session == 0
    finally:
        engine.shutdown()
        plane.close()
        refl.shutdown()
        rplane.close()


def test_an_unwritable_cache_leaves_the_python_path(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    assert probeio.build(blocker / "cache") is None  # a file where the directory goes


def test_record_fields_are_the_record_without_its_addresses() -> None:
    """The engine unpacks a reply for ``receive_record`` with ``RECORD_FIELDS`` and
    only a reply for the Python path with ``RECORD``: the same bytes must give the same
    fields, whatever the addresses hold."""
    assert probeio.RECORD_FIELDS.size == probeio.RECORD.size
    values = (
        -5, 1 << 63, 2, 3, 44, 7, 8, 0xFFFF, 0x8001, 0x4001, 862, -1, 64, 255, 3,
        b"\x20\x01" + bytes(13) + b"\x01", bytes(15) + b"\x02",
    )  # fmt: skip
    packed = probeio.RECORD.pack(*values)
    assert probeio.RECORD_FIELDS.unpack(packed) == values[:15]
    assert [*probeio.RECORD_FIELDS.iter_unpack(packed * 2)] == [values[:15]] * 2
