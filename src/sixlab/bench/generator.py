"""RFC 2544 trials on the two-node bench: a C frame generator and a kernel reply counter.

Theory of operation
-------------------
One trial offers frames at a rate R for T seconds from the generator namespace, pinned
to CPU 0, to a system in the SUT namespace, and counts the answers that come back.
Loss ratio = 1 - received / offered. :class:`FrameTrialRunner` is that trial for any
UDP frame and any answer an nftables rule can recognise; :class:`StampTrialRunner`
offers STAMP Session-Sender frames to a reflector (``sixlab.bench.ilnp_echo`` has the
ILNP UDP echo one).

Why a C generator. Python sending one datagram per system call tops out near
100-200 kpps on these machines, below the rate the fast planes must be driven to.
``stampgen.c`` (next to this file, built at first use with the system ``gcc`` and
cached by source hash, :func:`build_program`) sends pre-built Ethernet frames with
``sendmmsg(2)`` on an ``AF_PACKET`` socket with ``PACKET_QDISC_BYPASS``: up to
``batch`` frames per system call, no qdisc, no per-frame allocation in user space, only
a sequence number (the first 4 bytes of the UDP payload: STAMP's Sequence Number) and
the UDP checksum patched (RFC 1624). ``PACKET_TX_RING`` would save the copy into the
kernel too, but on a veth each frame is still one ``dev_queue_xmit``; the ceiling
measured with ``sendmmsg`` (``generator_ceiling``) is well above what any reflector here
sustains, which is what matters for a PDR search.

Pacing: the pacer spins on the vDSO clock and, every ``tick_us`` (100 µs by default),
sends what is due (``floor(R * elapsed) - offered``) back to back, so the offered rate
is exact over any window longer than a tick. Why ticks and not one frame at a time: on
a veth with RPS (below) every frame that finds the SUT's CPU idle costs an
inter-processor interrupt, and in this VM an IPI is a VM exit of several µs on both
CPUs; sent one by one, the same 150 kpps offered got 65 kpps reflected by ``mmap``
with CPU 1 mostly in softirq, and 126 kpps with 100 µs ticks. A NIC does the same
grouping with interrupt coalescing (``rx-usecs`` of 50-100 µs is common), as on the
two-server bench of "High Performance Delay Monitoring for SRv6 Based SD-WANs".
``tick_us=0`` sends each frame as soon as it is due.

Counting replies: an nftables ``netdev`` ``ingress`` chain on the generator's interface
counts and drops the answers (for STAMP: UDP to the generator's port) before the IPv6
stack (no ICMP, no socket queue): the cheapest and exact count. Each trial carries its
own 16-bit *tag* in every frame, which the answer echoes (STAMP: the SSID, that the
reflector's default session echoes, RFC 8972 §3), and only answers with that tag
count: late answers of an earlier trial are counted as ``stale`` and never taken for
this trial's. After the generator stops, the counters are read once they
have stood still for ``_SETTLE_S`` (replies still queued in the SUT's ring count, as
RFC 2544 §23 asks: loss is what never comes back).

Receive steering: on a veth, the receive work of a frame runs on the CPU that sent it
(``netif_rx`` on the sender's CPU). So that the SUT's CPU pays for the SUT's receive
path and the generator's CPU for its own, as on two machines, ``prepare_bench`` sets
RPS: the SUT's ``rx-0`` to the SUT's CPU, the generator's to the generator's CPU. Frames
that the SUT's input backlog (``netdev_max_backlog``) cannot take are dropped by the
kernel at the veth; the generator sees that as ``ENOBUFS`` and counts them as offered
and lost (``input_drops``), the SUT's NIC-queue overflow of a real bench.

RPS has a price on the sending side: a frame steered to another CPU whose backlog is
idle costs the sender an inter-processor interrupt, and in a VM that is a trap to the
hypervisor (x2APIC MSR write). Where the SUT answers frame by frame (a UDP application
that sends each answer with its own ``local_bh_enable``), the generator's RPS makes the
SUT pay one IPI per answer: profiled on the ILNP echo bench, 36 % of the SUT's CPU was
``net_rps_send_ipi``. ``prepare_bench(gen_rps=False)`` leaves the generator's interface
without RPS instead: the answers are then received and counted (nftables, a few hundred
ns) on the SUT's CPU, which is charged more than on two machines, not less.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from ipaddress import IPv6Address
from pathlib import Path

from sixlab.linux.bpfbuild import BuildError
from sixlab.linux.ccbuild import build_c, cache_dir
from sixlab.testbed import BenchTestbed, Node
from sixlab.wire.packet import build_udp_packet

__all__ = [
    "GEN_PORT",
    "FrameTrialRunner",
    "GeneratorError",
    "Mix",
    "StampTrialRunner",
    "TrialResult",
    "build_generator",
    "build_program",
    "generator_ceiling",
    "interface_mac",
    "prepare_bench",
    "run_generator",
    "stamp_frame",
]

#: The generator's UDP source port; replies come back to it (RFC 8762 §4.3).
GEN_PORT = 40862
#: STAMP's port on the reflector (RFC 8762 §4.1: 862 unless configured).
STAMP_PORT = 862
#: Frames per sendmmsg(2): enough to amortise the system call, small enough that one
#: batch (32 x ~100 B) is far below the SUT's input backlog (1000 by default).
DEFAULT_BATCH = 32
#: Send at most every this many µs, all that is due back to back (module doc, "Pacing").
DEFAULT_TICK_US = 100.0
#: Counters are final once they have not moved for this long after the generator stops.
_SETTLE_S = 0.2
#: ... but no trial waits longer than this for late replies. A reflector overloaded by
#: the search's first trial (at the generator's ceiling) may work through a full ring or
#: socket buffer for seconds; the next trial must not start before it is idle again.
_SETTLE_MAX_S = 15.0
_SOURCE = Path(__file__).with_name("stampgen.c")
_TABLE = "sixlab_bench"
_ETHERTYPE_IPV6 = b"\x86\xdd"
_IPPROTO_UDP = 17


class GeneratorError(RuntimeError):
    """The generator could not be built or a trial could not run."""


@dataclass(frozen=True, slots=True)
class TrialResult:
    """One trial: what was offered at ``rate`` for ``seconds`` and what came back."""

    rate: float
    seconds: float
    offered: int
    received: int
    input_drops: int = 0
    stale: int = 0
    elapsed_s: float = 0.0

    @property
    def loss_ratio(self) -> float:
        """1 - received/offered; 0 when nothing was offered."""
        if self.offered <= 0:
            return 0.0
        return max(0.0, 1.0 - self.received / self.offered)

    @property
    def offered_rate(self) -> float:
        return self.offered / self.elapsed_s if self.elapsed_s > 0 else 0.0


def build_program(source_path: Path, cache: Path | None = None) -> Path:
    """Compile one C file of this package with gcc -O2 once per source version
    (``sixlab.linux.ccbuild``: cached as ``<stem>-<hash of the source>``); the binary's path."""
    try:
        return build_c(source_path, cache or cache_dir("bench"))
    except BuildError as exc:
        raise GeneratorError(f"bench: {exc}") from exc


