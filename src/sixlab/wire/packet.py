"""Whole IPv6/UDP packets, optionally with an SRH: what the data planes build and parse.

Theory of operation
-------------------
``build_udp_packet`` writes ``IPv6 [/ SRH] / UDP / payload``. Given a path of segments
in TRAVEL ORDER (first segment to visit first, the final destination last, as iproute2's
``segs``), the IPv6 Destination Address is the first segment, the SRH holds the path in
wire order with Segments Left = n − 1, and the UDP checksum is computed over the FINAL
destination (RFC 8200 §8.1). ``dst`` must be that final destination, so the path must
end with it: a missing or misplaced reflector address is refused rather than guessed.

``parse_udp_packet`` is on the per-packet path of user-space reflectors, so it reads
with ``struct.unpack_from`` on a ``memoryview`` and builds no ``ipaddress`` objects:
addresses stay 16-byte ``bytes`` (``src``, ``dst``, ``final_dst``) and the typed views
(``ipv6``, ``srh``, ``source``, ``destination``, ``final_destination``) are properties
computed on demand. It walks the extension headers in a bounded loop:

* Hop-by-Hop Options (0): only right after the IPv6 header (RFC 8200 §4.1); skipped.
* Routing (43): Routing Type 4 (SRH, RFC 8754) is checked and kept; another Routing
  Type with Segments Left = 0 is skipped, as RFC 8200 §4.4 tells a node to do; with
  Segments Left > 0 its final destination cannot be known, so the packet is refused.
  A second Routing header is refused too (RFC 8200 §4.1: it should occur once) since it
  would make the final destination ambiguous.
* Destination Options (60): skipped (ILNP's nonce lives here; ``sixlab.wire.ilnp``
  reads it).
* Fragment (44), ESP (50), AH (51), No Next Header (59), anything else that is not
  UDP: refused with ``InvalidFieldError``. A data plane measuring delay never needs to
  reassemble or decrypt; such packets are not ours.

``MAX_EXTENSION_HEADERS`` = 8 bounds the walk. RFC 8200 §4.1's recommended order holds
at most 7 extension headers (Hop-by-Hop, Destination, Routing, Fragment, AH, ESP,
Destination), and of those this parser accepts 4; 8 leaves room for any legitimate chain
while capping per-packet work against a chain of many tiny 8-octet headers, the
resource-exhaustion case draft-ietf-6man-eh-limits sets limits for.

Lengths: the buffer must hold 40 + Payload Length octets (``TruncatedError`` if not);
octets after that are ignored like a link-layer pad. Every header must fit inside the
payload (``TruncatedError``). UDP Length must be at least 8 and fit in what is left;
if it is shorter, the rest is ignored like the kernel does (it trims the datagram to
UDP Length). Jumbograms (Payload Length 0, RFC 2675) are not supported.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv6Address

from sixlab.wire._errors import ChecksumError, InvalidFieldError, TruncatedError
from sixlab.wire.checksum import BytesLike
from sixlab.wire.ipv6 import (
    IPV6_HEADER,
    IPV6_HEADER_SIZE,
    IPV6_VERSION,
    MAX_PAYLOAD_LENGTH,
    AddressLike,
    IPv6Header,
    NextHeader,
    packed_address,
)
from sixlab.wire.srh import ROUTING_TYPE_SRH, SegmentRoutingHeader, validate_srh
from sixlab.wire.udp import UDP_HEADER, UDP_HEADER_SIZE, UdpHeader, encode_udp, verify_udp

__all__ = [
    "MAX_EXTENSION_HEADERS",
    "ParsedUdpPacket",
    "build_udp_packet",
    "parse_udp_packet",
]

#: Bound on the extension-header walk; see the module docstring for the reasoning.
MAX_EXTENSION_HEADERS = 8

_EXT = struct.Struct("!BB")  # Next Header, Hdr Ext Len: common to 0, 43 and 60
_ROUTING = struct.Struct("!BB")  # Routing Type, Segments Left at offset 2
# Plain ints for the per-packet loop: comparing against IntEnum members costs more.
_NH_UDP = int(NextHeader.UDP)
_NH_HBH = int(NextHeader.HOP_BY_HOP)
_NH_ROUTING = int(NextHeader.ROUTING)
_NH_SKIPPED = frozenset({_NH_HBH, _NH_ROUTING, int(NextHeader.DEST_OPTS)})
_SEGMENT0_OFFSET = 8  # Segment List[0] in an SRH
_ADDRESS_SIZE = 16


@dataclass(frozen=True, slots=True)
class ParsedUdpPacket:
    """A parsed IPv6/UDP packet. Addresses are 16-byte ``bytes``; offsets index ``data``.

    ``dst`` is the IPv6 Destination Address as received (the active segment while an SRH
    has Segments Left > 0); ``final_dst`` is the final destination, the address the UDP
    checksum covers (RFC 8200 §8.1).
    """

    traffic_class: int
    flow_label: int
    payload_length: int
    next_header: int
    hop_limit: int
    src: bytes
    dst: bytes
    final_dst: bytes
    udp: UdpHeader
    payload: bytes
    udp_offset: int
    payload_offset: int
    srh_offset: int | None = None
    srh_data: bytes | None = None

    @property
    def ipv6(self) -> IPv6Header:
        """The IPv6 fixed header as a typed value (built on each access)."""
        return IPv6Header(
            self.traffic_class,
            self.flow_label,
            self.payload_length,
            self.next_header,
            self.hop_limit,
            IPv6Address(self.src),
            IPv6Address(self.dst),
        )

    @property
    def srh(self) -> SegmentRoutingHeader | None:
        """The SRH, decoded on each access, or None when the packet has none."""
        if self.srh_data is None:
            return None
        return SegmentRoutingHeader.decode(self.srh_data)

    @property
    def source(self) -> IPv6Address:
        return IPv6Address(self.src)

    @property
    def destination(self) -> IPv6Address:
        return IPv6Address(self.dst)

    @property
    def final_destination(self) -> IPv6Address:
        return IPv6Address(self.final_dst)

    @property
    def src_port(self) -> int:
        return self.udp.src_port

    @property
    def dst_port(self) -> int:
        return self.udp.dst_port


def build_udp_packet(
    src: AddressLike,
    dst: AddressLike,
    sport: int,
    dport: int,
    payload: BytesLike,
    *,
    hop_limit: int = 64,
    segments: Sequence[IPv6Address] | None = None,
    traffic_class: int = 0,
    flow_label: int = 0,
) -> bytes:
    """Bytes of ``IPv6 [/ SRH] / UDP / payload`` from ``src`` to the final destination ``dst``.

    ``segments`` is the SRv6 path in TRAVEL ORDER and must end with ``dst``. When given,
    the IPv6 Destination Address is ``segments[0]`` and an SRH with Segments Left = n − 1
    follows the IPv6 header; the UDP checksum uses ``dst`` either way.
    """
    src_b = packed_address(src)
    dst_b = packed_address(dst)
    udp = encode_udp(sport, dport, payload, src_b, dst_b)
    if segments is None:
        extension = b""
        next_header = NextHeader.UDP
        first_hop = dst_b
    else:
        if not segments or segments[-1].packed != dst_b:
            raise InvalidFieldError(
                "the segment path (travel order) must end with the final destination dst"
            )
        extension = SegmentRoutingHeader.from_path(segments, NextHeader.UDP).encode()
        next_header = NextHeader.ROUTING
        first_hop = segments[0].packed
    payload_length = len(extension) + len(udp)
    if payload_length > MAX_PAYLOAD_LENGTH:
        raise InvalidFieldError(f"IPv6 payload of {payload_length} bytes needs a jumbogram")
    header = IPv6Header(
        traffic_class,
        flow_label,
        payload_length,
        next_header,
        hop_limit,
        IPv6Address(src_b),
        IPv6Address(first_hop),
    )
    return header.encode() + extension + udp


def parse_udp_packet(data: BytesLike, *, verify_checksum: bool = False) -> ParsedUdpPacket:
    """Parse an IPv6 packet carrying UDP (possibly behind an SRH), without copying it.

    With ``verify_checksum`` a wrong or zero UDP checksum raises ``ChecksumError``;
    off by default because a capture of locally sent packets may carry a checksum the
    NIC has yet to fill in (checksum offload).
    """
    view = memoryview(data)
    first, plen, first_nh, hlim, src, dst = _fixed_header(view)
    end = IPV6_HEADER_SIZE + plen
    offset, final_dst, srh_offset, srh_data = _extension_chain(view, first_nh, end, dst)
    if offset + UDP_HEADER_SIZE > end:
        raise TruncatedError(f"UDP header at {offset} past the payload")
    sport, dport, udp_length, checksum = UDP_HEADER.unpack_from(view, offset)
    if udp_length < UDP_HEADER_SIZE:
        raise InvalidFieldError(f"UDP Length {udp_length} is shorter than its header")
    udp_end = offset + udp_length
    if udp_end > end:
        raise TruncatedError(f"UDP Length {udp_length} but {end - offset} bytes left")
    if verify_checksum and not verify_udp(src, final_dst, view[offset:udp_end]):
        raise ChecksumError("UDP checksum does not match")
    payload_offset = offset + UDP_HEADER_SIZE
    return ParsedUdpPacket(
        (first >> 20) & 0xFF,
        first & 0xF_FFFF,
        plen,
        first_nh,
        hlim,
        src,
        dst,
        final_dst,
        UdpHeader(sport, dport, udp_length, checksum),
        bytes(view[payload_offset:udp_end]),
        offset,
        payload_offset,
        srh_offset,
        srh_data,
    )


def _fixed_header(view: memoryview) -> tuple[int, int, int, int, bytes, bytes]:
    """The IPv6 fixed header's (version/class/label word, Payload Length, Next Header,
    Hop Limit, Source, Destination), checked against the buffer."""
    size = len(view)
    if size < IPV6_HEADER_SIZE:
        raise TruncatedError(f"IPv6 packet of {size} bytes, need {IPV6_HEADER_SIZE}")
    first, plen, first_nh, hlim, src, dst = IPV6_HEADER.unpack_from(view)
    if first >> 28 != IPV6_VERSION:
        raise InvalidFieldError(f"IP version {first >> 28}, expected {IPV6_VERSION}")
    if IPV6_HEADER_SIZE + plen > size:
        raise TruncatedError(f"Payload Length {plen} but only {size - IPV6_HEADER_SIZE} bytes")
    return first, plen, first_nh, hlim, src, dst


def _extension_chain(
    view: memoryview, nh: int, end: int, dst: bytes
) -> tuple[int, bytes, int | None, bytes | None]:
    """Walk the extension headers up to UDP: (UDP offset, final destination, SRH offset,
    SRH bytes)."""
    offset = IPV6_HEADER_SIZE
    final_dst = dst
    srh_offset: int | None = None
    srh_data: bytes | None = None
    routing_seen = False
    for count in range(MAX_EXTENSION_HEADERS + 1):
        if nh == _NH_UDP:
            break
        next_nh, length = _extension_header(view, nh, offset, end, count)
        if nh == _NH_ROUTING:
            if routing_seen:
                raise InvalidFieldError("more than one Routing header")
            routing_seen = True
            srh = _routing_header(view, offset, length, end)
            if srh is not None:
                srh_offset = offset
                srh_data, segment = srh
                final_dst = segment or final_dst
        offset += length
        nh = next_nh
    return offset, final_dst, srh_offset, srh_data


def _extension_header(
    view: memoryview, nh: int, offset: int, end: int, count: int
) -> tuple[int, int]:
    """(Next Header, length in octets) of the ``count``-th extension header, type ``nh``."""
    if count == MAX_EXTENSION_HEADERS:
        raise InvalidFieldError(f"more than {MAX_EXTENSION_HEADERS} extension headers")
    if nh not in _NH_SKIPPED:
        raise InvalidFieldError(f"next header {nh} is not UDP nor a header sixlab skips")
    if offset + 2 > end:
        raise TruncatedError(f"extension header {nh} at {offset} past the payload")
    next_nh, ext_len = _EXT.unpack_from(view, offset)
    length = 8 * (ext_len + 1)  # RFC 8200 §4.3-4.6: 8-octet units after the first 8
    if offset + length > end:
        raise TruncatedError(f"extension header {nh} of {length} bytes past the payload")
    if nh == _NH_HBH and offset != IPV6_HEADER_SIZE:
        raise InvalidFieldError("Hop-by-Hop Options header not right after IPv6 header")
    return next_nh, length


def _routing_header(
    view: memoryview, offset: int, length: int, end: int
) -> tuple[bytes, bytes | None] | None:
    """An SRH: (its bytes, the final destination when Segments Left > 0); None for
    another Routing Type with Segments Left 0 (skipped, RFC 8200 §4.4)."""
    routing_type, left = _ROUTING.unpack_from(view, offset + 2)
    if routing_type == ROUTING_TYPE_SRH:
        validate_srh(view[:end], offset)
        srh_data = bytes(view[offset : offset + length])
        if not left:
            return srh_data, None
        start = offset + _SEGMENT0_OFFSET
        return srh_data, bytes(view[start : start + _ADDRESS_SIZE])
    if left:
        raise InvalidFieldError(
            f"Routing Type {routing_type} with Segments Left {left} is not supported"
        )
    return None
