"""The shared TPACKET_V3 ring (:mod:`sixlab.linux.packetring`) and its two users after a
link flap: the socket error the kernel sets must be read once, then the ring sleeps.

Topology: ``h eth0 ── p0 p`` (one veth pair in two namespaces).
"""

from __future__ import annotations

import gc
import select
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from sixlab.dataplane.base import DataplaneConfig
from sixlab.dataplane.mmap_plane import MmapDataplane
from sixlab.linux.cbpf import (
    ACCEPT_SNAPLEN,
    BPF_ABS,
    BPF_B,
    BPF_H,
    BPF_JEQ,
    BPF_JMP,
    BPF_K,
    BPF_LD,
    BPF_RET,
    Assembler,
    BpfInstruction,
)
from sixlab.linux.packetring import (
    BLOCK_STATUS,
    BLOCK_STATUS_OFFSET,
    TP_STATUS_KERNEL,
    TP_STATUS_USER,
    PacketRing,
)
from sixlab.testbed import Node, Testbed
from sixlab.testbed._netns import entered

pytestmark = pytest.mark.root

PREFIX = "sixlab-t-"
H_ADDR = "2001:db8:a::a"
PORT = 9


@dataclass
class Pair:
    tb: Testbed
    h: Node
    p: Node

    def flap(self) -> None:
        """eth0 down and up; the static address goes with it and is put back (SLAAC
        would, in the field)."""
        self.tb.exec_in(self.h, ["ip", "link", "set", "eth0", "down"])
        self.tb.exec_in(self.h, ["ip", "link", "set", "eth0", "up"])
        self.h.add_address("eth0", H_ADDR)


@pytest.fixture
def pair() -> Iterator[Pair]:
    with Testbed(prefix=PREFIX) as tb:
        h = tb.add_node("h")
        p = tb.add_node("p")
        tb.add_link(h, p, if_a="eth0", if_b="p0", addr_a=H_ADDR, addr_b="2001:db8:a::b")
        yield Pair(tb, h, p)


def _udp_port_filter(port: int) -> tuple[BpfInstruction, ...]:
    """Classic BPF: Ethernet + IPv6 + UDP to ``port`` (no extension headers)."""
    asm = Assembler()
    asm.emit(BPF_LD | BPF_B | BPF_ABS, 14 + 6)
    asm.emit(BPF_JMP | BPF_JEQ | BPF_K, 17, jt=0, jf="drop")
    asm.emit(BPF_LD | BPF_H | BPF_ABS, 14 + 40 + 2)
    asm.emit(BPF_JMP | BPF_JEQ | BPF_K, port, jt=0, jf="drop")
    asm.emit(BPF_RET | BPF_K, ACCEPT_SNAPLEN)
    asm.label("drop")
    asm.emit(BPF_RET | BPF_K, 0)
    return asm.finish()


