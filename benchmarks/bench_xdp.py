"""Per-packet cost of the XDP STAMP reflector, from the kernel's BPF run-time statistics.

    sudo .venv/bin/python benchmarks/bench_xdp.py [--seconds S] [--cases plain,srv6,other]

Builds the two-node bench (``gen eth0 ── sut eth0``), opens the ``xdp`` plane on the
SUT's interface with a default session, turns ``kernel.bpf_stats_enabled`` on (restored
after) and floods the SUT from a generator process pinned to CPU 0 that writes one
prebuilt frame in a loop on an AF_PACKET socket. For each case it reports:

* ns/packet = Δrun_time_ns / Δrun_cnt of the attached program (``bpf_prog_info``): the
  time the kernel spent inside the program, what the issue's 150 ns target is about;
* the generator's offered rate and the rate of replies the program sent (its
  ``reflected`` counter), so the generator's ceiling is reported next to it.

Cases: ``plain`` (IPv6/UDP/STAMP 44 bytes, stateless, NTP); ``srv6`` (arrives with a
2-segment SRH, answered stateful, PTP, with a 2-SID return list: the head is resized);
``padding`` (plain plus a 64-byte Extra Padding TLV, copied with U cleared); ``other``
(UDP to another port: the cost of passing non-STAMP traffic). Not a test: numbers go
in benchmarks/README.md with the command that produced them.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from ipaddress import IPv6Address
from pathlib import Path

from sixlab.dataplane.base import DataplaneConfig
from sixlab.dataplane.xdp_plane import XdpDataplane, attach_xdp_pass
from sixlab.stamp.reflector import ReflectorMode, ReflectorSessionConfig
from sixlab.testbed import Node, entered, two_node_bench
from sixlab.wire import stamp as wire
from sixlab.wire.packet import build_udp_packet
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat, ntp_from_ns, ptp_from_ns

PORT = 862
GEN_PORT = 40862
STATS = Path("/proc/sys/kernel/bpf_stats_enabled")

#: The generator: one frame, sent in a loop for a while; prints how many it sent.
GENERATOR = """
import socket, sys, time
frame = bytes.fromhex(sys.argv[1]); seconds = float(sys.argv[2])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("eth0", 0))
sink = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)  # absorbs the replies
sink.bind(("::", int(sys.argv[3])))
send = s.send
sent = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(1000):
        try:
            send(frame)
            sent += 1
        except OSError:
            pass
print(sent, flush=True)
"""


def _mac(node: Node, ifname: str) -> bytes:
    out = node.exec(["ip", "link", "show", "dev", ifname]).stdout
    match = re.search(r"link/ether ([0-9a-f:]{17})", out)
    assert match is not None, out
    return bytes.fromhex(match.group(1).replace(":", ""))


def _frame(case: str, gen: IPv6Address, sut: IPv6Address, gmac: bytes, smac: bytes) -> bytes:
    now = time.time_ns()
    fmt = TimestampFormat.PTP if case == "srv6" else TimestampFormat.NTP
    ts = ptp_from_ns(now + 37_000_000_000) if case == "srv6" else ntp_from_ns(now)
    tlvs = b"\x80\x01\x00\x40" + bytes(64) if case == "padding" else b""
    ee = ErrorEstimate.for_error_ns(1000, fmt=fmt)
    payload = wire.encode_sender(wire.SenderPacket(1, ts, ee, 5, tlvs))
    dport = PORT + 1 if case == "other" else PORT
    segments = (IPv6Address("fc00::1"), sut) if case == "srv6" else None
    pkt = bytearray(build_udp_packet(gen, sut, GEN_PORT, dport, payload, segments=segments))
    if segments:  # as the last End leaves it: final destination, Segments Left 0
        pkt[24:40] = sut.packed
        pkt[43] = 0
    return smac + gmac + b"\x86\xdd" + bytes(pkt)


def run(seconds: float, cases: list[str]) -> list[dict[str, object]]:
    results = []
    previous = STATS.read_text().strip()
    with two_node_bench(prefix="sixlab-bench-") as tb:
        for node in (tb.gen, tb.sut):
            node.exec(["ethtool", "-K", "eth0", "tx", "off"])
        with entered(tb.gen.ns):
            attach_xdp_pass("eth0")  # XDP_TX on the SUT's veth needs XDP on its peer
        with entered(tb.sut.ns):
            plane = XdpDataplane(DataplaneConfig(PORT, interface="eth0"))
            plane.open()
        try:
            plane.set_reflector_session(
                ReflectorSessionConfig(ssid=None, mode=ReflectorMode.STATELESS)
            )
            plane.set_reflector_session(
                ReflectorSessionConfig(
                    ssid=5,
                    mode=ReflectorMode.STATEFUL,
                    fmt=TimestampFormat.PTP,
                    return_segments=(IPv6Address("fc00::2"), IPv6Address("fc00::3")),
                )
            )
            gmac, smac = _mac(tb.gen, "eth0"), _mac(tb.sut, "eth0")
            gen, sut = IPv6Address(tb.gen_addr), IPv6Address(tb.sut_addr)
            STATS.write_text("1\n")
            for case in cases:
                if case != "srv6":  # the SSID-5 session is the SRv6 case's
                    plane.remove_reflector_session(5)
                else:
                    plane.set_reflector_session(
                        ReflectorSessionConfig(
                            ssid=5,
                            mode=ReflectorMode.STATEFUL,
                            fmt=TimestampFormat.PTP,
                            return_segments=(IPv6Address("fc00::2"), IPv6Address("fc00::3")),
                        )
                    )
                frame = _frame(case, gen, sut, gmac, smac)
                before = plane.program_stats()
                c0 = plane.counters()
                t0 = time.monotonic()
                proc = tb.run_pinned(
                    tb.gen,
                    [sys.executable, "-c", GENERATOR, frame.hex(), str(seconds), str(GEN_PORT)],
                    0,
                    stdout=subprocess.PIPE,
                )
                out, _ = proc.communicate(timeout=seconds + 30)
                elapsed = time.monotonic() - t0
                after = plane.program_stats()
                c1 = plane.counters()
                runs = after.run_cnt - before.run_cnt
                reflected = c1.get("reflected", 0) - c0.get("reflected", 0)
                results.append(
                    {
                        "case": case,
                        "frame_bytes": len(frame),
                        "ns_per_packet": round((after.run_time_ns - before.run_time_ns) / runs, 1)
                        if runs
                        else None,
                        "program_runs": runs,
                        "offered_pps": round(int(out.split()[0]) / elapsed),
                        "reflected_pps": round(reflected / elapsed),
                    }
                )
        finally:
            STATS.write_text(f"{previous}\n")
            plane.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--cases", default="plain,srv6,padding,other")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = run(args.seconds, args.cases.split(","))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    head = ("case", "bytes", "ns/pkt", "runs", "offered pps", "reflected pps")
    print(f"{head[0]:8} {head[1]:>5} {head[2]:>7} {head[3]:>9} {head[4]:>12} {head[5]:>14}")
    for r in results:
        print(
            f"{r['case']!s:8} {r['frame_bytes']!s:>5} {r['ns_per_packet']!s:>7} "
            f"{r['program_runs']!s:>9} {r['offered_pps']!s:>12} {r['reflected_pps']!s:>14}"
        )


if __name__ == "__main__":
    main()
