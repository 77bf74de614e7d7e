"""Which link each claimed locator|NID address goes on (sixlab.ilnp.addresses, no kernel)."""

from __future__ import annotations

from sixlab.ilnp.addresses import place_locators

A, D, E = 0x2001_0DB8_000A_0000, 0x2001_0DB8_000D_0000, 0x2001_0DB8_000E_0000
LINKS = ("eth0", "eth1")


def test_by_position_the_nth_locator_on_the_nth_link_and_the_rest_on_the_first() -> None:
    assert place_locators([A, D, E], LINKS) == {A: "eth0", D: "eth1", E: "eth0"}
    assert place_locators([A, D], ()) == {}


def test_the_link_named_with_a_locator_wins() -> None:
    placed = place_locators([D, A], LINKS, named={D: "eth1", A: "eth0"})
    assert placed == {D: "eth1", A: "eth0"}


def test_an_on_link_route_covering_the_locator_places_it_the_most_specific_first() -> None:
    routes = {
        "eth0": [((D << 64), 64, True), (0, 0, False)],  # a default route never decides
        "eth1": [((A << 64), 48, True), ((A << 64) | (1 << 63), 64, False)],
    }
    assert place_locators([D, A], LINKS, routes=routes) == {D: "eth0", A: "eth1"}
    routes["eth0"].append(((A << 64), 56, True))
    assert place_locators([D, A], LINKS, routes=routes) == {D: "eth0", A: "eth0"}
    # ... and a named link over a route
    assert place_locators([D, A], LINKS, named={A: "eth1"}, routes=routes)[A] == "eth1"
