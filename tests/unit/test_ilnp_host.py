"""IlnpHost: two in-memory hosts under a fake clock, Locator Updates, forged updates,
admission policies under a random-NID flood, Parameter Problem fallback."""

from __future__ import annotations

import itertools
import random
import struct
from collections.abc import Callable

import pytest

from sixlab.ilnp import (
    Adopted,
    Deliver,
    Dropped,
    DropReason,
    EntryState,
    Event,
    HostConfig,
    IlnpHost,
    LocatorUpdateAcked,
    LocatorUpdateFailed,
    PeerLocatorsChanged,
    PeerNotIlnp,
    Removed,
    create_policy,
)
from sixlab.wire.ilnp import (
    IDENTIFIER_PREFIX,
    ILV,
    IlnpPacket,
    LocatorEntry,
    LocatorUpdate,
    LuOperation,
    Nonce,
    decode_packet,
    encode_locator_update,
    encode_packet,
    ipv6_checksum,
    nid_checksum,
)

A_NID, B_NID, M_NID = 0xA, 0xB, 0xE71
LOC_A1, LOC_A2, LOC_B = 0x2001_0DB8_000A_0001, 0x2001_0DB8_000A_0002, 0x2001_0DB8_000B_0001


def counting_nonces() -> Callable[[int], bytes]:
    counter = itertools.count(1)
    return lambda n: next(counter).to_bytes(n, "big")


def make_host(nid: int, loc: int, store: str = "hash", **kw: object) -> IlnpHost:
    policy = kw.pop("policy", None)
    config = HostConfig(nid, (LocatorEntry(loc, 10, 600),), **kw)  # type: ignore[arg-type]
    source = counting_nonces()
    return IlnpHost(config, policy=policy, store=store, nonce_source=source)  # type: ignore[arg-type]


def udp(src_nid: int, dst_nid: int, sport: int, dport: int, data: bytes) -> bytes:
    """An application packet on identifier addresses with a correct UDP checksum."""
    length = 8 + len(data)
    raw = struct.pack("!HHHH", sport, dport, length, 0) + data
    csum = nid_checksum(src_nid, dst_nid, 17, raw) or 0xFFFF
    raw = raw[:6] + struct.pack("!H", csum) + raw[8:]
    return encode_packet(
        IlnpPacket(ILV(IDENTIFIER_PREFIX, src_nid), ILV(IDENTIFIER_PREFIX, dst_nid), 17, raw)
    )


def events(host: IlnpHost) -> list[Event]:
    out = []
    while (event := host.next_event()) is not None:
        out.append(event)
    return out


def deliver(src: IlnpHost, dst: IlnpHost, now: float, drop: int = 0) -> list[bytes]:
    """Move src's queued packets to dst, losing the first ``drop`` of them."""
    sent = src.datagrams_to_send()
    for packet in sent[drop:]:
        dst.receive(packet, now)
    return sent


def pair(store: str = "hash") -> tuple[IlnpHost, IlnpHost]:
    a = make_host(A_NID, LOC_A1, store)
    b = make_host(B_NID, LOC_B, store)
    a.add_correspondent(B_NID, [LocatorEntry(LOC_B, 10, 600)], now=0.0)
    return a, b


def test_first_packet_carries_nonce_and_is_delivered_on_identifier_addresses() -> None:
    a, b = pair()
    app = udp(A_NID, B_NID, 5000, 7, b"ping")
    a.send(app, now=0.0)
    (wire,) = a.datagrams_to_send()
    packet = decode_packet(wire)
    assert packet.src == ILV(LOC_A1, A_NID)
    assert packet.dst == ILV(LOC_B, B_NID)
    assert packet.nonce is not None
    b.receive(wire, now=0.1)
    got = [e for e in events(b) if isinstance(e, Deliver)]
    assert got == [Deliver(app, A_NID)]  # byte-identical: checksum untouched
    inner = decode_packet(got[0].packet)
    pseudo = ipv6_checksum(inner.src.packed, inner.dst.packed, 17, inner.payload)
    assert pseudo == 0  # the checksum verifies over identifier addresses


def test_nonce_stops_after_peer_answers_unless_always() -> None:
    a, b = pair()
    a.send(udp(A_NID, B_NID, 5000, 7, b"1"), 0.0)
    deliver(a, b, 0.0)
    b.send(udp(B_NID, A_NID, 7, 5000, b"r"), 0.1)
    deliver(b, a, 0.1)
    a.send(udp(A_NID, B_NID, 5000, 7, b"2"), 0.2)
    (wire,) = a.datagrams_to_send()
    assert decode_packet(wire).nonce is None
    b.receive(wire, 0.2)
    assert isinstance(events(b)[-1], Deliver)

    always = make_host(A_NID, LOC_A1, always_carry_nonce=True)
    always.add_correspondent(B_NID, [LocatorEntry(LOC_B)], 0.0)
    for t in range(3):
        always.send(udp(A_NID, B_NID, 5000, 7, b"x"), float(t))
    assert all(decode_packet(p).nonce is not None for p in always.datagrams_to_send())


