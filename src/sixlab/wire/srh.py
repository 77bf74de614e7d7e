"""The IPv6 Segment Routing Header (SRH), RFC 8754 §2.

Layout (big-endian)::

     0 (1) Next Header
     1 (1) Hdr Ext Len      8-octet units, not counting the first 8 (RFC 8200 §4.4)
     2 (1) Routing Type     4 = SRH
     3 (1) Segments Left    index of the active segment in the Segment List
     4 (1) Last Entry       index of the last element of the Segment List (= n − 1)
     5 (1) Flags            none defined by RFC 8754; kept raw
     6 (2) Tag
     8 (16 × n) Segment List[0] … Segment List[n−1]
     …  TLVs (RFC 8754 §2.1), kept here as raw bytes; a multiple of 8 octets

So Hdr Ext Len = 2·n + len(TLVs)/8, and the header is 8·(Hdr Ext Len + 1) octets.

!!! TWO ORDERS — the classic pitfall !!!
=======================================
* **Wire order** (``SegmentRoutingHeader.segments``): Segment List[0] is the **last**
  segment of the path, the final destination; Segment List[n−1] is the first segment
  to visit. The active segment is Segment List[Segments Left], and Segments Left counts
  down from n − 1 to 0 as the packet travels. This is the order of the SRH itself, of
  scapy's ``IPv6ExtHdrSegmentRouting(addresses=...)`` and of pyroute2's ``segs``.
* **Travel order** (``SegmentRoutingHeader.from_path(path)``, ``travel_order``): the
  first segment to visit first, the final destination last. This is the order of
  iproute2's ``encap seg6 ... segs A,B,C`` and of how people write a path.

``from_path`` reverses the path into wire order and sets Segments Left = n − 1, so the
source puts ``path[0]`` in the IPv6 Destination Address (``active_segment``).

Every decoding check raises ``InvalidFieldError`` or ``TruncatedError``:
Routing Type 4; the Segment List (Last Entry + 1 entries) fits inside Hdr Ext Len and
what remains is the TLV area (so it is a multiple of 8 by construction); Segments Left
≤ Last Entry (RFC 8754 §4.3.1.1 answers a violation with a Parameter Problem);
the buffer holds the whole header.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv6Address

from sixlab.wire._errors import InvalidFieldError, TruncatedError, check_uint
from sixlab.wire.checksum import BytesLike

__all__ = [
    "MAX_SEGMENTS",
    "ROUTING_TYPE_SRH",
    "SRH_FIXED_SIZE",
    "SegmentRoutingHeader",
    "validate_srh",
]

#: RFC 8754 §2: Routing Type 4 identifies the SRH (IANA "Routing Types").
ROUTING_TYPE_SRH = 4
#: Next Header, Hdr Ext Len, Routing Type, Segments Left, Last Entry, Flags, Tag.
SRH_FIXED_SIZE = 8
_SEGMENT_SIZE = 16
#: Hdr Ext Len is 8 bits and each segment takes 2 of its units: at most 127 segments.
MAX_SEGMENTS = 0xFF // 2

FIXED = struct.Struct("!BBBBBBH")


@dataclass(frozen=True, slots=True)
class SegmentRoutingHeader:
    """An SRH. ``segments`` is in WIRE ORDER: ``segments[0]`` is the final destination.

    ``last_entry`` must equal ``len(segments) - 1``; it is kept as a field so the value
    mirrors the wire. Use ``from_path`` to build one from a path in travel order.
    """

    next_header: int
    segments_left: int
    last_entry: int
    flags: int
    tag: int
    segments: tuple[IPv6Address, ...]
    tlvs: bytes = b""

    def __post_init__(self) -> None:
        check_uint("Next Header", self.next_header, 8)
        check_uint("Segments Left", self.segments_left, 8)
        check_uint("Last Entry", self.last_entry, 8)
        check_uint("Flags", self.flags, 8)
        check_uint("Tag", self.tag, 16)
        count = len(self.segments)
        if not 1 <= count <= MAX_SEGMENTS:
            raise InvalidFieldError(f"{count} segments, an SRH holds 1 to {MAX_SEGMENTS}")
        if self.last_entry != count - 1:
            raise InvalidFieldError(f"Last Entry {self.last_entry} with {count} segments")
        if self.segments_left > self.last_entry:
            raise InvalidFieldError(
                f"Segments Left {self.segments_left} > Last Entry {self.last_entry}"
            )
        if len(self.tlvs) % 8:
            raise InvalidFieldError(f"TLV area of {len(self.tlvs)} bytes, not a multiple of 8")
        if 2 * count + len(self.tlvs) // 8 > 0xFF:
            raise InvalidFieldError("segments and TLVs exceed what Hdr Ext Len can describe")

    @classmethod
    def from_path(
        cls,
        path: Sequence[IPv6Address],
        next_header: int,
        *,
        flags: int = 0,
        tag: int = 0,
        tlvs: bytes = b"",
    ) -> SegmentRoutingHeader:
        """Build the SRH of a fresh packet from ``path`` in TRAVEL ORDER.

        ``path[0]`` is visited first (and goes in the IPv6 Destination Address),
        ``path[-1]`` is the final destination. The result holds the path reversed
        (wire order) with Segments Left = n − 1.
        """
        if not path:
            raise InvalidFieldError("an SRH path needs at least one segment")
        segments = tuple(reversed(path))
        last = len(segments) - 1
        return cls(next_header, last, last, flags, tag, segments, tlvs)

    @property
    def hdr_ext_len(self) -> int:
        """The Hdr Ext Len field: 8-octet units after the first 8."""
        return 2 * len(self.segments) + len(self.tlvs) // 8

    @property
    def size(self) -> int:
        """Octets the header takes on the wire."""
        return SRH_FIXED_SIZE + _SEGMENT_SIZE * len(self.segments) + len(self.tlvs)

    @property
    def final_destination(self) -> IPv6Address:
        """Segment List[0]: the last segment of the path."""
        return self.segments[0]

    @property
    def active_segment(self) -> IPv6Address:
        """Segment List[Segments Left]: where the packet is heading now."""
        return self.segments[self.segments_left]

    @property
    def travel_order(self) -> tuple[IPv6Address, ...]:
        """The segments first-visited first (the reverse of ``segments``)."""
        return tuple(reversed(self.segments))

    def encode(self) -> bytes:
        """The header's bytes."""
        fixed = FIXED.pack(
            self.next_header,
            self.hdr_ext_len,
            ROUTING_TYPE_SRH,
            self.segments_left,
            self.last_entry,
            self.flags,
            self.tag,
        )
        return fixed + b"".join(s.packed for s in self.segments) + self.tlvs

    @classmethod
    def decode(cls, data: BytesLike) -> SegmentRoutingHeader:
        """Parse the SRH at the start of ``data``; bytes after the header are not read."""
        size = validate_srh(data)
        nh, _, _, left, last, flags, tag = FIXED.unpack_from(data)
        end = SRH_FIXED_SIZE + _SEGMENT_SIZE * (last + 1)
        segments = tuple(
            IPv6Address(bytes(data[i : i + _SEGMENT_SIZE]))
            for i in range(SRH_FIXED_SIZE, end, _SEGMENT_SIZE)
        )
        return cls(nh, left, last, flags, tag, segments, bytes(data[end:size]))


