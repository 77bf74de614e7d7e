"""The daemon's send side without sockets: which destinations are neighbours, and the
neighbour events it reads from the kernel (any bytes, never an exception)."""

from __future__ import annotations

import ipaddress
import socket
import struct

from hypothesis import given
from hypothesis import strategies as st

from sixlab.ilnp.egress import Egress, neighbour_messages, on_link, route_table
from sixlab.ilnp.links import LinkState, LinkWatcher


def _net(text: str) -> int:
    return int(ipaddress.IPv6Address(text))


def test_a_gateway_route_of_lower_metric_wins_over_the_on_link_prefix() -> None:
    """The bench's crowd: the /64 is on-link (kernel prefix route, metric 256) and also
    routed via the generator (metric 1); the kernel takes the gateway, so the crowd's
    addresses are not neighbours."""
    routes = route_table(
        [
            (_net("2001:db8:10::"), 64, False),  # via the generator, metric 1: first
            (_net("2001:db8:10::"), 64, True),  # the prefix route, metric 256
            (_net("fe80::"), 64, True),
            (0, 0, False),  # default via a router
        ]
    )
    assert not on_link(routes, _net("2001:db8:10::1234:5678:9abc:def0"))
    assert on_link(routes, _net("fe80::1"))
    assert not on_link(routes, _net("2001:db8:99::1"))  # the default route
    assert not on_link(route_table([(_net("2001:db8:f::"), 64, True)]), _net("2001:db8:e::1"))


def test_longest_prefix_decides() -> None:
    routes = route_table([(_net("2001:db8:f::1"), 128, False), (_net("2001:db8:f::"), 64, True)])
    assert not on_link(routes, _net("2001:db8:f::1"))
    assert on_link(routes, _net("2001:db8:f::2"))


def _neigh(kind: int, ifindex: int, state: int, dst: str) -> bytes:
    body = struct.pack("=BBHiHBB", socket.AF_INET6, 0, 0, ifindex, state, 0, 0)
    body += struct.pack("=HH", 20, 1) + ipaddress.IPv6Address(dst).packed
    body += struct.pack("=HH", 10, 2) + bytes(6) + bytes(2)  # NDA_LLADDR, padded
    return struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body


def test_neighbour_messages_parses_new_and_delete() -> None:
    data = _neigh(28, 3, 0x02, "2001:db8:f::1") + _neigh(29, 3, 0x20, "2001:db8:f::2")
    assert neighbour_messages(data) == [
        (28, 3, 0x02, ipaddress.IPv6Address("2001:db8:f::1").packed),
        (29, 3, 0x20, ipaddress.IPv6Address("2001:db8:f::2").packed),
    ]


@given(st.binary(max_size=300))
def test_neighbour_messages_never_raises(data: bytes) -> None:
    for kind, _ifindex, _state, address in neighbour_messages(data):
        assert kind in (28, 29)
        assert len(address) == 16


@given(st.integers(0, 59))  # the message is 60 bytes
def test_a_cut_message_is_skipped(cut: int) -> None:
    whole = _neigh(28, 1, 0x02, "2001:db8::1")
    assert neighbour_messages(whole[:cut]) == []


def test_next_hop_is_the_local_locators_links_own_route() -> None:
    """eth0 has the preferred default route; a locator on eth1 still goes through
    eth1's gateway, a destination on eth1's subnet is its own next hop, and a link
    without a route there has none."""
    loc0, loc1 = 0x2001_0DB8_000A_0000, 0x2001_0DB8_000D_0000
    peer = 0x2001_0DB8_000B_0000 << 64 | 0xB
    gw0, gw1 = 0xFE80 << 112 | 1, 0xFE80 << 112 | 2
    watcher = LinkWatcher(("eth0", "eth1", "eth2"))
    watcher.states = {
        "eth0": LinkState("eth0", 2, True, True, "UP", frozenset({loc0}), hops=((0, 0, gw0),)),
        "eth1": LinkState(
            "eth1",
            3,
            True,
            True,
            "UP",
            frozenset({loc1}),
            hops=((loc1 << 64, 64, 0), (0, 0, gw1)),
        ),
        "eth2": LinkState("eth2", 4, True, True, "UP", frozenset({0x99})),
    }
    watcher.homes = {loc0: {"eth0"}, loc1: {"eth1"}, 0x99: {"eth2"}}
    watcher._route = {loc0: "eth0", loc1: "eth1", 0x99: "eth2"}
    assert watcher.next_hop(loc0, peer) == gw0
    assert watcher.next_hop(loc1, peer) == gw1
    assert watcher.next_hop(loc1, loc1 << 64 | 0x77) == loc1 << 64 | 0x77
    assert watcher.next_hop(0x99, peer) is None
    assert watcher.next_hop(0x1234, peer) is None  # no interface holds it


def test_a_neighbour_is_usable_for_the_fast_path_only_once_resolved() -> None:
    """The daemon names a next hop in a kernel record only while its neighbour is usable
    and rewrites the record when that changes (module doc: a fast-path packet queued
    behind an unresolved neighbour leaves without its Ethernet header)."""
    egress = Egress(["eth0"])
    router = bytes.fromhex("fe80" + "00" * 13 + "01")
    assert not egress.neighbour_usable(2, router)
    assert egress.take_changed() == set()
    egress._on_neighbour(28, (2, router), 0x01)  # RTM_NEWNEIGH, NUD_INCOMPLETE
    assert egress.take_changed() == set()
    egress._on_neighbour(28, (2, router), 0x02)  # NUD_REACHABLE
    assert egress.take_changed() == {(2, router)}
    assert egress.neighbour_usable(2, router)
    egress._on_neighbour(28, (2, router), 0x04)  # NUD_STALE: still usable, no change
    assert egress.take_changed() == set()
    egress._on_neighbour(29, (2, router), 0x04)  # RTM_DELNEIGH
    assert egress.take_changed() == {(2, router)}
    assert not egress.neighbour_usable(2, router)