def test_wrong_nonce_and_unknown_locator_are_dropped_and_counted() -> None:
    a, b = pair()
    a.send(udp(A_NID, B_NID, 5000, 7, b"1"), 0.0)
    deliver(a, b, 0.0)
    good = decode_packet(encode_packet(decode_packet(udp(A_NID, B_NID, 5000, 7, b"z"))))
    forged = IlnpPacket(ILV(LOC_A1, A_NID), ILV(LOC_B, B_NID), 17, good.payload, Nonce(b"evil"))
    b.receive(encode_packet(forged), 1.0)
    moved = IlnpPacket(ILV(LOC_A2, A_NID), ILV(LOC_B, B_NID), 17, good.payload)
    b.receive(encode_packet(moved), 1.0)
    assert b.counters[DropReason.NONCE_MISMATCH] == 1
    assert b.counters[DropReason.UNKNOWN_LOCATOR] == 1
    assert [e.reason for e in events(b) if isinstance(e, Dropped)] == [
        DropReason.NONCE_MISMATCH,
        DropReason.UNKNOWN_LOCATOR,
    ]


@pytest.mark.parametrize("store", ["hash", "linear"])
def test_locator_update_with_lost_first_advertisement(store: str) -> None:
    a, b = pair(store)
    a.send(udp(A_NID, B_NID, 5000, 7, b"hello"), 0.0)
    deliver(a, b, 0.0)
    b.send(udp(B_NID, A_NID, 7, 5000, b"hi"), 0.1)
    deliver(b, a, 0.1)

    a.set_local_locators([LocatorEntry(LOC_A2, 5, 600)], now=10.0)
    assert a.ilcc.get(B_NID) is not None
    assert a.ilcc.get(B_NID).state is EntryState.LU_PENDING  # type: ignore[union-attr]
    lost = deliver(a, b, 10.0, drop=1)  # the first advertisement is lost
    assert len(lost) == 1
    assert a.get_timer() == pytest.approx(11.0)
    a.handle_timer(11.0)  # retransmission
    (retry,) = deliver(a, b, 11.0)
    lu = decode_packet(retry)
    assert lu.nonce is not None
    assert lu.src == ILV(LOC_A2, A_NID)
    assert any(isinstance(e, PeerLocatorsChanged) for e in events(b))
    assert [p.locator for p in b.ilcc.get(A_NID).locators] == [LOC_A2]  # type: ignore[union-attr]
    deliver(b, a, 11.1)  # the acknowledgement
    assert LocatorUpdateAcked(B_NID) in events(a)
    assert a.ilcc.get(B_NID).state is EntryState.ACTIVE  # type: ignore[union-attr]
    assert a.counters["lu_retransmitted"] == 1

    # Traffic now flows from the new locator and B answers to it.
    a.send(udp(A_NID, B_NID, 5000, 7, b"after move"), 12.0)
    deliver(a, b, 12.0)
    b.send(udp(B_NID, A_NID, 7, 5000, b"ok"), 12.1)
    (reply,) = deliver(b, a, 12.1)
    assert decode_packet(reply).dst == ILV(LOC_A2, A_NID)
    assert isinstance(events(a)[-1], Deliver)


def test_locator_update_gives_up_after_bounded_tries() -> None:
    a, b = pair()
    a.send(udp(A_NID, B_NID, 5000, 7, b"1"), 0.0)
    deliver(a, b, 0.0)
    a.set_local_locators([LocatorEntry(LOC_A2)], now=1.0)
    now = 1.0
    while (timer := a.get_timer()) is not None and timer < 100.0:
        now = timer
        a.handle_timer(now)
    assert len(a.datagrams_to_send()) == a.config.lu_max_tries
    assert LocatorUpdateFailed(B_NID) in events(a)


def test_forged_locator_update_from_third_host_is_refused() -> None:
    a, b = pair()
    a.send(udp(A_NID, B_NID, 5000, 7, b"1"), 0.0)
    deliver(a, b, 0.0)
    mallory_loc = 0x2001_0DB8_0666_0001
    lu = LocatorUpdate(LuOperation.ADVERTISEMENT, (LocatorEntry(mallory_loc),))
    src, dst = ILV(mallory_loc, A_NID), ILV(LOC_B, B_NID)
    body = encode_locator_update(lu, src.packed, dst.packed)
    for nonce in (None, Nonce(b"gues")):
        b.receive(encode_packet(IlnpPacket(src, dst, 58, body, nonce)), 1.0)
    assert b.counters[DropReason.LU_BAD_NONCE] == 2
    assert [p.locator for p in b.ilcc.get(A_NID).locators] == [LOC_A1]  # type: ignore[union-attr]
    assert b.datagrams_to_send() == []


