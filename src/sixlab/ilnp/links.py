"""The host daemon's links: which are usable, which locators each holds, and when that
changes.

Theory of operation
-------------------
A locator is the /64 of an address on one of the daemon's interfaces (a locator names
the subnetwork a node is attached to, RFC 6740 §3.2). Each locator is tied to the
interfaces it was ever seen on, its *homes*: IPv6 drops a link's addresses when the
link goes administratively down (``keep_addr_on_down=0``), so a home is remembered,
and a locator is *down* when none of its homes is usable and holds it (or no link
ever held it: a locator is an L64 a link holds, :mod:`sixlab.ilnp.config`). A link is
usable when it is administratively up *and* has carrier: a cable pulled at the far end
(a veth whose peer went down) leaves the interface up with no carrier, and everything
sent there is lost.

Each link also carries its routes (main table, through that link), ordered as the
kernel's lookup picks them: longest prefix first, then lowest metric. A destination
whose chosen route has no gateway is a neighbour, whose link-layer address the kernel
must resolve first (:mod:`sixlab.ilnp.egress` needs to know). The kernel fast path
is told each correspondent's next hop on the link that holds the local locator
(:meth:`LinkWatcher.next_hop`): its own route lookup would take the host's preferred
route, whatever link that goes through, and look for that route's gateway on our
link, where it never answers.

Changes arrive on a netlink socket subscribed to link, IPv6 address and route events, which
wakes the daemon's loop at once; the message itself is not parsed (the links are read
again with pyroute2, every field at once). Carrier is read from ``IFLA_CARRIER``,
which the kernel updates at once, rather than from the operational state, which its
link watcher updates up to a second later; a slow poll (the daemon's) covers events
lost to an overrun of the socket.

Routes through a link without carrier stay in the table and keep winning the route
lookup (``ignore_routes_with_linkdown`` is 0 by default, ``Documentation/networking/
ip-sysctl.rst``), so the kernel's own routing, and with it the fast path's
``bpf_redirect_neigh`` (whose lookup takes the wanted device only as a hint once the
source address is set), keeps choosing the dead link. While the daemon runs, it sets
``net.ipv6.conf.LINK.ignore_routes_with_linkdown`` on each of its links and puts the
old value back when it closes.

An interface deleted and made again has a new index, which a capture socket bound to
the old one never sees: the daemon compares its rings' indexes with the ones read
here and makes a ring again when they differ.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sixlab.ilnp.config import LinkStates

__all__ = [
    "LinkState",
    "LinkWatcher",
    "clsact_filters",
    "default_interfaces",
    "device_drops",
    "link_states",
    "read_links",
]

# <linux/rtnetlink.h> multicast groups: link state, IPv6 addresses, IPv6 routes.
_RTMGRP_LINK = 0x1
_RTMGRP_IPV6_IFADDR = 0x100
_RTMGRP_IPV6_ROUTE = 0x400
_RT_TABLE_MAIN = 254
_RTN_UNICAST = 1
_IFF_UP = 0x1
#: Operational states (RFC 2863 ifOperStatus, as the kernel names them) that carry
#: packets: UNKNOWN is what drivers without carrier reporting (TUN, dummy) show.
_OPER_USABLE = frozenset({"UP", "UNKNOWN"})
_SYSCTL = "/proc/sys/net/ipv6/conf/{}/ignore_routes_with_linkdown"
#: The clsact qdisc's parent and its ingress and egress hooks (TC_H_CLSACT, TC_H_MIN_*).
_TC_H_CLSACT = 0xFFFFFFF1
_TC_HOOKS = (0xFFFFFFF2, 0xFFFFFFF3)


@dataclass(frozen=True, slots=True)
class LinkState:
    """One interface as last read. ``ifindex`` 0: no such interface now."""

    name: str
    ifindex: int = 0
    admin_up: bool = False
    carrier: bool = False
    operstate: str = "ABSENT"
    #: The /64 of every IPv6 address on it, as 64-bit integers (locators).
    prefixes: frozenset[int] = frozenset()
    #: Main-table routes through it in lookup order (longest prefix, then lowest
    #: metric): (network as a 128-bit integer, prefix length, on-link: no gateway).
    routes: tuple[tuple[int, int, bool], ...] = ()
    #: The same routes' next hops, where one is known: (network, prefix length, the
    #: gateway as a 128-bit integer; 0: on-link, the destination itself).
    hops: tuple[tuple[int, int, int], ...] = ()

    @property
    def usable(self) -> bool:
        """Up, with carrier, and in an operational state that carries packets.

        Losing carrier shows in ``carrier`` at once; getting it back is trusted only
        once the operational state follows (the kernel activates the link's queue
        at that moment, not before)."""
        return (
            self.ifindex != 0 and self.admin_up and self.carrier and self.operstate in _OPER_USABLE
        )

    def json(self) -> dict[str, object]:
        return {
            "ifindex": self.ifindex,
            "admin_up": self.admin_up,
            "carrier": self.carrier,
            "operstate": self.operstate,
            "usable": self.usable,
        }


def read_links(names: Iterable[str]) -> dict[str, LinkState]:
    """The state of each named interface (absent ones with ``ifindex`` 0)."""
    from pyroute2 import IPRoute  # noqa: PLC0415 - netlink only in the daemon

    out: dict[str, LinkState] = {}
    with IPRoute() as ipr:
        routes = ipr.get_routes(family=socket.AF_INET6, table=_RT_TABLE_MAIN)
        for name in names:
            found = ipr.link_lookup(ifname=name)
            if not found:
                out[name] = LinkState(name)
                continue
            index = found[0]
            link = ipr.get_links(index)[0]
            prefixes = frozenset(
                int(ipaddress.IPv6Address(a.get("IFA_ADDRESS"))) >> 64
                for a in ipr.get_addr(family=socket.AF_INET6, index=index)
            )
            ordered = sorted(
                (
                    -int(r["dst_len"]),
                    int(r.get("RTA_PRIORITY") or 0),
                    int(ipaddress.IPv6Address(r.get("RTA_DST") or "::")),
                    r["type"] == _RTN_UNICAST
                    and r.get("RTA_GATEWAY") is None
                    and r.get("RTA_MULTIPATH") is None,
                    int(ipaddress.IPv6Address(r.get("RTA_GATEWAY") or "::")),
                    r["type"] == _RTN_UNICAST and r.get("RTA_MULTIPATH") is None,
                )
                for r in routes
                if r.get("RTA_OIF") == index
            )
            link_routes = tuple((net, -neg, onlink) for neg, _m, net, onlink, _g, _u in ordered)
            hops = tuple((net, -neg, gw) for neg, _m, net, _o, gw, unicast in ordered if unicast)
            out[name] = LinkState(
                name,
                ifindex=index,
                admin_up=bool(link["flags"] & _IFF_UP),
                carrier=bool(link.get("carrier", 1)),
                operstate=str(link.get("operstate", "UNKNOWN")),
                prefixes=prefixes,
                routes=link_routes,
                hops=hops,
            )
    return out


def link_states(names: Iterable[str]) -> LinkStates:
    """:func:`read_links` as :mod:`sixlab.ilnp.config` takes it: name to (usable,
    the /64 prefixes on it)."""
    return {name: (s.usable, set(s.prefixes)) for name, s in read_links(names).items()}


def default_interfaces(sysfs: Path = Path("/sys/class/net")) -> tuple[str, ...]:
    """The links a daemon serves when none is named: every Ethernet interface (ARPHRD_ETHER:
    veth, NICs; not loopback, not a TUN device) that is administratively up, by name."""
    found = []
    for device in sorted(sysfs.iterdir()):
        try:
            kind = (device / "type").read_text().strip()
            flags = int((device / "flags").read_text().strip(), 16)
        except (OSError, ValueError):
            continue
        if kind == "1" and flags & _IFF_UP:
            found.append(device.name)
    return tuple(found)


def device_drops(name: str) -> dict[str, int]:
    """The kernel's ``rx_dropped``/``tx_dropped`` of interface ``name`` ({} if none)."""
    from pyroute2 import IPRoute  # noqa: PLC0415 - netlink only in the daemon

    try:
        with IPRoute() as ipr:
            found = ipr.link_lookup(ifname=name)
            if not found:
                return {}
            stats = ipr.get_links(found[0])[0].get("stats64") or {}
    except OSError:
        return {}
    return {k: int(stats.get(k, 0)) for k in ("rx_dropped", "tx_dropped")}


