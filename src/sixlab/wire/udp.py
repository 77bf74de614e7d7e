"""UDP over IPv6 (RFC 768, RFC 8200 §8.1).

Layout (8 bytes, big-endian)::

    0 (2) Source Port   2 (2) Destination Port   4 (2) Length   6 (2) Checksum

Length counts the header and the data. Over IPv6 the checksum is mandatory: it covers
the pseudo-header (``sixlab.wire.checksum.ipv6_pseudo_header``) and the whole UDP
datagram; a computed 0x0000 is sent as 0xFFFF, and a received 0x0000 is discarded.

The destination address in the pseudo-header is the FINAL destination (RFC 8200 §8.1):
with an SRH, the originator uses Segment List[0] (the last segment of the path), not
the IPv6 Destination Address it sends to; a recipient sees the final destination in the
Destination Address once Segments Left is 0.

``UdpHeader`` does not judge Length against a buffer (it sees 8 bytes only); the packet
parsers in ``sixlab.wire.packet`` do.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from sixlab.wire._errors import InvalidFieldError, TruncatedError
from sixlab.wire.checksum import (
    BytesLike,
    ipv6_pseudo_header,
    ones_complement_sum,
    udp_field,
)
from sixlab.wire.ipv6 import AddressLike, NextHeader, packed_address

__all__ = [
    "MAX_UDP_PAYLOAD",
    "UDP_HEADER",
    "UDP_HEADER_SIZE",
    "UdpHeader",
    "encode_udp",
    "udp_checksum",
    "verify_udp",
]

UDP_HEADER_SIZE = 8
#: Length is 16 bits and counts the header (RFC 768); jumbograms (RFC 2675) are not built.
MAX_UDP_PAYLOAD = 0xFFFF - UDP_HEADER_SIZE
_MOD = 0xFFFF

#: Source Port, Destination Port, Length, Checksum (RFC 768).
UDP_HEADER = struct.Struct("!HHHH")
_CHECKSUM_OFFSET = 6


@dataclass(frozen=True, slots=True)
class UdpHeader:
    """The UDP header; ``checksum`` is the field as on the wire."""

    src_port: int
    dst_port: int
    length: int
    checksum: int

    def __post_init__(self) -> None:
        # One cheap test first: this runs once per parsed packet.
        if (
            0 <= self.src_port <= 0xFFFF
            and 0 <= self.dst_port <= 0xFFFF
            and 0 <= self.length <= 0xFFFF
            and 0 <= self.checksum <= 0xFFFF
        ):
            return
        for name, value in (
            ("Source Port", self.src_port),
            ("Destination Port", self.dst_port),
            ("Length", self.length),
            ("Checksum", self.checksum),
        ):
            if not 0 <= value <= 0xFFFF:
                raise InvalidFieldError(f"UDP {name} {value} does not fit in 16 bits")

    def encode(self) -> bytes:
        """The 8 header bytes."""
        return UDP_HEADER.pack(self.src_port, self.dst_port, self.length, self.checksum)

    @classmethod
    def decode(cls, data: BytesLike) -> UdpHeader:
        """Parse the header at the start of ``data``."""
        if len(data) < UDP_HEADER_SIZE:
            raise TruncatedError(f"UDP header of {len(data)} bytes, need {UDP_HEADER_SIZE}")
        return cls(*UDP_HEADER.unpack_from(data))


def udp_checksum(src: bytes, dst: bytes, udp_segment: BytesLike) -> int:
    """The checksum field value for ``udp_segment`` (header + data) from ``src`` to ``dst``.

    ``dst`` is the final destination (see the module docstring). The checksum field
    inside ``udp_segment`` is ignored, so a segment may be summed as built or as
    received. A computed 0x0000 comes back as 0xFFFF (RFC 8200 §8.1).
    """
    if len(udp_segment) < UDP_HEADER_SIZE:
        raise TruncatedError(f"UDP segment of {len(udp_segment)} bytes, need {UDP_HEADER_SIZE}")
    pseudo = ipv6_pseudo_header(src, dst, len(udp_segment), NextHeader.UDP)
    (field,) = struct.unpack_from("!H", udp_segment, _CHECKSUM_OFFSET)
    # Add the field's one's-complement negation to cancel it from the sum.
    total = ones_complement_sum(pseudo) + ones_complement_sum(udp_segment) + (_MOD - field)
    folded = total % _MOD or _MOD  # the pseudo-header's Next Header makes the sum non-zero
    return udp_field(~folded & 0xFFFF)


def verify_udp(src: bytes, dst: bytes, udp_segment: BytesLike) -> bool:
    """Whether the checksum of a received ``udp_segment`` is right.

    A zero checksum field is refused (RFC 8200 §8.1: IPv6 receivers discard it). The
    sum of pseudo-header, header and data, checksum included, must be 0xFFFF.
    """
    if len(udp_segment) < UDP_HEADER_SIZE:
        return False
    (field,) = struct.unpack_from("!H", udp_segment, _CHECKSUM_OFFSET)
    if field == 0:
        return False
    # The pseudo-header is 40 bytes (even), so summing the two parts apart keeps the
    # segment's 16-bit words aligned as in one concatenated buffer.
    pseudo = ipv6_pseudo_header(src, dst, len(udp_segment), NextHeader.UDP)
    total = ones_complement_sum(pseudo) + ones_complement_sum(udp_segment)
    return total % _MOD == 0


def encode_udp(
    src_port: int,
    dst_port: int,
    payload: BytesLike,
    src_ip: AddressLike,
    dst_ip: AddressLike,
) -> bytes:
    """A UDP datagram (header + ``payload``) with its checksum filled in.

    ``dst_ip`` must be the FINAL destination: with an SRH, the last segment of the path
    (Segment List[0]), not the first segment the IPv6 header is addressed to.
    """
    if len(payload) > MAX_UDP_PAYLOAD:
        raise InvalidFieldError(f"UDP payload of {len(payload)} bytes, at most {MAX_UDP_PAYLOAD}")
    length = UDP_HEADER_SIZE + len(payload)
    segment = bytearray(UdpHeader(src_port, dst_port, length, 0).encode())
    segment += payload
    checksum = udp_checksum(packed_address(src_ip), packed_address(dst_ip), segment)
    struct.pack_into("!H", segment, _CHECKSUM_OFFSET, checksum)
    return bytes(segment)
