"""STAMP TLVs: RFC 8972 §4 (types 1–8), RFC 9503 §3–4 (9–10), RFC 9534 (11).

Theory of operation
-------------------
Whatever follows a STAMP base packet (``sixlab.wire.stamp``) is the TLV area, a run of::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |STAMP TLV Flags|     Type      |            Length             |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    ~                             Value                             ~

Length counts the Value only. Flags (IANA "STAMP TLV Flags"): U = 0x80 unrecognized,
M = 0x40 malformed, I = 0x20 integrity check failed; the Session-Sender sends U = 1, the
Session-Reflector clears U on the TLVs it understands and sets M / I (RFC 8972 §4).

Three layers, all pure:

1. ``Tlv`` is the raw TLV (type, flags, value). ``decode_tlvs`` / ``encode_tlvs`` are
   strict and symmetric: ``encode_tlvs(decode_tlvs(b)) == b`` for any area that decodes,
   unknown types included, byte for byte.
2. ``scan_tlvs`` is the lenient walk a Session-Reflector needs (RFC 8972 §4: a TLV whose
   Length runs past the end of the packet is malformed, the reflector still answers). It
   never raises and never reads out of bounds; it returns the well-formed TLVs and the
   offset where the malformed tail starts. ``mark_malformed`` turns a received area into
   the reflected one: same bytes, same size (packets stay symmetric, RFC 8762 §4.3), the
   M flag set in the Flags byte of the first malformed TLV.
3. Typed values (``ExtraPadding`` … ``MicroSessionId``), each ``from_tlv(tlv)`` /
   ``to_tlv(flags)`` (the ``TlvValue`` protocol), entered in ``TLV_CODECS`` by the
   ``@tlv_codec`` on their class: that is the one list of the types this module knows.
   ``parse_value`` dispatches on the type and returns ``None`` for a type not in it, so
   a reflector can tell "understood" from "not".

The HMAC TLV (type 8, RFC 8972 §4.8) carries HMAC-SHA-256 truncated to 16 bytes over the
Sequence Number field of the base packet (its first 4 bytes, in both modes) followed by
every TLV that precedes the HMAC TLV, headers included (not the HMAC TLV's own header, so
flags set on it in flight do not break it). It must follow every other TLV except Extra
Padding, which may come after it and is then not covered.

Exceptions come from ``sixlab.wire._errors``: ``TruncatedError`` when the area ends inside
a TLV, ``InvalidFieldError`` when a value has the wrong length or content.
"""

from __future__ import annotations

import hmac
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from ipaddress import IPv4Address, IPv6Address
from typing import ClassVar, Protocol, Self, TypeAlias, TypeVar

from sixlab.registry import Registry
from sixlab.wire._errors import InvalidFieldError, TruncatedError, WireError, check_uint
from sixlab.wire.stamp_auth import HMAC_SIZE, hmac16

__all__ = [
    "HMAC_TLV_VALUE_SIZE",
    "SEQ_FIELD_SIZE",
    "TLV_CODECS",
    "TLV_HEADER_SIZE",
    "AccessId",
    "AccessReport",
    "ClassOfService",
    "ControlCode",
    "ControlCodeFlag",
    "DestinationNodeAddress",
    "DirectMeasurement",
    "ExtraPadding",
    "FollowUpTelemetry",
    "HmacTlv",
    "Location",
    "LocationSubTlv",
    "LocationSubType",
    "MicroSessionId",
    "ReturnAddress",
    "ReturnPath",
    "ReturnPathSubTlv",
    "ReturnPathSubType",
    "SrMplsLabelStack",
    "Srv6SegmentList",
    "SyncSource",
    "TimestampInfo",
    "TimestampMethod",
    "Tlv",
    "TlvFlag",
    "TlvScan",
    "TlvType",
    "TlvValue",
    "append_hmac_tlv",
    "decode_tlvs",
    "encode_tlvs",
    "hmac_tlv_input",
    "mark_malformed",
    "parse_value",
    "scan_tlvs",
    "tlv_codec",
    "verify_hmac_tlv",
]

#: Flags(1) + Type(1) + Length(2) (RFC 8972 §4, Figure 3).
TLV_HEADER_SIZE = 4
#: The HMAC TLV covers the base packet's Sequence Number, its first 4 bytes (RFC 8972 §4.8).
SEQ_FIELD_SIZE = 4
#: HMAC-SHA-256 truncated to 128 bits (RFC 8972 §4.8, as in RFC 8762 §4.4).
HMAC_TLV_VALUE_SIZE = HMAC_SIZE
#: Length is a 16-bit field: no value can be longer.
_MAX_VALUE = 0xFFFF

_HEADER = struct.Struct("!BBH")
_PORTS = struct.Struct("!HH")
_TS_INFO = struct.Struct("!BBBB")
_COS = struct.Struct("!I")
_DIRECT = struct.Struct("!III")
_ACCESS = struct.Struct("!BBH")
_FOLLOW_UP = struct.Struct("!IQB3x")
_U32 = struct.Struct("!I")
_MICRO = struct.Struct("!HH")


