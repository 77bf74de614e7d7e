"""The host's own locators and NID as people write them, and as its links hold them.

Theory of operation
-------------------
A host's locators are the /64 prefixes (L64s, RFC 6740 §3) its links actually hold: a
locator no interface has an address under cannot receive anything, so the daemon
neither accepts it in a move (:func:`check_held`) nor keeps using it once its address
is gone (the daemon's link poll withdraws it).

Link state comes in as a plain mapping, interface name to ``(up, prefixes)`` with the
prefixes as 64-bit integers (what :func:`sixlab.ilnp.daemon._link_states` reads over
netlink), so everything here is pure and tested without a kernel.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sixlab.ilnp._errors import ConfigError
from sixlab.wire.ilnp import LocatorEntry

__all__ = ["LinkStates", "check_held", "format_l64", "held_locators"]

#: Interface name to (up, the /64 prefixes of its IPv6 addresses).
LinkStates = Mapping[str, tuple[bool, set[int]]]


def format_l64(locator: int) -> str:
    """A 64-bit locator as four hex groups (``2001:db8:a:0``)."""
    return ":".join(f"{(locator >> s) & 0xFFFF:x}" for s in (48, 32, 16, 0))


def held_locators(states: LinkStates) -> dict[int, list[str]]:
    """Every L64 an interface that is up holds an address under, with those interfaces."""
    held: dict[int, list[str]] = {}
    for name, (up, prefixes) in sorted(states.items()):
        if up:
            for prefix in prefixes:
                held.setdefault(prefix, []).append(name)
    return held


def check_held(locators: Iterable[LocatorEntry], states: LinkStates) -> None:
    """Raise :class:`ConfigError` naming each locator no interface (that is up) holds."""
    held = held_locators(states)
    missing = [format_l64(e.locator) for e in locators if e.locator not in held]
    if missing:
        links = ", ".join(sorted(states)) or "none"
        raise ConfigError(
            f"locators: no interface holds an address under {', '.join(missing)} "
            f"(interfaces: {links}); add the address first"
        )
