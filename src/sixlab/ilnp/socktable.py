"""The host's socket table, read from the kernel: the ``socket`` policy's oracle.

Theory of operation
-------------------
The admission rule of the ILNP paper (policy ``socket``, docs/papers.md) adopts an ILCC
entry only where a *connected* socket is part of the flow. Applications bind to identifier addresses
(:data:`sixlab.wire.ilnp.IDENTIFIER_PREFIX` + NID), so a socket connected to a
correspondent has that correspondent's NID in the low 64 bits of its remote address.

Source: **sock_diag netlink** (``SOCK_DIAG_BY_FAMILY``, inet_diag, pyroute2's
:class:`~pyroute2.DiagSocket`): one dump per protocol returns every IPv6 socket with
its state, ports and addresses — the same data ``ss`` shows — without text parsing.
``/proc/net/{udp6,tcp6}`` is the fallback when the kernel lacks ``udp_diag``
(``CONFIG_INET_UDP_DIAG``, a module that cannot be loaded here without modprobe): it
carries the same fields, but as text in host byte order and walked line by line.

A dump costs a netlink round trip per protocol, so answers come from a snapshot at
most ``max_age`` seconds old; a query that would answer "no" from a snapshot older than
``min_refresh`` re-reads first, so a socket connected a moment ago is still seen while
a flood of unknown correspondents costs at most one dump per ``max_age``.

States (``include/net/tcp_states.h``): a connected UDP socket reports
TCP_ESTABLISHED (1), an unconnected one TCP_CLOSE (7); a listening TCP socket
TCP_LISTEN (10).
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sixlab.wire.ilnp import IDENTIFIER_PREFIX

__all__ = [
    "KernelSocketTable",
    "SocketInfo",
    "parse_proc_net",
    "proc_net_dump",
    "sock_diag_dump",
]

TCP_ESTABLISHED = 1
TCP_SYN_SENT = 2
TCP_SYN_RECV = 3
TCP_CLOSE = 7
TCP_LISTEN = 10
#: States of a TCP socket that has a peer (everything but CLOSE and LISTEN).
_TCP_CONNECTED = frozenset(range(1, 12)) - {TCP_CLOSE, TCP_LISTEN}
_PROC_FILES = {socket.IPPROTO_UDP: "udp6", socket.IPPROTO_TCP: "tcp6"}
_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class SocketInfo:
    """One IPv6 socket: protocol, TCP-style state, local port, remote address and port."""

    protocol: int
    state: int
    local_port: int
    remote: int  # the 128-bit remote address as an integer (0 when unconnected)
    remote_port: int


def sock_diag_dump(protocol: int) -> list[SocketInfo]:
    """Every IPv6 socket of ``protocol`` through sock_diag (pyroute2 DiagSocket)."""
    from pyroute2 import DiagSocket  # noqa: PLC0415 - only the daemon needs netlink

    with DiagSocket() as diag:
        diag.bind()
        messages = diag.get_sock_stats(family=socket.AF_INET6, protocol=protocol)
    return [
        SocketInfo(
            protocol,
            int(m["idiag_state"]),
            int(m["idiag_sport"]),
            int(ipaddress.IPv6Address(m["idiag_dst"])),
            int(m["idiag_dport"]),
        )
        for m in messages
    ]


def _proc_address(text: str) -> tuple[int, int]:
    """``/proc/net`` ``ADDR:PORT``: the address is four 32-bit words in host order."""
    addr, port = text.split(":")
    raw = b"".join(bytes.fromhex(addr[i : i + 8])[::-1] for i in range(0, 32, 8))
    if socket.htonl(1) == 1:  # big-endian host: the words are already in network order
        raw = bytes.fromhex(addr)
    return int.from_bytes(raw, "big"), int(port, 16)


def parse_proc_net(text: str, protocol: int) -> list[SocketInfo]:
    """Parse ``/proc/net/udp6`` or ``tcp6`` text (the header line is skipped)."""
    sockets = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4:
            continue
        _local_addr, local_port = _proc_address(fields[1])
        remote, remote_port = _proc_address(fields[2])
        sockets.append(SocketInfo(protocol, int(fields[3], 16), local_port, remote, remote_port))
    return sockets


def proc_net_dump(protocol: int) -> list[SocketInfo]:
    """Every IPv6 socket of ``protocol`` from ``/proc/net`` (the fallback source)."""
    name = _PROC_FILES.get(protocol)
    if name is None:
        return []
    return parse_proc_net(Path("/proc/net", name).read_text(encoding="ascii"), protocol)


class KernelSocketTable:
    """A :class:`sixlab.ilnp.SocketTable` backed by the kernel's own socket table."""

    def __init__(
        self,
        *,
        identifier_prefix: int = IDENTIFIER_PREFIX,
        max_age: float = 0.1,
        min_refresh: float = 0.005,
        dump: Callable[[int], list[SocketInfo]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.identifier_prefix = identifier_prefix
        self.max_age = max_age
        self.min_refresh = min_refresh
        self.source = "sock_diag"
        self._dump = dump if dump is not None else self._default_dump
        self._clock = clock
        self._snapshots: dict[int, tuple[float, list[SocketInfo]]] = {}
        self.dumps = 0

    def _default_dump(self, protocol: int) -> list[SocketInfo]:
        if self.source == "sock_diag":
            try:
                return sock_diag_dump(protocol)
            except OSError:
                self.source = "proc"  # no udp_diag/tcp_diag in this kernel
        return proc_net_dump(protocol)

    def _sockets(self, protocol: int, *, want_fresh: bool) -> list[SocketInfo]:
        now = self._clock()
        cached = self._snapshots.get(protocol)
        limit = self.min_refresh if want_fresh else self.max_age
        if cached is not None and now - cached[0] < limit:
            return cached[1]
        self.dumps += 1
        sockets = self._dump(protocol)
        self._snapshots[protocol] = (now, sockets)
        return sockets

    def _connected(self, info: SocketInfo) -> bool:
        if info.protocol == socket.IPPROTO_TCP:
            return info.state in _TCP_CONNECTED
        return info.state == TCP_ESTABLISHED

    def _match(self, protocol: int, local_port: int, remote_nid: int, remote_port: int) -> bool:
        prefix = self.identifier_prefix
        return any(
            s.local_port == local_port
            and s.remote_port == remote_port
            and s.remote >> 64 == prefix
            and s.remote & _U64 == remote_nid
            and self._connected(s)
            for s in self._sockets(protocol, want_fresh=False)
        )

    def has_connected(
        self, protocol: int, local_port: int, remote_nid: int, remote_port: int
    ) -> bool:
        if self._match(protocol, local_port, remote_nid, remote_port):
            return True
        self._sockets(protocol, want_fresh=True)
        return self._match(protocol, local_port, remote_nid, remote_port)

    def is_listening(self, protocol: int, local_port: int) -> bool:
        wanted = TCP_LISTEN if protocol == socket.IPPROTO_TCP else TCP_CLOSE
        return any(
            s.local_port == local_port and s.state == wanted
            for s in self._sockets(protocol, want_fresh=False)
        )
