"""The Prometheus rules of the SR performance-measurement modes (deploy/prometheus)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from prometheus_client import generate_latest

from sixlab.controller.metrics import ControllerMetrics, PathTotals, Totals
from sixlab.stamp import DataCounters, StampResult
from sixlab.wire.timestamp import ErrorEstimate

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = DEPLOY / "sixlab-srpm-rules.yml"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool (the prometheus package) is needed for these tests"
    return subprocess.run(
        [promtool, *args], check=False, capture_output=True, text=True, cwd=DEPLOY
    )


def test_the_rules_are_valid_and_their_tests_pass() -> None:
    check = _promtool("check", "rules", RULES.name)
    assert check.returncode == 0, check.stdout + check.stderr
    test = _promtool("test", "rules", "sixlab-srpm-rules.test.yml")
    assert test.returncode == 0, test.stdout + test.stderr


def test_every_metric_the_rules_use_is_exported() -> None:
    """A rule over a metric the controller does not export would never fire."""
    ee = ErrorEstimate(multiplier=1)
    ms = 1_000_000
    records = [
        StampResult(
            1,
            seq,
            seq * ms,
            0,
            0,
            seq * ms + 5 * ms,
            ee,
            ee,
            0,
            seq,
            flow_label=1,
            data=DataCounters(seq * 10, seq * 9, 0, 0),
        )
        for seq in range(3)
    ]
    metrics = ControllerMetrics()
    metrics.bind(lambda: Totals([PathTotals("p", 3, 3, 0, 0, None, events_raised=("delay",))]))
    metrics.observe("p", records)
    exported = set(re.findall(r"^(sixlab_[a-z_]+)", generate_latest(metrics.registry).decode(),
                              re.MULTILINE))  # fmt: skip
    used = set(re.findall(r"\b(sixlab_[a-z_]+)", RULES.read_text()))
    assert used
    assert used <= exported, used - exported
