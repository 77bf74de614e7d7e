"""The link emulator's delays are on the monotonic clock: a wall-clock step (NTP, an
operator setting the date) neither stalls the frames held nor lets them out in a burst.

The kernel stamps frames with the wall clock; the element turns that into an age and
schedules on the monotonic clock (docs/architecture.md, time rule). Both clocks are
injected here and stepped apart.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from sixlab.testbed._emulation import DirectionConfig
from sixlab.testbed.linkemu import LATE_BUCKETS, _DelayLine, _Direction, _send_due
from tests.unit.test_engine import SteppedClocks as Clocks

MS = 1_000_000
HOUR = 3600 * 1_000_000_000


@pytest.fixture
def out() -> Iterator[socket.socket]:
    a, b = socket.socketpair()
    yield a
    a.close()
    b.close()


def _released(line: _DelayLine, now: int) -> list[bytes]:
    frames = []
    while (due := line.pop_due(now)) is not None:
        frames.append(due[2])
    return frames


@pytest.mark.parametrize("step", [HOUR, -HOUR], ids=["forward", "backward"])
def test_a_wall_clock_step_neither_stalls_nor_bursts(out: socket.socket, step: int) -> None:
    clocks = Clocks()
    line = _DelayLine(wall=clocks.wall, mono=clocks.mono)
    d = _Direction(DirectionConfig(delay_ms=10), out, "0:ab", reorder=False)
    # Received by the kernel 1 ms before the element reads it.
    line.hold(d, b"first", clocks.wall() - 1 * MS)
    clocks.advance(2 * MS)
    clocks.wall_ns += step
    line.hold(d, b"second", clocks.wall())  # received just after the step
    clocks.advance(6 * MS)  # 7 ms after "first" arrived, 6 ms after "second"
    assert _released(line, clocks.mono()) == []  # no burst
    clocks.advance(3 * MS)
    assert _released(line, clocks.mono()) == [b"first"]  # no stall: 10 ms after arrival
    clocks.advance(3 * MS)
    assert _released(line, clocks.mono()) == [b"second"]
    assert line.next_deadline() is None


def test_a_frame_read_across_a_backward_step_is_held_its_delay(out: socket.socket) -> None:
    """Stamped before the step, read after it: its age would be negative, and the
    element counts it as just arrived instead of holding it for an hour."""
    clocks = Clocks()
    line = _DelayLine(wall=clocks.wall, mono=clocks.mono)
    d = _Direction(DirectionConfig(delay_ms=10), out, "0:ab", reorder=False)
    stamped = clocks.wall()
    clocks.advance(1 * MS)
    clocks.wall_ns -= HOUR
    line.hold(d, b"frame", stamped)
    assert line.next_deadline() == clocks.mono() + 10 * MS


def test_without_a_kernel_timestamp_the_frame_counts_from_its_read(out: socket.socket) -> None:
    clocks = Clocks()
    line = _DelayLine(wall=clocks.wall, mono=clocks.mono)
    d = _Direction(DirectionConfig(delay_ms=4), out, "0:ab", reorder=False)
    line.hold(d, b"frame", None)
    assert line.next_deadline() == clocks.mono() + 4 * MS
    assert line.pending() == [d]


def test_lateness_is_counted_per_power_of_two_of_microseconds(out: socket.socket) -> None:
    """The histogram shows the element's usual wake-up error where a mean would be moved
    by one stall: three frames sent 0.5 µs, 3 µs and 40 ms after their deadlines."""
    clocks = Clocks()
    line = _DelayLine(wall=clocks.wall, mono=clocks.mono)
    d = _Direction(DirectionConfig(delay_ms=1), out, "0:ab", reorder=False)
    for late_ns in (500, 3_000, 40 * MS):
        line.hold(d, b"frame", None)
        clocks.advance(1 * MS + late_ns)
        _send_due(line, clocks.mono())
    hist = d.stats.late_us_log2
    assert len(hist) == LATE_BUCKETS
    # Below 1 µs; below 4 µs (2-3 µs); 40 ms is past the last bound (2**15 µs).
    assert {i: n for i, n in enumerate(hist) if n} == {0: 1, 2: 1, LATE_BUCKETS - 1: 1}
    assert d.stats.late_ns_sum == 500 + 3_000 + 40 * MS
    assert d.stats.forwarded == 3
