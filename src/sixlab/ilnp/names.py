"""Names for applications: a hosts file of identifier addresses the daemon owns.

Applications on an ILNP host reach a correspondent at its identifier address
(:func:`sixlab.wire.ilnp.identifier_address`), not at a locator. Rather than a
name-service plugin, the daemon writes ``/etc/hosts``-format lines, one per name it can
resolve (its I-LV hosts file, and names resolved in DNS: ``--name``, ``add-peer``), to a
file it owns (``--names PATH``): pointing the system's ``/etc/hosts`` at it (a symlink,
or ``/etc/netns/NAME/hosts``, which ``ip netns exec NAME`` mounts over ``/etc/hosts``)
makes ``getaddrinfo("bob")`` give ``fd00:2ff::b``. The file is rewritten whole and
atomically (a rename), so a reader never sees half of it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from sixlab.ilnp.resolve import Resolution
from sixlab.wire.ilnp import IDENTIFIER_PREFIX, identifier_address

__all__ = ["render_names", "write_names"]

_HEADER = "# Written by sixlab ilnp host: identifier addresses of ILNP names. Do not edit.\n"


def render_names(entries: Iterable[Resolution], prefix: int = IDENTIFIER_PREFIX) -> str:
    """``/etc/hosts`` lines: each NID's identifier address and its names, sorted."""
    by_nid: dict[int, list[str]] = {}
    for entry in entries:
        names = by_nid.setdefault(entry.nid, [])
        if entry.name not in names:
            names.append(entry.name)
    lines = [
        f"{identifier_address(nid, prefix)}\t{' '.join(names)}\n"
        for nid, names in sorted(by_nid.items())
    ]
    return _HEADER + "".join(lines)


def write_names(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(target)
