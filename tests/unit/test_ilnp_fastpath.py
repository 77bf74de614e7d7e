"""The ILNP kernel fast path: what the kernel is told, and what its ingress program does.

``peer_record`` is pure and tested against hosts driven through the sans-I/O API. The
ingress program is run with ``BPF_PROG_TEST_RUN`` (root) on packets a Python host
wrote, and its output is compared byte for byte with what the Python host delivers
for the same packet. (The egress program expects a TUN's L3 packet, which the test
runner cannot feed a ``tc`` program; the integration tests check its packets on the
wire and through the peer.)
"""

from __future__ import annotations

import errno
import struct
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sixlab.ilnp import Deliver, HostConfig, IlnpHost
from sixlab.ilnp.daemon import ring_filter
from sixlab.ilnp.fastpath import (
    _CONFIG,
    _PEER,
    F_CARRY_NONCE,
    F_EGRESS,
    F_INGRESS,
    F_NONCE_OPTIONAL,
    FastPath,
    peer_record,
)
from sixlab.ilnp.ilcc import LOCATOR_AGED_GRACE, EntryState, IlccEntry
from sixlab.linux.libbpf import LibbpfError
from sixlab.wire.ilnp import (
    IDENTIFIER_PREFIX,
    ILV,
    IlnpPacket,
    LocatorEntry,
    Nonce,
    decode_packet,
    encode_packet,
    nid_checksum,
)
from tests.unit.test_bpf_filter import run as run_classic_bpf

NID_A, NID_B = 0xA, 0xB
LOC_A, LOC_A2, LOC_B, LOC_X = (
    0x2001_0DB8_000A_0000,
    0x2001_0DB8_000D_0000,
    0x2001_0DB8_000B_0000,
    0x2001_0DB8_00EE_0000,
)
TC_ACT_OK, TC_ACT_REDIRECT = 0, 7
ETH = bytes(6) + bytes.fromhex("020000000001") + b"\x86\xdd"


def _host(nid: int, locator: int, *, always: bool = True, nonce_size: int = 4) -> IlnpHost:
    return IlnpHost(
        HostConfig(
            nid=nid,
            locators=(LocatorEntry(locator),),
            always_carry_nonce=always,
            require_nonce=always,
            nonce_size=nonce_size,
        )
    )


def _app_udp(src_nid: int, dst_nid: int, data: bytes) -> bytes:
    """An application's UDP datagram on identifier addresses, as the TUN hands it over."""
    header = struct.pack("!HHHH", 40000, 7, 8 + len(data), 0)
    csum = nid_checksum(src_nid, dst_nid, 17, header + data) or 0xFFFF
    udp = struct.pack("!HHHH", 40000, 7, 8 + len(data), csum) + data
    src, dst = ILV(IDENTIFIER_PREFIX, src_nid), ILV(IDENTIFIER_PREFIX, dst_nid)
    return encode_packet(IlnpPacket(src, dst, 17, udp, None))


def _wire(host: IlnpHost, data: bytes, now: float) -> bytes:
    host.send(_app_udp(host.config.nid, NID_B if host.config.nid == NID_A else NID_A, data), now)
    (out,) = host.datagrams_to_send()
    return out


def _deliver(host: IlnpHost, wire: bytes, now: float) -> bytes | None:
    host.receive(wire, now)
    delivered = None
    while (event := host.next_event()) is not None:
        if isinstance(event, Deliver):
            delivered = event.packet
    return delivered


def _pair(nonce_size: int = 4, now: float = 0.0) -> tuple[IlnpHost, IlnpHost, IlccEntry]:
    """A talks to B twice; B (policy none) has adopted A and learned its nonce.

    ``now``: the hosts' clock; for the kernel, CLOCK_MONOTONIC (``time.monotonic``).
    """
    a, b = _host(NID_A, LOC_A, nonce_size=nonce_size), _host(NID_B, LOC_B)
    a.add_correspondent(NID_B, (LocatorEntry(LOC_B),), now)
    for i in range(2):
        assert _deliver(b, _wire(a, b"hello %d" % i, now), now) is not None
    entry = b.ilcc.get(NID_A)
    assert entry is not None
    return a, b, entry


# --------------------------------------------------------------------- peer_record


def test_established_entry_is_granted_both_directions() -> None:
    _a, b, entry = _pair()
    record = peer_record(entry, b.config, lambda _loc: 7)
    assert record is not None
    assert record.flags == F_EGRESS | F_INGRESS | F_CARRY_NONCE  # nonce required: not optional
    assert record.peer_locator == LOC_A
    assert record.local_locator == LOC_B
    assert record.egress_ifindex == 7
    assert record.peer_nonce == entry.peer_nonce.value  # type: ignore[union-attr]
    assert record.local_nonce == entry.local_nonce.value
    (peer_loc,) = entry.locators
    assert record.accept == ((LOC_A, peer_loc.valid_until + LOCATOR_AGED_GRACE),)
    assert record.egress_until == peer_loc.valid_until


