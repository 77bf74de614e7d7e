"""The capture planes (``scapy``, ``mmap``) against the kernel ``socket`` plane, in namespaces.

Each side runs in its own process inside its namespace (``gen`` and ``sut`` of the bench
testbed, joined by a veth), started as ``python -m tests.integration.test_dataplanes
reflector|sender ...``: this module is also the helper program. A side prints one JSON
object on stdout when it is done; the reflector prints ``ready`` first and runs until its
stdin closes.

What is proven here: sessions of 50 probes over plain IPv6 and over an SRH are all
answered in both directions of interop (capture plane as reflector, and as sender); the
replies decode and carry the reflector's SRH when it has a return path; delays are sane;
the mmap plane's nftables table lives exactly as long as the plane (and a SIGKILLed
run's leftover is replaced by the next open); no ICMPv6 port unreachable leaves the
reflector while a capture plane is open (and one does once it is closed: the control).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from ipaddress import IPv6Address
from pathlib import Path
from typing import Any

import pytest

from sixlab.dataplane._filters import table_name
from sixlab.dataplane.base import DataplaneConfig, create
from sixlab.testbed import BenchTestbed, Node
from tests.integration._tap import ETH_P_IPV6, Tap

ROOT = Path(__file__).resolve().parents[2]
REFLECTOR_PORT = 862
SENDER_PORT = 40862
COUNT = 50
#: Generous: a scapy process takes ~1-2 s to import on a loaded 2-core machine.
READY_TIMEOUT_S = 30.0

pytestmark = pytest.mark.root


# ------------------------------------------------------------------ helper program


def _reflector_main(args: argparse.Namespace) -> None:
    from sixlab.dataplane.engine import ReflectorEngine  # noqa: PLC0415
    from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig  # noqa: PLC0415

    ret = tuple(IPv6Address(s) for s in args.return_segment) or None
    plane = create(args.plane, DataplaneConfig(port=args.port, interface=args.interface))
    plane.open()
    engine = ReflectorEngine(plane, Reflector())
    # Through the engine: a plane that steers sessions (afxdp, xdp) needs the session too.
    engine.set_default(ReflectorSessionConfig(None, return_segments=ret))
    engine.start()
    print("ready", flush=True)
    select.select([sys.stdin], [], [], args.seconds)
    engine.shutdown()
    plane.close()
    counters = engine.counters
    print(
        json.dumps(
            {
                "received": counters.received,
                "send_failed": counters.send_failed,
                "reflected": engine.reflector.counters.reflected,
                "fallback_sends": plane.counters().get("fallback_sends", 0),
                "fast_replies": plane.counters().get("fast_replies", 0),
                "error": repr(engine.error) if engine.error else None,
            }
        ),
        flush=True,
    )


def _sender_main(args: argparse.Namespace) -> None:
    from sixlab.dataplane.engine import SenderEngine, SenderSessionSpec  # noqa: PLC0415
    from sixlab.stamp.sender import SenderConfig  # noqa: PLC0415
    from sixlab.wire.packet import parse_udp_packet  # noqa: PLC0415
    from sixlab.wire.stamp_tlv import ExtraPadding  # noqa: PLC0415

    capture = Tap(None, args.interface, protocol=ETH_P_IPV6, cooked=True)
    plane = create(args.plane, DataplaneConfig(port=args.port, interface=args.interface))
    plane.open()
    engine = SenderEngine(plane)
    engine.start()
    segments = tuple(IPv6Address(s) for s in args.segment) or None
    tlvs = ExtraPadding(bytes(args.padding)).to_tlv().encode() if args.padding else b""
    config = SenderConfig(
        ssid=7, interval_ns=args.interval_ms * 1_000_000, count=args.count, tlvs=tlvs
    )
    engine.add_session(SenderSessionSpec(config, IPv6Address(args.reflector), args.rport, segments))
    engine.start_session(7)
    finished = engine.wait_finished(7, 60.0)
    results = engine.results(7)
    snapshot = engine.snapshot(7)
    engine.shutdown()
    plane_counters = plane.counters()
    plane.close()
    replies: list[list[str] | None] = []
    sizes: list[int] = []
    for frame in capture.frames():
        try:
            # No checksum check: a kernel-socket reply on a veth with checksum offload
            # is captured before its checksum is filled in.
            packet = parse_udp_packet(frame.data)
        except ValueError:
            continue
        if packet.udp.dst_port == args.port:
            srh = packet.srh
            replies.append(None if srh is None else [str(a) for a in srh.travel_order])
            sizes.append(len(packet.payload))
    print(
        json.dumps(
            {
                "finished": finished,
                "sent": snapshot.counters.sent,
                "received": snapshot.counters.received,
                "lost": snapshot.counters.lost,
                "results": [
                    [r.seq, r.t1_ns, r.t2_ns, r.t3_ns, r.t4_ns, r.ses_sender_ttl] for r in results
                ],
                "replies": replies,
                "sizes": sizes,
                "plane": plane_counters,
                "error": repr(engine.error) if engine.error else None,
            }
        ),
        flush=True,
    )


def _main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    refl = sub.add_parser("reflector")
    refl.add_argument("--plane", required=True)
    refl.add_argument("--port", type=int, default=REFLECTOR_PORT)
    refl.add_argument("--interface")
    refl.add_argument("--return-segment", action="append", default=[])
    refl.add_argument("--seconds", type=float, default=60.0)
    send = sub.add_parser("sender")
    send.add_argument("--plane", required=True)
    send.add_argument("--port", type=int, default=SENDER_PORT)
    send.add_argument("--interface", required=True)
    send.add_argument("--reflector", required=True)
    send.add_argument("--rport", type=int, default=REFLECTOR_PORT)
    send.add_argument("--segment", action="append", default=[])
    send.add_argument("--count", type=int, default=COUNT)
    send.add_argument("--interval-ms", type=int, default=10)
    send.add_argument("--padding", type=int, default=0, help="Extra Padding TLV bytes")
    args = parser.parse_args()
    if args.role == "reflector":
        _reflector_main(args)
    else:
        _sender_main(args)


# --------------------------------------------------------------------------- driver


@dataclass
class Side:
    proc: subprocess.Popen[bytes]

    def wait_ready(self) -> None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], READY_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else b""
        assert line.strip() == b"ready", (line, self.proc.poll())

    def finish(self, timeout: float = 90.0) -> dict[str, Any]:
        """Close stdin (the reflector's stop signal) and read the JSON report."""
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err.decode()
        report: dict[str, Any] = json.loads(out.splitlines()[-1])
        return report


def _start(tb: BenchTestbed, node: Node, role: str, *args: str, stdin: bool = True) -> Side:
    argv = [sys.executable, "-m", "tests.integration.test_dataplanes", role, *args]
    proc = tb.testbed.run_in(
        node,
        argv,
        cwd=ROOT,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    return Side(proc)


def _checksums_complete(tb: BenchTestbed) -> None:
    """Frames that kernel sockets send through a veth keep an unfinished UDP checksum
    while tx checksum offload is on; a plane that reads frames before the kernel's IPv6
    input (afxdp) would count them as damaged (``sixlab.dataplane.afxdp_plane``)."""
    tb.testbed.exec_in(tb.gen, ["ethtool", "-K", tb.gen_if, "tx", "off"])
    tb.testbed.exec_in(tb.sut, ["ethtool", "-K", tb.sut_if, "tx", "off"])


def reflector(tb: BenchTestbed, plane: str, *extra: str) -> Side:
    if plane == "afxdp":
        _checksums_complete(tb)
    side = _start(tb, tb.sut, "reflector", "--plane", plane, "--interface", tb.sut_if, *extra)
    side.wait_ready()
    return side


def sender(tb: BenchTestbed, plane: str, *extra: str) -> dict[str, Any]:
    if plane == "afxdp":
        _checksums_complete(tb)
    side = _start(
        tb, tb.gen, "sender", "--plane", plane, "--interface", tb.gen_if,
        "--reflector", tb.sut_addr, *extra, stdin=False,
    )  # fmt: skip
    return side.finish()


def check_session(report: dict[str, Any], *, srh: list[str] | None) -> None:
    """All probes answered, delays sane, replies carried ``srh`` (or none)."""
    assert report["error"] is None
    assert report["finished"]
    assert report["sent"] == COUNT
    assert report["received"] == COUNT
    assert report["lost"] == 0
    seqs = sorted(r[0] for r in report["results"])
    assert seqs == list(range(COUNT))
    for _seq, t1, t2, t3, t4, ttl in report["results"]:
        # Same kernel clock on both sides: every step is causal and well under 1 s.
        assert t1 < t2 <= t3 < t4, (t1, t2, t3, t4)
        assert 0 < (t4 - t1) - (t3 - t2) < 1_000_000_000
        assert ttl == 64  # one veth, no router: the sender's default Hop Limit
    assert len(report["replies"]) == COUNT
    assert all(r == srh for r in report["replies"]), report["replies"][:3]


def icmp6_unreachables(tb: BenchTestbed) -> int:
    """Icmp6OutDestUnreachs of the SUT namespace (/proc/net/snmp6 is per namespace)."""
    out = tb.testbed.exec_in(tb.sut, ["cat", "/proc/net/snmp6"]).stdout
    for line in out.splitlines():
        name, _, value = line.partition(" ")
        if name == "Icmp6OutDestUnreachs":
            return int(value)
    raise AssertionError("no Icmp6OutDestUnreachs in /proc/net/snmp6")


def nft_table(tb: BenchTestbed, port: int = REFLECTOR_PORT) -> str | None:
    proc = tb.testbed.exec_in(
        tb.sut, ["nft", "list", "table", "ip6", table_name(port)], check=False
    )
    return proc.stdout if proc.returncode == 0 else None


# ---------------------------------------------------------------------------- tests

PLANES = ["scapy", "mmap", "afxdp"]
#: Planes that tap packets the kernel also receives, and so keep it from answering them.
TAP_PLANES = ["scapy", "mmap"]


@pytest.mark.parametrize("path", ["plain", "srh"])
@pytest.mark.parametrize("plane", PLANES)
def test_capture_plane_as_reflector(bench_testbed: BenchTestbed, plane: str, path: str) -> None:
    tb = bench_testbed
    srh = path == "srh"
    ret = ["--return-segment", tb.gen_addr] if srh else []
    refl = reflector(tb, plane, *ret)
    before = icmp6_unreachables(tb)
    report = sender(tb, "socket", *(["--segment", tb.sut_addr] if srh else []))
    after = icmp6_unreachables(tb)
    stats = refl.finish()
    assert stats["error"] is None
    check_session(report, srh=[tb.gen_addr] if srh else None)
    assert after == before  # the kernel stayed silent
    assert stats["received"] == stats["reflected"] == COUNT
    assert stats["send_failed"] == 0
    # mmap: the neighbour is known from the sender's own ND, so at most the first reply
    # takes the kernel route; the rest go out on the packet socket.
    assert stats["fallback_sends"] <= 1


@pytest.mark.parametrize("path", ["plain", "srh"])
@pytest.mark.parametrize("plane", PLANES)
def test_capture_plane_as_sender(bench_testbed: BenchTestbed, plane: str, path: str) -> None:
    tb = bench_testbed
    srh = path == "srh"
    refl = reflector(tb, "socket", *(["--return-segment", tb.gen_addr] if srh else []))
    # An AF_XDP socket takes the replies before any packet tap on the sender's interface
    # sees them: capture them where they leave the reflector instead (only an ETH_P_ALL
    # tap sees outgoing frames).
    tap = Tap(tb.sut, tb.sut_if, cooked=True)
    report = sender(tb, plane, *(["--segment", tb.sut_addr] if srh else []))
    if plane == "afxdp":
        report["replies"] = _replies(tap, SENDER_PORT)
        assert report["plane"]["collected"] == COUNT  # all through collect_frames
    tap.close()
    check_session(report, srh=[tb.gen_addr] if srh else None)
    assert refl.finish()["reflected"] == COUNT


def _replies(tap: Tap, port: int) -> list[list[str] | None]:
    """The SRv6 paths (travel order, None: no SRH) of the STAMP replies ``tap`` saw
    leave."""
    from sixlab.wire.packet import parse_udp_packet  # noqa: PLC0415

    out: list[list[str] | None] = []
    for frame in tap.frames():
        if not frame.outgoing or frame.protocol != ETH_P_IPV6:
            continue
        try:
            packet = parse_udp_packet(frame.data)
        except ValueError:
            continue  # not UDP (Neighbour Discovery)
        if packet.udp.dst_port == port:
            srh = packet.srh
            out.append(None if srh is None else [str(a) for a in srh.travel_order])
    return out


def test_mmap_reflects_mmap(bench_testbed: BenchTestbed) -> None:
    tb = bench_testbed
    refl = reflector(tb, "mmap", "--return-segment", tb.gen_addr)
    check_session(sender(tb, "mmap", "--segment", tb.sut_addr), srh=[tb.gen_addr])
    assert refl.finish()["reflected"] == COUNT


@pytest.mark.parametrize("padding", [0, 20, 33])
@pytest.mark.parametrize("path", ["plain", "srh"])
@pytest.mark.parametrize("plane", ["mmap", "afxdp"])
def test_fast_path_takes_srh_and_padding(
    bench_testbed: BenchTestbed, plane: str, path: str, padding: int
) -> None:
    """Probes with an SRH (Segments Left 0) and Extra Padding TLVs (even and odd sizes)
    are answered by the fast path, replies of the probe's size on the configured return
    path."""
    tb = bench_testbed
    srh = path == "srh"
    refl = reflector(tb, plane, *(["--return-segment", tb.gen_addr] if srh else []))
    report = sender(
        tb, "socket", "--padding", str(padding), *(["--segment", tb.sut_addr] if srh else [])
    )
    stats = refl.finish()
    check_session(report, srh=[tb.gen_addr] if srh else None)
    size = 44 + (4 + padding if padding else 0)
    assert report["sizes"] == [size] * COUNT
    assert stats["received"] == stats["reflected"] == COUNT
    assert stats["fast_replies"] >= COUNT - 1  # the first may wait for the neighbour


def _probe(tb: BenchTestbed) -> None:
    """One unauthenticated STAMP probe from gen to the reflector port (kernel socket)."""
    with tb.gen.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
        sock.sendto(bytes(12) + b"\x00\x01" + bytes(30), (tb.sut_addr, REFLECTOR_PORT))


def _wait_for(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


@pytest.mark.parametrize("plane", TAP_PLANES)
def test_kernel_drop_lifecycle(bench_testbed: BenchTestbed, plane: str) -> None:
    """The table exists while open, is gone after close; the kernel answers only then."""
    tb = bench_testbed
    assert nft_table(tb) is None
    refl = reflector(tb, plane)
    table = nft_table(tb)
    assert table is not None
    assert f'comment "sixlab pid={refl.proc.pid}"' in table  # ip netns exec execs python
    before = icmp6_unreachables(tb)
    _probe(tb)
    time.sleep(0.3)
    assert icmp6_unreachables(tb) == before
    assert refl.finish()["received"] == 1
    assert nft_table(tb) is None
    # Control: with the plane closed the same probe makes the kernel answer, so the
    # silence above was the table's doing and the counter does see unreachables.
    _probe(tb)
    assert _wait_for(lambda: icmp6_unreachables(tb) > before)


def test_mmap_leftover_of_killed_run_is_replaced(bench_testbed: BenchTestbed) -> None:
    tb = bench_testbed
    first = reflector(tb, "mmap")
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)
    leftover = nft_table(tb)
    assert leftover is not None  # SIGKILL runs no atexit: the table stays behind
    second = reflector(tb, "mmap")
    table = nft_table(tb)
    assert table is not None
    assert table != leftover  # a new owner pid in the comment
    report = sender(tb, "socket", "--count", "5")
    assert report["received"] == 5
    second.finish()
    assert nft_table(tb) is None


def _xdp_attached(tb: BenchTestbed) -> bool:
    out = tb.testbed.exec_in(tb.sut, ["ip", "-j", "link", "show", tb.sut_if]).stdout
    return "xdp" in json.loads(out)[0]


def test_afxdp_detaches_on_exit_and_after_a_crash(bench_testbed: BenchTestbed) -> None:
    """A SIGKILLed afxdp plane leaves its program on the interface; the next open
    replaces it and answers, and a clean exit leaves no program behind."""
    tb = bench_testbed
    first = reflector(tb, "afxdp")
    assert _xdp_attached(tb)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)
    assert _xdp_attached(tb)  # SIGKILL runs no atexit: the program stays
    second = reflector(tb, "afxdp")
    report = sender(tb, "socket", "--count", "5")
    assert report["received"] == 5
    assert second.finish()["reflected"] == 5
    assert not _xdp_attached(tb)


def _snmp6(tb: BenchTestbed, name: str) -> int:
    out = tb.testbed.exec_in(tb.sut, ["cat", "/proc/net/snmp6"]).stdout
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    raise AssertionError(f"no {name} in /proc/net/snmp6")


def test_afxdp_leaves_a_damaged_probe_to_the_kernel(bench_testbed: BenchTestbed) -> None:
    """A probe whose UDP checksum fails never reaches the socket: the kernel's UDP layer
    counts and drops it; the good probe right after it is answered."""
    from sixlab.bench.generator import interface_mac, stamp_frame  # noqa: PLC0415

    tb = bench_testbed
    refl = reflector(tb, "afxdp")
    frame = stamp_frame(
        interface_mac(tb, tb.gen, tb.gen_if), interface_mac(tb, tb.sut, tb.sut_if),
        tb.gen_addr, tb.sut_addr, ssid=3,
    )  # fmt: skip
    damaged = bytearray(frame)
    damaged[-1] ^= 0x01  # one payload bit: the checksum no longer verifies
    before = _snmp6(tb, "Udp6InCsumErrors")
    with tb.gen.socket(socket.AF_PACKET, socket.SOCK_RAW) as raw:
        raw.bind((tb.gen_if, 0))
        raw.send(bytes(damaged))
        raw.send(frame)
    assert _wait_for(lambda: _snmp6(tb, "Udp6InCsumErrors") == before + 1)
    stats = refl.finish()
    assert stats["received"] == stats["reflected"] == 1


def test_mmap_refuses_port_of_live_owner(bench_testbed: BenchTestbed) -> None:
    tb = bench_testbed
    first = reflector(tb, "mmap")
    second = _start(tb, tb.sut, "reflector", "--plane", "mmap", "--interface", tb.sut_if)
    out, err = second.proc.communicate(timeout=60)
    assert second.proc.returncode != 0
    assert b"belongs to live process" in err
    assert nft_table(tb) is not None  # the first plane's table was left alone
    first.finish()
    assert nft_table(tb) is None
    del out


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    _main()
