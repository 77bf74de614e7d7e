"""The capture planes' kernel side: their classic BPF filter and their nftables drop.

Theory of operation
-------------------
The ``scapy`` and ``mmap`` planes own no UDP socket on the STAMP port: they capture
with an ``AF_PACKET`` socket and answer from user space. Two things follow.

1. **Which packets reach user space** is decided in the kernel by a classic BPF program
   (``SO_ATTACH_FILTER``), so the per-packet cost for foreign traffic is a few BPF
   instructions, not a system call and a Python call (the point of the STAMP paper's
   sniffer filter, docs/papers.md). The
   program sees the packet from the IPv6 header on: both planes use ``SOCK_DGRAM``
   packet sockets ("cooked", the link header removed), which keeps the offsets the same
   on Ethernet, loopback and headerless links. It accepts

   * IPv6 (version nibble 6, checked even though the socket is bound to ETH_P_IPV6),
   * optionally only to one Destination Address (a router that forwards STAMP packets
     of others must not reflect them),
   * carrying UDP right after the fixed header (UDP Destination Port at offset 42), or
     after ONE Routing header (Next Header 43) whose Segments Left is 0 and whose own
     Next Header is UDP: the Routing header is 8 × (Hdr Ext Len + 1) octets (RFC 8200
     §4.4), so the port sits at 40 + 8 × (Hdr Ext Len + 1) + 2. Classic BPF has no
     loop, so exactly one header is skipped: the STAMP-over-SRv6 case (RFC 8754 §2,
     the kernel delivers it with the SRH still in place). Segments Left > 0 means the
     packet is still travelling; it is not for us.
   * and whose UDP Destination Port is one of ours. Only the destination port is
     matched, never the source port: a reflector answering from 862 to a sender that
     also uses 862 would otherwise capture its own replies (a fault of the STAMP paper's
     code, docs/papers.md). Own outgoing packets are kept away by ``PACKET_IGNORE_OUTGOING``
     as well.

   The program is written with :mod:`sixlab.linux.cbpf` and uses ``ldb``/``ldh``
   absolute, ``ldh`` indexed, ``and``, ``lsh``, ``tax``, ``jeq`` and ``ret``;
   ``tests/unit/test_bpf_filter.py`` runs it in a small interpreter over packets built
   by ``sixlab.wire.packet``.

2. **The kernel must not answer STAMP packets itself.** With no socket bound on the
   port, every probe would make the kernel send an ICMPv6 Destination Unreachable
   (port unreachable, RFC 4443 §3.1). Packet taps see a packet before the IPv6 input
   hook of netfilter runs, so an nftables rule that drops UDP to our ports at that
   hook silences the kernel while the capture still gets the packet.
   :func:`stamp_drop` gives the :class:`sixlab.linux.nftdrop.KernelDrop` that owns one
   table per port (``ip6 sixlab_stamp_<port>``, IPv6 only so an IPv4 service
   on the same port is untouched), created by ``install`` and deleted by ``remove`` and
   at interpreter exit. The table's comment names the owner pid: a table whose owner is
   dead (a crashed or SIGKILLed run) is replaced on the next ``install``; one whose
   owner lives is refused, since two planes on one port in one namespace would steal
   each other's packets. (``tc ... action drop`` would be earlier still, but this
   kernel has no ``act_gact``.)
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from ipaddress import IPv6Address

from sixlab.linux.cbpf import (
    BPF_ABS,
    BPF_ALU,
    BPF_AND,
    BPF_B,
    BPF_H,
    BPF_IND,
    BPF_JEQ,
    BPF_JMP,
    BPF_K,
    BPF_LD,
    BPF_LSH,
    BPF_MISC,
    BPF_TAX,
    BPF_W,
    Assembler,
    BpfInstruction,
    attach_filter,
)
from sixlab.linux.nftdrop import KernelDrop, KernelDropError

__all__ = [
    "KernelDrop",
    "KernelDropError",
    "attach_filter",
    "stamp_drop",
    "stamp_filter",
    "table_name",
]


# Offsets from the start of the IPv6 header (RFC 8200 §3, RFC 8754 §2, RFC 768).
_OFF_VERSION = 0
_OFF_NEXT_HEADER = 6
_OFF_DST = 24
_IPV6_SIZE = 40
_OFF_RT_NEXT_HEADER = _IPV6_SIZE + 0
_OFF_RT_HDR_EXT_LEN = _IPV6_SIZE + 1
_OFF_RT_SEGMENTS_LEFT = _IPV6_SIZE + 3
#: UDP Destination Port behind a Routing header: X = 8 × Hdr Ext Len, and the header is
#: X + 8 octets long, so the port is at 40 + 8 + X + 2.
_OFF_DPORT_AFTER_RT = _IPV6_SIZE + 8 + 2
_OFF_DPORT_PLAIN = _IPV6_SIZE + 2
_NH_UDP = 17
_NH_ROUTING = 43


def stamp_filter(
    ports: Sequence[int], *, destination: IPv6Address | None = None
) -> tuple[BpfInstruction, ...]:
    """The program described in the module docstring, for packets starting at IPv6.

    ``ports`` are the UDP Destination Ports to accept; ``destination``, when given, is
    the only IPv6 Destination Address accepted.
    """
    wanted = sorted(set(ports))
    if not wanted or any(not 0 < p <= 0xFFFF for p in wanted):
        raise ValueError(f"ports must be 1..65535, got {list(ports)}")
    asm = Assembler()
    asm.emit(BPF_LD | BPF_B | BPF_ABS, _OFF_VERSION)
    asm.emit(BPF_ALU | BPF_AND | BPF_K, 0xF0)
    asm.emit(BPF_JMP | BPF_JEQ | BPF_K, 0x60, jt=0, jf="drop")
    if destination is not None:
        for i in range(4):
            (word,) = struct.unpack_from("!I", destination.packed, 4 * i)
            asm.emit(BPF_LD | BPF_W | BPF_ABS, _OFF_DST + 4 * i)
            asm.emit(BPF_JMP | BPF_JEQ | BPF_K, word, jt=0, jf="drop")
    asm.emit(BPF_LD | BPF_B | BPF_ABS, _OFF_NEXT_HEADER)
    asm.emit(BPF_JMP | BPF_JEQ | BPF_K, _NH_UDP, jt="plain", jf=0)
    asm.emit(BPF_JMP | BPF_JEQ | BPF_K, _NH_ROUTING, jt=0, jf="drop")
    # One Routing header: finished (Segments Left 0) and followed by UDP.
    asm.emit(BPF_LD | BPF_B | BPF_ABS, _OFF_RT_SEGMENTS_LEFT)
    asm.emit(BPF_JMP | BPF_JEQ | BPF_K, 0, jt=0, jf="drop")
    asm.emit(BPF_LD | BPF_B | BPF_ABS, _OFF_RT_NEXT_HEADER)
    asm.emit(BPF_JMP | BPF_JEQ | BPF_K, _NH_UDP, jt=0, jf="drop")
    asm.emit(BPF_LD | BPF_B | BPF_ABS, _OFF_RT_HDR_EXT_LEN)
    asm.emit(BPF_ALU | BPF_LSH | BPF_K, 3)
    asm.emit(BPF_MISC | BPF_TAX)
    asm.emit(BPF_LD | BPF_H | BPF_IND, _OFF_DPORT_AFTER_RT)
    # BPF_JA: skip the plain-UDP load, both paths meet at "port" with the port in A.
    asm.jump("port")
    asm.label("plain")
    asm.emit(BPF_LD | BPF_H | BPF_ABS, _OFF_DPORT_PLAIN)
    asm.label("port")
    for port in wanted:
        asm.emit(BPF_JMP | BPF_JEQ | BPF_K, port, jt="accept", jf=0)
    asm.verdicts()
    return asm.finish()


def table_name(port: int) -> str:
    """The nftables table (family ``ip6``) guarding ``port``."""
    return f"sixlab_stamp_{port}"


def stamp_drop(
    port: int, ports: Sequence[int], *, destination: IPv6Address | None = None
) -> KernelDrop:
    """The kernel drop of a capture plane on ``port`` (see the module docstring):
    UDP to any of ``ports`` (to ``destination`` only, when given) is dropped at input."""
    match = "" if destination is None else f"ip6 daddr {destination} "
    wanted = ", ".join(str(p) for p in sorted(set(ports)))
    return KernelDrop(
        table_name(port),
        [f"{match}udp dport {{ {wanted} }} counter drop"],
        purpose=f"another capture plane uses UDP port {port} in this namespace",
    )