def build_generator(cache: Path | None = None) -> Path:
    """Compile ``stampgen.c`` (:func:`build_program`); the binary's path."""
    return build_program(_SOURCE, cache)


def stamp_frame(
    src_mac: bytes, dst_mac: bytes, src: str, dst: str, *, ssid: int, sport: int = GEN_PORT
) -> bytes:
    """An Ethernet frame with an unauthenticated STAMP Session-Sender packet.

    RFC 8762 §4.2.1 layout, 44 bytes: Seq 0, Timestamp 0, Error Estimate with
    Multiplier 1 (0 would make the packet invalid, RFC 4656 §4.1.2), SSID (RFC 8972 §3),
    then zero MBZ. The generator patches Seq per frame.
    """
    payload = bytes(12) + b"\x00\x01" + ssid.to_bytes(2, "big") + bytes(28)
    packet = build_udp_packet(IPv6Address(src), IPv6Address(dst), sport, STAMP_PORT, payload)
    return dst_mac + src_mac + _ETHERTYPE_IPV6 + packet


def interface_mac(tb: BenchTestbed, node: Node, ifname: str) -> bytes:
    """The MAC address of ``ifname`` in ``node``."""
    out = tb.testbed.exec_in(node, ["ip", "-j", "link", "show", ifname]).stdout
    return bytes.fromhex(json.loads(out)[0]["address"].replace(":", ""))


