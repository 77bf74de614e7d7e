"""The standalone tools and the demo, run as a user runs them (subprocesses, loopback)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration._ports import free_port
from tests.integration._stamp_helpers import TIMEOUT_S

SIXLAB = [sys.executable, "-m", "sixlab"]


@pytest.fixture
def reflector(request: pytest.FixtureRequest) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    port = free_port()
    extra: list[str] = getattr(request, "param", [])
    proc = subprocess.Popen(
        [*SIXLAB, "stamp", "reflector", "--listen", "::1", "--port", str(port), *extra],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()  # "reflecting on ..." once the socket is bound
    assert "reflecting on" in line, line
    try:
        yield port, proc
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stderr.close()


def _send(port: int, *extra: str, count: int = 20) -> dict[str, Any]:
    out = subprocess.run(
        [
            *SIXLAB,
            "stamp",
            "sender",
            "::1",
            "--port",
            str(port),
            "--count",
            str(count),
            "--interval",
            "0.01",
            "--timeout",
            TIMEOUT_S,
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def _check(doc: dict[str, Any], count: int) -> None:
    assert (doc["sent"], doc["received"], doc["lost"]) == (count, count, 0)
    assert [r["seq"] for r in doc["records"]] == list(range(count))
    now = time.time_ns()
    for r in doc["records"]:
        assert now - 120 * 10**9 < r["t1_ns"] <= r["t2_ns"] <= r["t3_ns"] <= r["t4_ns"] <= now
        assert r["direct_ns"] == r["t2_ns"] - r["t1_ns"]
        assert r["return_ns"] == r["t4_ns"] - r["t3_ns"]
        assert r["rtt_ns"] == (r["t4_ns"] - r["t1_ns"]) - (r["t3_ns"] - r["t2_ns"])
        # Within the loss timeout (1 s; a later reply would be a loss, not a record).
        # Loopback takes microseconds, but a loaded host held one reply 55 ms.
        assert 0 < r["rtt_ns"] < 1_000_000_000
        assert r["ttl"] == 64  # ::1 hop limit of an unconnected socket
    for leg in ("direct", "return", "rtt"):
        s = doc["summary"][leg]
        assert s["min"] <= s["p50"] <= s["p99"] <= s["max"]


def test_sender_and_reflector_plain(reflector: tuple[int, subprocess.Popen[str]]) -> None:
    _check(_send(reflector[0]), 20)


@pytest.mark.parametrize("reflector", [["--stateful"]], indirect=True)
def test_stateful_reflector_counts_from_zero(
    reflector: tuple[int, subprocess.Popen[str]],
) -> None:
    doc = _send(reflector[0], "--ssid", "77")
    _check(doc, 20)
    assert [r["reflector_seq"] for r in doc["records"]] == list(range(20))


@pytest.mark.parametrize("reflector", [["--auth-key", "00112233aabbccdd"]], indirect=True)
def test_authenticated(reflector: tuple[int, subprocess.Popen[str]]) -> None:
    _check(_send(reflector[0], "--auth-key", "00112233aabbccdd"), 20)


@pytest.mark.parametrize("reflector", [["--auth-key", "00112233aabbccdd"]], indirect=True)
def test_wrong_key_gets_no_answer(reflector: tuple[int, subprocess.Popen[str]]) -> None:
    out = subprocess.run(
        [
            *SIXLAB,
            "stamp",
            "sender",
            "::1",
            "--port",
            str(reflector[0]),
            "--count",
            "3",
            "--interval",
            "0.01",
            "--timeout",
            "0.3",
            "--json",
            "--auth-key",
            "ff",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 1
    doc = json.loads(out.stdout)
    assert (doc["sent"], doc["received"], doc["lost"]) == (3, 0, 3)
    _port, proc = reflector
    proc.terminate()
    assert proc.stderr is not None
    assert "hmac-failed=3" in proc.stderr.read()


@pytest.mark.parametrize("reflector", [["--ptp"]], indirect=True)
def test_ptp_both_ways(reflector: tuple[int, subprocess.Popen[str]]) -> None:
    _check(_send(reflector[0], "--ptp", count=10), 10)


@pytest.mark.parametrize("reflector", [["--ptp"]], indirect=True)
def test_ntp_sender_ptp_reflector(reflector: tuple[int, subprocess.Popen[str]]) -> None:
    # Mixed formats: T2/T3 in TAI are put back on UTC with the TAI−UTC offset.
    _check(_send(reflector[0], count=10), 10)


@pytest.mark.parametrize("reflector", [["--ssid", "9"]], indirect=True)
def test_ssid_filter(reflector: tuple[int, subprocess.Popen[str]]) -> None:
    _check(_send(reflector[0], "--ssid", "9", count=5), 5)
    out = subprocess.run(
        [
            *SIXLAB,
            "stamp",
            "sender",
            "::1",
            "--port",
            str(reflector[0]),
            "--count",
            "2",
            "--interval",
            "0.01",
            "--timeout",
            "0.3",
            "--json",
            "--ssid",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert json.loads(out.stdout)["received"] == 0


def test_text_output(reflector: tuple[int, subprocess.Popen[str]]) -> None:
    out = subprocess.run(
        [
            *SIXLAB,
            "stamp",
            "sender",
            "::1",
            "--port",
            str(reflector[0]),
            "--count",
            "3",
            "--interval",
            "0.01",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = out.stdout.splitlines()
    assert [ln.split()[0] for ln in lines[:3]] == ["seq=0", "seq=1", "seq=2"]
    assert "3 sent, 3 received, 0 lost" in out.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["stamp", "sender", "not-an-address"],
        ["stamp", "sender", "::1", "--segments", ","],
        ["stamp", "sender", "::1", "--auth-key", "xyz"],
        ["stamp", "sender", "::1", "--port", "70000"],
        ["stamp", "reflector", "--ssid", "-1"],
        ["stamp", "sender", "::1", "--interval", "0"],
    ],
)
def test_bad_arguments_are_refused_clearly(args: list[str]) -> None:
    out = subprocess.run([*SIXLAB, *args], capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 2
    assert "error:" in out.stderr
    assert "Traceback" not in out.stderr


def test_reflector_port_in_use_is_a_clear_error() -> None:
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
        s.bind(("::1", 0))
        port = s.getsockname()[1]
        out = subprocess.run(
            [*SIXLAB, "stamp", "reflector", "--listen", "::1", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert out.returncode == 1
    assert "cannot bind UDP port" in out.stderr
    assert "Traceback" not in out.stderr


def test_demo_json() -> None:
    out = subprocess.run(
        [*SIXLAB, "demo", "--loopback", "--duration", "1", "--interval", "0.02", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    doc = json.loads(out.stdout)
    (path,) = doc["paths"]
    measured = path["measured"]
    assert measured["loss"] == 0
    for leg in ("direct_ms", "return_ms", "rtt_ms"):
        assert 0 < measured[leg]["min"] <= measured[leg]["p50"] <= measured[leg]["max"] < 50
