"""The ILNP echo bench's preflight (``sixlab.bench.ilnp_echo.preflight``) on scripted
trials: a trial that offered nothing (the generator got no CPU in its window) is run
again; anything else that is not one echo for one request fails at once."""

from __future__ import annotations

from typing import Any, cast

import pytest

from sixlab.bench import GeneratorError
from sixlab.bench.generator import TrialResult
from sixlab.bench.ilnp_echo import PREFLIGHT_ATTEMPTS, IlnpEchoSut, IlnpEchoTrialRunner, preflight


class _Script:
    """A trial runner that returns the given (offered, received) results in turn."""

    def __init__(self, *outcomes: tuple[int, int]) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0

    def trial(self, rate: float, seconds: float) -> TrialResult:
        self.calls += 1
        offered, received = self.outcomes.pop(0)
        return TrialResult(rate=rate, seconds=seconds, offered=offered, received=received)


class _Sut:
    def status(self) -> dict[str, Any]:
        return {"counters": {"delivered": 0}, "drops": {}, "wire": {}, "events": {}}


def _preflight(script: _Script) -> TrialResult:
    return preflight(cast(IlnpEchoTrialRunner, script), cast(IlnpEchoSut, _Sut()))


def test_a_trial_that_offered_nothing_is_run_again() -> None:
    script = _Script((0, 0), (0, 0), (1, 1))
    result = _preflight(script)
    assert (result.offered, result.received) == (1, 1)
    assert script.calls == 3


def test_a_generator_that_never_offers_fails_after_the_attempts() -> None:
    script = _Script(*[(0, 0)] * PREFLIGHT_ATTEMPTS)
    with pytest.raises(GeneratorError, match="preflight: 0 echo request"):
        _preflight(script)
    assert script.calls == PREFLIGHT_ATTEMPTS


def test_a_request_without_its_echo_fails_at_once() -> None:
    script = _Script((1, 0), (1, 1))
    with pytest.raises(GeneratorError, match=r"preflight: 1 echo request\(s\) offered, 0 echo"):
        _preflight(script)
    assert script.calls == 1  # a bench that loses the echo is not tried again
