"""The host's own locators and NID as people write them, and as its links hold them.

Theory of operation
-------------------
A host's locators are the /64 prefixes (L64s, RFC 6740 §3) its links actually hold: a
locator no interface has an address under cannot receive anything, so the daemon
neither accepts it in a move (:func:`check_held`) nor keeps using it once its address
is gone (the daemon's link poll withdraws it).

Link state comes in as a plain mapping, interface name to ``(up, prefixes)`` with the
prefixes as 64-bit integers (what :func:`sixlab.ilnp.links.link_states` reads over
netlink), so everything here is pure and tested without a kernel.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping

from sixlab.ilnp._errors import ConfigError
from sixlab.wire.ilnp import LocatorEntry

__all__ = ["LinkStates", "check_held", "format_l64", "held_locators", "parse_l64", "parse_nid"]

_U64 = (1 << 64) - 1
_HEX = frozenset("0123456789abcdefABCDEF")


def parse_l64(text: str) -> int:
    """A locator as people write it: ``2001:db8:a1::/64``, ``2001:db8:a1::`` or the
    four groups of the I-LV notation, ``2001:db8:a1:0``. Raises :class:`ConfigError`.

    A locator is the upper 64 bits of an address (RFC 6740 §3): a prefix must be a /64,
    and an address must have nothing in its lower 64 bits.
    """
    head, slash, length = text.strip().partition("/")
    groups = head.split(":")
    if (
        not slash
        and len(groups) == 4
        and all(1 <= len(g) <= 4 and _HEX.issuperset(g) for g in groups)
    ):
        return int("".join(g.zfill(4) for g in groups), 16)
    if slash and length != "64":
        raise ConfigError(f"locator {text!r}: a locator is a /64 prefix, not /{length}")
    try:
        value = int(ipaddress.IPv6Address(head))
    except ValueError:
        raise ConfigError(
            f"locator {text!r}: want 2001:db8:a1::/64, 2001:db8:a1:: or 2001:db8:a1:0"
        ) from None
    if value & _U64:
        raise ConfigError(
            f"locator {text!r}: its lower 64 bits are not zero (a locator is a /64 prefix)"
        )
    return value >> 64


def parse_nid(text: str) -> int:
    """A NID as ``::a`` (an interface identifier), four hex groups (``0:0:0:a``), or one
    integer (``0xa``, ``10``). Raises :class:`ConfigError`."""
    text = text.strip()
    groups = text.split(":")
    try:
        if len(groups) == 4 and all(1 <= len(g) <= 4 and _HEX.issuperset(g) for g in groups):
            return int("".join(g.zfill(4) for g in groups), 16)
        value = int(ipaddress.IPv6Address(text)) if ":" in text else int(text, 0)
    except ValueError:
        raise ConfigError(f"NID {text!r}: want ::a, 0:0:0:a or an integer") from None
    if not 0 <= value <= _U64:
        raise ConfigError(f"NID {text!r} does not fit in 64 bits (::a names NID a)")
    return value


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
