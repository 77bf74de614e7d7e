"""A sans-I/O ILNPv6 host: receive and send paths, Locator Updates, admission.

Theory of operation
-------------------
The host sits between the network and applications (docs/architecture.md). It owns no
socket and reads no clock: the adapter passes bytes and ``now`` in, and takes packets
(:meth:`IlnpHost.datagrams_to_send`), events (:meth:`IlnpHost.next_event`) and the next
timer (:meth:`IlnpHost.get_timer`) out — the aioquic shape (docs/architecture.md,
"Sans-I/O cores" and "Time").

Receive (:meth:`IlnpHost.receive`, a wire packet):
  1. parse; anything not for our NID and one of our locators is dropped;
  2. a known correspondent: its nonce must match (the first nonce it sent is learned),
     and the source locator must be in its set and not expired; Locator Updates are
     authenticated by the nonce alone, since they come from a locator we do not know yet;
  3. an unknown correspondent must carry a nonce; then the admission policy decides
     whether it gets an ILCC entry. Either way the packet is delivered; a refused peer
     goes into a small bounded *reply table* so that the answer of a non-connected
     server still finds its way back without growing the ILCC;
  4. deliver: addresses rewritten to identifier addresses (prefix + NID), nonce removed.
     The upper-layer checksum is untouched: see ``sixlab.wire.ilnp.IDENTIFIER_PREFIX``.

Send (:meth:`IlnpHost.send`, an application packet with identifier addresses): the
best valid peer locator (lowest preference) and our current locator replace the prefix;
our nonce is added until the peer has answered, while a Locator Update is pending, and
always with ``always_carry_nonce``. A peer that answered our nonce with ICMPv6
Parameter Problem code 2 pointing at option 0x8B is marked non-ILNP and gets plain IPv6
(no nonce, checksum recomputed for its real addresses).

Locator Update (RFC 6743): :meth:`IlnpHost.set_local_locators` advertises the new set
to every active correspondent, retransmits every ``lu_interval`` seconds up to
``lu_max_tries`` times until acknowledged. A received advertisement with the right
nonce replaces the peer's whole locator set and is acknowledged; a wrong or missing
nonce is dropped and counted.

Every drop is counted in :attr:`IlnpHost.counters` under its :class:`DropReason` and
emitted as a :class:`Dropped` event.

Change tracking: every site that creates or removes an ILCC entry, or changes its state,
locators (the set or their states), nonces, ``carry_nonce``, ``lu_next`` or
``local_locator``, calls one private hook, :meth:`IlnpHost._changed`. It records the NID
for :meth:`IlnpHost.take_touched`, so that an adapter mirroring the ILCC elsewhere (a
kernel fast path) copies only what changed, and it reschedules the entry's timer.
``last_used`` and the LRU order change with every packet and are not reported.

Timers: nothing walks the ILCC. Three sources, each with its earliest deadline at hand:

=====================  ===========================================  ====================
source                 earliest deadline                            due work
=====================  ===========================================  ====================
ILCC entries           a min-heap of ``(due, nid)`` (``_timers``)   pop the due items
admission policy       ``policy.next_deadline`` (LRU head: O(1))    ``policy.expired``
reply table            its first item: kept in expiry order         pop from the front
=====================  ===========================================  ====================

An entry is due at its :meth:`IlccEntry.next_deadline`. The heap is invalidated lazily:
``_changed`` pushes the entry's new deadline and leaves the old item where it is; an
item is live only if its entry is still in the ILCC with that very deadline, and stale
items are dropped when they reach the top. When the heap holds more than twice as many
items as the ILCC has entries (stale ones outnumber the live), it is rebuilt from the
ILCC, which the changes since the last rebuild pay for: ``get_timer`` is O(1) amortised
and ``handle_timer`` O(k log n) for k due entries. Due entries are handled in deadline
order. An entry whose locators all expired on a send or receive is
removed there and then, as the timer would have: left in the ILCC in state EXPIRED it
would meet events its table has no row for.

The reply table is an ``OrderedDict`` whose entries all live ``reply_ttl`` from their
last refresh, and a refresh moves the entry to the end: with ``now`` never decreasing
(the adapter's clock is monotonic) insertion order is expiry order, so its first entry
expires first, and the capacity limit evicts the least recently heard correspondent.
"""

from __future__ import annotations

import heapq
import hmac
import secrets
import struct
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from sixlab.ilnp._errors import ConfigError
from sixlab.ilnp.ilcc import EntryEvent, EntryState, IlccEntry, IlccStore, PeerLocator, create_store
from sixlab.ilnp.policy import AdmissionPolicy, AdmissionRequest, NonePolicy
from sixlab.wire import ChecksumError, WireError
from sixlab.wire.ilnp import (
    ICMPV6_NEXT_HEADER,
    ICMPV6_PARAM_PROBLEM,
    IDENTIFIER_PREFIX,
    ILNP_NONCE_OPTION,
    ILV,
    LOCATOR_UPDATE_TYPE,
    PARAM_PROBLEM_UNRECOGNIZED_OPTION,
    IlnpPacket,
    LocatorEntry,
    LocatorUpdate,
    LuOperation,
    Nonce,
    decode_destination_options,
    decode_locator_update,
    decode_packet,
    encode_locator_update,
    encode_packet,
    ipv6_checksum,
    relocate_checksum,
    upper_layer_checksum_offset,
)

