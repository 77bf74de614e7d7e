"""The ILNP test network of tests/integration/test_ilnp_*.py (topology in
test_ilnp_daemon.py's docstring): router R, hosts A (two links), B and C, the daemons
each test starts, and a capture on a router interface (tests/integration/_tap.py). The
``net`` fixture (tests/integration/conftest.py) makes one per test.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sixlab.ilnp.daemon import control_request
from sixlab.testbed import Node, Testbed
from tests.integration._tap import Capture, capture
from tests.integration.conftest import TEST_PREFIX

HOSTS = """\
# I-LV hosts file of the test network
2001:db8:a:0/0:0:0:a,10  2001:db8:d:0/0:0:0:a,20  alice
2001:db8:b:0/0:0:0:b  bob
"""


@dataclass
class Daemon:
    node: Node
    proc: subprocess.Popen[bytes]
    control: str

    def request(self, cmd: str, **fields: Any) -> dict[str, Any]:
        return control_request(self.control, {"cmd": cmd, **fields})

    def status(self) -> dict[str, Any]:
        return self.request("status")

    def counter(self, name: str) -> int:
        status = self.status()
        value: int = status["counters"].get(name, 0) + status["drops"].get(name, 0)
        return value


class IlnpNet:
    def __init__(self, tb: Testbed, tmp: Path) -> None:
        self.tb = tb
        self.tmp = tmp
        self.r = tb.add_node("r", router=True)
        self.a = tb.add_node("a")
        self.b = tb.add_node("b")
        self.c = tb.add_node("c")
        tb.add_link(self.a, self.r, if_a="eth0", if_b="ra", addr_a="2001:db8:a::a")
        tb.add_link(self.a, self.r, if_a="eth1", if_b="ra2", addr_a="2001:db8:d::a")
        tb.add_link(self.b, self.r, if_a="eth0", if_b="rb", addr_a="2001:db8:b::b")
        tb.add_link(self.c, self.r, if_a="eth0", if_b="rc", addr_a="2001:db8:e::c")
        for ifname, prefix, ll in (
            ("ra", "2001:db8:a::1", "fe80::1"),
            ("ra2", "2001:db8:d::1", "fe80::2"),
            ("rb", "2001:db8:b::1", "fe80::1"),
            ("rc", "2001:db8:e::1", "fe80::1"),
        ):
            self.r.add_address(ifname, prefix)
            self.r.add_address(ifname, ll)
        # Link-local gateways: the hosts' routes survive re-addressing (mobility).
        self.ip(self.a, "route", "add", "default", "via", "fe80::1", "dev", "eth0", "metric", "100")
        self.ip(self.a, "route", "add", "default", "via", "fe80::2", "dev", "eth1", "metric", "200")
        for node in (self.b, self.c):
            self.ip(node, "route", "add", "default", "via", "fe80::1", "dev", "eth0")
        # The flood's source locator is routed to C through one next hop: answers to
        # thousands of random NIDs must not make the router resolve each of them (the
        # kernel's neighbour table is shared by every namespace, 1024 entries at most).
        self.c.add_address("eth0", "fe80::c")
        self.ip(self.r, "route", "add", "2001:db8:f::/64", "via", "fe80::c", "dev", "rc")
        self.hosts = tmp / "hosts"
        self.hosts.write_text(HOSTS)
        self.daemons: list[Daemon] = []
        self.captures: list[Capture] = []
        #: ``--fastpath`` of the daemons started from now on.
        self.fastpath = "on"

    def ip(self, node: Node, *argv: str) -> None:
        self.tb.exec_in(node, ["ip", "-6", *argv])

    def start(
        self,
        node: Node,
        nid: str,
        locators: list[str],
        *,
        interfaces: tuple[str, ...] = ("eth0",),
        policy: str = "socket",
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> Daemon:
        control = str(self.tmp / f"{node.name}.sock")
        argv = [sys.executable, "-m", "sixlab.cli.ilnp", "host", "--nid", nid]
        for loc in locators:
            argv += ["--locator", loc]
        for ifname in interfaces:
            argv += ["--interface", ifname]
        argv += ["--policy", policy, "--control", control, "--hosts", str(self.hosts)]
        argv += ["--fastpath", self.fastpath, *extra]
        proc = self.tb.run_in(
            node, argv, stdout=subprocess.PIPE, env=None if env is None else os.environ | env
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(b"ready"), f"daemon on {node.name} did not start: {line!r}"
        daemon = Daemon(node, proc, control)
        self.daemons.append(daemon)
        return daemon

    def start_pair(self, policy_b: str = "socket", **kwargs: Any) -> tuple[Daemon, Daemon]:
        a = self.start(self.a, "0:0:0:a", ["2001:db8:a:0,10"], **kwargs)
        b = self.start(self.b, "0:0:0:b", ["2001:db8:b:0"], policy=policy_b)
        return a, b

    def capture(self, ifname: str) -> Capture:
        """Every frame the router sends or receives on ``ifname`` (stopped at the end
        of the test if the test did not stop it)."""
        cap = capture(self.r, ifname)
        self.captures.append(cap)
        return cap

    def stop_daemons(self) -> None:
        for daemon in self.daemons:
            if daemon.proc.poll() is None:
                daemon.proc.terminate()
                daemon.proc.wait(timeout=10)
        for cap in self.captures:
            cap.stop()  # again is harmless


@contextlib.contextmanager
def ilnp_net(tmp: Path) -> Iterator[IlnpNet]:
    """The network in fresh namespaces; its daemons stopped, then the namespaces
    removed, when the body ends."""
    with Testbed(prefix=TEST_PREFIX) as tb:
        network = IlnpNet(tb, tmp)
        try:
            yield network
        finally:
            network.stop_daemons()
