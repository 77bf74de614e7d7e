"""Classic BPF (``SO_ATTACH_FILTER``): instructions, a small assembler, attaching.

Capture sockets (the STAMP ``scapy`` and ``mmap`` planes, the ILNP host's receive
rings) decide in the kernel which packets reach user space, so foreign traffic costs a
few BPF instructions rather than a system call and a Python call. The programs
themselves belong to their users (``sixlab.dataplane`` builds the STAMP filter, the
ILNP daemon its own); this module is the instruction set they are written in
(``<linux/filter.h>``, ``<linux/bpf_common.h>``) and the call that attaches them.

:class:`Assembler` resolves named forward jumps: classic BPF jumps are relative and
only go forward, ``jt``/``jf`` are 8 bits and ``ja`` keeps its offset in ``k``;
:meth:`Assembler.finish` raises ``ValueError`` for a jump that does not fit.
"""

from __future__ import annotations

import ctypes
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ACCEPT_SNAPLEN",
    "BPF_ABS",
    "BPF_ALU",
    "BPF_AND",
    "BPF_B",
    "BPF_H",
    "BPF_IND",
    "BPF_JA",
    "BPF_JEQ",
    "BPF_JMP",
    "BPF_K",
    "BPF_LD",
    "BPF_LDX",
    "BPF_LSH",
    "BPF_MISC",
    "BPF_RET",
    "BPF_TAX",
    "BPF_W",
    "SO_ATTACH_FILTER",
    "Assembler",
    "BpfInstruction",
    "attach_filter",
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


class Assembler:
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

    def verdicts(self) -> None:
        """The program's tail: label ``drop`` returns 0 (the packet is not captured),
        label ``accept`` returns :data:`ACCEPT_SNAPLEN` (all of it). Jumps name them."""
        self.label("drop")
        self.emit(BPF_RET | BPF_K, 0)
        self.label("accept")
        self.emit(BPF_RET | BPF_K, ACCEPT_SNAPLEN)

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


def attach_filter(sock: socket.socket, program: Sequence[BpfInstruction]) -> None:
    """``SO_ATTACH_FILTER`` ``program`` to ``sock`` (a ``struct sock_fprog`` by pointer)."""
    code = b"".join(ins.encode() for ins in program)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = _SOCK_FPROG.pack(len(program), ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    del buf  # the kernel copied the program; the buffer only had to live until here
