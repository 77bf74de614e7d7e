"""``benchmarks/bench_fastpath.py``: a plane whose PDR is 0 is reported, not a crash."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from sixlab.bench.generator import GeneratorError, TrialResult

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fastpath.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_fastpath", _PATH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class Runner:
    """Trials as ``FrameTrialRunner.trial`` gives them; like ``stampgen``, a rate of 0
    is refused."""

    def __init__(self) -> None:
        self.asked: list[tuple[float, float]] = []

    def trial(self, rate: float, seconds: float) -> TrialResult:
        self.asked.append((rate, seconds))
        if rate <= 0:
            raise GeneratorError("bench: generator failed (2): stampgen: bad arguments")
        n = int(rate * seconds)
        return TrialResult(rate, seconds, n, n, elapsed_s=seconds)


def test_pdr_zero_gives_a_row_without_the_trial_at_the_pdr(bench: ModuleType) -> None:
    runner = Runner()
    assert bench.measure_at_pdr(runner, os.getpid(), 0.0, 3.0) is None
    assert runner.asked == []  # no trial at 0 frames/s
    flat = TrialResult(1e9, 2.0, 400_000, 0, elapsed_s=2.0)
    row = bench.plane_row("mmap-main", 0.0, None, flat, {"reflected": 12})
    assert row["pdr"] == 0.0
    assert row["cpu_busy"] is None
    assert row["replies_at_pdr"] is None
    assert row["flat_out_offered"] == 200_000
    assert row["flat_out_replies"] == 0
    assert "PDR 0" in bench.summary_line(row, 10.0)
    lines = bench.table([row]).splitlines()
    assert lines[1].split()[:4] == ["mmap-main", "0", "-", "-"]


def test_a_pdr_is_rechecked_at_its_rate(bench: ModuleType) -> None:
    runner = Runner()
    at = bench.measure_at_pdr(runner, os.getpid(), 1000.0, 0.2)
    assert runner.asked == [(1000.0, 0.2)]
    flat = TrialResult(1e9, 2.0, 400_000, 200_000, elapsed_s=2.0)
    row = bench.plane_row("mmap", 1000.0, at, flat, {})
    assert row["replies_at_pdr"] == pytest.approx(1000.0)
    assert row["loss_at_pdr"] == 0.0
    base = bench.plane_row("mmap-main", 500.0, at, flat, {})
    lines = bench.table([base, row]).splitlines()
    assert lines[2].split()[:3] == ["mmap", "1,000", "2.00"]
