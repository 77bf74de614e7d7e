"""Locators learned from Router Advertisements: the set, its preferences and lifetimes,
and when it is advertised again (sixlab.ilnp.autoconf, no kernel)."""

from __future__ import annotations

import pytest

from sixlab.ilnp._errors import ConfigError
from sixlab.ilnp.autoconf import (
    DEPRECATED_PENALTY,
    LearnedPrefix,
    RouterAdvertisements,
    learned_entries,
    needs_readvertising,
)
from sixlab.wire.ilnp import LocatorEntry

A, C, D = 0x2001_0DB8_000A_0000, 0x2001_0DB8_000C_0000, 0x2001_0DB8_000D_0000


def test_preference_follows_the_interface_order_and_deprecation() -> None:
    learned = [
        LearnedPrefix(D, "eth1", deprecated=False, valid=100),
        LearnedPrefix(A, "eth0", deprecated=True, valid=50),
        LearnedPrefix(C, "eth0", deprecated=False, valid=None),
    ]
    assert learned_entries(learned, ("eth0", "eth1")) == (
        LocatorEntry(C, 0, 0xFFFF),
        LocatorEntry(D, 10, 100),
        LocatorEntry(A, DEPRECATED_PENALTY, 50),
    )


def test_a_locator_on_two_links_counts_once_with_its_better_preference() -> None:
    learned = [
        LearnedPrefix(A, "eth1", deprecated=False, valid=10),
        LearnedPrefix(A, "eth0", deprecated=False, valid=20),
    ]
    assert learned_entries(learned, ("eth0", "eth1")) == (LocatorEntry(A, 0, 20),)


def test_lifetime_is_capped_at_what_a_locator_update_carries() -> None:
    (entry,) = learned_entries([LearnedPrefix(A, "eth0", False, 2_592_000)], ("eth0",))
    assert entry.lifetime == 0xFFFF


def test_readvertised_when_the_set_changes_or_the_router_extended_a_lifetime() -> None:
    told = (LocatorEntry(A, 0, 12),)
    assert not needs_readvertising(told, 2.0, (LocatorEntry(A, 0, 12),))
    # B has 12 - 7 = 5 s left, the kernel 12: under half, tell again.
    assert needs_readvertising(told, 7.0, (LocatorEntry(A, 0, 12),))
    # The kernel's own lifetime runs down too (no RA): nothing to tell.
    assert not needs_readvertising(told, 7.0, (LocatorEntry(A, 0, 5),))
    assert needs_readvertising(told, 0.0, (LocatorEntry(A, DEPRECATED_PENALTY, 12),))
    assert needs_readvertising(told, 0.0, (LocatorEntry(A, 0, 12), LocatorEntry(C, 10, 12)))


def test_poll_gives_a_set_only_when_it_must_go_out_and_never_an_empty_one() -> None:
    seen: list[list[LearnedPrefix]] = [[LearnedPrefix(A, "eth0", False, 12)]]
    ra = RouterAdvertisements(0xA, ("eth0",), read=lambda: seen[0])
    ra.wait(0.0)
    assert ra.take(100.0) == (LocatorEntry(A, 0, 12),)
    assert ra.poll(101.0) is None
    seen[0] = [LearnedPrefix(A, "eth0", True, 12), LearnedPrefix(C, "eth0", False, 12)]
    assert ra.poll(102.0) == (LocatorEntry(C, 0, 12), LocatorEntry(A, DEPRECATED_PENALTY, 12))
    seen[0] = []
    assert ra.poll(103.0) is None
    assert ra.advertised == (LocatorEntry(C, 0, 12), LocatorEntry(A, DEPRECATED_PENALTY, 12))


def test_wait_without_any_prefix_names_the_links() -> None:
    ra = RouterAdvertisements(0xA, ("eth0", "eth1"), read=list)
    with pytest.raises(ConfigError, match="no Router Advertisement gave a prefix on eth0, eth1"):
        ra.wait(0.0)
