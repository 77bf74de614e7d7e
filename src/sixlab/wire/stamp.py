"""STAMP base test packets (RFC 8762 §4.2–4.3, with the RFC 8972 §3 SSID).

Four layouts, big-endian, offsets in bytes::

    Session-Sender, unauthenticated (44)      Session-Reflector, unauthenticated (44)
      0 Sequence Number        (4)              0 Sequence Number          (4)
      4 Timestamp              (8)              4 Timestamp (T3)           (8)
     12 Error Estimate         (2)             12 Error Estimate           (2)
     14 SSID                   (2)             14 SSID                     (2)
     16 MBZ                   (28)             16 Receive Timestamp (T2)   (8)
                                               24 Session-Sender Seq       (4)
                                               28 Session-Sender TS (T1)   (8)
                                               36 Session-Sender Err Est   (2)
                                               38 MBZ                      (2)
                                               40 Ses-Sender TTL           (1)
                                               41 MBZ                      (3)

    Authenticated (112): the same fields spread out with MBZ padding so that each sits
    at a 16-byte-friendly offset (see the ``_AUTH_*`` structs), then HMAC at 96:16,
    HMAC-SHA-256 truncated to 16 bytes over bytes 0..95 (see ``sixlab.wire.stamp_auth``).

Whatever follows the base packet is the TLV area (RFC 8972 §4), kept here as raw bytes:
``sixlab.wire.stamp_tlv`` decodes it. MBZ fields are written as zero and ignored on
receipt (RFC 8762 §4.2.1).

A Session-Sender packet of 14 to 43 bytes is accepted: RFC 8762 §4.6 asks a reflector to
answer such a (TWAMP-Light) sender, whose packet holds at least Seq, Timestamp and Error
Estimate. Its SSID reads as 0 when the packet ends before it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from sixlab.wire._errors import TruncatedError, check_uint
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat, decode_timestamp

__all__ = [
    "AUTH_HMAC_OFFSET",
    "AUTH_PACKET_SIZE",
    "MIN_SENDER_SIZE",
    "REFLECTOR_AUTH",
    "REFLECTOR_UNAUTH",
    "SENDER_AUTH",
    "SENDER_SHORT",
    "SENDER_UNAUTH",
    "STAMP_PORT",
    "UNAUTH_PACKET_SIZE",
    "ReflectorPacket",
    "SenderPacket",
    "base_size",
    "decode_reflector",
    "decode_sender",
    "encode_reflector",
    "encode_sender",
]

#: The well-known STAMP port on the Session-Reflector (RFC 8762 §4.1, IANA).
STAMP_PORT = 862
UNAUTH_PACKET_SIZE = 44
AUTH_PACKET_SIZE = 112
#: The HMAC covers bytes 0..95 and sits at 96:112 (RFC 8762 §4.4).
AUTH_HMAC_OFFSET = 96
#: Seq + Timestamp + Error Estimate: the least a sender packet must hold (RFC 8762 §4.6).
MIN_SENDER_SIZE = 14

SENDER_UNAUTH = struct.Struct("!IQHH28x")
SENDER_AUTH = struct.Struct("!I12xQHH68x16x")
REFLECTOR_UNAUTH = struct.Struct("!IQHHQIQH2xB3x")
REFLECTOR_AUTH = struct.Struct("!I12xQHH4xQ8xI12xQH6xB15x16x")
SENDER_SHORT = struct.Struct("!IQH")
_SSID = struct.Struct("!H")


def base_size(*, authenticated: bool) -> int:
    """Size of the base packet (both roles have the same size in a mode)."""
    return AUTH_PACKET_SIZE if authenticated else UNAUTH_PACKET_SIZE


@dataclass(frozen=True, slots=True)
class SenderPacket:
    """A Session-Sender test packet. ``timestamp`` is the raw 64-bit wire value (T1)."""

    seq: int
    timestamp: int
    error_estimate: ErrorEstimate
    ssid: int = 0
    tlvs: bytes = b""

    def __post_init__(self) -> None:
        check_uint("Sequence Number", self.seq, 32)
        check_uint("Timestamp", self.timestamp, 64)
        check_uint("SSID", self.ssid, 16)

    @property
    def timestamp_ns(self) -> int:
        """T1 in nanoseconds on the timescale of the packet's format."""
        return decode_timestamp(self.timestamp, self.error_estimate.fmt)

    @property
    def fmt(self) -> TimestampFormat:
        return self.error_estimate.fmt


