"""What an emulated link does to frames, per direction (shared by the testbed and the element).

Kept apart from :mod:`sixlab.testbed.linkemu` so that importing :mod:`sixlab.testbed` does
not import the element's module: it runs as ``python -m sixlab.testbed.linkemu``, and
runpy warns when the module it is about to execute was already imported by its package.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DirectionConfig"]


@dataclass(frozen=True, slots=True)
class DirectionConfig:
    """What one direction of the link does to frames."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or self.jitter_ms < 0:
            raise ValueError("delay and jitter must be >= 0 ms")
        if not 0.0 <= self.loss <= 1.0:
            raise ValueError("loss is a probability in [0, 1]")
