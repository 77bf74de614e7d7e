"""sixlab against independent STAMP code, both directions, over loopback.

What is independent here (the registries offer no STAMP daemon to install):

- scapy's ``scapy.contrib.stamp`` layers: ``_scapy_peers.ScapyReflector`` is an RFC
  8762-only reflector built on them (SSID returned as zero), and the sender side of the
  second half builds its packets with them and reads sixlab's replies with them.
- tshark's TWAMP-Test dissector (Wireshark 4.0): captures of sixlab sessions decoded.

The matrix: IPv6 and IPv4; NTP and PTP timestamps; with and without TLVs; authenticated
mode where the independent side knows it (scapy has no authenticated layout: no
authenticated cases against it; tshark decodes an authenticated packet as if it were
unauthenticated, so only its Sequence Numbers are compared). docs/stamp-interop.md says
what each decoder lacks.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path

import pytest
from scapy.contrib import stamp as sc
from scapy.fields import RawVal

from sixlab.dataplane.base import DataplaneConfig, create
from sixlab.dataplane.engine import ReflectorEngine, SenderEngine, SenderSessionSpec
from sixlab.stamp import DropReason
from sixlab.stamp.reflector import Reflector, ReflectorMode, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig
from sixlab.wire import stamp_tlv as t
from sixlab.wire.timestamp import TimestampFormat

from ._scapy_peers import ScapyReflector, ntp_seconds, ptp_raw

pytestmark = pytest.mark.interop

ADDRESSES = ["::1", "127.0.0.1"]
FORMATS = [TimestampFormat.NTP, TimestampFormat.PTP]
PADDING = t.ExtraPadding(bytes(range(20))).to_tlv().encode()
COUNT = 10
SANE_NS = 1_000_000_000


def _ids(address: str) -> str:
    return "ipv6" if ":" in address else "ipv4"


# ------------------------------------------------------- sixlab sender, scapy reflector


@pytest.mark.parametrize("address", ADDRESSES, ids=_ids)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@pytest.mark.parametrize("tlvs", [b"", PADDING], ids=["no-tlv", "padding"])
def test_sixlab_sender_against_an_rfc8762_only_reflector(
    address: str, fmt: TimestampFormat, tlvs: bytes
) -> None:
    plane = create("socket", DataplaneConfig(port=0, source=ip_address(address)))
    plane.open()
    engine = SenderEngine(plane)
    engine.start()
    try:
        with ScapyReflector(address, ptp=fmt is TimestampFormat.PTP) as peer:
            for ssid, strict in ((1, False), (2, True)):
                cfg = SenderConfig(
                    ssid=ssid,
                    interval_ns=5_000_000,
                    count=COUNT,
                    fmt=fmt,
                    tlvs=tlvs,
                    loss_timeout_ns=500_000_000,
                    strict_ssid=strict,
                )
                engine.add_session(SenderSessionSpec(cfg, ip_address(address), peer.port))
                engine.start_session(ssid)
                assert engine.wait_finished(ssid, 20)
            assert not peer.errors
            assert peer.answered == 2 * COUNT
        # Default: every reply accepted, the reflector flagged RFC 8762-only.
        c = engine.snapshot(1).counters
        assert (c.sent, c.received, c.lost, c.ssid_zero) == (COUNT, COUNT, 0, COUNT)
        assert c.reflector_ssid_zero
        records = engine.results(1)
        assert sorted(r.seq for r in records) == list(range(COUNT))
        for r in records:
            assert 0 <= r.rtt_ns < SANE_NS
            assert abs(r.direct_ns) < SANE_NS  # one clock: T2 - T1 near 0 up to the path
            assert r.ses_sender_ttl == 64
            assert r.reflector_error.fmt is fmt
            assert r.tlvs == tlvs  # copied unread by an RFC 8762 reflector
        # Strict: every reply refused, and said why.
        c = engine.snapshot(2).counters
        assert (c.received, c.lost) == (0, COUNT)
        assert c.dropped == {DropReason.SSID_ZERO: COUNT}
    finally:
        engine.shutdown()
        plane.close()
        assert engine.error is None


# ------------------------------------------------------- scapy sender, sixlab reflector


@pytest.fixture(params=ADDRESSES, ids=_ids)
def sixlab_reflector(request: pytest.FixtureRequest) -> Iterator[tuple[str, int, Reflector]]:
    address: str = request.param
    plane = create("socket", DataplaneConfig(port=0, source=ip_address(address)))
    plane.open()
    reflector = Reflector()
    reflector.add_session(ReflectorSessionConfig(ssid=7, mode=ReflectorMode.STATEFUL))
    reflector.add_session(ReflectorSessionConfig(ssid=8, fmt=TimestampFormat.PTP))
    engine = ReflectorEngine(plane, reflector)
    engine.start()
    try:
        yield address, plane.local_port, reflector
    finally:
        engine.shutdown()
        plane.close()
        assert engine.error is None


def _scapy_sender_packet(
    seq: int, ssid: int, fmt: TimestampFormat, tlvs: list[sc.STAMPTestTLV]
) -> sc.STAMPSessionSenderTestUnauthenticated:
    now = time.time_ns()
    ptp = fmt is TimestampFormat.PTP
    return sc.STAMPSessionSenderTestUnauthenticated(
        seq=seq,
        ts=RawVal(ptp_raw(now)) if ptp else ntp_seconds(now),
        err_estimate=sc.ErrorEstimate(S=0, Z=int(ptp), scale=0, multiplier=3),
        ssid=ssid,
        tlv_objects=tlvs,
    )


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@pytest.mark.parametrize("with_tlvs", [False, True], ids=["no-tlv", "tlvs"])
def test_scapy_sender_against_the_sixlab_reflector(
    sixlab_reflector: tuple[str, int, Reflector], fmt: TimestampFormat, with_tlvs: bool
) -> None:
    address, port, _ = sixlab_reflector
    # scapy's TLV flags are bit-reversed against IANA's (its "U" is 0x01): raw bytes.
    tlvs = (
        [
            sc.STAMPTestTLV(flags=0x80, type=1, len=6, value=b"padpad"),
            sc.STAMPTestTLV(flags=0x80, type=200, len=2, value=b"??"),  # unknown (FCFS)
        ]
        if with_tlvs
        else []
    )
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.settimeout(2.0)
        sock.bind((address, 0))
        for ssid, stateful in ((7, True), (8, False)):
            for seq in range(COUNT):
                sent = bytes(_scapy_sender_packet(100 + seq, ssid, fmt, tlvs))
                sock.sendto(sent, (address, port))
                data = sock.recv(9000)
                assert len(data) == len(sent)  # symmetric (RFC 8762 §4.3)
                got = sc.STAMPSessionReflectorTestUnauthenticated(data)
                assert got.ssid == ssid
                assert got.seq_sender == 100 + seq
                assert got.seq == (seq if stateful else 100 + seq)
                assert data[28:36] == sent[4:12]  # T1 echoed as sent
                assert int(fmt is TimestampFormat.PTP) == got.err_estimate_sender.Z
                # The reflector answers in its own format: session 8 is PTP.
                assert int(ssid == 8) == got.err_estimate.Z
                assert got.err_estimate.multiplier > 0
                assert got.ttl_sender == 64
                flags = [tlv.flags.value for tlv in got.tlv_objects]
                assert flags == ([0x00, 0x80] if with_tlvs else [])  # U: understood or not
                if ssid == 8:  # PTP: TAI seconds, within a minute of now
                    tai_s = struct.unpack("!I", data[4:8])[0]
                    assert abs(tai_s - 37 - time.time()) < 60


# ------------------------------------------------------------------- tshark's decoder


@pytest.mark.root
@pytest.mark.parametrize("address", ADDRESSES, ids=_ids)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@pytest.mark.parametrize(
    ("tlvs", "key"),
    [(b"", None), (PADDING, None), (b"", b"k" * 16), (PADDING, b"k" * 16)],
    ids=["plain", "padding", "auth", "auth-padding"],
)
def test_tshark_decodes_sixlab_sessions(
    tmp_path: Path, address: str, fmt: TimestampFormat, tlvs: bytes, key: bytes | None
) -> None:
    assert os.geteuid() == 0, "capturing needs root (CI runs as root)"
    tshark = shutil.which("tshark")
    assert tshark, "tshark is installed by ./run (Debian package tshark)"
    source = ip_address(address)
    rplane = create("socket", DataplaneConfig(port=0, source=source))
    splane = create("socket", DataplaneConfig(port=0, source=source))
    rplane.open()
    splane.open()
    port = rplane.local_port
    pcap = tmp_path / "stamp.pcap"
    cap = subprocess.Popen(
        [tshark, "-q", "-i", "lo", "-f", f"udp port {port}", "-w", str(pcap)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert cap.stderr is not None
    try:
        deadline = time.monotonic() + 20
        while "Capturing on" not in cap.stderr.readline():
            assert time.monotonic() < deadline, "tshark did not start"
        time.sleep(1.0)  # the message comes slightly before the socket filter is live
        reflector = ReflectorEngine(
            rplane, Reflector(ReflectorSessionConfig(ssid=None, key=key, fmt=fmt))
        )
        sender = SenderEngine(splane)
        cfg = SenderConfig(
            ssid=3,
            interval_ns=10**7,
            count=COUNT,
            fmt=fmt,
            key=key,
            tlvs=tlvs,
            loss_timeout_ns=5 * 10**9,  # a loaded CI machine: no reply declared lost early
        )
        sender.add_session(SenderSessionSpec(cfg, source, port))
        reflector.start()
        sender.start()
        sender.start_session(3)
        assert sender.wait_finished(3, 20)
        records = {r.seq: r for r in sender.results(3)}
        sender.shutdown()
        reflector.shutdown()
        time.sleep(0.5)  # let the capture flush the last frames
    finally:
        cap.terminate()
        cap.wait(10)
        cap.stderr.close()
        rplane.close()
        splane.close()
    assert len(records) == COUNT
    fields = [
        "udp.dstport",
        "twamp.test.seq_number",
        "twamp.test.sender_seq_number",
        "twamp.test.sender_ttl",
        "twamp.test.error_estimate.z",
        "twamp.test.padding",
        "twamp.test.timestamp",
        "twamp.test.mbz1",
    ]
    out = subprocess.run(
        [tshark, "-r", str(pcap), "-d", f"udp.port=={port},twamp.test", "-T", "fields"]
        + [arg for f in fields for arg in ("-e", f)]
        + ["-E", "separator=|"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    rows = [line.split("|") for line in out.stdout.splitlines() if line.strip()]
    to_reflector = [r for r in rows if int(r[0]) == port]
    to_sender = [r for r in rows if int(r[0]) != port]
    assert len(to_reflector) == len(to_sender) == COUNT
    # What tshark decodes of every packet, authenticated or not: the Sequence Number.
    assert sorted(int(r[1]) for r in to_reflector) == list(range(COUNT))
    assert sorted(int(r[1]) for r in to_sender) == sorted(records[s].reflector_seq for s in records)
    if key is not None:
        return  # the rest of an authenticated packet is at other offsets (module doc)
    ptp = fmt is TimestampFormat.PTP
    # Without the TWAMP-Control conversation tshark cannot tell the sender's packets from
    # the reflector's: it reads both with the reflector's layout (41 bytes), whose Seq,
    # Timestamp and Error Estimate sit where the sender's do. It knows nothing of RFC 8972:
    # the SSID is an "MBZ" field, the TLVs are Packet Padding after 3 MBZ bytes.
    for row in to_reflector:
        assert row[4].split(",")[0] in (("True", "1") if ptp else ("False", "0"))
        assert int(row[7], 0) == 3
        assert bytes.fromhex(row[5].replace(":", "")) == bytes(3) + tlvs
    for row in to_sender:
        seq, ttl = int(row[2]), int(row[3])
        assert ttl == records[seq].ses_sender_ttl == 64
        assert int(row[7], 0) == 3  # the SSID, as tshark's "MBZ"
        reflected = bytes([tlvs[0] & ~t.TlvFlag.U, *tlvs[1:]]) if tlvs else b""  # U cleared
        assert bytes.fromhex(row[5].replace(":", "")) == bytes(3) + reflected
        if not ptp:  # tshark reads every timestamp as NTP, whatever Z says
            assert abs(_tshark_time_ns(row[6]) - records[seq].t3_ns) <= 1


def _tshark_time_ns(text: str) -> int:
    """'Nov 29, 2026 23:37:04.391617540 UTC' -> Unix ns."""
    stamp, frac = text.removesuffix(" UTC").rsplit(".", 1)
    whole = datetime.datetime.strptime(stamp, "%b %d, %Y %H:%M:%S").replace(tzinfo=datetime.UTC)
    return int(whole.timestamp()) * 10**9 + int(frac.ljust(9, "0")[:9])


# ------------------------------------------------------------ the CLI, as a user sees it


def _cli_sender(address: str, port: int, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sixlab",
            "stamp",
            "sender",
            address,
            "--port",
            str(port),
            "--count",
            "5",
            "--interval",
            "0.01",
            "--timeout",
            "0.5",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("address", ADDRESSES, ids=_ids)
def test_cli_sender_reports_an_rfc8762_only_reflector(address: str) -> None:
    with ScapyReflector(address) as peer:
        doc = json.loads(_cli_sender(address, peer.port, "--json").stdout)
        text = _cli_sender(address, peer.port)
        strict = _cli_sender(address, peer.port, "--strict-ssid")
    assert (doc["received"], doc["reflector_ssid_zero"], doc["ssid_zero_replies"]) == (5, True, 5)
    assert text.returncode == 0
    assert "reflector_ssid_zero: 5 replies had SSID 0" in text.stdout
    assert strict.returncode == 1  # nothing received
    assert "5 replies had SSID 0 (an RFC 8762-only reflector) and were refused" in strict.stdout