def test_parameter_problem_marks_peer_non_ilnp_and_falls_back() -> None:
    a, _ = pair()
    app = udp(A_NID, B_NID, 5000, 7, b"1")
    a.send(app, 0.0)
    (wire,) = a.datagrams_to_send()
    # A plain IPv6 node: option 0x8B unknown -> Parameter Problem code 2, pointer 42.
    icmp = struct.pack("!BBHI", 4, 2, 0, 42) + wire
    forged = bytearray(icmp)
    forged[8 + 44] ^= 0xFF  # an off-path forger does not know our nonce
    a.receive(
        encode_packet(IlnpPacket(ILV(LOC_B, B_NID), ILV(LOC_A1, A_NID), 58, bytes(forged))), 0.05
    )
    assert a.counters[DropReason.NONCE_MISMATCH] == 1
    assert a.ilcc.get(B_NID).state is EntryState.ACTIVE  # type: ignore[union-attr]
    a.receive(encode_packet(IlnpPacket(ILV(LOC_B, B_NID), ILV(LOC_A1, A_NID), 58, icmp)), 0.1)
    assert PeerNotIlnp(B_NID) in events(a)
    a.send(app, 0.2)
    (plain,) = a.datagrams_to_send()
    packet = decode_packet(plain)
    assert packet.nonce is None
    # The checksum now verifies for a plain IPv6 receiver on the real addresses.
    assert ipv6_checksum(packet.src.packed, packet.dst.packed, 17, packet.payload) == 0


def flood(host: IlnpHost, count: int, seed: int = 1, *, gap: float = 0.001) -> None:
    rng = random.Random(seed)
    for i in range(count):
        nid = rng.getrandbits(64)
        payload = struct.pack("!HHHH", 40000, 7, 12, 0) + b"echo"
        packet = IlnpPacket(
            ILV(0x2001_0DB8_00FF_0000 + i % 7, nid),
            ILV(host.local_locator, host.config.nid),
            17,
            payload,
            Nonce(rng.randbytes(4)),
        )
        host.receive(encode_packet(packet), now=i * gap)


class FakeSockets:
    def __init__(self, listening: set[int], connected: set[tuple[int, int, int]]) -> None:
        self.listening = listening
        self.connected = connected

    def has_connected(
        self, protocol: int, local_port: int, remote_nid: int, remote_port: int
    ) -> bool:
        return (local_port, remote_nid, remote_port) in self.connected

    def is_listening(self, protocol: int, local_port: int) -> bool:
        return local_port in self.listening


@pytest.mark.parametrize("store", ["hash", "linear"])
def test_flood_grows_ilcc_with_none_policy(store: str) -> None:
    host = make_host(B_NID, LOC_B, store, policy=create_policy("none"))
    flood(host, 300)
    assert len(host.ilcc) == 300
    assert host.counters["delivered"] == 300


def test_flood_leaves_ilcc_empty_with_socket_policy_and_replies_work() -> None:
    sockets = FakeSockets(listening={7}, connected=set())
    host = make_host(B_NID, LOC_B, policy=create_policy("socket", sockets=sockets))
    flood(host, 300)
    assert len(host.ilcc) == 0
    assert host.counters["not_adopted_unconnected_socket"] == 300
    assert host.reply_table_size <= host.config.reply_capacity
    # A non-connected echo server answers one of the (recent) clients.
    client = [e for e in events(host) if isinstance(e, Deliver)][-1]
    request = decode_packet(client.packet)
    host.send(udp(B_NID, request.src.nid, 7, 40000, b"echo"), now=0.5)
    (reply,) = host.datagrams_to_send()
    out = decode_packet(reply)
    assert out.dst.nid == request.src.nid
    assert out.nonce is not None
    assert len(host.ilcc) == 0


def test_socket_policy_adopts_connected_flow_only() -> None:
    sockets = FakeSockets(listening=set(), connected={(7, A_NID, 5000)})
    b = make_host(B_NID, LOC_B, policy=create_policy("socket", sockets=sockets))
    a = make_host(A_NID, LOC_A1)
    a.add_correspondent(B_NID, [LocatorEntry(LOC_B)], 0.0)
    a.send(udp(A_NID, B_NID, 5000, 7, b"1"), 0.0)
    a.send(udp(A_NID, B_NID, 5001, 7, b"2"), 0.0)
    deliver(a, b, 0.0)
    assert len(b.ilcc) == 1
    assert Adopted(A_NID, "connected_socket") in events(b)
    assert b.counters["delivered"] == 2


def test_no_socket_at_all_is_counted_separately() -> None:
    host = make_host(
        B_NID, LOC_B, policy=create_policy("socket", sockets=FakeSockets(set(), set()))
    )
    flood(host, 20)
    assert len(host.ilcc) == 0
    assert host.counters["not_adopted_no_socket"] == 20


def test_flood_stays_under_cap_with_bounded_policy_and_idle_entries_expire() -> None:
    host = make_host(B_NID, LOC_B, policy=create_policy("bounded", capacity=50, idle_timeout=5.0))
    flood(host, 300, gap=0.01)  # 100 newcomers a second for 3 s
    assert len(host.ilcc) == 50
    # Past the cap, a newcomer evicts an entry at least ACTIVE_WINDOW old, or is refused.
    assert host.counters["removed_evicted"] == 50
    assert host.counters["not_adopted_all_active"] == 200
    timer = host.get_timer()
    assert timer is not None
    host.handle_timer(10.0)
    assert len(host.ilcc) == 0


