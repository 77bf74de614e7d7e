"""Where the ILNP daemon's control socket lives, and who may take or remove it."""

from __future__ import annotations

import selectors
import socket
from pathlib import Path
from typing import Any

import pytest

from sixlab.ilnp._control import ControlServer, default_control
from sixlab.ilnp._errors import ConfigError


def _server(path: Path) -> ControlServer:
    def handler(_line: bytes) -> dict[str, Any]:
        return {"ok": True}

    return ControlServer(str(path), handler, selectors.DefaultSelector())


def test_a_live_daemons_socket_is_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "c.sock"
    first = _server(path)
    first.open()
    try:
        second = _server(path)
        with pytest.raises(ConfigError, match="a running daemon answers there"):
            second.open()
        second.close()  # a refused server removes nothing
        assert path.is_socket()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(str(path))  # still the first server's
    finally:
        first.close()
    assert not path.exists()


def test_a_dead_daemons_socket_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "c.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # the file stays, nobody listens: a killed daemon's
    server = _server(path)
    server.open()
    server.close()
    assert not path.exists()


def test_a_path_that_is_not_a_socket_is_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "c.sock"
    path.write_text("precious")
    server = _server(path)
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        server.open()
    server.close()
    assert path.read_text() == "precious"


def test_close_leaves_a_socket_that_replaced_ours(tmp_path: Path) -> None:
    """Someone removed our socket and another server took the path: our exit must not
    delete theirs."""
    path = tmp_path / "c.sock"
    ours = _server(path)
    ours.open()
    path.unlink()
    theirs = _server(path)
    theirs.open()
    try:
        ours.close()
        assert path.is_socket()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(str(path))
    finally:
        theirs.close()
    assert not path.exists()


def test_default_path_names_the_network_namespace() -> None:
    inode = Path("/proc/thread-self/ns/net").stat().st_ino
    assert default_control() == f"/run/sixlab-ilnp-{inode}.sock"