def clsact_filters(name: str) -> set[tuple[int, int]] | None:
    """The (priority, handle) of every tc filter on ``name``'s ``clsact`` hooks, or
    None when it has no ``clsact`` qdisc (or no such interface)."""
    from pyroute2 import IPRoute  # noqa: PLC0415 - netlink only in the daemon

    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=name)
        if not found:
            return None
        index = found[0]
        if not any(q["parent"] == _TC_H_CLSACT for q in ipr.get_qdiscs(index=index)):
            return None
        return {
            (f["info"] >> 16, f["handle"])
            for hook in _TC_HOOKS
            for f in ipr.get_filters(index=index, parent=hook)
            if f["handle"]  # the per-priority header a dump also lists has none
        }


class LinkWatcher:
    """The daemon's interfaces, their locators, and the event socket (module doc).

    :meth:`open` makes the event socket (:meth:`fileno` for the loop), :meth:`drain`
    empties it, :meth:`refresh` reads the links again; :meth:`link_for`,
    :meth:`ifindex_for` and :meth:`down` answer from the last read.
    """

    def __init__(self, names: Iterable[str]) -> None:
        self.names = tuple(names)
        self.states: dict[str, LinkState] = {name: LinkState(name) for name in self.names}
        #: Every interface each locator was ever seen on (module doc).
        self.homes: dict[int, set[str]] = {}
        self.counters: Counter[str] = Counter()
        self._sock: socket.socket | None = None
        self._route: dict[int, str] = {}
        #: ``ignore_routes_with_linkdown`` of each link before we set it (module doc).
        self._saved: dict[str, str] = {}

    def open(self) -> None:
        """The event socket, and dead links' routes ignored (module doc)."""
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        try:
            sock.bind((0, _RTMGRP_LINK | _RTMGRP_IPV6_IFADDR | _RTMGRP_IPV6_ROUTE))
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        for name in self.names:
            path = Path(_SYSCTL.format(name))
            try:
                old = path.read_text().strip()
                if old != "1":
                    path.write_text("1\n")
                    self._saved[name] = old
            except OSError:  # no such link (yet), or no IPv6 on it: nothing to route
                self.counters["sysctl_errors"] += 1

    @property
    def opened(self) -> bool:
        return self._sock is not None

    def changed_settings(self) -> dict[str, str]:
        """Each sysctl file :meth:`open` wrote, with the value it found there."""
        return {_SYSCTL.format(name): old for name, old in self._saved.items()}

    def fileno(self) -> int:
        assert self._sock is not None, "open() first"
        return self._sock.fileno()

    def close(self) -> None:
        """Close the event socket and put the links' settings back; safe to call twice."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for name, old in self._saved.items():
            with contextlib.suppress(OSError):  # the link is gone, and its setting with it
                Path(_SYSCTL.format(name)).write_text(f"{old}\n")
        self._saved.clear()

    def drain(self) -> None:
        """Read every waiting notification (what changed is moot: see :meth:`refresh`)."""
        sock = self._sock
        if sock is None:
            return
        while True:
            try:
                if not sock.recv(65536):
                    return
                self.counters["link_events"] += 1
            except BlockingIOError:
                return
            except OSError:  # ENOBUFS: events were lost; the caller's re-read covers them
                self.counters["link_events_lost"] += 1

    def refresh(self) -> bool:
        """Read the links again; whether any locator got a new home. On a netlink error
        the last read stays (counted)."""
        try:
            states = read_links(self.names)
        except OSError:
            self.counters["link_read_errors"] += 1
            return False
        new_home = False
        for name, state in states.items():
            for prefix in state.prefixes:
                homes = self.homes.setdefault(prefix, set())
                if name not in homes:
                    homes.add(name)
                    new_home = True
        self.states = states
        self._route = {}
        for locator, homes in self.homes.items():
            for name in sorted(homes):
                state = states[name]
                if state.usable and locator in state.prefixes:
                    self._route[locator] = name
                    break
        return new_home

    def link_for(self, locator: int) -> str | None:
        """The usable interface holding ``locator`` (the first by name), if any."""
        return self._route.get(locator)

    def ifindex_for(self, locator: int) -> int | None:
        """The interface index ``locator`` lives on: its usable home, else the first
        home by name that exists; None when it was never seen."""
        name = self._route.get(locator)
        if name is None:
            for home in sorted(self.homes.get(locator, ())):
                if self.states[home].ifindex:
                    name = home
                    break
        return None if name is None else self.states[name].ifindex or None

    def next_hop(self, locator: int, dst: int) -> int | None:
        """Where a packet from ``locator`` to ``dst`` goes first on the interface
        :meth:`ifindex_for` names: the gateway of the first route through that link that
        covers ``dst``, or ``dst`` itself on-link; None when that link has no such
        route (or the locator no interface)."""
        index = self.ifindex_for(locator)
        state = next((s for s in self.states.values() if index and s.ifindex == index), None)
        for net, plen, gateway in () if state is None else state.hops:
            if dst >> (128 - plen) == net >> (128 - plen):
                return gateway or dst
        return None

    def down(self, locators: Iterable[int]) -> set[int]:
        """Of ``locators``, those no usable interface holds now."""
        return {locator for locator in locators if locator not in self._route}

    def json(self) -> dict[str, dict[str, object]]:
        return {name: state.json() for name, state in self.states.items()}
