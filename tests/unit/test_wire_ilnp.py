"""ILNPv6 codecs: I-LV, nonce option, packets, Locator Update, NID-only checksums."""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sixlab.wire._errors import InvalidFieldError, TruncatedError
from sixlab.wire.ilnp import (
    IDENTIFIER_PREFIX,
    ILV,
    DestinationOption,
    DestinationOptions,
    IlnpPacket,
    LocatorEntry,
    LocatorUpdate,
    LuOperation,
    Nonce,
    decode_destination_options,
    decode_locator_update,
    decode_packet,
    encode_destination_options,
    encode_locator_update,
    encode_nonce_header,
    encode_packet,
    finish_partial_checksum,
    identifier_address,
    ipv6_checksum,
    is_ilnp_packet,
    nid_checksum,
    relocate_checksum,
)

SETTINGS = settings(max_examples=200, deadline=None)
u64 = st.integers(0, (1 << 64) - 1)
nonces = st.binary(min_size=4, max_size=4) | st.binary(min_size=12, max_size=12)
ilvs = st.builds(ILV, u64, u64)
options = st.builds(DestinationOption, st.integers(2, 255), st.binary(max_size=40))
entries = st.builds(LocatorEntry, u64, st.integers(0, 0xFFFF), st.integers(0, 0xFFFF))
updates = st.builds(
    LocatorUpdate, st.sampled_from(LuOperation), st.lists(entries, max_size=8).map(tuple)
)
packets = st.builds(
    IlnpPacket,
    ilvs,
    ilvs,
    st.sampled_from([6, 17, 58, 59]),
    st.binary(max_size=64),
    st.none() | nonces.map(Nonce),
    st.integers(0, 255),
    st.integers(0, 255),
    st.integers(0, (1 << 20) - 1),
)


def test_ilv_from_address_splits_locator_and_nid() -> None:
    ilv = ILV.from_address("2001:db8:1:2::1")
    assert ilv == ILV(0x2001_0DB8_0001_0002, 1)
    assert ilv.address == ipaddress.IPv6Address("2001:db8:1:2::1")
    assert str(ilv) == "2001:db8:1:2/0:0:0:1"
    assert ILV.parse("2001:db8:1:2/0:0:0:1") == ilv


@pytest.mark.parametrize(
    "text", ["1:2:3/0:0:0:1", "1:2:3:4", "1:2:3:4/0x1:0:0:1", "g:0:0:0/1:1:1:1"]
)
def test_ilv_parse_refuses_bad_text(text: str) -> None:
    with pytest.raises(InvalidFieldError):
        ILV.parse(text)


@SETTINGS
@given(ilvs)
def test_ilv_round_trips(ilv: ILV) -> None:
    assert ILV.from_address(ilv.address) == ilv
    assert ILV.from_address(ilv.packed) == ilv
    assert ILV.parse(str(ilv)) == ilv


def test_nonce_header_32_bit_is_exactly_8_bytes() -> None:
    # RFC 6744 §2: NextHdr, HdrExtLen=0, 0x8B, 4, nonce(4).
    assert encode_nonce_header(17, Nonce(b"\x01\x02\x03\x04")) == bytes.fromhex("11008b0401020304")


def test_nonce_header_96_bit_is_exactly_16_bytes() -> None:
    raw = encode_nonce_header(6, Nonce(bytes(range(12))))
    assert raw == bytes.fromhex("06018b0c") + bytes(range(12))


def test_padding_pad1_and_padn() -> None:
    # 2 + (2+3) = 7 bytes -> one Pad1; 2 + (2+1) = 5 -> PadN with 1 data byte.
    one = encode_destination_options(DestinationOptions(17, (DestinationOption(0x1E, b"abc"),)))
    assert one[-1] == 0
    assert len(one) == 8
    three = encode_destination_options(DestinationOptions(17, (DestinationOption(0x1E, b"a"),)))
    assert three[5:] == b"\x01\x01\x00"
    assert len(three) == 8


def test_decode_finds_nonce_among_other_options() -> None:
    # Like Android's net_test: PadN(6) before a 96-bit nonce, 24 bytes in all.
    nonce = bytes(range(1, 13))
    raw = b"\x11\x02" + b"\x01\x06" + bytes(6) + b"\x8b\x0c" + nonce
    header, size = decode_destination_options(raw)
    assert size == 24
    assert header.nonce == Nonce(nonce)
    assert header.next_header == 17


def test_decode_refuses_option_past_end() -> None:
    with pytest.raises(InvalidFieldError):
        decode_destination_options(b"\x11\x00\x8b\x05\x01\x02\x03\x04")
    with pytest.raises(TruncatedError):
        decode_destination_options(b"\x11\x01\x8b\x04\x01\x02\x03\x04")


def test_bad_nonce_length_is_invalid() -> None:
    header, _ = decode_destination_options(b"\x11\x00\x8b\x03\x01\x02\x03\x00")
    with pytest.raises(InvalidFieldError):
        _ = header.nonce


