"""Every command's arguments: out-of-range numbers, non-UTF-8 text and exposed servers
are one clear line and a non-zero exit, never a traceback.

The commands run in this process through ``sixlab.cli.main`` (argparse exits 2 with
SystemExit); one test passes real undecodable bytes on a subprocess's command line.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from sixlab.cli import _argtypes as at
from sixlab.cli import main
from sixlab.cli.controller import agent_target, utc_time
from sixlab.southbound.rpcserver import is_local

BIG = str(2**64)  # 18446744073709551616
CREATE = [
    "controller", "session", "create", "p", "--sender", "s", "--reflector", "r",
    "--reflector-address", "::1",
]  # fmt: skip
SERVE = ["controller", "serve", "--db", "/nonexistent/c.db"]
HOST = ["ilnp", "host", "--nid", "1", "--locator", "fd00:0:0:1", "--interface", "eth0"]
UNDECODABLE = "\udcff"  # how Python hands over the command-line byte 0xff


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run ``sixlab ARGV``; it must exit 2 with a usage line, no traceback."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # sixlab stamp sender / reflector
        (["stamp", "sender", "::1", "--count", BIG], "--count: 18446744073709551616 is not in"),
        (["stamp", "sender", "::1", "--count", "0"], "0 is not in 1..4294967295"),
        (["stamp", "sender", "::1", "--interval", "1e300"], "at most 86400 s"),
        (["stamp", "sender", "::1", "--interval", "inf"], "must be a positive number"),
        (["stamp", "sender", "::1", "--interval", "1e-9"], "at least 1e-06 s"),
        (["stamp", "sender", "::1", "--timeout", "1e12"], "--timeout: 1e12 s: at most"),
        (["stamp", "sender", "::1", "--port", BIG], "is not in 0..65535"),
        (["stamp", "sender", "::1", "--source-port", "-1"], "is not in 0..65535"),
        (["stamp", "sender", "::1", "--ssid", BIG], "not a 16-bit value"),
        (["stamp", "reflector", "--port", "1e3"], "not a port number"),
        (["stamp", "reflector", "--ssid", "65536"], "not a 16-bit value"),
        # sixlab stamp agent
        (["stamp", "agent", "--role", "sender", "--max-workers", "0"], "0 is not in 1..1024"),
        (["stamp", "agent", "--role", "sender", "--max-workers", BIG], "is not in 1..1024"),
        (["stamp", "agent", "--role", "sender", "--max-workers", "1e9"], "not a number of"),
        (["stamp", "agent", "--role", "sender", "--realtime-priority", "0"], "0 is not in 1..99"),
        (["stamp", "agent", "--role", "sender", "--realtime-priority", "x"], "not a SCHED_FIFO"),
        # sixlab controller
        ([*CREATE, "--count", BIG], "--count: 18446744073709551616 is not in 0..4294967295"),
        ([*CREATE, "--duration", "1e12"], "--duration: 1e12 s: at most 31622400 s"),
        ([*CREATE, "--loss-timeout", "1e12"], "--loss-timeout: 1e12 s: at most 86400 s"),
        ([*CREATE, "--interval", "1e300"], "--interval: 1e300 s: at most 86400 s"),
        ([*CREATE, "--interval", "nan"], "must be a positive number"),
        ([*CREATE, "--port", BIG], "is not in 0..65535"),
        (["controller", "session", "wait", "p", "--timeout", "1e300"], "at most 86400 s"),
        (["controller", "results", "p", "--limit", str(2**32)], "is not in 0..100000"),
        (["controller", "results", "p", "--since-ns", BIG], "is not in 0..18446744073709551615"),
        (["controller", "stats", "p", "--since-ns", "-1"], "is not in 0.."),
        (["controller", "node", "init", "s", "--port", BIG], "is not in 0..65535"),
        ([*SERVE, "--poll-interval", "1e300"], "at most 86400 s"),
        ([*SERVE, "--poll-interval", "0"], "must be a positive number"),
        ([*SERVE, "--max-workers", "0"], "is not in 1..1024"),
        ([*SERVE, "--switch-interval", "1e-5"], "--switch-interval: 1e-5 s: at least 0.0005 s"),
        ([*SERVE, "--metrics", f"[::1]:{BIG}"], "is not in 0..65535"),
        # sixlab demo
        (["demo", "--duration", "1e12"], "--duration: 1e12 s: at most"),
        (["demo", "--duration", "nan"], "must be a positive number"),
        (["demo", "--interval", "1e300"], "--interval: 1e300 s: at most"),
        (["demo", "--interval", "0"], "must be a positive number"),
        (["demo", "--timeout", "0"], "must be a positive number"),
        (["demo", "--timeout", "1e12"], "--timeout: 1e12 s: at most"),
        (["demo", "--path-a", "inf,1"], "must be in 0..10000 ms"),
        (["demo", "--path-b", "nan,1"], "not a number of ms"),
        (["demo", "--metrics", "[::1]:x"], "not a port number"),
        # sixlab ilnp host
        ([*HOST, "--capacity", BIG], "is not in 1..16777216"),
        ([*HOST, "--capacity", "0"], "is not in 1..16777216"),
        ([*HOST, "--idle", "1e300"], "at most 31622400 s"),
    ],
)
def test_numbers_out_of_range_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert message in _refused(capsys, argv)


@pytest.mark.parametrize(
    ("argv", "ending"),
    [
        # A bound under a day is said in seconds alone (it read "at most 1 s (1.15741e-05
        # days)"); from a day up, in days too.
        ([*SERVE, "--switch-interval", "2"], "--switch-interval: 2 s: at most 1 s"),
        (["demo", "--interval", "61"], "--interval: 61 s: at most 60 s"),
        ([*CREATE, "--interval", "1e300"], "--interval: 1e300 s: at most 86400 s (1 day)"),
        ([*CREATE, "--duration", "1e12"], "at most 31622400 s (366 days)"),
    ],
)
def test_upper_bounds_are_said_in_units_that_fit(
    capsys: pytest.CaptureFixture[str], argv: list[str], ending: str
) -> None:
    assert _refused(capsys, argv).endswith(ending)


@pytest.mark.parametrize(
    "argv",
    [
        ["controller", "node", "add", UNDECODABLE, "[::1]:1", "--role", "sender"],
        ["controller", "node", "add", "s", f"unix:/tmp/{UNDECODABLE}", "--role", "sender"],
        ["controller", "node", "init", UNDECODABLE],
        ["controller", "node", "init", "s", "--dataplane", UNDECODABLE],
        ["controller", "node", "init", "s", "--interface", UNDECODABLE],
        ["controller", "node", "list", "--controller", f"unix:/tmp/{UNDECODABLE}"],
        ["controller", "session", "create", UNDECODABLE, *CREATE[4:]],
        [*CREATE[:4], "--sender", UNDECODABLE, *CREATE[6:]],
        ["controller", "session", "start", UNDECODABLE],
        ["controller", "session", "destroy", f"p{UNDECODABLE}"],
        ["controller", "results", UNDECODABLE],
        ["controller", "stats", UNDECODABLE],
        ["controller", "serve", "--db", "x", "--grpc", f"unix:/tmp/{UNDECODABLE}"],
        ["controller", "serve", "--db", f"/tmp/{UNDECODABLE}.db"],
        ["stamp", "sender", "::1", "--interface", UNDECODABLE],
        ["stamp", "reflector", "--interface", UNDECODABLE],
        ["stamp", "sender", f"::{UNDECODABLE}"],
        [*HOST, "--interface", UNDECODABLE],
    ],
)
def test_non_utf8_text_is_one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    line = _refused(capsys, argv)
    assert "not valid UTF-8" in line or "not an IPv6 address" in line


def test_names_are_checked_like_the_api_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert "at most 64" in _refused(capsys, ["controller", "session", "start", "x" * 65])
    assert "blanks" in _refused(capsys, ["controller", "session", "start", "a b"])
    assert "empty" in _refused(capsys, ["controller", "session", "start", ""])


def test_undecodable_bytes_on_a_real_command_line() -> None:
    argv: list[str | bytes] = [sys.executable, "-m", "sixlab", "controller", "node", "add"]
    out = subprocess.run(
        [*argv, b"\xff\xfe", "[::1]:1", "--role", "sender"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    err = out.stderr.decode()
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].endswith(r"argument name: not valid UTF-8: '\xff\xfe'")


def test_bounds_hold_at_the_edges() -> None:
    assert at.count(str(at.MAX_COUNT)) == at.MAX_COUNT
    assert at.interval("86400") == 86400.0
    assert at.duration(str(366 * 86400)) == 366 * 86400.0
    assert at.u64(str(2**64 - 1)) == 2**64 - 1
    with pytest.raises(argparse.ArgumentTypeError):
        at.count(str(at.MAX_COUNT + 1))
    # Every accepted time converts to ns that fit a uint64 field.
    for parse, longest in (
        (at.interval, "86400"),
        (at.timeout, "86400"),
        (at.duration, "31622400"),
        (at.seconds, "31622400"),
    ):
        assert round(parse(longest) * 1e9) < 2**64


# ------------------------------------------------------------------- agent addresses


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("fc00::9", "[fc00::9]:50051"),
        ("192.0.2.7", "192.0.2.7:50051"),
        ("[fc00::9]:50052", "[fc00::9]:50052"),
        ("agent.example:7", "agent.example:7"),
        ("unix:/run/a.sock", "unix:/run/a.sock"),
    ],
)
def test_agent_address_forms(text: str, target: str) -> None:
    assert agent_target(text) == target


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("fc00::9:x", "goes in brackets, e.g. [fc00::9]:50051"),
        ("host", "HOST:PORT"),
        ("[fc00::9]:0", "port '0'"),
        ("[fc00::9]:", "port ''"),
    ],
)
def test_agent_address_refused(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message.replace("[", r"\[")):
        agent_target(text)


def test_utc_time() -> None:
    assert utc_time(1_778_340_001_123_456_789) == "2026-05-09T15:20:01.123456Z"
    assert utc_time(None) is None
    assert utc_time(2**64 - 1) == "2554-07-21T23:34:33.709551Z"  # the largest uint64 ns


# -------------------------------------------------------------------------- exposure


@pytest.mark.parametrize(
    ("address", "local"),
    [
        ("unix:/run/sixlab/a.sock", True),
        ("unix-abstract:sixlab", True),
        ("[::1]:50051", True),
        ("127.0.0.1:50051", True),
        ("127.8.0.1:1", True),
        ("localhost:50051", True),
        ("[::ffff:127.0.0.1]:1", True),
        ("ipv6:[::1]:50051", True),
        ("[::]:50051", False),
        ("0.0.0.0:50051", False),
        ("[fc00::2]:50051", False),
        ("192.0.2.1:50051", False),
        ("agent.example:50051", False),
    ],
)
def test_is_local(address: str, local: bool) -> None:
    assert is_local(address) is local


def test_agent_on_a_network_address_needs_mtls(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["stamp", "agent", "--role", "sender", "--grpc", "[::]:0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sixlab stamp agent: [::]:0 is reachable from the network:")
    assert "--tls-ca" in err
    assert "--insecure" in err
    assert len(err.splitlines()) == 1
    # Server-only TLS still lets anyone call: refused the same way (before the files
    # are read, so they need not exist).
    argv = ["stamp", "agent", "--role", "sender", "--grpc", "[::]:0"]
    tls = ["--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem")]
    assert main([*argv, *tls]) == 2
    assert "reachable from the network" in capsys.readouterr().err


def test_controller_on_a_network_address_needs_mtls(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = tmp_path / "c.db"
    assert main(["controller", "serve", "--db", str(db), "--grpc", "0.0.0.0:0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sixlab controller: 0.0.0.0:0 is reachable from the network:")
    assert len(err.splitlines()) == 1
    assert not db.exists()  # refused before anything was made
