"""Cost of walking a TPACKET_V3 ring: ``PacketRing.records()`` next to the walk inlined.

    python benchmarks/bench_ring_walk.py [--trials 21]

No kernel and no packets: the ring is an anonymous ``mmap`` laid out as the kernel
lays out a TPACKET_V3 ring (``sixlab.linux.packetring``'s constants), 64 blocks of
300 packets of 100 bytes, every block handed to user space. Each trial refills it and
reads it 64 packets a call, with a consumer that only looks at the fields, once with
the generator and once with the walk written into the loop (the ``mmap`` plane's
reflector loop before it used ``records()``), alternating. Reported: ns per packet,
best and median of the trials.
"""

from __future__ import annotations

import argparse
import mmap
import time
from collections import Counter
from collections.abc import Callable

from sixlab.linux import packetring as pr

BLOCK_SIZE = 1 << 16
BLOCK_COUNT = 64
PER_BLOCK = 300
PAYLOAD = bytes(range(100))
NET = pr.SLL_OFFSET + 20  # past the sockaddr_ll, as the kernel aligns it
STEP = NET + len(PAYLOAD) + 12


class _SyntheticRing(pr.PacketRing):
    """A PacketRing over an anonymous mapping (no socket)."""

    def __init__(self) -> None:  # the socket-opening constructor is skipped on purpose
        self.map = mmap.mmap(-1, BLOCK_SIZE * BLOCK_COUNT)
        self.block_size, self.block_count = BLOCK_SIZE, BLOCK_COUNT
        self.block = self.left = self.offset = 0
        self.resyncs = 0
        self.errors = Counter()
        self.vnet_hdr = False

    def clear_error(self) -> int:
        return 0

    def fill(self) -> None:
        ring = self.map
        for block in range(BLOCK_COUNT):
            base = block * BLOCK_SIZE
            pr.BLOCK_STATUS.pack_into(ring, base + pr.BLOCK_STATUS_OFFSET, pr.TP_STATUS_USER)
            pr.BLOCK_PKTS.pack_into(ring, base + pr.BLOCK_PKTS_OFFSET, PER_BLOCK, 48)
            pr.BLOCK_SEQ.pack_into(ring, base + pr.BLOCK_SEQ_OFFSET, block)
            off = base + 48
            for i in range(PER_BLOCK):
                nxt = STEP if i < PER_BLOCK - 1 else 0
                size = len(PAYLOAD)
                pr.PKT_HEADER.pack_into(ring, off, nxt, 1, 2, size, size, 0, NET, NET)
                ring[off + NET : off + NET + size] = PAYLOAD
                off += STEP
        self.block = self.left = self.offset = 0


def _inline(rxr: pr.PacketRing, limit: int) -> int:
    ring = rxr.map
    unpack = pr.PKT_HEADER.unpack_from
    consumed = seen = 0
    left, offset = rxr.left, rxr.offset
    while consumed < limit:
        if left == 0:
            rxr.left = 0
            if not rxr.next_block():
                if consumed == 0:
                    rxr.clear_error()
                    if rxr.resync():
                        continue
                break
            left, offset = rxr.left, rxr.offset
            continue
        next_offset, sec, nsec, snaplen, length, status, _mac, net = unpack(ring, offset)
        pkttype = ring[offset + pr.SLL_OFFSET + pr.SLL_PKTTYPE]
        data = ring[offset + net : offset + net + snaplen]
        offset += next_offset
        left -= 1
        if left == 0:
            rxr.release()
        consumed += 1
        rx_ns = sec * 1_000_000_000 + nsec
        seen += snaplen == length and pkttype == 0 and not status and rx_ns > 0 and len(data)
    rxr.left, rxr.offset = left, offset
    return consumed


def _records(rxr: pr.PacketRing, limit: int) -> int:
    consumed = seen = 0
    for data, rx_ns, length, snaplen, status, pkttype, _gso in rxr.records(limit):
        consumed += 1
        seen += snaplen == length and pkttype == 0 and not status and rx_ns > 0 and len(data)
    return consumed


def _trial(ring: _SyntheticRing, walk: Callable[[pr.PacketRing, int], int]) -> float:
    ring.fill()
    total = 0
    start = time.perf_counter_ns()
    while True:
        n = walk(ring, 64)
        total += n
        if n < 64:
            break
    elapsed = time.perf_counter_ns() - start
    if total != BLOCK_COUNT * PER_BLOCK:
        raise SystemExit(f"read {total} packets of {BLOCK_COUNT * PER_BLOCK}")
    return elapsed / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=21)
    args = parser.parse_args()
    ring = _SyntheticRing()
    walks: dict[str, Callable[[pr.PacketRing, int], int]] = {
        "inline": _inline,
        "records": _records,
    }
    results: dict[str, list[float]] = {name: [] for name in walks}
    for _ in range(args.trials):
        for name, walk in walks.items():
            results[name].append(_trial(ring, walk))
    for name, values in results.items():
        values.sort()
        print(f"{name:8s} ns/packet best {values[0]:6.0f}  median {values[len(values) // 2]:6.0f}")


if __name__ == "__main__":
    main()
