"""The STAMP paper harness's pure parts: frames, priming, statistics, invariants, report."""

from __future__ import annotations

import dataclasses
import struct
import time
from ipaddress import IPv6Address
from pathlib import Path

import pytest

from sixlab.bench.collector import prime_session
from sixlab.bench.generator import Mix
from sixlab.bench.stamp_paper import (
    BASELINE,
    PREFLIGHT_RATE,
    Implementation,
    PaperPoint,
    PaperTrial,
    SearchSettings,
    check,
    collector_frame,
    load_points,
    parse_external,
    reflector_probe_frame,
    sixlab_planes,
    summarize,
    write_results,
)
from sixlab.bench.stamp_report import PAPER, markdown, paper_ratios, plot_figures
from sixlab.dataplane.base import DataplaneConfig
from sixlab.dataplane.engine import SenderEngine, SenderSessionSpec
from sixlab.dataplane.memory import MemoryNetwork
from sixlab.stamp.sender import NS_PER_S, SenderConfig
from sixlab.wire.packet import parse_udp_packet
from sixlab.wire.stamp import decode_reflector, decode_sender
from sixlab.wire.timestamp import TimestampFormat, decode_timestamp

MACS = (bytes.fromhex("020000000001"), bytes.fromhex("020000000002"))
GEN, SUT = "fd00:0:10::1", "fd00:0:10::2"
U32 = struct.Struct("!I")


def _patched(payload: bytes, fields: tuple[tuple[int, int], ...], k: int) -> bytes:
    """What ``stampgen.c`` writes into the k-th mixed frame's payload."""
    data = bytearray(payload)
    for off, base in fields:
        U32.pack_into(data, off, (base + k) % (1 << 32))
    return bytes(data)


def test_reflector_probe_is_a_session_sender_packet_at_the_end_of_an_srv6_path() -> None:
    frame = reflector_probe_frame(*MACS, GEN, SUT, sport=49153, ssid=7)
    pkt = parse_udp_packet(frame[14:], verify_checksum=True)
    assert pkt.srh is not None
    assert pkt.srh.segments_left == 0
    assert str(pkt.final_destination) == SUT
    assert (pkt.src_port, pkt.dst_port) == (49153, 862)
    probe = decode_sender(bytes(pkt.payload))
    assert probe.ssid == 7
    assert probe.error_estimate.is_valid


def test_collector_frame_fields_count_seq_and_t1_seconds() -> None:
    t1_ns = 1_700_000_000 * NS_PER_S
    frame, fields = collector_frame(*MACS, GEN, SUT, dport=862, ssid=9, t1_ns=t1_ns)
    pkt = parse_udp_packet(frame[14:], verify_checksum=True)
    assert pkt.srh is not None
    assert pkt.srh.segments_left == 0
    assert (pkt.src_port, pkt.dst_port) == (862, 862)
    for k in (0, 1, 12_345):
        reply = decode_reflector(_patched(bytes(pkt.payload), fields, k))
        assert reply.ssid == 9
        assert reply.sender_seq == k
        assert decode_timestamp(reply.sender_timestamp, TimestampFormat.NTP) == t1_ns + k * NS_PER_S
    with pytest.raises(ValueError, match="whole second"):
        collector_frame(*MACS, GEN, SUT, dport=862, ssid=9, t1_ns=t1_ns + 1)


def test_mix_argv_and_bad_share() -> None:
    assert Mix(b"\x01\x02", 0.25, ((24, 0), (28, 5))).argv() == ["0102", "0.250000000", "24:0",
                                                                  "28:5"]  # fmt: skip
    assert Mix(b"\x01", 1.0, ((0, -1),)).argv()[2] == f"0:{(1 << 32) - 1}"
    with pytest.raises(ValueError, match="share"):
        Mix(b"\x01", 1.5).argv()


