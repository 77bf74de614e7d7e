"""The ``afxdp`` plane on an interface with several receive queues, in namespaces.

::

    G  m0 ──────── m1  R (afxdp reflector)
    fd00:8::1          fd00:8::2        a veth pair with 4 TX and 4 RX queues each

A veth delivers a frame on the receive queue whose index is the sender's transmit
queue, and G's kernel picks a transmit queue per flow (a hash of it): probes from 64
UDP source ports land on several of R's queues. An AF_XDP socket serves one queue and
``stamp_xsk`` gives each frame to its own queue's socket (frames of a queue without one
go to the kernel, which has no socket on the port), so every probe is answered only
if the plane serves every queue. A second afxdp plane on the same interface must be
refused with the reason, and leave the first one answering.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from sixlab.dataplane.afxdp_plane import AfXdpDataplane
from sixlab.dataplane.base import DataplaneConfig, DataplaneError
from sixlab.dataplane.engine import ReflectorEngine
from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig
from sixlab.testbed._netns import entered
from sixlab.wire import stamp as wire
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat

from ._pair import Pair, veth_pair

pytestmark = pytest.mark.root

G_ADDR = "fd00:8::1"
R_ADDR = "fd00:8::2"
QUEUES = 4
FLOWS = 64
PORT = 862
EE = ErrorEstimate.for_error_ns(1000, fmt=TimestampFormat.NTP)


@pytest.fixture
def pair() -> Iterator[Pair]:
    with veth_pair(G_ADDR, R_ADDR, if_g="m0", if_r="m1", queues=QUEUES) as p:
        yield p


def _probe(seq: int) -> bytes:
    return wire.encode_sender(wire.SenderPacket(seq, (3_900_000_000 << 32) | seq, EE, 1, b""))


def _answered(p: Pair) -> int:
    """One probe from each of ``FLOWS`` source ports; how many got a reply."""
    socks = [p.g.socket(socket.AF_INET6, socket.SOCK_DGRAM) for _ in range(FLOWS)]
    try:
        for i, s in enumerate(socks):
            s.bind((G_ADDR, 0))
            s.sendto(_probe(i), (R_ADDR, PORT))
        got = 0
        deadline = time.monotonic() + 5
        for s in socks:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                reply = s.recv(2048)
            except TimeoutError:
                continue
            got += len(reply) >= wire.UNAUTH_PACKET_SIZE
        return got
    finally:
        for s in socks:
            s.close()


def test_every_receive_queue_is_served(pair: Pair) -> None:
    with entered(pair.r.ns):
        plane = AfXdpDataplane(DataplaneConfig(PORT, interface="m1"))
        plane.open()
    engine = ReflectorEngine(plane, Reflector())
    engine.set_default(ReflectorSessionConfig(ssid=None))
    engine.start()
    try:
        assert plane.queues == QUEUES
        assert _answered(pair) == FLOWS
        counters = plane.counters()
        per_queue = [counters[f"rx_q{i}"] for i in range(QUEUES)]
        assert sum(per_queue) == FLOWS
        assert sum(n > 0 for n in per_queue) >= 2, per_queue  # the flows did spread

        with entered(pair.r.ns):
            second = AfXdpDataplane(DataplaneConfig(PORT, interface="m1"))
            with pytest.raises(DataplaneError, match="already has an AF_XDP socket"):
                second.open()
        assert _answered(pair) == FLOWS  # the first plane's program and sockets stand
    finally:
        engine.shutdown()
        with entered(pair.r.ns):
            plane.close()
    assert engine.error is None
