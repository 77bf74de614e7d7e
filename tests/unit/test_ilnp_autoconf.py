"""Locators learned from Router Advertisements: the set, its preferences and lifetimes,
and when it is advertised again (sixlab.ilnp.autoconf, no kernel)."""

from __future__ import annotations

import ipaddress
import socket
import struct
from pathlib import Path

import pytest

from sixlab.ilnp._errors import ConfigError
from sixlab.ilnp.autoconf import (
    DEPRECATED_PENALTY,
    LearnedPrefix,
    RouterAdvertisements,
    learned_entries,
    needs_readvertising,
    parse_rdnss,
)
from sixlab.ilnp.links import default_interfaces
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


def _useropt(ifindex: int, options: bytes, icmp_type: int = 134) -> bytes:
    body = struct.pack("=BBHiBBHI", socket.AF_INET6, 0, len(options), ifindex, icmp_type, 0, 0, 0)
    body += options
    return struct.pack("=IHHII", 16 + len(body), 68, 0, 0, 0) + body


def _rdnss(lifetime: int, *servers: str) -> bytes:
    packed = b"".join(ipaddress.IPv6Address(s).packed for s in servers)
    return struct.pack("!BBHI", 25, 1 + 2 * len(servers), 0, lifetime) + packed


def test_rdnss_servers_are_read_from_the_kernels_user_options() -> None:
    other = struct.pack("!BBHI", 31, 1, 0, 0)  # DNSSL, say: not ours
    data = _useropt(3, other + _rdnss(600, "2001:db8:a::1", "2001:db8:a::2"))
    data += _useropt(4, _rdnss(600, "2001:db8:f::1"))  # another link
    data += _useropt(3, _rdnss(0, "2001:db8:a::2"))  # withdrawn
    assert parse_rdnss(data, [3]) == [
        ("2001:db8:a::1", 600),
        ("2001:db8:a::2", 600),
        ("2001:db8:a::2", 0),
    ]


def test_malformed_user_options_are_skipped_not_raised() -> None:
    good = _useropt(3, _rdnss(60, "2001:db8:a::1"))
    assert parse_rdnss(good[:20], [3]) == []  # cut inside the message
    zero_length = _useropt(3, b"\x19\x00" + bytes(6) + _rdnss(60, "2001:db8:a::1"))
    assert parse_rdnss(zero_length, [3]) == []
    short = _useropt(3, struct.pack("!BBHI", 25, 1, 0, 60))  # no address at all
    assert parse_rdnss(short + good, [3]) == [("2001:db8:a::1", 60)]


def test_default_interfaces_are_the_ethernet_links_that_are_up(tmp_path: Path) -> None:
    for name, kind, flags in (
        ("eth1", "1", "0x1003"),
        ("eth0", "1", "0x1003"),
        ("down0", "1", "0x1002"),
        ("lo", "772", "0x9"),
        ("ilnp0", "65534", "0x1091"),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "type").write_text(kind + "\n")
        (tmp_path / name / "flags").write_text(flags + "\n")
    (tmp_path / "broken").mkdir()
    assert default_interfaces(tmp_path) == ("eth0", "eth1")
