"""How the host daemon's packets leave: out of the link that holds their source locator.

Theory of operation
-------------------
The host hands the daemon whole IPv6 packets (header included: ``IPPROTO_RAW``,
RFC 3542 §3), each from a locator it chose. A socket that the kernel routes by
destination alone sends them over whatever the routing table prefers, which after a
failover is often the link that just died: its default route stays while the link
has no carrier (``ignore_routes_with_linkdown`` is 0 by default), so the Locator
Update that announces the move and the data that follow it vanish into the dead link.
A locator names the subnetwork of one of the node's interfaces (RFC 6740 §3.2), so a
packet from that locator belongs on that interface.

So each link has its own ``IPPROTO_RAW`` socket bound to the device
(``SO_BINDTODEVICE``): the kernel's route lookup is then restricted to routes through
that link, and the packet goes out there or not at all. A packet whose locator is on
no usable link (it was never seen on one, or all its links are down) goes through an
unbound socket, routed by destination, as does one the link cannot route
(``ENETUNREACH``: no route through that link); both are counted.

Every failure to send is counted by errno (``tx_error_ENOBUFS``, ...): the daemon's
``drops`` shows them next to every other loss.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections import Counter
from collections.abc import Iterable

__all__ = ["Egress"]


def _raw_socket(device: str | None) -> socket.socket:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
    try:
        if device is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class Egress:
    """The daemon's send side: one socket per link plus an unbound one (module doc)."""

    def __init__(self, links: Iterable[str]) -> None:
        self.links = tuple(links)
        self.counters: Counter[str] = Counter()
        self._sockets: dict[str, socket.socket] = {}
        self._any: socket.socket | None = None

    def open(self) -> None:
        try:
            self._any = _raw_socket(None)
            for name in self.links:
                self._sockets[name] = _raw_socket(name)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()
        if self._any is not None:
            self._any.close()
            self._any = None

    def send(self, datagram: bytes, link: str | None) -> bool:
        """Send ``datagram`` out of ``link`` (None: wherever its destination routes)."""
        dst = (str(ipaddress.IPv6Address(datagram[24:40])), 0)
        sock = None if link is None else self._sockets.get(link)
        if sock is None:
            self.counters["tx_unbound"] += 1
        else:
            try:
                sock.sendto(datagram, dst)
            except OSError as exc:
                if exc.errno != errno.ENETUNREACH:
                    self._failed(exc)
                    return False
                self.counters["tx_no_route_on_link"] += 1
            else:
                self.counters["tx"] += 1
                return True
        if self._any is None:
            return False
        try:
            self._any.sendto(datagram, dst)
        except OSError as exc:
            self._failed(exc)
            return False
        self.counters["tx"] += 1
        return True

    def _failed(self, exc: OSError) -> None:
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        self.counters[f"tx_error_{name}"] += 1

    def drops(self) -> dict[str, int]:
        """The sends that failed, by cause."""
        return {k: v for k, v in self.counters.items() if k.startswith("tx_error")}
