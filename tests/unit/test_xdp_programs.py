"""The XDP programs in the kernel, packet by packet, through ``BPF_PROG_TEST_RUN``.

The kernel runs the loaded program on a frame we build and hands back the verdict and
the frame as the program left it: no interface, no namespace. Replies are compared
byte for byte with what the Python reflector core and the ``socket`` plane would put on
the wire (``build_udp_packet`` with the Linux defaults: Hop Limit 64, flow label 0),
except T3, T2 and the UDP checksum that covers them; the checksum is verified instead.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from ipaddress import IPv6Address

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sixlab.dataplane.xdp_plane import (
    Reason,
    measure_tai_offset_ns,
    pack_config,
    pack_session,
    record_to_received,
    session_key,
)
from sixlab.linux import LinuxError, libbpf
from sixlab.linux.bpfbuild import build_objects
from sixlab.stamp.reflector import Reflector, ReflectorMode, ReflectorSessionConfig
from sixlab.wire import ChecksumError
from sixlab.wire import stamp as wire
from sixlab.wire.packet import build_udp_packet, parse_udp_packet
from sixlab.wire.timestamp import (
    ErrorEstimate,
    TimestampFormat,
    ns_from_ntp,
    ns_from_ptp,
    ntp_from_ns,
    ptp_from_ns,
)

pytestmark = pytest.mark.root

XDP_DROP, XDP_PASS, XDP_TX = 1, 2, 3
PORT = 862
SENDER = IPv6Address("2001:db8:1::1")
REFLECTOR = IPv6Address("2001:db8:2::2")
MAC_S = bytes.fromhex("020000000001")
MAC_R = bytes.fromhex("020000000002")
ETH_IPV6 = b"\x86\xdd"
EE = ErrorEstimate.for_error_ns(1000)
TAI_UTC = 37_000_000_000


@dataclass
class Loaded:
    obj: libbpf.BpfObject
    prog: libbpf.BpfProgram
    tai_offset: int
    keys: set[int] = field(default_factory=set)

    def add(self, cfg: ReflectorSessionConfig) -> None:
        """Write a reflector session, its reply counter from 0."""
        key = session_key(cfg.ssid)
        self.map("stamp_reflected").update(key, struct.pack("<Q", 0))
        self.keys.add(struct.unpack("<I", key)[0])
        self.map("stamp_sessions").update(key, pack_session(cfg))

    def map(self, name: str) -> libbpf.BpfMap:
        return self.obj.map(name)

    def reset(self) -> None:
        for name in ("stamp_counters", "stamp_sessions", "stamp_senders", "stamp_flows"):
            try:
                m = self.map(name)
            except LinuxError:  # each object has only its own maps
                continue
            for key in list(m.iter_keys()):
                m.delete(key)
        self.keys.clear()

    def counters(self) -> dict[tuple[int, str], int]:
        m = self.map("stamp_counters")
        out = {}
        for key in m.iter_keys():
            ssid, reason = struct.unpack("<II", key)
            slots = m.lookup_percpu(key) or []
            out[ssid, Reason(reason).label] = sum(struct.unpack("<Q", s)[0] for s in slots)
        for index in self.keys:
            slots = self.map("stamp_reflected").lookup_percpu(struct.pack("<I", index)) or []
            if n := sum(struct.unpack("<Q", s)[0] for s in slots):
                out[index, Reason.REFLECTED.label] = n
        return out


def _load(name: str) -> Iterator[Loaded]:
    obj = libbpf.BpfObject(build_objects()[name])
    obj.load()
    off = measure_tai_offset_ns()
    obj.map("stamp_cfg").update(bytes(4), pack_config(PORT, 64, off))
    try:
        yield Loaded(obj, obj.program(name), off)
    finally:
        obj.close()


@pytest.fixture(scope="module")
def _reflector_obj() -> Iterator[Loaded]:
    yield from _load("stamp_reflector")


@pytest.fixture
def refl(_reflector_obj: Loaded) -> Loaded:
    _reflector_obj.reset()
    return _reflector_obj


@pytest.fixture(scope="module")
def _collector_obj() -> Iterator[Loaded]:
    yield from _load("stamp_collector")


@pytest.fixture
def coll(_collector_obj: Loaded) -> Loaded:
    _collector_obj.reset()
    return _collector_obj


def frame(ip_packet: bytes, *, src_mac: bytes = MAC_S, dst_mac: bytes = MAC_R) -> bytes:
    return dst_mac + src_mac + ETH_IPV6 + ip_packet


def arrived(
    payload: bytes,
    *,
    hop_limit: int = 61,
    via: tuple[IPv6Address, ...] = (),
    sport: int = 40000,
    dport: int = PORT,
) -> bytes:
    """A sender packet as it reaches the reflector: an SRH (if any) at Segments Left 0."""
    segments = (*via, REFLECTOR) if via else None
    pkt = bytearray(
        build_udp_packet(
            SENDER, REFLECTOR, sport, dport, payload, hop_limit=hop_limit, segments=segments
        )
    )
    if segments:
        pkt[24:40] = REFLECTOR.packed  # the last End set the final destination...
        pkt[40 + 3] = 0  # ...and Segments Left 0
    return frame(bytes(pkt))


def sender_payload(
    seq: int, ssid: int, *, fmt: TimestampFormat = TimestampFormat.NTP, tlvs: bytes = b""
) -> bytes:
    now = time.time_ns()
    ts = ntp_from_ns(now) if fmt is TimestampFormat.NTP else ptp_from_ns(now + TAI_UTC)
    ee = ErrorEstimate.for_error_ns(1000, fmt=fmt)
    return wire.encode_sender(wire.SenderPacket(seq, ts, ee, ssid, tlvs))


def padding(n: int, flags: int = 0x80) -> bytes:
    """An Extra Padding TLV (RFC 8972 §4.1) of ``n`` value bytes."""
    return struct.pack("!BBH", flags, 1, n) + bytes(range(n % 256))[:n].ljust(n, b"\xa5")


def expected_reply(
    cfg: ReflectorSessionConfig, frames: list[bytes], hop_limits: list[int]
) -> list[bytes]:
    """What the Python core + socket plane send for each arrived frame, timestamps zeroed."""
    core = Reflector()
    if cfg.ssid is None:
        core.set_default(cfg)
    else:
        core.add_session(cfg)
    out = []
    for f, hop in zip(frames, hop_limits, strict=True):
        rx = parse_udp_packet(f[14:])
        refl = core.reflect(bytes(rx.payload), time.time_ns(), time.time_ns, hop)
        assert refl is not None
        segs = refl.return_path.segments
        path = None
        if segs:
            path = segs if segs[-1] == SENDER else (*segs, SENDER)
        pkt = build_udp_packet(
            REFLECTOR, SENDER, PORT, rx.src_port, refl.payload, hop_limit=64, segments=path
        )
        out.append(frame(pkt, src_mac=MAC_R, dst_mac=MAC_S))
    return out


def masked(f: bytes) -> bytes:
    """The frame with T3, T2 and the UDP checksum zeroed."""
    rx = parse_udp_packet(f[14:])
    b = bytearray(f)
    udp = len(f) - len(rx.payload) - 8
    b[udp + 6 : udp + 8] = b"\0\0"
    base = udp + 8
    b[base + 4 : base + 12] = bytes(8)
    b[base + 16 : base + 24] = bytes(8)
    return bytes(b)


def check_reply(out: bytes, expected: bytes, fmt: TimestampFormat, before: int, after: int) -> None:
    """Same bytes but T2/T3/checksum; a valid checksum; before <= T2 <= T3 <= after (UTC)."""
    assert masked(out) == masked(expected)
    rx = parse_udp_packet(out[14:], verify_checksum=True)
    pkt = wire.decode_reflector(bytes(rx.payload))
    if fmt is TimestampFormat.NTP:
        t2, t3 = ns_from_ntp(pkt.receive_timestamp), ns_from_ntp(pkt.timestamp)
    else:
        t2 = ns_from_ptp(pkt.receive_timestamp) - TAI_UTC
        t3 = ns_from_ptp(pkt.timestamp) - TAI_UTC
    # NTP's fraction rounds to nearest: a reading can land half a unit (<1 ns) off.
    assert before - 1 <= t2 <= t3 <= after + 1


def run(loaded: Loaded, data: bytes) -> libbpf.TestRun:
    return loaded.prog.test_run(data)


# ------------------------------------------------------------------------ reflector


@pytest.mark.parametrize("fmt", list(TimestampFormat))
@pytest.mark.parametrize("mode", list(ReflectorMode))
@pytest.mark.parametrize(
    "ret", [None, (IPv6Address("fc00::a"),), (IPv6Address("fc00::a"), IPv6Address("fc00::b"))]
)
@pytest.mark.parametrize("via", [(), (IPv6Address("fc00::1"),)])
def test_reflector_matches_python_core(
    refl: Loaded,
    fmt: TimestampFormat,
    mode: ReflectorMode,
    ret: tuple[IPv6Address, ...] | None,
    via: tuple[IPv6Address, ...],
) -> None:
    cfg = ReflectorSessionConfig(ssid=7, mode=mode, fmt=fmt, return_segments=ret)
    refl.add(cfg)
    hops = [61, 3, 255]
    frames = [
        arrived(sender_payload(seq, 7, fmt=fmt), hop_limit=h, via=via)
        for seq, h in zip((10, 11, 40), hops, strict=True)
    ]
    expected = expected_reply(cfg, frames, hops)
    for f, exp in zip(frames, expected, strict=True):
        before = time.time_ns()
        r = run(refl, f)
        after = time.time_ns()
        assert r.retval == XDP_TX
        check_reply(r.data, exp, fmt, before, after)
    assert refl.counters() == {(7, "reflected"): 3}


def test_reflector_default_session_and_return_list_ending_at_sender(refl: Loaded) -> None:
    cfg = ReflectorSessionConfig(ssid=None, return_segments=(IPv6Address("fc00::a"), SENDER))
    refl.add(cfg)
    f = arrived(sender_payload(3, 999))
    before = time.time_ns()
    r = run(refl, f)
    assert r.retval == XDP_TX
    check_reply(
        r.data, expected_reply(cfg, [f], [61])[0], TimestampFormat.NTP, before, time.time_ns()
    )
    srh = parse_udp_packet(r.data[14:]).srh
    assert srh is not None
    assert srh.travel_order == (IPv6Address("fc00::a"), SENDER)


@pytest.mark.parametrize("mode", list(ReflectorMode))
def test_reflector_default_only_skips_ssid_lookups_same_reply(
    refl: Loaded, mode: ReflectorMode
) -> None:
    """``default_only`` (no SSID session in the map): the default session's reply, unchanged."""
    cfg = ReflectorSessionConfig(ssid=None, mode=mode, return_segments=(IPv6Address("fc00::a"),))
    refl.add(cfg)
    frames = [
        arrived(sender_payload(5, 999, tlvs=padding(20)), hop_limit=9),
        arrived(sender_payload(6, 0), via=(IPv6Address("fc00::1"),)),
    ]
    expected = expected_reply(cfg, frames, [9, 61])
    cfg_map = refl.map("stamp_cfg")
    cfg_map.update(bytes(4), pack_config(PORT, 64, refl.tai_offset, default_only=True))
    try:
        for f, exp in zip(frames, expected, strict=True):
            before = time.time_ns()
            r = run(refl, f)
            assert r.retval == XDP_TX
            check_reply(r.data, exp, TimestampFormat.NTP, before, time.time_ns())
    finally:
        cfg_map.update(bytes(4), pack_config(PORT, 64, refl.tai_offset))
    assert refl.counters() == {(0x10000, "reflected"): 2}  # STAMP_DEFAULT_SSID


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seq=st.integers(0, 2**32 - 1),
    ssid=st.integers(0, 0xFFFF),
    pads=st.lists(st.integers(0, 64), max_size=4),
    hop=st.integers(1, 255),
    nret=st.integers(0, 8),
)
def test_reflector_differential_padding_tlvs(
    refl: Loaded, seq: int, ssid: int, pads: list[int], hop: int, nret: int
) -> None:
    """Any Extra Padding area and return list: the kernel's reply is the core's."""
    refl.reset()
    ret = tuple(IPv6Address(f"fc00::{i + 1:x}") for i in range(nret)) or None
    cfg = ReflectorSessionConfig(ssid=ssid, mode=ReflectorMode.STATEFUL, return_segments=ret)
    refl.add(cfg)
    f = arrived(sender_payload(seq, ssid, tlvs=b"".join(padding(n) for n in pads)), hop_limit=hop)
    exp = expected_reply(cfg, [f], [hop])[0]
    before = time.time_ns()
    r = run(refl, f)
    assert r.retval == XDP_TX
    check_reply(r.data, exp, TimestampFormat.NTP, before, time.time_ns())


