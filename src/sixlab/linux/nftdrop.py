"""Keep the kernel from handling packets that user space answers: an nftables drop.

A capture socket (``AF_PACKET``, a TPACKET ring) sees a packet before the IPv6 input
hook of netfilter runs, so a rule that drops the packet at that hook silences the
kernel (no ICMPv6 port unreachable for a STAMP probe nobody bound a socket for, RFC 4443
§3.1; no transport reply to an ILNP packet the daemon rewrites) while the capture still
gets it. ``tc ... action drop`` would act earlier, but needs ``act_gact``, which not
every kernel has (see docs/design-notes.md).

:class:`KernelDrop` owns one table of family ``ip6`` (so an IPv4 service on the same
port is untouched) with one input chain holding the caller's rules. The table's comment
names the owner pid:

- ``install`` replaces a table whose owner is dead (a crashed or SIGKILLed run) and
  refuses one whose owner lives (two owners would steal each other's packets);
- ``remove`` (also run at interpreter exit) deletes the table only while this process
  owns it.

``nft`` runs with a timeout: a hung ``nft`` is a broken system, reported rather than
waited on. Every failure is a :class:`KernelDropError` naming what failed.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
from collections.abc import Sequence

from sixlab.linux.errors import LinuxError

__all__ = ["KernelDrop", "KernelDropError", "remove_orphan_table"]

_OWNER = re.compile(r'comment "sixlab pid=(\d+)"')
#: ``nft`` answers in milliseconds; ten seconds only bounds a hung one.
_NFT_TIMEOUT_S = 10.0


def _table_owner(table: str) -> int | None:
    """The pid in the comment of sixlab's ``ip6`` table ``table`` (0: none there), or None
    when there is no such table."""
    listing = _nft("list", "table", "ip6", table, check=False)
    if listing.returncode != 0:
        return None
    match = _OWNER.search(listing.stdout)
    return int(match.group(1)) if match else 0


class KernelDropError(LinuxError):
    """nftables is missing or refused the rule (the message says which)."""


def _nft(
    *args: str, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    nft = shutil.which("nft")
    if nft is None:
        raise KernelDropError("nft not found: install the nftables package")
    try:
        proc = subprocess.run(
            [nft, *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=_NFT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise KernelDropError(f"nft {' '.join(args)}: no answer in {_NFT_TIMEOUT_S:g} s") from exc
    if check and proc.returncode != 0:
        raise KernelDropError(f"nft {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_orphan_table(table: str) -> bool:
    """Delete ``ip6`` table ``table`` if a process of ours made it and is dead; whether
    it did. A table without our comment, or of a live process, stays."""
    owner = _table_owner(table)
    if not owner or _alive(owner):
        return False
    return _nft("delete", "table", "ip6", table, check=False).returncode == 0


class KernelDrop:
    """The ``ip6`` table ``table`` whose input chain holds ``rules`` (see module doc).

    ``rules`` are nftables rule statements, one per item, e.g.
    ``"udp dport { 862 } counter drop"``; ``priority`` is the input chain's priority
    (``filter``, or a number such as ``-300`` to run before other tables). ``purpose``
    names the user in the error raised when a live process owns the table.
    """

    def __init__(
        self,
        table: str,
        rules: Sequence[str],
        *,
        priority: str = "filter",
        purpose: str = "",
    ) -> None:
        if not rules:
            raise ValueError("a kernel drop needs at least one rule")
        self.table = table
        self.rules = tuple(rules)
        self.priority = priority
        self.purpose = purpose
        self.installed = False

    def owner(self) -> int | None:
        """The pid named by the existing table, or None when there is no table."""
        return _table_owner(self.table)

    def ruleset(self) -> str:
        """The ``nft -f`` script that creates the table."""
        body = "".join(f"    {rule}\n" for rule in self.rules)
        return (
            f'table ip6 {self.table} {{\n  comment "sixlab pid={os.getpid()}"\n'
            "  chain input {\n"
            f"    type filter hook input priority {self.priority}; policy accept;\n"
            f"{body}  }}\n}}\n"
        )

    def install(self) -> None:
        """Create the table; replace a dead owner's leftover, refuse a live owner's."""
        if self.installed:
            return
        owner = self.owner()
        if owner is not None:
            if owner and owner != os.getpid() and _alive(owner):
                what = f": {self.purpose}" if self.purpose else ""
                raise KernelDropError(
                    f"nft table ip6 {self.table} belongs to live process {owner}{what}"
                )
            _nft("delete", "table", "ip6", self.table, check=False)
        _nft("-f", "-", stdin=self.ruleset())
        self.installed = True
        atexit.register(self.remove)

    def remove(self) -> None:
        """Delete the table if this object installed it; safe to call twice."""
        if not self.installed:
            return
        self.installed = False
        atexit.unregister(self.remove)
        if self.owner() == os.getpid():
            _nft("delete", "table", "ip6", self.table, check=False)
