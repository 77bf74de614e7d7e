"""The daemon puts its own locator|NID addresses on its links (zero configuration).

A host given a locator (``--locator 2001:db8:a::/64``) should not also need an
``ip addr add``: the address under that locator is the I-LV itself, locator|NID
(RFC 6740 §3), so the daemon adds it to a link when no interface holds an address
under the locator yet, and removes what it added when it stops. Added without duplicate
address detection: the NID is the node's own identifier, and the address is usable at
once.

A link taken administratively down loses its addresses; the daemon adds its claimed
ones again when the link comes back up (:func:`add_addresses`, what
:mod:`sixlab.ilnp.links` notes; docs/ilnp-field.md, "Zero configuration").

A multihomed host has a locator per link (RFC 6740 §3: a locator names the subnetwork
an interface is on), so each locator's address goes on the link of its subnetwork
(:func:`place_locators`), the first rule that answers deciding:

1. the link named with the locator (``--locator 2001:db8:d::/64@eth1``);
2. the link with an on-link route covering the /64 (a Router Advertisement's prefix
   with the on-link flag, or a route someone added), the most specific route first;
3. the link at the locator's position among ``--interface`` (the n-th locator on the
   n-th link), or the first link for locators beyond the last.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterable, Mapping, Sequence

from sixlab.ilnp.config import LinkStates, held_locators
from sixlab.ilnp.links import read_links
from sixlab.wire.ilnp import ILV, LocatorEntry

__all__ = ["add_addresses", "claim_addresses", "place_locators", "release_addresses"]

_IFA_F_NODAD = 0x02


def place_locators(
    locators: Sequence[int],
    interfaces: Sequence[str],
    *,
    named: Mapping[int, str] | None = None,
    routes: Mapping[str, Iterable[tuple[int, int, bool]]] | None = None,
) -> dict[int, str]:
    """The link each locator's address belongs on (module doc).

    ``named``: locator to the link given with it; ``routes``: each link's routes as
    :class:`sixlab.ilnp.links.LinkState` has them, (network, length, on-link).
    """
    if not interfaces:
        return {}
    covering: dict[int, tuple[int, str]] = {}
    for name in interfaces:
        for network, length, onlink in (routes or {}).get(name, ()):
            if not onlink or length > 64 or length == 0:
                continue
            mask = ((1 << length) - 1) << (128 - length)
            for locator in locators:
                if (locator << 64) & mask == network & mask and length > covering.get(
                    locator, (-1, "")
                )[0]:
                    covering[locator] = (length, name)
    placed: dict[int, str] = {}
    for position, locator in enumerate(locators):
        given = (named or {}).get(locator)
        if given is not None and given in interfaces:
            placed[locator] = given
        elif locator in covering:
            placed[locator] = covering[locator][1]
        else:
            placed[locator] = interfaces[position] if position < len(interfaces) else interfaces[0]
    return placed


def claim_addresses(
    nid: int,
    locators: Iterable[LocatorEntry],
    interfaces: tuple[str, ...],
    states: LinkStates,
    *,
    named: Mapping[int, str] | None = None,
) -> list[tuple[str, str]]:
    """Add locator|NID/64 for every locator no interface holds, each on its link
    (:func:`place_locators`); (interface, address) added."""
    held = held_locators(states)
    order = [e.locator for e in locators]
    if all(locator in held for locator in order) or not interfaces:
        return []
    routes = {name: state.routes for name, state in read_links(interfaces).items()}
    placed = place_locators(order, interfaces, named=named, routes=routes)
    added = [
        (placed[locator], str(ILV(locator, nid).address))
        for locator in order
        if locator not in held
    ]
    add_addresses(added)
    return added


def add_addresses(addresses: Iterable[tuple[str, str]]) -> None:
    """Add each (interface, locator|NID address) as a /64, without duplicate address
    detection (module doc): at start, and again on a link whose addresses the kernel
    flushed when it went down (:mod:`sixlab.ilnp.links`)."""
    from pyroute2 import IPRoute  # noqa: PLC0415 - netlink only in the daemon

    with IPRoute() as ipr:
        for name, address in addresses:
            index = ipr.link_lookup(ifname=name)[0]
            ipr.addr("add", index=index, address=address, prefixlen=64, flags=_IFA_F_NODAD)


def release_addresses(added: Iterable[tuple[str, str]]) -> None:
    """Remove what :func:`claim_addresses` added (gone already: nothing to do)."""
    from pyroute2 import IPRoute  # noqa: PLC0415
    from pyroute2.netlink.exceptions import NetlinkError  # noqa: PLC0415

    with IPRoute() as ipr:
        for name, address in added:
            found = ipr.link_lookup(ifname=name)
            if not found:
                continue
            with contextlib.suppress(NetlinkError):
                ipr.addr(
                    "del",
                    index=found[0],
                    address=str(ipaddress.IPv6Address(address)),
                    prefixlen=64,
                    family=socket.AF_INET6,
                )
