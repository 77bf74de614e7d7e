"""IlnpHost timers against the ILCC walk they replaced, and take_touched() against diffs.

A host with the timer index and a reference host whose ``get_timer``/``handle_timer``
walk every entry (the code before the index) are driven through the same random
operations; after every step both must agree on the next timer, the ILCC (entries, LRU
order, every field), the reply table, counters, events and packets. The NIDs whose
entry changed in a step must all be reported by ``take_touched``.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.ilnp import EntryState, HostConfig, IlnpHost, LocatorUpdateFailed, create_policy
from sixlab.ilnp.ilcc import EntryEvent, IlccEntry
from sixlab.wire.ilnp import (
    ILV,
    IlnpPacket,
    LocatorEntry,
    LocatorUpdate,
    LuOperation,
    Nonce,
    encode_locator_update,
    encode_packet,
)

HOST = 0xB
OUR_LOCATORS = (0x2001_0DB8_000B_0001, 0x2001_0DB8_000B_0002)
PEERS = (0x10, 0x11, 0x12)  # few: operations meet the same entries often
PEER_LOCATORS = (0x2001_0DB8_0010_0001, 0x2001_0DB8_0010_0002, 0x2001_0DB8_0010_0003)
LIFETIMES = (0, 1, 3, 20, 600)


def _brute_due(entry: IlccEntry) -> float | None:
    """An entry's next timer, from its fields alone (no host code)."""
    times = [p.next_deadline() for p in entry.locators]
    times.append(entry.lu_next)
    return min((t for t in times if t is not None), default=None)


class WalkingHost(IlnpHost):
    """The reference: timers found and fired by walking the whole ILCC and reply table."""

    def get_timer(self) -> float | None:
        times = [t for e in list(self.ilcc) if (t := _brute_due(e)) is not None]
        policy_deadline = self.policy.next_deadline(self.ilcc)
        if policy_deadline is not None:
            times.append(policy_deadline)
        times.extend(h.expires for h in self._replies.values())
        times.extend(h.lu_next for h in self._replies.values() if h.lu_next is not None)
        return min(times, default=None)

    def handle_timer(self, now: float) -> None:
        for entry in list(self.ilcc):
            entry.advance(now)
            if entry.state is EntryState.EXPIRED:
                self._remove(entry.peer_nid, "locators_expired")
                continue
            if entry.lu_next is not None and now >= entry.lu_next:
                if entry.lu_tries >= self.config.lu_max_tries:
                    entry.lu_next = None
                    entry.fire(EntryEvent.LU_GAVE_UP)
                    self.counters["lu_failed"] += 1
                    self._events.append(LocatorUpdateFailed(entry.peer_nid))
                else:
                    self.counters["lu_retransmitted"] += 1
                    self._send_advertisement(entry, now)
        for nid in self.policy.expired(self.ilcc, now):
            self._remove(nid, "policy_expired")
        for nid in [n for n, h in self._replies.items() if h.expires <= now]:
            del self._replies[nid]
        for nid, hint in list(self._replies.items()):
            if hint.lu_next is not None and now >= hint.lu_next:
                if hint.lu_tries >= self.config.lu_max_tries:
                    hint.lu_next = None
                    self.counters["lu_failed"] += 1
                    self._events.append(LocatorUpdateFailed(nid))
                else:
                    self.counters["lu_retransmitted"] += 1
                    self._send_hint_advertisement(nid, hint, now)


class FakeSockets:
    def __init__(self) -> None:
        self.connected: set[int] = set()

    def has_connected(
        self, protocol: int, local_port: int, remote_nid: int, remote_port: int
    ) -> bool:
        return remote_nid in self.connected

    def is_listening(self, protocol: int, local_port: int) -> bool:
        return True


def _entry_fields(entry: IlccEntry) -> tuple[object, ...]:
    """Everything a mirror of the entry would hold (``last_used`` is compared apart)."""
    return (
        entry.state,
        entry.local_locator,
        entry.local_nonce,
        entry.peer_nonce,
        tuple(
            (p.locator, p.preference, p.lifetime, p.state, p.valid_until) for p in entry.locators
        ),
        entry.carry_nonce,
        entry.lu_tries,
        entry.lu_next,
        entry.lu_advertised,
    )


def _ilcc(host: IlnpHost) -> dict[int, tuple[object, ...]]:
    return {e.peer_nid: _entry_fields(e) for e in host.ilcc}


def _observe(host: IlnpHost) -> list[object]:
    events = []
    while (event := host.next_event()) is not None:
        events.append(repr(event))
    return [
        host.get_timer(),
        [(e.peer_nid, e.last_used, *_entry_fields(e)) for e in host.ilcc],  # LRU order too
        list(host._replies.items()),
        sorted(host.counters.items()),
        sorted(events),  # within one handle_timer the order of entries may differ
        sorted(host.datagrams_to_send()),
    ]


