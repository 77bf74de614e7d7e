"""Loopback measurement mode: the Session-Sender measures a loop with no Session-Reflector.

draft-ietf-spring-stamp-srpm describes, next to STAMP's one-way and two-way modes, a
*loopback* mode for SR paths: the Session-Sender's test packet carries a SID list that
leads it along the path under measurement and back to the Session-Sender itself; the far
end only forwards it by its SRv6 behaviour (End, End.X) and runs no STAMP. The Sender
receives its own packet and measures the loop: round-trip delay T4 − T1 and loss.

Packet format (docs/srpm.md records the decisions): the test packet is the ordinary
Session-Sender packet of RFC 8762 §4.2.1 (unauthenticated) or §4.2.2 (authenticated),
with the SSID of RFC 8972 §3 and any TLVs, sent with the Session-Sender's own address
as the final segment and its own UDP port as the destination port. Nothing on the way
writes into it, so what comes back is what was sent: Seq, T1 and the Error Estimate are
read from their places, the HMAC (authenticated mode) verifies with the session key,
and T1 must be the one sent for that Seq. A Session-Reflector packet that strays here
has T3 where T1 should be and is dropped (``bad-timestamp``).

:func:`decode_looped` is the one step that differs from the two-way Sender: a
``SenderSession`` whose config has ``loopback`` set decodes replies with it and gives
records with ``loopback`` set and T2 = T3 = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from sixlab.stamp._events import DropReason
from sixlab.wire import WireError, stamp_auth
from sixlab.wire import stamp as wire
from sixlab.wire.timestamp import ErrorEstimate

__all__ = ["LoopedPacket", "decode_looped"]


@dataclass(frozen=True, slots=True)
class LoopedPacket:
    """What a returned loopback test packet says (raw wire timestamp for T1)."""

    seq: int
    timestamp: int
    error_estimate: ErrorEstimate
    tlvs: bytes


def decode_looped(data: bytes, *, ssid: int, key: bytes | None) -> LoopedPacket | DropReason:
    """The returned test packet of session ``ssid``, or why it is dropped."""
    if key is not None and not stamp_auth.verify(data, key):
        return DropReason.HMAC_FAILED
    try:
        pkt = wire.decode_sender(data, authenticated=key is not None)
    except WireError:
        return DropReason.TOO_SHORT
    if len(data) < wire.base_size(authenticated=key is not None):
        return DropReason.TOO_SHORT  # a loopback sender always sends the full base packet
    if pkt.ssid != ssid:
        return DropReason.NO_SESSION
    if not pkt.error_estimate.is_valid:
        return DropReason.MULTIPLIER_ZERO
    return LoopedPacket(pkt.seq, pkt.timestamp, pkt.error_estimate, pkt.tlvs)
