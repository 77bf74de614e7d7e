"""The host daemon's control socket: JSON lines over a Unix stream socket, bounded.

Theory of operation
-------------------
One request is one line of JSON; its reply is one line of JSON. The server runs in the
daemon's single-threaded loop (it registers its sockets in the daemon's selector), so
nothing a client does may block that loop, which also carries the data path, or make
the daemon grow without bound. What each kind of client gets:

=======================  ==============================================================
a client that ...        the server ...
=======================  ==============================================================
sends a line             answers it; at most one request per client per loop turn
pipelines many lines     answers them in turn; it does not read from that client while
                         a reply is unsent, so one that never reads holds one reply
sends no newline         buffers up to :data:`MAX_REQUEST` bytes, then answers an error
                         and closes the connection
stalls (no byte moves)   closes it after :data:`IDLE_TIMEOUT` seconds
is one too many          gets an error line and is closed (:data:`MAX_CLIENTS`)
disconnects mid-request  is forgotten with its partial request
=======================  ==============================================================

Each is counted in :attr:`ControlServer.counters` (``accepted``, ``refused``,
``too_long``, ``idle_closed``, ``accept_errors``), which the daemon's ``status`` shows.

Where it lives
--------------
:func:`default_control` is ``/run/sixlab-ilnp-<netns>.sock``, ``<netns>`` the inode of
the caller's network namespace: ``/run`` is shared by every namespace of the machine,
and one daemon per namespace is the rule (its TUN device and nftables table are per
namespace), so daemons in different namespaces never meet on the default path while
``sixlab ilnp status`` run in a namespace finds that namespace's daemon.

:meth:`ControlServer.open` refuses a path where a live daemon answers (a connection
succeeds) and a path that is not a socket; it replaces a socket nobody listens on (a
daemon killed without cleaning up): :mod:`sixlab.linux.unixpath`, which the STAMP agent
uses for its gRPC socket too. :meth:`ControlServer.close` removes the path only
while it is still the socket this server made (same device and inode): a daemon never
deletes another's socket.

:func:`control_request` is the client side: one request, one reply, with a timeout;
a daemon that closes without a reply or answers something other than a JSON object
raises :class:`ControlError`, connection problems raise ``OSError``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import selectors
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sixlab.ilnp._errors import ConfigError, ControlError
from sixlab.linux.unixpath import SocketPathError, clear_stale_socket

__all__ = [
    "IDLE_TIMEOUT",
    "MAX_CLIENTS",
    "MAX_REQUEST",
    "ControlClient",
    "ControlServer",
    "control_request",
    "default_control",
]

#: Longest request line. The largest legitimate one, ``set-locators`` with the 255
#: locators a Locator Update can carry (RFC 6743 §2), is about 8 KiB.
MAX_REQUEST = 64 * 1024
#: Connections served at once. The control socket serves an operator and a few scripts;
#: the cap keeps descriptors (RLIMIT_NOFILE is often 1024, and the rings, TUN and maps
#: need theirs) and buffer memory bounded whatever connects.
MAX_CLIENTS = 16
#: A client that moves no byte for this long is closed. ``sixlab ilnp status`` sends
#: its line at once and waits at most 5 s for the reply; a client silent for longer is
#: stuck or hostile, and would otherwise hold one of :data:`MAX_CLIENTS` for ever.
IDLE_TIMEOUT = 10.0
_RECV_SIZE = 65536

#: How long :meth:`ControlServer.open` waits for a connection to an existing socket.
_PROBE_TIMEOUT = 1.0

Handler = Callable[[bytes], dict[str, Any]]


def default_control() -> str:
    """The control socket path of this network namespace (module doc)."""
    return f"/run/sixlab-ilnp-{Path('/proc/thread-self/ns/net').stat().st_ino}.sock"


@dataclass(eq=False)
class ControlClient:
    """One connection: bytes received but not yet answered, bytes not yet sent."""

    sock: socket.socket
    last_progress: float
    inbox: bytearray = field(default_factory=bytearray)
    outbox: bytearray = field(default_factory=bytearray)
    #: Close once the outbox is sent (after an error that ends the conversation).
    closing: bool = False
    events: int = selectors.EVENT_READ


def _encode(reply: dict[str, Any]) -> bytes:
    return json.dumps(reply).encode() + b"\n"


class ControlServer:
    """The listening socket and its clients, driven by the daemon's selector.

    The daemon calls :meth:`open` once, :meth:`on_event` for every selector key whose
    data is this server or a :class:`ControlClient`, :meth:`expire` every loop turn,
    and :meth:`close` at the end.
    """

    def __init__(self, path: str, handler: Handler, selector: selectors.BaseSelector) -> None:
        self.path = path
        self.handler = handler
        self.selector = selector
        self.counters: Counter[str] = Counter()
        self.clients: set[ControlClient] = set()
        self._listener: socket.socket | None = None
        #: (device, inode) of the socket file we made: what :meth:`close` may remove.
        self._made: tuple[int, int] | None = None

    def open(self) -> None:
        """Listen on the path; refuse it if a live daemon answers there (module doc).

        Raises :class:`ConfigError` for a path taken by a live daemon or by something
        that is not a socket, ``OSError`` when the path cannot be made.
        """
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._clear_leftover(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                sock.bind(str(path))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:  # made between our check and bind
                    raise ConfigError(f"control socket {path}: taken by another daemon") from None
                raise
            made = path.stat()
            self._made = (made.st_dev, made.st_ino)
            sock.listen(8)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            self._remove_ours()
            raise
        self._listener = sock
        self.selector.register(sock, selectors.EVENT_READ, self)

    def _clear_leftover(self, path: Path) -> None:
        """Remove a dead daemon's socket at ``path``; refuse a live one or a non-socket."""
        try:
            clear_stale_socket(path, timeout=_PROBE_TIMEOUT)
        except SocketPathError as exc:
            if not exc.live:
                raise ConfigError(f"control socket {path}: {exc.reason}") from None
            raise ConfigError(
                f"control socket {path}: a running daemon answers there "
                "(give this one its own --control)"
            ) from None

    def _remove_ours(self) -> None:
        """Unlink the path if it is still the socket this server made."""
        made, self._made = self._made, None
        if made is None:
            return
        path = Path(self.path)
        with contextlib.suppress(OSError):
            now = path.lstat()
            if (now.st_dev, now.st_ino) == made:
                path.unlink()

    def close(self) -> None:
        """Close every client and the listening socket; safe to call twice."""
        for client in list(self.clients):
            self._drop(client)
        if self._listener is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
        self._remove_ours()

    def on_event(self, data: object, mask: int, now: float) -> None:
        """A selector event on the listening socket (``data is self``) or on a client."""
        if data is self:
            self._accept(now)
        elif isinstance(data, ControlClient) and data in self.clients:
            if mask & selectors.EVENT_READ:
                self._read(data, now)
            if data in self.clients:
                self._serve(data, now)

    def expire(self, now: float) -> None:
        """Close the clients that moved no byte for :data:`IDLE_TIMEOUT` seconds."""
        for client in [c for c in self.clients if now - c.last_progress > IDLE_TIMEOUT]:
            self.counters["idle_closed"] += 1
            self._drop(client)

    # ------------------------------------------------------------------ internals

    def _accept(self, now: float) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        except OSError:  # EMFILE, ENFILE, ECONNABORTED: that connection is lost, not us
            self.counters["accept_errors"] += 1
            return
        sock.setblocking(False)
        if len(self.clients) >= MAX_CLIENTS:
            self._drop_departed()
        if len(self.clients) >= MAX_CLIENTS:
            self.counters["refused"] += 1
            with contextlib.suppress(OSError):  # best effort: the socket buffer is empty
                sock.send(_encode(_error(f"too many control connections ({MAX_CLIENTS})")))
            sock.close()
            return
        self.counters["accepted"] += 1
        client = ControlClient(sock, now)
        self.clients.add(client)
        self.selector.register(sock, client.events, client)

    def _drop_departed(self) -> None:
        """Forget the clients whose end has closed though the loop has not read it yet
        (one peek each): the cap is on clients that are still there."""
        for client in list(self.clients):
            try:
                if client.sock.recv(1, socket.MSG_PEEK):
                    continue
            except BlockingIOError:
                continue
            except OSError:
                pass
            self._drop(client)

    def _drop(self, client: ControlClient) -> None:
        self.clients.discard(client)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(client.sock)
        client.sock.close()

    def _read(self, client: ControlClient, now: float) -> None:
        try:
            chunk = client.sock.recv(_RECV_SIZE)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # gone, perhaps in the middle of a request: nothing to answer
            self._drop(client)
            return
        client.last_progress = now
        client.inbox += chunk
        if b"\n" not in client.inbox and len(client.inbox) > MAX_REQUEST:
            self.counters["too_long"] += 1
            client.inbox.clear()
            client.outbox += _encode(_error(f"request longer than {MAX_REQUEST} bytes"))
            client.closing = True

    def _serve(self, client: ControlClient, now: float) -> None:
        """Send what is pending; with nothing pending, answer one complete line."""
        if client.outbox and not self._send(client, now):
            return
        if not client.outbox:
            if client.closing:
                self._drop(client)
                return
            line, newline, rest = bytes(client.inbox).partition(b"\n")
            if newline:
                client.inbox[:] = rest
                client.outbox += _encode(self.handler(line))
                if not self._send(client, now):
                    return
        # Writable while a reply or a further line waits: the next turn goes on (one
        # request per turn, so a pipelining client cannot starve the loop); readable
        # only when there is nothing to answer.
        pending = bool(client.outbox) or b"\n" in client.inbox or client.closing
        events = selectors.EVENT_WRITE if pending else selectors.EVENT_READ
        if events != client.events:
            client.events = events
            self.selector.modify(client.sock, events, client)

    def _send(self, client: ControlClient, now: float) -> bool:
        """Send as much of the outbox as the socket takes; False if the client is gone."""
        try:
            sent = client.sock.send(client.outbox)
        except BlockingIOError:
            return True
        except OSError:
            self._drop(client)
            return False
        if sent:
            client.last_progress = now
            del client.outbox[:sent]
        return True


def _error(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message}


def control_request(path: str, request: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """Send one JSON request to a daemon's control socket and return its reply.

    Raises ``OSError`` when the socket cannot be reached or times out, and
    :class:`ControlError` when the daemon closes without a reply or the reply is not
    one JSON object.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(json.dumps(request).encode() + b"\n")
        buffer = b""
        while not buffer.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            buffer += chunk
    if not buffer:
        raise ControlError(f"{path}: the daemon closed the connection without a reply")
    try:
        reply = json.loads(buffer)
    except ValueError as exc:
        raise ControlError(f"{path}: the reply is not JSON: {exc}") from None
    if not isinstance(reply, dict):
        raise ControlError(f"{path}: the reply is not a JSON object")
    return reply