__all__ = [
    "MAX_LOCATORS",
    "Adopted",
    "Deliver",
    "DropReason",
    "Dropped",
    "Event",
    "HostConfig",
    "IlnpHost",
    "LocatorUpdateAcked",
    "LocatorUpdateFailed",
    "PeerLocatorsChanged",
    "PeerNotIlnp",
    "Removed",
    "check_locator_set",
]

_PORTS = struct.Struct("!HH")
_PORT_PROTOCOLS = frozenset({6, 17, 132, 136})  # TCP, UDP, SCTP, UDP-Lite: ports first
#: The timer heap is rebuilt once it holds more than twice the ILCC's entries plus this:
#: the slack keeps a small ILCC from being rebuilt on every other change.
_TIMER_HEAP_SLACK = 64


class DropReason(StrEnum):
    MALFORMED = "malformed"
    NOT_FOR_US = "not_for_us"
    NO_NONCE = "no_nonce"
    NONCE_MISMATCH = "nonce_mismatch"
    UNKNOWN_LOCATOR = "unknown_locator"
    NOT_IDENTIFIER = "not_identifier"  # an application packet not on the identifier prefix
    NO_ROUTE = "no_route"  # no usable locator for the destination NID
    LU_UNKNOWN_PEER = "lu_unknown_peer"
    LU_BAD_NONCE = "lu_bad_nonce"
    LU_BAD_CHECKSUM = "lu_bad_checksum"
    LU_UNEXPECTED_ACK = "lu_unexpected_ack"


@dataclass(frozen=True, slots=True)
class Deliver:
    """A packet for the application, on identifier addresses."""

    packet: bytes
    peer_nid: int


@dataclass(frozen=True, slots=True)
class Dropped:
    reason: DropReason
    peer_nid: int | None = None


@dataclass(frozen=True, slots=True)
class Adopted:
    peer_nid: int
    reason: str


@dataclass(frozen=True, slots=True)
class Removed:
    peer_nid: int
    why: str


@dataclass(frozen=True, slots=True)
class PeerLocatorsChanged:
    peer_nid: int
    locators: tuple[LocatorEntry, ...]


@dataclass(frozen=True, slots=True)
class LocatorUpdateAcked:
    peer_nid: int


@dataclass(frozen=True, slots=True)
class LocatorUpdateFailed:
    peer_nid: int


@dataclass(frozen=True, slots=True)
class PeerNotIlnp:
    peer_nid: int


Event = (
    Deliver
    | Dropped
    | Adopted
    | Removed
    | PeerLocatorsChanged
    | LocatorUpdateAcked
    | LocatorUpdateFailed
    | PeerNotIlnp
)


@dataclass(frozen=True, slots=True)
class HostConfig:
    """Static settings of one host; ``locators`` are our own, with preferences."""

    nid: int
    locators: tuple[LocatorEntry, ...]
    identifier_prefix: int = IDENTIFIER_PREFIX
    always_carry_nonce: bool = False
    #: Refuse a packet without our peer's nonce even from a known correspondent (not
    #: NON_ILNP): with both ends carrying it always (RFC 6744 §2 allows that), an
    #: off-path node that spoofs a known I-LV cannot inject data.
    require_nonce: bool = False
    nonce_size: int = 4  # RFC 6744: 4 or 12
    #: Retransmit an unacknowledged Locator Update every second, at most 7 times: what
    #: the Linux prototypes do; RFC 6743 leaves both open (docs/protocols.md).
    lu_interval: float = 1.0
    lu_max_tries: int = 7
    #: Lifetime given to a locator learned from a packet's source address (no LU yet).
    learned_lifetime: int = 600
    #: The reply table for correspondents the policy did not adopt: small and bounded.
    reply_capacity: int = 256
    reply_ttl: float = 30.0
    #: A known correspondent whose packets all failed the nonce check for this long
    #: (nothing valid heard) and that now sends another nonce is taken to have
    #: restarted: its old session is removed and the packet starts a new one, through
    #: admission like any newcomer (RFC 6744 §2: a nonce lives as long as its session;
    #: docs/ilnp-field.md). Three of the kernel fast path's one-second activity periods,
    #: so that a session it carries is never mistaken for a dead one.
    restart_grace: float = 3.0
    #: Ask the policy again, at most this often, about a correspondent answered through
    #: the reply table (None: never). A TCP server's socket is only connected after the
    #: handshake, long after the first packet; like the FreeBSD prototype's tentative
    #: entries promoted when a socket connects, the peer then gets its ILCC entry (and
    #: with it Locator Updates) under the ``socket`` policy.
    readmit_interval: float | None = 0.25
    #: With a key, our nonce toward a peer is HMAC-SHA256(key, NID), truncated: the same
    #: every time that peer gets an entry or a reply-table slot again (after an LRU
    #: eviction under a flood, say), so the peer never sees our nonce change and drop
    #: us; unpredictable to anyone without the key (RFC 6744 §2 asks no more). Without
    #: one, every entry draws a fresh nonce from ``nonce_source``.
    nonce_key: bytes | None = None
    hop_limit: int = 64


#: Locators of one host: what the Num of Locs byte of a Locator Update can carry
#: (RFC 6743 §2); every advertisement holds the whole set.
MAX_LOCATORS = 255


