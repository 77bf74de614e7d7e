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

from sixlab.ilnp._cli import add_parsers
from sixlab.testbed import Node, Testbed

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
    assert args.locator == ["2001:db8:a:0,10", "2001:db8:d:0,20"]
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
        [sys.executable, "-m", "sixlab.ilnp._cli", "status", "--control", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 1
    assert "No such file" in out.stderr


class Host:
    def __init__(self, tb: Testbed, tmp: Path) -> None:
        self.tb = tb
        self.node: Node = tb.add_node("h")
        peer = tb.add_node("p")
        tb.add_link(self.node, peer, if_a="eth0", if_b="p0", addr_a="2001:db8:a::a")
        self.control = str(tmp / "h.sock")

    def start(self) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "sixlab.ilnp._cli", "host", "--nid", "0:0:0:a"]
        argv += ["--locator", "2001:db8:a:0,10", "--interface", "eth0", "--policy", "bounded"]
        argv += ["--control", self.control]
        proc = self.tb.run_in(self.node, argv, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(b"ready nid=0:0:0:a address=fd00:2ff::a"), line
        return proc

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return self.tb.exec_in(
            self.node, [sys.executable, "-m", "sixlab.ilnp._cli", *argv, "--control", self.control]
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
