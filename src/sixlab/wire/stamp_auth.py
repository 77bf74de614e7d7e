"""STAMP authentication (RFC 8762 §4.4): HMAC-SHA-256 truncated to 16 bytes.

The HMAC of an authenticated base packet covers bytes 0..95 (everything before the HMAC
field, SSID and MBZ included) and sits at 96..111. RFC 8762 leaves key management out of
scope; a key is configured per session. Verification compares in constant time
(``hmac.compare_digest``) and must come before anything else is done with the packet.
"""

from __future__ import annotations

import hashlib
import hmac

from sixlab.wire._errors import TruncatedError
from sixlab.wire.stamp import AUTH_HMAC_OFFSET, AUTH_PACKET_SIZE

__all__ = ["HMAC_SIZE", "hmac16", "sign", "verify"]

#: Truncated HMAC length (RFC 8762 §4.4: "truncated to 128 bits").
HMAC_SIZE = 16


def hmac16(key: bytes, data: bytes | bytearray | memoryview) -> bytes:
    """HMAC-SHA-256 of ``data`` under ``key``, truncated to its first 16 bytes."""
    return hmac.digest(key, data, hashlib.sha256)[:HMAC_SIZE]


def sign(packet: bytes | bytearray, key: bytes) -> bytes:
    """Return ``packet`` (an authenticated base packet plus TLVs) with its HMAC filled in."""
    if len(packet) < AUTH_PACKET_SIZE:
        raise TruncatedError(
            f"authenticated packet of {len(packet)} bytes, need {AUTH_PACKET_SIZE}"
        )
    mac = hmac16(key, memoryview(packet)[:AUTH_HMAC_OFFSET])
    return bytes(packet[:AUTH_HMAC_OFFSET]) + mac + bytes(packet[AUTH_PACKET_SIZE:])


def verify(packet: bytes | bytearray | memoryview, key: bytes) -> bool:
    """True if the packet's HMAC field is right for ``key`` (constant-time comparison).

    A packet too short to hold the HMAC field fails verification rather than raising.
    """
    if len(packet) < AUTH_PACKET_SIZE:
        return False
    view = memoryview(packet)
    expected = hmac16(key, view[:AUTH_HMAC_OFFSET])
    return hmac.compare_digest(expected, bytes(view[AUTH_HMAC_OFFSET:AUTH_PACKET_SIZE]))
