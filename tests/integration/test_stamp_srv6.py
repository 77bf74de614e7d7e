"""STAMP over SRv6 on the namespace testbed: measured delays match the emulated ones.

The testbed's two paths have per-direction emulated delays (A: 5 ms forward, 12 ms
return; B: 20 ms forward, 3 ms return). All namespaces share the host clock, so the
one-way delays a session measures must match the configuration: this checks the whole
chain (SRH on the way out, SRv6 End.X on the routers, the reflector's return SID list,
T1..T4 in the right places) within ±1 ms.

The reflector's return path is given both ways that RFC 9503 and "High Performance Delay
Monitoring for SRv6 Based SD-WANs" (docs/papers.md) allow: configured on the reflector
per session (``--ssid N --return-segments``), or asked for by the
sender in a Return Path TLV.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from sixlab.testbed import SRv6Path, SRv6TwoPaths
from tests.integration._stamp_helpers import SIXLAB, measure_path

pytestmark = pytest.mark.root

TOLERANCE_MS = 1.0


@contextmanager
def _reflector(tb: SRv6TwoPaths, *args: str, plane: str = "socket") -> Iterator[None]:
    proc = tb.testbed.run_in(
        tb.reflector,
        [*SIXLAB, "reflector", "--dataplane", plane, *args],
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline().decode()
    assert "reflecting on" in line, line + proc.stderr.read().decode()
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stderr.close()


def _measured(tb: SRv6TwoPaths, path: SRv6Path, *args: str, count: int = 20) -> dict[str, Any]:
    """One session over ``path``, its delays checked against the path's (±1 ms, the median
    and three records in four; measured again if the records were only late, see
    ``measure_delays``)."""
    return measure_path(
        tb, path, *args, count=count, tolerance_ms=TOLERANCE_MS, spread_ms=TOLERANCE_MS, share=0.75
    ).doc


@pytest.mark.parametrize("mode", [[], ["--stateful"]], ids=["stateless", "stateful"])
def test_return_path_configured_on_the_reflector(
    srv6_testbed: SRv6TwoPaths, mode: list[str]
) -> None:
    tb = srv6_testbed
    a, b = tb.paths["A"], tb.paths["B"]
    with (
        _reflector(
            tb,
            "--port",
            "862",
            "--ssid",
            "1",
            "--return-segments",
            ",".join(a.return_segments),
            *mode,
        ),
        _reflector(
            tb,
            "--port",
            "863",
            "--ssid",
            "2",
            "--return-segments",
            ",".join(b.return_segments),
            *mode,
        ),
    ):
        _measured(tb, a, "--ssid", "1", "--port", "862")
        _measured(tb, b, "--ssid", "2", "--port", "863")


def test_return_path_requested_with_the_return_path_tlv(srv6_testbed: SRv6TwoPaths) -> None:
    tb = srv6_testbed
    with _reflector(tb):  # one SSID-agnostic reflector serves both paths
        for name in ("A", "B"):
            path = tb.paths[name]
            _measured(tb, path, "--return-segments", ",".join(path.return_segments))


def test_authenticated_over_srv6(srv6_testbed: SRv6TwoPaths) -> None:
    tb = srv6_testbed
    b = tb.paths["B"]
    key = "5ec7e75ec7e7"
    with _reflector(tb, "--auth-key", key, "--return-segments", ",".join(b.return_segments)):
        _measured(tb, b, "--auth-key", key, count=10)


def test_ptp_over_srv6(srv6_testbed: SRv6TwoPaths) -> None:
    tb = srv6_testbed
    a = tb.paths["A"]
    with _reflector(tb, "--ptp", "--return-segments", ",".join(a.return_segments)):
        _measured(tb, a, "--ptp", count=10)


def test_links_really_carry_their_paths(srv6_testbed: SRv6TwoPaths) -> None:
    """Path B's probes cross link B in both directions and never link A."""
    tb = srv6_testbed
    b = tb.paths["B"]
    before_a = tb.links["A"].stats()
    before_b = tb.links["B"].stats()
    with _reflector(tb, "--return-segments", ",".join(b.return_segments)):
        _measured(tb, b, count=10)
    time.sleep(0.1)
    after_a = tb.links["A"].stats()
    after_b = tb.links["B"].stats()
    for d in ("ab", "ba"):
        assert after_b[d]["forwarded"] - before_b[d]["forwarded"] >= 10
        # Link A sees at most neighbour discovery, no probe.
        assert after_a[d]["forwarded"] - before_a[d]["forwarded"] < 10


@pytest.mark.parametrize("plane", ["scapy", "mmap"])
@pytest.mark.parametrize("mode", [[], ["--stateful"]], ids=["stateless", "stateful"])
def test_capture_planes_over_srv6(srv6_testbed: SRv6TwoPaths, plane: str, mode: list[str]) -> None:
    """The same sessions with the reflector on a capture data plane (``--interface``)."""
    tb = srv6_testbed
    a, b = tb.paths["A"], tb.paths["B"]
    extra = ["--interface", "eth0", *mode]
    ret_a, ret_b = ",".join(a.return_segments), ",".join(b.return_segments)
    with (
        _reflector(
            tb, "--port", "862", "--ssid", "1", "--return-segments", ret_a, *extra, plane=plane
        ),
        _reflector(
            tb, "--port", "863", "--ssid", "2", "--return-segments", ret_b, *extra, plane=plane
        ),
    ):
        _measured(tb, a, "--ssid", "1", "--port", "862", count=10)
        _measured(tb, b, "--ssid", "2", "--port", "863", count=10)