class TlvFlag(IntFlag):
    """STAMP TLV Flags (IANA registry, RFC 8972 §4 and §6.2); the low 5 bits are reserved."""

    U = 0x80  # unrecognized: the Sender sets it, a Reflector that understands clears it
    M = 0x40  # malformed: Length wrong for the type, or past the end of the packet
    I = 0x20  # integrity: HMAC TLV verification failed (RFC 8972 §4.8)  # noqa: E741


class TlvType(IntEnum):
    """STAMP TLV Types (IANA): 1–8 RFC 8972 §4.1–4.8, 9–10 RFC 9503, 11 RFC 9534."""

    EXTRA_PADDING = 1
    LOCATION = 2
    TIMESTAMP_INFO = 3
    CLASS_OF_SERVICE = 4
    DIRECT_MEASUREMENT = 5
    ACCESS_REPORT = 6
    FOLLOW_UP_TELEMETRY = 7
    HMAC = 8
    DESTINATION_NODE_ADDRESS = 9
    RETURN_PATH = 10
    MICRO_SESSION_ID = 11


class TlvValue(Protocol):
    """A typed TLV value: the codec of one TLV type, ``TYPE``."""

    TYPE: ClassVar[TlvType]

    def to_tlv(self, flags: int = ...) -> Tlv:
        """The raw TLV, with ``flags`` (U by default: what a Session-Sender sends)."""

    @classmethod
    def from_tlv(cls, tlv: Tlv) -> Self:
        """Decode ``tlv`` (``InvalidFieldError`` for a wrong type, length or content)."""


#: The TLV codecs, one per type, named after their ``TlvType`` (``"extra-padding"``, …).
#: Adding a TLV type is its ``TlvType`` member and a codec class marked ``@tlv_codec``;
#: the Session-Reflector then needs a handler for it (``sixlab.stamp`` registers one per
#: codec, and tests/unit/test_stamp_tlv_registry.py fails while one is missing).
TLV_CODECS: Registry[type[TlvValue]] = Registry("STAMP TLV type", InvalidFieldError)
#: The same codecs by type number, for ``parse_value``; filled only by ``tlv_codec``.
_CODEC_OF_TYPE: dict[int, type[TlvValue]] = {}

_V = TypeVar("_V", bound=TlvValue)


def tlv_codec(codec: type[_V]) -> type[_V]:
    """Enter ``codec`` in ``TLV_CODECS`` under the name of its ``TYPE`` (class decorator).

    It must sit above ``@dataclass``: a slotted dataclass is a new class.
    """
    tlv_type = TlvType(codec.TYPE)
    TLV_CODECS.add(tlv_type.name.lower().replace("_", "-"), codec)
    _CODEC_OF_TYPE[tlv_type] = codec
    return codec


def _check_value(name: str, value: bytes) -> None:
    if not isinstance(value, bytes):
        raise InvalidFieldError(f"{name} must be bytes, not {type(value).__name__}")
    if len(value) > _MAX_VALUE:
        raise InvalidFieldError(f"{name} of {len(value)} bytes does not fit a 16-bit Length")


# --------------------------------------------------------------------------- raw layer


@dataclass(frozen=True, slots=True)
class Tlv:
    """A raw TLV. Any type, known or not, round-trips byte for byte."""

    type: int
    flags: int
    value: bytes

    def __post_init__(self) -> None:
        check_uint("TLV Type", self.type, 8)
        check_uint("TLV Flags", self.flags, 8)
        _check_value("TLV Value", self.value)

    def encode(self) -> bytes:
        return _HEADER.pack(self.flags, self.type, len(self.value)) + self.value

    @property
    def size(self) -> int:
        """Bytes on the wire, header included."""
        return TLV_HEADER_SIZE + len(self.value)


def _walk(data: bytes | bytearray | memoryview) -> tuple[list[Tlv], int | None]:
    """Well-formed TLVs from the front of ``data``, and where the malformed tail starts."""
    view = memoryview(data)
    end = len(view)
    tlvs: list[Tlv] = []
    offset = 0
    while offset < end:  # bounded: every turn consumes at least TLV_HEADER_SIZE bytes
        if end - offset < TLV_HEADER_SIZE:
            return tlvs, offset
        flags, tlv_type, length = _HEADER.unpack_from(view, offset)
        start = offset + TLV_HEADER_SIZE
        if start + length > end:
            return tlvs, offset
        tlvs.append(Tlv(tlv_type, flags, bytes(view[start : start + length])))
        offset = start + length
    return tlvs, None


def decode_tlvs(data: bytes | bytearray | memoryview) -> tuple[Tlv, ...]:
    """Strictly decode a TLV area; an empty area gives ``()``.

    Raises ``TruncatedError`` when fewer than 4 bytes remain where a TLV must start, or when
    a Length runs past the end of ``data``.
    """
    tlvs, bad = _walk(data)
    if bad is not None:
        remaining = len(data) - bad
        if remaining < TLV_HEADER_SIZE:
            raise TruncatedError(
                f"{remaining} byte(s) at offset {bad}: a TLV header needs {TLV_HEADER_SIZE}"
            )
        length = _HEADER.unpack_from(data, bad)[2]
        raise TruncatedError(
            f"TLV at offset {bad} has Length {length}, "
            f"only {remaining - TLV_HEADER_SIZE} byte(s) follow"
        )
    return tuple(tlvs)


