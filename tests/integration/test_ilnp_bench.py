"""The ILNP UDP echo harness (``sixlab.bench.ilnp_echo``) on a real two-node bench.

The generator offers whole ILNPv6 frames to ``sixlab ilnp host`` with the C echo server
behind it; nftables counts the echoes at the generator. Low rates, no timing
thresholds: they check that every frame offered comes back and is counted once, that
it went through the daemon, that nothing else is counted, and that the preflight
refuses a bench on which echoes cannot come back.
"""

from __future__ import annotations

import pytest

from sixlab.bench import GeneratorError, prepare_bench
from sixlab.bench.ilnp_echo import (
    ECHO_PORT,
    GEN_NONCE,
    IlnpEchoSut,
    IlnpEchoTrialRunner,
    ilnp_echo_frame,
    preflight,
)
from sixlab.bench.ilnp_study import CONFIGS, route_crowd_via_generator, run_point
from sixlab.testbed import BenchTestbed
from sixlab.wire.ilnp import ILV

GEN = ILV.parse("fd00:0:10:0/0:0:0:1")
SUT = ILV.parse("fd00:0:10:0/0:0:0:2")
#: Ethernet (14) + IPv6 (40) + the 32-bit nonce's Destination Options header (8).
UDP_OFFSET = 62


def _delta(after: dict[str, int], before: dict[str, int], key: str) -> int:
    return after.get(key, 0) - before.get(key, 0)


@pytest.mark.root
def test_every_echo_is_counted_and_went_through_the_daemon(bench_testbed: BenchTestbed) -> None:
    tb = bench_testbed
    prepare_bench(tb)
    runner = IlnpEchoTrialRunner(tb)
    assert (runner.gen_ilv, runner.sut_ilv) == (GEN, SUT)
    with IlnpEchoSut(tb, policy="none") as sut:
        first = preflight(runner, sut)
        before = sut.status()
        result = runner.trial(1_000.0, 1.0)
        after = sut.status()
        kernel = sut.kernel_counters()
    assert (first.offered, first.received) == (1, 1)
    assert result.offered > 0
    assert result.input_drops == 0
    assert result.received == result.offered
    assert result.stale == 0
    # Each frame was read from the daemon's ring, delivered to the TUN device, and its
    # echo came back through the TUN device and left from the daemon's raw socket.
    for section, key in (("wire", "rx"), ("counters", "delivered"),
                         ("counters", "transmitted"), ("wire", "tx")):  # fmt: skip
        assert _delta(after[section], before[section], key) == result.offered, (section, key)
    assert after["counters"]["adopted"] == 1  # the generator's NID, by the first frame
    assert after["drops"] == {}
    assert kernel["Udp6InCsumErrors"] == 0  # the NID-only checksum verified every time
    assert sut.echo is not None
    assert sut.echo["received"] == sut.echo["sent"] == result.offered + 1  # + preflight


@pytest.mark.root
def test_nothing_answering_counts_nothing(bench_testbed: BenchTestbed) -> None:
    """Without the daemon the SUT's kernel answers the unknown option 0x8B with ICMPv6
    Parameter Problem (RFC 8200 §4.2): such answers must not count as echoes."""
    prepare_bench(bench_testbed)
    runner = IlnpEchoTrialRunner(bench_testbed)
    result = runner.trial(1_000.0, 0.5)
    assert result.offered > 0
    assert (result.received, result.stale) == (0, 0)


class _BadChecksum(IlnpEchoTrialRunner):
    """Frames whose UDP checksum is off: the SUT's kernel drops them after the daemon."""

    def frame(self, tag: int) -> bytes:
        frame = bytearray(super().frame(tag))
        frame[UDP_OFFSET + 6] ^= 0xFF
        return bytes(frame)


@pytest.mark.root
def test_preflight_fails_loudly_when_no_echo_comes_back(bench_testbed: BenchTestbed) -> None:
    tb = bench_testbed
    prepare_bench(tb)
    runner = _BadChecksum(tb)
    with IlnpEchoSut(tb) as sut:
        with pytest.raises(GeneratorError, match="preflight: 1 echo request"):
            preflight(runner, sut)
        kernel = sut.kernel_counters()
    assert kernel["Udp6InCsumErrors"] == 1
    assert sut.echo is not None
    assert sut.echo["received"] == 0


@pytest.mark.interop
def test_frame_checksum_is_the_nid_only_one_by_scapy() -> None:
    """scapy, computing the checksum itself over ``::NID`` addresses (RFC 6740 §6.3),
    gets the bytes our frame carries after its IPv6 header."""
    # scapy only here, where it is the oracle.
    from scapy.layers.inet import UDP  # noqa: PLC0415
    from scapy.layers.inet6 import HBHOptUnknown, IPv6, IPv6ExtHdrDestOpt  # noqa: PLC0415

    src_mac, dst_mac = bytes.fromhex("020000000001"), bytes.fromhex("020000000002")
    frame = ilnp_echo_frame(src_mac, dst_mac, GEN, SUT, tag=0x1234, payload_size=64)
    payload = bytes(4) + b"\x12\x34" + bytes(58)
    option = HBHOptUnknown(otype=0x8B, optlen=4, optdata=GEN_NONCE.value)
    oracle = bytes(
        IPv6(src=f"::{GEN.nid:x}", dst=f"::{SUT.nid:x}", hlim=64)
        / IPv6ExtHdrDestOpt(options=[option])
        / UDP(sport=frame[UDP_OFFSET] << 8 | frame[UDP_OFFSET + 1], dport=ECHO_PORT)
        / payload
    )
    assert frame[:14] == dst_mac + src_mac + b"\x86\xdd"
    assert frame[14 + 40 :] == oracle[40:]  # extension header, UDP with checksum, payload
    assert frame[14 + 8 : 14 + 40] == GEN.packed + SUT.packed


@pytest.mark.root
def test_study_point_tells_the_policies_apart(bench_testbed: BenchTestbed) -> None:
    """One short test of the ILCC study per policy, crowd and echo flow at low rates:
    every request of both is answered, and the ILCC is what each policy promises —
    nothing adopted with ``socket`` (udpecho's socket is not connected), every
    correspondent with ``none``, the generator's NID included."""
    tb = bench_testbed
    prepare_bench(tb, gen_rps=False)
    route_crowd_via_generator(tb)
    runner = IlnpEchoTrialRunner(tb)
    points = {
        name: run_point(
            tb, runner, CONFIGS[name], 2, seconds=1.0, base_rate=300.0, per_process_rate=100.0
        )
        for name in ("socket", "none-hash")
    }
    for name, p in points.items():
        assert p.base_offered > 0, (name, p)
        assert p.base_echoed == p.base_offered, (name, p)
        assert p.load_sent > 100, (name, p)  # 2 x 100/s for 1 s, give or take a tick
        assert p.load_echoed == p.load_sent, (name, p)
        assert p.ring_drops == 0, (name, p)
        assert p.tx_errors == 0, (name, p)  # the crowd is routed: every send goes out
        assert p.latency_samples > 0, (name, p)
    assert points["socket"].ilcc_size == 0
    assert points["none-hash"].ilcc_size == points["none-hash"].load_sent + 1
