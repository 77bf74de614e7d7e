"""The ILNP daemon's control socket: bad requests, bad clients, bad replies.

The server is driven by hand here (its own selector, a clock that only moves when the
test says so); the daemon's command handling is exercised on an unopened daemon,
which needs neither root nor a network. ``tests/integration/test_ilnp_control.py``
does the same against a running daemon.
"""

from __future__ import annotations

import json
import selectors
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sixlab.cli.ilnp import main as ilnp_main
from sixlab.ilnp._control import (
    IDLE_TIMEOUT,
    MAX_CLIENTS,
    MAX_REQUEST,
    ControlServer,
    control_request,
)
from sixlab.ilnp._errors import ConfigError, ControlError
from sixlab.ilnp.daemon import DaemonConfig, IlnpDaemon
from sixlab.ilnp.host import MAX_LOCATORS, check_locator_set
from sixlab.wire.ilnp import LocatorEntry

LOC_A, LOC_B = 0x2001_0DB8_000A_0000, 0x2001_0DB8_000B_0000


class Harness:
    """A control server with a fake clock; ``turn`` is one pass of the daemon's loop."""

    def __init__(self, path: Path) -> None:
        self.selector = selectors.DefaultSelector()
        self.requests: list[bytes] = []
        self.server = ControlServer(str(path), self._handle, self.selector)
        self.server.open()
        self.path = str(path)
        self.now = 0.0

    def _handle(self, line: bytes) -> dict[str, Any]:
        self.requests.append(line)
        return {"ok": True, "echo": line.decode(errors="replace"), "pad": "x" * 50_000}

    def turn(self) -> None:
        for key, mask in self.selector.select(0):
            self.server.on_event(key.data, mask, self.now)
        self.server.expire(self.now)

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5)
        sock.connect(self.path)
        self.turn()  # accepted
        return sock

    def read_line(self, sock: socket.socket) -> bytes:
        buffer = b""
        while not buffer.endswith(b"\n"):
            self.turn()
            try:
                chunk = sock.recv(1 << 20, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            if not chunk:
                break
            buffer += chunk
        return buffer

    def close(self) -> None:
        self.server.close()
        self.selector.close()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path / "c.sock")
    yield h
    h.close()


def test_pipelined_requests_are_answered_one_per_turn_and_a_non_reader_holds_one_reply(
    harness: Harness,
) -> None:
    sock = harness.connect()
    sock.sendall(b"".join(b'{"n": %d}\n' % i for i in range(200)))
    for _ in range(20):  # the client reads nothing: each reply is ~50 KB
        harness.turn()
    (client,) = harness.server.clients
    assert len(harness.requests) < 20  # stopped, not answering into a full socket
    assert len(client.outbox) <= 60_000
    other = harness.connect()
    other.sendall(b'{"cmd": "status"}\n')
    assert json.loads(harness.read_line(other))["ok"]
    other.close()
    sock.close()


def test_overlong_request_gets_an_error_and_the_connection_closes(harness: Harness) -> None:
    sock = harness.connect()
    data = memoryview(b"x" * (MAX_REQUEST + 1))
    while data:  # the server reads in this thread: alternate sending and turns
        data = data[sock.send(data[:4096]) :]
        harness.turn()
    reply = harness.read_line(sock)
    assert json.loads(reply) == {"ok": False, "error": f"request longer than {MAX_REQUEST} bytes"}
    harness.turn()
    assert sock.recv(10) == b""
    assert harness.server.counters["too_long"] == 1
    assert harness.requests == []
    sock.close()


def test_clients_past_the_cap_are_told_and_closed(harness: Harness) -> None:
    idle = [harness.connect() for _ in range(MAX_CLIENTS)]
    extra = harness.connect()
    reply = json.loads(extra.recv(4096))
    assert reply == {"ok": False, "error": f"too many control connections ({MAX_CLIENTS})"}
    assert extra.recv(10) == b""
    assert harness.server.counters["refused"] == 1
    for sock in [*idle, extra]:
        sock.close()


def test_a_client_that_comes_as_the_others_leave_is_served(harness: Harness) -> None:
    """The cap counts live clients: ones that closed but whose end the loop has not
    read yet are not held against a newcomer (the loop may see the listener first)."""
    idle = [harness.connect() for _ in range(MAX_CLIENTS)]
    for sock in idle:
        sock.close()
    newcomer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    newcomer.settimeout(5)
    newcomer.connect(harness.path)
    harness.server.on_event(harness.server, selectors.EVENT_READ, harness.now)  # accept only
    assert harness.server.counters["refused"] == 0
    assert len(harness.server.clients) == 1
    newcomer.sendall(b"status\n")
    assert json.loads(harness.read_line(newcomer))["echo"] == "status"
    newcomer.close()


def test_silent_clients_are_closed_after_the_idle_timeout(harness: Harness) -> None:
    silent = harness.connect()
    halfway = harness.connect()
    halfway.sendall(b'{"cmd": "sta')  # and then nothing more
    harness.turn()
    harness.now = IDLE_TIMEOUT / 2
    active = harness.connect()
    harness.now = IDLE_TIMEOUT + 1
    harness.turn()
    assert harness.server.counters["idle_closed"] == 2
    assert silent.recv(10) == b""
    assert halfway.recv(10) == b""
    active.sendall(b"{}\n")
    assert json.loads(harness.read_line(active))["ok"]
    assert harness.requests == [b"{}"]
    for sock in (silent, halfway, active):
        sock.close()