def encode_tlvs(tlvs: Iterable[Tlv]) -> bytes:
    """Concatenate the TLVs' wire forms in order."""
    return b"".join(tlv.encode() for tlv in tlvs)


@dataclass(frozen=True, slots=True)
class TlvScan:
    """What a lenient walk of a TLV area found.

    ``tlvs`` are the well-formed TLVs before the first problem. ``malformed_at`` is the
    offset where the malformed tail starts (a TLV whose Length runs past the end, or 1–3
    stray bytes too short for a header), ``None`` when the whole area is well formed.
    """

    tlvs: tuple[Tlv, ...]
    malformed_at: int | None
    size: int

    @property
    def well_formed(self) -> bool:
        return self.malformed_at is None

    @property
    def well_formed_size(self) -> int:
        """Bytes covered by ``tlvs`` (the tail starts there)."""
        return self.size if self.malformed_at is None else self.malformed_at


def scan_tlvs(data: bytes | bytearray | memoryview) -> TlvScan:
    """Lenient decode for the Session-Reflector (RFC 8972 §4). Never raises."""
    tlvs, bad = _walk(data)
    return TlvScan(tuple(tlvs), bad, len(data))


def mark_malformed(data: bytes | bytearray | memoryview) -> bytes:
    """The TLV area a Session-Reflector sends back for ``data`` as far as malformation goes.

    RFC 8972 §4: a TLV whose Length is larger than what remains of the packet is malformed;
    the reflector answers with the M flag set in it. The bytes are copied unchanged, so the
    reflected packet has the received size (RFC 8762 §4.3 symmetric size); only the Flags
    byte at ``malformed_at`` gains M. With 1–3 stray bytes (no room for a header) the first
    of them sits where a Flags byte would and is marked the same way (our choice: the RFC
    does not describe that case). The well-formed TLVs before are copied as received: the
    reflector still processes them (clearing U and so on) with ``scan_tlvs``.
    """
    scan = scan_tlvs(data)
    out = bytearray(data)
    if scan.malformed_at is not None:
        out[scan.malformed_at] |= TlvFlag.M
    return bytes(out)


def _decode_nested(value: bytes, what: str) -> tuple[Tlv, ...]:
    """Sub-TLVs share the TLV format (RFC 8972 §4.2, RFC 9503 §4)."""
    try:
        return decode_tlvs(value)
    except TruncatedError as exc:
        raise InvalidFieldError(f"{what}: {exc}") from exc


def _expect(tlv: Tlv, tlv_type: int, size: int | None = None) -> None:
    if tlv.type != tlv_type:
        raise InvalidFieldError(f"TLV type {tlv.type} where type {tlv_type} was expected")
    if size is not None and len(tlv.value) != size:
        raise InvalidFieldError(
            f"TLV type {tlv_type} needs a {size}-byte value, got {len(tlv.value)}"
        )


def _address(raw: bytes, what: str) -> IPv4Address | IPv6Address:
    if len(raw) == 4:
        return IPv4Address(raw)
    if len(raw) == 16:
        return IPv6Address(raw)
    raise InvalidFieldError(f"{what} of {len(raw)} bytes is neither IPv4 (4) nor IPv6 (16)")


def _check_address(what: str, address: object) -> None:
    if not isinstance(address, IPv4Address | IPv6Address):
        raise InvalidFieldError(f"{what} must be an IPv4Address or IPv6Address")


# ------------------------------------------------------------------ RFC 8972 §4.1–4.8


@tlv_codec
@dataclass(frozen=True, slots=True)
class ExtraPadding:
    """Extra Padding TLV (RFC 8972 §4.1): opaque bytes that make the packet larger."""

    TYPE: ClassVar[TlvType] = TlvType.EXTRA_PADDING
    data: bytes = b""

    def __post_init__(self) -> None:
        _check_value("Extra Padding", self.data)

    def to_tlv(self, flags: int = TlvFlag.U) -> Tlv:
        return Tlv(self.TYPE, flags, self.data)

    @classmethod
    def from_tlv(cls, tlv: Tlv) -> Self:
        _expect(tlv, cls.TYPE)
        return cls(tlv.value)


class LocationSubType(IntEnum):
    """STAMP sub-TLV types used in the Location TLV (IANA registry, RFC 8972 §4.2, §6).

    The Sender asks with the generic types (source MAC, destination IP, source IP); the
    Reflector answers with the specific one it can fill (EUI-48/64, IPv4/IPv6).
    Two public implementations number these differently; this follows the IANA registry.
    """

    SRC_MAC = 1
    SRC_EUI48 = 2
    SRC_EUI64 = 3
    DST_IP = 4
    DST_IPV4 = 5
    DST_IPV6 = 6
    SRC_IP = 7
    SRC_IPV4 = 8
    SRC_IPV6 = 9


_IPV4_SUBTYPES = frozenset({LocationSubType.DST_IPV4, LocationSubType.SRC_IPV4})
_IPV6_SUBTYPES = frozenset({LocationSubType.DST_IPV6, LocationSubType.SRC_IPV6})