def wait_until(check: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_ring_socket_error_is_cleared_once_and_the_ring_reads_again(pair: Pair) -> None:
    """A link that goes down and up: the socket polls readable with nothing in the
    ring until the error is read, once; then it sleeps, and receives again."""
    with entered(pair.h.ns):  # UDP to one port only: the link's own ND/MLD stay out
        ring = PacketRing("eth0", program=_udp_port_filter(PORT))
    try:
        assert select.select([ring], [], [], 0.1)[0] == []
        pair.flap()
        for _ in range(3):  # level-triggered: it stays readable while the error is set
            assert select.select([ring], [], [], 1.0)[0] == [ring]
        assert list(ring.frames()) == []
        assert dict(ring.errors) == {"ENETDOWN": 1}
        assert select.select([ring], [], [], 0.2)[0] == []
        with pair.p.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sender:

            def arrives() -> bool:
                sender.sendto(b"ring", (H_ADDR, PORT))
                time.sleep(0.05)
                return any(f.data.endswith(b"ring") for f in ring.frames())

            wait_until(arrives, what="a packet in the ring")  # hooked again on link up
    finally:
        ring.close()
    assert dict(ring.errors) == {"ENETDOWN": 1}


@pytest.mark.parametrize("path", ["receive", "reflect_batch"])
def test_mmap_plane_clears_the_ring_error_after_a_link_flap(pair: Pair, path: str) -> None:
    """The STAMP mmap plane reads the same ring: after a flap, one call that finds
    nothing clears the error, and ``select`` on the plane sleeps again (it used to
    report it readable for ever, and the engine's loop spun)."""
    with entered(pair.h.ns):
        plane = MmapDataplane(DataplaneConfig(port=862, interface="eth0"))
        plane.open()
    try:
        fd = plane.fileno()
        assert select.select([fd], [], [], 0.1)[0] == []
        pair.flap()
        assert select.select([fd], [], [], 1.0)[0] == [fd]
        if path == "receive":
            assert plane.receive() == []
        else:

            def reflect_nothing(
                data: bytes, t2: int, clock: Callable[[], int], hop: int, /, *, flow: object
            ) -> None:
                return None

            batch = plane.reflect_batch(reflect_nothing, time.time_ns)
            assert batch.consumed == 0
        assert select.select([fd], [], [], 0.3)[0] == []
    finally:
        with warnings.catch_warnings(), entered(pair.h.ns):  # nft(8) removes its table
            warnings.simplefilter("ignore", ResourceWarning)
            plane.close()
            gc.collect()


def _blocks_handed_over(ring: PacketRing) -> list[int]:
    """The blocks whose status is the user's, in ring order."""
    return [
        b
        for b in range(ring.block_count)
        if BLOCK_STATUS.unpack_from(ring.map, b * ring.block_size + BLOCK_STATUS_OFFSET)[0]
        & TP_STATUS_USER
    ]


def _lose_place(pair: Pair, ring: PacketRing, port: int) -> None:
    """Three datagrams in three blocks (each retired on its own timer), then the
    cursor's block handed back to the kernel unread: the ring's cursor now points at a
    block the kernel owns, with the user's blocks after it. The state the ``mmap``
    plane was seen in after overload (benchmarks/README.md, issue 14 section): the
    reader waited there while the kernel filled every other block, and answered each
    probe one lap of the ring late."""
    with pair.p.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sender:
        for i in range(3):
            sender.sendto(b"lost-%d" % i, (H_ADDR, port))
            time.sleep(0.02)  # > the ring's retire_ms: one block per datagram
    wait_until(lambda: len(_blocks_handed_over(ring)) == 3, what="three blocks handed over")
    assert ring.block == 0
    BLOCK_STATUS.pack_into(ring.map, BLOCK_STATUS_OFFSET, TP_STATUS_KERNEL)


def test_ring_that_lost_its_place_goes_on_at_the_oldest_user_block(pair: Pair) -> None:
    with entered(pair.h.ns):
        ring = PacketRing("eth0", program=_udp_port_filter(PORT))
    try:
        _lose_place(pair, ring, PORT)
        got = [bytes(f.data[-6:]) for f in ring.frames()]
        assert got == [b"lost-1", b"lost-2"]  # block 0's datagram went back unread
        assert ring.resyncs == 1
        assert _blocks_handed_over(ring) == []
        with pair.p.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sender:

            def arrives() -> bool:
                sender.sendto(b"in-step", (H_ADDR, PORT))
                time.sleep(0.05)
                return any(f.data.endswith(b"in-step") for f in ring.frames())

            wait_until(arrives, what="the next datagram, read in step")
        assert ring.resyncs == 1
    finally:
        ring.close()


@pytest.mark.parametrize("path", ["receive", "reflect_batch"])
def test_mmap_plane_goes_on_at_the_oldest_user_block(pair: Pair, path: str) -> None:
    with entered(pair.h.ns):
        plane = MmapDataplane(DataplaneConfig(port=862, interface="eth0"))
        plane.open()
    try:
        ring = plane._rxring
        assert ring is not None
        _lose_place(pair, ring, 862)
        if path == "receive":
            assert [rx.payload for rx in plane.receive()] == [b"lost-1", b"lost-2"]
        else:
            seen: list[bytes] = []

            def reflect_nothing(
                data: bytes, t2: int, clock: Callable[[], int], hop: int, /, *, flow: object
            ) -> None:
                seen.append(bytes(data))

            batch = plane.reflect_batch(reflect_nothing, time.time_ns)
            assert batch.consumed == 2
            assert seen == [b"lost-1", b"lost-2"]
        assert plane.counters()["rx_ring_resyncs"] == 1
    finally:
        with warnings.catch_warnings(), entered(pair.h.ns):  # nft(8) removes its table
            warnings.simplefilter("ignore", ResourceWarning)
            plane.close()
            gc.collect()


def test_records_stopped_early_leaves_the_rest_for_the_next_walk(pair: Pair) -> None:
    """The walk keeps the cursor in the generator: a loop that breaks, or a limit,
    must leave the packets it did not take for the next call, in order, none twice."""
    with entered(pair.h.ns):
        ring = PacketRing("eth0", program=_udp_port_filter(PORT))
    try:
        sent = [f"walk-{i}".encode() for i in range(6)]
        with pair.p.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sender:
            for payload in sent:
                sender.sendto(payload, (H_ADDR, PORT))
        wait_until(lambda: ring.statistics()[0] >= len(sent), what="six datagrams")
        time.sleep(0.05)  # past retire_ms: the last block is handed over
        got: list[bytes] = []
        for record in ring.records():
            got.append(bytes(record[0][-6:]))
            if len(got) == 2:
                break
        got += [bytes(record[0][-6:]) for record in ring.records(limit=1)]
        got += [bytes(frame.data[-6:]) for frame in ring.frames()]
        assert got == sent
        assert list(ring.records()) == []
    finally:
        ring.close()