def _check_sources(host: IlnpHost) -> None:
    """Each timer source's own earliest deadline, which get_timer's minimum can hide."""
    host.get_timer()  # drops the stale items at the top of the heap
    entries = [t for e in host.ilcc if (t := _brute_due(e)) is not None]
    assert (host._timers[0][0] if host._timers else None) == min(entries, default=None)
    replies = [h.expires for h in host._replies.values()]
    assert replies == sorted(replies)  # expiry order: the first expires first


def _udp(peer: int, data: bytes = b"x") -> bytes:
    return struct.pack("!HHHH", 5000, 7, 8 + len(data), 0) + data


def _peer_nonce(peer: int) -> Nonce:
    return Nonce(peer.to_bytes(4, "big"))


class Driver:
    """Turns one operation into the packets and calls both hosts get, reading ``host``."""

    def __init__(self, host: IlnpHost, sockets: FakeSockets) -> None:
        self.host = host
        self.sockets = sockets
        self.now = 0.0

    def _to_us(self, src: ILV, next_header: int, payload: bytes, nonce: Nonce | None) -> bytes:
        dst = ILV(self.host.local_locator, HOST)
        return encode_packet(IlnpPacket(src, dst, next_header, payload, nonce))

    def step(self, op: tuple[Any, ...]) -> Callable[[IlnpHost], object]:
        kind = op[0]
        now = self.now
        if kind == "data":  # a peer's data packet: adoption, nonce learning, locator check
            _, peer, loc, with_nonce = op
            nonce = _peer_nonce(peer) if with_nonce else None
            wire = self._to_us(ILV(PEER_LOCATORS[loc], peer), 17, _udp(peer), nonce)
            return lambda h: h.receive(wire, now)
        if kind == "add":
            _, peer, loc, lifetime = op
            entries = [LocatorEntry(PEER_LOCATORS[loc], 0, lifetime)]
            return lambda h: h.add_correspondent(peer, entries, now)
        if kind == "send":
            app = encode_packet(
                IlnpPacket(
                    ILV(self.host.config.identifier_prefix, HOST),
                    ILV(self.host.config.identifier_prefix, op[1]),
                    17,
                    _udp(HOST),
                )
            )
            return lambda h: h.send(app, now)
        if kind == "lu":  # the peer moved: its advertisement, with the right nonce
            _, peer, locs = op
            update = LocatorUpdate(
                LuOperation.ADVERTISEMENT,
                tuple(LocatorEntry(PEER_LOCATORS[i], pref, life) for i, pref, life in locs),
            )
            src = ILV(PEER_LOCATORS[locs[0][0]], peer)
            dst = ILV(self.host.local_locator, HOST)
            body = encode_locator_update(update, src.packed, dst.packed)
            wire = self._to_us(src, 58, body, _peer_nonce(peer))
            return lambda h: h.receive(wire, now)
        if kind == "ack":  # the peer acknowledges what we advertised it
            entry = self.host.ilcc.get(op[1])
            advertised = entry.lu_advertised if entry is not None else ()
            update = LocatorUpdate(LuOperation.ACKNOWLEDGEMENT, advertised)
            src = ILV(PEER_LOCATORS[0], op[1])
            dst = ILV(self.host.local_locator, HOST)
            body = encode_locator_update(update, src.packed, dst.packed)
            wire = self._to_us(src, 58, body, _peer_nonce(op[1]))
            return lambda h: h.receive(wire, now)
        if kind == "pp":  # Parameter Problem quoting our nonce: the peer is not ILNP
            entry = self.host.ilcc.get(op[1])
            our_nonce = entry.local_nonce if entry is not None else Nonce(b"none")
            invoking = encode_packet(
                IlnpPacket(
                    ILV(self.host.local_locator, HOST),
                    ILV(PEER_LOCATORS[0], op[1]),
                    17,
                    _udp(HOST),
                    our_nonce,
                )
            )
            icmp = struct.pack("!BBHI", 4, 2, 0, 42) + invoking
            wire = self._to_us(ILV(PEER_LOCATORS[0], op[1]), 58, icmp, None)
            return lambda h: h.receive(wire, now)
        if kind == "move":
            ours = [LocatorEntry(OUR_LOCATORS[i], pref, 600) for i, pref in op[1]]
            return lambda h: h.set_local_locators(ours, now)
        if kind == "connect":
            self.sockets.connected.add(op[1])
            return lambda h: None
        if kind == "tick":  # time passes; the adapter looks at the timers, or not yet
            _, dt, look = op
            self.now += dt
            later = self.now
            return (lambda h: h.handle_timer(later)) if look else (lambda h: None)
        assert kind == "to_timer"  # jump exactly to the next deadline, as the daemon does
        timer = self.host.get_timer()
        if timer is not None and timer > self.now:
            self.now = timer
        at = self.now
        return lambda h: h.handle_timer(at)


