"""What the agent's and the controller's gRPC servicers share: a unary method run under
the servicer's lock, with its typed errors turned into gRPC statuses.

Theory of operation
-------------------
Each server keeps its own table from its errors to statuses, a ``status_of`` function
(``sixlab.southbound.agent._status_of``, ``sixlab.controller.northbound._status_of``):
what an error means is that server's business. This module holds only the mechanics
of a call wrapped by :func:`unary`:

1. if ``locked``, take ``self._lock``, so a check and the change it guards are never
   split by another call (``locked=False``: a read that may run beside them);
2. call ``method(self, request)``; its return value is the reply;
3. an exception ``status_of`` maps aborts the call with that status (:func:`abort_for`);
   one it does not map is a bug: it is reported to ``unexpected`` (if given, with the
   method's name, inside the ``except`` so the traceback is at hand) and re-raised,
   and gRPC answers UNKNOWN.

gRPC calls ``servicer.Method(request, context)``; the wrapped method takes only the
request, so it can be called (and tested) without a context.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc

from sixlab.linux.unixpath import SocketPathError, clear_stale_socket

__all__ = [
    "StatusOf",
    "abort_for",
    "claim_unix_address",
    "each",
    "is_local",
    "server_credentials",
    "unary",
]

#: A server's error table: the status for an exception, or None for one it does not know.
StatusOf = Callable[[Exception], tuple[grpc.StatusCode, str] | None]

log = logging.getLogger(__name__)


class _Locked(Protocol):
    @property
    def _lock(self) -> AbstractContextManager[Any]: ...


_S = TypeVar("_S", bound=_Locked)
_Req = TypeVar("_Req")
_Rep = TypeVar("_Rep")


def abort_for(exc: Exception, context: Any, status_of: StatusOf) -> None:
    """Abort the call with ``exc``'s status; return only if ``status_of`` does not map it.

    Call it in an ``except`` block and re-raise after it: ``context.abort`` raises (it
    ends the RPC), so what follows it runs only for an error the table does not know.
    """
    status = status_of(exc)
    if status is not None:
        context.abort(*status)


def unary(
    status_of: StatusOf,
    *,
    locked: bool = True,
    unexpected: Callable[[str], None] | None = None,
) -> Callable[[Callable[[_S, _Req], _Rep]], Callable[[_S, _Req, Any], _Rep]]:
    """A decorator for a unary servicer method; see the module docstring."""

    def wrap(method: Callable[[_S, _Req], _Rep]) -> Callable[[_S, _Req, Any], _Rep]:
        @functools.wraps(method)
        def handler(self: _S, request: _Req, context: Any) -> _Rep:
            try:
                if locked:
                    with self._lock:
                        return method(self, request)
                return method(self, request)
            except Exception as exc:
                abort_for(exc, context, status_of)
                if unexpected is not None:
                    unexpected(method.__name__)
                raise

        return handler

    return wrap


def each(
    status_of: StatusOf, requests: Iterable[_Req], method: Callable[[_Req], object]
) -> list[tuple[grpc.StatusCode, str]]:
    """The requests of a batch call carried out in order, each as its own unary call
    would be (hold the servicer's lock): per request (status, message), ``OK`` if
    ``method`` returned, the status ``status_of`` maps its error to otherwise. An error
    it does not map is a bug: logged, and that request answered ``UNKNOWN`` as gRPC
    answers a call that raised it; the others go on."""
    out: list[tuple[grpc.StatusCode, str]] = []
    for request in requests:
        try:
            method(request)
        except Exception as exc:
            status = status_of(exc)
            if status is None:
                log.exception("a request of a batch call failed")
                status = (grpc.StatusCode.UNKNOWN, f"Exception calling application: {exc}")
            out.append(status)
        else:
            out.append((grpc.StatusCode.OK, ""))
    return out


#: Address schemes that reach only processes of this host (gRPC's naming doc).
_LOCAL_SCHEMES = ("unix:", "unix-abstract:")
#: Schemes whose rest is host:port.
_IP_SCHEMES = ("ipv4:", "ipv6:", "dns:")


def is_local(address: str) -> bool:
    """Whether a server address is reachable only from this host.

    True for unix sockets and for loopback hosts (``[::1]:N``, ``127.0.0.0/8``,
    ``localhost``); False for every other host, the wildcards ``[::]`` and ``0.0.0.0``
    included, and for names (they may resolve to anything).
    """
    if address.startswith(_LOCAL_SCHEMES):
        return True
    for scheme in _IP_SCHEMES:
        address = address.removeprefix(scheme)
    host = address.rpartition(":")[0] if address.count(":") == 1 or "]" in address else address
    host = host.removeprefix("[").removesuffix("]").split("%")[0]
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def claim_unix_address(address: str) -> None:
    """Ready a ``unix:PATH`` (or ``unix:///PATH``) server address for binding.

    gRPC unlinks whatever socket is at the path before it binds: a restart after
    SIGKILL works, but so would a second server started on a live one's path, taking it
    (the first then serves nobody). So a socket nobody answers on is removed and a live
    one refused (:mod:`sixlab.linux.unixpath`), as is a path that is not a socket.
    Other addresses (``unix-abstract:`` has no file) are left alone. Raises ``OSError``.
    """
    if address.startswith("unix://"):
        path = address.removeprefix("unix://")
    elif address.startswith("unix:"):
        path = address.removeprefix("unix:")
    else:
        return
    try:
        clear_stale_socket(path)
    except SocketPathError as exc:
        hint = "; stop that server or choose another path" if exc.live else ""
        raise OSError(f"{address}: {exc.reason}{hint}") from None


def server_credentials(cert: Path, key: Path, ca: Path | None = None) -> Any:
    """gRPC server credentials from PEM files; with ``ca``, clients must present a
    certificate it signed (mutual TLS). ValueError names a file that cannot be read."""
    try:
        chain = Path(cert).read_bytes()
        private = Path(key).read_bytes()
        roots = Path(ca).read_bytes() if ca is not None else None
    except OSError as exc:
        raise ValueError(f"tls: cannot read {exc.filename}: {exc.strerror}") from exc
    return grpc.ssl_server_credentials(
        [(private, chain)], root_certificates=roots, require_client_auth=roots is not None
    )