@dataclass(frozen=True, slots=True)
class LocationSubTlv:
    """One Location sub-TLV, kept raw so that every layout round-trips.

    The Sender fills the value with zeros of the size it wants back (the reflected packet
    keeps the size); ``address`` and ``mac`` read the filled-in forms: an IPv4 address in
    the first 4 bytes (types 5, 8), IPv6 in the first 16 (6, 9), an EUI-48 in the first 6
    (2), an EUI-64 in the first 8 (3).
    """

    type: int
    value: bytes = b""
    flags: int = 0

    def __post_init__(self) -> None:
        check_uint("Location sub-TLV Type", self.type, 8)
        check_uint("Location sub-TLV Flags", self.flags, 8)
        _check_value("Location sub-TLV Value", self.value)

    @property
    def address(self) -> IPv4Address | IPv6Address | None:
        if self.type in _IPV4_SUBTYPES and len(self.value) >= 4:
            return IPv4Address(self.value[:4])
        if self.type in _IPV6_SUBTYPES and len(self.value) >= 16:
            return IPv6Address(self.value[:16])
        return None

    @property
    def mac(self) -> bytes | None:
        if self.type == LocationSubType.SRC_EUI48 and len(self.value) >= 6:
            return self.value[:6]
        if self.type == LocationSubType.SRC_EUI64 and len(self.value) >= 8:
            return self.value[:8]
        return None

    def to_raw(self) -> Tlv:
        return Tlv(self.type, self.flags, self.value)


@tlv_codec
@dataclass(frozen=True, slots=True)
class Location:
    """Location TLV (RFC 8972 §4.2): Destination Port(2) Source Port(2), then sub-TLVs.

    The Sender sends the ports as 0; the Reflector writes the UDP ports of the packet it
    received and fills the sub-TLVs.
    """

    TYPE: ClassVar[TlvType] = TlvType.LOCATION
    dest_port: int = 0
    src_port: int = 0
    sub_tlvs: tuple[LocationSubTlv, ...] = ()

    def __post_init__(self) -> None:
        check_uint("Destination Port", self.dest_port, 16)
        check_uint("Source Port", self.src_port, 16)

    def to_tlv(self, flags: int = TlvFlag.U) -> Tlv:
        body = encode_tlvs(sub.to_raw() for sub in self.sub_tlvs)
        return Tlv(self.TYPE, flags, _PORTS.pack(self.dest_port, self.src_port) + body)

    @classmethod
    def from_tlv(cls, tlv: Tlv) -> Self:
        _expect(tlv, cls.TYPE)
        if len(tlv.value) < _PORTS.size:
            raise InvalidFieldError(f"Location TLV of {len(tlv.value)} bytes, need 4")
        dest_port, src_port = _PORTS.unpack_from(tlv.value)
        subs = _decode_nested(tlv.value[_PORTS.size :], "Location sub-TLVs")
        return cls(
            dest_port, src_port, tuple(LocationSubTlv(s.type, s.value, s.flags) for s in subs)
        )


class SyncSource(IntEnum):
    """STAMP Synchronization Source registry (RFC 8972 §4.3, IANA)."""

    RESERVED = 0
    NTP = 1
    PTP = 2
    SSU_BITS = 3
    GNSS = 4  # GPS / GLONASS / LORAN-C / BDS / Galileo
    LOCAL_FREE_RUNNING = 5


class TimestampMethod(IntEnum):
    """STAMP Timestamping Method registry (RFC 8972 §4.3, §4.7, IANA)."""

    RESERVED = 0
    HW_ASSIST = 1
    SW_LOCAL = 2
    CONTROL_PLANE = 3


_E = TypeVar("_E", bound=IntEnum)


def _enum_or_int(enum: type[_E], value: int) -> _E | int:
    try:
        return enum(value)
    except ValueError:
        return value


@tlv_codec
@dataclass(frozen=True, slots=True)
class TimestampInfo:
    """Timestamp Information TLV (RFC 8972 §4.3): four 1-byte codes, then optional sub-TLVs.

    ``*_in`` describe how the Reflector took T2, ``*_out`` how it takes T3. Values outside
    the registries are kept as plain ints. ``sub_tlvs`` keeps any optional sub-TLV bytes
    raw (none are defined by RFC 8972).
    """

    TYPE: ClassVar[TlvType] = TlvType.TIMESTAMP_INFO
    sync_src_in: int = SyncSource.RESERVED
    ts_method_in: int = TimestampMethod.RESERVED
    sync_src_out: int = SyncSource.RESERVED
    ts_method_out: int = TimestampMethod.RESERVED
    sub_tlvs: bytes = b""

    def __post_init__(self) -> None:
        check_uint("Sync Src In", self.sync_src_in, 8)
        check_uint("Timestamp In", self.ts_method_in, 8)
        check_uint("Sync Src Out", self.sync_src_out, 8)
        check_uint("Timestamp Out", self.ts_method_out, 8)
        _check_value("Timestamp Information sub-TLVs", self.sub_tlvs)

    def to_tlv(self, flags: int = TlvFlag.U) -> Tlv:
        head = _TS_INFO.pack(
            self.sync_src_in, self.ts_method_in, self.sync_src_out, self.ts_method_out
        )
        return Tlv(self.TYPE, flags, head + self.sub_tlvs)

    @classmethod
    def from_tlv(cls, tlv: Tlv) -> Self:
        _expect(tlv, cls.TYPE)
        if len(tlv.value) < _TS_INFO.size:
            raise InvalidFieldError(f"Timestamp Information of {len(tlv.value)} bytes, need 4")
        s_in, m_in, s_out, m_out = _TS_INFO.unpack_from(tlv.value)
        return cls(
            _enum_or_int(SyncSource, s_in),
            _enum_or_int(TimestampMethod, m_in),
            _enum_or_int(SyncSource, s_out),
            _enum_or_int(TimestampMethod, m_out),
            tlv.value[_TS_INFO.size :],
        )


