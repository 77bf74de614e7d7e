"""Kernel-side helpers of the capture planes: a classic BPF filter and an nftables drop.

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

   The program uses ``ldb``/``ldh`` absolute, ``ldh`` indexed, ``and``, ``lsh``, ``tax``,
   ``jeq`` and ``ret``; ``tests/unit/test_bpf_filter.py`` runs it in a small interpreter
   over packets built by ``sixlab.wire.packet``.

2. **The kernel must not answer STAMP packets itself.** With no socket bound on the
   port, every probe would make the kernel send an ICMPv6 Destination Unreachable
   (port unreachable, RFC 4443 §3.1). Packet taps see a packet before the IPv6 input
   hook of netfilter runs, so an nftables rule that drops UDP to our ports at that
   hook silences the kernel while the capture still gets the packet. ``KernelDrop``
   owns one table per port (``ip6 sixlab_stamp_<port>``, IPv6 only so an IPv4 service
   on the same port is untouched), created by ``install`` and deleted by ``remove`` and
   at interpreter exit. The table's comment names the owner pid: a table whose owner is
   dead (a crashed or SIGKILLed run) is replaced on the next ``install``; one whose
   owner lives is refused, since two planes on one port in one namespace would steal
   each other's packets. (``tc ... action drop`` would be earlier still, but this
   kernel has no ``act_gact``.)
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import shutil
import socket
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv6Address

__all__ = [
    "ACCEPT_SNAPLEN",
    "BpfInstruction",
    "KernelDrop",
    "KernelDropError",
    "attach_filter",
    "stamp_filter",
    "table_name",
]

# <linux/filter.h> / <linux/bpf_common.h> opcode fields.
BPF_LD = 0x00
BPF_LDX = 0x01
BPF_ALU = 0x04
BPF_JMP = 0x05
BPF_RET = 0x06
BPF_MISC = 0x07
BPF_W = 0x00
BPF_H = 0x08
BPF_B = 0x10
BPF_ABS = 0x20
BPF_IND = 0x40
BPF_AND = 0x50
BPF_LSH = 0x60
BPF_JA = 0x00
BPF_JEQ = 0x10
BPF_K = 0x00
BPF_TAX = 0x00

#: What an accepting program returns: the number of bytes to keep. Larger than any
#: packet (64 KiB IPv6 payload plus headers), so a match is never truncated.
ACCEPT_SNAPLEN = 0x40000
#: <asm-generic/socket.h>
SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)

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
_SOCK_FILTER = struct.Struct("=HBBI")  # struct sock_filter
_SOCK_FPROG = struct.Struct("@HP")  # struct sock_fprog {len, pointer}


@dataclass(frozen=True, slots=True)
class BpfInstruction:
    """One classic BPF instruction (``struct sock_filter``); jumps are relative."""

    code: int
    jt: int
    jf: int
    k: int

    def encode(self) -> bytes:
        return _SOCK_FILTER.pack(self.code, self.jt, self.jf, self.k)


class _Assembler:
    """Appends instructions; conditional jumps name labels, resolved by ``finish``."""

    def __init__(self) -> None:
        self._code: list[tuple[int, str | int, str | int, int | str]] = []
        self._labels: dict[str, int] = {}

    def emit(self, code: int, k: int = 0, jt: str | int = 0, jf: str | int = 0) -> None:
        self._code.append((code, jt, jf, k))

    def jump(self, label: str) -> None:
        """``ja label``: the unconditional jump keeps its 32-bit offset in k."""
        self._code.append((BPF_JMP | BPF_JA, 0, 0, label))

    def label(self, name: str) -> None:
        self._labels[name] = len(self._code)

    def finish(self) -> tuple[BpfInstruction, ...]:
        out = []
        for pc, (code, jt, jf, k) in enumerate(self._code):
            offsets = []
            for target in (jt, jf):
                rel = target if isinstance(target, int) else self._labels[target] - pc - 1
                if not 0 <= rel <= 0xFF:  # jt/jf are 8 bits and only go forward
                    raise ValueError(f"BPF jump of {rel} from {pc} does not fit")
                offsets.append(rel)
            k_value = k if isinstance(k, int) else self._labels[k] - pc - 1
            out.append(BpfInstruction(code, offsets[0], offsets[1], k_value))
        return tuple(out)


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
    asm = _Assembler()
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
    asm.label("drop")
    asm.emit(BPF_RET | BPF_K, 0)
    asm.label("accept")
    asm.emit(BPF_RET | BPF_K, ACCEPT_SNAPLEN)
    return asm.finish()


def attach_filter(sock: socket.socket, program: Sequence[BpfInstruction]) -> None:
    """``SO_ATTACH_FILTER`` ``program`` to ``sock`` (a ``struct sock_fprog`` by pointer)."""
    code = b"".join(ins.encode() for ins in program)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = _SOCK_FPROG.pack(len(program), ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    del buf  # the kernel copied the program; the buffer only had to live until here


# ----------------------------------------------------------------------- kernel drop


def table_name(port: int) -> str:
    """The nftables table (family ``ip6``) guarding ``port``."""
    return f"sixlab_stamp_{port}"


_OWNER = re.compile(r'comment "sixlab pid=(\d+)"')
#: ``nft`` is quick; a hung one is a broken system, reported rather than waited on.
_NFT_TIMEOUT_S = 10.0


class KernelDropError(RuntimeError):
    """nftables is missing or refused the rule (the message says which)."""


def _nft(
    *args: str, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    nft = shutil.which("nft")
    if nft is None:
        raise KernelDropError("nft not found: install the nftables package")
    proc = subprocess.run(
        [nft, *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=_NFT_TIMEOUT_S,
    )
    if check and proc.returncode != 0:
        raise KernelDropError(f"nft {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class KernelDrop:
    """The nftables table that drops UDP to ``ports`` at IPv6 input (see module doc)."""

    def __init__(
        self, port: int, ports: Sequence[int], *, destination: IPv6Address | None = None
    ) -> None:
        self.port = port
        self.ports = tuple(sorted(set(ports)))
        self.destination = destination
        self.table = table_name(port)
        self.installed = False

    def owner(self) -> int | None:
        """The pid named by the existing table, or None when there is no table."""
        listing = _nft("list", "table", "ip6", self.table, check=False)
        if listing.returncode != 0:
            return None
        match = _OWNER.search(listing.stdout)
        return int(match.group(1)) if match else 0

    def install(self) -> None:
        """Create the table; replace a dead owner's leftover, refuse a live owner's."""
        if self.installed:
            return
        owner = self.owner()
        if owner is not None:
            if owner and owner != os.getpid() and _alive(owner):
                raise KernelDropError(
                    f"nft table ip6 {self.table} belongs to live process {owner}: "
                    f"another capture plane uses UDP port {self.port} in this namespace"
                )
            _nft("delete", "table", "ip6", self.table, check=False)
        match = "" if self.destination is None else f"ip6 daddr {self.destination} "
        ports = ", ".join(str(p) for p in self.ports)
        script = (
            f'table ip6 {self.table} {{\n  comment "sixlab pid={os.getpid()}"\n'
            "  chain input {\n    type filter hook input priority filter; policy accept;\n"
            f"    {match}udp dport {{ {ports} }} counter drop\n  }}\n}}\n"
        )
        _nft("-f", "-", stdin=script)
        self.installed = True
        atexit.register(self.remove)

    def remove(self) -> None:
        """Delete the table if this object installed it; safe to call twice."""
        if not self.installed:
            return
        self.installed = False
        atexit.unregister(self.remove)
        owner = self.owner()
        if owner == os.getpid():
            _nft("delete", "table", "ip6", self.table, check=False)
