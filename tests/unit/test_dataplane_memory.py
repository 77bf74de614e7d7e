"""The memory plane's wake-up pipe (``sixlab.dataplane.memory``): a datagram queued while
``receive`` empties the queue leaves the plane readable."""

from __future__ import annotations

import os
import select
from ipaddress import IPv6Address

import pytest

from sixlab.dataplane import memory
from sixlab.dataplane.base import DataplaneConfig


def test_a_datagram_queued_while_receive_empties_the_queue_keeps_the_plane_readable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A datagram another thread queues after ``receive`` took the last one and before it
    reads the pipe empty must leave ``fileno`` readable, or no select wakes its engine
    for it until some later datagram (a reflector engine never answered it)."""
    network = memory.MemoryNetwork()
    a = network.plane(DataplaneConfig(port=0, source=IPv6Address("fd00::1")))
    b = network.plane(DataplaneConfig(port=0, source=IPv6Address("fd00::2")))
    a.open()
    b.open()
    a.send(b"first", b.address, b.port)
    real_read = os.read
    raced: list[bool] = []

    def read(fd: int, n: int) -> bytes:
        if fd == b.fileno() and not raced:  # the other thread's send lands here
            raced.append(True)
            a.send(b"second", b.address, b.port)
        return real_read(fd, n)

    monkeypatch.setattr(memory.os, "read", read)
    got = [r.payload for r in b.receive()]
    monkeypatch.undo()
    assert raced
    while select.select([b.fileno()], [], [], 0)[0]:  # what an engine's select does
        got += [r.payload for r in b.receive()]
    assert got == [b"first", b"second"]
    a.close()
    b.close()