def test_unknown_peer_without_nonce_is_dropped() -> None:
    host = make_host(B_NID, LOC_B)
    raw = encode_packet(IlnpPacket(ILV(LOC_A1, A_NID), ILV(LOC_B, B_NID), 17, b"\0" * 8))
    host.receive(raw, 0.0)
    assert host.counters[DropReason.NO_NONCE] == 1
    host.receive(encode_packet(IlnpPacket(ILV(LOC_A1, A_NID), ILV(LOC_B, 99), 17, b"")), 0.0)
    assert host.counters[DropReason.NOT_FOR_US] == 1
    host.receive(b"\x60garbage", 0.0)
    assert host.counters[DropReason.MALFORMED] == 1


def test_send_without_route_or_identifier_addresses_is_dropped() -> None:
    host = make_host(A_NID, LOC_A1)
    host.send(udp(A_NID, 0x77, 1, 2, b""), 0.0)
    assert host.counters[DropReason.NO_ROUTE] == 1
    host.send(encode_packet(IlnpPacket(ILV(1, A_NID), ILV(1, 2), 17, b"")), 0.0)
    assert host.counters[DropReason.NOT_IDENTIFIER] == 1


def trace(store: str) -> list[object]:
    """Run one scripted scenario and record every observable output."""
    a, b = pair(store)
    log: list[object] = []
    script: list[Callable[[float], object]] = [
        lambda t: a.send(udp(A_NID, B_NID, 5000, 7, b"1"), t),
        lambda t: deliver(a, b, t),
        lambda t: b.send(udp(B_NID, A_NID, 7, 5000, b"2"), t),
        lambda t: deliver(b, a, t),
        lambda t: a.set_local_locators([LocatorEntry(LOC_A2)], t),
        lambda t: deliver(a, b, t, drop=1),
        a.handle_timer,
        lambda t: deliver(a, b, t),
        lambda t: deliver(b, a, t),
        lambda t: flood(b, 20),
    ]
    for step, action in enumerate(script):
        action(float(step))
        log.extend(events(a) + events(b))
    log.append(sorted(a.counters.items()))
    log.append(sorted(b.counters.items()))
    log.append(len(b.ilcc))
    return log


def test_linear_and_hash_stores_behave_identically() -> None:
    assert trace("hash") == trace("linear")


def test_take_touched_reports_every_ilcc_change_once() -> None:
    a, b = pair()
    assert a.take_touched() == {B_NID}  # the first call: a full sync of what is there
    assert a.take_touched() == set()
    assert b.take_touched() == set()

    a.send(udp(A_NID, B_NID, 5000, 7, b"1"), 0.0)
    deliver(a, b, 0.0)
    assert b.take_touched() == {A_NID}  # adopted
    assert a.take_touched() == set()  # sending changed nothing a mirror holds

    b.send(udp(B_NID, A_NID, 7, 5000, b"2"), 0.1)
    deliver(b, a, 0.1)
    assert a.ilcc.get(B_NID).peer_nonce is not None  # type: ignore[union-attr]
    assert a.take_touched() == {B_NID}  # B's nonce learned (and ours no longer carried)
    a.send(udp(A_NID, B_NID, 5000, 7, b"3"), 0.2)
    deliver(a, b, 0.2)
    assert b.take_touched() == {A_NID}  # A answered B: B stops carrying its nonce
    b.send(udp(B_NID, A_NID, 7, 5000, b"4"), 0.3)
    deliver(b, a, 0.3)
    assert a.take_touched() == set()  # a data packet of an established session: nothing

    a.set_local_locators([LocatorEntry(LOC_A2, 5, 600)], now=1.0)
    assert a.take_touched() == {B_NID}  # local locator change, LU pending
    deliver(a, b, 1.0)
    assert b.take_touched() == {A_NID}  # the peer's Locator Update
    deliver(b, a, 1.1)
    assert a.ilcc.get(B_NID).state is EntryState.ACTIVE  # type: ignore[union-attr]
    assert a.take_touched() == {B_NID}  # acknowledged

    a.send(udp(A_NID, B_NID, 5000, 7, b"5"), 600.5)  # B's locator (600 s from t=0) ages
    assert a.take_touched() == {B_NID}
    a.handle_timer(600.5)  # already aged: nothing new
    assert a.take_touched() == set()
    a.handle_timer(700.0)  # and expires with its grace: the entry goes
    assert a.ilcc.get(B_NID) is None
    assert a.take_touched() == {B_NID}
    assert a.take_touched() == set()


def test_take_touched_reports_added_correspondent_and_timer_aging() -> None:
    a, _ = pair()
    a.take_touched()
    a.add_correspondent(M_NID, [LocatorEntry(LOC_B, 0, 5)], now=0.0)
    assert a.take_touched() == {M_NID}
    a.handle_timer(5.0)
    assert a.take_touched() == {M_NID}  # its only locator aged