def _counted(refl: Loaded, data: bytes, verdict: int, key: tuple[int, str]) -> None:
    """``data`` gets ``verdict`` and one more count under ``key``."""
    before = refl.counters().get(key, 0)
    r = run(refl, data)
    assert r.retval == verdict
    if verdict == XDP_PASS:
        assert r.data == data  # passed untouched
    assert refl.counters().get(key) == before + 1


NO_SSID = 0xFFFFFFFF


def test_reflector_drops_and_counts_malformed(refl: Loaded) -> None:
    cfg = ReflectorSessionConfig(ssid=7)
    refl.add(cfg)
    good = sender_payload(1, 7)
    # Truncated below Seq + Timestamp + Error Estimate (RFC 8762 §4.6): every length.
    for n in range(14):
        _counted(refl, arrived(good[:n]), XDP_DROP, (NO_SSID, "drop-too-short"))
    # Multiplier 0 (RFC 4656 §4.1.2).
    bad = bytearray(good)
    bad[13] = 0
    _counted(refl, arrived(bytes(bad)), XDP_DROP, (7, "drop-multiplier-zero"))
    # The frame cut short of the UDP Length.
    _counted(refl, arrived(good)[:-5], XDP_DROP, (NO_SSID, "drop-malformed"))


def test_reflector_passes_what_user_space_answers(refl: Loaded) -> None:
    refl.add(ReflectorSessionConfig(ssid=7))
    auth = ReflectorSessionConfig(ssid=9, key=b"k")
    refl.add(auth)
    apkt = wire.encode_sender(
        wire.SenderPacket(1, ntp_from_ns(time.time_ns()), EE, 9), authenticated=True
    )
    _counted(refl, arrived(apkt), XDP_PASS, (9, "pass-auth"))
    _counted(refl, arrived(sender_payload(1, 7)[:30]), XDP_PASS, (NO_SSID, "pass-short"))
    _counted(refl, arrived(sender_payload(1, 8)), XDP_PASS, (NO_SSID, "pass-no-session"))
    location = struct.pack("!BBHHH", 0x80, 2, 4, 0, 0)
    _counted(refl, arrived(sender_payload(1, 7, tlvs=location)), XDP_PASS, (7, "pass-tlv"))
    # A TLV whose Length runs past the end: the core marks it M.
    _counted(refl, arrived(sender_payload(1, 7, tlvs=padding(8)[:-2])), XDP_PASS, (7, "pass-tlv"))


