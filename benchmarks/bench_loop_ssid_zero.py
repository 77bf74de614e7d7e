"""What a reply with SSID 0 that no session claims costs the compiled run loop.

A ``probeio.SendLoop`` holds N sessions to one reflector address and port, each with
one packet outstanding (Seq 4) and no send due; a socket on that address and port
sends it 44-byte replies with SSID 0 and Seq 4 whose T1 no session sent (what anyone
who can spoof the reflector's address can send: docs/stamp-interop.md, "Sessions and
SSIDs"), 64 at a time. Reported: the time ``sl_run`` took per reply, receive included.

    .venv/bin/python benchmarks/bench_loop_ssid_zero.py --sessions 10000 --replies 2000
"""

from __future__ import annotations

import argparse
import json
import socket
import time
from ipaddress import IPv6Address

from sixlab.dataplane.base import DataplaneConfig, create
from sixlab.dataplane.udpsocket import SocketDataplane
from sixlab.stamp.batch import send_template
from sixlab.stamp.sender import DUPLICATE_WINDOW, SenderConfig
from sixlab.wire import stamp as wire
from sixlab.wire.timestamp import ntp_from_ns

LOOP = IPv6Address("::1")
SECOND = 10**9


def run(sessions: int, replies: int) -> dict[str, float]:
    plane = create("socket", DataplaneConfig(port=0))
    assert isinstance(plane, SocketDataplane)
    plane.open()
    pio = plane.probe_io()
    assert pio is not None, "the probe path needs a C compiler"
    loop = pio.send_loop()
    peer = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    peer.bind(("::1", 0))
    waker = socket.socketpair()
    far = time.monotonic_ns() + 1000 * SECOND
    wall = time.time_ns()
    bitmaps = [bytearray(DUPLICATE_WINDOW // 8) for _ in range(sessions)]
    try:
        loop.lock()
        try:
            for i in range(sessions):
                template = send_template(SenderConfig(i + 1, interval_ns=SECOND))
                assert template is not None
                record = pio.record(LOOP, peer.getsockname()[1], template, ptp=False, tai_ns=0)
                assert record is not None
                assert loop.add(
                    i, record, ssid=i + 1, timing=(far, SECOND, far, -1, SECOND, 0), seq=5,
                    highest=-1, window=8, outstanding=[(4, wall - i, far)], answered=bitmaps[i],
                )  # fmt: skip
        finally:
            loop.unlock()
        t1 = ntp_from_ns(wall + SECOND)  # no session sent a packet at this T1
        reply = wire.REFLECTOR_UNAUTH.pack(0, t1, 0x0101, 0, t1, 4, t1, 0x0101, 64)
        handled = spent = 0
        while handled < replies:
            for _ in range(min(64, replies - handled)):
                peer.sendto(reply, ("::1", plane.local_port))
            time.sleep(0.002)
            start = time.perf_counter_ns()
            loop.run(waker[0].fileno(), time.monotonic_ns() + 50_000_000, 0, 8_000_000)
            spent += time.perf_counter_ns() - start
            loop.lock()
            try:
                handled += loop.take().received
                loop.left_done()
            finally:
                loop.unlock()
        return {"sessions": sessions, "replies": handled, "us_per_reply": spent / handled / 1e3}
    finally:
        loop.close()
        peer.close()
        for sock in waker:
            sock.close()
        plane.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--replies", type=int, default=2_000)
    args = parser.parse_args()
    print(json.dumps(run(args.sessions, args.replies)))


if __name__ == "__main__":
    main()