def prepare_bench(
    tb: BenchTestbed, *, gen_cpu: int = 0, sut_cpu: int = 1, gen_rps: bool = True
) -> None:
    """RPS (module doc) and the generator's reply counter table.

    ``gen_rps=False`` leaves the generator's interface without RPS: the answers are then
    counted on the CPU that sent them, the SUT's (module doc, "Receive steering").
    """
    ends = [(tb.gen, tb.gen_if, gen_cpu if gen_rps else None), (tb.sut, tb.sut_if, sut_cpu)]
    for node, ifname, cpu in ends:
        mask = "0" if cpu is None else f"{1 << cpu:x}"
        path = f"/sys/class/net/{ifname}/queues/rx-0/rps_cpus"
        tb.testbed.exec_in(node, ["sh", "-c", f"echo {mask} > {path}"])
    script = (
        f"table netdev {_TABLE} {{\n"
        "  counter replies {}\n"
        "  counter stale {}\n"
        f"  chain ingress {{ type filter hook ingress device {tb.gen_if} priority -500; }}\n"
        "}\n"
    )
    _nft(tb, script)


@dataclass(frozen=True, slots=True)
class Mix:
    """A second frame mixed into a generator run: ``share`` (0..1) of the frames.

    ``fields`` are the counter fields of the mixed frame, (UDP payload offset, base):
    each gets base + the frame's index among the mixed ones (``stampgen.c``); empty,
    the first 4 payload bytes count from 0, as in the main frame.
    """

    frame: bytes
    share: float
    fields: tuple[tuple[int, int], ...] = ()

    def argv(self) -> list[str]:
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"mix share {self.share} is not in 0..1")
        return [
            self.frame.hex(),
            f"{self.share:.9f}",
            *(f"{off}:{base % (1 << 32)}" for off, base in self.fields),
        ]


def run_generator(
    tb: BenchTestbed,
    binary: Path,
    frame: bytes,
    rate: float,
    seconds: float,
    *,
    cpu: int = 0,
    batch: int = DEFAULT_BATCH,
    tick_us: float = DEFAULT_TICK_US,
    mix: Mix | None = None,
) -> dict[str, float]:
    """Run ``stampgen`` once in the generator namespace, pinned to ``cpu``; its summary
    (``offered``, ``input_drops``, ``elapsed_s``..., with ``mix``: ``mix_offered``)."""
    argv = [str(binary), tb.gen_if, frame.hex(), f"{rate:.3f}", f"{seconds:.3f}", str(batch),
            f"{tick_us:.3f}", *(mix.argv() if mix is not None else [])]  # fmt: skip
    proc = tb.run_pinned(tb.gen, argv, cpu, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=seconds + 30)
    if proc.returncode != 0:
        raise GeneratorError(f"bench: generator failed ({proc.returncode}): {err.decode()}")
    stats: dict[str, float] = json.loads(out.decode().splitlines()[-1])
    return stats


def _nft(tb: BenchTestbed, script: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".nft", delete=False) as f:
        f.write(script)
    try:
        return tb.testbed.exec_in(tb.gen, ["nft", "-f", f.name]).stdout
    finally:
        Path(f.name).unlink()