@tlv_codec
@dataclass(frozen=True, slots=True)
class ClassOfService:
    """Class of Service TLV (RFC 8972 §4.4), 4-byte value, bits from the most significant::

        DSCP1(6) DSCP2(6) ECN2(2) RP(2) | ECN1(2) RPE(2) Reserved(12)

    DSCP1 / ECN1: what the Sender asks the Reflector to put in the reflected packet;
    DSCP2 / ECN2: what the Reflector received (RFC 8972 calls ECN2 just "ECN"); RP: the
    Reflector could not use DSCP1. RFC 8972 keeps the last 16 bits reserved; ECN1 and RPE
    in their first 4 bits follow draft-ietf-ippm-stamp-cos-ecn (bit positions not verified:
    docs/protocols.md).
    Reserved bits are written as zero and ignored on receipt.
    """

    TYPE: ClassVar[TlvType] = TlvType.CLASS_OF_SERVICE
    dscp1: int = 0
    ecn1: int = 0
    dscp2: int = 0
    ecn2: int = 0
    rp: int = 0
    rpe: int = 0

    def __post_init__(self) -> None:
        check_uint("DSCP1", self.dscp1, 6)
        check_uint("ECN1", self.ecn1, 2)
        check_uint("DSCP2", self.dscp2, 6)
        check_uint("ECN2", self.ecn2, 2)
        check_uint("RP", self.rp, 2)
        check_uint("RPE", self.rpe, 2)

    def to_tlv(self, flags: int = TlvFlag.U) -> Tlv:
        word = (
            self.dscp1 << 26
            | self.dscp2 << 20
            | self.ecn2 << 18
            | self.rp << 16
            | self.ecn1 << 14
            | self.rpe << 12
        )
        return Tlv(self.TYPE, flags, _COS.pack(word))

    @classmethod
    def from_tlv(cls, tlv: Tlv) -> Self:
        _expect(tlv, cls.TYPE, _COS.size)
        (word,) = _COS.unpack(tlv.value)
        return cls(
            dscp1=word >> 26 & 0x3F,
            ecn1=word >> 14 & 0x3,
            dscp2=word >> 20 & 0x3F,
            ecn2=word >> 18 & 0x3,
            rp=word >> 16 & 0x3,
            rpe=word >> 12 & 0x3,
        )


@tlv_codec
@dataclass(frozen=True, slots=True)
class DirectMeasurement:
    """Direct Measurement TLV (RFC 8972 §4.5): three 32-bit packet counters.

    S_TxC: packets the Sender sent; R_RxC: packets the Reflector received;
    R_TxC: packets the Reflector sent. The Sender sends the last two as 0.
    """

    TYPE: ClassVar[TlvType] = TlvType.DIRECT_MEASUREMENT
    s_txc: int = 0
    r_rxc: int = 0
    r_txc: int = 0

    def __post_init__(self) -> None:
        check_uint("S_TxC", self.s_txc, 32)
        check_uint("R_RxC", self.r_rxc, 32)
        check_uint("R_TxC", self.r_txc, 32)

    def to_tlv(self, flags: int = TlvFlag.U) -> Tlv:
        return Tlv(self.TYPE, flags, _DIRECT.pack(self.s_txc, self.r_rxc, self.r_txc))

    @classmethod
    def from_tlv(cls, tlv: Tlv) -> Self:
        _expect(tlv, cls.TYPE, _DIRECT.size)
        return cls(*_DIRECT.unpack(tlv.value))


class AccessId(IntEnum):
    """Access Report ID (RFC 8972 §4.6): which access network the report is about."""

    THREE_GPP = 1
    NON_THREE_GPP = 2


@tlv_codec
@dataclass(frozen=True, slots=True)
class AccessReport:
    """Access Report TLV (RFC 8972 §4.6): ID(4 bits) Resv(4) Return Code(8) Reserved(16)."""

    TYPE: ClassVar[TlvType] = TlvType.ACCESS_REPORT
    id: int
    return_code: int

    def __post_init__(self) -> None:
        check_uint("Access ID", self.id, 4)
        check_uint("Return Code", self.return_code, 8)

    def to_tlv(self, flags: int = TlvFlag.U) -> Tlv:
        return Tlv(self.TYPE, flags, _ACCESS.pack(self.id << 4, self.return_code, 0))

    @classmethod
    def from_tlv(cls, tlv: Tlv) -> Self:
        _expect(tlv, cls.TYPE, _ACCESS.size)
        first, code, _reserved = _ACCESS.unpack(tlv.value)
        return cls(_enum_or_int(AccessId, first >> 4), code)


