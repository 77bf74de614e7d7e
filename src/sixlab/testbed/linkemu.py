"""A user-space link emulator: per-direction delay, jitter and loss on a wire.

This kernel has no netem, so the testbed builds the element itself. An emulated link
between ``A`` and ``B`` is two veth pairs joined by a middle namespace::

    A ──veth── mid_a ┤ linkemu ├ mid_b ──veth── B

``mid_a`` and ``mid_b`` carry no IPv6 (``disable_ipv6=1``) so the middle kernel never
answers anything; this process opens one ``AF_PACKET``/``SOCK_RAW`` socket on each,
holds every frame for the configured delay and sends it out of the other side. The
element is a wire for layer 2: neighbour discovery, multicast and SRv6 frames all pass.

Theory of operation
-------------------
- A frame's deadline is its *kernel* receive timestamp (``SO_TIMESTAMPNS``, taken when
  veth hands the frame to the middle namespace) plus the delay, so time spent before
  this process reads the frame does not add to the delay. Deadlines are on the
  monotonic clock (docs/architecture.md, time rule): the kernel stamps the frame with
  the wall clock, so its age (wall clock now less the stamp, never below zero) is taken
  off the monotonic clock's now. A step of the wall clock then neither holds frames
  back nor lets the held ones out early; only a frame read across the step has a wrong
  age (a backward step: it is held its delay from the read; a forward one: it leaves
  at once).
- Deadlines sit in a heap. The loop sleeps in ``select`` until the earliest deadline
  minus a short *spin* window, then busy-waits the rest: ``select`` timeouts are
  microsecond-grained and the timer slack is lowered to 1 ns (``PR_SET_TIMERSLACK``),
  but a wake-up still lands tens of microseconds late on a loaded machine, and the spin
  window absorbs that. The process asks for ``SCHED_FIFO`` when it may, so a busy
  neighbour on the same core does not delay the wake-up.
- Jitter: each frame's delay is ``delay + U(-jitter, +jitter)`` (uniform, like netem's
  default), never below zero, drawn from a per-direction ``random.Random`` seeded from
  ``--seed``. Frames of one direction keep their order by default (a deadline is never
  earlier than the previous frame's — a wire does not reorder); ``--reorder`` lets a
  frame with a smaller draw overtake, as netem does.
- Loss: a frame is dropped with probability ``loss`` (independent draws, same RNG).
- ``PACKET_IGNORE_OUTGOING`` keeps the element from reading back frames it sent.
- ``PACKET_VNET_HDR`` passes the kernel's offload metadata through: a frame that left
  ``A`` with its checksum still to be filled in (``CHECKSUM_PARTIAL``, the veth default)
  or as a GSO super-frame arrives at ``B`` in the same state, so the element needs no
  ``ethtool`` changes on the end interfaces.

Counters (per direction ``ab`` and ``ba``: received, forwarded, dropped_loss,
send_errors, pending, and the element's own lateness late_ns_max/late_ns_sum and its
histogram late_us_log2) are
written as JSON to ``--stats`` on ``SIGUSR1`` and at exit, with a ``generation`` number
that grows with every dump, and printed on stdout at exit (``SIGTERM``/``SIGINT``).
The first stdout line, ``{"event": "ready"}``, tells the parent that both sockets are
bound.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import gc
import heapq
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType

from sixlab.linux.signals import StopOnSignal
from sixlab.testbed._emulation import DirectionConfig

__all__ = ["DirectionConfig", "DirectionStats", "main", "parse_args", "run"]

#: <linux/if_ether.h>: every protocol; bound per socket, not at socket() time, so the
#: socket sees nothing before ``bind`` names the interface.
ETH_P_ALL = 0x0003
#: <linux/if_packet.h> socket options (SOL_PACKET).
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
SOL_PACKET = 263
#: <asm-generic/socket.h>: SO_TIMESTAMPNS / SCM_TIMESTAMPNS (old, 64-bit time_t here).
SO_TIMESTAMPNS = 35
#: <linux/prctl.h>
PR_SET_TIMERSLACK = 29
#: struct virtio_net_hdr (no num_buffers): flags, gso_type, hdr_len, gso_size,
#: csum_start, csum_offset.
VNET_HDR_LEN = 10
#: Largest frame read: a 64 KiB GSO frame plus the virtio header and an Ethernet header.
_RECV_SIZE = 65536 + VNET_HDR_LEN + 64
_TIMESPEC = struct.Struct("=qq")
_NS_PER_S = 1_000_000_000
_NS_PER_MS = 1_000_000
#: Socket receive buffer: a burst of thousands of frames while the loop is busy sending.
_RCVBUF = 4 << 20
#: Default busy-wait window before a deadline (µs): covers the late wake-up of
#: ``select`` on the shared 2-core lab machines (tens of µs, more under load).
DEFAULT_SPIN_US = 200
#: Entries of the lateness histogram: below 1 µs, 2 µs, ... 2**15 µs (32.8 ms), the rest.
LATE_BUCKETS = 17
#: Lateness at or above 2**15 µs lands in the last entry.
_LATE_CAP_US = (1 << (LATE_BUCKETS - 1)) - 1


@dataclass(slots=True)
class DirectionStats:
    """Counters of one direction."""

    received: int = 0
    forwarded: int = 0
    dropped_loss: int = 0
    send_errors: int = 0
    pending: int = 0
    #: Lateness of sends (instant send() is called minus deadline), ns: the element's own
    #: scheduling error.
    late_ns_max: int = 0
    late_ns_sum: int = 0
    #: How many frames left within each power of two of microseconds late: entry ``i``
    #: counts those late by less than 2**i µs (the last entry: the rest). A mean is moved
    #: by one long stall of the machine; this shows the element's usual wake-up error.
    late_us_log2: list[int] = field(default_factory=lambda: [0] * LATE_BUCKETS)


class _Direction:
    """One direction: its config, RNG, counters and the last deadline (for FIFO order)."""

    __slots__ = ("cfg", "last_deadline", "out", "reorder", "rng", "stats")

    def __init__(self, cfg: DirectionConfig, out: socket.socket, seed: str, reorder: bool):
        self.cfg = cfg
        self.out = out
        self.reorder = reorder
        # Seeded, reproducible draws for emulation, not for secrets.
        self.rng = random.Random(seed)  # noqa: S311
        self.stats = DirectionStats()
        self.last_deadline = 0

    def deadline(self, rx_ns: int) -> int | None:
        """The instant the frame leaves, or None when it is lost (``rx_ns``: arrival,
        both on the monotonic clock)."""
        cfg = self.cfg
        if cfg.loss and self.rng.random() < cfg.loss:
            self.stats.dropped_loss += 1
            return None
        delay_ms = cfg.delay_ms
        if cfg.jitter_ms:
            delay_ms = max(0.0, delay_ms + self.rng.uniform(-cfg.jitter_ms, cfg.jitter_ms))
        deadline = rx_ns + round(delay_ms * _NS_PER_MS)
        if not self.reorder:
            deadline = max(deadline, self.last_deadline)
            self.last_deadline = deadline
        return deadline


def _open(ifname: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
    sock.bind((ifname, ETH_P_ALL))
    sock.setblocking(False)
    return sock


def _tune_process(realtime: bool) -> None:
    """Timer slack 1 ns (PR_SET_TIMERSLACK) and, when allowed, SCHED_FIFO."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    if realtime:
        # Not permitted (unprivileged, RT throttled): ordinary scheduling.
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    # The loop allocates tuples at packet rate; a full collection mid-deadline would add
    # milliseconds, and nothing here forms cycles.
    gc.disable()


