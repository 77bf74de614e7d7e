"""The Internet checksum (RFC 1071), its incremental update (RFC 1624) and the IPv6
pseudo-header (RFC 8200 §8.1).

Theory of operation
-------------------
The Internet checksum is the one's-complement of the one's-complement sum of the data
taken as big-endian 16-bit words (an odd trailing byte is padded with a zero byte,
RFC 1071 §1). One's-complement addition is addition modulo 0xFFFF with two spellings of
zero, 0x0000 ("+0") and 0xFFFF ("−0"). That gives a fast way to sum in pure Python:
because 2^16 ≡ 1 (mod 0xFFFF), the whole buffer read as one big-endian integer is
congruent to the sum of its 16-bit words, so ``int.from_bytes(data) % 0xFFFF`` sums the
buffer in C, without a Python loop over words. The only care needed is the spelling of
zero: an end-around-carry adder returns 0x0000 only when every word is zero and 0xFFFF
for any other multiple of 0xFFFF, and ``ones_complement_sum`` reproduces that exactly.

UDP over IPv6 (RFC 8200 §8.1, RFC 768): the checksum is mandatory, so a computed value
of 0x0000 is transmitted as 0xFFFF (its other spelling), and a received 0x0000 means "no
checksum" and is discarded. ``udp_field`` applies that rule.

Incremental update (RFC 1624 eqn. 3): ``HC' = ~(~HC + ~m + m')``, where ``m`` are the
old 16-bit words and ``m'`` the new ones. A fast path that patches timestamps into a
pre-built reply uses it to fix the UDP checksum without re-summing the packet. The
patched span must start at an even offset of the checksummed data (so its words line up
with the words of the sum) and have the same, even, length before and after.
"""

from __future__ import annotations

import struct
from typing import TypeAlias

from sixlab.wire._errors import InvalidFieldError

__all__ = [
    "PSEUDO_HEADER_SIZE",
    "BytesLike",
    "checksum_adjust",
    "internet_checksum",
    "ipv6_pseudo_header",
    "ones_complement_sum",
    "udp_field",
]

#: What the codecs accept as input: anything whose bytes can be read without copying.
BytesLike: TypeAlias = bytes | bytearray | memoryview

#: Source (16) + destination (16) + upper-layer length (4) + zero (3) + next header (1),
#: RFC 8200 §8.1.
PSEUDO_HEADER_SIZE = 40
_PSEUDO = struct.Struct("!16s16sI3xB")
_MOD = 0xFFFF


def ones_complement_sum(data: BytesLike) -> int:
    """The 16-bit one's-complement sum of ``data`` (odd length padded with a zero byte).

    Returns what an end-around-carry adder returns: 0x0000 only for all-zero data,
    otherwise a value in 1..0xFFFF.
    """
    value = int.from_bytes(data, "big")
    if len(data) % 2:
        value <<= 8  # pad the odd trailing byte on the right (RFC 1071 §1)
    folded = value % _MOD
    if folded == 0 and value:
        return _MOD
    return folded


def internet_checksum(data: BytesLike) -> int:
    """The RFC 1071 checksum: the complement of the one's-complement sum of ``data``.

    Summing the data together with a correct checksum gives 0xFFFF (RFC 1071 §1).
    """
    return ~ones_complement_sum(data) & 0xFFFF


def ipv6_pseudo_header(src: bytes, dst: bytes, upper_length: int, next_header: int) -> bytes:
    """The 40-byte IPv6 pseudo-header of RFC 8200 §8.1.

    ``dst`` must be the *final* destination: the last segment of a Routing header when
    one is present at the originator, the Destination Address at the recipient.
    """
    if len(src) != 16 or len(dst) != 16:
        raise InvalidFieldError("pseudo-header addresses must be 16 bytes each")
    if not 0 <= upper_length <= 0xFFFF_FFFF:
        raise InvalidFieldError(f"upper-layer length {upper_length} does not fit in 32 bits")
    if not 0 <= next_header <= 0xFF:
        raise InvalidFieldError(f"next header {next_header} does not fit in 8 bits")
    return _PSEUDO.pack(src, dst, upper_length, next_header)


def checksum_adjust(checksum: int, old: BytesLike, new: BytesLike, *, udp: bool = False) -> int:
    """Update ``checksum`` after the span ``old`` of the data was replaced by ``new``.

    RFC 1624 eqn. 3: ``HC' = ~(~HC + ~m + m')``. The span must have the same even length
    before and after and start at an even offset of the checksummed data. With
    ``udp=True`` a result of 0x0000 is returned as 0xFFFF (``udp_field``); a stored
    0xFFFF (UDP's spelling of a computed zero) is accepted as input either way, since
    both spellings are the same one's-complement number. Misuse (spans of different or
    odd length, a checksum wider than 16 bits) raises a plain ``ValueError``.

    The result equals a full recomputation over the new data whenever ``checksum`` was
    itself a full computation (or its UDP field form), with one exception no transport
    checksum meets: new data that is all zero sums to +0, which an update cannot tell
    from −0, so it returns 0x0000 where a full computation gives 0xFFFF (RFC 1624 §3).
    With ``udp=True`` both map to 0xFFFF, so the UDP result is always exact.
    """
    if len(old) != len(new):
        raise ValueError(f"old span of {len(old)} bytes, new span of {len(new)} bytes")
    if len(old) % 2:
        raise ValueError("RFC 1624 update needs whole 16-bit words (an even-length span)")
    if not 0 <= checksum <= 0xFFFF:
        raise ValueError(f"checksum {checksum} does not fit in 16 bits")
    # ~m summed over the old words is the one's-complement negation of their sum.
    total = (~checksum & 0xFFFF) + (_MOD - ones_complement_sum(old)) + ones_complement_sum(new)
    folded = total % _MOD
    if folded == 0 and total:
        folded = _MOD  # an end-around-carry adder never yields +0 from non-zero input
    result = ~folded & 0xFFFF
    return udp_field(result) if udp else result


def udp_field(checksum: int) -> int:
    """The value to put in a UDP-over-IPv6 checksum field for a computed ``checksum``.

    A computed 0x0000 is sent as 0xFFFF, since 0x0000 on the wire means "no checksum"
    and IPv6 receivers discard it (RFC 8200 §8.1, RFC 768).
    """
    return 0xFFFF if checksum == 0 else checksum
