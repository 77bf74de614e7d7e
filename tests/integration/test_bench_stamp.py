"""The STAMP paper harness on a real bench: the mixing generator, and ``--quick`` in CI.

No speed is asserted: the quick run checks the harness's invariants (``check`` in
``sixlab.bench.stamp_paper``): every configuration produced a PDR, every trial's counts
add up and agree with the implementations' own counters, and the xdp plane's STAMP
work was done by its kernel program (``XDP_KERNEL_SHARE``), which is what "xdp at 100 %
STAMP is at least the user-space planes" guards against without timing anything: on a
machine shared with other test runs the planes' PDRs swap places from run to run.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sixlab.bench.generator import Mix, build_generator, interface_mac, run_generator
from sixlab.bench.stamp_paper import (
    BASELINE,
    Implementation,
    SearchSettings,
    collector_frame,
    parse_external,
    reflector_probe_frame,
    run_paper,
)
from sixlab.testbed import BenchTestbed
from sixlab.wire.packet import parse_udp_packet

from .conftest import TEST_PREFIX

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parents[2]
#: The quick run takes 3-5 minutes here, on a machine shared with other test runs.
QUICK_TIMEOUT_S = 540
ETH_P_IPV6 = 0x86DD


def _capture(tb: BenchTestbed) -> socket.socket:
    sock = tb.sut.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IPV6))
    sock.bind((tb.sut_if, ETH_P_IPV6))
    sock.settimeout(0.5)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    return sock


def test_generator_mixes_a_share_of_a_second_frame_with_its_own_counters(
    bench_testbed: BenchTestbed,
) -> None:
    tb = bench_testbed
    macs = (interface_mac(tb, tb.gen, tb.gen_if), interface_mac(tb, tb.sut, tb.sut_if))
    main = reflector_probe_frame(macs[0], macs[1], tb.gen_addr, tb.sut_addr, sport=50000, ssid=1)
    t1_ns = 1_700_000_000 * 1_000_000_000
    mixed, fields = collector_frame(macs[0], macs[1], tb.gen_addr, tb.sut_addr, dport=40000,
                                    ssid=2, t1_ns=t1_ns)  # fmt: skip
    sock = _capture(tb)
    try:
        stats = run_generator(tb, build_generator(), main, 2000.0, 0.5, batch=8,
                              mix=Mix(mixed, 0.25, fields))  # fmt: skip
        frames: list[bytes] = []
        deadline = time.monotonic() + 5
        while len(frames) < stats["offered"] and time.monotonic() < deadline:
            try:
                frame, addr = sock.recvfrom(2048)
            except TimeoutError:
                break
            # The generator's frames only (both kinds carry an SRH), not the kernels'
            # Neighbour Discovery or anything the SUT sends.
            if addr[2] != socket.PACKET_OUTGOING and frame[6:12] == macs[0] and frame[20] == 43:
                frames.append(frame)
    finally:
        sock.close()
    assert stats["input_drops"] == 0
    offered = int(stats["offered"])
    assert len(frames) == offered > 900
    kinds = []
    for frame in frames:
        pkt = parse_udp_packet(frame[14:], verify_checksum=True)  # checksums kept valid
        payload = bytes(pkt.payload)
        if pkt.dst_port == 40000:
            seq, seconds = struct.unpack_from("!I", payload, 24)[0], payload[28:32]
            assert struct.unpack("!I", seconds)[0] == fields[1][1] + seq
            kinds.append(("mix", seq))
        else:
            kinds.append(("main", struct.unpack_from("!I", payload)[0]))
    mix = [n for kind, n in kinds if kind == "mix"]
    main_seqs = [n for kind, n in kinds if kind == "main"]
    assert stats["mix_offered"] == len(mix) == offered // 4  # the share, exactly
    assert mix == list(range(len(mix)))  # each kind counts its own frames
    assert main_seqs == list(range(offered - len(mix)))
    # Spread evenly: one in four, never two mixed frames in a row.
    assert all(kinds[i][0] == ("mix" if i % 4 == 3 else "main") for i in range(len(kinds)))


@pytest.mark.timeout(QUICK_TIMEOUT_S + 60)
def test_quick_paper_run_holds_its_invariants(tmp_path: Path) -> None:
    """``bench_stamp.py paper --quick`` with an external reflector (sixlab's own CLI)."""
    out = tmp_path / "run"
    external = (
        f"cli={sys.executable} -m sixlab stamp reflector --listen {{address}} --port {{port}}"
    )
    argv = [sys.executable, str(ROOT / "benchmarks" / "bench_stamp.py"), "paper", "--quick",
            "--out", str(out), "--external", external, "--netns-prefix", TEST_PREFIX]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=QUICK_TIMEOUT_S)
    finally:
        if proc.poll() is None:  # it cleans up its namespaces on SIGTERM
            proc.terminate()
            proc.communicate(timeout=60)
    assert proc.returncode == 0, output[-5000:]
    document = json.loads((out / "stamp-paper.json").read_text())
    assert document["meta"]["invariants"] == "all hold"
    got = {(p["role"], p["impl"], p["fraction"]) for p in document["points"]}
    for role in ("collector", "reflector"):
        assert (role, "baseline", 0.0) in got
        for plane in ("scapy", "mmap", "socket", "xdp", "afxdp"):
            assert {(role, plane, f) for f in (0.0, 0.01, 1.0)} <= got
    assert {("reflector", "cli", f) for f in (0.0, 0.01, 1.0)} <= got
    assert not any(p[1] == "cli" for p in got if p[0] == "collector")  # no records command
    for name in ("stamp-paper.md", *(f"fig{n}.png" for n in range(12, 17))):
        assert (out / name).stat().st_size > 0