def test_egress_names_the_next_hop_of_the_local_locators_link_or_is_not_granted() -> None:
    """The kernel is told where the packet goes first on the egress link; a link with
    no route to the peer gets no egress (the kernel's own lookup would pick another
    link's gateway)."""
    _a, b, entry = _pair()
    asked: list[tuple[int, int]] = []

    def via_router(local: int, dst: int) -> int:
        asked.append((local, dst))
        return 0xFE80 << 112 | 1

    record = peer_record(entry, b.config, lambda _loc: 7, via_router)
    assert record is not None
    assert record.flags & F_EGRESS
    assert record.next_hop == 0xFE80 << 112 | 1
    assert asked == [(LOC_B, LOC_A << 64 | NID_A)]
    assert int.from_bytes(record.pack()[-16:], "big") == 0xFE80 << 112 | 1
    no_route = peer_record(entry, b.config, lambda _loc: 7, lambda _l, _d: None)
    assert no_route is not None
    assert not no_route.flags & F_EGRESS
    assert no_route.flags & F_INGRESS


def test_ingress_waits_until_the_host_has_seen_the_peer_answer() -> None:
    """While carry_nonce is set, the host still learns from the next packet."""
    a, b = _host(NID_A, LOC_A, always=False), _host(NID_B, LOC_B, always=False)
    a.add_correspondent(NID_B, (LocatorEntry(LOC_B),), 0.0)
    entry_a = a.ilcc.get(NID_B)
    assert entry_a is not None
    record = peer_record(entry_a, a.config, lambda _loc: 1)
    assert record is not None
    assert record.flags == F_EGRESS | F_CARRY_NONCE  # B's nonce unknown yet
    assert _deliver(b, _wire(a, b"1", 0.0), 0.0) is not None
    entry_b = b.ilcc.get(NID_A)
    assert entry_b is not None
    # One packet from a newcomer: no kernel copy yet, and carry_nonce still set.
    assert entry_b.carry_nonce
    assert peer_record(entry_b, b.config, lambda _loc: 1) is None
    assert _deliver(a, _wire(b, b"2", 0.0), 0.0) is not None
    after = peer_record(entry_a, a.config, lambda _loc: 1)
    assert after is not None
    # A heard B: no nonce needed any more (minimal mode), packets without it accepted.
    assert after.flags == F_EGRESS | F_INGRESS | F_NONCE_OPTIONAL


def test_pending_locator_update_carries_the_nonce_and_keeps_ingress() -> None:
    _a, b, entry = _pair()
    b.set_local_locators((LocatorEntry(LOC_X),), 1.0)
    assert entry.state is EntryState.LU_PENDING
    record = peer_record(entry, b.config, lambda loc: 3 if loc == LOC_X else None)
    assert record is not None
    assert record.flags & (F_EGRESS | F_INGRESS | F_CARRY_NONCE) == (
        F_EGRESS | F_INGRESS | F_CARRY_NONCE
    )
    assert record.local_locator == LOC_X


def test_no_record_for_non_ilnp_or_expired_entries_nor_egress_without_interface() -> None:
    _a, b, entry = _pair()
    no_link = peer_record(entry, b.config, lambda _loc: None)
    assert no_link is not None
    assert not no_link.flags & F_EGRESS
    entry.state = EntryState.NON_ILNP
    assert peer_record(entry, b.config, lambda _loc: 1) is None
    entry.state = EntryState.EXPIRED
    assert peer_record(entry, b.config, lambda _loc: 1) is None


def test_aged_locators_stay_accepted_until_grace_and_egress_stops_at_first_deadline() -> None:
    _a, b, entry = _pair()
    entry.replace_locators((LocatorEntry(LOC_A, 0, 10), LocatorEntry(LOC_A2, 5, 100)), 0.0)
    record = peer_record(entry, b.config, lambda _loc: 1)
    assert record is not None
    assert record.peer_locator == LOC_A
    assert record.egress_until == 10.0  # LOC_A ages then: the host would pick LOC_A2
    assert dict(record.accept) == {LOC_A: 10 + LOCATOR_AGED_GRACE, LOC_A2: 100 + LOCATOR_AGED_GRACE}
    entry.advance(10 + LOCATOR_AGED_GRACE)
    record = peer_record(entry, b.config, lambda _loc: 1)
    assert record is not None
    assert record.peer_locator == LOC_A2
    assert dict(record.accept) == {LOC_A2: 100 + LOCATOR_AGED_GRACE}


