"""The forwarding bench: data traffic that the SUT encapsulates (SRv6 H.Encaps) to a sink.

Theory of operation
-------------------
On ``two_node_bench(forward=True)`` (gen → ``in0`` SUT ``out0`` → sink) the SUT is an
SRv6 ingress node, as in the STAMP paper's evaluation ("High Performance Delay
Monitoring for SRv6 Based SD-WANs", §VIII): a ``seg6`` ``encap`` route puts every
packet for the sink into an outer IPv6 header with an SRH towards the sink's SID
(H.Encaps, RFC 8986 §5.1). :func:`setup_forwarding` installs it, turns tx checksum
offload off where frames reach an XDP program (``sixlab.dataplane.xdp_plane``: a
partial checksum is not one the programs can verify) and accepts SRH on the SUT
(``seg6_enabled``: STAMP packets arrive with an SRH whose Segments Left is 0, RFC 8754
§4.3.1.1; the kernel discards any SRH on an interface without it).

:class:`SinkCounter` counts what reaches the sink with an nftables ``netdev ingress``
rule, per trial tag (the inner UDP source port, read at its fixed offset in the
encapsulated packet), and drops it there.

Where the receive path runs (:func:`threaded_napi`). On a veth the receive work of a
frame normally runs on the CPU that sent it, and an XDP program on a veth always runs
in the veth's NAPI poll, on the sending CPU unless the poll is threaded. With GRO on (a
veth then has a NAPI instance with or without an XDP program, so attaching one does not
switch the path) and threaded NAPI, the poll runs in a kthread ``napi/IF-ID``, which
is pinned to the SUT's CPU: the SUT's receive path, its forwarding and any XDP program
on ``in0`` are then charged to the SUT's CPU, for every configuration alike
(``benchmarks/README.md``, ``forward-cpu``). UDP is not aggregated by GRO here: the
device does not forward UDP GRO, and no socket asks for it.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from ipaddress import IPv6Address
from pathlib import Path

from sixlab.testbed import BenchTestbed, Node
from sixlab.wire.packet import build_udp_packet

__all__ = [
    "DATA_PAYLOAD",
    "DATA_PORT",
    "SINK_SID",
    "SinkCounter",
    "allowed_cpus",
    "data_frame",
    "kthreads",
    "nft",
    "setup_forwarding",
    "softnet_processed",
    "threaded_napi",
]

#: The sink's SID: the outer destination of encapsulated traffic.
SINK_SID = "fc00:0:20::d6"
#: Data traffic goes to the discard port (RFC 863): anything but STAMP's 862.
DATA_PORT = 9
#: UDP payload of a data frame: the size of a STAMP base packet (RFC 8762 §4.2.1).
DATA_PAYLOAD = 44
_ETHERTYPE_IPV6 = b"\x86\xdd"
#: Offset (bits) of the inner UDP source port in what the sink receives: outer IPv6
#: (40) + SRH with one segment (8 + 16) + inner IPv6 (40). The inner and outer Next
#: Header fields are matched too, so a different encapsulation counts as stale.
_SINK_INNER_SPORT_BITS = (40 + 24 + 40) * 8
_SINK_TABLE = "sixlab_sink"


def nft(tb: BenchTestbed, node: Node, script: str) -> str:
    """Run an nftables script in ``node``."""
    with tempfile.NamedTemporaryFile("w", suffix=".nft", delete=False) as f:
        f.write(script)
    try:
        return tb.testbed.exec_in(node, ["nft", "-f", f.name]).stdout
    finally:
        Path(f.name).unlink()


def setup_forwarding(tb: BenchTestbed) -> None:
    """H.Encaps on the SUT towards the sink, tx checksum offload off, SRH accepted."""
    if tb.sink is None or tb.sink_addr is None or tb.sut_out_if is None:
        raise ValueError("the forwarding bench needs two_node_bench(forward=True)")
    tb.testbed.exec_in(tb.sut, ["ip", "-6", "route", "add", "fc00:0:20::/48", "via", tb.sink_addr])
    tb.testbed.exec_in(
        tb.sut,
        ["ip", "-6", "route", "add", f"{tb.sink_addr}/128", "encap", "seg6", "mode", "encap",
         "segs", SINK_SID, "dev", tb.sut_out_if],
    )  # fmt: skip
    for name in ("all", tb.sut_if):
        tb.testbed.exec_in(tb.sut, ["sysctl", "-qw", f"net.ipv6.conf.{name}.seg6_enabled=1"])
    for node, ifname in ((tb.gen, tb.gen_if), (tb.sut, tb.sut_if), (tb.sut, tb.sut_out_if)):
        tb.testbed.exec_in(node, ["ethtool", "-K", ifname, "tx", "off"])


def data_frame(src_mac: bytes, dst_mac: bytes, src: str, dst: str, *, sport: int) -> bytes:
    """An Ethernet frame of data traffic: UDP from ``sport`` to the discard port."""
    payload = bytes(DATA_PAYLOAD)
    packet = build_udp_packet(IPv6Address(src), IPv6Address(dst), sport, DATA_PORT, payload)
    return dst_mac + src_mac + _ETHERTYPE_IPV6 + packet


class SinkCounter:
    """Counts (and drops) the encapsulated data frames at the sink's ingress, per tag."""

    def __init__(self, tb: BenchTestbed) -> None:
        if tb.sink is None:
            raise ValueError("the sink counter needs two_node_bench(forward=True)")
        self.tb = tb
        self.sink = tb.sink
        nft(
            tb,
            tb.sink,
            f"table netdev {_SINK_TABLE} {{\n  counter frames {{}}\n  counter stale {{}}\n"
            "  chain ingress { type filter hook ingress device eth0 priority -500; }\n}\n",
        )

    def arm(self, sport: int) -> None:
        """Count frames whose inner UDP source port is ``sport``; all else as stale."""
        match = (f"@nh,48,8 43 @nh,{(40 + 24 + 6) * 8},8 17 "
                 f"@nh,{_SINK_INNER_SPORT_BITS},16 {sport}")  # fmt: skip
        nft(
            self.tb,
            self.sink,
            f"flush chain netdev {_SINK_TABLE} ingress\n"
            f"reset counters table netdev {_SINK_TABLE}\n"
            f"add rule netdev {_SINK_TABLE} ingress meta protocol ip6 {match} "
            "counter name frames drop\n"
            f"add rule netdev {_SINK_TABLE} ingress meta protocol ip6 @nh,48,8 43 "
            "counter name stale drop\n",
        )

    def counters(self) -> tuple[int, int]:
        """(frames of the armed tag, stale frames) counted since :meth:`arm`."""
        out = self.tb.testbed.exec_in(
            self.sink, ["nft", "-j", "list", "counters", "table", "netdev", _SINK_TABLE]
        ).stdout
        values = {
            item["counter"]["name"]: int(item["counter"]["packets"])
            for item in json.loads(out)["nftables"]
            if "counter" in item
        }
        return values.get("frames", 0), values.get("stale", 0)


