"""I-LV hosts file and DNS NID/L64 resolution (RFC 6742) for the ILNP host daemon."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import dns.message
import dns.rdatatype
import dns.resolver
import dns.rrset
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.ilnp.resolve import (
    DEFAULT_LIFETIME,
    HostsFile,
    Resolution,
    ResolveError,
    Resolver,
    parse_hosts,
    parse_locator_spec,
    resolve_dns,
)
from sixlab.wire.ilnp import ILV, LocatorEntry

HOSTS = """\
# comment line
2001:db8:a:0/0:0:0:a,10  2001:db8:d:0/0:0:0:a,20,600   alice  a.example   # trailing
2001:db8:b:0/0:0:0:b bob

2001:db8:e:0/0:0:0:b,5 bob
"""


def test_hosts_file_names_aliases_preferences_and_merged_lines() -> None:
    hosts = parse_hosts(HOSTS)
    alice = hosts.by_name("alice")
    assert alice == Resolution(
        "alice",
        0xA,
        (
            LocatorEntry(0x2001_0DB8_000A_0000, 10, DEFAULT_LIFETIME),
            LocatorEntry(0x2001_0DB8_000D_0000, 20, 600),
        ),
    )
    assert hosts.by_name("a.example") is not None
    assert hosts.by_nid(0xA) == alice
    bob = hosts.by_nid(0xB)
    assert bob is not None
    assert [e.locator for e in bob.locators] == [0x2001_0DB8_000B_0000, 0x2001_0DB8_000E_0000]
    assert [e.preference for e in bob.locators] == [0, 5]
    assert hosts.by_nid(0xC) is None
    assert hosts.by_name("carol") is None
    assert len(hosts) == 2


@pytest.mark.parametrize(
    "text",
    [
        "alice",  # no I-LV
        "2001:db8:a:0/0:0:0:a",  # no name
        "2001:db8:a:0/0:0:0:a alice 2001:db8:b:0/0:0:0:a",  # I-LV after a name
        "2001:db8:a:0/0:0:0:a 2001:db8:b:0/0:0:0:b alice",  # two NIDs on a line
        "2001:db8:a/0:0:0:a alice",  # three groups
        "2001:db8:a:0/0:0:0:a,x alice",  # bad preference
        "2001:db8:a:0/0:0:0:a,70000 alice",  # preference past 16 bits
        "2001:db8:a:0/0:0:0:a alice\n2001:db8:a:0/0:0:0:b alice",  # one name, two NIDs
    ],
)
def test_malformed_hosts_lines_are_refused(text: str) -> None:
    with pytest.raises(ResolveError):
        parse_hosts(text)


def test_locator_spec() -> None:
    assert parse_locator_spec("2001:db8:a:0") == LocatorEntry(0x2001_0DB8_000A_0000, 0, 0xFFFF)
    assert parse_locator_spec("2001:db8:a:0,7,30") == LocatorEntry(0x2001_0DB8_000A_0000, 7, 30)
    for bad in ("2001:db8:a", "2001:db8:a:0,1,2,3", "zz:0:0:0", ""):
        with pytest.raises(ResolveError):
            parse_locator_spec(bad)


_u16 = st.integers(0, 0xFFFF)
_u64 = st.integers(0, (1 << 64) - 1)
_names = st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(
    nid=_u64,
    entries=st.lists(st.tuples(_u64, _u16, _u16), min_size=1, max_size=4),
    name=_names,
)
def test_hosts_round_trip(nid: int, entries: list[tuple[int, int, int]], name: str) -> None:
    specs = [f"{ILV(loc, nid)},{pref},{life}" for loc, pref, life in entries]
    hosts = parse_hosts(" ".join(specs) + f" {name}\n")
    expected = Resolution(name, nid, tuple(LocatorEntry(*e) for e in entries))
    assert hosts.by_name(name) == expected
    assert hosts.by_nid(nid) == expected


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_hosts_parser_fuzz(text: str) -> None:
    """Arbitrary text parses or raises ResolveError, nothing else."""
    with contextlib.suppress(ResolveError):
        parse_hosts(text)


# --------------------------------------------------------------------- DNS


@pytest.fixture
def dns_server() -> Iterator[dns.resolver.Resolver]:
    """A one-zone authoritative server on loopback answering NID and L64 queries."""
    records = {
        ("node.example.", dns.rdatatype.NID): dns.rrset.from_text(
            "node.example.", 300, "IN", "NID", "20 0000:0000:0000:0099", "10 0000:0000:0000:000a"
        ),
        ("node.example.", dns.rdatatype.L64): dns.rrset.from_text(
            "node.example.", 120, "IN", "L64", "10 2001:0db8:000a:0000", "20 2001:0db8:000d:0000"
        ),
        ("nol64.example.", dns.rdatatype.NID): dns.rrset.from_text(
            "nol64.example.", 300, "IN", "NID", "10 0000:0000:0000:000b"
        ),
    }
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                wire, peer = sock.recvfrom(4096)
            except TimeoutError:
                continue
            query = dns.message.from_wire(wire)
            response = dns.message.make_response(query)
            question = query.question[0]
            found = records.get((question.name.to_text(), question.rdtype))
            if found is not None:
                response.answer.append(found)
            sock.sendto(response.to_wire(), peer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    resolver = dns.resolver.Resolver(configure=False)
    resolver.nameservers = ["127.0.0.1"]
    resolver.port = sock.getsockname()[1]
    resolver.lifetime = 2.0
    try:
        yield resolver
    finally:
        stop.set()
        thread.join()
        sock.close()


def test_dns_nid_and_l64_records(dns_server: dns.resolver.Resolver) -> None:
    found = resolve_dns("node.example.", dns_server)
    assert found.nid == 0xA  # the more preferred NID record (RFC 6742 §3)
    assert set(found.locators) == {
        LocatorEntry(0x2001_0DB8_000A_0000, 10, 120),
        LocatorEntry(0x2001_0DB8_000D_0000, 20, 120),
    }


def test_dns_failures_are_resolve_errors(dns_server: dns.resolver.Resolver) -> None:
    with pytest.raises(ResolveError):
        resolve_dns("nol64.example.", dns_server)
    with pytest.raises(ResolveError):
        resolve_dns("absent.example.", dns_server)


def test_resolver_prefers_hosts_file_then_dns(dns_server: dns.resolver.Resolver) -> None:
    resolver = Resolver(parse_hosts(HOSTS), dns_server)
    assert resolver.by_name("alice").nid == 0xA
    assert resolver.by_name("node.example.").nid == 0xA
    assert resolver.by_nid(0xB) is not None
    with pytest.raises(ResolveError):
        resolver.by_name("node.example.", use_dns=False)
    assert Resolver(HostsFile()).by_nid(0xA) is None