def test_packed_layouts_have_the_c_sizes() -> None:
    # struct ilnp_peer: 3*8 + 8*8 + 8*8 + 2*8 + 4 + 4 + 3 + 5 + 12 + 12 + 16 bytes, and
    # struct ilnp_config 88 bytes
    assert _PEER.size == 224
    assert _CONFIG.size == 88


# --------------------------------------------------------------------- the ingress program


@pytest.fixture
def fastpath() -> Iterator[FastPath]:
    fp = FastPath(nid=NID_B, prefix=IDENTIFIER_PREFIX, tun="", links=(), on_active=lambda *_: None)
    fp.load(tun_ifindex=1)
    try:
        fp.set_locators([LOC_B])
        yield fp
    finally:
        fp.close()


@pytest.mark.root
def test_loaded_maps_match_the_packed_layouts(fastpath: FastPath) -> None:
    assert fastpath._peers is not None
    assert fastpath._cfg_map is not None
    assert fastpath._peers.value_size == _PEER.size
    assert fastpath._cfg_map.value_size == _CONFIG.size


@pytest.mark.root
@pytest.mark.parametrize("nonce_size", [4, 12])
def test_ingress_output_is_what_the_host_delivers(fastpath: FastPath, nonce_size: int) -> None:
    now = time.monotonic()
    a, b, entry = _pair(nonce_size, now)
    fastpath.update(NID_A, peer_record(entry, b.config, lambda _loc: 1))
    ingress = fastpath.program("ilnp_ingress")
    for i in range(3):
        wire = _wire(a, b"payload %d" % i, now)
        assert decode_packet(wire).nonce is not None
        run = ingress.test_run(ETH + wire)
        assert run.retval == TC_ACT_REDIRECT
        assert run.data[:14] == ETH
        assert run.data[14:] == _deliver(b, wire, now)
    assert fastpath.counters() == {"rx_fast": 3}
    runs = fastpath.program_stats()
    assert set(runs) == {"ilnp_ingress", "ilnp_egress"}
    assert runs["ilnp_egress"]["runs"] == 0  # never run; ingress counts only with stats on


@pytest.mark.root
def test_ingress_leaves_to_user_space_what_it_must_not_take(fastpath: FastPath) -> None:
    now = time.monotonic()
    a, b, entry = _pair(now=now)
    fastpath.update(NID_A, peer_record(entry, b.config, lambda _loc: 1))
    ingress = fastpath.program("ilnp_ingress")
    good = decode_packet(_wire(a, b"x", now))
    assert good.nonce is not None

    def variant(**changes: object) -> bytes:
        fields = {f: getattr(good, f) for f in IlnpPacket.__dataclass_fields__} | changes
        return encode_packet(IlnpPacket(**fields))

    cases = {
        "rx_nonce": [
            variant(nonce=type(good.nonce)(bytes(4))),  # a guess
            variant(nonce=None),  # none, and the host requires it
        ],
        "rx_locator": [variant(src=ILV(LOC_X, NID_A))],
        "rx_no_peer": [variant(src=ILV(LOC_A, 0x5EED))],
        "rx_protocol": [variant(next_header=58, payload=b"\x80\x00" + bytes(10))],
        "rx_not_our_locator": [variant(dst=ILV(LOC_X, NID_B))],
    }
    for packets in cases.values():
        for wire in packets:
            frame = ETH + wire
            run = ingress.test_run(frame)
            assert run.retval == TC_ACT_OK
            assert run.data == frame  # untouched
    # Not for our NID at all: passed without a count (a link carries other traffic).
    other = ETH + variant(dst=ILV(LOC_B, 0x77))
    assert ingress.test_run(other).retval == TC_ACT_OK
    assert fastpath.counters() == {name: len(p) for name, p in cases.items()}
    # And the entry gone from the kernel: the peer is unknown there again.
    fastpath.update(NID_A, None)
    assert ingress.test_run(ETH + _wire(a, b"y", now)).retval == TC_ACT_OK
    assert fastpath.counters()["rx_no_peer"] == 2


# --------------------------------------------------------------------- the ring's filter


@given(
    dst_hi=st.integers(0, (1 << 64) - 1),
    dst_nid=st.sampled_from([NID_B, NID_A, NID_B | 1 << 40]),
)
def test_ring_filter_keeps_exactly_what_the_daemon_would_look_at(dst_hi: int, dst_nid: int) -> None:
    """Our NID on any locator but the identifier prefix: kept whole; the rest dropped."""
    dst = ILV(dst_hi, dst_nid)
    frame = ETH + encode_packet(IlnpPacket(ILV(LOC_A, NID_A), dst, 17, bytes(12), None))
    kept = run_classic_bpf(ring_filter(NID_B), frame)
    wanted = dst_nid == NID_B and dst_hi != IDENTIFIER_PREFIX
    assert (kept >= len(frame)) == wanted
    assert kept == 0 or wanted


