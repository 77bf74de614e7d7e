"""Small helpers used with testbeds: an ICMPv6 ping and CPU pinning.

``ping6`` is done in Python over a raw ICMPv6 socket opened inside the node's namespace
(the kernel fills in the ICMPv6 checksum of raw ICMPv6 sockets, RFC 3542 §3.1): the lab
image has no ``ping`` binary, and this way the test needs nothing but the kernel.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from dataclasses import dataclass

from sixlab.testbed import _netns

__all__ = ["PingResult", "pin_cpu", "ping6"]

#: ICMPv6 Echo Request / Echo Reply types (RFC 4443 §4.1, §4.2).
_ECHO_REQUEST = 128
_ECHO_REPLY = 129
_ECHO = struct.Struct("!BBHHH")


@dataclass(frozen=True, slots=True)
class PingResult:
    """Outcome of :func:`ping6`: how many replies came back and their round-trip times."""

    sent: int
    received: int
    rtts_ms: tuple[float, ...]


def ping6(
    ns: str, dst: str, *, count: int = 3, interval: float = 0.05, timeout: float = 2.0
) -> PingResult:
    """Send ``count`` Echo Requests from namespace ``ns`` to ``dst`` and wait for replies."""
    sock = _netns.netns_socket(ns, socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
    ident = os.getpid() & 0xFFFF
    rtts: list[float] = []
    try:
        for seq in range(count):
            sent_at = time.monotonic()
            sock.sendto(_ECHO.pack(_ECHO_REQUEST, 0, 0, ident, seq) + b"sixlab", (dst, 0))
            deadline = sent_at + timeout
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                try:
                    data = sock.recv(2048)
                except TimeoutError:
                    break
                kind, _, _, rid, rseq = _ECHO.unpack_from(data)
                if kind == _ECHO_REPLY and rid == ident and rseq == seq:
                    rtts.append((time.monotonic() - sent_at) * 1000.0)
                    break
            time.sleep(interval)
    finally:
        sock.close()
    return PingResult(count, len(rtts), tuple(rtts))


def pin_cpu(pid: int, cpu: int) -> None:
    """Pin process ``pid`` (0: this process) to one CPU (the bench's generator/SUT split)."""
    os.sched_setaffinity(pid, {cpu})