class FrameTrialRunner(ABC):
    """Runs trials of one kind of frame on a prepared bench (``prepare_bench``).

    A subclass says what to send and what counts as an answer: :meth:`frame` builds
    the Ethernet frame of a trial with its tag, :meth:`reply_matches` gives the nftables
    matches of an answer (with the tag: this trial's; without: any). Everything else
    (the generator, pacing, the counter, settling) is shared.
    """

    def __init__(
        self,
        tb: BenchTestbed,
        *,
        binary: Path | None = None,
        gen_cpu: int = 0,
        batch: int = DEFAULT_BATCH,
        tick_us: float = DEFAULT_TICK_US,
    ) -> None:
        self.tb = tb
        self.binary = binary or build_generator()
        self.gen_cpu = gen_cpu
        self.batch = batch
        self.tick_us = tick_us
        self._src_mac = interface_mac(tb, tb.gen, tb.gen_if)
        self._dst_mac = interface_mac(tb, tb.sut, tb.sut_if)
        self._tag = 0
        self.trials: list[TrialResult] = []

    @abstractmethod
    def frame(self, tag: int) -> bytes:
        """The Ethernet frame offered in the trial tagged ``tag`` (1..65535)."""

    @abstractmethod
    def reply_matches(self, tag: int | None) -> list[str]:
        """nftables matches (after ``meta protocol ip6``) of an answer to this runner's
        frames: with ``tag``, only that trial's; with None, any. One rule per item."""

    def _arm(self, tag: int) -> None:
        rules = [f"add rule netdev {_TABLE} ingress meta protocol ip6 {m} counter name "
                 "replies drop\n" for m in self.reply_matches(tag)]  # fmt: skip
        rules += [f"add rule netdev {_TABLE} ingress meta protocol ip6 {m} counter name "
                  "stale drop\n" for m in self.reply_matches(None)]  # fmt: skip
        _nft(
            self.tb,
            f"flush chain netdev {_TABLE} ingress\nreset counters table netdev {_TABLE}\n"
            + "".join(rules),
        )

    def counters(self) -> tuple[int, int]:
        """(replies of the current trial, stale replies) counted so far."""
        out = self.tb.testbed.exec_in(
            self.tb.gen, ["nft", "-j", "list", "counters", "table", "netdev", _TABLE]
        ).stdout
        values = {
            item["counter"]["name"]: int(item["counter"]["packets"])
            for item in json.loads(out)["nftables"]
            if "counter" in item
        }
        return values.get("replies", 0), values.get("stale", 0)

    def settle(self) -> tuple[int, int]:
        """Wait until the counters stand still (module doc); their final values."""
        deadline = time.monotonic() + _SETTLE_MAX_S
        last = self.counters()
        while time.monotonic() < deadline:
            time.sleep(_SETTLE_S)
            now = self.counters()
            if now == last:
                break
            last = now
        return last

    def trial(
        self,
        rate: float,
        seconds: float,
        *,
        background: contextlib.AbstractContextManager[object] | None = None,
    ) -> TrialResult:
        """Offer ``rate`` frames/s for ``seconds``; count what the SUT sent back.

        ``background``, if given, is entered once the counters are armed and left when
        the generator has finished, before the counters settle: other traffic offered
        during the trial (answers to it count as ``stale`` unless they carry the tag).
        """
        self.settle()  # let the previous trial's backlog drain before this one starts
        self._tag = self._tag % 0xFFFF + 1
        self._arm(self._tag)
        frame = self.frame(self._tag)
        with background or contextlib.nullcontext():
            stats = run_generator(
                self.tb, self.binary, frame, rate, seconds,
                cpu=self.gen_cpu, batch=self.batch, tick_us=self.tick_us,
            )  # fmt: skip
        received, stale = self.settle()
        result = TrialResult(
            rate=rate,
            seconds=seconds,
            offered=int(stats["offered"]),
            received=received,
            input_drops=int(stats["input_drops"]),
            stale=stale,
            elapsed_s=float(stats["elapsed_s"]),
        )
        self.trials.append(result)
        return result


class StampTrialRunner(FrameTrialRunner):
    """Trials of STAMP Session-Sender frames against whatever reflects; the tag is the SSID."""

    def frame(self, tag: int) -> bytes:
        return stamp_frame(
            self._src_mac, self._dst_mac, self.tb.gen_addr, self.tb.sut_addr, ssid=tag
        )

    def reply_matches(self, tag: int | None) -> list[str]:
        # Raw offsets from the IPv6 header (replies are plain IPv6/UDP, RFC 8200 §3):
        # Next Header at byte 6, UDP destination port at 40 + 2, SSID at 40 + 8 + 14
        # (RFC 8972 §3). Not ``udp dport``: nftables' netdev ingress leaves the transport
        # header unset for some frames that come from a TX ring, and such a rule then
        # misses them (seen here: ``meta l4proto udp`` matched 37 of 99 replies).
        match = f"@nh,48,8 {_IPPROTO_UDP} @nh,336,16 {GEN_PORT}"
        return [match if tag is None else f"{match} @nh,496,16 {tag}"]


def generator_ceiling(runner: FrameTrialRunner, seconds: float = 2.0) -> float:
    """Frames/s the generator offers when asked for far more than it can send.

    Run with nothing answering (the SUT's kernel drops the frames): the figure is the
    generator's own limit on this machine, to compare with the PDRs it measures.
    """
    result = runner.trial(1e9, seconds)
    return result.offered_rate
