"""The ILCC study's pure parts: the crowd's frames, the averaging, the plot."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from sixlab.bench.generator import GeneratorError
from sixlab.bench.ilnp_study import (
    CONFIGS,
    CpuBusy,
    StudyPoint,
    _series,
    cpu_idle,
    crowd_frame,
    plot_study,
)
from sixlab.wire.ilnp import ILV, decode_packet, nid_checksum

GEN_LOCATOR = 0xFD00_0000_0010_0000
SUT = ILV.parse("fd00:0:10:0/0:0:0:2")
MACS = (bytes.fromhex("020000000001"), bytes.fromhex("020000000002"))


def _frames(seed: int, n: int) -> list[bytes]:
    rng = random.Random(seed)
    return [
        crowd_frame(rng, *MACS, locator=GEN_LOCATOR, target=SUT, payload_size=64) for _ in range(n)
    ]


def test_crowd_frames_are_valid_ilnp_from_new_correspondents() -> None:
    frames = _frames(7, 500)
    nids, nonces = set(), set()
    for frame in frames:
        assert frame[:12] == MACS[1] + MACS[0]  # destination, then source MAC
        packet = decode_packet(frame[14:])
        assert packet.src.locator == GEN_LOCATOR
        assert packet.dst == SUT
        assert packet.src.nid not in {0, 1, 2}  # never the bench's own NIDs
        assert packet.nonce is not None
        assert len(packet.nonce.value) == 4
        udp = packet.payload
        # The NID-only checksum (RFC 6740 §6.3) verifies: the sum over it is zero.
        assert nid_checksum(packet.src.nid, SUT.nid, 17, udp) == 0
        assert udp[8 + 4 : 8 + 6] == b"\x00\x00"  # tag 0: no trial's
        nids.add(packet.src.nid)
        nonces.add(packet.nonce.value)
    assert len(nids) == 500  # every frame a new correspondent
    assert len(nonces) > 490  # 32-bit random nonces: a collision or two at most


def test_crowd_frames_are_reproducible_by_seed() -> None:
    assert _frames(3, 20) == _frames(3, 20)
    assert _frames(3, 20) != _frames(4, 20)


def _point(config: str, rank: int, rep: int, **kw: object) -> StudyPoint:
    values: dict[str, object] = {
        "config": config, "rank": rank, "repetition": rep, "seconds": 1.0,
        "base_offered": 100, "base_echoed": 100, "load_sent": 0, "load_echoed": 0,
        "ilcc_size": 0, "latency_p50_us": 10.0, "latency_p99_us": 20.0,
        "latency_samples": 1000,
    }  # fmt: skip
    values.update(kw)
    return StudyPoint(**values)  # type: ignore[arg-type]


def test_series_averages_repetitions_and_skips_missing_values() -> None:
    points = [
        _point("socket", 0, 0, ilcc_size=0),
        _point("socket", 2, 0, ilcc_size=4),
        _point("socket", 2, 1, ilcc_size=8),
        _point("socket", 5, 0, ilcc_size=None),  # the daemon did not answer
        _point("sixlab", 2, 0, ilcc_size=99),
    ]
    assert _series(points, "socket", lambda p: p.ilcc_size) == ([0, 2], [0.0, 6.0])
    assert _series(points, "sixlab", lambda p: p.ilcc_size) == ([2], [99.0])


def test_served_ratios() -> None:
    p = _point("socket", 1, 0, base_offered=200, base_echoed=150, load_sent=0)
    assert p.base_served == 0.75
    assert p.load_served == 0.0  # nothing sent: nothing served, no division by zero


def test_plot_writes_a_png(tmp_path: Path) -> None:
    points = [_point(c, r, 0, latency_samples=5 if r == 0 else 1000)
              for c in ("st-andrews", "sixlab") for r in range(3)]  # fmt: skip
    png = plot_study(points, [CONFIGS["st-andrews"], CONFIGS["sixlab"]], tmp_path / "s.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cpu_idle_reads_idle_and_steal_of_the_cpu(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  10 0 10 100 5 0 0 0 0 0\n"
        "cpu0 1 0 2 50 1 0 0 0 0 0\n"
        "cpu1 7 1 3 40 4 2 5 9 0 0\n"  # idle 40 + iowait 4, steal 9
    )
    assert cpu_idle(1, str(stat)) == (44, 9)
    assert cpu_idle(0, str(stat)) == (51, 0)
    with pytest.raises(GeneratorError, match="no cpu7"):
        cpu_idle(7, str(stat))


def test_cpu_busy_is_wall_time_less_idle_and_steal(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    hz = os.sysconf("SC_CLK_TCK")
    stat.write_text("cpu1 0 0 0 1000 0 0 0 0 0 0\n")
    outer = time.monotonic()
    with CpuBusy(1, str(stat)) as busy:
        time.sleep(0.2)
        # Over the window: 0.05 s idle and 0.05 s stolen (in USER_HZ ticks).
        quarter = round(0.05 * hz)
        stat.write_text(f"cpu1 0 0 0 {1000 + quarter} 0 0 0 {quarter} 0 0\n")
    outer = time.monotonic() - outer
    assert busy.busy is not None
    # busy = 1 - 0.1 s / window, the window being between 0.2 s and the outer time.
    not_busy = 2 * quarter / hz
    assert 1 - not_busy / 0.2 - 1e-9 <= busy.busy <= 1 - not_busy / outer + 1e-9