def check_locator_set(locators: Iterable[LocatorEntry]) -> tuple[LocatorEntry, ...]:
    """Our own locator set, checked: not empty, no locator twice, one LU can carry it.

    Raises :class:`ConfigError`: a set that fails here would break later, in a
    Locator Update or in the choice of the preferred locator.
    """
    new = tuple(locators)
    if not new:
        raise ConfigError("locators: a host needs at least one locator")
    if len(new) > MAX_LOCATORS:
        raise ConfigError(f"locators: {len(new)}, a Locator Update carries at most {MAX_LOCATORS}")
    seen: set[int] = set()
    for entry in new:
        if entry.locator in seen:
            quad = ":".join(f"{(entry.locator >> s) & 0xFFFF:x}" for s in (48, 32, 16, 0))
            raise ConfigError(f"locators: {quad} is given twice")
        seen.add(entry.locator)
    return new


@dataclass(slots=True)
class _ReplyHint:
    locator: int
    peer_nonce: Nonce | None  # None: a plain IPv6 correspondent
    local_nonce: Nonce
    expires: float
    retry_at: float = 0.0
    #: Our Locator Update to this correspondent (see ``set_local_locators``).
    lu_advertised: tuple[LocatorEntry, ...] = ()
    lu_tries: int = 0
    lu_next: float | None = None

    @property
    def plain(self) -> bool:
        """A plain IPv6 correspondent: no nonce, checksums on the real addresses."""
        return self.peer_nonce is None


