"""``sixlab ilnp host/status/cache``: the command group, cleanup on exit and after a crash."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sixlab.cli import main
from sixlab.cli.ilnp import add_parsers
from sixlab.testbed import Node, Testbed
from sixlab.wire.ilnp import LocatorEntry

PREFIX = "sixlab-t-"
TABLE = "sixlab_ilnp_000000000000000a"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sixlab")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    return parser


def test_parser_builds_host_status_cache() -> None:
    args = _parser().parse_args(
        [
            "ilnp",
            "host",
            "--nid",
            "0:0:0:a",
            "--locator",
            "2001:db8:a:0,10",
            "--locator",
            "2001:db8:d:0,20",
            "--interface",
            "eth0",
            "--interface",
            "eth1",
            "--policy",
            "bounded",
            "--store",
            "linear",
            "--control",
            "/tmp/x.sock",
        ]
    )
    assert args.locator == [  # each with the link named by @IF (none here)
        (LocatorEntry(0x2001_0DB8_000A_0000, 10), None),
        (LocatorEntry(0x2001_0DB8_000D_0000, 20), None),
    ]
    assert args.nid == 0xA
    assert args.interface == ["eth0", "eth1"]
    assert (args.policy, args.store, args.control, args.nonce) == (
        "bounded",
        "linear",
        "/tmp/x.sock",
        "always",
    )
    status = _parser().parse_args(["ilnp", "status", "--control", "/tmp/x.sock", "--json"])
    assert (status.query, status.json) == ("status", True)
    cache = _parser().parse_args(["ilnp", "cache"])
    assert cache.query == "cache"
    with pytest.raises(SystemExit):
        _parser().parse_args(["ilnp", "host", "--nid", "1", "--policy", "lru"])


def test_status_without_daemon_fails_cleanly(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sixlab.cli.ilnp", "status", "--control", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 1
    assert "No such file" in out.stderr


HOST = ["ilnp", "host", "--nid", "0:0:0:a", "--interface", "eth0"]
HOST_OK = [*HOST, "--locator", "2001:db8:a:0"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ilnp", "host", "--nid", "zz", "--locator", "2001:db8:a:0", "--interface", "e"], "zz"),
        ([*HOST_OK[:2], "--nid", "0x1ffffffffffffffff", *HOST_OK[4:]], "does not fit in 64"),
        ([*HOST_OK[:2], "--nid", "-1", *HOST_OK[4:]], "does not fit in 64 bits"),
        ([*HOST_OK[:2], "--nid", "0:0:a", *HOST_OK[4:]], "want ::a, 0:0:0:a or an integer"),
        ([*HOST, "--locator", "2001:db8:a"], "bad locator '2001:db8:a'"),
        ([*HOST, "--locator", "2001:db8:a:g"], "bad locator"),
        ([*HOST, "--locator", "2001:db8:a:0,70000"], "Preference 70000 does not fit"),
        ([*HOST, "--locator", "2001:db8:a:0,-1"], "Preference -1 does not fit"),
        ([*HOST, "--locator", "2001:db8:a:0,x"], "bad locator"),
        ([*HOST, "--locator", "2001:db8:a:0,1,2,3"], "is not L64[,PREF[,LIFETIME]]"),
        ([*HOST_OK, "--capacity", "0"], "0 is not in 1..16777216"),
        ([*HOST_OK, "--capacity", "-5"], "-5 is not in 1..16777216"),
        ([*HOST_OK, "--idle", "nan"], "must be a positive number"),
        ([*HOST_OK, "--idle", "soon"], "not a number of seconds"),
    ],
)
def test_bad_host_arguments_exit_2_with_one_clear_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert message in err.strip().splitlines()[-1]


def test_duplicate_locators_exit_2_before_anything_is_made(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [*HOST_OK, "--locator", "2001:db8:a:0,5", "--control", "/nonexistent/x.sock"]
    assert main(argv) == 2
    assert capsys.readouterr().err == "sixlab ilnp host: locators: 2001:db8:a:0 is given twice\n"


class Host:
    def __init__(self, tb: Testbed, tmp: Path) -> None:
        self.tb = tb
        self.node: Node = tb.add_node("h")
        peer = tb.add_node("p")
        tb.add_link(self.node, peer, if_a="eth0", if_b="p0", addr_a="2001:db8:a::a")
        self.control = str(tmp / "h.sock")

    def start(self) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "sixlab.cli.ilnp", "host", "--nid", "0:0:0:a"]
        argv += ["--locator", "2001:db8:a:0,10", "--interface", "eth0", "--policy", "bounded"]
        argv += ["--control", self.control]
        proc = self.tb.run_in(self.node, argv, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(b"ready nid=0:0:0:a address=fd00:2ff::a"), line
        return proc

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return self.tb.exec_in(
            self.node, [sys.executable, "-m", "sixlab.cli.ilnp", *argv, "--control", self.control]
        )

    def has_tun(self) -> bool:
        out = self.tb.exec_in(self.node, ["ip", "link", "show", "ilnp0"], check=False)
        return out.returncode == 0

    def has_table(self) -> bool:
        out = self.tb.exec_in(self.node, ["nft", "list", "tables"]).stdout
        return TABLE in out


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    with Testbed(prefix=PREFIX) as tb:
        yield Host(tb, tmp_path)


@pytest.mark.root
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--interface", "eth9"], "interface 'eth9': no such interface"),
        (["--hosts", "/nonexistent/hosts"], "hosts file /nonexistent/hosts: No such file"),
        (["--hosts", "{dir}"], "Is a directory"),
        (["--hosts", "{dir}/bad"], "line 2: want I-LV ... name [alias ...]"),
        (["--hosts", "{dir}/binary"], "codec can't decode"),
    ],
)
def test_unusable_configuration_is_one_line_exit_1_and_leaves_nothing(
    host: Host, tmp_path: Path, extra: list[str], message: str
) -> None:
    (tmp_path / "bad").write_text("2001:db8:b:0/0:0:0:b bob\nbob\n")
    (tmp_path / "binary").write_bytes(b"\xff\xfe 2001:db8:b:0/0:0:0:b bob\n")
    argv = [sys.executable, "-m", "sixlab.cli.ilnp", "host", "--nid", "0:0:0:a"]
    argv += ["--locator", "2001:db8:a:0", "--interface", "eth0", "--control", host.control]
    argv += [arg.format(dir=tmp_path) for arg in extra]
    out = host.tb.exec_in(host.node, argv, check=False)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("sixlab ilnp host: ")
    assert message in out.stderr
    assert out.stderr.count("\n") == 1
    assert not host.has_tun()
    assert not host.has_table()
    assert not Path(host.control).exists()


@pytest.mark.root
def test_status_cache_and_cleanup_on_sigterm(host: Host) -> None:
    proc = host.start()
    assert host.has_tun()
    assert host.has_table()
    status = json.loads(host.cli("status", "--json").stdout)
    assert status["ok"]
    assert status["nid"] == "0:0:0:a"
    assert status["identifier_address"] == "fd00:2ff::a"
    assert status["locators"] == [
        {"locator": "2001:db8:a:0", "preference": 10, "lifetime": 65535, "in_use": True}
    ]
    assert (status["policy"], status["store"], status["ilcc_size"]) == ("bounded", "hash", 0)
    assert json.loads(host.cli("cache", "--json").stdout) == {"ok": True, "entries": []}
    text = host.cli("status").stdout
    assert "NID 0:0:0:a" in text
    assert "policy bounded" in text
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert not host.has_tun()
    assert not host.has_table()
    assert not Path(host.control).exists()


@pytest.mark.root
def test_restart_after_a_crash_replaces_leftovers(host: Host) -> None:
    proc = host.start()
    proc.kill()
    proc.wait(timeout=10)
    assert host.has_table()  # a crash leaves the kernel drop behind...
    assert Path(host.control).exists()  # ...and the control socket file
    proc = host.start()  # ...which the next start replaces
    status = json.loads(host.cli("status", "--json").stdout)
    assert status["ok"]
    rules = host.tb.exec_in(host.node, ["nft", "list", "table", "ip6", TABLE]).stdout
    assert rules.count("drop") == 1
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 0
    assert not host.has_table()
