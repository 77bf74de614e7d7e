"""The older PDR commands are ``bench_stamp.py paper`` with fixed roles and STAMP shares.

One way to measure the PDR of a STAMP role (issue 13): ``bench_pdr.py`` and
``bench_xdp_pdr.py pdr`` / ``forward`` hand over to the harness. ``--help`` reaches the
harness's own parser without a bench (and without root), so each command's help is
``bench_stamp.py paper``'s, behind the line that names the command it ran.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize(
    ("argv", "options"),
    [
        (["bench_pdr.py"], "paper --roles reflector --fractions 100"),
        (["bench_xdp_pdr.py", "pdr"], "paper --roles reflector --fractions 100"),
        (["bench_xdp_pdr.py", "forward"], "paper --roles reflector --fractions 0 --planes xdp"),
    ],
)
def test_old_pdr_commands_run_the_paper_harness(argv: list[str], options: str) -> None:
    script, *rest = argv
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *rest, "--help"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, *help_lines = done.stdout.splitlines()
    assert first.startswith("= ")
    assert f"bench_stamp.py {options} --help" in first
    text = "\n".join(help_lines)
    assert "usage: bench_stamp.py paper" in text
    assert "--repeat" in text
    assert "--external" in text


def test_forward_cpu_stays_its_own_measurement() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_xdp_pdr.py"), "forward-cpu", "--help"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "bench_stamp.py" not in done.stdout
    assert "--rounds" in done.stdout
