"""The kernel socket table behind the ``socket`` admission policy."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from sixlab.ilnp import HostConfig, IlnpHost, create_policy
from sixlab.ilnp.socktable import (
    TCP_CLOSE,
    TCP_ESTABLISHED,
    TCP_LISTEN,
    KernelSocketTable,
    SocketInfo,
    parse_proc_net,
    proc_net_dump,
    sock_diag_dump,
)
from sixlab.wire.ilnp import (
    IDENTIFIER_PREFIX,
    ILV,
    IlnpPacket,
    LocatorEntry,
    Nonce,
    decode_packet,
    encode_packet,
)

UDP, TCP = socket.IPPROTO_UDP, socket.IPPROTO_TCP
PEER = 0xB
PEER_ADDR = (IDENTIFIER_PREFIX << 64) | PEER

# /proc/net/udp6 as this kernel writes it (x86, little-endian words): a socket on
# [::]:7 and one from [::1]:40000 connected to [fd00:2ff::b]:9.
PROC_UDP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  1: 00000000000000000000000000000000:0007 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0000000000000000 0
  2: 00000000000000000000000001000000:9C40 FF0200FD00000000000000000B000000:0009 01 00000000:00000000 00:00000000 00000000     0        0 3 2 0000000000000000 0
"""  # noqa: E501 - kernel output, one socket a line


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeKernel:
    """A dump function over a mutable list of sockets, counting its calls."""

    def __init__(self) -> None:
        self.sockets: list[SocketInfo] = []
        self.calls = 0

    def __call__(self, protocol: int) -> list[SocketInfo]:
        self.calls += 1
        return [s for s in self.sockets if s.protocol == protocol]


def test_proc_net_parse() -> None:
    if socket.htonl(1) == 1:
        pytest.skip("sample text is from a little-endian kernel")
    unconnected, connected = parse_proc_net(PROC_UDP6, UDP)
    assert unconnected == SocketInfo(UDP, TCP_CLOSE, 7, 0, 0)
    assert connected == SocketInfo(UDP, TCP_ESTABLISHED, 40000, PEER_ADDR, 9)


def test_table_answers_connected_and_listening() -> None:
    kernel = FakeKernel()
    kernel.sockets = [
        SocketInfo(UDP, TCP_ESTABLISHED, 5000, PEER_ADDR, 7),
        SocketInfo(UDP, TCP_CLOSE, 7, 0, 0),
        SocketInfo(TCP, TCP_LISTEN, 80, 0, 0),
        SocketInfo(TCP, TCP_ESTABLISHED, 80, PEER_ADDR, 4000),
        SocketInfo(UDP, TCP_ESTABLISHED, 6000, (0x2001_0DB8 << 96) | PEER, 7),  # not ID
    ]
    table = KernelSocketTable(dump=kernel, clock=Clock())
    assert table.has_connected(UDP, 5000, PEER, 7)
    assert not table.has_connected(UDP, 5000, PEER + 1, 7)
    assert not table.has_connected(UDP, 5000, PEER, 8)
    assert not table.has_connected(UDP, 6000, PEER, 7)  # not an identifier address
    assert table.has_connected(TCP, 80, PEER, 4000)
    assert table.is_listening(UDP, 7)
    assert not table.is_listening(UDP, 5000)
    assert table.is_listening(TCP, 80)
    assert not table.is_listening(TCP, 81)


def test_snapshots_are_reused_but_a_miss_refreshes_a_stale_one() -> None:
    kernel, clock = FakeKernel(), Clock()
    table = KernelSocketTable(dump=kernel, clock=clock, max_age=0.1, min_refresh=0.005)
    assert not table.has_connected(UDP, 5000, PEER, 7)
    calls = kernel.calls
    assert not table.has_connected(UDP, 5000, PEER, 7)  # same instant: no new dump
    assert kernel.calls == calls
    kernel.sockets.append(SocketInfo(UDP, TCP_ESTABLISHED, 5000, PEER_ADDR, 7))
    clock.now += 0.01  # past min_refresh: a miss re-reads and sees the new socket
    assert table.has_connected(UDP, 5000, PEER, 7)
    calls = kernel.calls
    for _ in range(100):  # a flood of unknown peers within min_refresh: no dumps
        table.has_connected(UDP, 5000, PEER + 1, 7)
    assert kernel.calls == calls
    assert table.dumps == kernel.calls


