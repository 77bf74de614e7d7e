"""Network-namespace primitives: names, entering, sysctls, processes, sweeping.

Namespaces are named ``<prefix><owner pid>-<token>-<node>`` (e.g.
``sixlab-4242-3fa9c2-r1``): the random token keeps parallel tests and a demo apart, the
owner pid lets :func:`sweep` tell leftovers of a dead run from namespaces still in use.

The current *thread* enters a namespace with ``setns(2)`` for as long as it needs to
open a netlink or data socket or write a ``/proc/sys/net`` file: a socket stays in the
namespace it was created in, and ``/proc/sys/net`` resolves against the opener's
namespace. Processes are started with ``ip netns exec``: pyroute2 has no way to exec a
program in a namespace, and a ``preexec_fn`` calling ``setns`` is unsafe in a parent
with threads (pyroute2 runs its own); ``ip netns exec`` also remounts ``/sys`` for the
namespace, which tools such as ``ethtool`` need.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pyroute2 import netns as _pyr_netns

__all__ = [
    "DEFAULT_PREFIX",
    "NETNS_DIR",
    "entered",
    "exec_in",
    "kill_all",
    "make_token",
    "namespace_pids",
    "netns_socket",
    "remove_namespace",
    "run_in",
    "sweep",
    "sysctl_set",
]

#: Where iproute2 and pyroute2 bind-mount named namespaces.
NETNS_DIR = Path("/run/netns")
#: Prefix of every namespace the testbed makes unless told otherwise.
DEFAULT_PREFIX = "sixlab-"
#: <sched.h>
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def make_token() -> str:
    """``<pid>-<6 hex>``: unique per run, and names the owner for :func:`sweep`."""
    return f"{os.getpid()}-{secrets.token_hex(3)}"


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered(ns: str) -> Iterator[None]:
    """Run the body with the calling thread inside namespace ``ns``, then come back."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(NETNS_DIR / ns, os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(home)


def netns_socket(ns: str, family: int, type_: int, proto: int = 0) -> socket.socket:
    """A socket that lives in namespace ``ns`` (usable from this process afterwards)."""
    with entered(ns):
        return socket.socket(family, type_, proto)


def sysctl_set(ns: str, values: dict[str, str | int]) -> None:
    """Write ``net.*`` sysctls (dotted keys, e.g. ``net.ipv6.conf.all.forwarding``)."""
    with entered(ns):
        for key, value in values.items():
            Path("/proc/sys", *key.split(".")).write_text(f"{value}\n")


def _argv(ns: str, argv: Sequence[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def run_in(ns: str, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """Start ``argv`` inside ``ns`` (untracked: prefer ``Testbed.run_in``)."""
    # ``ip netns exec`` execs the program in place, so the Popen pid is the program's.
    return subprocess.Popen(_argv(ns, argv), **popen_kwargs)


def exec_in(
    ns: str, argv: Sequence[str], *, check: bool = True, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside ``ns`` to completion and capture its output as text."""
    return subprocess.run(
        _argv(ns, argv), capture_output=True, text=True, check=check, timeout=timeout
    )


def namespace_pids(names: Sequence[str]) -> list[int]:
    """Pids of every process whose network namespace is one of ``names``."""
    wanted = set(names)
    found = _pyr_netns.ns_pids(str(NETNS_DIR))
    return [pid for name, pids in found.items() if name in wanted for pid in pids]


def kill_all(names: Sequence[str], grace: float = 2.0) -> None:
    """SIGTERM, then SIGKILL, every process living in ``names``."""
    pids = namespace_pids(names)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]
            time.sleep(0.02)
        if not pids:
            return


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def remove_namespace(ns: str) -> None:
    """Unmount and unlink ``/run/netns/<ns>``; absent is fine."""
    if (NETNS_DIR / ns).exists():
        _pyr_netns.remove(ns)


def _owner_alive(name: str, prefix: str) -> bool:
    pid_text = name[len(prefix) :].split("-", 1)[0]
    if not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return True
    return Path(f"/proc/{pid}").exists() and not _zombie(pid)


def sweep(prefix: str = DEFAULT_PREFIX, *, force: bool = False) -> list[str]:
    """Remove namespaces named ``prefix*`` left by dead runs; return their names.

    A namespace whose owner pid (the first field after the prefix) is still alive is
    kept unless ``force``: a running demo or a parallel test session is not swept away.
    Processes still inside a swept namespace are killed first.
    """
    if not prefix:
        raise ValueError("refusing to sweep every namespace: give a prefix")
    names = sorted(
        n
        for n in _pyr_netns.listnetns(str(NETNS_DIR))
        if n.startswith(prefix) and (force or not _owner_alive(n, prefix))
    )
    kill_all(names)
    for name in names:
        remove_namespace(name)
    return names