def validate_srh(data: BytesLike, offset: int = 0) -> int:
    """Check the SRH at ``data[offset:]`` without building objects; return its size.

    Applies every check of ``SegmentRoutingHeader.decode``; the per-packet parser uses
    it so that it can keep addresses as raw bytes.
    """
    available = len(data) - offset
    if available < SRH_FIXED_SIZE:
        raise TruncatedError(f"SRH of {available} bytes, need at least {SRH_FIXED_SIZE}")
    _, ext_len, routing_type, left, last, _, _ = FIXED.unpack_from(data, offset)
    if routing_type != ROUTING_TYPE_SRH:
        raise InvalidFieldError(f"Routing Type {routing_type}, an SRH is {ROUTING_TYPE_SRH}")
    size: int = SRH_FIXED_SIZE + 8 * ext_len
    # Hdr Ext Len = 2n + TLV/8: the n = Last Entry + 1 segments need 2n of its units.
    if 2 * (last + 1) > ext_len:
        raise InvalidFieldError(
            f"Last Entry {last} needs {2 * (last + 1)} units, Hdr Ext Len is {ext_len}"
        )
    if left > last:
        raise InvalidFieldError(f"Segments Left {left} > Last Entry {last}")
    if available < size:
        raise TruncatedError(f"SRH of {size} bytes, only {available} in the buffer")
    return size