@tlv_codec
@dataclass(frozen=True, slots=True)
class FollowUpTelemetry:
    """Follow-Up Telemetry TLV (RFC 8972 §4.7): Seq(4) Follow-Up Timestamp(8) Mode(1) Rsv(3).

    The Reflector reports the sequence number and a more precise transmit timestamp of
    the packet it sent before this one; ``ts_mode`` is a ``TimestampMethod`` value.
    ``timestamp`` is the raw 64-bit wire value (format per the Error Estimate's Z bit).
    """

    TYPE: ClassVar[TlvType] = TlvType.FOLLOW_UP_TELEMETRY
    seq: int = 0
    timestamp: int = 0
    ts_mode: int = TimestampMethod.RESERVED

    def __post_init__(self) -> None:
        check_uint("Follow-Up Sequence Number", self.seq, 32)
        check_uint("Follow-Up Timestamp", self.timestamp, 64)
        check_uint("Timestamp Mode", self.ts_mode, 8)

    def to_tlv(self, flags: int = TlvFlag.U) -> Tlv:
        return Tlv(self.TYPE, flags, _FOLLOW_UP.pack(self.seq, self.timestamp, self.ts_mode))

    @classmethod
    def from_tlv(cls, tlv: Tlv) -> Self:
        _expect(tlv, cls.TYPE, _FOLLOW_UP.size)
        seq, ts, mode = _FOLLOW_UP.unpack(tlv.value)
        return cls(seq, ts, _enum_or_int(TimestampMethod, mode))


@tlv_codec
@dataclass(frozen=True, slots=True)
class HmacTlv:
    """HMAC TLV (RFC 8972 §4.8): 16 bytes; see ``append_hmac_tlv`` / ``verify_hmac_tlv``."""

    TYPE: ClassVar[TlvType] = TlvType.HMAC
    hmac: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.hmac, bytes) or len(self.hmac) != HMAC_TLV_VALUE_SIZE:
            raise InvalidFieldError(f"HMAC must be {HMAC_TLV_VALUE_SIZE} bytes")

    def to_tlv(self, flags: int = TlvFlag.U) -> Tlv:
        return Tlv(self.TYPE, flags, self.hmac)

    @classmethod
    def from_tlv(cls, tlv: Tlv) -> Self:
        _expect(tlv, cls.TYPE, HMAC_TLV_VALUE_SIZE)
        return cls(tlv.value)


# ------------------------------------------------------------------------ RFC 9503


@tlv_codec
@dataclass(frozen=True, slots=True)
class DestinationNodeAddress:
    """Destination Node Address TLV (RFC 9503 §3): the address (4 or 16 bytes) the Sender
    meant to reach, so that a Reflector reached by another address still answers."""

    TYPE: ClassVar[TlvType] = TlvType.DESTINATION_NODE_ADDRESS
    address: IPv4Address | IPv6Address

    def __post_init__(self) -> None:
        _check_address("Destination Node Address", self.address)

    def to_tlv(self, flags: int = TlvFlag.U) -> Tlv:
        return Tlv(self.TYPE, flags, self.address.packed)

    @classmethod
    def from_tlv(cls, tlv: Tlv) -> Self:
        _expect(tlv, cls.TYPE)
        return cls(_address(tlv.value, "Destination Node Address"))


class ReturnPathSubType(IntEnum):
    """Return Path sub-TLV types (RFC 9503 §4, IANA STAMP sub-TLV registry)."""

    CONTROL_CODE = 1
    RETURN_ADDRESS = 2
    SR_MPLS_LABEL_STACK = 3
    SRV6_SEGMENT_LIST = 4


class ControlCodeFlag(IntFlag):
    """Control Code Flags (RFC 9503 §4.1): the least significant bit is Reply Request."""

    REPLY_REQUEST = 0x1


@dataclass(frozen=True, slots=True)
class ControlCode:
    """Control Code sub-TLV (RFC 9503 §4.1): 32 bits of flags (``ControlCodeFlag``)."""

    SUBTYPE: ClassVar[ReturnPathSubType] = ReturnPathSubType.CONTROL_CODE
    flags: int = 0
    tlv_flags: int = 0

    def __post_init__(self) -> None:
        check_uint("Control Code Flags", self.flags, 32)
        check_uint("sub-TLV Flags", self.tlv_flags, 8)

    @property
    def reply_request(self) -> bool:
        return bool(self.flags & ControlCodeFlag.REPLY_REQUEST)

    def to_raw(self) -> Tlv:
        return Tlv(self.SUBTYPE, self.tlv_flags, _U32.pack(self.flags))

    @classmethod
    def from_raw(cls, sub: Tlv) -> Self:
        _expect(sub, cls.SUBTYPE, _U32.size)
        return cls(_U32.unpack(sub.value)[0], sub.flags)


@dataclass(frozen=True, slots=True)
class ReturnAddress:
    """Return Address sub-TLV (RFC 9503 §4.2): where the Reflector sends its reply."""

    SUBTYPE: ClassVar[ReturnPathSubType] = ReturnPathSubType.RETURN_ADDRESS
    address: IPv4Address | IPv6Address
    tlv_flags: int = 0

    def __post_init__(self) -> None:
        _check_address("Return Address", self.address)
        check_uint("sub-TLV Flags", self.tlv_flags, 8)

    def to_raw(self) -> Tlv:
        return Tlv(self.SUBTYPE, self.tlv_flags, self.address.packed)

    @classmethod
    def from_raw(cls, sub: Tlv) -> Self:
        _expect(sub, cls.SUBTYPE)
        return cls(_address(sub.value, "Return Address"), sub.flags)


