"""TCP throughput over ILNP, configurations side by side in one run.

    sudo .venv/bin/python benchmarks/bench_ilnp_tcp.py [--seconds 5] [--repeat 3]
        [--before TREE] [--gro] [--json FILE]

Topology (``sixlab.testbed``)::

    A eth0 ── ra  R  rb ── eth0 B     A: NID 0:0:0:a, locator 2001:db8:a:0
                                      B: NID 0:0:0:b, locator 2001:db8:b:0

``sixlab ilnp host`` on A and B (policy ``socket``: B's server socket is connected, so
B adopts A); one TCP connection between the identifier addresses (an unmodified
socket pair, this process) carries bytes from A to B as fast as the sender can write
them, for ``--seconds`` after a one-second warm-up. Each configuration runs on a fresh
testbed, the configurations take turns round by round, and the figures are the
received bytes per second, the CPU the two daemons used (per MB moved) and the fast
path's TCP counters.

Configurations:

* ``daemon``: ``--fastpath off``: every packet through both daemons;
* ``fastpath``: ``--fastpath on``: TCP in the kernel both ways (checksums left to the
  device: the veth passes them on unfinished);
* ``fastpath-link-csum``: the same with transmit checksum offload off on A's and B's
  links, so the kernel finishes each checksum in software, as a NIC would in hardware;
* ``plain``: no ILNP at all, plain IPv6 between the hosts' interface addresses (the
  namespaces' ceiling on this machine);
* ``before``: ``--fastpath on`` from another source tree (``--before TREE``, e.g. an
  export of main's ``src``), where the egress program left TCP to the daemon;
* ``before-daemon``: ``--fastpath off`` from that tree;
* ``b-daemon`` (and ``before-b-daemon``, from the ``--before`` tree): the fast path on
  A only: A's kernel sends, B's daemon receives everything from its ring;
* ``fastpath-gro-off``, ``b-daemon-gro-off``: those without the ``--gro`` settings,
  next to them in the same run.

``--gro``: every configuration with GRO on B's link, as a NIC has it by default: B's
``eth0`` gets ``gro on`` and threaded NAPI (frames wait for the poll thread, so GRO
has several to coalesce, as after a NIC's interrupt coalescing), and the router's
``rb`` TSO off (a veth feeds its peer's GRO only from a device that cannot segment).

Nothing is asserted; the figures go in ``benchmarks/README.md`` with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sixlab.ilnp.daemon import control_request
from sixlab.testbed import Node, Testbed

ID_A, ID_B = "fd00:2ff::a", "fd00:2ff::b"
PORT = 5001
CHUNK = 1 << 18
HOSTS = "2001:db8:a:0/0:0:0:a  alice\n2001:db8:b:0/0:0:0:b  bob\n"


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _daemon(
    tb: Testbed, node: Node, nid: str, locator: str, tmp: Path, *, fastpath: str, tree: str | None
) -> tuple[subprocess.Popen[bytes], str]:
    control = str(tmp / f"{node.name}.sock")
    argv = [sys.executable, "-m", "sixlab.cli.ilnp", "host", "--nid", nid, "--locator", locator]
    argv += ["--interface", "eth0", "--control", control, "--hosts", str(tmp / "hosts")]
    argv += ["--fastpath", fastpath]
    env = os.environ | ({"PYTHONPATH": tree} if tree else {})
    proc = tb.run_in(node, argv, stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(b"ready"):
        raise SystemExit(f"daemon on {node.name} did not start: {line!r}")
    return proc, control


def one_run(config: str, seconds: float, tree: str | None, gro: bool = False) -> dict[str, Any]:
    name = config
    tmp = Path(tempfile.mkdtemp(prefix="sixlab-bench-tcp-"))
    (tmp / "hosts").write_text(HOSTS)
    with Testbed(prefix="sixlab-btcp-") as tb:
        r = tb.add_node("r", router=True)
        a, b = tb.add_node("a"), tb.add_node("b")
        tb.add_link(a, r, if_a="eth0", if_b="ra", addr_a="2001:db8:a::a")
        tb.add_link(b, r, if_a="eth0", if_b="rb", addr_a="2001:db8:b::b")
        for ifname, prefix in (("ra", "2001:db8:a::1"), ("rb", "2001:db8:b::1")):
            r.add_address(ifname, prefix)
            r.add_address(ifname, "fe80::1")
        for node in (a, b):
            tb.exec_in(
                node, ["ip", "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0"]
            )
            if config == "fastpath-link-csum":
                node.exec(["ethtool", "-K", "eth0", "tx", "off"])
        gro_here = gro and not config.endswith("-gro-off")
        config = config.removesuffix("-gro-off")
        if gro_here:
            b.exec(["ethtool", "-K", "eth0", "gro", "on"])
            b.exec(["sh", "-c", "echo 1 > /sys/class/net/eth0/threaded"])
            r.exec(["ethtool", "-K", "rb", "tso", "off"])
        fastpath = "off" if config in ("daemon", "before-daemon") else "on"
        b_fastpath = "off" if "b-daemon" in config else fastpath
        tree = tree if config.startswith("before") else None
        daemons = []
        if config != "plain":
            for node, nid, loc, mode in (
                (a, "0:0:0:a", "2001:db8:a:0", fastpath),
                (b, "0:0:0:b", "2001:db8:b:0", b_fastpath),
            ):
                daemons.append(_daemon(tb, node, nid, loc, tmp, fastpath=mode, tree=tree))
        src, dst = ("2001:db8:a::a", "2001:db8:b::b") if config == "plain" else (ID_A, ID_B)
        listener = b.socket(socket.AF_INET6, socket.SOCK_STREAM)
        listener.bind((dst, PORT))
        listener.listen(1)
        client = a.socket(socket.AF_INET6, socket.SOCK_STREAM)
        client.bind((src, 0))
        client.settimeout(30)
        client.connect((dst, PORT))
        server, _ = listener.accept()
        server.settimeout(30)
        received = [0]
        marks: list[tuple[float, int]] = []
        stop = threading.Event()

        def read() -> None:
            buf = bytearray(1 << 20)
            while n := server.recv_into(buf):
                received[0] += n

        def write() -> None:
            data = os.urandom(CHUNK)
            try:
                while not stop.is_set():
                    client.sendall(data)
            except OSError:
                pass
            client.shutdown(socket.SHUT_WR)

        reader = threading.Thread(target=read, daemon=True)
        writer = threading.Thread(target=write, daemon=True)
        reader.start()
        writer.start()
        time.sleep(1.0)
        marks.append((time.monotonic(), received[0]))
        cpu0 = sum(_cpu(proc.pid) for proc, _ in daemons)
        time.sleep(seconds)
        marks.append((time.monotonic(), received[0]))
        cpu1 = sum(_cpu(proc.pid) for proc, _ in daemons)
        stop.set()
        writer.join(timeout=30)
        reader.join(timeout=30)
        for sock in (client, server, listener):
            sock.close()
        status = {
            name: control_request(control, {"cmd": "status"})
            for name, (_proc, control) in zip("ab", daemons, strict=False)
        }
        fast = {name: s["fastpath"]["counters"] for name, s in status.items()}
        b_wire = status.get("b", {}).get("wire", {})
        b_drops = status.get("b", {}).get("drops", {})
    (t0, n0), (t1, n1) = marks
    moved = (n1 - n0) / 1e6
    return {
        "config": name,
        "mb_per_s": round(moved / (t1 - t0), 1),
        "daemon_cpu_s_per_mb": round((cpu1 - cpu0) / moved, 4) if moved else None,
        "a_tx_fast_tcp": fast.get("a", {}).get("tx_fast_tcp", 0),
        "a_tx_gso": fast.get("a", {}).get("tx_gso", 0),
        "b_rx_fast_tcp": fast.get("b", {}).get("rx_fast_tcp", 0),
        "b_rx_fast_gso": fast.get("b", {}).get("rx_fast_gso", 0),
        "b_rx_gso": fast.get("b", {}).get("rx_gso", 0),
        "b_daemon_rx": b_wire.get("rx", 0),
        "b_daemon_rx_aggregate": b_wire.get("rx_aggregate", 0),
        "b_drops": b_drops,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", help="a source tree (its src/) to run as 'before'")
    parser.add_argument("--gro", action="store_true", help="GRO on B's link (module doc)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--configs", help="comma-separated subset of the configurations")
    args = parser.parse_args()
    configs = ["plain", "daemon", "fastpath", "fastpath-link-csum", "b-daemon"]
    if args.gro:
        configs += ["fastpath-gro-off", "b-daemon-gro-off"]
    if args.before:
        configs[1:1] = ["before", "before-daemon", "before-b-daemon"]
    if args.configs:
        configs = [c for c in configs if c in args.configs.split(",")]
    load = [os.getloadavg()]
    runs = []
    for _ in range(args.repeat):
        for config in configs:
            runs.append(one_run(config, args.seconds, args.before, args.gro))
            print(json.dumps(runs[-1]), flush=True)
    load.append(os.getloadavg())
    print(f"load average at start {load[0]}, at end {load[1]}")
    print(f"{'config':<20}{'MB/s (runs)':>34}{'median':>9}{'daemon CPU s/MB':>17}")
    for config in configs:
        mine = [r for r in runs if r["config"] == config]
        rates = [r["mb_per_s"] for r in mine]
        cpu = statistics.median(r["daemon_cpu_s_per_mb"] or 0 for r in mine)
        print(f"{config:<20}{rates!s:>34}{statistics.median(rates):>9.1f}{cpu:>17.4f}")
    if args.json:
        args.json.write_text(json.dumps({"load": load, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