def _wait(predicate: object, timeout: float = 5.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_primed_session_stores_a_record_per_generator_reply_and_nothing_else() -> None:
    """The collector's priming: the replies stampgen makes match test packets the session
    has outstanding (records); a reply past the primed count, or with another T1, or a
    second one for the same Seq, is dropped by the core, not stored."""
    net = MemoryNetwork()
    sut_addr, gen_addr = IPv6Address(SUT), IPv6Address(GEN)
    collector = net.plane(DataplaneConfig(port=862, source=sut_addr))
    generator = net.plane(DataplaneConfig(port=862, source=gen_addr))
    collector.open()
    generator.open()
    engine = SenderEngine(collector)
    engine.start()
    try:
        count, t1_ns = 50, (int(time.time()) - 1000) * NS_PER_S
        config = SenderConfig(ssid=9, interval_ns=1000, count=count,
                              loss_timeout_ns=10_000 * NS_PER_S)  # fmt: skip
        prime_session(engine, SenderSessionSpec(config, gen_addr), count, t1_ns)
        assert net.sent == []  # primed, nothing sent
        frame, fields = collector_frame(*MACS, GEN, SUT, dport=862, ssid=9, t1_ns=t1_ns)
        payload = bytes(parse_udp_packet(frame[14:]).payload)
        for k in range(count - 1):
            generator.send(_patched(payload, fields, k), sut_addr, 862)
        _wait(lambda: engine.snapshot(9).counters.received == count - 1)
        generator.send(_patched(payload, fields, count), sut_addr, 862)  # never primed
        wrong_t1 = ((24, 0), (28, fields[1][1] + 1))  # Seq k with the T1 of Seq k + 1
        generator.send(_patched(payload, wrong_t1, count - 1), sut_addr, 862)
        generator.send(_patched(payload, fields, 4), sut_addr, 862)  # answered already
        generator.send(_patched(payload, fields, count - 1), sut_addr, 862)
        _wait(lambda: engine.counters.received == count + 3)
        snap = engine.snapshot(9)
        assert snap.counters.received == count
        assert snap.fifo_len == count
        assert snap.counters.duplicates == 1
        assert {r.value: n for r, n in snap.counters.dropped.items()} == {
            "unknown-seq": 1,
            "bad-timestamp": 1,
        }
        records = engine.results(9)
        assert [r.seq for r in records] == list(range(count))
        assert all(r.t1_ns == t1_ns + r.seq * NS_PER_S for r in records)
        # The session never sends (its count is reached): all that went was the generator's.
        assert {dst for dst, _, _ in net.sent} == {sut_addr}
    finally:
        engine.shutdown()
        collector.close()
        generator.close()


def test_priming_refuses_a_session_that_would_send_or_expire() -> None:
    net = MemoryNetwork()
    plane = net.plane(DataplaneConfig(port=862))
    plane.open()
    engine = SenderEngine(plane)
    try:
        spec = SenderSessionSpec(SenderConfig(ssid=1, count=None), IPv6Address(GEN))
        with pytest.raises(ValueError, match="count"):
            prime_session(engine, spec, 10, 0)
        config = SenderConfig(ssid=1, interval_ns=NS_PER_S, count=10, loss_timeout_ns=NS_PER_S)
        spec = SenderSessionSpec(config, IPv6Address(GEN))
        with pytest.raises(ValueError, match="loss timeout"):
            prime_session(engine, spec, 10, 0)
        assert engine.sessions() == []
    finally:
        plane.close()


def test_parse_external() -> None:
    impl = parse_external("c=prog --port {port}", {"c": "cat /tmp/n"})
    assert (impl.name, impl.command, impl.records) == ("c", "prog --port {port}", "cat /tmp/n")
    assert impl.roles() == ("collector", "reflector")
    assert parse_external("r=prog").roles() == ("reflector",)
    for bad in ("noequals", "=cmd", "x=", "xdp=prog", f"{BASELINE}=prog"):
        with pytest.raises(ValueError, match="external"):
            parse_external(bad)


def _trial(fraction: float, offered: int, handled: int, data: int | None = None) -> PaperTrial:
    stamp = round(offered * fraction)
    data_rx = offered - stamp if data is None else data
    return PaperTrial(rate=offered / 1.0, seconds=1.0, fraction=fraction, offered=offered,
                      stamp_offered=stamp, data_received=data_rx, stamp_handled=handled,
                      input_drops=0, stale=0, elapsed_s=1.0)  # fmt: skip


def _run(pdrs: dict[tuple[str, str, float], list[float]]) -> list[PaperPoint]:
    points = []
    for (role, impl, fraction), values in pdrs.items():
        for rep, pdr in enumerate(values):
            t = _trial(fraction, 1000, round(1000 * fraction))
            points.append(PaperPoint(role, impl, fraction, rep, pdr, [t], 1.0, 1e6))
    return points


IMPLS = sixlab_planes(["mmap", "xdp"])


def _complete(xdp_at_100: float = 9e5) -> dict[tuple[str, str, float], list[float]]:
    pdrs: dict[tuple[str, str, float], list[float]] = {}
    for role in ("collector", "reflector"):
        pdrs[(role, BASELINE, 0.0)] = [1e6, 1.01e6]
        for plane in ("mmap", "xdp"):
            pdrs[(role, plane, 0.0)] = [9e5, 9.1e5]
            pdrs[(role, plane, 1.0)] = [xdp_at_100 if plane == "xdp" else 1e5] * 2
    return pdrs


def test_summary_mean_and_confidence_interval() -> None:
    points = _run({("reflector", "xdp", 1.0): [10.0, 12.0, 14.0]})
    (s,) = summarize(points)
    assert (s.n, s.mean) == (3, 12.0)
    assert s.ci95 == pytest.approx(4.303 * 2.0 / 3**0.5)  # t(0.975, 2) * s / sqrt(n)
    (one,) = summarize(_run({("reflector", "xdp", 1.0): [10.0]}))
    assert one.ci95 == 0.0


def test_check_passes_a_complete_consistent_run() -> None:
    xdp = {"handled": 5, "reflected": 0, "plane": {"reflected": 5}}
    meta = {"repeat": 2, "sut_counters": {"0/reflector/xdp": xdp}}
    assert check(_run(_complete()), meta, IMPLS, ["collector", "reflector"], [0.0, 1.0]) == []


def test_check_names_what_does_not_hold() -> None:
    pdrs = _complete(xdp_at_100=4e4)  # xdp far below mmap at 100 % STAMP
    del pdrs[("collector", "mmap", 1.0)]  # a missing point
    pdrs[("reflector", "mmap", 0.0)] = [0.0, 9e5]  # a PDR of 0
    points = _run(pdrs)
    points[0].trials.append(_trial(0.0, 100, 0, data=101))  # more received than offered
    points[0].trials.append(_trial(0.0, 100, 1))  # STAMP handled at 0 % STAMP
    points[-1].trials.append(dataclasses.replace(_trial(1.0, 100, 50), stamp_offered=50))
    mmap = {"handled": 7, "engine": {"received": 6}}
    failed = {"1/collector/mmap": "mmap (collector): a light trial does not pass"}
    meta = {"repeat": 2, "sut_counters": {"0/collector/mmap": mmap}, "failed": failed}
    problems = check(points, meta, IMPLS, ["collector", "reflector"], [0.0, 1.0])
    text = "\n".join(problems)
    assert "collector/mmap/100.00%: 0 of 2 points" in text
    assert "reflector/mmap/0.00%: PDR 0" in text
    assert "101 data received of 100" in text
    assert "1 STAMP handled of 0" in text
    assert "50 STAMP of 100 offered" in text
    assert "the bench counted 7 handled, the implementation 6" in text
    assert "reflector: xdp at 100 % STAMP" in text
    assert "1/collector/mmap: no searches (mmap (collector): a light trial" in text
    quick = check(points, meta, IMPLS, ["collector", "reflector"], [0.0, 1.0], compare_speed=False)
    assert not any("xdp at 100 % STAMP" in line for line in quick)  # no speed in --quick
    assert set(quick) == set(problems) - {line for line in problems if "xdp at 100" in line}


def test_check_names_an_xdp_plane_whose_kernel_program_did_not_do_the_work() -> None:
    user_space = {"handled": 100, "engine": {"received": 100}, "plane": {"collected": 10}}
    kernel = {"handled": 100, "engine": {"received": 100}, "plane": {"collected": 100}}
    for counters, expected in ((user_space, 1), (kernel, 0)):
        meta = {"repeat": 2, "sut_counters": {"0/collector/xdp": counters}}
        problems = check(_run(_complete()), meta, IMPLS, ["collector", "reflector"], [0.0, 1.0])
        assert len(problems) == expected, problems
        assert all("kernel program handled 10 of the 100" in line for line in problems)


def test_report_tables_ratios_and_plots(tmp_path: Path) -> None:
    points = _run(_complete())
    meta = {"command": "bench_stamp.py paper", "date": "today", "commit": "abc",
            "ceiling": [2e6, 1.9e6], "xdp_note": "note", "repeat": 2}  # fmt: skip
    write_results(points, meta, tmp_path / "r.json")
    again, meta_again = load_points(tmp_path / "r.json")
    assert again == points
    assert meta_again == meta
    text = markdown(points, meta)
    assert "bench_stamp.py paper" in text
    assert "| xdp | 905.0 ± 63.5 | 0.900 | 1,015.9 | 0.984 |" in text
    assert "| xdp | 900.0 ± 0.0 | 900.0 ± 0.0 | 2,994.90 | 2,179.00 |" in text
    ratios = {r["what"]: r for r in paper_ratios(summarize(points))}
    row = ratios["Fig 14b: xdp / mmap, 100 % STAMP"]
    assert row["ours"] == pytest.approx(9.0)
    assert row["paper"] == pytest.approx(2179.0 / 35.3)
    assert ratios["Fig 12: xdp / baseline, 0 % STAMP"]["paper"] == pytest.approx(0.984)
    written = plot_figures(points, meta, tmp_path)
    assert sorted(written) == ["12", "13", "14", "15", "16"]
    for path in written.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ratios_of_planes_the_paper_has_not() -> None:
    pdrs = {("reflector", BASELINE, 0.0): [1e6], ("reflector", "afxdp", 0.0): [8e5],
            ("reflector", "afxdp", 1.0): [3e5], ("reflector", "mmap", 1.0): [1e5]}  # fmt: skip
    ratios = {r["what"]: r for r in paper_ratios(summarize(_run(pdrs)))}
    row = ratios["Fig 13: afxdp / baseline, 0 % STAMP"]
    assert (row["ours"], row["paper"]) == (pytest.approx(0.8), None)
    row = ratios["Fig 14b: afxdp / mmap, 100 % STAMP"]
    assert (row["ours"], row["paper"]) == (pytest.approx(3.0), None)
    assert ratios["Fig 12: afxdp / baseline, 0 % STAMP"]["ours"] is None  # no point


def test_lowest_rates_are_below_the_papers_slowest_figure() -> None:
    # The paper's Scapy reflector at 100 % STAMP: 0.47 kframes/s. A search starting
    # above it gives a plane as slow PDR 0; a light trial with more STAMP than that
    # stops a plane as slow before its searches.
    slowest = min(PAPER.values()) * 1e3
    assert SearchSettings().min_rate < slowest
    assert slowest > PREFLIGHT_RATE * 0.5


def test_report_says_what_a_pdr_of_zero_means() -> None:
    pdrs = {("reflector", BASELINE, 0.0): [1e6], ("reflector", "scapy", 1.0): [0.0]}
    text = markdown(_run(pdrs), {"settings": {"min_rate": 100.0}})
    assert "lowest rate (100.0 frames/s) already lost more than 0.5 %" in text
    assert "lowest rate" not in markdown(_run({("reflector", BASELINE, 0.0): [1e6]}), {})


def test_implementation_roles() -> None:
    assert Implementation("x", "sixlab", plane="xdp").roles() == ("collector", "reflector")
    assert [i.name for i in sixlab_planes(["scapy"])] == [BASELINE, "scapy"]
