"""The ``memory`` data plane: planes joined in one process, for tests and examples.

A ``MemoryNetwork`` delivers what one plane sends to the plane bound to the destination
address and port, instantly, with a fixed Hop Limit; ``fileno`` is a pipe that polls
readable while datagrams wait. It is the in-memory backend a test suite wants
(docs/architecture.md, "Adapters and registries"): engines and agents run unchanged on
it, with no root and no sockets. Addresses of either family; the Traffic Class given to
``send`` arrives as the datagram's ``tclass``; ``send_labelled`` delivers like ``send``
and records the flow label in ``MemoryNetwork.labels`` (there is no header to carry it).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from ipaddress import IPv6Address

from sixlab.dataplane.base import Dataplane, DataplaneConfig, DataplaneError, IPAddress, Received

__all__ = ["MemoryDataplane", "MemoryNetwork"]


class MemoryNetwork:
    """Where memory planes find each other, by (address, port)."""

    def __init__(self, hop_limit: int = 64, clock: Callable[[], int] = time.time_ns) -> None:
        self.hop_limit = hop_limit
        self.clock = clock
        self._planes: dict[tuple[IPAddress, int], MemoryDataplane] = {}
        self._lock = threading.Lock()
        self._next_port = 40000
        #: Every datagram sent, with the SID list it was sent along (for assertions).
        self.sent: list[tuple[IPAddress, int, tuple[IPv6Address, ...] | None]] = []
        #: The flow label of every datagram sent with ``send_labelled``, with its payload.
        self.labels: list[tuple[int, bytes]] = []

    def plane(self, config: DataplaneConfig) -> MemoryDataplane:
        return MemoryDataplane(config, self)

    def _bind(self, plane: MemoryDataplane, address: IPAddress, port: int) -> int:
        with self._lock:
            if port == 0:
                self._next_port += 1
                port = self._next_port
            if (address, port) in self._planes:
                raise DataplaneError(f"memory: [{address}]:{port} is already bound")
            self._planes[(address, port)] = plane
            return port

    def _unbind(self, address: IPAddress, port: int) -> None:
        with self._lock:
            self._planes.pop((address, port), None)

    def _deliver(self, received: Received, dst: IPAddress, port: int) -> bool:
        with self._lock:
            plane = self._planes.get((dst, port))
        if plane is None:
            return False
        plane._enqueue(received)
        return True


class MemoryDataplane(Dataplane):
    """One endpoint on a ``MemoryNetwork`` (not in the registry: it needs its network)."""

    name = "memory"
    sets_tclass = True
    sets_flow_label = True

    def __init__(self, config: DataplaneConfig, network: MemoryNetwork) -> None:
        super().__init__(config)
        self.network = network
        self.address: IPAddress = config.source or IPv6Address("::1")
        self.port = 0
        self._queue: deque[Received] = deque()
        self._pipe: tuple[int, int] | None = None
        self.undeliverable = 0

    def open(self) -> None:
        if self._pipe is not None:
            return
        self.port = self.network._bind(self, self.address, self.config.port)
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self._pipe = (r, w)

    def close(self) -> None:
        if self._pipe is None:
            return
        self.network._unbind(self.address, self.port)
        for fd in self._pipe:
            os.close(fd)
        self._pipe = None

    @property
    def local_port(self) -> int:
        return self.port

    def fileno(self) -> int:
        if self._pipe is None:
            raise DataplaneError("memory: data plane is not open")
        return self._pipe[0]

    def receive(self, max_batch: int = 64) -> list[Received]:
        # The wake-up pipe is emptied before the queue is read, never after: a datagram
        # queued (and its byte written) between the two would otherwise lose its byte
        # and no select would wake the engine for it. What is left queued past
        # ``max_batch`` gets a byte of its own.
        if self._pipe is not None:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._pipe[0], 4096):
                    pass
        out: list[Received] = []
        while self._queue and len(out) < max_batch:
            out.append(self._queue.popleft())
        if self._pipe is not None and self._queue:
            with contextlib.suppress(BlockingIOError):
                os.write(self._pipe[1], b"x")
        return out

    def send(
        self,
        payload: bytes,
        dst: IPAddress,
        dst_port: int,
        *,
        segments: Sequence[IPv6Address] | None = None,
        src: IPAddress | None = None,
        tclass: int | None = None,
    ) -> None:
        if self._pipe is None:
            raise DataplaneError("memory: data plane is not open")
        net = self.network
        net.sent.append((dst, dst_port, tuple(segments) if segments else None))
        rx = Received(
            payload=bytes(payload),
            src=(src or self.address).packed,
            dst=dst.packed,
            src_port=self.port,
            dst_port=dst_port,
            hop_limit=net.hop_limit,
            rx_ns=net.clock(),
            tclass=0 if tclass is None else tclass,
        )
        if not net._deliver(rx, dst, dst_port):
            self.undeliverable += 1

    def send_labelled(
        self,
        payload: bytes,
        dst: IPv6Address,
        dst_port: int,
        flow_label: int,
        *,
        segments: Sequence[IPv6Address] | None = None,
        src: IPv6Address | None = None,
    ) -> None:
        self.network.labels.append((flow_label, bytes(payload)))
        self.send(payload, dst, dst_port, segments=segments, src=src)

    def _enqueue(self, received: Received) -> None:
        self._queue.append(received)
        if self._pipe is not None:
            with contextlib.suppress(BlockingIOError):
                os.write(self._pipe[1], b"x")
