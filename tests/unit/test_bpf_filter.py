"""The capture planes' classic BPF program, run in a small interpreter (no root needed).

The interpreter implements the opcodes ``sixlab.dataplane._filters`` emits with the
kernel's semantics (``net/core/filter.c``, ``bpf_check_classic``): loads beyond the end
of the packet end the program with 0 (drop); jumps are relative and forward only.
"""

from __future__ import annotations

import struct
from ipaddress import IPv6Address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.dataplane._filters import stamp_filter
from sixlab.linux import cbpf as f
from sixlab.wire.packet import build_udp_packet

SENDER = IPv6Address("fd00:0:10::1")
REFLECTOR = IPv6Address("fd00:0:10::2")
ROUTER = IPv6Address("fd00:0:20::1")
PORT = 862
PAYLOAD = bytes(44)


def run(program: tuple[f.BpfInstruction, ...], packet: bytes) -> int:
    """Execute ``program`` over ``packet``: the number of bytes to keep (0 = drop)."""
    a = x = 0
    pc = 0
    while True:
        ins = program[pc]
        code, k = ins.code, ins.k
        cls = code & 0x07
        if cls == f.BPF_LD:
            size = {f.BPF_W: 4, f.BPF_H: 2, f.BPF_B: 1}[code & 0x18]
            mode = code & 0xE0
            assert mode in (f.BPF_ABS, f.BPF_IND), f"unsupported load mode {code:#x}"
            offset = k + (x if mode == f.BPF_IND else 0)
            if offset + size > len(packet):
                return 0  # the kernel aborts the program: the packet is dropped
            a = int.from_bytes(packet[offset : offset + size], "big")
        elif cls == f.BPF_ALU:
            assert code & 0x08 == f.BPF_K, "only constant operands are emitted"
            op = code & 0xF0
            if op == f.BPF_AND:
                a &= k
            elif op == f.BPF_LSH:
                a = (a << k) & 0xFFFF_FFFF
            else:
                raise AssertionError(f"unsupported ALU op {code:#x}")
        elif cls == f.BPF_MISC:
            assert code == f.BPF_MISC | f.BPF_TAX, f"unsupported misc op {code:#x}"
            x = a
        elif cls == f.BPF_JMP:
            op = code & 0xF0
            if op == f.BPF_JA:
                pc += k
            elif op == f.BPF_JEQ:
                pc += ins.jt if a == k else ins.jf
            else:
                raise AssertionError(f"unsupported jump {code:#x}")
        elif cls == f.BPF_RET:
            return k
        else:
            raise AssertionError(f"unsupported instruction class {code:#x}")
        pc += 1


def arrived(packet: bytes, final: IPv6Address) -> bytes:
    """``packet`` as its last segment receives it: Segments Left 0, DA = ``final``."""
    data = bytearray(packet)
    data[24:40] = final.packed
    if data[6] == 43:
        data[43] = 0
    return bytes(data)


def probe(dport: int = PORT, *, segments: list[IPv6Address] | None = None) -> bytes:
    packet = build_udp_packet(SENDER, REFLECTOR, 50000, dport, PAYLOAD, segments=segments)
    return arrived(packet, REFLECTOR)


PROGRAM = stamp_filter([PORT])
ACCEPT = f.ACCEPT_SNAPLEN


def test_program_is_well_formed() -> None:
    """Every jump lands inside the program and the program ends with a return."""
    assert PROGRAM[-1].code == f.BPF_RET | f.BPF_K
    for pc, ins in enumerate(PROGRAM):
        if ins.code & 0x07 == f.BPF_JMP:
            targets = [ins.k] if ins.code & 0xF0 == f.BPF_JA else [ins.jt, ins.jf]
            assert all(pc + 1 + t < len(PROGRAM) for t in targets)
        assert len(ins.encode()) == 8


def test_plain_udp_to_port_matches() -> None:
    assert run(PROGRAM, probe()) == ACCEPT


@pytest.mark.parametrize("hops", [1, 2, 3, 7])
def test_udp_behind_srh_matches(hops: int) -> None:
    path = [IPv6Address(f"fd00:99::{i + 1}") for i in range(hops - 1)] + [REFLECTOR]
    packet = probe(segments=path)
    assert packet[6] == 43
    assert run(PROGRAM, packet) == ACCEPT


