"""Two builds of the XDP STAMP reflector side by side under ``BPF_PROG_TEST_RUN``.

    sudo PYTHONPATH=src .venv/bin/python benchmarks/bench_xdp_ab.py OLD.bpf.o NEW.bpf.o

Loads both ``stamp_reflector`` objects (nothing is attached), gives each the same
config and sessions as ``bench_xdp.py`` (a stateless NTP default session; SSID 5
stateful, PTP, with a 2-SID return list), and runs each case frame through each
program one run at a time (``repeat`` would run the program again on its own reply):
``--runs`` single runs per case and build, the median of the kernel's reported
durations, rounds alternating between the builds, best round kept. Against
``bench_xdp.py`` this has no flood, no second CPU and no veth: a quieter A/B of the
program alone, where the flood's run-to-run noise is as large as the difference.

Cases: ``plain``, ``srv6``, ``padding`` as in ``bench_xdp.py``, and ``damaged``: the
plain frame with one Seq bit flipped and its UDP checksum left as it was.

An older build's object: ``git archive COMMIT src | tar -x -C /tmp/old``, then
``PYTHONPATH=/tmp/old/src python -c 'from sixlab.linux.bpfbuild import
build_objects; print(build_objects()["stamp_reflector"])'`` (objects are cached by
source hash). Not a test: numbers go in benchmarks/README.md with the command.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import time
from ipaddress import IPv6Address
from pathlib import Path

from sixlab.dataplane.xdp_plane import (
    measure_tai_offset_ns,
    pack_config,
    pack_session,
    session_key,
)
from sixlab.linux import libbpf
from sixlab.stamp.reflector import ReflectorMode, ReflectorSessionConfig
from sixlab.wire import stamp as wire
from sixlab.wire.packet import build_udp_packet
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat, ntp_from_ns

PORT = 862
SENDER = IPv6Address("2001:db8:1::1")
REFLECTOR = IPv6Address("2001:db8:2::2")
#: Ethernet header: reflector MAC, sender MAC, IPv6.
ETH = bytes.fromhex("02000000000202000000000186dd")


def _arrived(ssid: int, *, tlvs: bytes = b"", via: tuple[IPv6Address, ...] = ()) -> bytes:
    """A sender packet as it reaches the reflector: an SRH (if any) at Segments Left 0."""
    payload = wire.encode_sender(
        wire.SenderPacket(
            1, ntp_from_ns(time.time_ns()), ErrorEstimate.for_error_ns(1000), ssid, tlvs
        )
    )
    segments = (*via, REFLECTOR) if via else None
    pkt = bytearray(
        build_udp_packet(SENDER, REFLECTOR, 40000, PORT, payload, hop_limit=61, segments=segments)
    )
    if segments:
        pkt[24:40] = REFLECTOR.packed
        pkt[40 + 3] = 0
    return ETH + bytes(pkt)


def cases() -> dict[str, bytes]:
    plain = _arrived(7)
    damaged = bytearray(plain)
    damaged[len(plain) - 44 + 3] ^= 0x04  # Seq, low byte
    return {
        "plain": plain,
        "srv6": _arrived(5, via=(IPv6Address("fc00::1"),)),
        "padding": _arrived(7, tlvs=struct.pack("!BBH", 0x80, 1, 64) + bytes(64)),
        "damaged": bytes(damaged),
    }


def _load(path: Path) -> tuple[libbpf.BpfObject, libbpf.BpfProgram]:
    obj = libbpf.BpfObject(path)
    obj.load()
    obj.map("stamp_cfg").update(bytes(4), pack_config(PORT, 64, measure_tai_offset_ns()))
    sessions = obj.map("stamp_sessions")
    sessions.update(session_key(None), pack_session(ReflectorSessionConfig(ssid=None)))
    srv6 = ReflectorSessionConfig(
        ssid=5,
        mode=ReflectorMode.STATEFUL,
        fmt=TimestampFormat.PTP,
        return_segments=(IPv6Address("fc00::2"), IPv6Address("fc00::3")),
    )
    sessions.update(session_key(5), pack_session(srv6))
    return obj, obj.program("stamp_reflector")


def run(old: Path, new: Path, runs: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    """case -> build ("old"/"new") -> the median duration (ns) of each round."""
    frames = cases()
    loaded = {"old": _load(old), "new": _load(new)}
    out: dict[str, dict[str, list[float]]] = {c: {"old": [], "new": []} for c in frames}
    try:
        for _ in range(rounds):
            for build, (_obj, prog) in loaded.items():
                for case, data in frames.items():
                    d = [prog.test_run(data).duration_ns for _ in range(runs)]
                    out[case][build].append(statistics.median(d))
    finally:
        for obj, _prog in loaded.values():
            obj.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{'case':8} {'old ns':>7} {'new ns':>7} {'delta':>7}  rounds (old | new)")
    for case, by in run(args.old, args.new, args.runs, args.rounds).items():
        o, n = min(by["old"]), min(by["new"])
        print(f"{case:8} {o:7.1f} {n:7.1f} {n - o:+7.1f}  {by['old']} | {by['new']}")


if __name__ == "__main__":
    main()