def _flipped(data: bytes, offset: int, bit: int = 0x04) -> bytes:
    """``data`` with one bit flipped at ``offset`` and the UDP checksum left as it was."""
    b = bytearray(data)
    b[offset] ^= bit
    return bytes(b)


def _payload_offset(f: bytes) -> int:
    rx = parse_udp_packet(f[14:])
    return len(f) - len(rx.payload)


#: Sender packet fields (RFC 8762 §4.2.1) that a damaged bit must not carry into a reply:
#: Seq, T1, Error Estimate (its Multiplier), MBZ, the Extra Padding TLV's value; and one
#: bit of the IPv6 Source Address (pseudo-header) and of the Checksum field itself.
DAMAGED = {
    "seq": lambda f: _payload_offset(f) + 3,
    "t1": lambda f: _payload_offset(f) + 9,
    "multiplier": lambda f: _payload_offset(f) + 13,
    "mbz": lambda f: _payload_offset(f) + 20,
    "padding": lambda f: _payload_offset(f) + 44 + 4 + 5,
    "ipv6-source": lambda f: 14 + 8 + 15,
    "checksum": lambda f: _payload_offset(f) - 1,
}


@pytest.mark.parametrize("field", list(DAMAGED))
@pytest.mark.parametrize("via", [(), (IPv6Address("fc00::1"),)])
def test_reflector_never_answers_a_damaged_packet(
    refl: Loaded, field: str, via: tuple[IPv6Address, ...]
) -> None:
    """One bit flipped, checksum unchanged: passed untouched to the kernel and counted;
    the intact packet is answered as before, with the stateful Seq not used up."""
    cfg = ReflectorSessionConfig(ssid=7, mode=ReflectorMode.STATEFUL)
    refl.add(cfg)
    good = [arrived(sender_payload(seq, 7, tlvs=padding(12)), via=via) for seq in (1, 2)]
    bad = _flipped(good[0], DAMAGED[field](good[0]))
    with pytest.raises(ChecksumError):
        parse_udp_packet(bad[14:], verify_checksum=True)  # the damage is real
    _counted(refl, bad, XDP_PASS, (NO_SSID, "pass-bad-checksum"))
    assert refl.counters() == {(NO_SSID, "pass-bad-checksum"): 1}
    # The Python core answering both intact packets in turn: Seq 0, then 1.
    expected = expected_reply(cfg, good, [61, 61])
    for f, exp in zip(good, expected, strict=True):
        before = time.time_ns()
        r = run(refl, f)
        assert r.retval == XDP_TX
        check_reply(r.data, exp, TimestampFormat.NTP, before, time.time_ns())
    assert refl.counters() == {(NO_SSID, "pass-bad-checksum"): 1, (7, "reflected"): 2}


