"""The housekeeper's pass: reads of ``ROLL_UP_LIMIT`` records, with waits between them
for the share of its time the pass is not to run (``Retention.duty``)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import sixlab.controller.housekeeping as housekeeping
from sixlab.controller.housekeeping import Housekeeper, Retention
from sixlab.controller.rollup import MINUTE_NS
from sixlab.controller.store import Store, open_store
from sixlab.stamp import StampResult
from sixlab.wire.timestamp import ErrorEstimate

EE = ErrorEstimate(scale=10, multiplier=3)
T0 = 1_700_000_000 * 10**9 // MINUTE_NS * MINUTE_NS


class _Waits(threading.Event):
    """An event that records each wait's timeout and returns at once (set: closing)."""

    def __init__(self, closing: bool = False) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []
        if closing:
            self.set()

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        return self.is_set()


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """25 records of one session, rolled up 10 at a time."""
    monkeypatch.setattr(housekeeping, "ROLL_UP_LIMIT", 10)
    s = open_store(tmp_path / "c.sqlite")
    s.add_node("s1", "127.0.0.1:5001", "sender")
    s.add_node("r1", "127.0.0.1:5002", "reflector")
    sid = s.add_session("p", 1, sender="s1", reflector="r1", params={}, now_ns=0).id
    s.begin_epoch("p", 1)
    records = [(q + 1, StampResult(0, q, T0 + q * 10**9, T0 + q * 10**9 + 100,
                                   T0 + q * 10**9 + 150, T0 + q * 10**9 + 300, EE, EE, 64, q))
               for q in range(25)]  # fmt: skip
    s.store_results(sid, records)
    return s


def _keeper(store: Store, duty: float, waits: _Waits, interval_s: float = 60) -> Housekeeper:
    ticks = iter(range(0, 1000, 2))  # each read "takes" 2 s
    keeper = Housekeeper(
        store, Retention(duty=duty, interval_s=interval_s), timer=lambda: float(next(ticks))
    )
    keeper._stop = waits
    return keeper


@pytest.mark.parametrize(("duty", "timeouts"), [(1.0, []), (0.25, [6.0, 6.0]), (0.5, [2.0, 2.0])])
def test_a_pass_waits_between_its_reads_for_the_rest_of_its_duty(
    store: Store, duty: float, timeouts: list[float]
) -> None:
    waits = _Waits()
    assert _keeper(store, duty, waits).run_once() == (25, 0, 0)
    assert waits.timeouts == timeouts
    store.close()


def test_a_pass_that_ran_for_an_interval_waits_no_more(store: Store) -> None:
    """The pass begins at 0 s; its first read ends at 4 s, its second at 8 s, past an
    interval of 5 s: only the first is followed by a wait."""
    waits = _Waits()
    assert _keeper(store, 0.5, waits, interval_s=5).run_once() == (25, 0, 0)
    assert waits.timeouts == [2.0]
    store.close()


def test_a_pass_that_is_closed_while_waiting_stops_after_its_read(store: Store) -> None:
    waits = _Waits(closing=True)
    assert _keeper(store, 0.5, waits).run_once() == (10, 0, 0)
    assert _keeper(store, 1.0, _Waits()).run_once() == (15, 0, 0)  # the rest, next pass
    store.close()


@pytest.mark.parametrize("duty", [0.0, -0.5, 1.5, float("nan")])
def test_a_duty_out_of_range_is_refused(duty: float) -> None:
    with pytest.raises(ValueError, match="duty"):
        Retention(duty=duty).validate()


def test_the_cli_default_duty_is_the_retentions() -> None:
    from sixlab.cli.controller import DEFAULT_HOUSEKEEPING_DUTY  # noqa: PLC0415

    assert Retention().duty == DEFAULT_HOUSEKEEPING_DUTY