@dataclass(frozen=True, slots=True)
class ReflectorPacket:
    """A Session-Reflector test packet; timestamps are raw 64-bit wire values."""

    seq: int
    timestamp: int  # T3
    error_estimate: ErrorEstimate
    ssid: int
    receive_timestamp: int  # T2
    sender_seq: int
    sender_timestamp: int  # T1
    sender_error_estimate: ErrorEstimate
    ses_sender_ttl: int
    tlvs: bytes = b""

    def __post_init__(self) -> None:
        check_uint("Sequence Number", self.seq, 32)
        check_uint("Timestamp", self.timestamp, 64)
        check_uint("SSID", self.ssid, 16)
        check_uint("Receive Timestamp", self.receive_timestamp, 64)
        check_uint("Session-Sender Sequence Number", self.sender_seq, 32)
        check_uint("Session-Sender Timestamp", self.sender_timestamp, 64)
        check_uint("Ses-Sender TTL", self.ses_sender_ttl, 8)


def encode_sender(packet: SenderPacket, *, authenticated: bool = False) -> bytes:
    """The packet's bytes; in authenticated mode the HMAC field is left zero.

    ``sixlab.wire.stamp_auth.sign`` fills it: keeping the key out of the codec keeps
    ``decode(encode(x)) == x`` a property of the layout alone.
    """
    fields = (packet.seq, packet.timestamp, packet.error_estimate.to_int(), packet.ssid)
    base = SENDER_AUTH.pack(*fields) if authenticated else SENDER_UNAUTH.pack(*fields)
    return base + packet.tlvs


def decode_sender(data: bytes, *, authenticated: bool = False) -> SenderPacket:
    """Parse a Session-Sender packet; the TLV area is returned as raw bytes."""
    if authenticated:
        if len(data) < AUTH_PACKET_SIZE:
            raise TruncatedError(
                f"authenticated Session-Sender packet of {len(data)} bytes, need {AUTH_PACKET_SIZE}"
            )
        seq, ts, ee, ssid = SENDER_AUTH.unpack_from(data)
        return SenderPacket(
            seq, ts, ErrorEstimate.from_int(ee), ssid, bytes(data[AUTH_PACKET_SIZE:])
        )
    size = len(data)
    if size >= UNAUTH_PACKET_SIZE:
        seq, ts, ee, ssid = SENDER_UNAUTH.unpack_from(data)
        return SenderPacket(
            seq, ts, ErrorEstimate.from_int(ee), ssid, bytes(data[UNAUTH_PACKET_SIZE:])
        )
    if size < MIN_SENDER_SIZE:
        raise TruncatedError(
            f"Session-Sender packet of {size} bytes, need at least {MIN_SENDER_SIZE}"
        )
    seq, ts, ee = SENDER_SHORT.unpack_from(data)
    ssid = _SSID.unpack_from(data, 14)[0] if size >= 16 else 0
    return SenderPacket(seq, ts, ErrorEstimate.from_int(ee), ssid)


def encode_reflector(packet: ReflectorPacket, *, authenticated: bool = False) -> bytes:
    """The packet's bytes; in authenticated mode the HMAC field is left zero."""
    fields = (
        packet.seq,
        packet.timestamp,
        packet.error_estimate.to_int(),
        packet.ssid,
        packet.receive_timestamp,
        packet.sender_seq,
        packet.sender_timestamp,
        packet.sender_error_estimate.to_int(),
        packet.ses_sender_ttl,
    )
    layout = REFLECTOR_AUTH if authenticated else REFLECTOR_UNAUTH
    return layout.pack(*fields) + packet.tlvs


def decode_reflector(data: bytes, *, authenticated: bool = False) -> ReflectorPacket:
    """Parse a Session-Reflector packet; the TLV area is returned as raw bytes."""
    layout = REFLECTOR_AUTH if authenticated else REFLECTOR_UNAUTH
    if len(data) < layout.size:
        raise TruncatedError(f"Session-Reflector packet of {len(data)} bytes, need {layout.size}")
    seq, ts, ee, ssid, rts, sseq, sts, see, ttl = layout.unpack_from(data)
    return ReflectorPacket(
        seq,
        ts,
        ErrorEstimate.from_int(ee),
        ssid,
        rts,
        sseq,
        sts,
        ErrorEstimate.from_int(see),
        ttl,
        bytes(data[layout.size :]),
    )
