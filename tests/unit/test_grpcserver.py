"""The shared unary wrapper of the agent and the controller servicers, without gRPC;
claiming a unix socket address."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import grpc
import pytest

from sixlab.southbound.rpcserver import claim_unix_address, unary


class _AbortedError(Exception):
    """What the fake context raises, as grpc's ``context.abort`` does."""


class _Context:
    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _AbortedError(code, details)


class _KnownError(Exception):
    pass


def _status_of(exc: Exception) -> tuple[grpc.StatusCode, str] | None:
    if isinstance(exc, _KnownError):
        return grpc.StatusCode.NOT_FOUND, str(exc)
    return None


unexpected: list[str] = []


class _Servicer:
    def __init__(self) -> None:
        self._lock = threading.Lock()

    @unary(_status_of)
    def locked(self, request: str) -> tuple[str, bool]:
        return request.upper(), self._lock.locked()

    @unary(_status_of, locked=False)
    def unlocked(self, request: str) -> tuple[str, bool]:
        return request, self._lock.locked()

    @unary(_status_of, unexpected=unexpected.append)
    def fails(self, request: str) -> str:
        if request == "known":
            raise _KnownError("no such thing")
        raise RuntimeError("a bug")


def test_reply_and_lock() -> None:
    servicer = _Servicer()
    assert servicer.locked("x", _Context()) == ("X", True)
    assert servicer.unlocked("y", _Context()) == ("y", False)
    assert not servicer._lock.locked()  # released after the call


def test_mapped_error_aborts_with_its_status() -> None:
    unexpected.clear()
    with pytest.raises(_AbortedError) as info:
        _Servicer().fails("known", _Context())
    assert info.value.args == (grpc.StatusCode.NOT_FOUND, "no such thing")
    assert unexpected == []


def test_unmapped_error_is_reported_and_reraised() -> None:
    unexpected.clear()
    servicer = _Servicer()
    with pytest.raises(RuntimeError, match="a bug"):
        servicer.fails("other", _Context())
    assert unexpected == ["fails"]
    assert not servicer._lock.locked()


@pytest.mark.parametrize("scheme", ["unix:", "unix://"])
def test_claim_unix_address_replaces_dead_and_refuses_live(tmp_path: Path, scheme: str) -> None:
    path = tmp_path / "a.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # the file stays, nobody listens
    claim_unix_address(f"{scheme}{path}")
    assert not path.exists()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(path))
        live.listen(1)
        with pytest.raises(OSError, match="a server answers there"):
            claim_unix_address(f"{scheme}{path}")
        assert path.is_socket()
