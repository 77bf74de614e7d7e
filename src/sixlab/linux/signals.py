"""Run a foreground program until SIGTERM or SIGINT, then let it clean up.

Every long-running ``sixlab`` program (``stamp agent``, ``stamp reflector``,
``controller serve``, the ILNP daemon, the link emulator) stops the same way::

    with StopOnSignal() as stop:        # handlers installed
        try:
            ...start, announce ready...
            stop.wait()                 # or the program's own loop, until stop.stopped
        finally:
            ...clean up...              # a second signal meanwhile changes nothing
    return 0                            # handlers restored

Theory of operation
-------------------
- CPython runs a signal handler in the main thread, between two bytecodes. The handler
  here only *records* the request (sets a :class:`threading.Event`, then calls the
  optional ``on_stop``, which must be as small, e.g. set a loop's flag). Nothing is torn
  down inside the handler: the main thread's loop notices the request, returns, and the
  caller's ``finally`` cleans up as ordinary code, never half-way through an operation.
- A program whose main thread only waits calls :meth:`StopOnSignal.wait`. It waits in
  slices of :data:`POLL_S`, so the main thread is back in the interpreter (where the
  handler runs) at least that often, whatever the platform does to a lock wait
  interrupted by a signal.
- A program with its own loop (a ``select`` loop) tests :attr:`StopOnSignal.stopped`
  each turn, or passes ``on_stop`` to stop the loop its own way.
- Leaving the ``with`` block puts back the handlers found on entry, so a command run
  in-process (a test calling the handler function) leaves the process as it found it.
  Cleanup inside the block is still covered: a second SIGTERM during cleanup only sets
  the event again.
- ``signal.signal`` works only in the main thread; elsewhere entering raises
  ``ValueError`` (Python's own error), before any handler is changed.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType

__all__ = ["POLL_S", "StopOnSignal"]

#: How long :meth:`StopOnSignal.wait` blocks at a time. It bounds how late a stop is
#: seen; a shorter slice only wakes an idle process more often.
POLL_S = 0.5


class StopOnSignal:
    """Record SIGTERM/SIGINT (or ``signals``) as a stop request while in a ``with`` block."""

    def __init__(
        self,
        on_stop: Callable[[], None] | None = None,
        signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
    ) -> None:
        self._on_stop = on_stop
        self._signals = tuple(signals)
        self._event = threading.Event()
        self._previous: dict[signal.Signals, Callable[[int, FrameType | None], object] | int] = {}

    @property
    def stopped(self) -> bool:
        """Whether one of the signals has arrived since the block was entered."""
        return self._event.is_set()

    def wait(self, alive: Callable[[], bool] | None = None) -> None:
        """Block until a signal arrives or, if given, ``alive()`` turns false.

        ``alive`` is checked after every slice of :data:`POLL_S` (a program that can also
        end by itself, e.g. when its engine fails).
        """
        while not self._event.wait(POLL_S):
            if alive is not None and not alive():
                return

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        self._event.set()
        if self._on_stop is not None:
            self._on_stop()

    def __enter__(self) -> StopOnSignal:
        try:
            for sig in self._signals:
                previous = signal.signal(sig, self._handle)
                # None: a handler not installed from Python; SIG_DFL is what it amounts to.
                self._previous[sig] = signal.SIG_DFL if previous is None else previous
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
