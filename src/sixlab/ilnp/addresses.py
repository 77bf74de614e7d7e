"""The daemon puts its own locator|NID addresses on its links (zero configuration).

A host given a locator (``--locator 2001:db8:a::/64``) should not also need an
``ip addr add``: the address under that locator is the I-LV itself, locator|NID
(RFC 6740 §3), so the daemon adds it to the link when no interface holds an address
under the locator yet, and removes what it added when it stops. On a host with
several interfaces the address goes on the first one given (``--interface``); a
multihomed host that wants another link for a locator puts the address there itself.
Added without duplicate address detection: the NID is the node's own identifier, and
the address is usable at once.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterable

from sixlab.ilnp.config import LinkStates, held_locators
from sixlab.wire.ilnp import ILV, LocatorEntry

__all__ = ["claim_addresses", "release_addresses"]

_IFA_F_NODAD = 0x02


def claim_addresses(
    nid: int, locators: Iterable[LocatorEntry], interfaces: tuple[str, ...], states: LinkStates
) -> list[tuple[str, str]]:
    """Add locator|NID/64 for every locator no interface holds; (interface, address) added."""
    from pyroute2 import IPRoute  # noqa: PLC0415 - netlink only in the daemon

    held = held_locators(states)
    wanted = [e.locator for e in locators if e.locator not in held]
    if not wanted or not interfaces:
        return []
    added: list[tuple[str, str]] = []
    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=interfaces[0])[0]
        for locator in wanted:
            address = str(ILV(locator, nid).address)
            ipr.addr("add", index=index, address=address, prefixlen=64, flags=_IFA_F_NODAD)
            added.append((interfaces[0], address))
    return added


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