def test_srh_still_travelling_is_not_ours() -> None:
    packet = build_udp_packet(SENDER, REFLECTOR, 50000, PORT, PAYLOAD, segments=[ROUTER, REFLECTOR])
    assert packet[43] == 1  # Segments Left
    assert run(PROGRAM, packet) == 0


@pytest.mark.parametrize("dport", [861, 863, 0x5E03, 50000])  # 0x5E03: 862 byte-swapped
def test_wrong_port_does_not_match(dport: int) -> None:
    assert run(PROGRAM, probe(dport)) == 0
    assert run(PROGRAM, probe(dport, segments=[REFLECTOR])) == 0


def test_reply_direction_does_not_match() -> None:
    """A reflector's reply (source port 862, to the sender's port) is not captured."""
    for segments in (None, [SENDER]):
        reply = build_udp_packet(REFLECTOR, SENDER, PORT, 50000, PAYLOAD, segments=segments)
        assert run(PROGRAM, arrived(reply, SENDER)) == 0


def test_ipv4_does_not_match() -> None:
    # IPv4 header (20 bytes) + UDP to 862; put 862 at offset 42 too, as bait.
    ipv4 = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 72, 0, 0, 64, 17, 0, bytes(4), bytes(4))
    udp = struct.pack("!HHHH", 50000, PORT, 52, 0)
    packet = bytearray(ipv4 + udp + PAYLOAD)
    packet[42:44] = PORT.to_bytes(2, "big")
    assert run(PROGRAM, bytes(packet)) == 0


def test_other_next_headers_do_not_match() -> None:
    packet = bytearray(probe())
    for nh in (6, 58, 60, 44, 0):
        packet[6] = nh
        assert run(PROGRAM, bytes(packet)) == 0
    routed = bytearray(probe(segments=[REFLECTOR]))
    routed[40] = 6  # the routing header is followed by TCP
    assert run(PROGRAM, bytes(routed)) == 0


@pytest.mark.parametrize("segments", [None, [REFLECTOR], [ROUTER, REFLECTOR]])
def test_truncated_packets_are_dropped(segments: list[IPv6Address] | None) -> None:
    packet = probe(segments=segments)
    port_end = len(packet) - len(PAYLOAD) - 8 + 4  # Destination Port's last byte + 1
    for cut in range(port_end):
        assert run(PROGRAM, packet[:cut]) == 0, cut
    assert run(PROGRAM, packet[:port_end]) == ACCEPT


def test_several_ports() -> None:
    program = stamp_filter([PORT, 40000, 862])
    assert run(program, probe(40000)) == ACCEPT
    assert run(program, probe(PORT, segments=[REFLECTOR])) == ACCEPT
    assert run(program, probe(40001)) == 0


def test_destination_address() -> None:
    program = stamp_filter([PORT], destination=REFLECTOR)
    assert run(program, probe()) == ACCEPT
    other = bytearray(probe())
    other[39] ^= 1
    assert run(program, bytes(other)) == 0


@pytest.mark.parametrize("ports", [[], [0], [70000]])
def test_bad_ports_refused(ports: list[int]) -> None:
    with pytest.raises(ValueError, match="ports"):
        stamp_filter(ports)


@settings(max_examples=200, deadline=None)
@given(
    dport=st.integers(1, 0xFFFF),
    sport=st.integers(1, 0xFFFF),
    hops=st.integers(0, 5),
    payload=st.binary(max_size=64),
)
def test_match_iff_destination_port(dport: int, sport: int, hops: int, payload: bytes) -> None:
    segments = None
    if hops:
        segments = [IPv6Address(f"fd00:99::{i + 1}") for i in range(hops - 1)] + [REFLECTOR]
    packet = build_udp_packet(SENDER, REFLECTOR, sport, dport, payload, segments=segments)
    expected = ACCEPT if dport in (PORT, 4242) else 0
    assert run(stamp_filter([PORT, 4242]), arrived(packet, REFLECTOR)) == expected


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_accept_or_drop(data: bytes) -> None:
    assert run(PROGRAM, data) in (0, ACCEPT)
