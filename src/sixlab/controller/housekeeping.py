"""Bounded storage: a thread that rolls results up and deletes what is past retention.

Every ``interval_s`` the housekeeper folds the results stored since its last pass into
per-minute rollups (``Store.roll_up``) and, if a retention is set, deletes raw results
of minutes older than ``raw_retention_s`` (once rolled up) and rollups older than
``rollup_retention_s`` (``Store.expire``). With replicas, one replica at a time does it:
the holder of the ``housekeeping`` lease (``sixlab.controller.replica``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sixlab.controller.store import OUTAGES_IN_ONE_LINE, ConcurrentPassError, Store

__all__ = ["HOUSEKEEPING", "Housekeeper", "Retention"]

log = logging.getLogger(__name__)
log.addFilter(OUTAGES_IN_ONE_LINE)  # a database outage: a line a round

#: The lease name of the housekeeping work.
HOUSEKEEPING = "housekeeping"
#: Records per roll-up pass: each is read by one statement under the store's lock and
#: written by one transaction, so collection waits for at most that much at a time
#: (benchmarks/README.md, issue 15: 200,000 stalled collection for seconds).
ROLL_UP_LIMIT = 20_000


@dataclass(frozen=True, slots=True)
class Retention:
    """How long results are kept (s); None: for ever."""

    raw_s: float | None = None
    rollup_s: float | None = None
    #: Seconds between passes.
    interval_s: float = 60.0
    #: The share of a pass's time spent rolling up: after each read of records it waits
    #: (1 − duty) / duty times as long as that read took (until the pass has run for
    #: ``interval_s``), so that a pass at 10,000 results/s leaves the interpreter to
    #: collection most of the time instead of raising its lag (benchmarks/README.md,
    #: issue 15). 1: no waits.
    duty: float = 0.1

    def validate(self) -> None:
        for name, value in (("retention", self.raw_s), ("rollup retention", self.rollup_s)):
            if value is not None and value < 60:
                raise ValueError(f"{name}: at least 60 s (rollups are per minute)")
        if self.raw_s is not None and self.rollup_s is not None and self.rollup_s < self.raw_s:
            raise ValueError("rollup retention: shorter than the raw results' retention")
        if self.interval_s <= 0:
            raise ValueError("housekeeping interval: must be positive")
        if not 0 < self.duty <= 1:
            raise ValueError("housekeeping duty: above 0, at most 1")


class Housekeeper:
    """Runs :meth:`run_once` every ``retention.interval_s`` while ``owns()`` says so."""

    def __init__(
        self,
        store: Store,
        retention: Retention,
        *,
        owns: Callable[[str], bool] = lambda _name: True,
        clock: Callable[[], int] = time.time_ns,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        retention.validate()
        self.store = store
        self.retention = retention
        self._owns = owns
        self._clock = clock
        self._timer = timer
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> tuple[int, int, int]:
        """One pass: (records rolled up, raw records deleted, rollups deleted)."""
        rolled = 0
        rest = (1 - self.retention.duty) / self.retention.duty
        began = self._timer()
        while True:
            start = self._timer()
            try:
                n = self.store.roll_up(limit=ROLL_UP_LIMIT)
            except ConcurrentPassError:
                log.info("housekeeping: another replica's pass came first")
                break
            rolled += n
            if n < ROLL_UP_LIMIT:
                break
            now = self._timer()
            # Waits no more once the pass has run for an interval: it then catches up.
            if (
                rest
                and now - began < self.retention.interval_s
                and self._stop.wait((now - start) * rest)
            ):
                break  # closing
        raw = rollups = 0
        r = self.retention
        if r.raw_s is not None:
            raw, rollups = self.store.expire(
                self._clock(),
                raw_ns=int(r.raw_s * 1e9),
                rollup_ns=None if r.rollup_s is None else int(r.rollup_s * 1e9),
            )
        return rolled, raw, rollups

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="housekeeping", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self.retention.interval_s):
            if not self._owns(HOUSEKEEPING):
                continue
            try:
                rolled, raw, rollups = self.run_once()
            except Exception:
                log.exception("housekeeping failed; retrying at the next pass")
                continue
            if rolled or raw or rollups:
                log.info(
                    "housekeeping: %d results rolled up, %d raw results and %d rollups deleted",
                    rolled, raw, rollups,
                )  # fmt: skip
