"""Answers to the host daemon's own DNS queries reach its resolver, not the ILNP host:
the ring's filter and the kernel drop leave UDP to its port to the kernel."""

from __future__ import annotations

import struct

from sixlab.ilnp.daemon import kernel_drop, ring_filter
from sixlab.wire.ilnp import ILV, IlnpPacket, Nonce, encode_packet
from tests.unit.test_bpf_filter import run as run_classic_bpf

NID = 0xA
LOC, LOC_DNS = 0x2001_0DB8_000A_0000, 0x2001_0DB8_0053_0000
ETH = bytes(12) + b"\x86\xdd"
PORT = 40123


def _frame(dport: int, proto: int = 17, nonce: Nonce | None = None) -> bytes:
    udp = struct.pack("!HHHH", 53, dport, 12, 0) + bytes(4)
    packet = IlnpPacket(ILV(LOC_DNS, 1), ILV(LOC, NID), proto, udp, nonce)
    return ETH + encode_packet(packet)


def test_ring_filter_leaves_answers_to_the_dns_port_to_the_kernel() -> None:
    program = ring_filter(NID, dns_port=PORT)
    assert run_classic_bpf(program, _frame(PORT)) == 0
    assert run_classic_bpf(program, _frame(PORT + 1)) > 0  # any other port: the host's
    assert run_classic_bpf(program, _frame(PORT, proto=6)) > 0  # TCP: the host's
    # an ILNP packet (nonce option first) is the host's whatever its port
    assert run_classic_bpf(program, _frame(PORT, nonce=Nonce(b"abcd"))) > 0
    assert run_classic_bpf(ring_filter(NID), _frame(PORT)) > 0  # no port: all kept


def test_kernel_drop_accepts_udp_to_the_dns_port_before_dropping() -> None:
    rules = kernel_drop(NID, ("eth0",), dns_port=PORT).rules
    assert [i for i, r in enumerate(rules) if f"udp dport {PORT} accept" in r] == [1]
    assert rules[-1].endswith("counter drop")
    assert not any("udp dport" in r for r in kernel_drop(NID, ("eth0",)).rules)
