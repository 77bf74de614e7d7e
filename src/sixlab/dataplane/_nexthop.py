"""The link-layer next hop of a reply, from the kernel's route and neighbour tables.

Shared by the planes that write whole frames (``mmap``, ``afxdp``): ``RTM_GETROUTE``
for the first hop of the reply (the first segment of its return path, or its
destination) gives the output interface, the gateway and the preferred source; the
neighbour table gives the MAC. An answer is trusted for ``NEXT_HOP_TTL_S``; an
unresolved neighbour (or a local first hop) gives an empty Ethernet header, and the
plane sends through the kernel's IPv6 stack instead, which resolves it for the next
packet.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from ipaddress import IPv6Address
from typing import Any

from sixlab.dataplane.base import DataplaneError

__all__ = ["NEXT_HOP_TTL_S", "NextHop", "resolve_next_hop"]

#: Per-first-hop link-layer answers are trusted this long.
NEXT_HOP_TTL_S = 1.0
#: An unresolved neighbour is asked for again after this long: under a flood of probes
#: from a new peer, one netlink round trip per packet would stall the plane.
UNRESOLVED_TTL_S = 0.01
_ETHERTYPE_IPV6 = (0x86DD).to_bytes(2, "big")
#: <linux/neighbour.h> states whose MAC can be used now.
_NUD_USABLE = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80
_RTN_LOCAL = 2


@dataclass(frozen=True, slots=True)
class NextHop:
    ifname: str
    ethernet: bytes  # destination MAC + our MAC + EtherType, or b"" for the L3 path
    source: bytes | None  # the route's preferred source
    expires: float


def resolve_next_hop(ipr: Any, first_hop: IPv6Address) -> NextHop:
    """Output interface, Ethernet header and source for ``first_hop`` (module doc).

    ``ipr`` is a pyroute2 ``IPRoute``; a missing route raises ``DataplaneError``.
    """
    from pyroute2.netlink.exceptions import NetlinkError  # noqa: PLC0415

    now = time.monotonic()
    try:
        route = ipr.route("get", dst=str(first_hop))[0]
    except NetlinkError as exc:
        raise DataplaneError(f"dataplane: no route to {first_hop}: {exc}") from exc
    oif = route.get_attr("RTA_OIF")
    prefsrc = route.get_attr("RTA_PREFSRC")
    source = IPv6Address(prefsrc).packed if prefsrc else None
    ethernet = b""
    ifname = ""
    if route["type"] != _RTN_LOCAL and oif:
        neighbour = route.get_attr("RTA_GATEWAY") or str(first_hop)
        try:
            entries = ipr.neigh("get", dst=neighbour, ifindex=oif)
        except NetlinkError:
            entries = []
        # The name from netlink, not if_indextoname(3): ``ipr`` answers for the
        # namespace the plane was opened in, which the calling thread may not be in.
        info = ipr.get_links(oif)[0]
        ifname = info.get_attr("IFLA_IFNAME") or ""
        link = info.get_attr("IFLA_ADDRESS")
        for entry in entries:
            lladdr = entry.get_attr("NDA_LLADDR")
            if lladdr and entry["state"] & _NUD_USABLE and link:
                ethernet = (
                    bytes.fromhex(lladdr.replace(":", ""))
                    + bytes.fromhex(link.replace(":", ""))
                    + _ETHERTYPE_IPV6
                )
                break
    # An unresolved neighbour is retried soon (the L3 send resolves it meanwhile).
    resolved = ethernet or route["type"] == _RTN_LOCAL
    expires = now + (NEXT_HOP_TTL_S if resolved else UNRESOLVED_TTL_S)
    return NextHop(ifname, ethernet, source, expires)