def test_a_client_gone_mid_request_is_forgotten(harness: Harness) -> None:
    sock = harness.connect()
    sock.sendall(b'{"cmd": "st')
    sock.close()
    harness.turn()
    harness.turn()
    assert harness.server.clients == set()
    assert harness.requests == []


# --------------------------------------------------------------------- the commands


@pytest.fixture
def daemon() -> IlnpDaemon:
    """A daemon that was never opened: its commands work, it owns no socket."""
    return IlnpDaemon(
        DaemonConfig(
            nid=0xA,
            locators=(LocatorEntry(LOC_A, 10),),
            interfaces=("eth0",),
            policy="none",
            control="/nonexistent/never-opened.sock",
        )
    )


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b"garbage", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[" * 100_000, "not JSON"),
        (b"[]", "a request is a JSON object"),
        (b'"status"', "a request is a JSON object"),
        (b"{}", "unknown command None"),
        (b'{"cmd": 5}', "unknown command 5"),
        (b'{"cmd": ["status"]}', "unknown command ['status']"),
        (b'{"cmd": "reboot"}', "unknown command 'reboot' (known: status, cache"),
        (b'{"cmd": "set-locators"}', "locators: want a list"),
        (b'{"cmd": "set-locators", "locators": "2001:db8:b:0"}', "locators: want a list"),
        (b'{"cmd": "set-locators", "locators": [5]}', "locators: want a list"),
        (b'{"cmd": "set-locators", "locators": []}', "at least one locator"),
        (b'{"cmd": "set-locators", "locators": ["2001:db8:b"]}', "bad locator '2001:db8:b'"),
        (b'{"cmd": "set-locators", "locators": ["2001:db8:b:0,70000"]}', "Preference 70000"),
        (
            b'{"cmd": "set-locators", "locators": ["2001:db8:b:0,1", "2001:db8:b:0,2"]}',
            "locators: 2001:db8:b:0 is given twice",
        ),
        (b'{"cmd": "add-peer"}', "name: want a host name"),
        (b'{"cmd": "add-peer", "name": 5}', "name: want a host name"),
    ],
)
def test_bad_requests_get_one_clear_error_and_change_nothing(
    daemon: IlnpDaemon, line: bytes, error: str
) -> None:
    before = daemon.status()
    reply = daemon.handle_request(line)
    assert reply["ok"] is False
    assert error in reply["error"]
    assert "Traceback" not in reply["error"]
    assert daemon.status() == before
    assert daemon.host.local_locator == LOC_A


def test_set_locators_still_moves(daemon: IlnpDaemon) -> None:
    daemon.read_links = lambda: {"eth0": (True, {LOC_A, LOC_B})}
    reply = daemon.handle_request(
        b'{"cmd": "set-locators", "locators": ["2001:db8:b:0,5", "2001:db8:a:0,10"]}'
    )
    assert reply["ok"] is True
    assert [loc["locator"] for loc in reply["locators"]] == ["2001:db8:b:0", "2001:db8:a:0"]
    assert daemon.host.local_locator == LOC_B


def test_locator_sets_are_checked() -> None:
    entries = tuple(LocatorEntry(LOC_A + i) for i in range(MAX_LOCATORS))
    assert check_locator_set(entries) == entries
    with pytest.raises(ConfigError, match="at most 255"):
        check_locator_set((*entries, LocatorEntry(LOC_B)))
    with pytest.raises(ConfigError, match="given twice"):
        check_locator_set((LocatorEntry(LOC_A, 1), LocatorEntry(LOC_A, 2)))


# --------------------------------------------------------------------- the client side


def _one_shot_server(path: Path, answer: bytes) -> threading.Thread:
    """A fake daemon that reads one request, writes ``answer`` and closes."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"", "closed the connection without a reply"),
        (b"<html>\n", "the reply is not JSON"),
        (b"[1, 2]\n", "the reply is not a JSON object"),
    ],
)
def test_a_bad_reply_is_a_control_error_and_one_cli_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], answer: bytes, error: str
) -> None:
    path = tmp_path / "fake.sock"
    _one_shot_server(path, answer).join(0)
    with pytest.raises(ControlError, match=error):
        control_request(str(path), {"cmd": "status"})
    path.unlink()
    _one_shot_server(path, answer)
    assert ilnp_main(["status", "--control", str(path)]) == 1
    err = capsys.readouterr().err
    assert error in err
    assert err.count("\n") == 1


def test_a_dead_socket_is_one_cli_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))  # a leftover: the file exists, nobody listens
    assert ilnp_main(["cache", "--control", str(path)]) == 1
    err = capsys.readouterr().err
    assert "Connection refused" in err
    assert err.count("\n") == 1


def test_set_locators_refuses_a_locator_no_link_holds(daemon: IlnpDaemon) -> None:
    """Issue 12 #5: a move to an L64 that no interface (that is up) has an address
    under is refused with the reason, and changes nothing."""
    daemon.read_links = lambda: {"eth0": (True, {LOC_A}), "eth1": (False, {LOC_B})}
    before = daemon.status()
    reply = daemon.handle_request(b'{"cmd": "set-locators", "locators": ["2001:db8:b:0,5"]}')
    assert reply["ok"] is False
    assert "no interface holds an address under 2001:db8:b:0" in reply["error"]
    assert daemon.status() == before
    assert daemon.host.local_locator == LOC_A