def test_take_touched_reports_a_nonce_learned_alone() -> None:
    a, b = pair()
    a.send(udp(A_NID, B_NID, 5000, 7, b"1"), 0.0)
    deliver(a, b, 0.0)
    # A moves (A1 stays ours, A2 preferred); its advertisement is lost.
    a.set_local_locators([LocatorEntry(LOC_A1, 10, 600), LocatorEntry(LOC_A2, 5, 600)], 1.0)
    deliver(a, b, 1.0, drop=1)
    a.take_touched()
    b.send(udp(B_NID, A_NID, 7, 5000, b"2"), 1.1)
    deliver(b, a, 1.1)  # to A1, with B's nonce
    entry = a.ilcc.get(B_NID)
    assert entry is not None
    assert entry.peer_nonce is not None
    assert entry.carry_nonce  # LU pending: only the nonce changed
    assert a.take_touched() == {B_NID}


def test_take_touched_reports_late_adoption_and_non_ilnp_peer() -> None:
    sockets = FakeSockets(listening={7}, connected=set())
    b = make_host(B_NID, LOC_B, policy=create_policy("socket", sockets=sockets))
    b.take_touched()
    a = make_host(A_NID, LOC_A1)
    a.add_correspondent(B_NID, [LocatorEntry(LOC_B)], 0.0)
    a.send(udp(A_NID, B_NID, 5000, 7, b"1"), 0.0)
    deliver(a, b, 0.0)
    assert len(b.ilcc) == 0
    assert b.take_touched() == set()  # the reply table is not the ILCC
    sockets.connected.add((7, A_NID, 5000))
    a.send(udp(A_NID, B_NID, 5000, 7, b"2"), 1.0)
    deliver(a, b, 1.0)
    assert b.counters["adopted_late"] == 1
    assert b.take_touched() == {A_NID}

    a.take_touched()
    a.send(udp(A_NID, B_NID, 5000, 7, b"3"), 2.0)
    (wire,) = a.datagrams_to_send()
    icmp = struct.pack("!BBHI", 4, 2, 0, 42) + wire  # Parameter Problem at our nonce
    a.receive(encode_packet(IlnpPacket(ILV(LOC_B, B_NID), ILV(LOC_A1, A_NID), 58, icmp)), 2.1)
    assert a.ilcc.get(B_NID).state is EntryState.NON_ILNP  # type: ignore[union-attr]
    assert a.take_touched() == {B_NID}


def test_take_touched_reports_eviction_by_policy() -> None:
    host = make_host(B_NID, LOC_B, policy=create_policy("bounded", capacity=2, idle_timeout=5.0))
    host.take_touched()
    flood(host, 3, gap=1.0)
    (evicted,) = {e.peer_nid for e in events(host) if isinstance(e, Removed)}
    touched = host.take_touched()
    assert len(touched) == 3
    assert evicted in touched
    host.handle_timer(10.0)  # both remaining entries idle out
    assert host.take_touched() == touched - {evicted}
    assert len(host.ilcc) == 0


def test_reply_table_refresh_keeps_expiry_order() -> None:
    sockets = FakeSockets(listening={7}, connected=set())
    host = make_host(B_NID, LOC_B, policy=create_policy("socket", sockets=sockets))
    ttl = host.config.reply_ttl

    def hello(nid: int, now: float) -> None:
        payload = struct.pack("!HHHH", 40000, 7, 12, 0) + b"echo"
        packet = IlnpPacket(ILV(LOC_A1, nid), ILV(LOC_B, B_NID), 17, payload, Nonce(b"\0\0\0\1"))
        host.receive(encode_packet(packet), now)

    hello(A_NID, 0.0)
    hello(M_NID, 1.0)
    hello(A_NID, 2.0)  # refreshed: now expires after M's
    assert host.reply_table_size == 2
    assert host.get_timer() == 1.0 + ttl
    host.handle_timer(1.0 + ttl)
    assert not host.can_reach(M_NID, 1.0 + ttl)
    assert host.can_reach(A_NID, 1.0 + ttl)
    assert host.get_timer() == 2.0 + ttl
    host.handle_timer(2.0 + ttl)
    assert host.reply_table_size == 0
    assert host.get_timer() is None