class IlnpHost:
    """One ILNPv6 node: ILCC, admission policy, nonce handling and Locator Updates."""

    def __init__(
        self,
        config: HostConfig,
        *,
        policy: AdmissionPolicy | None = None,
        store: IlccStore | str = "hash",
        nonce_source: Callable[[int], bytes] = secrets.token_bytes,
    ) -> None:
        check_locator_set(config.locators)
        self.config = config
        self.policy: AdmissionPolicy = policy if policy is not None else NonePolicy()
        self.ilcc: IlccStore = create_store(store) if isinstance(store, str) else store
        self.counters: Counter[str] = Counter()
        self._nonce_source = nonce_source
        self._locators: tuple[LocatorEntry, ...] = config.locators
        self._replies: OrderedDict[int, _ReplyHint] = OrderedDict()
        self._out: list[bytes] = []
        self._events: deque[Event] = deque()
        #: NIDs changed since the last take_touched(); None until someone first asks.
        self._touched: set[int] | None = None
        #: (due, nid) of ILCC entries, a heap invalidated lazily (module docstring).
        self._timers: list[tuple[float, int]] = []
        #: (due, nid) of Locator Update retransmissions to reply-table correspondents:
        #: every due time is now + lu_interval, so appending keeps the queue in order;
        #: an item is stale unless the hint still waits with that very due time.
        self._hint_lus: deque[tuple[float, int]] = deque()

    # ------------------------------------------------------------------ outputs

    def datagrams_to_send(self) -> list[bytes]:
        """Wire packets produced since the last call."""
        out, self._out = self._out, []
        return out

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    @property
    def local_locator(self) -> int:
        """Our preferred locator: lowest preference value."""
        return min(self._locators, key=lambda e: (e.preference, e.locator)).locator

    def can_reach(self, nid: int, now: float) -> bool:
        """Whether :meth:`send` has a way to ``nid``: an ILCC entry or a live reply hint.

        An adapter asks this before resolving a peer by name, so that the answer of a
        server to a correspondent the policy did not adopt never grows the ILCC.
        """
        if self.ilcc.get(nid) is not None:
            return True
        hint = self._replies.get(nid)
        return hint is not None and hint.expires > now

    @property
    def reply_table_size(self) -> int:
        return len(self._replies)

    def take_touched(self) -> set[int]:
        """NIDs whose entry was added, changed or removed since the last call.

        For I/O adapters that mirror the ILCC elsewhere, e.g. a kernel fast path: look
        each NID up in :attr:`ilcc` (absent: removed) and copy what the entry holds.
        "Changed" covers the entry's state, its locators (the set, or one's state as
        it ages), nonces, ``carry_nonce``, ``lu_next`` and ``local_locator``; not
        ``last_used`` nor the LRU order, which move with every packet.

        Recording starts with the first call, which returns every NID then in the ILCC
        (the full sync a mirror starts with): a host nobody asks keeps no set, so a
        flood of short-lived correspondents cannot grow one without bound.
        """
        if self._touched is None:
            self._touched = set()
            return {entry.peer_nid for entry in self.ilcc}
        touched, self._touched = self._touched, set()
        return touched

    # ------------------------------------------------------------------ configuration

    def add_correspondent(
        self, nid: int, locators: Iterable[LocatorEntry], now: float
    ) -> IlccEntry:
        """Create an entry for a peer we start talking to (its L64s from DNS, RFC 6742).

        This is an explicit local decision (like ``connect``): the policy cannot refuse
        it, but a capped one still makes room (its evictions are applied), so that an
        application sending to many named peers cannot push the ILCC past its cap.
        """
        entries = tuple(locators)
        if self.ilcc.get(nid) is None:
            first = entries[0].locator if entries else 0
            decision = self.policy.admit(
                AdmissionRequest(nid, first, 0, None, None), self.ilcc, now
            )
            for evicted in decision.evict:
                self._remove(evicted, "evicted")
        entry = self._new_entry(nid, None, now)
        entry.initiated = True
        entry.replace_locators(entries, now)
        self.ilcc.add(entry)
        self._changed(entry)
        return entry

    def set_local_locators(self, locators: Iterable[LocatorEntry], now: float) -> None:
        """Our locators changed (a move, a new uplink): tell every active correspondent."""
        new = check_locator_set(locators)
        self._locators = new
        local = self.local_locator
        for entry in self.ilcc:  # changes entries, never the store: a live iteration is safe
            entry.local_locator = local
            entry.fire(EntryEvent.LOCAL_LOCATOR_CHANGE)
            if entry.state is EntryState.LU_PENDING:
                entry.carry_nonce = True
                entry.lu_advertised = new
                entry.lu_tries = 0
                self._send_advertisement(entry, now)
            self._changed(entry)
        # Correspondents answered through the reply table talk to us too (a client of a
        # non-connected server, say): they get the same update (docs/ilnp-field.md).
        for nid, hint in self._replies.items():
            if hint.expires > now and not hint.plain:
                hint.lu_advertised = new
                hint.lu_tries = 0
                self._send_hint_advertisement(nid, hint, now)

    # ------------------------------------------------------------------ timers

    def get_timer(self) -> float | None:
        """The earliest time :meth:`handle_timer` has work, or None: O(1) amortised."""
        times = []
        heap = self._timers
        while heap and not self._is_live(*heap[0]):
            heapq.heappop(heap)
        if heap:
            times.append(heap[0][0])
        policy_deadline = self.policy.next_deadline(self.ilcc)
        if policy_deadline is not None:
            times.append(policy_deadline)
        if self._replies:
            times.append(next(iter(self._replies.values())).expires)  # expiry order
        queue = self._hint_lus
        while queue and not self._hint_lu_live(*queue[0]):
            queue.popleft()
        if queue:
            times.append(queue[0][0])
        return min(times, default=None)

    def _hint_lu_live(self, when: float, nid: int) -> bool:
        """Whether ``(when, nid)`` is still the reply-table correspondent's LU due time."""
        hint = self._replies.get(nid)
        return hint is not None and hint.lu_next == when

    def handle_timer(self, now: float) -> None:
        """Fire what is due at ``now``: O(k log n) for k due entries, n in the ILCC."""
        due: dict[int, IlccEntry] = {}
        heap = self._timers
        while heap and heap[0][0] <= now:
            when, nid = heapq.heappop(heap)
            entry = self.ilcc.get(nid)
            if entry is not None and nid not in due and entry.next_deadline() == when:
                due[nid] = entry
        for entry in due.values():  # deadline order; handling one never touches another
            changed = entry.advance(now)
            if entry.state is EntryState.EXPIRED:
                self._remove(entry.peer_nid, "locators_expired")
                continue
            if entry.lu_next is not None and now >= entry.lu_next:
                changed = True
                if entry.lu_tries >= self.config.lu_max_tries:
                    entry.lu_next = None
                    entry.fire(EntryEvent.LU_GAVE_UP)
                    self.counters["lu_failed"] += 1
                    self._events.append(LocatorUpdateFailed(entry.peer_nid))
                else:
                    self.counters["lu_retransmitted"] += 1
                    self._send_advertisement(entry, now)
            if changed:
                self._changed(entry)
            else:  # not reached (a due entry always changes), but never lose a timer
                self._schedule(entry)
        for nid in self.policy.expired(self.ilcc, now):
            self._remove(nid, "policy_expired")
        replies = self._replies
        while replies and next(iter(replies.values())).expires <= now:  # expiry order
            replies.popitem(last=False)
        queue = self._hint_lus
        while queue and queue[0][0] <= now:
            when, nid = queue.popleft()
            hint = replies.get(nid)
            if hint is None or hint.lu_next != when:
                continue  # acknowledged, promoted to the ILCC, expired or replaced
            if hint.lu_tries >= self.config.lu_max_tries:
                hint.lu_next = None
                self.counters["lu_failed"] += 1
                self._events.append(LocatorUpdateFailed(nid))
            else:
                self.counters["lu_retransmitted"] += 1
                self._send_hint_advertisement(nid, hint, now)

    def _is_live(self, when: float, nid: int) -> bool:
        """Whether the heap item ``(when, nid)`` is still the entry's own deadline."""
        entry = self.ilcc.get(nid)
        return entry is not None and entry.next_deadline() == when

    def _schedule(self, entry: IlccEntry) -> None:
        """Push ``entry``'s deadline; rebuild the heap once stale items outnumber live ones.

        The old item, if any, stays in the heap and is dropped when it reaches the top
        (it no longer matches the entry's deadline). Live items are at most
        ``len(ilcc)``, so past ``2 * len(ilcc)`` items most are stale. The O(n) rebuild
        comes after at least n pushes or removals since the last one: O(1) amortised
        per change.
        """
        when = entry.next_deadline()
        if when is None:
            return
        heap = self._timers
        heapq.heappush(heap, (when, entry.peer_nid))
        if len(heap) > 2 * len(self.ilcc) + _TIMER_HEAP_SLACK:
            self._timers = [
                (t, e.peer_nid) for e in self.ilcc if (t := e.next_deadline()) is not None
            ]
            heapq.heapify(self._timers)

    # ------------------------------------------------------------------ receive

    def receive(self, data: bytes, now: float) -> None:
        """A packet from the network."""
        try:
            packet = decode_packet(data)
        except WireError:
            self._drop(DropReason.MALFORMED)
            return
        if packet.dst.nid != self.config.nid or packet.dst.locator not in {
            e.locator for e in self._locators
        }:
            self._drop(DropReason.NOT_FOR_US, packet.src.nid)
            return
        if packet.next_header == ICMPV6_NEXT_HEADER and packet.payload[:1] == bytes(
            [ICMPV6_PARAM_PROBLEM]
        ):
            self._param_problem(packet)
            return
        if packet.next_header == ICMPV6_NEXT_HEADER and packet.payload[:1] == bytes(
            [LOCATOR_UPDATE_TYPE]
        ):
            self._locator_update(packet, now)
            return
        entry = self.ilcc.get(packet.src.nid)
        if entry is not None:
            self._receive_known(entry, packet, now)
            return
        self._receive_unknown(packet, now)

    def _receive_unknown(self, packet: IlnpPacket, now: float) -> None:
        """A packet from a NID without an ILCC entry: reply table, else admission."""
        peer = packet.src.nid
        hint = self._replies.get(peer)
        if hint is not None and (
            packet.nonce == hint.peer_nonce
            or (
                packet.nonce is None
                and packet.src.locator == hint.locator
                and (hint.plain or not self.config.require_nonce)
            )
        ):
            hint.locator, hint.expires = packet.src.locator, now + self.config.reply_ttl
            self._replies.move_to_end(peer)  # keeps the table in expiry order
            interval = self.config.readmit_interval
            if interval is not None and now >= hint.retry_at:
                hint.retry_at = now + interval
                self._readmit(packet, hint, now)
            self._deliver(packet, plain=hint.plain)
            return
        if packet.nonce is None:
            # Without a nonce: a plain IPv6 node if its checksum is one over the real
            # addresses (docs/ilnp-field.md, "Plain IPv6 correspondents").
            if not _plain_checksum_ok(packet):
                self._drop(DropReason.NO_NONCE, peer)
                return
            self._admit(packet, None, now)
            return
        self._admit(packet, packet.nonce, now)

    def _receive_known(self, entry: IlccEntry, packet: IlnpPacket, now: float) -> None:
        peer = entry.peer_nid
        learned = False
        if packet.nonce is not None:
            if entry.peer_nonce is None:
                entry.peer_nonce = packet.nonce
                learned = True
            elif packet.nonce != entry.peer_nonce:
                if now - entry.last_heard >= self.config.restart_grace:
                    # Nothing valid heard for a while and a new nonce: the peer
                    # restarted (docs/ilnp-field.md). A fresh session, admitted anew.
                    self._remove(peer, "peer_restarted")
                    self._receive_unknown(packet, now)
                    return
                self._drop(DropReason.NONCE_MISMATCH, peer)
                return
        elif entry.state is not EntryState.NON_ILNP and (
            entry.peer_nonce is None or self.config.require_nonce
        ):
            self._drop(DropReason.NO_NONCE, peer)
            return
        if self._advance(entry, now) or learned:
            self._changed(entry)
        source = entry.find_locator(packet.src.locator)
        if source is None or source.next_deadline() is None:  # unknown or expired
            self._drop(DropReason.UNKNOWN_LOCATOR, peer)
            return
        if entry.carry_nonce and entry.state is not EntryState.LU_PENDING:
            entry.carry_nonce = False  # the peer answered: it knows our nonce
            self._changed(entry)
        self._use(entry, now)
        entry.last_heard = now
        if entry.heard < 2:
            entry.heard += 1
            if entry.heard == 2 and not entry.initiated:  # now ready for the fast path
                self._changed(entry)
        self._deliver(packet, plain=packet.nonce is None and entry.state is EntryState.NON_ILNP)

    @staticmethod
    def _request(packet: IlnpPacket) -> AdmissionRequest:
        local_port = remote_port = None
        if packet.next_header in _PORT_PROTOCOLS and len(packet.payload) >= _PORTS.size:
            remote_port, local_port = _PORTS.unpack_from(packet.payload)
        return AdmissionRequest(
            packet.src.nid, packet.src.locator, packet.next_header, local_port, remote_port
        )

    def _readmit(self, packet: IlnpPacket, hint: _ReplyHint, now: float) -> None:
        """Promote a reply-table correspondent once the policy accepts it.

        The entry keeps the nonces both sides already use, so the peer sees no change.
        """
        decision = self.policy.admit(self._request(packet), self.ilcc, now)
        if not decision.admit:
            return
        for nid in decision.evict:
            self._remove(nid, "evicted")
        peer = packet.src.nid
        del self._replies[peer]
        entry = self._new_entry(peer, hint.peer_nonce, now)
        entry.local_nonce = hint.local_nonce
        if hint.plain:
            entry.state, entry.carry_nonce, entry.last_heard = EntryState.NON_ILNP, False, now
        entry.replace_locators(
            (LocatorEntry(packet.src.locator, 0, self.config.learned_lifetime),), now
        )
        if hint.lu_next is not None:  # our update to it goes on from the entry
            entry.fire(EntryEvent.LOCAL_LOCATOR_CHANGE)
            entry.lu_advertised = hint.lu_advertised
            entry.lu_tries = hint.lu_tries
            entry.lu_next = hint.lu_next
        self.ilcc.add(entry)
        self._changed(entry)
        self.counters["adopted"] += 1
        self.counters["adopted_late"] += 1
        self._events.append(Adopted(peer, decision.reason))

    def _admit(self, packet: IlnpPacket, nonce: Nonce | None, now: float) -> None:
        """A newcomer (``nonce`` None: a plain IPv6 node) through the admission policy."""
        peer = packet.src.nid
        decision = self.policy.admit(self._request(packet), self.ilcc, now)
        if decision.admit:
            for nid in decision.evict:
                self._remove(nid, "evicted")
            entry = self._new_entry(peer, nonce, now)
            if nonce is None:
                entry.state, entry.carry_nonce, entry.last_heard = EntryState.NON_ILNP, False, now
                self.counters["plain_ipv6_peers"] += 1
            entry.replace_locators(
                (LocatorEntry(packet.src.locator, 0, self.config.learned_lifetime),), now
            )
            self.ilcc.add(entry)
            self._changed(entry)
            self.counters["adopted"] += 1
            self._events.append(Adopted(peer, decision.reason))
        else:
            self.counters["not_adopted"] += 1
            self.counters[f"not_adopted_{decision.reason}"] += 1
            self._replies.pop(peer, None)
            self._replies[peer] = _ReplyHint(
                packet.src.locator,
                nonce,
                self._make_nonce(peer),
                now + self.config.reply_ttl,
                now + (self.config.readmit_interval or 0.0),
            )
            while len(self._replies) > self.config.reply_capacity:
                self._replies.popitem(last=False)
        self._deliver(packet, plain=nonce is None)

    def _deliver(self, packet: IlnpPacket, *, plain: bool = False) -> None:
        """To the application on identifier addresses; ``plain``: the checksum was made
        over the real addresses (a plain IPv6 peer) and is moved to the identifier ones."""
        prefix = self.config.identifier_prefix
        src, dst = ILV(prefix, packet.src.nid), ILV(prefix, packet.dst.nid)
        payload = packet.payload
        if plain:
            payload = relocate_checksum(
                packet.next_header,
                payload,
                old_src=packet.src.packed,
                old_dst=packet.dst.packed,
                new_src=src.packed,
                new_dst=dst.packed,
            )
        inner = IlnpPacket(
            src,
            dst,
            packet.next_header,
            payload,
            None,
            packet.hop_limit,
            packet.traffic_class,
            packet.flow_label,
        )
        self.counters["delivered"] += 1
        self._events.append(Deliver(encode_packet(inner), packet.src.nid))

    # ------------------------------------------------------------------ send

    def send(self, data: bytes, now: float) -> None:
        """A packet from an application, on identifier addresses."""
        try:
            packet = decode_packet(data)
        except WireError:
            self._drop(DropReason.MALFORMED)
            return
        prefix = self.config.identifier_prefix
        if (
            packet.src.locator != prefix
            or packet.dst.locator != prefix
            or packet.src.nid != self.config.nid
        ):
            self._drop(DropReason.NOT_IDENTIFIER, packet.dst.nid)
            return
        peer = packet.dst.nid
        entry = self.ilcc.get(peer)
        if entry is None:
            self._send_by_hint(packet, now)
            return
        if self._advance(entry, now):
            self._changed(entry)
        best = entry.best_locator()
        if best is None:
            self._drop(DropReason.NO_ROUTE, peer)
            return
        self._use(entry, now)
        src = ILV(entry.local_locator, self.config.nid)
        dst = ILV(best.locator, peer)
        payload = packet.payload
        nonce: Nonce | None = None
        if entry.state is EntryState.NON_ILNP:
            payload = relocate_checksum(
                packet.next_header,
                payload,
                old_src=packet.src.packed,
                old_dst=packet.dst.packed,
                new_src=src.packed,
                new_dst=dst.packed,
            )
        elif (
            self.config.always_carry_nonce
            or entry.carry_nonce
            or entry.state is EntryState.LU_PENDING
        ):
            nonce = entry.local_nonce
        self._transmit(
            IlnpPacket(
                src,
                dst,
                packet.next_header,
                payload,
                nonce,
                packet.hop_limit,
                packet.traffic_class,
                packet.flow_label,
            )
        )

    def _send_by_hint(self, packet: IlnpPacket, now: float) -> None:
        hint = self._replies.get(packet.dst.nid)
        if hint is None or hint.expires <= now:
            self._drop(DropReason.NO_ROUTE, packet.dst.nid)
            return
        # A peer we did not adopt gets our nonce on every reply: it may be adopting us;
        # a plain IPv6 one gets none, and the checksum over its real addresses.
        src = ILV(self.local_locator, self.config.nid)
        dst = ILV(hint.locator, packet.dst.nid)
        payload = packet.payload
        if hint.plain:
            payload = relocate_checksum(
                packet.next_header,
                payload,
                old_src=packet.src.packed,
                old_dst=packet.dst.packed,
                new_src=src.packed,
                new_dst=dst.packed,
            )
        self._transmit(
            IlnpPacket(
                src,
                dst,
                packet.next_header,
                payload,
                None if hint.plain else hint.local_nonce,
                packet.hop_limit,
                packet.traffic_class,
                packet.flow_label,
            )
        )

    def _transmit(self, packet: IlnpPacket) -> None:
        self.counters["transmitted"] += 1
        self._out.append(encode_packet(packet))

    # ------------------------------------------------------------------ Locator Update

    def _send_lu(self, entry: IlccEntry, update: LocatorUpdate, to: PeerLocator) -> None:
        src = ILV(entry.local_locator, self.config.nid)
        dst = ILV(to.locator, entry.peer_nid)
        body = encode_locator_update(update, src.packed, dst.packed)
        self._transmit(
            IlnpPacket(src, dst, ICMPV6_NEXT_HEADER, body, entry.local_nonce, self.config.hop_limit)
        )

    def _send_advertisement(self, entry: IlccEntry, now: float) -> None:
        """Send (again) our advertisement; sets ``lu_next``: the caller reports the change."""
        best = entry.best_locator()
        if best is None:
            entry.lu_next = None
            return
        entry.lu_tries += 1
        entry.lu_next = now + self.config.lu_interval
        self.counters["lu_sent"] += 1
        self._send_lu(entry, LocatorUpdate(LuOperation.ADVERTISEMENT, entry.lu_advertised), best)

    def _send_hint_advertisement(self, nid: int, hint: _ReplyHint, now: float) -> None:
        """Our advertisement to a reply-table correspondent, retransmitted like an entry's."""
        hint.lu_tries += 1
        hint.lu_next = now + self.config.lu_interval
        self._hint_lus.append((hint.lu_next, nid))
        self.counters["lu_sent"] += 1
        src = ILV(self.local_locator, self.config.nid)
        dst = ILV(hint.locator, nid)
        update = LocatorUpdate(LuOperation.ADVERTISEMENT, hint.lu_advertised)
        body = encode_locator_update(update, src.packed, dst.packed)
        self._transmit(
            IlnpPacket(src, dst, ICMPV6_NEXT_HEADER, body, hint.local_nonce, self.config.hop_limit)
        )

    def _hint_locator_update(self, packet: IlnpPacket, hint: _ReplyHint, now: float) -> None:
        """An LU from a reply-table correspondent: our ack, or its own move."""
        peer = packet.src.nid
        if packet.nonce is None or packet.nonce != hint.peer_nonce:
            self._drop(DropReason.LU_BAD_NONCE, peer)
            return
        try:
            update = decode_locator_update(packet.payload, packet.src.packed, packet.dst.packed)
        except ChecksumError:
            self._drop(DropReason.LU_BAD_CHECKSUM, peer)
            return
        except WireError:
            self._drop(DropReason.MALFORMED, peer)
            return
        if update.operation is LuOperation.ACKNOWLEDGEMENT:
            if hint.lu_next is None or update.locators != hint.lu_advertised:
                self._drop(DropReason.LU_UNEXPECTED_ACK, peer)
                return
            hint.lu_next = None
            self.counters["lu_acked"] += 1
            self._events.append(LocatorUpdateAcked(peer))
            return
        if not update.locators:
            self._drop(DropReason.MALFORMED, peer)
            return
        # The table keeps one locator per correspondent: its preferred one.
        best = min(update.locators, key=lambda e: (e.preference, e.locator))
        hint.locator, hint.expires = best.locator, now + self.config.reply_ttl
        self._replies.move_to_end(peer)  # keeps the table in expiry order
        self.counters["lu_received"] += 1
        self._events.append(PeerLocatorsChanged(peer, update.locators))
        src = ILV(self.local_locator, self.config.nid)
        dst = ILV(best.locator, peer)
        ack = LocatorUpdate(LuOperation.ACKNOWLEDGEMENT, update.locators)
        body = encode_locator_update(ack, src.packed, dst.packed)
        self._transmit(
            IlnpPacket(src, dst, ICMPV6_NEXT_HEADER, body, hint.local_nonce, self.config.hop_limit)
        )

    def _locator_update(self, packet: IlnpPacket, now: float) -> None:
        peer = packet.src.nid
        entry = self.ilcc.get(peer)
        if entry is None:
            hint = self._replies.get(peer)
            if hint is not None and hint.expires > now:
                self._hint_locator_update(packet, hint, now)
                return
            self._drop(DropReason.LU_UNKNOWN_PEER, peer)
            return
        # The nonce alone authenticates an LU: it comes from a locator not yet known.
        # A peer whose nonce we never saw (added by name, silent since) is learned from
        # its LU, as from its first data packet, if it comes from a locator of its set
        # (docs/ilnp-field.md, "Locator Update from a peer not heard yet").
        learn = (
            entry.peer_nonce is None
            and packet.nonce is not None
            and (source := entry.find_locator(packet.src.locator)) is not None
            and source.next_deadline() is not None
        )
        if packet.nonce is None or (packet.nonce != entry.peer_nonce and not learn):
            self._drop(DropReason.LU_BAD_NONCE, peer)
            return
        try:
            update = decode_locator_update(packet.payload, packet.src.packed, packet.dst.packed)
        except ChecksumError:
            self._drop(DropReason.LU_BAD_CHECKSUM, peer)
            return
        except WireError:
            self._drop(DropReason.MALFORMED, peer)
            return
        if update.operation is LuOperation.ACKNOWLEDGEMENT:
            if entry.state is not EntryState.LU_PENDING or update.locators != entry.lu_advertised:
                self._drop(DropReason.LU_UNEXPECTED_ACK, peer)
                return
            if learn:
                entry.peer_nonce = packet.nonce
            entry.fire(EntryEvent.LU_ACKED)
            entry.lu_next = None
            entry.last_heard = now
            self._changed(entry)
            self.counters["lu_acked"] += 1
            self._events.append(LocatorUpdateAcked(peer))
            return
        if not update.locators:
            self._drop(DropReason.MALFORMED, peer)
            return
        if learn:
            entry.peer_nonce = packet.nonce
        entry.replace_locators(update.locators, now)
        entry.fire(EntryEvent.PEER_UPDATE)
        self._changed(entry)
        self._use(entry, now)
        entry.last_heard = now
        self.counters["lu_received"] += 1
        self._events.append(PeerLocatorsChanged(peer, update.locators))
        best = entry.best_locator()
        if best is not None:
            self._send_lu(entry, LocatorUpdate(LuOperation.ACKNOWLEDGEMENT, update.locators), best)

    # ------------------------------------------------------------------ ICMPv6 errors

    def _param_problem(self, packet: IlnpPacket) -> None:
        """RFC 4443 §3.4 code 2 pointing at our nonce option: the peer is not ILNP."""
        body = packet.payload
        if len(body) < 8 or body[1] != PARAM_PROBLEM_UNRECOGNIZED_OPTION:
            self._drop(DropReason.MALFORMED, packet.src.nid)
            return
        (pointer,) = struct.unpack_from("!I", body, 4)
        invoking = body[8:]
        if len(invoking) < 40 or pointer >= len(invoking) or invoking[pointer] != ILNP_NONCE_OPTION:
            self._drop(DropReason.MALFORMED, packet.src.nid)
            return
        peer = ILV.from_address(invoking[24:40]).nid
        entry = self.ilcc.get(peer)
        if entry is None or entry.state is EntryState.NON_ILNP:
            self.counters["param_problem_ignored"] += 1
            return
        # The quoted packet must hold the nonce we sent this peer: an off-path forger
        # cannot downgrade the session to plain IPv6 (RFC 4443 §2.4 quotes the invoker).
        try:
            quoted = decode_destination_options(invoking[40:])[0].nonce
        except WireError:
            quoted = None
        if quoted != entry.local_nonce:
            self._drop(DropReason.NONCE_MISMATCH, peer)
            return
        entry.fire(EntryEvent.PARAM_PROBLEM)
        entry.lu_next = None
        self._changed(entry)
        self.counters["peer_not_ilnp"] += 1
        self._events.append(PeerNotIlnp(peer))

    # ------------------------------------------------------------------ helpers

    def _make_nonce(self, peer_nid: int) -> Nonce:
        key = self.config.nonce_key
        if key is not None:
            digest = hmac.digest(key, peer_nid.to_bytes(8, "big"), "sha256")
            return Nonce(digest[: self.config.nonce_size])
        return Nonce(self._nonce_source(self.config.nonce_size))

    def _new_entry(self, nid: int, peer_nonce: Nonce | None, now: float) -> IlccEntry:
        return IlccEntry(
            peer_nid=nid,
            local_nid=self.config.nid,
            local_locator=self.local_locator,
            local_nonce=self._make_nonce(nid),
            peer_nonce=peer_nonce,
            created=now,
            last_used=now,
            last_heard=now if peer_nonce is not None else 0.0,
            heard=1 if peer_nonce is not None else 0,
        )

    def mark_used(self, nid: int, now: float, *, heard: bool = False) -> None:
        """``nid``'s traffic went through a path outside the host (the kernel fast path).

        Keeps its entry's LRU place and idle timer as a packet through here would;
        ``heard``: a packet *from* the peer passed the kernel's nonce check, which
        also keeps its session safe from a restart guess (``restart_grace``).
        """
        entry = self.ilcc.get(nid)
        if entry is not None:
            self._use(entry, now)
            if heard:
                entry.last_heard = now

    def _advance(self, entry: IlccEntry, now: float) -> bool:
        """Age ``entry`` on a send or receive; True if it changed and is still in the ILCC.

        Once all its locators expired the entry is removed at once, as
        :meth:`handle_timer` would: an EXPIRED entry left in the ILCC would meet events
        its state table has no row for (a Locator Update, a Parameter Problem, a move).
        """
        if not entry.advance(now):
            return False
        if entry.state is EntryState.EXPIRED:
            self._remove(entry.peer_nid, "locators_expired")
            return False
        return True

    def _use(self, entry: IlccEntry, now: float) -> None:
        entry.last_used = now
        self.ilcc.touch(entry.peer_nid)

    def _changed(self, entry: IlccEntry | int) -> None:
        """The hook every change to the ILCC goes through: ``entry`` or a removed NID.

        Called after an entry is added (or replaced), after its state, locators, nonces,
        ``carry_nonce``, ``lu_next`` or ``local_locator`` changed, and with the bare
        NID after it was removed. Records the NID for :meth:`take_touched` and
        reschedules the entry's timer (a removed entry's old item goes stale).
        """
        if isinstance(entry, int):
            nid = entry
        else:
            nid = entry.peer_nid
            self._schedule(entry)
        if self._touched is not None:
            self._touched.add(nid)

    def _remove(self, nid: int, why: str) -> None:
        entry = self.ilcc.remove(nid)
        if entry is not None:
            self._changed(nid)
            if entry.state is not EntryState.EXPIRED:
                entry.fire(EntryEvent.EVICTED)
            self.counters[f"removed_{why}"] += 1
            self._events.append(Removed(nid, why))

    def _drop(self, reason: DropReason, peer_nid: int | None = None) -> None:
        self.counters[reason.value] += 1
        self._events.append(Dropped(reason, peer_nid))


def _plain_checksum_ok(packet: IlnpPacket) -> bool:
    """Whether ``packet``'s transport checksum is right over its real addresses (what a
    plain IPv6 sender computes; an ILNP sender's covers the NIDs only, RFC 6740 §6.3).
    A protocol without a checksum we know passes."""
    if upper_layer_checksum_offset(packet.next_header) is None:
        return True
    return (
        ipv6_checksum(packet.src.packed, packet.dst.packed, packet.next_header, packet.payload) == 0
    )
