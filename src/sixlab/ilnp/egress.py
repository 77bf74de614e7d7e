"""How the host daemon's packets leave: out of the link that holds their source locator,
and never parked in the kernel behind a neighbour nobody resolves.

Theory of operation
-------------------
**Which link.** The host hands the daemon whole IPv6 packets (header included:
``IPPROTO_RAW``, RFC 3542 §3), each from a locator it chose. A socket that the kernel
routes by destination alone sends them over whatever the routing table prefers, which
after a failover is often the link that just died: its default route stays while the
link has no carrier, so the Locator Update that announces the move and the data that
follow it vanish into the dead link. A locator names the subnetwork of one of the
node's interfaces (RFC 6740 §3.2), so a packet from that locator belongs on that
interface: each link has its own ``IPPROTO_RAW`` socket bound to the device
(``SO_BINDTODEVICE``), which restricts the kernel's route lookup to routes through
that link. A packet whose locator is on no usable link goes through an unbound socket,
routed by destination, as does one the link cannot route (``ENETUNREACH``); both are
counted (``tx_unbound``, ``tx_no_route_on_link``).

**Unresolved neighbours.** A packet for an on-link destination whose link-layer
address is not known yet waits in the kernel's neighbour queue while Neighbour
Discovery runs (RFC 4861 §7.2.2), up to three seconds when nobody answers, and all that
time it is charged to the sending socket's buffer. A crowd of such destinations (a
flood of new correspondents from an on-link prefix with no hosts behind it) fills the
buffer, and every later send fails, to established peers as well: one flood stops
every flow. So the daemon keeps those packets itself:

* it knows the kernel's neighbour table (a dump at start, then the neighbour events
  of a netlink socket), and each link's routes (:mod:`sixlab.ilnp.links`): a
  destination is on-link when the route the kernel would pick through that link (the
  longest prefix, then the lowest metric) has no gateway;
* a packet to an on-link destination with no usable neighbour entry (reachable,
  stale, delay, probe, permanent or no-ARP) is held in the daemon, at most
  :data:`QUEUE_PER_NEIGHBOUR` per destination (a new arrival replaces the oldest, RFC
  4861 §7.2.2) and :data:`MAX_PENDING` destinations, and the kernel is asked to
  resolve the destination without a packet (``RTM_NEWNEIGH`` with ``NTF_USE``);
* when the entry becomes usable, the held packets leave; when it fails, or after
  :data:`HOLD_S`, they are dropped and counted (``neighbour_unresolved``), as are
  packets refused for a full table (``neighbour_table_full``) or replaced
  (``neighbour_queue_overflow``).

A packet to a destination behind a router is sent at once: its next hop is the router,
one neighbour that every flow through it shares. Nothing of the daemon's is ever
queued in the kernel for long, so an established peer's packets go out whatever the
crowd does.

Every failure to send is counted by errno (``tx_error_ENOBUFS``, ...): the daemon's
``drops`` shows them next to every other loss.

**The kernel fast path's packets** leave through the kernel's neighbour code
(``bpf_redirect_neigh``), which parks a packet for an unresolved next hop in the
neighbour's queue. Between a link's failure and the daemon's rewrite of the kernel's
records a few packets still go to the dead link, whose neighbours the kernel flushed:
each waits there for Neighbour Discovery to give up, three seconds, and a TCP segment
that waits is never retransmitted meanwhile (the kernel does not resend a segment
whose last copy is still queued in the host), so the connection stops for three
seconds. :func:`flush_unresolved` deletes the unresolved neighbours of a link that is
not usable, and their queues with them; the daemon calls it for such links whenever
it reads the links.

A fast-path packet must not wait in that queue at all: it carries the TUN route's
``dst``, and when the neighbour resolves the kernel sends what waited through the
neighbour that ``dst`` names (one of the TUN device, which has no link layer), so it
leaves the link with no Ethernet header and is lost. The daemon therefore names a next
hop in a kernel record only while :meth:`Egress.neighbour_usable` says its neighbour is
usable (asking the kernel to resolve it otherwise, packets meanwhile taking the
daemon's path), and rewrites the records whose next hop :meth:`Egress.take_changed`
reports.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
import struct
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sixlab.ilnp.links import LinkState, netlink_messages

__all__ = [
    "HOLD_S",
    "MAX_PENDING",
    "QUEUE_PER_NEIGHBOUR",
    "Egress",
    "flush_unresolved",
    "neighbour_messages",
    "on_link",
    "route_table",
]

#: Packets held per unresolved destination (Linux keeps about as many by default).
QUEUE_PER_NEIGHBOUR = 3
#: Unresolved destinations held at once; past this, packets to new ones are dropped.
MAX_PENDING = 1024
#: Longest a packet waits for its neighbour: Neighbour Discovery gives up after
#: MAX_MULTICAST_SOLICIT (3) × RETRANS_TIMER (1 s) (RFC 4861 §10), plus a second.
HOLD_S = 4.0

# <linux/rtnetlink.h>, <linux/neighbour.h>, <linux/netlink.h>
_RTMGRP_NEIGH = 0x4
_RTM_NEWNEIGH = 28
_RTM_DELNEIGH = 29
_NLM_F_REQUEST = 0x1
_NLM_F_CREATE = 0x400
_NLMSG_ERROR = 2
_NDA_DST = 1
_NTF_USE = 0x01
_NUD_FAILED = 0x20
#: REACHABLE, STALE, DELAY, PROBE, NOARP, PERMANENT: the kernel sends at once.
_NUD_USABLE = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80
_NLMSGHDR = struct.Struct("=IHHII")
_NDMSG = struct.Struct("=BBHiHBB")
_RTATTR = struct.Struct("=HH")
_EVENT_RCVBUF = 4 << 20

_Key = tuple[int, bytes]  # (ifindex, IPv6 destination)


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


def _netlink(groups: int) -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    try:
        if groups:
            with contextlib.suppress(OSError):  # a larger buffer is only a cushion
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _EVENT_RCVBUF)
        sock.bind((0, groups))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def neighbour_messages(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """The IPv6 neighbour messages of a netlink buffer: (type, ifindex, state, address).

    Other messages, other families and truncated ones are skipped.
    """
    out = []
    for kind, body, end in netlink_messages(data):
        if kind in (_RTM_NEWNEIGH, _RTM_DELNEIGH) and end - body >= _NDMSG.size:
            family, _p1, _p2, ifindex, state, _fl, _type = _NDMSG.unpack_from(data, body)
            attr = body + _NDMSG.size
            while family == socket.AF_INET6 and attr + _RTATTR.size <= end:
                alen, atype = _RTATTR.unpack_from(data, attr)
                if alen < _RTATTR.size:
                    break
                if atype == _NDA_DST and alen == _RTATTR.size + 16:
                    address = data[attr + _RTATTR.size : attr + alen]
                    out.append((kind, ifindex, state, address))
                    break
                attr += (alen + 3) & ~3
    return out


#: INCOMPLETE (resolution running, packets queued) and FAILED neighbour states.
_NUD_UNRESOLVED = 0x01 | _NUD_FAILED


def flush_unresolved(ifindex: int) -> int:
    """Delete the unresolved neighbours of interface ``ifindex`` (and the packets they
    hold, module doc); how many. A link that is gone has none."""
    from pyroute2 import IPRoute  # noqa: PLC0415 - netlink only in the daemon
    from pyroute2.netlink.exceptions import NetlinkError  # noqa: PLC0415

    flushed = 0
    with IPRoute() as ipr:
        try:
            entries = ipr.get_neighbours(family=socket.AF_INET6, ifindex=ifindex)
        except NetlinkError:
            return 0
        for entry in entries:
            dst = entry.get("NDA_DST")
            if dst and entry["state"] & _NUD_UNRESOLVED:
                with contextlib.suppress(NetlinkError):  # gone meanwhile
                    ipr.neigh("del", dst=dst, ifindex=ifindex, family=socket.AF_INET6)
                    flushed += 1
    return flushed


def on_link(routes: Iterable[tuple[int, int, bool]], dst: int) -> bool:
    """Whether the route the kernel takes to ``dst`` is on-link (has no gateway).

    ``routes`` are (shift, network >> shift, on-link) in lookup order (longest prefix,
    then lowest metric), as :meth:`Egress.set_links` makes them; the first match is
    the kernel's choice. No match: not on-link (the kernel refuses, or another socket
    routes it).
    """
    for shift, network, onlink in routes:
        if dst >> shift == network:
            return onlink
    return False


def _use_request(ifindex: int, address: bytes) -> bytes:
    """``RTM_NEWNEIGH`` + ``NTF_USE``: resolve ``address`` on ``ifindex`` now, no packet."""
    body = _NDMSG.pack(socket.AF_INET6, 0, 0, ifindex, 0, _NTF_USE, 0)
    body += _RTATTR.pack(_RTATTR.size + 16, _NDA_DST) + address
    flags = _NLM_F_REQUEST | _NLM_F_CREATE
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), _RTM_NEWNEIGH, flags, 0, 0) + body


def route_table(routes: Iterable[tuple[int, int, bool]]) -> tuple[tuple[int, int, bool], ...]:
    """(network, prefix length, on-link) routes, in lookup order, as :func:`on_link`
    takes them."""
    return tuple((128 - plen, net >> (128 - plen), onlink) for net, plen, onlink in routes)


@dataclass(slots=True)
class _Pending:
    link: str
    until: float
    packets: deque[bytes] = field(default_factory=lambda: deque(maxlen=QUEUE_PER_NEIGHBOUR))


class Egress:
    """The daemon's send side (module doc): a socket per link, an unbound one, and the
    packets held for unresolved neighbours.

    Use :meth:`open`, :meth:`set_links` whenever the links were read, :meth:`send` per
    packet, :meth:`on_events` when :meth:`fileno` is readable, :meth:`expire` every
    loop turn, and :meth:`close`.
    """

    def __init__(self, links: Iterable[str]) -> None:
        self.links = tuple(links)
        self.counters: Counter[str] = Counter()
        self._sockets: dict[str, socket.socket] = {}
        self._any: socket.socket | None = None
        self._events: socket.socket | None = None
        self._requests: socket.socket | None = None
        self._ifindex: dict[str, int] = {}
        #: Per link, its routes in lookup order: (shift, network >> shift, on-link).
        self._routes: dict[str, tuple[tuple[int, int, bool], ...]] = {}
        self._usable: set[_Key] = set()
        self._pending: dict[_Key, _Pending] = {}
        self._expiry: deque[tuple[float, _Key]] = deque()
        #: Neighbours whose usability changed since :meth:`take_changed`.
        self._changed: set[_Key] = set()

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        try:
            self._any = _raw_socket(None)
            for name in self.links:
                self._sockets[name] = _raw_socket(name)
            self._events = _netlink(_RTMGRP_NEIGH)
            self._requests = _netlink(0)
            self._load_neighbours()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for sock in (*self._sockets.values(), self._any, self._events, self._requests):
            if sock is not None:
                sock.close()
        self._sockets.clear()
        self._any = self._events = self._requests = None

    @property
    def opened(self) -> bool:
        return self._events is not None

    def fileno(self) -> int:
        """The neighbour event socket."""
        assert self._events is not None, "open() first"
        return self._events.fileno()

    def set_links(self, states: Mapping[str, LinkState]) -> None:
        """Each link's index and routes, as :mod:`sixlab.ilnp.links` read them."""
        self._ifindex = {n: s.ifindex for n, s in states.items() if s.ifindex}
        self._routes = {name: route_table(state.routes) for name, state in states.items()}

    def _load_neighbours(self) -> None:
        """The kernel's neighbour table now (events keep it up to date afterwards)."""
        from pyroute2 import IPRoute  # noqa: PLC0415 - netlink only in the daemon

        usable: set[_Key] = set()
        with IPRoute() as ipr:
            for entry in ipr.get_neighbours(family=socket.AF_INET6):
                dst = entry.get("NDA_DST")
                if dst and entry["state"] & _NUD_USABLE:
                    usable.add((int(entry["ifindex"]), ipaddress.IPv6Address(dst).packed))
        self._changed |= usable ^ self._usable
        self._usable = usable

    # ------------------------------------------------------------------ sending

    def send(self, datagram: bytes, link: str | None, now: float) -> bool:
        """Send ``datagram`` out of ``link`` (None: wherever its destination routes), or
        hold it for its neighbour (module doc). False when it was dropped."""
        if (
            link is not None
            and link in self._sockets
            and on_link(self._routes.get(link, ()), int.from_bytes(datagram[24:40], "big"))
        ):
            key = (self._ifindex.get(link, 0), datagram[24:40])
            if key not in self._usable:
                return self._hold(key, link, datagram, now)
        return self._transmit(datagram, link)

    def _transmit(self, datagram: bytes, link: str | None) -> bool:
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

    def _hold(self, key: _Key, link: str, datagram: bytes, now: float) -> bool:
        pending = self._pending.get(key)
        if pending is None:
            if len(self._pending) >= MAX_PENDING:
                self.counters["neighbour_table_full"] += 1
                return False
            pending = _Pending(link, now + HOLD_S)
            self._pending[key] = pending
            self._expiry.append((pending.until, key))
            self._resolve(key)
        elif len(pending.packets) == QUEUE_PER_NEIGHBOUR:
            self.counters["neighbour_queue_overflow"] += 1  # the oldest one goes
        pending.packets.append(datagram)
        self.counters["held"] += 1
        return True

    def _resolve(self, key: _Key) -> None:
        ifindex, address = key
        if self._requests is None or not ifindex:
            return
        try:
            self._requests.send(_use_request(ifindex, address))
            self.counters["resolve_requests"] += 1
        except OSError:  # the kernel's queue is full: the hold times out, counted
            self.counters["resolve_request_errors"] += 1

    # ------------------------------------------------------------------ events

    def on_events(self, now: float) -> None:
        """Read the neighbour events: send what waited for a now usable neighbour,
        drop what waited for a failed one. Also drains the answers to our requests."""
        self._drain_requests()
        sock = self._events
        if sock is None:
            return
        lost = False
        while True:
            try:
                data = sock.recv(1 << 16)
            except BlockingIOError:
                break
            except OSError:  # ENOBUFS: events were lost; the table is read again below
                lost = True
                continue
            if not data:
                break
            for kind, ifindex, state, address in neighbour_messages(data):
                self._on_neighbour(kind, (ifindex, address), state)
        if lost:
            self.counters["neighbour_events_lost"] += 1
            with contextlib.suppress(OSError):
                self._load_neighbours()
            for key in [k for k in self._pending if k in self._usable]:
                self._release(key)
        self.expire(now)

    def neighbour_usable(self, ifindex: int, address: bytes) -> bool:
        """Whether the kernel sends to ``address`` on ``ifindex`` without queueing the
        packet; when not, the kernel is asked to resolve it (module doc)."""
        key = (ifindex, address)
        if key in self._usable:
            return True
        self._resolve(key)
        return False

    def take_changed(self) -> set[_Key]:
        """The neighbours that became usable, or stopped being so, since the last call."""
        changed, self._changed = self._changed, set()
        return changed

    def _on_neighbour(self, kind: int, key: _Key, state: int) -> None:
        if (kind == _RTM_NEWNEIGH and bool(state & _NUD_USABLE)) != (key in self._usable):
            self._changed.add(key)
        if kind == _RTM_NEWNEIGH and state & _NUD_USABLE:
            self._usable.add(key)
            if key in self._pending:
                self._release(key)
            return
        self._usable.discard(key)
        if kind == _RTM_NEWNEIGH and state & _NUD_FAILED and key in self._pending:
            self._drop(key)

    def _release(self, key: _Key) -> None:
        pending = self._pending.pop(key)
        for datagram in pending.packets:
            self._transmit(datagram, pending.link)

    def _drop(self, key: _Key) -> None:
        pending = self._pending.pop(key)
        self.counters["neighbour_unresolved"] += len(pending.packets)

    def _drain_requests(self) -> None:
        sock = self._requests
        if sock is None:
            return
        while True:
            try:
                data = sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.counters["resolve_request_errors"] += 1
                continue
            if not data:
                return
            offset = 0
            while offset + _NLMSGHDR.size + 4 <= len(data):
                length, kind, _f, _s, _p = _NLMSGHDR.unpack_from(data, offset)
                if kind == _NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", data, offset + _NLMSGHDR.size)
                    if code:
                        self.counters["resolve_request_errors"] += 1
                if length < _NLMSGHDR.size:
                    break
                offset += (length + 3) & ~3

    def expire(self, now: float) -> None:
        """Drop the packets that waited :data:`HOLD_S` for their neighbour."""
        expiry = self._expiry
        while expiry and expiry[0][0] <= now:
            until, key = expiry.popleft()
            pending = self._pending.get(key)
            if pending is not None and pending.until == until:
                self._drop(key)

    # ------------------------------------------------------------------ reporting

    def drops(self) -> dict[str, int]:
        """The packets lost on the way out, by cause."""
        names = ("neighbour_unresolved", "neighbour_table_full", "neighbour_queue_overflow")
        out = {k: v for k, v in self.counters.items() if k.startswith("tx_error")}
        out |= {k: self.counters[k] for k in names if self.counters[k]}
        return out

    def json(self) -> dict[str, object]:
        return {"counters": dict(self.counters), "pending_neighbours": len(self._pending)}
