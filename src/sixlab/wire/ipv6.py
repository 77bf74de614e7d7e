"""The IPv6 fixed header (RFC 8200 §3) and the Next Header numbers sixlab meets.

Layout (40 bytes, big-endian)::

     0       4 bits Version (6) | 8 bits Traffic Class | 20 bits Flow Label
     4  (2) Payload Length      octets after this header, extension headers included
     6  (1) Next Header         IANA "Assigned Internet Protocol Numbers"
     7  (1) Hop Limit
     8 (16) Source Address
    24 (16) Destination Address

``IPv6Header`` is the typed value (addresses as ``ipaddress.IPv6Address``). The
per-packet paths of the data planes do not need typed addresses: building an
``IPv6Address`` costs about a microsecond, more than reading the whole header, and a
16-byte ``bytes`` compares and hashes as well for table lookups. ``hop_limit_of`` and
``addresses_of`` therefore read raw bytes in place and build no objects.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from ipaddress import IPv6Address

from sixlab.wire._errors import InvalidFieldError, TruncatedError, check_uint
from sixlab.wire.checksum import BytesLike

__all__ = [
    "IPV6_HEADER",
    "IPV6_HEADER_SIZE",
    "IPV6_VERSION",
    "MAX_PAYLOAD_LENGTH",
    "AddressLike",
    "IPv6Header",
    "NextHeader",
    "addresses_of",
    "hop_limit_of",
    "packed_address",
]

#: RFC 8200 §3: the fixed header is always 40 octets.
IPV6_HEADER_SIZE = 40
IPV6_VERSION = 6
#: Payload Length is a 16-bit field; larger payloads need a Jumbo Payload option
#: (RFC 2675), which sixlab does not build.
MAX_PAYLOAD_LENGTH = 0xFFFF

#: The fixed header, for every module that packs or unpacks one: the Version, Traffic
#: Class and Flow Label word, Payload Length, Next Header, Hop Limit, source, destination.
IPV6_HEADER = struct.Struct("!IHBB16s16s")
_HOP_LIMIT_OFFSET = 7
_SRC_OFFSET = 8
_DST_OFFSET = 24

#: An address as the API accepts it: typed, or its 16 packed bytes.
AddressLike = IPv6Address | bytes


class NextHeader(IntEnum):
    """IANA protocol numbers used in the IPv6 Next Header field (RFC 8200 §4)."""

    HOP_BY_HOP = 0  # RFC 8200 §4.3
    TCP = 6
    UDP = 17
    IPV6 = 41  # IPv6-in-IPv6 (SRv6 encapsulation mode, RFC 8986 H.Encaps)
    ROUTING = 43  # RFC 8200 §4.4; Routing Type 4 is the SRH (RFC 8754)
    FRAGMENT = 44  # RFC 8200 §4.5
    ESP = 50  # RFC 4303
    AH = 51  # RFC 4302
    ICMPV6 = 58  # RFC 4443
    NO_NEXT = 59  # RFC 8200 §4.7
    DEST_OPTS = 60  # RFC 8200 §4.6; ILNP's Nonce option lives here (RFC 6744)


def packed_address(address: AddressLike) -> bytes:
    """The 16 bytes of an IPv6 address given typed or packed."""
    if isinstance(address, IPv6Address):
        return address.packed
    if len(address) != 16:
        raise InvalidFieldError(f"an IPv6 address is 16 bytes, got {len(address)}")
    return bytes(address)


@dataclass(frozen=True, slots=True)
class IPv6Header:
    """The IPv6 fixed header. ``payload_length`` counts every octet after the 40."""

    traffic_class: int
    flow_label: int
    payload_length: int
    next_header: int
    hop_limit: int
    src: IPv6Address
    dst: IPv6Address

    def __post_init__(self) -> None:
        check_uint("Traffic Class", self.traffic_class, 8)
        check_uint("Flow Label", self.flow_label, 20)
        check_uint("Payload Length", self.payload_length, 16)
        check_uint("Next Header", self.next_header, 8)
        check_uint("Hop Limit", self.hop_limit, 8)

    def encode(self) -> bytes:
        """The 40 header bytes."""
        first = (IPV6_VERSION << 28) | (self.traffic_class << 20) | self.flow_label
        return IPV6_HEADER.pack(
            first,
            self.payload_length,
            self.next_header,
            self.hop_limit,
            self.src.packed,
            self.dst.packed,
        )

    @classmethod
    def decode(cls, data: BytesLike) -> IPv6Header:
        """Parse the fixed header at the start of ``data`` (what follows is not read)."""
        if len(data) < IPV6_HEADER_SIZE:
            raise TruncatedError(f"IPv6 header of {len(data)} bytes, need {IPV6_HEADER_SIZE}")
        first, plen, nh, hlim, src, dst = IPV6_HEADER.unpack_from(data)
        version = first >> 28
        if version != IPV6_VERSION:
            raise InvalidFieldError(f"IP version {version}, expected {IPV6_VERSION}")
        return cls(
            (first >> 20) & 0xFF,
            first & 0xF_FFFF,
            plen,
            nh,
            hlim,
            IPv6Address(src),
            IPv6Address(dst),
        )


def hop_limit_of(data: BytesLike) -> int:
    """The Hop Limit of the IPv6 packet in ``data``, read in place.

    STAMP copies it into the reply's Ses-Sender TTL (RFC 8762 §4.3.1) before anything
    else may touch the header.
    """
    _check_fast(data)
    return data[_HOP_LIMIT_OFFSET]


def addresses_of(data: BytesLike) -> tuple[bytes, bytes]:
    """(source, destination) of the IPv6 packet in ``data`` as 16-byte ``bytes``.

    No ``IPv6Address`` is built: see the module docstring for why.
    """
    _check_fast(data)
    return (
        bytes(data[_SRC_OFFSET:_DST_OFFSET]),
        bytes(data[_DST_OFFSET:IPV6_HEADER_SIZE]),
    )


def _check_fast(data: BytesLike) -> None:
    if len(data) < IPV6_HEADER_SIZE:
        raise TruncatedError(f"IPv6 header of {len(data)} bytes, need {IPV6_HEADER_SIZE}")
    if data[0] >> 4 != IPV6_VERSION:
        raise InvalidFieldError(f"IP version {data[0] >> 4}, expected {IPV6_VERSION}")