@pytest.mark.parametrize("late", ["locator_update", "param_problem", "move"])
def test_entry_expired_on_the_data_path_is_removed_at_once(late: str) -> None:
    a, b = pair()
    a.send(udp(A_NID, B_NID, 5000, 7, b"1"), 0.0)
    (first,) = deliver(a, b, 0.0)
    b.send(udp(B_NID, A_NID, 7, 5000, b"2"), 0.1)
    deliver(b, a, 0.1)
    events(a)
    # No timer ran since: sending at 700 s finds B's only locator (600 s) past its grace.
    a.send(udp(A_NID, B_NID, 5000, 7, b"3"), 700.0)
    assert a.counters[DropReason.NO_ROUTE] == 1
    assert a.ilcc.get(B_NID) is None
    assert Removed(B_NID, "locators_expired") in events(a)
    # A late packet finds no entry: nothing meets an EXPIRED entry (its state table has
    # no row for these events).
    if late == "locator_update":
        b.set_local_locators([LocatorEntry(0x2001_0DB8_000B_0002)], 700.1)
        deliver(b, a, 700.1)
        assert a.counters[DropReason.LU_UNKNOWN_PEER] == 1
    elif late == "param_problem":
        icmp = struct.pack("!BBHI", 4, 2, 0, 42) + first
        wire = encode_packet(IlnpPacket(ILV(LOC_B, B_NID), ILV(LOC_A1, A_NID), 58, icmp))
        a.receive(wire, 700.1)
        assert a.counters["param_problem_ignored"] == 1
    else:
        a.set_local_locators([LocatorEntry(LOC_A2)], 700.1)
        assert a.datagrams_to_send() == []
    assert a.get_timer() is None


def established() -> tuple[IlnpHost, IlnpHost]:
    """A and B after one exchange each way: both know both nonces."""
    a, b = pair()
    a.send(udp(A_NID, B_NID, 5000, 7, b"hello"), 0.0)
    deliver(a, b, 0.0)
    b.send(udp(B_NID, A_NID, 7, 5000, b"hi"), 0.1)
    deliver(b, a, 0.1)
    events(a)
    events(b)
    return a, b


def restarted_a() -> IlnpHost:
    """A again after a restart: same NID and locator, no state, other nonces."""
    config = HostConfig(A_NID, (LocatorEntry(LOC_A1, 10, 600),))
    fresh = itertools.count(1000)
    return IlnpHost(config, nonce_source=lambda n: next(fresh).to_bytes(n, "big"))


def test_restarted_peer_gets_a_new_session_once_its_old_one_is_silent() -> None:
    """Issue 12 #3: B keeps A's old nonce; A restarts with a new one. B drops it while
    A's old session was heard recently (an off-path forger cannot reset a live
    session), then takes the new nonce as a new session and both directions work."""
    _, b = established()
    a = restarted_a()
    a.add_correspondent(B_NID, [LocatorEntry(LOC_B, 10, 600)], now=1.0)
    a.send(udp(A_NID, B_NID, 5000, 7, b"again"), 1.0)
    deliver(a, b, 1.0)
    assert b.counters[DropReason.NONCE_MISMATCH] == 1
    assert not [e for e in events(b) if isinstance(e, Deliver)]
    later = 0.1 + b.config.restart_grace
    a.send(udp(A_NID, B_NID, 5000, 7, b"still there"), later)
    deliver(a, b, later)
    got = events(b)
    assert Removed(A_NID, "peer_restarted") in got
    assert [e.packet for e in got if isinstance(e, Deliver)] == [
        udp(A_NID, B_NID, 5000, 7, b"still there")
    ]
    entry = b.ilcc.get(A_NID)
    assert entry is not None
    assert entry.peer_nonce == a.ilcc.get(B_NID).local_nonce  # type: ignore[union-attr]
    b.send(udp(B_NID, A_NID, 7, 5000, b"welcome back"), later + 0.1)
    deliver(b, a, later + 0.1)
    assert [e.packet for e in events(a) if isinstance(e, Deliver)] == [
        udp(B_NID, A_NID, 7, 5000, b"welcome back")
    ]


def test_restart_guess_cannot_reset_a_session_the_kernel_hears() -> None:
    """A session carried by the fast path is heard through its activity reports
    (``mark_used(heard=True)``): a packet with another nonce never resets it."""
    _, b = established()
    forged = IlnpPacket(
        ILV(LOC_A1, A_NID),
        ILV(LOC_B, B_NID),
        17,
        decode_packet(udp(A_NID, B_NID, 5000, 7, b"x")).payload,
        Nonce(b"evil"),
    )
    for second in range(1, 30):
        b.mark_used(A_NID, float(second), heard=True)
        b.receive(encode_packet(forged), second + 0.5)
    assert b.counters[DropReason.NONCE_MISMATCH] == 29
    assert b.counters["removed_peer_restarted"] == 0


