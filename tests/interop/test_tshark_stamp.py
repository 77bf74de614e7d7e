"""Packets on the wire, decoded by an independent dissector: Wireshark's TWAMP-Test.

STAMP's unauthenticated packets share TWAMP-Test's layout (RFC 8762 §4 keeps it), so
tshark decodes a capture of a sixlab session with ``-d udp.port==P,twamp.test``. This
checks sequence numbers, timestamps, Error Estimates and Ses-Sender TTL as tshark sees
them against what the sender recorded.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sixlab.dataplane.base import DataplaneConfig, create
from sixlab.dataplane.engine import ReflectorEngine, SenderEngine, SenderSessionSpec
from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig

pytestmark = [pytest.mark.interop, pytest.mark.root]

LO = ipaddress.IPv6Address("::1")
COUNT = 8


def test_tshark_decodes_a_session_as_twamp_test(tmp_path: Path) -> None:
    assert os.geteuid() == 0, "capturing needs root (CI runs as root)"
    tshark = shutil.which("tshark")
    assert tshark, "tshark is installed by ./run (Debian package tshark)"
    rplane = create("socket", DataplaneConfig(port=0, source=LO))
    splane = create("socket", DataplaneConfig(port=0, source=LO))
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
        # tshark prints "Capturing on 'Loopback: lo'" once the capture runs.
        deadline = time.monotonic() + 20
        while "Capturing on" not in cap.stderr.readline():
            assert time.monotonic() < deadline, "tshark did not start"
        time.sleep(1.0)  # the message comes slightly before the socket filter is live
        reflector = ReflectorEngine(rplane, Reflector(ReflectorSessionConfig(ssid=None)))
        sender = SenderEngine(splane)
        sender.add_session(
            SenderSessionSpec(SenderConfig(ssid=3, interval_ns=10**7, count=COUNT), LO, port)
        )
        reflector.start()
        sender.start()
        sender.start_session(3)
        assert sender.wait_finished(3, 10)
        records = sender.results(3)
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
        "twamp.test.timestamp",
        "twamp.test.sender_seq_number",
        "twamp.test.sender_ttl",
        "twamp.test.error_estimate.multiplier",
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
    by_seq = {r.seq: r for r in records}
    for row in to_reflector:
        assert int(row[1]) in by_seq
        assert int(row[5].split(",")[0]) > 0  # a valid Multiplier (first Error Estimate)
    for row in to_sender:
        seq, ttl = int(row[3]), int(row[4])
        assert seq in by_seq
        assert ttl == by_seq[seq].ses_sender_ttl == 64
    # tshark shows the reflector's Timestamp (T3) as a UTC date with nanoseconds.
    for row in to_sender:
        t3 = _tshark_time_ns(row[2])
        assert abs(t3 - by_seq[int(row[3])].t3_ns) <= 1  # NTP carries sub-ns units


def _tshark_time_ns(text: str) -> int:
    """'Nov 29, 2026 23:37:04.391617540 UTC' -> Unix ns."""
    stamp, frac = text.removesuffix(" UTC").rsplit(".", 1)
    whole = datetime.datetime.strptime(stamp, "%b %d, %Y %H:%M:%S").replace(tzinfo=datetime.UTC)
    return int(whole.timestamp()) * 10**9 + int(frac.ljust(9, "0")[:9])
