"""Claim a Unix socket path for a server: replace a dead server's socket, refuse a live one.

A server killed with SIGKILL leaves its socket file; the next one to start on that path
must not be stopped by it, and must not take the path from a server still running there
(its clients would silently reach the newcomer, and the old server would serve nobody).
Whether someone serves is what a connection tells: refused (``ECONNREFUSED``, nobody
listens on that inode) means dead, and the file is removed; accepted, or a full backlog
or a timeout (someone listens but is slow), means live. A path that is not a socket is
never touched: it is someone's file.

The check and the server's own ``bind`` are two steps; two servers started on the same
dead path at the same instant can both pass the check (the loser's ``bind`` then fails
with ``EADDRINUSE``, or, for a server that unlinks before binding as gRPC does, takes the
path). That is the window of a supervisor starting two copies at once, not of a restart.
"""

from __future__ import annotations

import contextlib
import socket
import stat
from pathlib import Path

from sixlab.linux.errors import LinuxError

__all__ = ["SocketPathError", "clear_stale_socket"]

#: How long :func:`clear_stale_socket` waits for a connection to an existing socket.
PROBE_TIMEOUT = 1.0


class SocketPathError(LinuxError):
    """A Unix socket path is served by a live server, or is not a socket.

    ``reason`` is the message without the path, for callers that word their own;
    ``live`` says a server is there (rather than a file that is not a socket).
    """

    def __init__(self, path: str, reason: str, *, live: bool) -> None:
        self.path = path
        self.reason = reason
        self.live = live
        super().__init__(f"{path}: {reason}")


def clear_stale_socket(path: str | Path, *, timeout: float = PROBE_TIMEOUT) -> None:
    """Make ``path`` free for a server to bind (module doc).

    Nothing there: nothing to do. A socket nobody listens on: removed. A socket a server
    answers on, or a file that is not a socket: :class:`SocketPathError`, the path kept.
    """
    path = Path(path)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketPathError(str(path), "exists and is not a socket", live=False)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # nobody listens: the leftover of a killed server
        return
    except OSError as exc:  # a full backlog, a timeout: someone is there
        reason = f"a server listens there (connect: {exc.strerror or exc})"
        raise SocketPathError(str(path), reason, live=True) from None
    finally:
        probe.close()
    raise SocketPathError(str(path), "a server answers there (it accepted a connection)", live=True)