def test_ring_filter_drops_the_identifier_prefix_and_short_frames() -> None:
    to_us = ETH + encode_packet(
        IlnpPacket(ILV(LOC_A, NID_A), ILV(IDENTIFIER_PREFIX, NID_B), 17, bytes(12), None)
    )
    assert run_classic_bpf(ring_filter(NID_B), to_us) == 0
    assert run_classic_bpf(ring_filter(NID_B), to_us[:50]) == 0


class _RefusingMap:
    """Stands for the peer map: refuses every write with ``err``, records deletes."""

    def __init__(self, err: int) -> None:
        self.err = err
        self.deleted: list[bytes] = []

    def update(self, key: bytes, value: bytes) -> None:
        raise LibbpfError("bpf_map_update_elem(ilnp_peers)", self.err)

    def delete(self, key: bytes) -> bool:
        self.deleted.append(key)
        return True


@pytest.mark.parametrize(
    ("err", "counter"), [(errno.E2BIG, "map_full"), (errno.ENOMEM, "update_errors")]
)
def test_refused_write_keeps_the_entry_in_user_space_and_drops_a_stale_copy(
    err: int, counter: str
) -> None:
    _a, b, entry = _pair()
    fp = FastPath(nid=NID_B, prefix=IDENTIFIER_PREFIX, tun="", links=(), on_active=lambda *_: None)
    refusing = _RefusingMap(err)
    fp._peers = refusing  # type: ignore[assignment]
    record = peer_record(entry, b.config, lambda _loc: 1)
    fp.update(NID_A, record)  # no copy yet: nothing to take out
    assert fp.stats[counter] == 1
    assert fp.installed == set()
    assert refusing.deleted == []
    fp.installed.add(NID_A)  # as if an earlier write had gone through
    fp.update(NID_A, record)
    assert fp.stats[counter] == 2
    assert fp.installed == set()
    assert refusing.deleted == [struct.pack("<Q", NID_A)]


@pytest.mark.root
def test_ingress_reports_the_peer_heard_and_the_host_keeps_its_session() -> None:
    """A packet taken by the kernel from the peer is reported as *heard*: the host then
    never takes a packet with another nonce for a restart (issue 12 #3)."""
    reports: list[tuple[int, bool]] = []
    fp = FastPath(
        nid=NID_B,
        prefix=IDENTIFIER_PREFIX,
        tun="",
        links=(),
        on_active=lambda nid, heard: reports.append((nid, heard)),
    )
    fp.load(tun_ifindex=1)
    try:
        fp.set_locators([LOC_B])
        now = time.monotonic()
        a, b, entry = _pair(now=now)
        fp.update(NID_A, peer_record(entry, b.config, lambda _loc: 1))
        run = fp.program("ilnp_ingress").test_run(ETH + _wire(a, b"x", now))
        assert run.retval == TC_ACT_REDIRECT
        assert fp.drain() == 1
    finally:
        fp.close()
    assert reports == [(NID_A, True)]
    later = now + 10 * b.config.restart_grace
    b.mark_used(NID_A, later, heard=True)
    forged = decode_packet(_wire(a, b"y", later))
    b.receive(encode_packet(replace(forged, nonce=Nonce(bytes(4)))), later + 0.5)
    assert b.counters["nonce_mismatch"] == 1
    assert b.ilcc.get(NID_A) is entry


def test_a_newcomer_gets_its_kernel_copy_with_its_second_packet() -> None:
    """A crowd of one-packet senders costs no map write each: B (policy none) adopts A
    on its first packet but reports A for the kernel only with the second; an entry B
    started itself (a resolved name) is reported at once."""
    a, b = _host(NID_A, LOC_A), _host(NID_B, LOC_B)
    b.take_touched()
    a.add_correspondent(NID_B, (LocatorEntry(LOC_B),), 0.0)
    assert _deliver(b, _wire(a, b"one", 0.0), 0.0) is not None
    entry = b.ilcc.get(NID_A)
    assert entry is not None
    assert peer_record(entry, b.config, lambda _loc: 1) is None
    b.take_touched()
    assert _deliver(b, _wire(a, b"two", 0.1), 0.1) is not None
    assert b.take_touched() == {NID_A}
    assert peer_record(entry, b.config, lambda _loc: 1) is not None
    started = a.ilcc.get(NID_B)
    assert started is not None
    assert peer_record(started, a.config, lambda _loc: 1) is not None