def kthreads(prefix: str) -> dict[int, str]:
    """Tasks (kernel threads among them) whose name starts with ``prefix``: pid -> name."""
    found = {}
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            name = comm.read_text().strip()
        except OSError:  # gone meanwhile
            continue
        if name.startswith(prefix):
            found[int(comm.parent.name)] = name
    return found


def allowed_cpus(pid: int) -> str:
    """``Cpus_allowed_list`` of task ``pid`` ("?" if it has none)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return "?"


def threaded_napi(
    tb: BenchTestbed, node: Node, ifname: str, cpu: int, *, fifo_priority: int = 0
) -> int:
    """GRO and threaded NAPI on veth ``ifname`` of ``node``, its kthread pinned to ``cpu``.

    GRO first: a veth only has a NAPI instance while GRO is on or an XDP program is
    attached, and ``threaded`` is refused on a device without one. The kthread is the
    one that appears when ``threaded`` is set; its pid. ``fifo_priority`` > 0 makes it
    a SCHED_FIFO thread of that priority: it then preempts user space on its CPU as the
    receive softirq of a NIC's interrupt does, instead of waiting for its turn while the
    veth's 256-frame ring overflows (module doc of ``sixlab.bench.stamp_paper``).
    """
    before = kthreads("napi/")
    tb.testbed.exec_in(node, ["ethtool", "-K", ifname, "gro", "on"])
    tb.testbed.exec_in(node, ["sh", "-c", f"echo 1 > /sys/class/net/{ifname}/threaded"])
    new = [pid for pid, name in kthreads(f"napi/{ifname}-").items() if pid not in before]
    if len(new) != 1:
        raise RuntimeError(f"expected one new napi/{ifname}-* kthread, found {new}")
    pid = new[0]
    subprocess.run(["taskset", "-p", "-c", str(cpu), str(pid)], check=True, capture_output=True)
    if allowed_cpus(pid) != str(cpu):
        raise RuntimeError(f"napi kthread {pid} not pinned: {allowed_cpus(pid)}")
    if fifo_priority > 0:
        subprocess.run(["chrt", "-f", "-p", str(fifo_priority), str(pid)], check=True,
                       capture_output=True)  # fmt: skip
    return pid


def softnet_processed() -> list[int]:
    """Frames taken by the receive path so far, per CPU (/proc/net/softnet_stat, col. 1)."""
    lines = Path("/proc/net/softnet_stat").read_text().split("\n")
    return [int(line.split()[0], 16) for line in lines if line.strip()]
