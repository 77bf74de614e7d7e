"""The PDR search against fake systems of known capacity, and the generator's frame."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.bench import TrialResult, search_pdr, stamp_frame
from sixlab.bench.pdr import Method
from sixlab.wire.packet import parse_udp_packet
from sixlab.wire.stamp import decode_sender

LOSS = 0.005
PRECISION = 0.02
METHODS: list[Method] = ["mlrsearch", "bisect"]


class FakeSystem:
    """Forwards up to ``capacity`` frames/s and drops the rest: PDR = capacity/(1-LOSS)."""

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self.calls: list[tuple[float, float]] = []

    def __call__(self, rate: float, seconds: float) -> TrialResult:
        self.calls.append((rate, seconds))
        offered = round(rate * seconds)
        received = min(offered, int(self.capacity * seconds))
        return TrialResult(rate, seconds, offered, received, elapsed_s=seconds)

    @property
    def pdr(self) -> float:
        return self.capacity / (1 - LOSS)


def _search(system: FakeSystem, method: Method, max_rate: float = 1e6) -> float:
    result = search_pdr(
        system,
        min_rate=100.0,
        max_rate=max_rate,
        loss_ratio=LOSS,
        precision=PRECISION,
        trial_seconds=0.5,
        final_seconds=2.0,
        method=method,
    )
    assert result.method == method
    assert len(result.trials) == len(system.calls)  # every trial is reported
    return result.pdr


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("capacity", [150.0, 3_000.0, 41_000.0, 123_456.0, 700_000.0])
def test_finds_known_capacity_within_precision(method: Method, capacity: float) -> None:
    system = FakeSystem(capacity)
    pdr = _search(system, method)
    assert system.pdr * (1 - 2 * PRECISION) <= pdr <= system.pdr
    # The reported rate passed a final-duration trial (the confirmation).
    assert any(r == pytest.approx(pdr, rel=1e-6) and s == 2.0 for r, s in system.calls)


@pytest.mark.parametrize("method", METHODS)
def test_capacity_above_max_rate_reports_max_rate(method: Method) -> None:
    assert _search(FakeSystem(5e6), method, max_rate=1e6) == pytest.approx(1e6, rel=PRECISION)


@pytest.mark.parametrize("method", METHODS)
def test_system_failing_at_min_rate_has_pdr_zero(method: Method) -> None:
    assert _search(FakeSystem(10.0), method) == 0.0


@pytest.mark.parametrize("method", METHODS)
def test_short_trials_too_kind_final_trial_decides(method: Method) -> None:
    """A system that holds 50 kpps for under a second but only 20 kpps for longer."""

    def trial(rate: float, seconds: float) -> TrialResult:
        capacity = 50_000.0 if seconds < 1 else 20_000.0
        offered = round(rate * seconds)
        return TrialResult(rate, seconds, offered, min(offered, int(capacity * seconds)))

    result = search_pdr(
        trial, min_rate=100.0, max_rate=1e6, precision=PRECISION,
        trial_seconds=0.5, final_seconds=2.0, method=method,
    )  # fmt: skip
    assert 20_000 * (1 - 2 * PRECISION) <= result.pdr <= 20_000 / (1 - LOSS)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="min_rate"):
        search_pdr(FakeSystem(1.0), min_rate=10.0, max_rate=5.0)
    with pytest.raises(ValueError, match="precision"):
        search_pdr(FakeSystem(1.0), min_rate=1.0, max_rate=5.0, precision=1.5)
    with pytest.raises(ValueError, match="method"):
        search_pdr(FakeSystem(1.0), min_rate=1.0, max_rate=5.0, method="guess")  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(offered=st.integers(0, 10**9), received=st.integers(0, 10**9))
def test_loss_ratio_is_a_ratio(offered: int, received: int) -> None:
    result = TrialResult(1.0, 1.0, offered, received)
    assert 0.0 <= result.loss_ratio <= 1.0
    if offered and received <= offered:
        assert result.loss_ratio == pytest.approx(1 - received / offered)


@settings(max_examples=200, deadline=None)
@given(ssid=st.integers(0, 0xFFFF), sport=st.integers(1, 0xFFFF))
def test_stamp_frame_is_a_valid_session_sender_packet(ssid: int, sport: int) -> None:
    src_mac, dst_mac = bytes.fromhex("020000000001"), bytes.fromhex("020000000002")
    frame = stamp_frame(src_mac, dst_mac, "fd00::1", "fd00::2", ssid=ssid, sport=sport)
    assert frame[:6] == dst_mac
    assert frame[6:12] == src_mac
    assert frame[12:14] == b"\x86\xdd"
    packet = parse_udp_packet(frame[14:], verify_checksum=True)
    assert (packet.udp.src_port, packet.udp.dst_port) == (sport, 862)
    sender = decode_sender(packet.payload)
    assert sender.ssid == ssid
    assert sender.error_estimate.is_valid  # Multiplier != 0 (RFC 4656 §4.1.2)
