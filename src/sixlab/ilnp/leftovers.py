"""What the host daemon changed in its namespace, written down so that a killed
daemon's changes are undone by the next one, or by ``sixlab ilnp cleanup``.

Theory of operation
-------------------
The daemon adds to its network namespace an nftables table, a ``clsact`` qdisc (with
its tc filters) on links that had none, the addresses it claims (zero configuration),
``ignore_routes_with_linkdown`` set on its links, a names file and a control socket
file; the TUN device goes with its last descriptor. A clean exit removes them all. A
daemon killed with SIGKILL cannot, and what it leaves looks like the namespace's own
settings to the next daemon: that one keeps the sysctl at 1 and puts 1 back at its
exit, never claims (nor releases) the address it finds, and leaves the qdisc.

So the daemon writes what it changed, with the values it found, to a state file
of its own, :func:`state_path` (``/run/sixlab-ilnp-NETNS-TUN.state``: one per network
namespace and TUN device, since a TUN name is unique in a namespace), each time that
changes, and deletes it once its clean exit has undone everything. A start first
undoes a dead daemon's file (:func:`undo`), before it changes anything itself;
``sixlab ilnp cleanup`` does the same without starting a daemon.

The file names its daemon by pid *and* start time (a reused pid is not the daemon),
and its namespace by the netns cookie (``SO_NETNS_COOKIE``, never reused while the
kernel runs): the inode number in the name can come back with a later namespace, and
a file from another namespace is discarded unread. A live daemon's file is refused.

Undoing is conservative: a sysctl goes back to the value recorded, a ``clsact`` qdisc
goes only once it holds no filter (our filters are removed first), a claimed address
is removed, the nft table only if the process named in it is dead.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sixlab.ilnp._errors import DaemonError
from sixlab.ilnp.addresses import release_addresses
from sixlab.ilnp.fastpath import remove_leftovers
from sixlab.ilnp.links import clsact_filters
from sixlab.linux.errors import LinuxError
from sixlab.linux.libbpf import tc_hook_destroy
from sixlab.linux.nftdrop import remove_orphan_table

__all__ = ["Leftovers", "netns_cookie", "process_start", "save", "state_path", "undo"]

_SO_NETNS_COOKIE = 71  # <asm-generic/socket.h>, Linux 5.14


def netns_cookie() -> int:
    """This network namespace's cookie (0 where the kernel has none)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            return int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, _SO_NETNS_COOKIE, 8), "little")
        except OSError:
            return 0


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), None if there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19])


def state_path(tun: str) -> str:
    """The state file of the daemon with TUN device ``tun`` in this namespace."""
    inode = Path("/proc/thread-self/ns/net").stat().st_ino
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in tun)  # a name, no path
    return f"/run/sixlab-ilnp-{inode}-{safe}.state"


@dataclass(slots=True)
class Leftovers:
    """What one daemon changed (module doc); the JSON of the state file."""

    pid: int
    started: int
    netns: int
    #: sysctl file -> the value found there before the daemon wrote it.
    sysctls: dict[str, str] = field(default_factory=dict)
    #: Links whose ``clsact`` qdisc the daemon made.
    clsact: list[str] = field(default_factory=list)
    #: (link, address) the daemon added.
    addresses: list[tuple[str, str]] = field(default_factory=list)
    #: Links that may hold the fast path's ingress filter.
    filters: list[str] = field(default_factory=list)
    nft_table: str | None = None
    #: Files the daemon made (names file, control socket).
    files: list[str] = field(default_factory=list)


def save(path: str, leftovers: Leftovers) -> None:
    """Write ``leftovers`` to ``path`` in one step (a reader sees the old or the new)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    Path(tmp).write_text(json.dumps(asdict(leftovers)))
    Path(tmp).replace(path)


def _load(path: str) -> Leftovers | None:
    try:
        data = json.loads(Path(path).read_text())
        data["addresses"] = [tuple(a) for a in data["addresses"]]
        return Leftovers(**data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:  # not ours to trust
        Path(path).unlink(missing_ok=True)
        raise DaemonError(f"state file {path}: unreadable, removed ({exc})") from exc


def undo(path: str) -> list[str]:
    """Undo what the dead daemon recorded in ``path`` and delete the file; what was
    undone, one line each ([] when there was no file, or it was another namespace's).

    Raises :class:`DaemonError` when the daemon that wrote it still runs.
    """
    found = _load(path)
    if found is None:
        return []
    if found.netns != netns_cookie():
        Path(path).unlink(missing_ok=True)  # an earlier namespace with the same inode
        return []
    if process_start(found.pid) == found.started and found.pid != os.getpid():
        raise DaemonError(f"{path}: the daemon that wrote it (pid {found.pid}) still runs")
    done = [f"removed {n} fast path filter(s)" for n in [remove_leftovers(found.filters)] if n]
    for name in found.clsact:
        with contextlib.suppress(OSError, LinuxError):
            if clsact_filters(name) == set() and tc_hook_destroy(socket.if_nametoindex(name)):
                done.append(f"removed the clsact qdisc of {name}")
    for setting, value in found.sysctls.items():
        with contextlib.suppress(OSError):  # the link is gone, and its setting with it
            if Path(setting).read_text().strip() != value:
                Path(setting).write_text(f"{value}\n")
                done.append(f"{setting} back to {value}")
    if found.addresses:
        release_addresses(found.addresses)
        done += [f"removed address {a} from {n}" for n, a in found.addresses]
    if found.nft_table is not None and remove_orphan_table(found.nft_table):
        done.append(f"removed nft table ip6 {found.nft_table}")
    for name in found.files:
        with contextlib.suppress(OSError):
            Path(name).unlink()
            done.append(f"removed {name}")
    Path(path).unlink(missing_ok=True)
    return done
