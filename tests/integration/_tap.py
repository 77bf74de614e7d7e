"""Packet taps for the integration tests: an ``AF_PACKET`` socket bound to one
interface of a namespace, and what it saw (packet(7)).

Only a socket of protocol ``ETH_P_ALL`` sees the frames the host sends (``outgoing``:
``PACKET_OUTGOING``) besides those it receives; one of a single EtherType sees what
arrives only. ``Tap`` reads on demand (``frames``, ``wait``); ``Capture`` collects on a
thread until stopped.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from sixlab.testbed import Node
from sixlab.testbed._netns import entered

__all__ = [
    "ETH_P_ALL",
    "ETH_P_IPV6",
    "PACKET_OUTGOING",
    "Capture",
    "Frame",
    "Tap",
    "capture",
    "open_tap",
]

#: Every protocol: the only tap that sees sent frames too.
ETH_P_ALL = 0x0003
ETH_P_IPV6 = 0x86DD
#: ``sll_pkttype`` of a frame this host sent (<linux/if_packet.h>).
PACKET_OUTGOING = 4
#: The largest frame read whole.
_SNAP = 65535


def open_tap(
    node: Node | None, ifname: str, *, protocol: int = ETH_P_ALL, cooked: bool = False
) -> socket.socket:
    """An ``AF_PACKET`` socket on ``ifname`` of ``node``'s namespace (None: this
    process's), for ``protocol`` frames; ``cooked``: without the link-layer header
    (``SOCK_DGRAM``), else whole frames (``SOCK_RAW``)."""
    kind = socket.SOCK_DGRAM if cooked else socket.SOCK_RAW
    if node is None:
        sock = socket.socket(socket.AF_PACKET, kind, socket.htons(protocol))
        sock.bind((ifname, protocol))
        return sock
    sock = node.socket(socket.AF_PACKET, kind, socket.htons(protocol))
    with entered(node.ns):
        sock.bind((ifname, protocol))
    return sock


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame a tap saw: its bytes (from the Ethernet header, or the network header
    on a cooked tap), its EtherType, and whether this host sent it."""

    data: bytes
    protocol: int
    outgoing: bool


class Tap:
    """A tap read on demand; a context manager that closes it."""

    def __init__(
        self,
        node: Node | None,
        ifname: str,
        *,
        protocol: int = ETH_P_ALL,
        cooked: bool = False,
    ) -> None:
        self.sock = open_tap(node, ifname, protocol=protocol, cooked=cooked)
        self.sock.setblocking(False)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, frame: bytes) -> None:
        """Send ``frame`` out of the tap's interface."""
        self.sock.send(frame)

    def _read(self) -> Frame | None:
        try:
            data, addr = self.sock.recvfrom(_SNAP)
        except BlockingIOError:
            return None
        return Frame(data, addr[1], addr[2] == PACKET_OUTGOING)

    def frames(self) -> list[Frame]:
        """The frames queued so far, without waiting."""
        out: list[Frame] = []
        while (frame := self._read()) is not None:
            out.append(frame)
        return out

    def wait(
        self, match: Callable[[Frame], bool], *, count: int = 1, timeout: float = 3.0
    ) -> list[Frame]:
        """The first ``count`` frames ``match`` accepts, waiting up to ``timeout`` s in
        all (fewer if they do not come)."""
        out: list[Frame] = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            frame = self._read()
            if frame is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                select.select([self.sock], [], [], left)
                continue
            if match(frame):
                out.append(frame)
        return out


@dataclass
class Capture:
    """Frames read from a socket on a thread (``start``) until ``stop``."""

    sock: socket.socket
    frames: list[bytes] = field(default_factory=list)
    #: Longest frame kept whole.
    size: int = _SNAP
    #: Why the capture ended before ``stop`` (the interface went down), if it did.
    error: OSError | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self.sock.settimeout(0.1)

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.frames.append(self.sock.recv(self.size))
                except TimeoutError:
                    continue
                except OSError as exc:  # the interface went down or away (ENETDOWN)
                    self.error = exc
                    return

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> list[bytes]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sock.close()
        return self.frames

    def ipv6(self) -> list[bytes]:
        return [f[14:] for f in self.frames if f[12:14] == b"\x86\xdd"]

    def write_pcap(self, path: Path) -> None:
        with path.open("wb") as out:
            out.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
            for frame in self.frames:
                out.write(struct.pack("<IIII", 0, 0, len(frame), len(frame)) + frame)


def capture(node: Node, ifname: str) -> Capture:
    """A started ``Capture`` of every frame ``ifname`` of ``node`` sends or receives."""
    cap = Capture(open_tap(node, ifname))
    cap.start()
    return cap