@dataclass(frozen=True, slots=True)
class SrMplsLabelStack:
    """SR-MPLS Label Stack sub-TLV (RFC 9503 §4.3): n ≥ 1 label stack entries.

    Each entry is the whole 32-bit LSE (Label 20, TC 3, S 1, TTL 8), top of stack first.
    """

    SUBTYPE: ClassVar[ReturnPathSubType] = ReturnPathSubType.SR_MPLS_LABEL_STACK
    labels: tuple[int, ...]
    tlv_flags: int = 0

    def __post_init__(self) -> None:
        if not self.labels:
            raise InvalidFieldError("an SR-MPLS Label Stack needs at least one entry")
        for entry in self.labels:
            check_uint("Label stack entry", entry, 32)
        check_uint("sub-TLV Flags", self.tlv_flags, 8)
        _check_value("SR-MPLS Label Stack", b"\0" * 4 * len(self.labels))

    @property
    def label_values(self) -> tuple[int, ...]:
        """The 20-bit labels alone."""
        return tuple(entry >> 12 for entry in self.labels)

    def to_raw(self) -> Tlv:
        return Tlv(self.SUBTYPE, self.tlv_flags, b"".join(_U32.pack(e) for e in self.labels))

    @classmethod
    def from_raw(cls, sub: Tlv) -> Self:
        _expect(sub, cls.SUBTYPE)
        if not sub.value or len(sub.value) % 4:
            raise InvalidFieldError(
                f"SR-MPLS Label Stack of {len(sub.value)} bytes: need n × 4, n ≥ 1"
            )
        return cls(tuple(e for (e,) in _U32.iter_unpack(sub.value)), sub.flags)


@dataclass(frozen=True, slots=True)
class Srv6SegmentList:
    """SRv6 Segment List sub-TLV (RFC 9503 §4.4): n ≥ 1 SIDs of 128 bits.

    Order: the order the reflected packet travels them. ``segments[0]`` (RFC 9503's
    Segment(1)) is the first segment to visit; the last is the bottom of the stack (the
    final destination, normally the Session-Sender). An SRH stores the same list
    reversed (Segment List[0] is the last segment, RFC 8754 §2), so reverse it to build one.
    """

    SUBTYPE: ClassVar[ReturnPathSubType] = ReturnPathSubType.SRV6_SEGMENT_LIST
    segments: tuple[IPv6Address, ...]
    tlv_flags: int = 0

    def __post_init__(self) -> None:
        if not self.segments:
            raise InvalidFieldError("an SRv6 Segment List needs at least one segment")
        for sid in self.segments:
            if not isinstance(sid, IPv6Address):
                raise InvalidFieldError("SRv6 segments must be IPv6Address")
        check_uint("sub-TLV Flags", self.tlv_flags, 8)
        _check_value("SRv6 Segment List", b"\0" * 16 * len(self.segments))

    def to_raw(self) -> Tlv:
        return Tlv(self.SUBTYPE, self.tlv_flags, b"".join(s.packed for s in self.segments))

    @classmethod
    def from_raw(cls, sub: Tlv) -> Self:
        _expect(sub, cls.SUBTYPE)
        if not sub.value or len(sub.value) % 16:
            raise InvalidFieldError(
                f"SRv6 Segment List of {len(sub.value)} bytes: need n × 16, n ≥ 1"
            )
        segs = tuple(IPv6Address(sub.value[i : i + 16]) for i in range(0, len(sub.value), 16))
        return cls(segs, sub.flags)


#: A Return Path sub-TLV: one of the RFC 9503 kinds, or a raw ``Tlv`` for any other type.
ReturnPathSubTlv: TypeAlias = ControlCode | ReturnAddress | SrMplsLabelStack | Srv6SegmentList | Tlv

_RETURN_PATH_SUBS: dict[
    int, type[ControlCode] | type[ReturnAddress] | type[SrMplsLabelStack] | type[Srv6SegmentList]
] = {
    ReturnPathSubType.CONTROL_CODE: ControlCode,
    ReturnPathSubType.RETURN_ADDRESS: ReturnAddress,
    ReturnPathSubType.SR_MPLS_LABEL_STACK: SrMplsLabelStack,
    ReturnPathSubType.SRV6_SEGMENT_LIST: Srv6SegmentList,
}