def test_ack_from_a_peer_added_by_name_is_taken_before_any_data() -> None:
    """Issue 12 #6: A added B by name (no nonce of B's yet); B heard A but never sent.
    A moves: B's acknowledgement teaches A B's nonce instead of being dropped, and the
    update completes. An ack from a locator not in B's set is still refused."""
    a, b = pair()
    a.send(udp(A_NID, B_NID, 5000, 7, b"hello"), 0.0)
    deliver(a, b, 0.0)
    assert a.ilcc.get(B_NID).peer_nonce is None  # type: ignore[union-attr]
    a.set_local_locators([LocatorEntry(LOC_A2, 5, 600)], now=1.0)
    deliver(a, b, 1.0)
    (ack,) = b.datagrams_to_send()
    spoofed = decode_packet(ack)
    elsewhere = IlnpPacket(
        ILV(0x2001_0DB8_0666_0001, B_NID),
        spoofed.dst,
        58,
        encode_locator_update(
            LocatorUpdate(LuOperation.ACKNOWLEDGEMENT, (LocatorEntry(LOC_A2, 5, 600),)),
            ILV(0x2001_0DB8_0666_0001, B_NID).packed,
            spoofed.dst.packed,
        ),
        spoofed.nonce,
    )
    a.receive(encode_packet(elsewhere), 1.05)
    assert a.counters[DropReason.LU_BAD_NONCE] == 1
    a.receive(ack, 1.1)
    assert LocatorUpdateAcked(B_NID) in events(a)
    entry = a.ilcc.get(B_NID)
    assert entry is not None
    assert entry.state is EntryState.ACTIVE
    assert entry.peer_nonce == b.ilcc.get(A_NID).local_nonce  # type: ignore[union-attr]
    assert a.counters[DropReason.LU_BAD_NONCE] == 1
    a.handle_timer(5.0)
    assert a.datagrams_to_send() == []  # no retransmission: the update is done


def test_bounded_never_evicts_a_correspondent_active_in_the_last_period() -> None:
    """Issue 12 #7: a fast-path peer is marked used once a second (the kernel's
    activity reports); 100 newcomers a second against a cap of 20 must not evict it."""
    host = make_host(B_NID, LOC_B, policy=create_policy("bounded", capacity=20, idle_timeout=60))
    a = make_host(A_NID, LOC_A1)
    a.add_correspondent(B_NID, [LocatorEntry(LOC_B, 10, 600)], now=0.0)
    a.send(udp(A_NID, B_NID, 5000, 7, b"hello"), 0.0)
    deliver(a, host, 0.0)
    assert host.ilcc.get(A_NID) is not None
    rng = random.Random(7)
    for tick in range(1000):  # 10 s
        now = tick * 0.01
        if tick % 100 == 0:
            host.mark_used(A_NID, now, heard=True)
        nid = rng.getrandbits(64) | 0x100
        payload = struct.pack("!HHHH", 40000, 7, 12, 0) + b"echo"
        packet = IlnpPacket(
            ILV(0x2001_0DB8_00FF_0000, nid), ILV(LOC_B, B_NID), 17, payload, Nonce(b"\1\2\3\4")
        )
        host.receive(encode_packet(packet), now)
    assert Removed(A_NID, "evicted") not in events(host)
    assert host.ilcc.get(A_NID) is not None
    assert len(host.ilcc) == 20
    assert host.counters["removed_evicted"] > 0  # newcomers still churn among themselves


def test_move_reaches_a_correspondent_answered_through_the_reply_table() -> None:
    """Issue 12 #4: B serves A with a non-connected socket (policy socket: A is not
    adopted, B answers through the reply table). B moves: A still gets B's Locator
    Update, acknowledges it, and sends to the new locator; an unanswered update is
    retransmitted and given up like an entry's."""
    sockets = FakeSockets(listening={7}, connected=set())
    b = make_host(B_NID, LOC_B, policy=create_policy("socket", sockets=sockets))
    a = make_host(A_NID, LOC_A1)
    a.add_correspondent(B_NID, [LocatorEntry(LOC_B, 10, 600)], now=0.0)
    a.send(udp(A_NID, B_NID, 5000, 7, b"ping"), 0.0)
    deliver(a, b, 0.0)
    b.send(udp(B_NID, A_NID, 7, 5000, b"pong"), 0.1)
    deliver(b, a, 0.1)
    assert len(b.ilcc) == 0
    assert b.reply_table_size == 1
    new_loc = 0x2001_0DB8_000B_0002
    b.set_local_locators([LocatorEntry(new_loc, 0, 600)], now=1.0)
    (lu,) = deliver(b, a, 1.0)
    assert decode_packet(lu).dst == ILV(LOC_A1, A_NID)
    assert PeerLocatorsChanged(B_NID, (LocatorEntry(new_loc, 0, 600),)) in events(a)
    deliver(a, b, 1.05)  # the acknowledgement
    assert LocatorUpdateAcked(A_NID) in events(b)
    b.handle_timer(2.0)
    assert b.datagrams_to_send() == []  # acknowledged: no retransmission
    a.send(udp(A_NID, B_NID, 5000, 7, b"after"), 3.0)
    (moved,) = deliver(a, b, 3.0)
    assert decode_packet(moved).dst == ILV(new_loc, B_NID)
    assert [e for e in events(b) if isinstance(e, Deliver)]

    # A second move that nobody acknowledges: retransmitted, then given up.
    b.set_local_locators([LocatorEntry(LOC_B, 0, 600)], now=4.0)
    now = 4.0
    while (timer := b.get_timer()) is not None and timer < 20.0:
        now = timer
        b.handle_timer(now)
    assert len(b.datagrams_to_send()) == b.config.lu_max_tries
    assert LocatorUpdateFailed(A_NID) in events(b)


