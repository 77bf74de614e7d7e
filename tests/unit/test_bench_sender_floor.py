"""``benchmarks/sender_floor.c``, the compiled floor of ``bench_sender.py --c-floor``:
it builds with ``sixlab.linux.ccbuild.build_c``, sends its probes to a socket-plane
reflector on loopback, and matches the replies by SSID, Seq and the echoed T1."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sixlab.dataplane.base import DataplaneConfig, create
from sixlab.dataplane.engine import ReflectorEngine
from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig

SOURCE = Path(__file__).resolve().parents[2] / "benchmarks" / "sender_floor.c"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


@pytest.fixture
def reflector() -> Iterator[int]:
    plane = create("socket", DataplaneConfig(port=0))
    plane.open()
    engine = ReflectorEngine(plane, Reflector(ReflectorSessionConfig(None)))
    engine.start()
    try:
        yield plane.local_port
    finally:
        engine.shutdown()
        plane.close()


def _binary(tmp_path: Path) -> Path:
    from sixlab.linux.ccbuild import build_c  # noqa: PLC0415

    return build_c(SOURCE, tmp_path)


def test_the_floor_sends_and_matches_its_replies(reflector: int, tmp_path: Path) -> None:
    binary = _binary(tmp_path)
    argv = [str(binary), str(reflector), "200", "1000", "0.1", "0.5", "10"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    out = json.loads(done.stdout)
    assert out["sent"] > 0
    assert out["refused"] == 0
    # Replies are matched to the session's last probe by Seq and echoed T1 (at 20
    # packets/s per session a reply comes back long before the session's next probe).
    assert 0 < out["matched"] <= out["received"]
    assert out["slip_us_p50"] <= out["slip_us_p99"] <= out["slip_us_max"]
    assert {"user_s", "system_s", "span_s"} <= out.keys()


def test_the_floor_refuses_bad_arguments(tmp_path: Path) -> None:
    binary = _binary(tmp_path)
    bad: tuple[list[str], ...] = (
        [],
        ["0", "1000", "250", "0", "1", "10"],
        ["862", "1000", "250", "0", "1", "0"],
    )
    for argv in bad:
        done = subprocess.run(
            [str(binary), *argv], capture_output=True, text=True, timeout=10, check=False
        )
        assert done.returncode == 2
        assert done.stderr
