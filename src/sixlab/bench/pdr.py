"""RFC 2544 Partial Drop Rate search: the highest offered rate whose loss ratio is at most
a target (0.5 % in the evaluation of "High Performance Delay Monitoring for SRv6 Based
SD-WANs"; docs/design-notes.md, "Benchmark method").

Theory of operation
-------------------
A *trial* is any callable ``(rate, seconds) -> TrialResult`` (``sixlab.bench.generator``
runs real ones; the unit tests use a fake system of known capacity). Two searches:

- ``method="mlrsearch"``: FD.io CSIT's MLRsearch (PyPI ``MLRsearch``), in process. One
  goal: loss ratio ``loss_ratio``, exceed ratio 0 (every final-duration trial at the
  reported load must pass), relative width ``precision``. It starts with a trial at
  ``max_rate``, jumps to the forwarding rate measured there, and narrows with short
  trials before confirming the bounds with ``final_seconds`` trials. The PDR is the
  relevant lower bound's load (an offered rate at which the final trial passed).
- ``method="bisect"``: a plain binary search on ``[min_rate, max_rate]`` with
  ``trial_seconds`` trials until the bracket is narrower than ``precision`` (relative),
  then a confirmation trial of ``final_seconds`` at the lower bound; if that fails, it
  becomes the new upper bound and the search goes on below it. Kept because it needs no
  dependency and its steps are easy to follow in a log.

Both report every trial they ran (``PdrResult.trials``), so a reader can check the
verdict. A system that fails even at ``min_rate`` has PDR 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from sixlab.bench.generator import TrialResult

__all__ = ["DEFAULT_LOSS_RATIO", "PdrResult", "Trial", "search_pdr"]

#: The STAMP paper's PDR criterion: loss ratio at most 0.5 % (RFC 2544 leaves it to the
#: tester).
DEFAULT_LOSS_RATIO = 0.005

Trial = Callable[[float, float], TrialResult]
Method = Literal["mlrsearch", "bisect"]


@dataclass(frozen=True, slots=True)
class PdrResult:
    """The PDR found (frames/s, 0 if none), how, and every trial behind it."""

    pdr: float
    method: str
    loss_ratio: float
    trials: list[TrialResult] = field(default_factory=list)


class _Recorder:
    """Wraps a trial and keeps what it returned."""

    def __init__(self, trial: Trial) -> None:
        self.trial = trial
        self.trials: list[TrialResult] = []

    def __call__(self, rate: float, seconds: float) -> TrialResult:
        result = self.trial(rate, seconds)
        self.trials.append(result)
        return result


def search_pdr(
    trial: Trial,
    *,
    min_rate: float,
    max_rate: float,
    loss_ratio: float = DEFAULT_LOSS_RATIO,
    precision: float = 0.02,
    trial_seconds: float = 1.0,
    final_seconds: float = 2.0,
    method: Method = "mlrsearch",
    timeout_s: float = 600.0,
    log: Callable[[str], None] | None = None,
) -> PdrResult:
    """The highest rate in ``[min_rate, max_rate]`` with loss ratio <= ``loss_ratio``."""
    if not 0 < min_rate < max_rate:
        raise ValueError(f"need 0 < min_rate < max_rate, got {min_rate}, {max_rate}")
    if not 0 < precision < 1:
        raise ValueError(f"precision is a relative width in (0, 1), got {precision}")
    recorder = _Recorder(trial)
    params = _Params(
        min_rate, max_rate, loss_ratio, precision, trial_seconds, final_seconds, timeout_s, log
    )
    if method == "mlrsearch":
        pdr = _mlrsearch(recorder, params)
    elif method == "bisect":
        pdr = _bisect(recorder, params)
    else:
        raise ValueError(f"unknown search method {method!r}")
    return PdrResult(pdr, method, loss_ratio, recorder.trials)


@dataclass(frozen=True, slots=True)
class _Params:
    min_rate: float
    max_rate: float
    loss_ratio: float
    precision: float
    trial_seconds: float
    final_seconds: float
    timeout_s: float
    log: Callable[[str], None] | None


def _mlrsearch(trial: Trial, p: _Params) -> float:
    # No type information ships with MLRsearch (no py.typed).
    from MLRsearch import (  # type: ignore[import-untyped]  # noqa: PLC0415
        AbstractMeasurer,
        Config,
        MeasurementResult,
        MultipleLossRatioSearch,
        SearchGoal,
    )

    class Measurer(AbstractMeasurer):  # type: ignore[misc]
        def measure(self, intended_duration: float, intended_load: float) -> object:
            result = trial(intended_load, intended_duration)
            return MeasurementResult(
                intended_duration=intended_duration,
                intended_load=intended_load,
                offered_count=result.offered,
                forwarding_count=min(result.received, result.offered),
                offered_duration=result.elapsed_s or intended_duration,
            )

    goal = SearchGoal(
        loss_ratio=p.loss_ratio,
        exceed_ratio=0.0,
        relative_width=p.precision,
        initial_trial_duration=p.trial_seconds,
        final_trial_duration=p.final_seconds,
        duration_sum=p.final_seconds,
        expansion_coefficient=2,
        fail_fast=False,  # a system that fails at min_rate has PDR 0, not an exception
    )
    config = Config()
    config.goals = [goal]
    config.min_load = p.min_rate
    config.max_load = p.max_rate
    config.search_duration_max = p.timeout_s
    config.warmup_duration = None
    results = MultipleLossRatioSearch(config=config).search(
        measurer=Measurer(), debug=p.log or (lambda _msg: None)
    )
    lower = results[goal].relevant_lower_bound
    return 0.0 if lower is None else float(lower.float_load)


def _bisect(trial: Trial, p: _Params) -> float:
    def passes(rate: float, seconds: float) -> bool:
        result = trial(rate, seconds)
        ok = result.loss_ratio <= p.loss_ratio
        if p.log is not None:
            p.log(f"bisect: {rate:.0f}/s for {seconds} s: loss {result.loss_ratio:.4%} ok={ok}")
        return ok

    if passes(p.max_rate, p.trial_seconds) and passes(p.max_rate, p.final_seconds):
        return p.max_rate
    low, high = p.min_rate, p.max_rate  # invariant: high failed; low not known to fail
    if not passes(low, p.trial_seconds):
        return 0.0
    while True:
        while high - low > p.precision * high:
            mid = (low + high) / 2
            if passes(mid, p.trial_seconds):
                low = mid
            else:
                high = mid
        if passes(low, p.final_seconds):  # the confirmation trial at full duration
            return low
        if low <= p.min_rate:
            return 0.0
        # The short trials were too kind: the bracket is now below the failed rate.
        low, high = p.min_rate, low