#: An external collector for the test: counts the STAMP datagrams of SSID 1 that reach
#: its UDP socket and keeps the count in a file (its "records").
_COUNTING_COLLECTOR = """
import os, socket, struct, sys, time
path, port = sys.argv[1], int(sys.argv[2])
sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
sock.bind(("::", port))
sock.settimeout(0.02)
n, written, last = 0, -1, 0.0
while True:
    try:
        data = sock.recv(2048)
        if len(data) >= 44 and struct.unpack_from("!H", data, 14)[0] == 1:
            n += 1
    except TimeoutError:
        pass
    if n != written and time.monotonic() - last > 0.02:
        with open(path + ".tmp", "w") as f:
            f.write(str(n))
        os.replace(path + ".tmp", path)
        written, last = n, time.monotonic()
"""


@pytest.mark.parametrize("bench_testbed", [True], indirect=True)
def test_external_collector_is_counted_by_its_records_command(
    bench_testbed: BenchTestbed, tmp_path: Path
) -> None:
    script = tmp_path / "collector.py"
    script.write_text(_COUNTING_COLLECTOR)
    count = tmp_path / "records"
    impl = parse_external(
        f"counting={sys.executable} {script} {count} {{port}}", {"counting": f"cat {count}"}
    )
    settings = SearchSettings(precision=0.3, trial_seconds=0.3, final_seconds=0.3,
                              max_rate=20_000.0, method="bisect")  # fmt: skip
    points, info = run_paper(bench_testbed, [impl], roles=["collector"], fractions=[0.5],
                             settings=settings, log=lambda _m: None)  # fmt: skip
    (point,) = points
    # What is checked is the counting, not a rate: on a loaded machine every trial of the
    # search can lose more than 0.5 % (a CI run beside other work: a PDR of 0 with load
    # average 10.4), while the collector still counted what it got.
    assert any(t.stamp_handled > 0 for t in point.trials)
    for t in point.trials:
        assert 0 <= t.stamp_handled <= t.stamp_offered
    counters = info["sut_counters"]
    assert isinstance(counters, dict)
    handled = counters["0/collector/counting"]["handled"]
    assert 0 < handled <= int(count.read_text())  # what the bench counted, it reported


@pytest.mark.parametrize("bench_testbed", [True], indirect=True)
def test_an_implementation_that_never_answers_is_named_and_the_run_goes_on(
    bench_testbed: BenchTestbed,
) -> None:
    mute = parse_external("mute=sleep 600")  # started, answers nothing
    settings = SearchSettings(precision=0.3, trial_seconds=0.3, final_seconds=0.3,
                              max_rate=20_000.0, method="bisect")  # fmt: skip
    impls = [Implementation(BASELINE, "baseline"), mute]
    points, info = run_paper(bench_testbed, impls, roles=["reflector"], fractions=[0.5],
                             settings=settings, log=lambda _m: None,
                             preflight_attempts=2)  # fmt: skip
    assert [(p.impl, p.fraction) for p in points] == [(BASELINE, 0.0)]  # the run went on
    failed = info["failed"]
    assert isinstance(failed, dict)
    assert list(failed) == ["0/reflector/mute"]
    assert "a light trial does not pass" in failed["0/reflector/mute"]
