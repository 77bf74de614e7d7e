"""Per-session thresholds that raise and clear events (delay, jitter, loss).

Theory of operation
-------------------
A session may carry :class:`Thresholds`. After each batch of results the controller
hands the :class:`ThresholdMonitor` what the session looks like over the last
``window_s`` seconds (:class:`WindowSample`: mean round-trip delay, mean |IPDV|, and
the test packets received and lost); the monitor compares each measure with its
threshold and says which events start or end. An event is *raised* when the measure
goes above its threshold and *cleared* when it falls to ``clear_ratio`` of it or below
(hysteresis, so that a measure hovering at the threshold does not flap). A kind whose
window has too few packets (``min_packets``) is not judged: its state stays as it was.

Measures (docs/srpm.md, "Events"):

- ``delay``: the mean round-trip delay in the window (``(T4 − T1) − (T3 − T2)``, or
  ``T4 − T1`` for a loopback session), ms;
- ``jitter``: the mean |IPDV| of the window (RFC 3393; the forward delay's for a two-way
  session, the round trip's for a loopback one), ms;
- ``loss``: lost / (received + lost) over the window's test packets, a ratio in [0, 1].

The monitor is pure (values in, events out); the controller stores the events, exports
them as metrics and shows them (``sixlab controller events``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from sixlab.controller.errors import ControllerError
from sixlab.stamp import StampResult, path_stats

__all__ = [
    "DEFAULT_CLEAR_RATIO",
    "DEFAULT_MIN_PACKETS",
    "DEFAULT_WINDOW_S",
    "EventKind",
    "EventState",
    "LossWindow",
    "SessionEvent",
    "ThresholdMonitor",
    "Thresholds",
    "WindowSample",
    "window_sample",
]

#: Seconds of results each judgement looks at.
DEFAULT_WINDOW_S = 10.0
#: An event clears at 90 % of its threshold.
DEFAULT_CLEAR_RATIO = 0.9
#: Test packets a window needs before its loss (and delay, jitter) are judged.
DEFAULT_MIN_PACKETS = 5


class EventKind(StrEnum):
    DELAY = "delay"
    JITTER = "jitter"
    LOSS = "loss"


class EventState(StrEnum):
    RAISED = "raised"
    CLEARED = "cleared"


@dataclass(frozen=True, slots=True)
class Thresholds:
    """A session's thresholds; None leaves a measure unwatched."""

    delay_ms: float | None = None
    jitter_ms: float | None = None
    loss_ratio: float | None = None
    window_s: float = DEFAULT_WINDOW_S
    clear_ratio: float = DEFAULT_CLEAR_RATIO
    min_packets: int = DEFAULT_MIN_PACKETS

    def __post_init__(self) -> None:
        for name in ("delay_ms", "jitter_ms"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ControllerError(f"thresholds.{name}: must be positive, got {value}")
        if self.loss_ratio is not None and not 0 <= self.loss_ratio < 1:
            raise ControllerError(f"thresholds.loss_ratio: {self.loss_ratio} is not in [0, 1)")
        if not self.window_s > 0:
            raise ControllerError(f"thresholds.window_s: must be positive, got {self.window_s}")
        if not 0 < self.clear_ratio <= 1:
            raise ControllerError(f"thresholds.clear_ratio: {self.clear_ratio} is not in (0, 1]")
        if self.min_packets < 1:
            raise ControllerError(f"thresholds.min_packets: at least 1, got {self.min_packets}")

    @property
    def any(self) -> bool:
        return any(t is not None for t in (self.delay_ms, self.jitter_ms, self.loss_ratio))

    def limit(self, kind: EventKind) -> float | None:
        return {
            EventKind.DELAY: self.delay_ms,
            EventKind.JITTER: self.jitter_ms,
            EventKind.LOSS: self.loss_ratio,
        }[kind]

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "delay_ms": self.delay_ms,
            "jitter_ms": self.jitter_ms,
            "loss_ratio": self.loss_ratio,
            "window_s": self.window_s,
            "clear_ratio": self.clear_ratio,
            "min_packets": self.min_packets,
        }


