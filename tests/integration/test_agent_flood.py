"""A reflector agent under a flood of malformed STAMP packets keeps working and counts
every drop by reason (no crash, no reply to garbage)."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator

import pytest

from sixlab.southbound import AgentClient, AgentServer, ReflectorSession, SenderSession, serve
from sixlab.wire import stamp as wire
from sixlab.wire import stamp_auth
from sixlab.wire.timestamp import ErrorEstimate

MS = 1_000_000
FLOOD = 3000


@pytest.fixture
def agents() -> Iterator[tuple[AgentClient, AgentClient, int, list[AgentServer]]]:
    rserver = serve("[::1]:0", "reflector")
    sserver = serve("[::1]:0", "sender")
    reflector = AgentClient(f"[::1]:{rserver.port}")
    sender = AgentClient(f"[::1]:{sserver.port}")
    try:
        port = reflector.init(port=0, source="::1")
        sender.init(port=0, source="::1")
        yield sender, reflector, port, [sserver, rserver]
    finally:
        sender.close()
        reflector.close()
        sserver.stop(None)
        rserver.stop(None)


def _garbage(rng: random.Random) -> tuple[str, bytes]:
    """One malformed packet and the drop reason it must be counted under."""
    good = wire.encode_sender(wire.SenderPacket(1, 2, ErrorEstimate(), 5))
    kind = rng.choice(["short", "multiplier", "nosession", "hmac"])
    if kind == "short":
        return "too-short", bytes(rng.randrange(256) for _ in range(rng.randrange(14)))
    if kind == "multiplier":
        return "multiplier-zero", good[:12] + b"\x00\x00" + good[14:]  # Multiplier 0
    if kind == "nosession":
        return "no-session", good[:14] + (999).to_bytes(2) + good[16:]
    signed = bytearray(
        stamp_auth.sign(
            wire.encode_sender(wire.SenderPacket(1, 2, ErrorEstimate(), 7), authenticated=True),
            b"the-key",
        )
    )
    # Tampered after signing, anywhere the HMAC covers but the SSID (26:28), so that the
    # packet stays addressed to the authenticated session.
    signed[rng.choice([*range(4, 26), *range(28, 96)])] ^= 0xFF
    return "hmac-failed", bytes(signed)


def test_flood_of_malformed_packets(
    agents: tuple[AgentClient, AgentClient, int, list[AgentServer]],
) -> None:
    sender, reflector, port, _servers = agents
    reflector.create_reflector_session(ReflectorSession(5))
    reflector.create_reflector_session(ReflectorSession(7, key=b"the-key"))
    reflector.start_session(5)
    reflector.start_session(7)
    rng = random.Random(8762)
    expected: dict[str, int] = {}
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
        s.bind(("::1", 0))
        s.setblocking(False)
        for i in range(FLOOD):
            reason, data = _garbage(rng)
            expected[reason] = expected.get(reason, 0) + 1
            s.sendto(data, ("::1", port))
            if i % 200 == 0:
                time.sleep(0.005)  # stay under the socket buffer: every packet must count
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            rc = reflector.counters().reflector
            if rc.received >= FLOOD:
                break
            time.sleep(0.05)
        time.sleep(0.2)
        replies = []
        while True:
            try:
                replies.append(s.recv(2048))
            except BlockingIOError:
                break
        assert replies == [], (len(replies), replies[:2], reflector.counters().reflector)
    rc = reflector.counters().reflector
    assert rc.received == FLOOD
    assert rc.reflected == 0
    assert dict(rc.dropped) == expected
    # And the agent still measures.
    sender.create_sender_session(
        SenderSession(
            5, "::1", reflector_port=port, count=20, interval_ns=5 * MS, loss_timeout_ns=500 * MS
        )
    )
    sender.start_session(5)
    deadline = time.monotonic() + 10
    got = 0
    while got < 20 and time.monotonic() < deadline:
        got += len(sender.results(5).results)
        time.sleep(0.05)
    assert got == 20