peers = st.sampled_from(PEERS)
locs = st.integers(0, len(PEER_LOCATORS) - 1)
data = st.tuples(st.just("data"), peers, locs, st.booleans())
sends = st.tuples(st.just("send"), peers)
ticks = st.tuples(
    st.just("tick"), st.sampled_from([0.0, 0.3, 1.0, 2.5, 10.0, 700.0]), st.booleans()
)
operations = st.one_of(  # packets and time weigh more: most sequences need several
    data,
    data,
    data,
    sends,
    sends,
    ticks,
    ticks,
    st.tuples(st.just("add"), peers, locs, st.sampled_from(LIFETIMES)),
    st.tuples(
        st.just("lu"),
        peers,
        st.lists(
            st.tuples(locs, st.integers(0, 3), st.sampled_from(LIFETIMES)),
            min_size=1,
            max_size=3,
            unique_by=lambda t: t[0],
        ),
    ),
    st.tuples(st.just("ack"), peers),
    st.tuples(st.just("pp"), peers),
    st.tuples(
        st.just("move"),
        st.lists(  # a locator set names each locator once (check_locator_set)
            st.tuples(st.integers(0, 1), st.integers(0, 3)),
            min_size=1,
            max_size=2,
            unique_by=lambda t: t[0],
        ),
    ),
    st.tuples(st.just("connect"), st.just(PEERS[-1])),  # one only: the others stay unadopted
    st.tuples(st.just("to_timer")),
)
policies = st.sampled_from(["none", "bounded", "socket"])


def _make(cls: type[IlnpHost], policy: str, sockets: FakeSockets) -> IlnpHost:
    config = HostConfig(
        HOST,
        (LocatorEntry(OUR_LOCATORS[0], 0, 600),),
        lu_max_tries=3,
        reply_capacity=3,
        reply_ttl=20.0,  # outlives a few ticks: refreshed hints meet newer ones
        nonce_key=b"timer-test",  # the same nonces on both hosts
    )
    options: dict[str, dict[str, Any]] = {
        "none": {},
        "bounded": {"capacity": 3, "idle_timeout": 4.0},
        "socket": {"sockets": sockets},
    }
    return cls(config, policy=create_policy(policy, **options[policy]))


@settings(max_examples=300, deadline=None)
@given(policies, st.lists(operations, min_size=30, max_size=100))
def test_timer_index_matches_the_walk_and_take_touched_covers_every_change(
    policy: str, ops: list[tuple[Any, ...]]
) -> None:
    sockets = FakeSockets()
    host = _make(IlnpHost, policy, sockets)
    walker = _make(WalkingHost, policy, sockets)
    driver = Driver(host, sockets)
    host.take_touched()
    for op in ops:
        before = _ilcc(host)
        action = driver.step(op)
        action(host)
        action(walker)
        after = _ilcc(host)
        changed = {n for n in before.keys() | after.keys() if before.get(n) != after.get(n)}
        assert changed <= host.take_touched(), op
        assert all(e.state is not EntryState.EXPIRED for e in host.ilcc)  # removed at once
        _check_sources(host)
        assert _observe(host) == _observe(walker), op


def test_driver_reaches_the_interesting_states() -> None:
    """The operations above can produce every entry state, retransmissions and expiry."""
    sockets = FakeSockets()
    host = _make(IlnpHost, "none", sockets)
    driver = Driver(host, sockets)
    seen: set[object] = set()
    script: list[tuple[Any, ...]] = [
        ("add", 0x10, 0, 3),
        ("data", 0x11, 1, True),
        ("move", [(1, 0)]),
        ("to_timer",),
        ("ack", 0x11),
        ("pp", 0x10),
        ("lu", 0x11, [(2, 0, 1)]),
        *itertools.repeat(("to_timer",), 8),
    ]
    for op in script:
        driver.step(op)(host)
        seen.update(e.state for e in host.ilcc)
    assert {EntryState.ACTIVE, EntryState.LU_PENDING, EntryState.NON_ILNP} <= seen
    assert host.counters["lu_retransmitted"] >= 1
    assert host.counters["lu_acked"] == 1
    assert host.counters["removed_locators_expired"] == 2
    assert host.get_timer() is None