@dataclass(frozen=True, slots=True)
class WindowSample:
    """What a session looked like over its last window."""

    received: int
    lost: int
    delay_ms: float | None
    jitter_ms: float | None

    def value(self, kind: EventKind) -> float | None:
        if kind is EventKind.DELAY:
            return self.delay_ms
        if kind is EventKind.JITTER:
            return self.jitter_ms
        total = self.received + self.lost
        return self.lost / total if total else None


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """An event raised or cleared: which session, what, the measure and the limit."""

    session: str
    kind: EventKind
    state: EventState
    value: float
    threshold: float
    at_ns: int


class ThresholdMonitor:
    """Which events of which sessions are raised; see the module docstring."""

    def __init__(self) -> None:
        self._raised: set[tuple[str, EventKind]] = set()

    def raised(self, session: str) -> list[EventKind]:
        return sorted(kind for name, kind in self._raised if name == session)

    def restore(self, session: str, kind: EventKind) -> None:
        """Mark an event raised without emitting it (state reloaded after a restart)."""
        self._raised.add((session, kind))

    def forget(self, session: str) -> None:
        self._raised = {(name, kind) for name, kind in self._raised if name != session}

    def judge(
        self, session: str, thresholds: Thresholds, sample: WindowSample, now_ns: int
    ) -> list[SessionEvent]:
        """The events that start or end with this window (in kind order)."""
        out = []
        enough = sample.received + sample.lost >= thresholds.min_packets
        for kind in EventKind:
            limit = thresholds.limit(kind)
            key = (session, kind)
            if limit is None:
                self._raised.discard(key)
                continue
            value = sample.value(kind)
            if value is None or not enough:
                continue
            if key not in self._raised and value > limit:
                self._raised.add(key)
                out.append(SessionEvent(session, kind, EventState.RAISED, value, limit, now_ns))
            elif key in self._raised and value <= limit * thresholds.clear_ratio:
                self._raised.discard(key)
                out.append(SessionEvent(session, kind, EventState.CLEARED, value, limit, now_ns))
        return out


def window_sample(records: Sequence[StampResult], lost: int) -> WindowSample:
    """The window's measures from its records (any order) and its lost packets."""
    st = path_stats(sorted(records, key=lambda r: r.seq), lost)
    return WindowSample(
        received=len(records),
        lost=lost,
        delay_ms=None if st.rtt is None else st.rtt.mean_ns / 1e6,
        jitter_ms=None if st.direct_jitter_ns is None else st.direct_jitter_ns / 1e6,
    )


class LossWindow:
    """Test packets received and lost over the last ``window_ns``, from running totals.

    The sender agent reports totals since the session began (totals that go down mean
    the session started over, and the history restarts). ``observe`` keeps one point
    per report, and forgets those older than the window needs; ``over`` answers the
    change across the window.
    """

    def __init__(self, window_ns: int) -> None:
        self.window_ns = window_ns
        self._points: deque[tuple[int, int, int]] = deque()  # (at_ns, received, lost)

    def observe(self, at_ns: int, received: int, lost: int) -> None:
        points = self._points
        if points and (received < points[-1][1] or lost < points[-1][2]):
            points.clear()
        points.append((at_ns, received, lost))
        # Keep one point at or before the window's start: the base of the difference.
        while len(points) > 1 and points[1][0] <= at_ns - self.window_ns:
            points.popleft()

    def over(self, now_ns: int) -> tuple[int, int]:
        """(received, lost) in the window that ends at ``now_ns``."""
        points = [p for p in self._points if p[0] <= now_ns]
        if not points:
            return 0, 0
        start = now_ns - self.window_ns
        base = [p for p in points if p[0] <= start]
        _, r1, l1 = points[-1]
        if not base:
            return r1, l1  # the whole session falls in the window
        _, r0, l0 = base[-1]
        return r1 - r0, l1 - l0
