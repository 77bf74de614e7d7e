"""A long TCP transfer over ILNP through link failures: how long the data stops.

    sudo .venv/bin/python benchmarks/bench_ilnp_failover.py [--fastpath on] [--repeat 3]
        [--settle 4] [--json FILE]

Topology (``sixlab.testbed``)::

    A eth0 ── ra  R  rb ── eth0 B     A: NID 0:0:0:a, locators 2001:db8:a:0 (eth0, pref
    A eth1 ── ra2 R                      10) and 2001:db8:d:0 (eth1, pref 20)
                                      B: NID 0:0:0:b, locator 2001:db8:b:0

``sixlab ilnp host`` on A and B (policy ``socket``, ``--fastpath`` as given); a TCP
connection between the identifier addresses (an unmodified socket pair, this process)
carries a stream of random bytes from A to B for the whole run, the writer always
ahead of the network. The receiver timestamps every ``recv``. Each round makes six
events, ``--settle`` seconds apart:

* ``admin down``: ``ip link set eth0 down`` on A (the host's own interface);
* ``admin up``: eth0 up again, its address and default route put back (what SLAAC
  would do), A moves back to its preferred locator;
* ``carrier loss``: ``ip link set ra down`` on R: A's eth0 stays up, without carrier;
* ``carrier back``: ``ra`` up again, with the router's addresses on it (its down
  flushed them);
* ``move``: A's eth0 is renumbered into 2001:db8:c::/64, make before break: the new
  address is added, A is moved to the new locator (``set-locators``, what ``sixlab
  ilnp move`` sends), then the old address is deleted;
* ``move back``: the same back to 2001:db8:a::/64.

For each event the *stall* is the longest gap between two receives in the window from
the event to the next one, next to the longest gap in the second before the event
(the stream's own jitter). At the end the bytes received must equal the bytes sent
and their SHA-256 match. Nothing here is asserted; the figures go in
``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sixlab.ilnp.daemon import control_request
from sixlab.testbed import Node, Testbed

ID_A, ID_B = "fd00:2ff::a", "fd00:2ff::b"
PORT = 5001
CHUNK = 16384
HOSTS = "2001:db8:a:0/0:0:0:a,10  2001:db8:d:0/0:0:0:a,20  alice\n2001:db8:b:0/0:0:0:b  bob\n"


@dataclass
class Stream:
    """A TCP stream from ``client`` to ``server`` that records when data arrives."""

    client: socket.socket
    server: socket.socket
    arrivals: list[tuple[float, int]] = field(default_factory=list)
    sent: int = 0
    received: int = 0
    errors: list[BaseException] = field(default_factory=list)
    sent_hash: Any = field(default_factory=hashlib.sha256)
    recv_hash: Any = field(default_factory=hashlib.sha256)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self._writer = threading.Thread(target=self._write, daemon=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._writer.start()
        self._reader.start()

    def _write(self) -> None:
        rng = random.Random(1)
        try:
            while not self._stop.is_set():
                chunk = rng.randbytes(CHUNK)
                self.client.sendall(chunk)
                self.sent_hash.update(chunk)
                self.sent += len(chunk)
            self.client.shutdown(socket.SHUT_WR)
        except OSError as exc:
            self.errors.append(exc)

    def _read(self) -> None:
        clock = time.monotonic
        try:
            while chunk := self.server.recv(1 << 16):
                self.arrivals.append((clock(), len(chunk)))
                self.recv_hash.update(chunk)
                self.received += len(chunk)
        except OSError as exc:
            self.errors.append(exc)

    def finish(self) -> None:
        self._stop.set()
        self._writer.join(timeout=60)
        self._reader.join(timeout=60)

    def longest_gap(self, start: float, end: float) -> float:
        """Longest time without a receive inside [start, end] (edges included)."""
        times = [start, *(t for t, _ in self.arrivals if start < t < end), end]
        return max(b - a for a, b in itertools.pairwise(times))

    def rate(self, start: float, end: float) -> float:
        """Bytes per second received in [start, end]."""
        got = sum(n for t, n in self.arrivals if start <= t < end)
        return got / (end - start)


class Net:
    def __init__(self, tb: Testbed, tmp: Path, fastpath: str) -> None:
        self.tb, self.tmp, self.fastpath = tb, tmp, fastpath
        self.r = tb.add_node("r", router=True)
        self.a = tb.add_node("a")
        self.b = tb.add_node("b")
        tb.add_link(self.a, self.r, if_a="eth0", if_b="ra", addr_a="2001:db8:a::a")
        tb.add_link(self.a, self.r, if_a="eth1", if_b="ra2", addr_a="2001:db8:d::a")
        tb.add_link(self.b, self.r, if_a="eth0", if_b="rb", addr_a="2001:db8:b::b")
        for ifname, prefix, ll in (
            ("ra", "2001:db8:a::1", "fe80::1"),
            ("ra2", "2001:db8:d::1", "fe80::2"),
            ("rb", "2001:db8:b::1", "fe80::1"),
        ):
            self.r.add_address(ifname, prefix)
            self.r.add_address(ifname, ll)
        self.r.add_address("ra", "2001:db8:c::1")  # where A moves to
        self.ip(self.a, "route", "add", "default", "via", "fe80::1", "dev", "eth0", "metric", "100")
        self.ip(self.a, "route", "add", "default", "via", "fe80::2", "dev", "eth1", "metric", "200")
        self.ip(self.b, "route", "add", "default", "via", "fe80::1", "dev", "eth0")
        (tmp / "hosts").write_text(HOSTS)
        self.controls: dict[str, str] = {}

    def ip(self, node: Node, *argv: str) -> None:
        self.tb.exec_in(node, ["ip", "-6", *argv])

    def start(self, node: Node, nid: str, locators: list[str], links: list[str]) -> None:
        control = str(self.tmp / f"{node.name}.sock")
        argv = [sys.executable, "-m", "sixlab.cli.ilnp", "host", "--nid", nid]
        for loc in locators:
            argv += ["--locator", loc]
        for link in links:
            argv += ["--interface", link]
        argv += ["--control", control, "--hosts", str(self.tmp / "hosts")]
        argv += ["--fastpath", self.fastpath]
        proc = self.tb.run_in(node, argv, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith(b"ready"):
            raise SystemExit(f"daemon on {node.name} did not start: {line!r}")
        self.controls[node.name] = control

    def status(self, name: str) -> dict[str, Any]:
        return control_request(self.controls[name], {"cmd": "status"})

    def stream(self) -> Stream:
        listener = self.b.socket(socket.AF_INET6, socket.SOCK_STREAM)
        listener.bind((ID_B, PORT))
        listener.listen(1)
        client = self.a.socket(socket.AF_INET6, socket.SOCK_STREAM)
        client.bind((ID_A, 0))
        client.settimeout(30)
        client.connect((ID_B, PORT))
        server, _ = listener.accept()
        listener.close()
        server.settimeout(60)
        return Stream(client, server)


EVENTS = ("admin down", "admin up", "carrier loss", "carrier back", "move", "move back")
#: The move's locators: (old address, new address, the locator set after the move).
_MOVES = {
    "move": ("2001:db8:a::a", "2001:db8:c::a", ["2001:db8:c:0,10", "2001:db8:d:0,20"]),
    "move back": ("2001:db8:c::a", "2001:db8:a::a", ["2001:db8:a:0,10", "2001:db8:d:0,20"]),
}


def _event(net: Net, name: str) -> None:
    if name in _MOVES:
        old, new, locators = _MOVES[name]
        net.a.add_address("eth0", new)
        reply = control_request(net.controls["a"], {"cmd": "set-locators", "locators": locators})
        if not reply.get("ok"):
            raise SystemExit(f"move refused: {reply}")
        net.ip(net.a, "addr", "del", f"{old}/64", "dev", "eth0")
    elif name == "admin down":
        net.ip(net.a, "link", "set", "eth0", "down")
    elif name == "admin up":
        net.ip(net.a, "link", "set", "eth0", "up")
        net.a.add_address("eth0", "2001:db8:a::a")
        net.ip(net.a, "route", "add", "default", "via", "fe80::1", "dev", "eth0", "metric", "100")
    elif name == "carrier loss":
        net.ip(net.r, "link", "set", "ra", "down")
    else:  # down flushed the router's addresses on ra: its configuration comes back
        net.ip(net.r, "link", "set", "ra", "up")
        for address in ("2001:db8:a::1", "fe80::1", "2001:db8:c::1"):
            net.r.add_address("ra", address)


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="sixlab-bench-failover-"))
    with Testbed(prefix="sixlab-bench-") as tb:
        net = Net(tb, tmp, args.fastpath)
        net.start(net.a, "0:0:0:a", ["2001:db8:a:0,10", "2001:db8:d:0,20"], ["eth0", "eth1"])
        net.start(net.b, "0:0:0:b", ["2001:db8:b:0"], ["eth0"])
        stream = net.stream()
        stream.start()
        time.sleep(args.settle)
        marks: list[tuple[str, float]] = []
        for _ in range(args.repeat):
            for name in EVENTS:
                marks.append((name, time.monotonic()))
                _event(net, name)
                time.sleep(args.settle)
        end = time.monotonic()
        status = {name: net.status(name) for name in ("a", "b")}
        stream.finish()
        stream.client.close()
        stream.server.close()
    events = []
    for i, (name, at) in enumerate(marks):
        until = marks[i + 1][1] if i + 1 < len(marks) else end
        events.append(
            {
                "event": name,
                "stall_s": round(stream.longest_gap(at, until), 3),
                "gap_before_s": round(stream.longest_gap(at - 1.0, at), 3),
                "mb_per_s_before": round(stream.rate(at - 1.0, at) / 1e6, 2),
                "mb_per_s_after": round(stream.rate(until - 1.0, until) / 1e6, 2),
            }
        )
    return {
        "fastpath": args.fastpath,
        "settle_s": args.settle,
        "events": events,
        "bytes_sent": stream.sent,
        "bytes_received": stream.received,
        "intact": stream.received == stream.sent
        and stream.recv_hash.digest() == stream.sent_hash.digest(),
        "errors": [repr(e) for e in stream.errors],
        "a": {k: status["a"].get(k) for k in ("counters", "drops", "withdrawn", "links")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fastpath", choices=["auto", "on", "off"], default="on")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the six events")
    parser.add_argument("--settle", type=float, default=4.0, help="seconds between events")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args()
    result = run(args)
    print(f"TCP A->B over ILNP through failures, --fastpath {args.fastpath}")
    print(f"{'event':<14}{'stall s':>9}{'gap before s':>14}{'MB/s before':>13}{'MB/s after':>12}")
    for e in result["events"]:
        print(
            f"{e['event']:<14}{e['stall_s']:>9.3f}{e['gap_before_s']:>14.3f}"
            f"{e['mb_per_s_before']:>13.2f}{e['mb_per_s_after']:>12.2f}"
        )
    for name in EVENTS:
        stalls = [e["stall_s"] for e in result["events"] if e["event"] == name]
        print(f"{name}: median stall {statistics.median(stalls):.3f} s over {len(stalls)}")
    print(
        f"bytes sent {result['bytes_sent']:,}, received {result['bytes_received']:,}, "
        f"intact {result['intact']}, errors {result['errors'] or 'none'}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
