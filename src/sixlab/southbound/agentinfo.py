"""What an agent's GetAgentInfo answer says of its sessions without listing them.

A controller asks every agent how it is every second (docs/architecture.md, "Orphan
sessions"); an agent holding 10,000 sessions listed their 10,000 SSIDs in each answer,
which the agent built and the controller parsed and compared, every second. Asked
``without_ssids``, the answer carries only their count and this digest; the controller
asks for the list when the digest (or the agent's run, or its Init) changed.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from sixlab.southbound._generated import stamp_pb2 as pb

__all__ = ["info_sessions", "ssids_digest"]


def ssids_digest(ssids: Sequence[int]) -> int:
    """The digest of SSIDs given ascending: the first 8 bytes of BLAKE2b over them,
    each as 4 bytes little-endian, read as an unsigned little-endian integer."""
    packed = struct.pack(f"<{len(ssids)}I", *ssids)
    return int.from_bytes(hashlib.blake2b(packed, digest_size=8).digest(), "little")


def info_sessions(
    reply: pb.GetAgentInfoReply, request: pb.GetAgentInfoRequest, ssids: Sequence[int]
) -> pb.GetAgentInfoReply:
    """Fill ``reply``'s sessions (``ssids`` ascending) as ``request`` asks: their count
    and digest, and the list unless asked ``without_ssids``."""
    reply.ssid_count = len(ssids)
    reply.ssids_digest = ssids_digest(ssids)
    if not request.without_ssids:
        reply.ssids.extend(ssids)
    return reply