def test_reflector_bad_checksum_of_the_default_session_and_odd_length(refl: Loaded) -> None:
    """The default session (default_only: no SSID lookup) and an odd-length datagram,
    whose last byte is summed padded with zero (RFC 768)."""
    cfg = ReflectorSessionConfig(ssid=None)
    refl.add(cfg)
    cfg_map = refl.map("stamp_cfg")
    cfg_map.update(bytes(4), pack_config(PORT, 64, refl.tai_offset, default_only=True))
    try:
        good = arrived(sender_payload(1, 7, tlvs=padding(7)))
        assert len(good) % 2 == 1
        exp = expected_reply(cfg, [good], [61])[0]
        before = time.time_ns()
        r = run(refl, good)
        assert r.retval == XDP_TX
        check_reply(r.data, exp, TimestampFormat.NTP, before, time.time_ns())
        _counted(refl, _flipped(good, len(good) - 1), XDP_PASS, (NO_SSID, "pass-bad-checksum"))
    finally:
        cfg_map.update(bytes(4), pack_config(PORT, 64, refl.tai_offset))
    assert refl.counters() == {(NO_SSID, "pass-bad-checksum"): 1, (0x10000, "reflected"): 1}


def test_reflector_checksum_zero_is_left_to_the_kernel(refl: Loaded) -> None:
    refl.add(ReflectorSessionConfig(ssid=7))
    f = bytearray(arrived(sender_payload(1, 7)))
    udp = _payload_offset(bytes(f)) - 8
    f[udp + 6 : udp + 8] = b"\0\0"
    _counted(refl, bytes(f), XDP_PASS, (NO_SSID, "pass-checksum-zero"))


