"""A running ILNP daemon's control socket under clients that misbehave.

The daemon runs in a namespace with few descriptors (``prlimit --nofile``), as it would
be under a tight limit; the clients are this process. Each test ends by asking the
daemon for its status: it must still be there and serving.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sixlab.ilnp._control import MAX_CLIENTS
from sixlab.ilnp.daemon import control_request
from sixlab.testbed import Testbed

pytestmark = pytest.mark.root

PREFIX = "sixlab-t-"
#: Enough for the daemon's own descriptors and MAX_CLIENTS connections, far fewer than
#: the clients the tests open.
NOFILE = 64


class Daemon:
    def __init__(self, tb: Testbed, tmp: Path) -> None:
        node = tb.add_node("h")
        peer = tb.add_node("p")
        tb.add_link(node, peer, if_a="eth0", if_b="p0", addr_a="2001:db8:a::a")
        self.control = str(tmp / "h.sock")
        argv = ["prlimit", f"--nofile={NOFILE}", sys.executable, "-m", "sixlab.cli.ilnp"]
        argv += ["host", "--nid", "0:0:0:a", "--locator", "2001:db8:a:0,10"]
        argv += ["--interface", "eth0", "--policy", "none", "--fastpath", "off"]
        argv += ["--control", self.control]
        self.proc = tb.run_in(node, argv, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().startswith(b"ready ")

    def connect(self) -> socket.socket:
        """A connection, retried while the listen backlog is full (EAGAIN)."""
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.control)
            except BlockingIOError:
                sock.close()
                assert self.proc.poll() is None, "the daemon died"
                time.sleep(0.01)
                continue
            return sock

    def status(self) -> dict[str, object]:
        return control_request(self.control, {"cmd": "status"})


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with Testbed(prefix=PREFIX) as tb:
        d = Daemon(tb, tmp_path)
        try:
            yield d
        finally:
            d.proc.terminate()
            try:
                d.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # a stalled loop never sees the signal flag
                d.proc.kill()
                d.proc.wait()


def test_a_client_that_never_reads_its_replies_does_not_stall_the_daemon(daemon: Daemon) -> None:
    greedy = daemon.connect()
    greedy.setblocking(False)
    with contextlib.suppress(BlockingIOError):  # pipeline until the socket is full
        while True:
            greedy.send(b'{"cmd": "status"}\n' * 64)
    assert daemon.status()["ok"] is True  # a blocked loop never answers this
    greedy.close()
    assert daemon.proc.poll() is None


def test_more_idle_clients_than_descriptors_are_refused_not_fatal(daemon: Daemon) -> None:
    idle = [daemon.connect() for _ in range(2 * NOFILE)]
    refused = 0
    with selectors.DefaultSelector() as sel:
        for sock in idle:
            sel.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + 20  # a guard against hanging, not a measurement
        while refused < len(idle) - MAX_CLIENTS and time.monotonic() < deadline:
            for key, _ in sel.select(1.0):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                if ready.recv(4096).startswith(b'{"ok": false, "error": "too many control'):
                    refused += 1
                sel.unregister(ready)
    assert refused == len(idle) - MAX_CLIENTS
    for sock in idle:
        sock.close()
    assert daemon.proc.poll() is None
    status = daemon.status()
    assert status["ok"] is True
    control = status["control"]
    assert isinstance(control, dict)
    assert control["refused"] == refused