@tlv_codec
@dataclass(frozen=True, slots=True)
class ReturnPath:
    """Return Path TLV (RFC 9503 §4): a list of sub-TLVs telling the Reflector how to reply.

    Sub-TLVs of a type RFC 9503 does not define are kept as raw ``Tlv`` (a raw ``Tlv`` of a
    known sub-type is not accepted: it would decode back as the typed form). Which
    combinations are allowed (RFC 9503 §4) is the session's business, not the codec's.
    """

    TYPE: ClassVar[TlvType] = TlvType.RETURN_PATH
    sub_tlvs: tuple[ReturnPathSubTlv, ...] = ()

    def __post_init__(self) -> None:
        for sub in self.sub_tlvs:
            if isinstance(sub, Tlv) and sub.type in _RETURN_PATH_SUBS:
                raise InvalidFieldError(
                    f"Return Path sub-TLV type {sub.type} must be given in its typed form"
                )

    @property
    def control_code(self) -> ControlCode | None:
        return next((s for s in self.sub_tlvs if isinstance(s, ControlCode)), None)

    @property
    def return_address(self) -> ReturnAddress | None:
        return next((s for s in self.sub_tlvs if isinstance(s, ReturnAddress)), None)

    @property
    def segment_list(self) -> Srv6SegmentList | None:
        return next((s for s in self.sub_tlvs if isinstance(s, Srv6SegmentList)), None)

    def to_tlv(self, flags: int = TlvFlag.U) -> Tlv:
        raws = (sub if isinstance(sub, Tlv) else sub.to_raw() for sub in self.sub_tlvs)
        return Tlv(self.TYPE, flags, encode_tlvs(raws))

    @classmethod
    def from_tlv(cls, tlv: Tlv) -> Self:
        _expect(tlv, cls.TYPE)
        subs: list[ReturnPathSubTlv] = []
        for raw in _decode_nested(tlv.value, "Return Path sub-TLVs"):
            kind = _RETURN_PATH_SUBS.get(raw.type)
            subs.append(raw if kind is None else kind.from_raw(raw))
        return cls(tuple(subs))


# ------------------------------------------------------------------------ RFC 9534


@tlv_codec
@dataclass(frozen=True, slots=True)
class MicroSessionId:
    """Micro-session ID TLV (RFC 9534): Sender ID(16) Reflector ID(16), one per LAG member."""

    TYPE: ClassVar[TlvType] = TlvType.MICRO_SESSION_ID
    sender_id: int = 0
    reflector_id: int = 0

    def __post_init__(self) -> None:
        check_uint("Sender Micro-session ID", self.sender_id, 16)
        check_uint("Reflector Micro-session ID", self.reflector_id, 16)

    def to_tlv(self, flags: int = TlvFlag.U) -> Tlv:
        return Tlv(self.TYPE, flags, _MICRO.pack(self.sender_id, self.reflector_id))

    @classmethod
    def from_tlv(cls, tlv: Tlv) -> Self:
        _expect(tlv, cls.TYPE, _MICRO.size)
        return cls(*_MICRO.unpack(tlv.value))


# ------------------------------------------------------------------------ dispatch


def parse_value(tlv: Tlv) -> TlvValue | None:
    """The typed value of ``tlv``; ``None`` if no codec in ``TLV_CODECS`` has its type.

    A known type with a bad value raises ``InvalidFieldError`` (the reflector sets M).
    """
    codec = _CODEC_OF_TYPE.get(tlv.type)
    return None if codec is None else codec.from_tlv(tlv)


# ------------------------------------------------------------------------ HMAC TLV


def hmac_tlv_input(base: bytes | bytearray | memoryview, tlvs_before: bytes) -> bytes:
    """The bytes the HMAC TLV covers (RFC 8972 §4.8).

    The base packet's Sequence Number field (its first 4 bytes, unauthenticated and
    authenticated layouts alike) followed by every TLV before the HMAC TLV, whole.
    """
    if len(base) < SEQ_FIELD_SIZE:
        raise TruncatedError(f"base packet of {len(base)} bytes has no Sequence Number")
    return bytes(base[:SEQ_FIELD_SIZE]) + bytes(tlvs_before)


def append_hmac_tlv(
    base: bytes | bytearray | memoryview,
    tlv_area: bytes,
    key: bytes,
    *,
    flags: int = TlvFlag.U,
) -> bytes:
    """``tlv_area`` with an HMAC TLV appended that covers it (RFC 8972 §4.8).

    ``tlv_area`` must decode (``WireError`` otherwise). Extra Padding may be appended after
    the result: RFC 8972 §4.8 lets it follow the HMAC TLV, uncovered. ``flags`` is U for a
    Session-Sender, 0 for a Reflector.
    """
    decode_tlvs(tlv_area)
    mac = hmac16(key, hmac_tlv_input(base, tlv_area))
    return bytes(tlv_area) + Tlv(TlvType.HMAC, flags, mac).encode()


def verify_hmac_tlv(base: bytes | bytearray | memoryview, tlv_area: bytes, key: bytes) -> bool:
    """True if ``tlv_area`` carries a valid HMAC TLV for ``key`` (constant-time compare).

    False when the area does not decode, holds no HMAC TLV or more than one, the HMAC TLV
    is followed by anything but Extra Padding (RFC 8972 §4.8: that is processed as a
    verification failure), its value is not 16 bytes, or the digest differs.
    """
    if len(base) < SEQ_FIELD_SIZE:
        return False
    try:
        tlvs = decode_tlvs(tlv_area)
    except WireError:
        return False
    positions = [i for i, tlv in enumerate(tlvs) if tlv.type == TlvType.HMAC]
    if len(positions) != 1:
        return False
    at = positions[0]
    if any(tlv.type != TlvType.EXTRA_PADDING for tlv in tlvs[at + 1 :]):
        return False
    received = tlvs[at].value
    if len(received) != HMAC_TLV_VALUE_SIZE:
        return False
    covered = sum(tlv.size for tlv in tlvs[:at])
    expected = hmac16(key, hmac_tlv_input(base, tlv_area[:covered]))
    return hmac.compare_digest(expected, received)