def test_reflector_leaves_other_traffic_alone(refl: Loaded) -> None:
    refl.add(ReflectorSessionConfig(None))
    payload = sender_payload(1, 7)
    others = [
        arrived(payload, dport=PORT + 1),  # another port
        arrived(payload, via=(IPv6Address("fc00::1"),))[:43] + b"\x01" + arrived(payload)[44:],
        frame(bytes.fromhex("6000000000083a40") + SENDER.packed + REFLECTOR.packed + bytes(8)),
        MAC_R + MAC_S + b"\x08\x00" + bytes(40),  # IPv4
        MAC_R + MAC_S + b"\x08\x06" + bytes(28),  # ARP
    ]
    # An SRH still in transit (Segments Left 1): the kernel's to forward.
    transit = bytearray(arrived(payload, via=(IPv6Address("fc00::1"),)))
    transit[14 + 40 + 3] = 1
    others.append(bytes(transit))
    for data in others:
        r = run(refl, data)
        assert r.retval == XDP_PASS
        assert r.data == data
    assert refl.counters() == {}


def test_reflector_fuzz_never_answers_garbage(refl: Loaded) -> None:
    """Random and mutated frames: PASS or DROP untouched, or a reply with a valid checksum
    to a frame whose own checksum verified."""
    import random  # noqa: PLC0415 - seeded local generator

    rng = random.Random(862)
    refl.add(ReflectorSessionConfig(None))
    base = arrived(sender_payload(1, 7, tlvs=padding(12)), via=(IPv6Address("fc00::1"),))
    for i in range(400):
        data = bytearray(base)
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(14, len(data))] = rng.randrange(256)
        # BPF_PROG_TEST_RUN wants at least an Ethernet header.
        cut = bytes(data[: rng.randint(14, len(data))]) if i % 3 == 0 else bytes(data)
        r = run(refl, cut)
        assert r.retval in (XDP_PASS, XDP_DROP, XDP_TX)
        if r.retval == XDP_TX:
            rx = parse_udp_packet(r.data[14:], verify_checksum=True)
            assert rx.dst_port == 40000 or rx.src_port == PORT
            # Answered only what arrived intact (or with its damage summed out).
            parse_udp_packet(cut[14:], verify_checksum=True)
        elif r.retval == XDP_PASS:
            assert r.data == cut


