"""The user-space fast paths on SRv6 traffic, on the two-path SRv6 testbed.

``sixlab stamp reflector --dataplane PLANE --interface eth0`` answers sessions over both
SRv6 paths (A: 5/12 ms, B: 20/3 ms), each with its own configured return SID list, as the
STAMP paper's reflector does: every probe carries an SRH (Segments Left 0 at the
reflector) and every reply a new one. The sessions must measure the emulated delays
within ±1 ms; the reflector's exit summary must show that the plane's fast path sent
the replies (``fast_replies``), not the general path; and every reply, captured where
it enters R2, must decode with scapy (an independent decoder) as IPv6 + SRH + UDP +
STAMP with the configured return path, a UDP checksum that scapy computes the same,
and the probe's SSID.
"""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from sixlab.testbed import SRv6Path, SRv6TwoPaths
from tests.integration._stamp_helpers import SIXLAB, run_sender

pytestmark = [pytest.mark.root, pytest.mark.interop]

TOLERANCE_MS = 1.0
COUNT = 10
WARMUP = 2
ETH_P_IPV6 = 0x86DD
PLANES = ["mmap"]


@contextmanager
def _reflector(tb: SRv6TwoPaths, plane: str, *args: str) -> Iterator[list[str]]:
    """The reflector CLI; yields a list that holds its exit summary once the block ends."""
    proc = tb.testbed.run_in(
        tb.reflector,
        [*SIXLAB, "reflector", "--dataplane", plane, "--interface", "eth0", *args],
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline().decode()
    assert "reflecting on" in line, line + proc.stderr.read().decode()
    summary: list[str] = []
    try:
        yield summary
    finally:
        proc.terminate()
        rest = proc.stderr.read().decode()
        assert proc.wait(10) == 0, rest
        proc.stderr.close()
        summary.extend(rest.splitlines())


def _plane_counters(summary: list[str], plane: str) -> dict[str, int]:
    for line in summary:
        if line.startswith(f"{plane} data plane:"):
            return {k: int(v) for k, v in re.findall(r"([a-z_-]+)=(\d+)", line)}
    raise AssertionError(f"no plane counters in {summary}")


def _check(doc: dict[str, Any], path: SRv6Path) -> None:
    assert (doc["sent"], doc["received"], doc["lost"]) == (COUNT, COUNT, 0)
    for key, want in (("direct_ns", path.forward_delay_ms), ("return_ns", path.return_delay_ms)):
        close = [abs(r[key] / 1e6 - want) <= TOLERANCE_MS for r in doc["records"]]
        assert sum(close) >= 0.9 * len(close), (key, [r[key] for r in doc["records"]])


@contextmanager
def _capture(tb: SRv6TwoPaths) -> Iterator[list[bytes]]:
    """Frames R2 receives from the reflector (its ``to_rfl`` end), kept when the block ends."""
    sock = tb.r2.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IPV6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    sock.bind(("to_rfl", ETH_P_IPV6))
    sock.setblocking(False)
    frames: list[bytes] = []
    try:
        yield frames
    finally:
        while True:
            try:
                data, addr = sock.recvfrom(65535)
            except BlockingIOError:
                break
            if addr[2] != socket.PACKET_OUTGOING:
                frames.append(data)
        sock.close()


def _check_replies(frames: list[bytes], tb: SRv6TwoPaths, sessions: dict[int, SRv6Path]) -> int:
    """Decode every STAMP reply with scapy; the number of replies checked."""
    from scapy.layers.inet import UDP  # noqa: PLC0415
    from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting  # noqa: PLC0415
    from scapy.layers.l2 import Ether  # noqa: PLC0415

    checked = 0
    for raw in frames:
        pkt = Ether(raw)
        if UDP not in pkt or pkt[UDP].sport not in sessions:
            continue
        path = sessions[pkt[UDP].sport]
        srh = pkt[IPv6ExtHdrSegmentRouting]
        # The SRH lists the segments last first (RFC 8754 §2); the packet is on its way
        # to the first one, R2's End.X towards the sender.
        assert [str(a) for a in reversed(srh.addresses)] == list(path.return_segments)
        assert srh.segleft == len(path.return_segments) - 1
        assert pkt[IPv6].dst == path.return_segments[0]
        assert pkt[IPv6].src == tb.reflector_addr
        # scapy's own checksum over the final destination (the last segment).
        again = Ether(raw)
        del again[UDP].chksum
        assert Ether(bytes(again))[UDP].chksum == pkt[UDP].chksum
        payload = bytes(pkt[UDP].payload)
        assert len(payload) == 44
        ssid = int.from_bytes(payload[14:16], "big")
        assert ssid == (1 if pkt[UDP].sport == 862 else 2)
        checked += 1
    return checked


@pytest.mark.parametrize(
    "mode", [[], ["--stateful"], ["--ptp"]], ids=["stateless", "stateful", "ptp"]
)
@pytest.mark.parametrize("plane", PLANES)
def test_fast_path_answers_both_srv6_paths(
    srv6_testbed: SRv6TwoPaths, plane: str, mode: list[str]
) -> None:
    tb = srv6_testbed
    a, b = tb.paths["A"], tb.paths["B"]
    ret_a, ret_b = ",".join(a.return_segments), ",".join(b.return_segments)
    with (
        _capture(tb) as frames,
        _reflector(
            tb, plane, "--port", "862", "--ssid", "1", "--return-segments", ret_a, *mode
        ) as sum_a,
        _reflector(
            tb, plane, "--port", "863", "--ssid", "2", "--return-segments", ret_b, *mode
        ) as sum_b,
    ):
        for ssid, port, path in (("1", "862", a), ("2", "863", b)):
            args = ("--ssid", ssid, "--port", port, *(["--ptp"] if "--ptp" in mode else []))
            run_sender(tb, path, *args, count=WARMUP)
            _check(run_sender(tb, path, *args, count=COUNT), path)
    for summary in (sum_a, sum_b):
        counters = _plane_counters(summary, plane)
        # The first reply to a new peer may take the general path while the neighbour
        # is resolved; every other one is written by the fast path.
        assert counters["fast_replies"] >= COUNT + WARMUP - 1, summary
    assert _check_replies(frames, tb, {862: a, 863: b}) == 2 * (COUNT + WARMUP)