def _rx_timestamp(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """The kernel's receive time (wall clock, ns); None without one (should not happen)."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = _TIMESPEC.unpack_from(data)
            return int(sec) * _NS_PER_S + int(nsec)
    return None


class _DelayLine:
    """The frames held back, by deadline on the monotonic clock ``mono``.

    ``wall`` is the clock the kernel's receive timestamps are on (``CLOCK_REALTIME``);
    it only ever measures how long ago a frame arrived.
    """

    __slots__ = ("_heap", "_seq", "mono", "wall")

    def __init__(
        self,
        wall: Callable[[], int] = time.time_ns,
        mono: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.wall = wall
        self.mono = mono
        self._heap: list[tuple[int, int, _Direction, bytes]] = []
        self._seq = 0

    def hold(self, d: _Direction, frame: bytes, rx_wall_ns: int | None) -> None:
        """Hold ``frame``, received at ``rx_wall_ns`` by the kernel, for ``d``'s delay
        (or count it lost)."""
        # Wall clock first: a pause between the two readings then makes the frame late,
        # never early.
        age = 0 if rx_wall_ns is None else max(0, self.wall() - rx_wall_ns)
        due = d.deadline(self.mono() - age)
        if due is not None:
            self._seq += 1
            heapq.heappush(self._heap, (due, self._seq, d, frame))

    def next_deadline(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: int) -> tuple[int, _Direction, bytes] | None:
        """The earliest frame whose deadline is ``now`` or earlier, taken out; or None."""
        heap = self._heap
        if not heap or heap[0][0] > now:
            return None
        deadline, _, d, frame = heapq.heappop(heap)
        return deadline, d, frame

    def pending(self) -> list[_Direction]:
        """The direction of every frame held."""
        return [d for _, _, d, _ in self._heap]


def _send_due(line: _DelayLine, now: int) -> None:
    """Send every frame due at ``now``; count what happened and how late it left."""
    while (due := line.pop_due(now)) is not None:
        deadline, d, frame = due
        late = line.mono() - deadline
        try:
            d.out.send(frame)
        except OSError:
            d.stats.send_errors += 1  # interface down, frame too big: count it
            continue
        st = d.stats
        st.forwarded += 1
        st.late_ns_sum += late
        st.late_ns_max = max(st.late_ns_max, late)
        st.late_us_log2[min(max(late, 0) // 1000, _LATE_CAP_US).bit_length()] += 1


def _wait(
    readers: list[socket.socket], line: _DelayLine, now: int, spin_ns: int
) -> list[socket.socket]:
    """Sleep until a frame arrives or the spin window before the next deadline opens;
    the sockets with frames waiting."""
    deadline = line.next_deadline()
    # Inside the spin window the timeout is 0: poll without blocking and go round again.
    timeout = 0.5 if deadline is None else max(0, deadline - now - spin_ns) / _NS_PER_S
    ready: list[socket.socket] = select.select(readers, [], [], timeout)[0]
    return ready


def _read_all(sock: socket.socket, d: _Direction, line: _DelayLine) -> None:
    """Hold every frame waiting on ``sock``."""
    while True:
        try:
            frame, ancdata, _, _ = sock.recvmsg(_RECV_SIZE, 64)
        except BlockingIOError:
            return
        d.stats.received += 1
        line.hold(d, frame, _rx_timestamp(ancdata))


def run(
    if_a: str,
    if_b: str,
    ab: DirectionConfig,
    ba: DirectionConfig,
    *,
    seed: int = 0,
    reorder: bool = False,
    spin_us: int = DEFAULT_SPIN_US,
    realtime: bool = True,
    stats_path: Path | None = None,
) -> dict[str, dict[str, int]]:
    """Forward frames between ``if_a`` and ``if_b`` until SIGTERM/SIGINT; return counters."""
    _tune_process(realtime)
    sock_a, sock_b = _open(if_a), _open(if_b)
    dirs = {
        sock_a.fileno(): _Direction(ab, sock_b, f"{seed}:ab", reorder),
        sock_b.fileno(): _Direction(ba, sock_a, f"{seed}:ba", reorder),
    }
    named = {"ab": dirs[sock_a.fileno()], "ba": dirs[sock_b.fileno()]}
    line = _DelayLine()

    def counters() -> dict[str, dict[str, int]]:
        for d in named.values():
            d.stats.pending = 0
        for d in line.pending():
            d.stats.pending += 1
        return {name: asdict(d.stats) for name, d in named.items()}

    generation = 0

    def dump() -> None:
        nonlocal generation
        if stats_path is None:
            return
        generation += 1  # lets a reader tell a fresh dump from the previous one
        tmp = stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"generation": generation, **counters()}))
        tmp.replace(stats_path)  # atomic: a reader never sees half a file

    def on_dump(_signum: int, _frame: FrameType | None) -> None:
        dump()

    # Cleanup (the last dump) stays inside: a second SIGTERM then only sets the flag again.
    with StopOnSignal() as stop:
        signal.signal(signal.SIGUSR1, on_dump)
        dump()
        sys.stdout.write(json.dumps({"event": "ready"}) + "\n")
        sys.stdout.flush()

        spin_ns = spin_us * 1000
        readers = [sock_a, sock_b]
        mono = line.mono
        while not stop.stopped:
            now = mono()
            _send_due(line, now)
            for sock in _wait(readers, line, now, spin_ns):
                _read_all(sock, dirs[sock.fileno()], line)
        result = counters()
        dump()
    sock_a.close()
    sock_b.close()
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of ``python -m sixlab.testbed.linkemu``."""
    p = argparse.ArgumentParser(
        prog="python -m sixlab.testbed.linkemu",
        description="Forward frames between two interfaces with per-direction delay, "
        "jitter and loss (a user-space netem for this kernel).",
    )
    p.add_argument("if_a", help="interface toward side A")
    p.add_argument("if_b", help="interface toward side B")
    for d in ("ab", "ba"):
        p.add_argument(f"--{d}-delay", type=float, default=0.0, help=f"{d} delay, ms")
        p.add_argument(f"--{d}-jitter", type=float, default=0.0, help=f"{d} jitter, ms")
        p.add_argument(f"--{d}-loss", type=float, default=0.0, help=f"{d} loss probability")
    p.add_argument("--seed", type=int, default=0, help="RNG seed for jitter and loss")
    p.add_argument("--reorder", action="store_true", help="let jitter reorder frames")
    p.add_argument("--spin-us", type=int, default=DEFAULT_SPIN_US, help="busy-wait window")
    p.add_argument("--no-realtime", action="store_true", help="do not ask for SCHED_FIFO")
    p.add_argument("--stats", type=Path, default=None, help="JSON counters file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run until signalled, then print the counters as JSON."""
    args = parse_args(argv)
    result = run(
        args.if_a,
        args.if_b,
        DirectionConfig(args.ab_delay, args.ab_jitter, args.ab_loss),
        DirectionConfig(args.ba_delay, args.ba_jitter, args.ba_loss),
        seed=args.seed,
        reorder=args.reorder,
        spin_us=args.spin_us,
        realtime=not args.no_realtime,
        stats_path=args.stats,
    )
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