# ------------------------------------------------------------------------ collector


def test_collector_records_equal_the_socket_plane_view(coll: Loaded) -> None:
    coll.map("stamp_senders").update(struct.pack("<I", 7), struct.pack("<I", 1))
    records: list[bytes] = []
    ring = libbpf.RingBuffer(coll.map("stamp_records"), records.append)
    try:
        reply = wire.encode_reflector(
            wire.ReflectorPacket(
                4, ntp_from_ns(time.time_ns()), EE, 7, 123456789, 9, 987654321, EE, 58
            )
        )
        pkt = build_udp_packet(REFLECTOR, SENDER, PORT, PORT, reply, hop_limit=60)
        before = time.time_ns()
        r = run(coll, frame(pkt))
        after = time.time_ns()
        assert r.retval == XDP_DROP
        assert ring.consume() == 1
        rx = record_to_received(records[0], coll.tai_offset)
        assert rx.payload == reply
        assert (rx.src, rx.dst, rx.src_port, rx.dst_port, rx.hop_limit) == (
            REFLECTOR.packed,
            SENDER.packed,
            PORT,
            PORT,
            60,
        )
        assert before <= rx.rx_ns <= after
        # Not a session of ours, or with TLVs: left to the socket.
        other = build_udp_packet(REFLECTOR, SENDER, PORT, PORT, reply[:14] + b"\0\x08" + reply[16:])
        assert run(coll, frame(other)).retval == XDP_PASS
        tlv = build_udp_packet(REFLECTOR, SENDER, PORT, PORT, reply + padding(4))
        assert run(coll, frame(tlv)).retval == XDP_PASS
        assert ring.consume() == 0
        assert coll.counters() == {(7, "collected"): 1}
    finally:
        ring.free()


