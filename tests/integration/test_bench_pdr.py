"""The PDR harness on a real two-node bench: C generator, nftables counter, reflector.

Short runs, no timing thresholds: they check that the harness measures (what it
counts agrees with the reflector's own counters) and that a search finds a PDR.
"""

from __future__ import annotations

import pytest

from sixlab.bench import StampTrialRunner, prepare_bench, search_pdr
from sixlab.bench.reflector import ReflectorProcess
from sixlab.testbed import BenchTestbed

pytestmark = pytest.mark.root


def test_nothing_reflecting_counts_nothing(bench_testbed: BenchTestbed) -> None:
    prepare_bench(bench_testbed)
    runner = StampTrialRunner(bench_testbed)
    result = runner.trial(2_000.0, 0.5)
    assert result.offered > 0
    assert result.received == 0
    assert result.loss_ratio == 1.0


@pytest.mark.parametrize("plane", ["mmap", "socket"])
def test_search_finds_a_pdr(bench_testbed: BenchTestbed, plane: str) -> None:
    tb = bench_testbed
    prepare_bench(tb)
    runner = StampTrialRunner(tb)
    refl = ReflectorProcess(tb, plane, cpu=1)
    try:
        result = search_pdr(
            runner.trial, min_rate=200.0, max_rate=20_000.0, precision=0.25,
            trial_seconds=0.5, final_seconds=0.5, method="bisect",
        )  # fmt: skip
    finally:
        counters = refl.finish()
    assert result.pdr > 0
    assert result.trials
    received = sum(t.received for t in result.trials)
    # Every reply counted came from this reflector; each trial counted only its own.
    assert 0 < received <= int(str(counters["reflected"]))
    assert all(0 <= t.received <= t.offered for t in result.trials)
    assert any(t.loss_ratio <= 0.005 for t in result.trials)
