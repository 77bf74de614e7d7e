"""Locators and NIDs as people write them; locators checked against the links; the
names file."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from sixlab.cli.ilnp import add_parsers
from sixlab.ilnp._errors import ConfigError
from sixlab.ilnp.config import check_held, held_locators, parse_l64, parse_nid
from sixlab.ilnp.names import render_names, write_names
from sixlab.ilnp.resolve import Resolution, ResolveError, parse_hosts, parse_locator_spec
from sixlab.wire.ilnp import LocatorEntry

L64 = 0x2001_0DB8_00A1_0000


@pytest.mark.parametrize(
    "text", ["2001:db8:a1::/64", "2001:db8:a1::", "2001:db8:a1:0", " 2001:DB8:A1:0 "]
)
def test_locator_notations(text: str) -> None:
    assert parse_l64(text) == L64


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("2001:db8:a1::/48", "/64 prefix, not /48"),
        ("2001:db8:a1::1", "lower 64 bits are not zero"),
        ("2001:db8:a1::1/64", "lower 64 bits are not zero"),
        ("2001:db8:a", "want 2001:db8:a1::/64"),
        ("fe80::zz", "want"),
        ("", "want"),
    ],
)
def test_bad_locators_say_why(text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_l64(text)


def test_locator_spec_takes_the_new_notations_with_preference_and_lifetime() -> None:
    assert parse_locator_spec("2001:db8:a1::/64,10") == LocatorEntry(L64, 10, 0xFFFF)
    assert parse_locator_spec("2001:db8:a1::,5,600") == LocatorEntry(L64, 5, 600)
    with pytest.raises(ResolveError, match="bad locator '2001:db8:a1::/48'"):
        parse_locator_spec("2001:db8:a1::/48")


@pytest.mark.parametrize(
    ("text", "nid"),
    [("::a", 0xA), ("0:0:0:a", 0xA), ("10", 10), ("0xa", 0xA), ("::1:0:0:a", 0x1_0000_0000_000A)],
)
def test_nid_notations(text: str, nid: int) -> None:
    assert parse_nid(text) == nid


@pytest.mark.parametrize("text", ["2001:db8::a", "zz", "-1", str(1 << 64), "::g"])
def test_bad_nids_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="NID"):
        parse_nid(text)


def test_only_links_that_are_up_hold_locators() -> None:
    states = {"eth0": (True, {L64}), "eth1": (False, {L64 + 1}), "eth2": (True, {L64})}
    assert held_locators(states) == {L64: ["eth0", "eth2"]}
    check_held([LocatorEntry(L64)], states)
    with pytest.raises(ConfigError, match="2001:db8:a1:1"):
        check_held([LocatorEntry(L64), LocatorEntry(L64 + 1)], states)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sixlab")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_cli_move_and_add_peer() -> None:
    args = _parse(["ilnp", "move", "2001:db8:a1::/64,0", "2001:db8:a2::,10", "--control", "x"])
    assert args.query == "set-locators"
    assert args.locators == [LocatorEntry(L64, 0), LocatorEntry(0x2001_0DB8_00A2_0000, 10)]
    args = _parse(["ilnp", "add-peer", "bob"])
    assert (args.query, args.name) == ("add-peer", "bob")
    args = _parse(
        ["ilnp", "host", "--nid", "::a", "--locator", "2001:db8:a1::/64", "--interface", "e"]
    )
    assert args.nid == 0xA
    assert args.locator == [(LocatorEntry(L64, 0), None)]
    args = _parse(["ilnp", "host", "--nid", "::a", "--locator", "2001:db8:a1::,5@eth1"])
    assert args.locator == [(LocatorEntry(L64, 5), "eth1")]
    assert args.interface is None  # every Ethernet link that is up (the daemon decides)


def test_names_file_lists_identifier_addresses(tmp_path: Path) -> None:
    hosts = parse_hosts(
        "2001:db8:a:0/0:0:0:a,10 2001:db8:d:0/0:0:0:a,20 alice a\n2001:db8:b:0/0:0:0:b bob\n"
    )
    text = render_names([*hosts.entries(), Resolution("carol.example", 0xC, ())])
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == ["fd00:2ff::a\talice a", "fd00:2ff::b\tbob", "fd00:2ff::c\tcarol.example"]
    target = tmp_path / "sub" / "hosts"
    write_names(target, text)
    assert target.read_text() == text
    assert [p.name for p in target.parent.iterdir()] == ["hosts"]  # no temporary left
