"""ILNPv6 wire formats (RFC 6740, 6741, 6743, 6744).

Theory of operation
-------------------
ILNPv6 keeps the IPv6 packet format and splits each 128-bit address in two
(RFC 6740 §3.1): bytes 0–7 are the Locator (L64, a routing prefix) and bytes 8–15 the
Node Identifier (NID). The pair is an Identifier-Locator Vector, :class:`ILV`.

What marks a packet as ILNPv6 is the Nonce Destination Option (RFC 6744): a Destination
Options header (IPv6 Next Header 60) holding option type 0x8B with a 4-byte (32-bit)
or 12-byte (96-bit) nonce. With a 32-bit nonce the whole header is exactly 8 bytes::

    NextHdr | HdrExtLen=0 | 0x8B | 4 | nonce (4)

and with a 96-bit nonce exactly 16 (HdrExtLen=1), so neither needs padding.

Locator Updates are ICMPv6 type 156, code 0 (RFC 6743 §2)::

     0 Type=156 (1) | Code=0 (1) | Checksum (2)
     4 Num of Locs (1) | Operation (1) | Reserved (2)
     8 Num of Locs × { Locator (8) | Preference (2) | Lifetime (2) }

Operation 1 is an advertisement and 2 its acknowledgement, as the Linux ILNP prototypes
do: RFC 6743 never defines the field's values (erratum 5911; docs/protocols.md).

Transport checksums under ILNP use a pseudo-header whose addresses are the NIDs with
a zero locator, ``::NIDs`` and ``::NIDd`` (RFC 6740 §6.3 / RFC 6741 §4), so a locator
change in flight never invalidates them. :func:`nid_checksum` computes that.
The host hands applications *identifier addresses* — :data:`IDENTIFIER_PREFIX` plus
the NID. That prefix's 16-bit words add up to 0xFFFF, which is zero in one's-complement
arithmetic, so a plain IPv6 checksum over identifier addresses *is* the NID-only checksum
and rewriting the prefix to a locator and back never touches it.

The one's-complement arithmetic is :mod:`sixlab.wire.checksum`'s (RFC 1071 sum, RFC 8200
§8.1 pseudo-header, RFC 1624 incremental update).

Decoders return a value or raise :class:`~sixlab.wire._errors.WireError`; nothing else.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from enum import IntEnum

from sixlab.wire._errors import ChecksumError, InvalidFieldError, TruncatedError, check_uint
from sixlab.wire.checksum import (
    BytesLike,
    checksum_adjust,
    internet_checksum,
    ipv6_pseudo_header,
    ones_complement_sum,
    udp_field,
)
from sixlab.wire.ipv6 import IPV6_HEADER

__all__ = [
    "DSTOPTS_NEXT_HEADER",
    "ICMPV6_NEXT_HEADER",
    "ICMPV6_PARAM_PROBLEM",
    "IDENTIFIER_PREFIX",
    "ILNP_NONCE_OPTION",
    "ILV",
    "IPV6_HEADER_SIZE",
    "LOCATOR_UPDATE_TYPE",
    "PARAM_PROBLEM_UNRECOGNIZED_OPTION",
    "DestinationOption",
    "DestinationOptions",
    "IlnpPacket",
    "LocatorEntry",
    "LocatorUpdate",
    "LuOperation",
    "Nonce",
    "decode_destination_options",
    "decode_locator_update",
    "decode_packet",
    "encode_destination_options",
    "encode_locator_update",
    "encode_nonce_header",
    "encode_packet",
    "finish_partial_checksum",
    "identifier_address",
    "ipv6_checksum",
    "is_ilnp_packet",
    "nid_checksum",
    "relocate_checksum",
    "upper_layer_checksum_offset",
]

#: IPv6 Next Header value of a Destination Options header (RFC 8200 §4.6).
DSTOPTS_NEXT_HEADER = 60
#: IPv6 Next Header value of ICMPv6 (RFC 4443 §1).
ICMPV6_NEXT_HEADER = 58
#: The ILNP Nonce option type (RFC 6744 §2, IANA). Its top bits 10 make a node that does
#: not know it drop the packet and send ICMPv6 Parameter Problem code 2 (RFC 8200 §4.2).
ILNP_NONCE_OPTION = 0x8B
#: ICMPv6 type of the ILNPv6 Locator Update (RFC 6743 §2, IANA).
LOCATOR_UPDATE_TYPE = 156
#: ICMPv6 Parameter Problem (RFC 4443 §3.4) and its code "unrecognized IPv6 option".
ICMPV6_PARAM_PROBLEM = 4
PARAM_PROBLEM_UNRECOGNIZED_OPTION = 2
#: The fixed IPv6 header (RFC 8200 §3).
IPV6_HEADER_SIZE = 40
#: Identifier-address prefix fd00:2ff::/64 (a ULA, RFC 4193): 0xfd00 + 0x02ff = 0xffff, a
#: one's-complement zero, so identifier addresses checksum exactly like ``::NID``.
IDENTIFIER_PREFIX = 0xFD00_02FF_0000_0000

_PAD1 = 0  # RFC 8200 §4.2
_PADN = 1
_NONCE_SIZES = (4, 12)  # RFC 6744 §2: a 32-bit or a 96-bit nonce
_U64 = (1 << 64) - 1
_HEX = frozenset("0123456789abcdefABCDEF")

_OPT_HDR = struct.Struct("!BB")
_LU_HEADER = struct.Struct("!BBHBBH")
_LU_ENTRY = struct.Struct("!QHH")
_MAX_LOCS = 255  # Num of Locs is one byte (RFC 6743 §2)


# --------------------------------------------------------------------- one's complement


def ipv6_checksum(src: bytes, dst: bytes, next_header: int, upper_layer: bytes) -> int:
    """The upper-layer checksum over the RFC 8200 §8.1 pseudo-header.

    ``upper_layer`` must hold a zero checksum field. The result is the value to write;
    UDP callers turn 0 into 0xFFFF themselves (RFC 8200 §8.1).
    """
    pseudo = ipv6_pseudo_header(src, dst, len(upper_layer), next_header)
    return internet_checksum(pseudo + upper_layer)


def nid_checksum(src_nid: int, dst_nid: int, next_header: int, upper_layer: bytes) -> int:
    """The ILNP transport checksum: pseudo-header addresses ``::NIDs`` and ``::NIDd``.

    RFC 6740 §6.3 and RFC 6741 §4: locators are zero in the pseudo-header.
    """
    return ipv6_checksum(ILV(0, src_nid).packed, ILV(0, dst_nid).packed, next_header, upper_layer)


def upper_layer_checksum_offset(next_header: int) -> int | None:
    """Where the checksum sits in a TCP (16), UDP (6) or ICMPv6 (2) header, else None."""
    return {6: 16, 17: 6, ICMPV6_NEXT_HEADER: 2}.get(next_header)


def relocate_checksum(
    next_header: int,
    upper_layer: bytes,
    *,
    old_src: bytes,
    old_dst: bytes,
    new_src: bytes,
    new_dst: bytes,
) -> bytes:
    """Rewrite the checksum after the pseudo-header addresses change (RFC 1624 eqn. 3).

    Used for the plain-IPv6 fallback, where the peer checks against its real addresses.
    A payload whose protocol has no known checksum, or that is too short to hold one, or
    a UDP datagram sent without checksum (0), is returned unchanged.
    """
    offset = upper_layer_checksum_offset(next_header)
    if offset is None or len(upper_layer) < offset + 2:
        return upper_layer
    (old,) = struct.unpack_from("!H", upper_layer, offset)
    if next_header == 17 and old == 0:
        return upper_layer
    # The addresses are the pseudo-header's first 32 bytes, so their words line up.
    new = checksum_adjust(old, old_src + old_dst, new_src + new_dst, udp=next_header == 17)
    return upper_layer[:offset] + struct.pack("!H", new) + upper_layer[offset + 2 :]


#: Extension headers walked to find the transport header (RFC 8200 §4): Hop-by-Hop,
#: Routing, Destination Options; each is (Hdr Ext Len + 1) × 8 bytes long.
_WALKED_EXTENSIONS = frozenset({0, 43, DSTOPTS_NEXT_HEADER})


def finish_partial_checksum(packet: BytesLike, *, nid_only: bool = False) -> bytes | None:
    """``packet`` with its transport checksum finished, for one a kernel left unfinished.

    A Linux sender leaves the TCP (and some UDP) checksum to the device
    (``CHECKSUM_PARTIAL``): the checksum field holds the pseudo-header sum, not
    complemented, and the device adds the transport header and data and writes the
    complement. A device that finishes nothing (a veth between namespaces) hands the
    packet on like that, and a packet socket flags it ``TP_STATUS_CSUMNOTREADY``. This
    does the device's part (RFC 1071 over the transport header and data, a UDP zero
    sent as 0xFFFF, RFC 8200 §8.1); whatever pseudo-header the sender summed, over
    real or identifier addresses, is what the result checks against.

    ``nid_only``: the pseudo-header part is the ILNP one (``::NIDs``/``::NIDd``, RFC 6740
    §6.3) whatever the field holds. For a TCP aggregate the receiver's GRO made out of
    an ILNP sender's segments: GRO rewrites the field with the sum over the addresses
    on the wire, locator|NID (``tcp6_gro_complete`` in Linux), not the sender's.

    None when there is no TCP, UDP or ICMPv6 header after the fixed header and
    Hop-by-Hop, Routing or Destination Options headers, or the packet is cut short.
    """
    if len(packet) < IPV6_HEADER_SIZE or packet[0] >> 4 != 6:
        return None
    end = IPV6_HEADER_SIZE + int.from_bytes(packet[4:6], "big")
    if end > len(packet):
        return None
    next_header, offset = packet[6], IPV6_HEADER_SIZE
    while next_header in _WALKED_EXTENSIONS and offset + 2 <= end:
        next_header, offset = packet[offset], offset + (packet[offset + 1] + 1) * 8
    where = upper_layer_checksum_offset(next_header)
    if where is None or offset + where + 2 > end:
        return None
    if nid_only:
        upper = bytearray(packet[offset:end])
        upper[where : where + 2] = b"\0\0"
        src, dst = int.from_bytes(packet[16:24], "big"), int.from_bytes(packet[32:40], "big")
        checksum = nid_checksum(src, dst, next_header, bytes(upper))
    else:
        checksum = internet_checksum(packet[offset:end])
    if next_header == 17:
        checksum = udp_field(checksum)
    out = bytearray(packet)
    struct.pack_into("!H", out, offset + where, checksum)
    return bytes(out)


# --------------------------------------------------------------------- I-LV


@dataclass(frozen=True, slots=True, order=True)
class ILV:
    """An Identifier-Locator Vector: 64-bit Locator and 64-bit Node Identifier.

    The textual form is ``L64/NID``, each half as four colon-separated hexadecimal
    groups, e.g. ``2001:db8:1:2/0:0:0:1`` (our notation; see the module report).
    """

    locator: int
    nid: int

    def __post_init__(self) -> None:
        check_uint("Locator", self.locator, 64)
        check_uint("NID", self.nid, 64)

    @classmethod
    def from_address(cls, address: ipaddress.IPv6Address | bytes | str) -> ILV:
        """Split an IPv6 address (object, 16 bytes or text) into Locator and NID."""
        try:
            value = int(ipaddress.IPv6Address(address))
        except ValueError as exc:
            raise InvalidFieldError(f"not an IPv6 address: {address!r}") from exc
        return cls(value >> 64, value & _U64)

    @property
    def address(self) -> ipaddress.IPv6Address:
        return ipaddress.IPv6Address((self.locator << 64) | self.nid)

    @property
    def packed(self) -> bytes:
        return ((self.locator << 64) | self.nid).to_bytes(16, "big")

    @classmethod
    def parse(cls, text: str) -> ILV:
        """Parse the ``L64/NID`` textual form."""
        parts = text.split("/")
        if len(parts) != 2:
            raise InvalidFieldError(f"I-LV {text!r} is not L64/NID")
        return cls(_parse_quad(parts[0]), _parse_quad(parts[1]))

    def __str__(self) -> str:
        return f"{_format_quad(self.locator)}/{_format_quad(self.nid)}"


def _parse_quad(text: str) -> int:
    groups = text.split(":")
    if len(groups) != 4 or not all(1 <= len(g) <= 4 and _HEX.issuperset(g) for g in groups):
        raise InvalidFieldError(f"{text!r} is not four 16-bit hex groups")
    words = [int(g, 16) for g in groups]
    return (words[0] << 48) | (words[1] << 32) | (words[2] << 16) | words[3]


def _format_quad(value: int) -> str:
    return ":".join(f"{(value >> s) & 0xFFFF:x}" for s in (48, 32, 16, 0))


def identifier_address(nid: int, prefix: int = IDENTIFIER_PREFIX) -> ipaddress.IPv6Address:
    """The stable address an application sees for ``nid``: the identifier prefix + NID."""
    return ILV(prefix, nid).address


# --------------------------------------------------------------------- nonce option


@dataclass(frozen=True, slots=True)
class Nonce:
    """An ILNP nonce: 4 bytes (32-bit) or 12 bytes (96-bit) (RFC 6744 §2)."""

    value: bytes

    def __post_init__(self) -> None:
        if len(self.value) not in _NONCE_SIZES:
            raise InvalidFieldError(f"nonce of {len(self.value)} bytes, must be 4 or 12")


@dataclass(frozen=True, slots=True)
class DestinationOption:
    """One TLV option of a Destination Options header (Pad1/PadN are never kept)."""

    type: int
    data: bytes

    def __post_init__(self) -> None:
        check_uint("Option Type", self.type, 8)
        if self.type in (_PAD1, _PADN):
            raise InvalidFieldError("padding options are added by the encoder")
        if len(self.data) > 255:
            raise InvalidFieldError(f"option data of {len(self.data)} bytes exceeds 255")


@dataclass(frozen=True, slots=True)
class DestinationOptions:
    """A Destination Options header: what follows it and its non-padding options."""

    next_header: int
    options: tuple[DestinationOption, ...]

    def __post_init__(self) -> None:
        check_uint("Next Header", self.next_header, 8)

    @property
    def nonce(self) -> Nonce | None:
        """The ILNP nonce carried here, if any; a malformed one raises InvalidFieldError."""
        for option in self.options:
            if option.type == ILNP_NONCE_OPTION:
                return Nonce(option.data)
        return None


def encode_destination_options(header: DestinationOptions) -> bytes:
    """Serialise, padding the end with Pad1 or PadN to a multiple of 8 bytes (RFC 8200 §4.2)."""
    body = b"".join(_OPT_HDR.pack(o.type, len(o.data)) + o.data for o in header.options)
    pad = -(2 + len(body)) % 8
    if pad == 1:
        body += bytes([_PAD1])
    elif pad:
        body += _OPT_HDR.pack(_PADN, pad - 2) + bytes(pad - 2)
    size = 2 + len(body)
    hdr_ext_len = size // 8 - 1
    if hdr_ext_len > 255:
        raise InvalidFieldError("Destination Options header exceeds 2048 bytes")
    return bytes([header.next_header, hdr_ext_len]) + body


def encode_nonce_header(next_header: int, nonce: Nonce) -> bytes:
    """The Destination Options header that carries only the nonce (8 or 16 bytes)."""
    option = DestinationOption(ILNP_NONCE_OPTION, nonce.value)
    return encode_destination_options(DestinationOptions(next_header, (option,)))


def decode_destination_options(data: bytes) -> tuple[DestinationOptions, int]:
    """Parse a Destination Options header at the start of ``data``.

    Returns the header and its length in bytes. Options are walked in a loop bounded by
    the header length; Pad1/PadN are skipped, an option running past the end is refused.
    """
    if len(data) < 2:
        raise TruncatedError(f"Destination Options header of {len(data)} bytes, need 2")
    next_header, hdr_ext_len = data[0], data[1]
    size = (hdr_ext_len + 1) * 8
    if len(data) < size:
        raise TruncatedError(f"Destination Options header needs {size} bytes, has {len(data)}")
    options: list[DestinationOption] = []
    pos = 2
    while pos < size:
        opt_type = data[pos]
        if opt_type == _PAD1:
            pos += 1
            continue
        if pos + 2 > size:
            raise InvalidFieldError("option header crosses the end of the options area")
        opt_len = data[pos + 1]
        end = pos + 2 + opt_len
        if end > size:
            raise InvalidFieldError(f"option 0x{opt_type:02x} runs past the header")
        if opt_type != _PADN:
            options.append(DestinationOption(opt_type, bytes(data[pos + 2 : end])))
        pos = end
    return DestinationOptions(next_header, tuple(options)), size


# --------------------------------------------------------------------- ILNPv6 packet


@dataclass(frozen=True, slots=True)
class IlnpPacket:
    """An IPv6 packet seen through ILNP eyes.

    ``next_header`` is the protocol of ``payload`` (what follows the nonce header when
    there is one). Other Destination Options found next to the nonce are not kept.
    """

    src: ILV
    dst: ILV
    next_header: int
    payload: bytes
    nonce: Nonce | None = None
    hop_limit: int = 64
    traffic_class: int = 0
    flow_label: int = 0

    def __post_init__(self) -> None:
        check_uint("Next Header", self.next_header, 8)
        check_uint("Hop Limit", self.hop_limit, 8)
        check_uint("Traffic Class", self.traffic_class, 8)
        check_uint("Flow Label", self.flow_label, 20)


def encode_packet(packet: IlnpPacket) -> bytes:
    """IPv6 header, then the nonce Destination Options header if any, then the payload."""
    if packet.nonce is not None:
        ext = encode_nonce_header(packet.next_header, packet.nonce)
        first = DSTOPTS_NEXT_HEADER
    else:
        ext, first = b"", packet.next_header
    length = len(ext) + len(packet.payload)
    if length > 0xFFFF:
        raise InvalidFieldError(f"payload of {length} bytes needs a jumbogram")
    word = (6 << 28) | (packet.traffic_class << 20) | packet.flow_label
    header = IPV6_HEADER.pack(
        word, length, first, packet.hop_limit, packet.src.packed, packet.dst.packed
    )
    return header + ext + packet.payload


def decode_packet(data: bytes) -> IlnpPacket:
    """Parse an IPv6 packet; a leading Destination Options header yields its nonce."""
    if len(data) < IPV6_HEADER_SIZE:
        raise TruncatedError(f"IPv6 packet of {len(data)} bytes, need {IPV6_HEADER_SIZE}")
    word, length, next_header, hop_limit, src, dst = IPV6_HEADER.unpack_from(data)
    if word >> 28 != 6:
        raise InvalidFieldError(f"IP version {word >> 28}, expected 6")
    end = IPV6_HEADER_SIZE + length
    if len(data) < end:
        raise TruncatedError(f"IPv6 payload length {length} exceeds the {len(data)} bytes")
    body = bytes(data[IPV6_HEADER_SIZE:end])
    nonce = None
    if next_header == DSTOPTS_NEXT_HEADER:
        header, size = decode_destination_options(body)
        nonce = header.nonce
        if nonce is not None:
            next_header, body = header.next_header, body[size:]
    return IlnpPacket(
        ILV.from_address(src),
        ILV.from_address(dst),
        next_header,
        body,
        nonce,
        hop_limit,
        (word >> 20) & 0xFF,
        word & 0xFFFFF,
    )


def is_ilnp_packet(data: bytes) -> bool:
    """True when ``data`` is IPv6 with Next Header 60 whose first real option is 0x8B.

    Leading Pad1/PadN options are skipped (a sender may align the nonce). Never raises.
    """
    if len(data) < IPV6_HEADER_SIZE + 4 or data[0] >> 4 != 6 or data[6] != DSTOPTS_NEXT_HEADER:
        return False
    end = min(len(data), IPV6_HEADER_SIZE + (data[IPV6_HEADER_SIZE + 1] + 1) * 8)
    pos = IPV6_HEADER_SIZE + 2
    while pos < end:
        opt_type = data[pos]
        if opt_type == _PAD1:
            pos += 1
        elif opt_type == _PADN and pos + 1 < end:
            pos += 2 + data[pos + 1]
        else:
            return opt_type == ILNP_NONCE_OPTION
    return False


# --------------------------------------------------------------------- Locator Update


class LuOperation(IntEnum):
    """Locator Update Operation (RFC 6743 §2; values as the Linux prototypes use them)."""

    ADVERTISEMENT = 1
    ACKNOWLEDGEMENT = 2


@dataclass(frozen=True, slots=True)
class LocatorEntry:
    """A locator with its Preference (lower is preferred) and Lifetime in seconds."""

    locator: int
    preference: int = 0
    lifetime: int = 0xFFFF

    def __post_init__(self) -> None:
        check_uint("Locator", self.locator, 64)
        check_uint("Preference", self.preference, 16)
        check_uint("Lifetime", self.lifetime, 16)


@dataclass(frozen=True, slots=True)
class LocatorUpdate:
    """An ICMPv6 Locator Update: an advertisement of the sender's whole locator set, or
    the acknowledgement that repeats it."""

    operation: LuOperation
    locators: tuple[LocatorEntry, ...]

    def __post_init__(self) -> None:
        if len(self.locators) > _MAX_LOCS:
            raise InvalidFieldError(f"{len(self.locators)} locators, at most {_MAX_LOCS}")


def encode_locator_update(update: LocatorUpdate, src: bytes, dst: bytes) -> bytes:
    """The ICMPv6 message with its checksum over the pseudo-header of ``src``/``dst``
    (the 16-byte addresses the message travels with, RFC 4443 §2.3)."""
    body = _LU_HEADER.pack(
        LOCATOR_UPDATE_TYPE, 0, 0, len(update.locators), update.operation, 0
    ) + b"".join(_LU_ENTRY.pack(e.locator, e.preference, e.lifetime) for e in update.locators)
    checksum = ipv6_checksum(src, dst, ICMPV6_NEXT_HEADER, body)
    return body[:2] + struct.pack("!H", checksum) + body[4:]


def decode_locator_update(
    data: bytes, src: bytes | None = None, dst: bytes | None = None
) -> LocatorUpdate:
    """Parse a Locator Update; with ``src`` and ``dst`` given, verify its checksum too."""
    if len(data) < _LU_HEADER.size:
        raise TruncatedError(f"Locator Update of {len(data)} bytes, need {_LU_HEADER.size}")
    msg_type, code, _checksum, count, operation, _reserved = _LU_HEADER.unpack_from(data)
    if msg_type != LOCATOR_UPDATE_TYPE:
        raise InvalidFieldError(f"ICMPv6 type {msg_type} is not a Locator Update")
    if code != 0:
        raise InvalidFieldError(f"Locator Update code {code}, must be 0")
    try:
        op = LuOperation(operation)
    except ValueError as exc:
        raise InvalidFieldError(f"Locator Update operation {operation} unknown") from exc
    size = _LU_HEADER.size + count * _LU_ENTRY.size
    if len(data) < size:
        raise TruncatedError(f"Locator Update with {count} locators needs {size} bytes")
    if len(data) > size:
        raise InvalidFieldError(f"{len(data) - size} bytes after the last locator")
    if (
        src is not None
        and dst is not None
        and ones_complement_sum(ipv6_pseudo_header(src, dst, len(data), ICMPV6_NEXT_HEADER) + data)
        != 0xFFFF
    ):
        raise ChecksumError("Locator Update checksum does not verify")
    entries = tuple(
        LocatorEntry(*_LU_ENTRY.unpack_from(data, _LU_HEADER.size + i * _LU_ENTRY.size))
        for i in range(count)
    )
    return LocatorUpdate(op, entries)
