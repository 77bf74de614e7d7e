"""ILCC state tables and stores."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.ilnp import InvalidTransitionError, UnknownBackendError, create_policy, create_store
from sixlab.ilnp.ilcc import (
    ENTRY_TRANSITIONS,
    LOCATOR_AGED_GRACE,
    LOCATOR_TRANSITIONS,
    EntryEvent,
    EntryState,
    IlccEntry,
    LocatorEvent,
    LocatorState,
    PeerLocator,
)
from sixlab.wire.ilnp import LocatorEntry, Nonce


def entry(nid: int) -> IlccEntry:
    return IlccEntry(nid, 1, 2, Nonce(b"abcd"))


def test_every_table_pair_is_reachable_and_missing_pairs_raise() -> None:
    for state in EntryState:
        for event in EntryEvent:
            e = entry(1)
            e.state = state
            if (state, event) in ENTRY_TRANSITIONS:
                e.fire(event)
                assert e.state is ENTRY_TRANSITIONS[state, event]
            else:
                with pytest.raises(InvalidTransitionError):
                    e.fire(event)
    for lstate in LocatorState:
        for levent in LocatorEvent:
            p = PeerLocator(1, 0, 10, lstate, 10.0)
            if (lstate, levent) in LOCATOR_TRANSITIONS:
                p.fire(levent)
                assert p.state is LOCATOR_TRANSITIONS[lstate, levent]
            else:
                with pytest.raises(InvalidTransitionError):
                    p.fire(levent)


def test_expired_entries_accept_no_event() -> None:
    assert not [k for k in ENTRY_TRANSITIONS if k[0] is EntryState.EXPIRED]


def test_locator_ages_then_expires_by_timers() -> None:
    e = entry(1)
    e.replace_locators((LocatorEntry(0xAA, 1, 30), LocatorEntry(0xBB, 2, 60)), now=0.0)
    assert e.best_locator().locator == 0xAA  # type: ignore[union-attr]
    e.advance(30.0)
    assert [p.state for p in e.locators] == [LocatorState.AGED, LocatorState.VALID]
    assert e.best_locator().locator == 0xBB  # type: ignore[union-attr]  # a valid one wins
    e.advance(60.0 + LOCATOR_AGED_GRACE)
    assert [p.state for p in e.locators] == [LocatorState.EXPIRED, LocatorState.EXPIRED]
    assert e.best_locator() is None
    assert e.state is EntryState.EXPIRED


def test_lowest_preference_is_best() -> None:
    e = entry(1)
    e.replace_locators((LocatorEntry(3, 50), LocatorEntry(4, 5), LocatorEntry(5, 20)), 0.0)
    assert e.best_locator().locator == 4  # type: ignore[union-attr]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "get", "remove", "touch"]), st.integers(0, 8))))
def test_linear_and_hash_stores_agree(ops: list[tuple[str, int]]) -> None:
    stores = [create_store("hash"), create_store("linear")]
    for op, nid in ops:
        results = []
        for store in stores:
            if op == "add":
                store.add(entry(nid))
            elif op == "touch":
                store.touch(nid)
            else:
                found = store.get(nid) if op == "get" else store.remove(nid)
                results.append(None if found is None else found.peer_nid)
        assert len(set(map(str, results))) <= 1
        assert [e.peer_nid for e in stores[0]] == [e.peer_nid for e in stores[1]]
        oldest = {None if (o := s.oldest()) is None else o.peer_nid for s in stores}
        assert len(oldest) == 1
        assert len(stores[0]) == len(stores[1])


def test_unknown_names_raise_lookup_error() -> None:
    with pytest.raises(UnknownBackendError):
        create_store("btree")
    with pytest.raises(LookupError):
        create_policy("magic")