def test_reply_table_correspondent_that_moves_is_acknowledged() -> None:
    """The other way round: A (B's client, not adopted by B) moves; B acknowledges
    from its reply table and answers at the new locator."""
    sockets = FakeSockets(listening={7}, connected=set())
    b = make_host(B_NID, LOC_B, policy=create_policy("socket", sockets=sockets))
    a = make_host(A_NID, LOC_A1)
    a.add_correspondent(B_NID, [LocatorEntry(LOC_B, 10, 600)], now=0.0)
    a.send(udp(A_NID, B_NID, 5000, 7, b"ping"), 0.0)
    deliver(a, b, 0.0)
    b.send(udp(B_NID, A_NID, 7, 5000, b"pong"), 0.1)
    deliver(b, a, 0.1)
    a.set_local_locators([LocatorEntry(LOC_A2, 0, 600)], now=1.0)
    deliver(a, b, 1.0)
    deliver(b, a, 1.05)
    assert LocatorUpdateAcked(B_NID) in events(a)
    b.send(udp(B_NID, A_NID, 7, 5000, b"to the new place"), 1.1)
    (reply,) = deliver(b, a, 1.1)
    assert decode_packet(reply).dst == ILV(LOC_A2, A_NID)


P_NID, LOC_P = 0xC, 0x2001_0DB8_000E_0000


def plain_udp(src: ILV, dst: ILV, sport: int, dport: int, data: bytes) -> bytes:
    """What a plain IPv6 node sends: no nonce, the checksum over the real addresses."""
    raw = struct.pack("!HHHH", sport, dport, 8 + len(data), 0) + data
    csum = ipv6_checksum(src.packed, dst.packed, 17, raw) or 0xFFFF
    return encode_packet(IlnpPacket(src, dst, 17, raw[:6] + struct.pack("!H", csum) + raw[8:]))


@pytest.mark.parametrize("policy", ["none", "socket"])
def test_plain_ipv6_node_reaches_an_ilnp_host_and_is_answered(policy: str) -> None:
    """Plain IPv6 interworking: P (no ILNP) sends to A's locator|NID address. A
    delivers it with the checksum fixed for identifier addresses, through the same
    admission policy, and answers without a nonce, checksummed for P's real addresses."""
    sockets = FakeSockets(listening={7}, connected=set())
    options = {"sockets": sockets} if policy == "socket" else {}
    a = make_host(A_NID, LOC_A1, policy=create_policy(policy, **options), always_carry_nonce=True)
    p, me = ILV(LOC_P, P_NID), ILV(LOC_A1, A_NID)
    for i in range(3):
        a.receive(plain_udp(p, me, 40000, 7, b"hi %d" % i), float(i))
        (got,) = [e for e in events(a) if isinstance(e, Deliver)]
        inner = decode_packet(got.packet)
        assert inner.src == ILV(IDENTIFIER_PREFIX, P_NID)
        assert ipv6_checksum(inner.src.packed, inner.dst.packed, 17, inner.payload) == 0
        a.send(udp(A_NID, P_NID, 7, 40000, b"ho %d" % i), i + 0.1)
        (out,) = a.datagrams_to_send()
        reply = decode_packet(out)
        assert reply.nonce is None
        assert (reply.src, reply.dst) == (me, p)
        assert ipv6_checksum(reply.src.packed, reply.dst.packed, 17, reply.payload) == 0
    assert len(a.ilcc) == (1 if policy == "none" else 0)
    assert a.counters[DropReason.NO_NONCE] == 0
    # A packet without nonce whose checksum fits neither is still refused.
    bad = bytearray(plain_udp(ILV(LOC_P, 0x99), me, 1, 7, b"x"))
    bad[-1] ^= 0xFF
    a.receive(bytes(bad), 5.0)
    assert a.counters[DropReason.NO_NONCE] == 1


def test_replies_of_a_peer_found_not_ilnp_are_delivered() -> None:
    """A sends to P with a nonce; P answers Parameter Problem; A goes plain, and P's
    (nonce-less) answers are delivered, checksum fixed, not dropped as no_nonce."""
    a = make_host(A_NID, LOC_A1, always_carry_nonce=True, require_nonce=True)
    a.add_correspondent(P_NID, [LocatorEntry(LOC_P, 0, 600)], now=0.0)
    a.send(udp(A_NID, P_NID, 5000, 7, b"1"), 0.0)
    (wire,) = a.datagrams_to_send()
    icmp = struct.pack("!BBHI", 4, 2, 0, 42) + wire
    a.receive(encode_packet(IlnpPacket(ILV(LOC_P, P_NID), ILV(LOC_A1, A_NID), 58, icmp)), 0.1)
    assert PeerNotIlnp(P_NID) in events(a)
    a.receive(plain_udp(ILV(LOC_P, P_NID), ILV(LOC_A1, A_NID), 7, 5000, b"answer"), 0.2)
    (got,) = [e for e in events(a) if isinstance(e, Deliver)]
    inner = decode_packet(got.packet)
    assert inner.payload[8:] == b"answer"
    assert ipv6_checksum(inner.src.packed, inner.dst.packed, 17, inner.payload) == 0
    assert a.counters[DropReason.NO_NONCE] == 0
