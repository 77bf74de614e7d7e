"""The Identifier-Locator Communication Cache (RFC 6741 §3): entries, states, stores.

Theory of operation
-------------------
One :class:`IlccEntry` per correspondent NID holds the correspondent's locator set
(each with preference, lifetime and a state), the local locator in use, the nonce each
side chose, and the timers of the Locator Update exchange.

Two state machines, both written as tables (docs/architecture.md, "State machines") —
a pair missing from a table is a bug and raises :class:`InvalidTransitionError`:

* a peer locator is ``VALID`` until its lifetime elapses, then ``AGED`` (still accepted
  on receive, used for sending only when nothing is valid) for
  :data:`LOCATOR_AGED_GRACE` seconds, then ``EXPIRED`` (refused). A fresh advertisement
  makes it ``VALID`` again.
* an entry is ``ACTIVE``; ``LU_PENDING`` while our Locator Update awaits its ack;
  ``NON_ILNP`` once the peer answered our nonce with Parameter Problem; ``EXPIRED`` when
  it is to be removed.

Stores keep entries by NID behind one interface (:class:`IlccStore`) and in
least-recently-used order: ``hash`` (a dict, O(1)) is the default, ``linear`` (a list
scanned on every lookup) exists only to reproduce the St Andrews prototype that the ILNP
paper measured (docs/papers.md). Stores are entered by name in :data:`STORES`, the one
list of them (``--store`` offers its names); :func:`create_store` builds one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from sixlab.ilnp._errors import InvalidTransitionError, UnknownBackendError
from sixlab.registry import Registry
from sixlab.wire.ilnp import LocatorEntry, Nonce

__all__ = [
    "ENTRY_TRANSITIONS",
    "LOCATOR_AGED_GRACE",
    "LOCATOR_TRANSITIONS",
    "STORES",
    "EntryEvent",
    "EntryState",
    "HashStore",
    "IlccEntry",
    "IlccStore",
    "LinearStore",
    "LocatorEvent",
    "LocatorState",
    "PeerLocator",
    "create_store",
    "register_store",
    "store_names",
]

#: How long a locator whose lifetime ran out is still accepted on receive. Neither
#: RFC 6741 nor the kernels fix it; 10 s follows the FreeBSD prototype's prune period.
LOCATOR_AGED_GRACE = 10.0


class LocatorState(Enum):
    VALID = "valid"
    AGED = "aged"
    EXPIRED = "expired"


class LocatorEvent(Enum):
    LIFETIME_ELAPSED = "lifetime_elapsed"
    GRACE_ELAPSED = "grace_elapsed"
    REFRESHED = "refreshed"


LOCATOR_TRANSITIONS: dict[tuple[LocatorState, LocatorEvent], LocatorState] = {
    (LocatorState.VALID, LocatorEvent.LIFETIME_ELAPSED): LocatorState.AGED,
    (LocatorState.VALID, LocatorEvent.REFRESHED): LocatorState.VALID,
    (LocatorState.AGED, LocatorEvent.GRACE_ELAPSED): LocatorState.EXPIRED,
    (LocatorState.AGED, LocatorEvent.REFRESHED): LocatorState.VALID,
    (LocatorState.EXPIRED, LocatorEvent.REFRESHED): LocatorState.VALID,
}


class EntryState(Enum):
    ACTIVE = "active"
    LU_PENDING = "lu_pending"
    NON_ILNP = "non_ilnp"
    EXPIRED = "expired"


class EntryEvent(Enum):
    LOCAL_LOCATOR_CHANGE = "local_locator_change"
    LU_ACKED = "lu_acked"
    LU_GAVE_UP = "lu_gave_up"
    PEER_UPDATE = "peer_update"
    PARAM_PROBLEM = "param_problem"
    ALL_LOCATORS_EXPIRED = "all_locators_expired"
    EVICTED = "evicted"


_A, _P, _N, _X = (
    EntryState.ACTIVE,
    EntryState.LU_PENDING,
    EntryState.NON_ILNP,
    EntryState.EXPIRED,
)
ENTRY_TRANSITIONS: dict[tuple[EntryState, EntryEvent], EntryState] = {
    (_A, EntryEvent.LOCAL_LOCATOR_CHANGE): _P,
    (_A, EntryEvent.PEER_UPDATE): _A,
    (_A, EntryEvent.PARAM_PROBLEM): _N,
    (_A, EntryEvent.ALL_LOCATORS_EXPIRED): _X,
    (_A, EntryEvent.EVICTED): _X,
    (_P, EntryEvent.LOCAL_LOCATOR_CHANGE): _P,  # restart the exchange with the new set
    (_P, EntryEvent.LU_ACKED): _A,
    (_P, EntryEvent.LU_GAVE_UP): _A,  # keep talking; the peer may still hear the old one
    (_P, EntryEvent.PEER_UPDATE): _P,
    (_P, EntryEvent.PARAM_PROBLEM): _N,
    (_P, EntryEvent.ALL_LOCATORS_EXPIRED): _X,
    (_P, EntryEvent.EVICTED): _X,
    (_N, EntryEvent.LOCAL_LOCATOR_CHANGE): _N,  # plain IPv6: nothing to advertise
    (_N, EntryEvent.PEER_UPDATE): _A,  # a valid LU proves the peer speaks ILNP after all
    (_N, EntryEvent.ALL_LOCATORS_EXPIRED): _X,
    (_N, EntryEvent.EVICTED): _X,
}


@dataclass(slots=True)
class PeerLocator:
    """One locator of a correspondent, with its own lifetime timer."""

    locator: int
    preference: int
    lifetime: int
    state: LocatorState
    valid_until: float

    @classmethod
    def fresh(cls, entry: LocatorEntry, now: float) -> PeerLocator:
        return cls(entry.locator, entry.preference, entry.lifetime, LocatorState.VALID, 0.0)._arm(
            now
        )

    def _arm(self, now: float) -> PeerLocator:
        self.valid_until = now + self.lifetime
        return self

    def fire(self, event: LocatorEvent) -> None:
        try:
            self.state = LOCATOR_TRANSITIONS[self.state, event]
        except KeyError:
            raise InvalidTransitionError(f"locator {self.state.value} on {event.value}") from None

    def next_deadline(self) -> float | None:
        if self.state is LocatorState.VALID:
            return self.valid_until
        if self.state is LocatorState.AGED:
            return self.valid_until + LOCATOR_AGED_GRACE
        return None

    def advance(self, now: float) -> bool:
        """Fire the timer events whose deadline has passed; True if the state changed."""
        before = self.state
        if self.state is LocatorState.VALID and now >= self.valid_until:
            self.fire(LocatorEvent.LIFETIME_ELAPSED)
        if self.state is LocatorState.AGED and now >= self.valid_until + LOCATOR_AGED_GRACE:
            self.fire(LocatorEvent.GRACE_ELAPSED)
        return self.state is not before


@dataclass(slots=True)
class IlccEntry:
    """Everything a host keeps about one correspondent (RFC 6741 §3)."""

    peer_nid: int
    local_nid: int
    local_locator: int
    local_nonce: Nonce
    peer_nonce: Nonce | None = None
    locators: list[PeerLocator] = field(default_factory=list)
    state: EntryState = EntryState.ACTIVE
    created: float = 0.0
    last_used: float = 0.0
    #: When a packet from the peer last passed the nonce and locator checks (in the
    #: host or, as reported, in the kernel fast path): a peer heard from recently keeps
    #: its session against a packet with another nonce (docs/ilnp-field.md, restart).
    last_heard: float = 0.0
    #: Packets heard from the peer in user space, counted up to 2: the kernel fast path
    #: takes a correspondent from its second packet on (``sixlab.ilnp.fastpath``), so a
    #: crowd of one-packet senders costs no map write each.
    heard: int = 0
    #: We started the session (a name resolved, ``add-peer``): no packet to wait for.
    initiated: bool = False
    #: Carry our nonce until the peer has answered (the first packets of a session) and
    #: again after a locator change (RFC 6740, RFC 6744; docs/protocols.md).
    carry_nonce: bool = True
    lu_tries: int = 0
    lu_next: float | None = None
    lu_advertised: tuple[LocatorEntry, ...] = ()

    def fire(self, event: EntryEvent) -> None:
        try:
            self.state = ENTRY_TRANSITIONS[self.state, event]
        except KeyError:
            raise InvalidTransitionError(f"entry {self.state.value} on {event.value}") from None

    def replace_locators(self, entries: tuple[LocatorEntry, ...], now: float) -> None:
        """An advertisement replaces the whole set (RFC 6743 §3)."""
        self.locators = [PeerLocator.fresh(e, now) for e in entries]

    def find_locator(self, locator: int) -> PeerLocator | None:
        for peer in self.locators:
            if peer.locator == locator:
                return peer
        return None

    def best_locator(self) -> PeerLocator | None:
        """Lowest preference among VALID locators, else among AGED ones (RFC 6742 §2)."""
        for wanted in (LocatorState.VALID, LocatorState.AGED):
            usable = [p for p in self.locators if p.state is wanted]
            if usable:
                return min(usable, key=lambda p: (p.preference, p.locator))
        return None

    def advance(self, now: float) -> bool:
        """Age the locators to ``now``; True if any locator or the entry changed state.

        The host uses the answer to tell its timer index and :meth:`IlnpHost.take_touched`
        consumers about the change without comparing whole entries on every packet.
        """
        changed = False
        for peer in self.locators:
            changed = peer.advance(now) or changed
        if (
            self.locators
            and self.state is not EntryState.EXPIRED
            and all(p.state is LocatorState.EXPIRED for p in self.locators)
        ):
            self.fire(EntryEvent.ALL_LOCATORS_EXPIRED)
            changed = True
        return changed

    def next_deadline(self) -> float | None:
        times = [t for p in self.locators if (t := p.next_deadline()) is not None]
        if self.lu_next is not None:
            times.append(self.lu_next)
        return min(times, default=None)


class IlccStore(Protocol):
    """Entries by correspondent NID, kept in least-recently-used order.

    Iteration yields the entries oldest first. It may be a live view (``hash``: no copy,
    so that a policy stopping at the first entry still in use pays for what it looks
    at, not for the whole ILCC): do not add, remove or touch entries while iterating,
    iterate over ``list(store)`` to do that.
    """

    name: str

    def get(self, nid: int) -> IlccEntry | None: ...
    def add(self, entry: IlccEntry) -> None: ...
    def remove(self, nid: int) -> IlccEntry | None: ...
    def touch(self, nid: int) -> None: ...
    def oldest(self) -> IlccEntry | None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[IlccEntry]: ...


class HashStore:
    """A dict: O(1) lookups; re-inserting on ``touch`` keeps the LRU order."""

    name = "hash"

    def __init__(self) -> None:
        self._entries: dict[int, IlccEntry] = {}

    def get(self, nid: int) -> IlccEntry | None:
        return self._entries.get(nid)

    def add(self, entry: IlccEntry) -> None:
        self._entries.pop(entry.peer_nid, None)
        self._entries[entry.peer_nid] = entry

    def remove(self, nid: int) -> IlccEntry | None:
        return self._entries.pop(nid, None)

    def touch(self, nid: int) -> None:
        entry = self._entries.pop(nid, None)
        if entry is not None:
            self._entries[nid] = entry

    def oldest(self) -> IlccEntry | None:
        return next(iter(self._entries.values()), None)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[IlccEntry]:
        # A live view: adding or removing while iterating raises RuntimeError (dict).
        return iter(self._entries.values())


class LinearStore:
    """A list scanned from the start on every lookup, like the St Andrews Linux code.

    Per-packet cost grows with the number of correspondents: that is what the ILNP
    paper measured. Use it only to reproduce that result.
    """

    name = "linear"

    def __init__(self) -> None:
        self._entries: list[IlccEntry] = []

    def _index(self, nid: int) -> int | None:
        for i, entry in enumerate(self._entries):
            if entry.peer_nid == nid:
                return i
        return None

    def get(self, nid: int) -> IlccEntry | None:
        i = self._index(nid)
        return None if i is None else self._entries[i]

    def add(self, entry: IlccEntry) -> None:
        self.remove(entry.peer_nid)
        self._entries.append(entry)

    def remove(self, nid: int) -> IlccEntry | None:
        i = self._index(nid)
        return None if i is None else self._entries.pop(i)

    def touch(self, nid: int) -> None:
        i = self._index(nid)
        if i is not None:
            self._entries.append(self._entries.pop(i))

    def oldest(self) -> IlccEntry | None:
        return self._entries[0] if self._entries else None

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[IlccEntry]:
        # A copy: a list iterator would silently skip entries if the list changed.
        return iter(list(self._entries))


#: Every ILCC store by name (``--store``): the one place a store is added.
STORES: Registry[Callable[[], IlccStore]] = Registry("ILCC store", UnknownBackendError)
STORES.add("hash", HashStore)
STORES.add("linear", LinearStore)


def register_store(name: str, factory: Callable[[], IlccStore]) -> None:
    """Make a store available to :func:`create_store` under ``name``."""
    STORES.add(name, factory)


def create_store(name: str) -> IlccStore:
    return STORES.get(name)()


def store_names() -> list[str]:
    return STORES.names()