@SETTINGS
@given(st.integers(0, 255), st.lists(options, max_size=5).map(tuple))
def test_destination_options_round_trip(
    next_header: int, opts: tuple[DestinationOption, ...]
) -> None:
    raw = encode_destination_options(DestinationOptions(next_header, opts))
    assert len(raw) % 8 == 0
    header, size = decode_destination_options(raw + b"trailing")
    assert size == len(raw)
    assert header == DestinationOptions(next_header, opts)


@SETTINGS
@given(packets)
def test_packet_round_trip_and_recognition(packet: IlnpPacket) -> None:
    raw = encode_packet(packet)
    assert decode_packet(raw) == packet
    assert is_ilnp_packet(raw) == (packet.nonce is not None)


def test_packet_without_nonce_keeps_other_dstopts_as_payload() -> None:
    dst_opts = encode_destination_options(DestinationOptions(17, (DestinationOption(0x1E, b"x"),)))
    packet = IlnpPacket(ILV(1, 2), ILV(3, 4), 60, dst_opts + b"udp!")
    decoded = decode_packet(encode_packet(packet))
    assert decoded.nonce is None
    assert decoded.next_header == 60
    assert not is_ilnp_packet(encode_packet(packet))


def test_locator_update_layout() -> None:
    # RFC 6743 §2: Type, Code, Checksum, NumLocs, Operation, Reserved,
    # then {Locator(64), Preference(16), Lifetime(16)}.
    src, dst = ILV(1, 2).packed, ILV(3, 4).packed
    lu = LocatorUpdate(LuOperation.ADVERTISEMENT, (LocatorEntry(0x20010DB8_00000001, 10, 600),))
    raw = encode_locator_update(lu, src, dst)
    assert raw[0] == 156
    assert raw[1] == 0
    assert raw[4:8] == b"\x01\x01\x00\x00"
    assert raw[8:] == struct.pack("!QHH", 0x20010DB8_00000001, 10, 600)
    assert (
        ipv6_checksum(src, dst, 58, raw[:2] + b"\0\0" + raw[4:]) == struct.unpack("!H", raw[2:4])[0]
    )


@SETTINGS
@given(updates, ilvs, ilvs)
def test_locator_update_round_trip_with_checksum(lu: LocatorUpdate, a: ILV, b: ILV) -> None:
    raw = encode_locator_update(lu, a.packed, b.packed)
    assert decode_locator_update(raw, a.packed, b.packed) == lu
    assert decode_locator_update(raw) == lu


@SETTINGS
@given(updates, st.integers(0, 7), st.integers(1, 255))
def test_locator_update_corruption_is_caught(lu: LocatorUpdate, index: int, flip: int) -> None:
    src, dst = ILV(1, 2).packed, ILV(3, 4).packed
    raw = bytearray(encode_locator_update(lu, src, dst))
    if index in (0, 1, 4, 5):  # fields whose change can also change the meaning
        return
    raw[index] ^= flip
    with pytest.raises(InvalidFieldError):
        decode_locator_update(bytes(raw), src, dst)


def test_locator_update_refuses_unknown_operation_and_code() -> None:
    raw = bytearray(
        encode_locator_update(LocatorUpdate(LuOperation.ACKNOWLEDGEMENT, ()), bytes(16), bytes(16))
    )
    raw[5] = 3
    with pytest.raises(InvalidFieldError):
        decode_locator_update(bytes(raw))
    raw[5], raw[1] = 1, 1
    with pytest.raises(InvalidFieldError):
        decode_locator_update(bytes(raw))


def test_identifier_prefix_words_sum_to_ones_complement_zero() -> None:
    words = struct.unpack("!4H", IDENTIFIER_PREFIX.to_bytes(8, "big"))
    assert sum(words) == 0xFFFF
    assert identifier_address(5) == ipaddress.IPv6Address("fd00:2ff::5")


@SETTINGS
@given(u64, u64, st.sampled_from([6, 17, 58]), st.binary(min_size=8, max_size=80))
def test_identifier_address_checksum_equals_nid_checksum(
    src_nid: int, dst_nid: int, nh: int, payload: bytes
) -> None:
    """A plain IPv6 checksum over fd00:2ff::NID equals the ILNP NID-only one (the prefix
    is checksum-neutral: docs/design-notes.md)."""
    plain = ipv6_checksum(
        identifier_address(src_nid).packed, identifier_address(dst_nid).packed, nh, payload
    )
    assert plain == nid_checksum(src_nid, dst_nid, nh, payload)


@SETTINGS
@given(u64, u64, u64, u64, st.binary(min_size=8, max_size=80))
def test_nid_checksum_is_independent_of_locators_but_plain_is_not(
    loc_a: int, loc_b: int, src_nid: int, dst_nid: int, body: bytes
) -> None:
    udp = body[:6] + b"\0\0" + body[8:]
    expected = nid_checksum(src_nid, dst_nid, 17, udp)
    assume(expected != 0)  # 0 would mean "no checksum" for UDP
    # Fill in the checksum: verification over ::NID pseudo-header then sums to zero.
    filled = udp[:6] + struct.pack("!H", expected) + udp[8:]
    assert nid_checksum(src_nid, dst_nid, 17, filled) == 0
    # relocate_checksum makes it right for a plain IPv6 receiver with real locators.
    moved = relocate_checksum(
        17,
        filled,
        old_src=ILV(IDENTIFIER_PREFIX, src_nid).packed,
        old_dst=ILV(IDENTIFIER_PREFIX, dst_nid).packed,
        new_src=ILV(loc_a, src_nid).packed,
        new_dst=ILV(loc_b, dst_nid).packed,
    )
    value = struct.unpack("!H", moved[6:8])[0]
    recomputed = ipv6_checksum(ILV(loc_a, src_nid).packed, ILV(loc_b, dst_nid).packed, 17, udp)
    assert value == (recomputed or 0xFFFF)
    assert moved != filled or loc_a == loc_b == IDENTIFIER_PREFIX or value == expected