@pytest.fixture
def loopback_sockets() -> Iterator[tuple[socket.socket, socket.socket]]:
    connected = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    connected.bind(("::1", 0))
    connected.connect(("::1", 9))
    unconnected = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    unconnected.bind(("::1", 0))
    try:
        yield connected, unconnected
    finally:
        connected.close()
        unconnected.close()


@pytest.mark.parametrize("dump", [sock_diag_dump, proc_net_dump])
def test_real_kernel_sources_see_our_sockets(
    dump: object, loopback_sockets: tuple[socket.socket, socket.socket]
) -> None:
    """Both sources (sock_diag, /proc/net) find a connected and an unconnected socket."""
    assert callable(dump)
    connected, unconnected = loopback_sockets
    found = {s.local_port: s for s in dump(UDP)}
    c = found[connected.getsockname()[1]]
    assert c.state == TCP_ESTABLISHED
    assert c.remote == 1  # ::1
    assert c.remote_port == 9
    u = found[unconnected.getsockname()[1]]
    assert (u.state, u.remote, u.remote_port) == (TCP_CLOSE, 0, 0)


def test_kernel_table_with_loopback_as_identifier_prefix(
    loopback_sockets: tuple[socket.socket, socket.socket],
) -> None:
    """The real table, with prefix 0 so that ::1 reads as NID 1."""
    connected, unconnected = loopback_sockets
    table = KernelSocketTable(identifier_prefix=0)
    assert table.source == "sock_diag"
    assert table.has_connected(UDP, connected.getsockname()[1], 1, 9)
    assert not table.has_connected(UDP, connected.getsockname()[1], 2, 9)
    assert table.is_listening(UDP, unconnected.getsockname()[1])


def _tcp_segment(sport: int, dport: int) -> bytes:
    return struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 5 << 4, 0x10, 65535, 0, 0)


def test_socket_policy_promotes_a_peer_once_its_socket_connects() -> None:
    """A TCP server: the SYN finds only a listener (no entry); once the accepted socket
    exists, the next packet after readmit_interval promotes the peer, nonces kept."""
    kernel, clock = FakeKernel(), Clock()
    kernel.sockets = [SocketInfo(TCP, TCP_LISTEN, 80, 0, 0)]
    table = KernelSocketTable(dump=kernel, clock=clock)
    loc_a, loc_b = 0x2001_0DB8_000A_0000, 0x2001_0DB8_000B_0000
    host = IlnpHost(
        HostConfig(nid=0xA, locators=(LocatorEntry(loc_a),), readmit_interval=0.25),
        policy=create_policy("socket", sockets=table),
    )
    nonce = Nonce(b"\x01\x02\x03\x04")

    def from_peer(now: float) -> None:
        clock.now = now
        packet = IlnpPacket(ILV(loc_b, PEER), ILV(loc_a, 0xA), 6, _tcp_segment(4000, 80), nonce)
        host.receive(encode_packet(packet), now)

    from_peer(0.0)
    assert len(host.ilcc) == 0
    assert host.counters["not_adopted_unconnected_socket"] == 1
    # Our answer goes out through the reply table, with the nonce the peer will learn.
    reply = IlnpPacket(
        ILV(IDENTIFIER_PREFIX, 0xA), ILV(IDENTIFIER_PREFIX, PEER), 6, _tcp_segment(80, 4000)
    )
    host.send(encode_packet(reply), 0.0)
    (wire,) = host.datagrams_to_send()
    our_nonce = decode_packet(wire).nonce
    kernel.sockets.append(SocketInfo(TCP, TCP_ESTABLISHED, 80, PEER_ADDR, 4000))
    from_peer(0.1)  # before readmit_interval: still not asked again
    assert len(host.ilcc) == 0
    from_peer(0.3)
    entry = host.ilcc.get(PEER)
    assert entry is not None
    assert host.counters["adopted_late"] == 1
    assert entry.peer_nonce == nonce
    assert entry.local_nonce == our_nonce
    assert not host.can_reach(PEER + 1, 0.3)
    assert host.can_reach(PEER, 0.3)