def _reply_frame(payload: bytes, via: tuple[IPv6Address, ...] = ()) -> bytes:
    """A reflector packet as it reaches the sender: an SRH (if any) at Segments Left 0."""
    segments = (*via, SENDER) if via else None
    pkt = bytearray(
        build_udp_packet(REFLECTOR, SENDER, PORT, PORT, payload, hop_limit=60, segments=segments)
    )
    if segments:
        pkt[24:40] = SENDER.packed
        pkt[40 + 3] = 0
    return frame(bytes(pkt))


@pytest.mark.parametrize("via", [(), (IPv6Address("fc00::1"),)])
def test_collector_records_no_damaged_reply(coll: Loaded, via: tuple[IPv6Address, ...]) -> None:
    """A reply with one bit flipped (T2, T1, Seq...) or a zero checksum is passed to the
    kernel, which drops it, and counted; nothing is recorded. The intact one is."""
    coll.map("stamp_senders").update(struct.pack("<I", 7), struct.pack("<I", 1))
    records: list[bytes] = []
    ring = libbpf.RingBuffer(coll.map("stamp_records"), records.append)
    try:
        reply = wire.encode_reflector(
            wire.ReflectorPacket(
                4, ntp_from_ns(time.time_ns()), EE, 7, 123456789, 9, 987654321, EE, 58
            )
        )
        good = _reply_frame(reply, via)
        base = _payload_offset(good)
        for offset in (base + 3, base + 20, base + 27, base + 33, base + 40, base - 8):
            bad = _flipped(good, offset)
            with pytest.raises(ChecksumError):
                parse_udp_packet(bad[14:], verify_checksum=True)
            r = run(coll, bad)
            assert r.retval == XDP_PASS
            assert r.data == bad
        zero = bytearray(good)
        zero[base - 2 : base] = b"\0\0"
        assert run(coll, bytes(zero)).retval == XDP_PASS
        assert ring.consume() == 0
        assert coll.counters() == {
            (NO_SSID, "pass-bad-checksum"): 6,
            (NO_SSID, "pass-checksum-zero"): 1,
        }
        assert run(coll, good).retval == XDP_DROP
        assert ring.consume() == 1
        assert record_to_received(records[0], coll.tai_offset).payload == reply
        assert coll.counters()[7, "collected"] == 1
    finally:
        ring.free()


def test_reflector_stateful_counts_per_flow(refl: Loaded) -> None:
    """RFC 8972 §3: the SSID with the addresses and ports is the session. Two senders
    (two source ports here) with one SSID each count from 0; a session written again
    (a new generation) starts from 0."""
    refl.add(ReflectorSessionConfig(ssid=7, mode=ReflectorMode.STATEFUL))

    def rseq(sport: int) -> int:
        out = run(refl, arrived(sender_payload(100, 7), sport=sport))
        assert out.retval == XDP_TX
        return wire.decode_reflector(bytes(parse_udp_packet(out.data[14:]).payload)).seq

    assert [rseq(40000), rseq(40001), rseq(40000), rseq(40001), rseq(40000)] == [0, 0, 1, 1, 2]
    key = session_key(7)
    refl.map("stamp_sessions").update(
        key, pack_session(ReflectorSessionConfig(ssid=7, mode=ReflectorMode.STATEFUL), 1)
    )
    assert rseq(40000) == 0


def test_reflector_passes_an_unauthenticated_packet_of_an_authenticated_ssid(
    refl: Loaded,
) -> None:
    """Not answered by the default session in the kernel: the core drops it (it would
    otherwise answer a packet naming an authenticated session without its key)."""
    refl.add(ReflectorSessionConfig(ssid=None))
    refl.add(ReflectorSessionConfig(ssid=9, key=b"k"))
    _counted(refl, arrived(sender_payload(1, 9)), XDP_PASS, (9, "pass-auth"))