def _partial(packet: IlnpPacket, pseudo_src: bytes, pseudo_dst: bytes) -> bytes:
    """``packet`` as a Linux sender hands it to the device (CHECKSUM_PARTIAL): the
    checksum field holds the pseudo-header sum over the given addresses, uncomplemented."""
    offset = 6 if packet.next_header == 17 else 16
    body = bytearray(packet.payload)
    body[offset : offset + 2] = b"\0\0"
    pseudo = ~ipv6_checksum(pseudo_src, pseudo_dst, packet.next_header, b"\0" * len(body))
    # the pseudo-header alone: its sum, not complemented, is what the kernel writes
    struct.pack_into("!H", body, offset, pseudo & 0xFFFF)
    return encode_packet(replace(packet, payload=bytes(body)))


@given(a=ilvs, b=ilvs, payload=st.binary(min_size=20, max_size=300), tcp=st.booleans())
@SETTINGS
def test_finish_partial_checksum_gives_what_a_device_writes(
    a: ILV, b: ILV, payload: bytes, tcp: bool
) -> None:
    """Finishing a checksum started over identifier addresses gives the NID-only one,
    whatever the locators and whether or not a nonce option sits in between."""
    next_header = 6 if tcp else 17
    body = payload if tcp else struct.pack("!HHHH", 1, 2, 8 + len(payload), 0) + payload
    offset = 16 if tcp else 6
    zeroed = bytearray(body)
    zeroed[offset : offset + 2] = b"\0\0"
    want = nid_checksum(a.nid, b.nid, next_header, bytes(zeroed))
    if not tcp and want == 0:
        want = 0xFFFF
    for nonce in (None, Nonce(b"\1\2\3\4")):
        packet = IlnpPacket(a, b, next_header, bytes(zeroed), nonce)
        raw = _partial(packet, identifier_address(a.nid).packed, identifier_address(b.nid).packed)
        finished = finish_partial_checksum(raw)
        assert finished is not None
        got = decode_packet(finished).payload
        assert struct.unpack_from("!H", got, offset)[0] == want


def test_finish_partial_checksum_over_real_addresses_is_the_plain_checksum() -> None:
    """A plain IPv6 sender's unfinished checksum finishes to the plain one."""
    a, b = ILV(0x20010DB8000E0000, 0xC), ILV(0x20010DB8000A0000, 0xA)
    tcp = bytes(range(40))
    zeroed = tcp[:16] + b"\0\0" + tcp[18:]
    raw = _partial(IlnpPacket(a, b, 6, zeroed), a.packed, b.packed)
    finished = finish_partial_checksum(raw)
    assert finished is not None
    assert struct.unpack_from("!H", finished, 40 + 16)[0] == ipv6_checksum(
        a.packed, b.packed, 6, zeroed
    )


@given(a=ilvs, b=ilvs, payload=st.binary(min_size=20, max_size=3000))
@SETTINGS
def test_finish_partial_checksum_nid_only_ignores_a_seed_over_the_wire_addresses(
    a: ILV, b: ILV, payload: bytes
) -> None:
    """A TCP aggregate the receiver's GRO made of an ILNP sender's segments holds the
    pseudo-header sum over locator|NID (GRO's, not the sender's): finished ``nid_only``
    it gets the NID-only checksum all the same."""
    zeroed = payload[:16] + b"\0\0" + payload[18:]
    packet = IlnpPacket(a, b, 6, zeroed, Nonce(b"\1\2\3\4"))
    raw = _partial(packet, a.packed, b.packed)
    finished = finish_partial_checksum(raw, nid_only=True)
    assert finished is not None
    got = struct.unpack_from("!H", decode_packet(finished).payload, 16)[0]
    assert got == nid_checksum(a.nid, b.nid, 6, zeroed)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x60" + bytes(38),  # shorter than the fixed header
        b"\x40" + bytes(59),  # IPv4
        encode_packet(IlnpPacket(ILV(1, 2), ILV(3, 4), 59, b"")),  # no next header
        encode_packet(IlnpPacket(ILV(1, 2), ILV(3, 4), 6, bytes(10))),  # TCP cut short
        encode_packet(IlnpPacket(ILV(1, 2), ILV(3, 4), 17, bytes(8)))[:-4],  # length lies
    ],
)
def test_finish_partial_checksum_refuses_what_has_no_checksum_to_finish(raw: bytes) -> None:
    assert finish_partial_checksum(raw) is None
