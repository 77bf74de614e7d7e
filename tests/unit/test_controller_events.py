"""The threshold monitor: events raise above their threshold and clear with hysteresis."""

from __future__ import annotations

import pytest

from sixlab.controller import ControllerError
from sixlab.controller.events import (
    EventKind,
    EventState,
    LossWindow,
    ThresholdMonitor,
    Thresholds,
    WindowSample,
    window_sample,
)
from sixlab.stamp import StampResult
from sixlab.wire.timestamp import ErrorEstimate


def _sample(delay: float | None = 10.0, jitter: float | None = 1.0, lost: int = 0) -> WindowSample:
    return WindowSample(received=100 - lost, lost=lost, delay_ms=delay, jitter_ms=jitter)


def test_an_event_raises_once_and_clears_below_the_hysteresis() -> None:
    mon = ThresholdMonitor()
    th = Thresholds(delay_ms=20.0, clear_ratio=0.9)
    assert mon.judge("p", th, _sample(delay=19.0), 1) == []
    (raised,) = mon.judge("p", th, _sample(delay=25.0), 2)
    assert (raised.kind, raised.state, raised.value, raised.threshold) == (
        EventKind.DELAY,
        EventState.RAISED,
        25.0,
        20.0,
    )
    assert mon.judge("p", th, _sample(delay=30.0), 3) == []  # still raised: no repeat
    assert mon.judge("p", th, _sample(delay=18.5), 4) == []  # under 20, above 18: holds
    (cleared,) = mon.judge("p", th, _sample(delay=17.0), 5)
    assert (cleared.state, cleared.at_ns) == (EventState.CLEARED, 5)
    assert mon.raised("p") == []


def test_each_kind_and_session_is_separate() -> None:
    mon = ThresholdMonitor()
    th = Thresholds(delay_ms=20.0, jitter_ms=2.0, loss_ratio=0.05)
    events = mon.judge("a", th, _sample(delay=5.0, jitter=3.0, lost=10), 1)
    assert [(e.kind, e.state) for e in events] == [
        (EventKind.JITTER, EventState.RAISED),
        (EventKind.LOSS, EventState.RAISED),
    ]
    assert events[1].value == pytest.approx(0.1)
    assert mon.raised("a") == [EventKind.JITTER, EventKind.LOSS]
    assert mon.raised("b") == []
    assert mon.judge("b", th, _sample(), 1) == []
    mon.forget("a")
    assert mon.raised("a") == []


def test_a_window_with_too_few_packets_is_not_judged() -> None:
    mon = ThresholdMonitor()
    th = Thresholds(loss_ratio=0.1, min_packets=10)
    few = WindowSample(received=2, lost=3, delay_ms=None, jitter_ms=None)
    assert mon.judge("p", th, few, 1) == []
    many = WindowSample(received=8, lost=3, delay_ms=None, jitter_ms=None)
    assert [e.kind for e in mon.judge("p", th, many, 2)] == [EventKind.LOSS]


def test_a_restored_event_clears_without_being_raised_again() -> None:
    mon = ThresholdMonitor()
    mon.restore("p", EventKind.DELAY)
    th = Thresholds(delay_ms=20.0)
    assert mon.judge("p", th, _sample(delay=25.0), 1) == []
    assert [e.state for e in mon.judge("p", th, _sample(delay=1.0), 2)] == [EventState.CLEARED]


@pytest.mark.parametrize(
    "kwargs",
    [{"delay_ms": 0.0}, {"jitter_ms": -1.0}, {"loss_ratio": 1.0}, {"window_s": 0.0},
     {"clear_ratio": 1.5}, {"min_packets": 0}],
)  # fmt: skip
def test_impossible_thresholds_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ControllerError, match="thresholds"):
        Thresholds(**kwargs)  # type: ignore[arg-type]


def test_a_loss_window_counts_the_change_across_the_window() -> None:
    win = LossWindow(10)
    assert win.over(100) == (0, 0)
    win.observe(0, 10, 0)
    assert win.over(5) == (10, 0)  # one report: all of it is in the window
    win.observe(10, 20, 2)
    win.observe(20, 30, 5)
    assert win.over(20) == (10, 3)
    assert win.over(15) == (20, 2)  # a window ending earlier reaches the first report
    win.observe(25, 3, 0)  # the totals went down: the session started over
    assert win.over(25) == (3, 0)
    win.observe(40, 13, 1)
    win.observe(50, 23, 1)
    assert win.over(50) == (10, 0)
    assert len(win._points) == 2  # what the window no longer needs is gone


def test_a_window_sample_takes_the_round_trip_and_its_jitter() -> None:
    ee = ErrorEstimate(multiplier=1)
    ms = 1_000_000
    records = [
        StampResult(1, seq, 0, 0, 0, (10 + seq) * ms, ee, ee, 0, seq, loopback=True)
        for seq in (2, 0, 1)
    ]
    sample = window_sample(records, lost=1)
    assert (sample.received, sample.lost) == (3, 1)
    assert sample.delay_ms == pytest.approx(11.0)
    assert sample.jitter_ms == pytest.approx(1.0)
    assert sample.value(EventKind.LOSS) == pytest.approx(0.25)
