"""The STAMP paper's evaluation (§VIII, Figs 12–16) on the two-node bench, every data plane.

Theory of operation
-------------------
The paper ("High Performance Delay Monitoring for SRv6 Based SD-WANs", §VIII) measures
what STAMP costs a Linux SRv6 router: the SUT forwards data traffic with H.Encaps and,
in the same trial, handles STAMP traffic in one *role*, and the figure of merit is the
RFC 2544 Partial Drop Rate at 0.5 % loss of the **total** traffic. Here, on
``two_node_bench(forward=True)`` (:mod:`sixlab.bench.forward`: gen → ``in0`` SUT
``out0`` → sink):

* **data**: UDP to the sink's discard port, which the SUT encapsulates towards the
  sink's SID; counted (and dropped) at the sink's ingress;
* **reflector** role: the generator mixes in Session-Sender packets (unauthenticated,
  with an SRH whose Segments Left is 0, as at the end of an SRv6 path) to the SUT's
  port 862; the SUT reflects them (``python -m sixlab.bench.reflector``: the engine with
  a stateless default session, so the xdp plane answers in its kernel program); the
  replies are counted at the generator's ingress. A STAMP packet counts as handled when
  its reply came back;
* **collector** role: the generator mixes in Session-Reflector packets (SRH, Segments
  Left 0) answering test packets of a session that the SUT's sender really has
  outstanding (``python -m sixlab.bench.collector``, whose module doc says how the
  session is primed); the SUT collects them: T4, match, record into the session's FIFO.
  A STAMP packet counts as handled only if the engine stored a record for it (the
  session's ``received``, ``SessionCounters.received`` of GetCounters), not when it
  merely arrived;

and the trial's loss ratio is 1 − (data received at the sink + STAMP handled) /
(frames offered). One C generator (``stampgen.c``) offers both kinds, the STAMP share of
the frames spread evenly through the stream (:class:`~sixlab.bench.generator.Mix`), from
the generator's CPU. Every trial has a tag: the UDP source port of both kinds
(``TAG_PORT_BASE`` + tag) and the SSID; counters count only the trial's own frames
(late ones of an earlier trial are ``stale``), and a trial starts only when the counters
of the last one have stood still.

Residual frames. RFC 2544 §23 counts what arrives within two seconds after a trial
of (§24) at least 60 s. Trials here last 1 s while searching and a few seconds to
confirm, and a user-space plane with a deep receive buffer (a socket buffer, a ring)
works off after the trial what it could not during it: counted over seconds, such a
plane would pass at about (trial + wait) / trial times the rate it sustains. So a trial
counts what came back (or was stored) within ``residual_s`` (0.5 s) after the generator
stopped, at most a tenth of a 5 s confirmation trial, and the next trial starts only
once every counter has stood still (the backlog drained, uncounted).

Implementations (:class:`Implementation`): ``baseline`` (no STAMP process at all,
only at 0 % STAMP, the paper's reference), ``scapy``, ``mmap``, ``socket``, ``xdp`` and
``afxdp`` (sixlab's planes, each pinned to the SUT's CPU; ``afxdp``'s XDP program steers
the STAMP frames into its socket, user space answers or collects them in batches), and
any number of ``external`` ones (a command started in the SUT's namespace, pinned
likewise).

Figures. For each role the STAMP fraction is swept (``PAPER_FRACTIONS``); Fig 12 (the
collector) and Fig 13 (the reflector) are its 0 % points next to the baseline, Fig 14
its 100 % points (a: collector, b: reflector), Figs 15 and 16 the whole sweep.
``repeat`` repetitions give a mean and a 95 % confidence interval per point
(:func:`summarize`). :mod:`sixlab.bench.stamp_report` writes the table and the plots.

Where the work runs (``rx_path``). ``napi`` (default): GRO and threaded NAPI on
``in0``, the kthread pinned to the SUT's CPU (:func:`sixlab.bench.forward.threaded_napi`),
so the SUT's receive path, its forwarding and an XDP program on ``in0`` are all charged
to the SUT's CPU, for every implementation alike. The kthread runs SCHED_FIFO
(``napi_priority``, 50 as a threaded interrupt handler): on a NIC the receive softirq
runs on the interrupt's exit, before the application; a kthread that waited for its
turn behind a busy STAMP process would let the veth's ring of 256 frames overflow
within a scheduler slice (at 100 kframes/s, 3 ms is 300 frames), a loss a NIC's larger
ring and interrupt would not have. ``rps``: the receive path of the
older benchmarks (RPS to the SUT's CPU); an XDP program on a veth then runs on the
*generator's* CPU (the veth's NAPI poll runs where the frame was sent), so the xdp and
afxdp planes' figures are partly the generator's, not the SUT's: the run says so. Either way the
generator's veth runs the XDP_PASS program (frames an XDP program sends with XDP_TX on
a veth are lost unless its peer has one too), and what comes back to the generator and
the sink is counted in the softirq of the CPU that sent it, the SUT's: a few hundred ns
per frame, the same for every implementation.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from ipaddress import IPv6Address
from pathlib import Path
from typing import IO, Any, Literal, Protocol

from sixlab.bench.collector import CollectorProcess
from sixlab.bench.forward import (
    SinkCounter,
    allowed_cpus,
    data_frame,
    nft,
    setup_forwarding,
    softnet_processed,
    threaded_napi,
)
from sixlab.bench.generator import (
    DEFAULT_BATCH,
    DEFAULT_TICK_US,
    GeneratorError,
    Mix,
    TrialResult,
    build_generator,
    interface_mac,
    run_generator,
)
from sixlab.bench.pdr import DEFAULT_LOSS_RATIO, search_pdr
from sixlab.bench.reflector import ReflectorProcess
from sixlab.testbed import BenchTestbed, entered
from sixlab.wire.packet import build_udp_packet
from sixlab.wire.stamp import (
    STAMP_PORT,
    ReflectorPacket,
    SenderPacket,
    encode_reflector,
    encode_sender,
)
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat, encode_timestamp

__all__ = [
    "BASELINE",
    "NAPI_FIFO_PRIORITY",
    "PAPER_FRACTIONS",
    "PLANES",
    "PREFLIGHT_RATE",
    "QUICK_FRACTIONS",
    "RESIDUAL_S",
    "ROLES",
    "Implementation",
    "PaperBench",
    "PaperPoint",
    "PaperTrial",
    "Role",
    "SearchSettings",
    "Summary",
    "check",
    "collector_frame",
    "load_points",
    "machine_state",
    "parse_external",
    "reflector_probe_frame",
    "run_paper",
    "sixlab_planes",
    "summarize",
    "write_results",
]

Role = Literal["collector", "reflector"]
ROLES: tuple[Role, ...] = ("collector", "reflector")
#: sixlab's planes in the figures: all of ``sixlab.dataplane.base.PLANES``.
PLANES = ("scapy", "mmap", "socket", "xdp", "afxdp")
BASELINE = "baseline"
#: The paper's STAMP fractions (Figs 15, 16): 0, 0.05, 0.1, 0.5, 1, 5, 10, 20, 50, 100 %.
PAPER_FRACTIONS = (0.0, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0)
QUICK_FRACTIONS = (0.0, 0.01, 1.0)
#: Trial tags are UDP source ports from here (the dynamic range, RFC 6335 §6).
TAG_PORT_BASE = 49152
_TAGS = 16383
_REPLY_TABLE = "sixlab_replies"
_IPPROTO_UDP = 17
_ETHERTYPE_IPV6 = b"\x86\xdd"
_NTP_UNIX_OFFSET_S = 2_208_988_800
#: The SSID of every STAMP frame offered to an external collector (it cannot know the
#: trial's tag): ``{ssid}`` in its command.
EXTERNAL_SSID = 1
#: Counters have settled once they stood still this long. A trial starts only when the
#: last one's have (waiting at most _SETTLE_MAX_S: an overloaded user-space plane may
#: work through a full socket buffer or ring for seconds).
_SETTLE_S = 0.2
_SETTLE_MAX_S = 15.0
#: What comes back (or is stored) this long after the generator stopped counts for the
#: trial (module doc, "Residual frames").
RESIDUAL_S = 0.5
#: SCHED_FIFO priority of the SUT's NAPI kthread (``rx_path="napi"``): that of a
#: threaded interrupt handler (``kernel/irq/manage.c``), module doc.
NAPI_FIFO_PRIORITY = 50
#: Frames/s of the light trial before an implementation's searches, half of them STAMP:
#: less STAMP than the slowest figure of the paper (its Scapy reflector at 100 % STAMP,
#: 470 frames/s), so that a plane as slow passes it on a loaded machine.
PREFLIGHT_RATE = 400.0
#: Test packets primed beyond the trial's share: the generator's count is exact, this
#: covers rounding.
_PRIME_SLACK = 64


@dataclass(frozen=True, slots=True)
class Implementation:
    """One system under test: the baseline, a sixlab plane, or an external command."""

    name: str
    kind: Literal["baseline", "sixlab", "external"]
    plane: str | None = None
    #: external: the command that starts it, with ``{interface}``, ``{address}``,
    #: ``{port}`` and ``{ssid}`` placeholders.
    command: str | None = None
    #: external collector: a command (same placeholders) that prints how many records
    #: the implementation has stored so far; without it, it takes no collector figure.
    records: str | None = None

    def roles(self) -> tuple[Role, ...]:
        if self.kind == "external" and self.records is None:
            return ("reflector",)
        return ROLES


def sixlab_planes(planes: Iterable[str]) -> list[Implementation]:
    """The baseline and one implementation per sixlab plane."""
    return [Implementation(BASELINE, "baseline")] + [
        Implementation(p, "sixlab", plane=p) for p in planes
    ]


def parse_external(text: str, records: dict[str, str] | None = None) -> Implementation:
    """``NAME=COMMAND`` (``--external``) as an implementation; ``records`` maps names to
    their ``--external-records`` commands."""
    name, sep, command = text.partition("=")
    name = name.strip()
    if not sep or not name or not command.strip():
        raise ValueError(f"--external wants NAME=COMMAND, got {text!r}")
    if name in (BASELINE, *PLANES):
        raise ValueError(f"--external: {name!r} is the name of a built-in implementation")
    return Implementation(
        name, "external", command=command.strip(), records=(records or {}).get(name)
    )


# -------------------------------------------------------------------------------- frames


def reflector_probe_frame(
    src_mac: bytes, dst_mac: bytes, src: str, dst: str, *, sport: int, ssid: int
) -> bytes:
    """A Session-Sender packet at the end of an SRv6 path: SRH [dst], Segments Left 0.

    RFC 8762 §4.2.1 base packet, Error Estimate Multiplier 1 (RFC 4656 §4.1.2), the SSID
    of RFC 8972 §3; the generator writes Seq (the first 4 bytes) per frame.
    """
    ee = ErrorEstimate.for_error_ns(1000)
    payload = encode_sender(SenderPacket(0, 0, ee, ssid))
    packet = build_udp_packet(
        IPv6Address(src), IPv6Address(dst), sport, STAMP_PORT, payload,
        segments=[IPv6Address(dst)],
    )  # fmt: skip
    return dst_mac + src_mac + _ETHERTYPE_IPV6 + packet


def collector_frame(
    src_mac: bytes,
    dst_mac: bytes,
    src: str,
    dst: str,
    *,
    dport: int,
    ssid: int,
    t1_ns: int,
) -> tuple[bytes, tuple[tuple[int, int], ...]]:
    """A Session-Reflector packet answering Seq 0 with T1 = ``t1_ns``, and its counter
    fields for the generator: Session-Sender Seq k and T1 + k s (whole NTP seconds).

    RFC 8762 §4.3.1 layout (Session-Sender Seq at 24, its Timestamp at 28); SRH [dst],
    Segments Left 0; from the reflector's port 862 to the collector's ``dport``.
    ``t1_ns`` must be a whole second, so that adding seconds is a 32-bit counter.
    """
    t1 = encode_timestamp(t1_ns, TimestampFormat.NTP)
    if t1 & 0xFFFF_FFFF:
        raise ValueError("t1_ns must be a whole second")
    ee = ErrorEstimate.for_error_ns(1000)
    payload = encode_reflector(ReflectorPacket(0, t1, ee, ssid, t1, 0, t1, ee, 64))
    packet = build_udp_packet(
        IPv6Address(src), IPv6Address(dst), STAMP_PORT, dport, payload,
        segments=[IPv6Address(dst)],
    )  # fmt: skip
    return dst_mac + src_mac + _ETHERTYPE_IPV6 + packet, ((24, 0), (28, t1 >> 32))


# ---------------------------------------------------------------------------- the SUT


class Sut(Protocol):
    """A running implementation: what a trial asks of it (the baseline has none)."""

    name: str

    def prepare(self, ssid: int, count: int, t1_ns: int) -> None:
        """Collector: expect ``count`` replies of session ``ssid`` (Seq k, T1 + k s)."""

    def handled(self, ssid: int) -> tuple[int, int]:
        """Collector: (records stored for ``ssid``, packets the engine took) so far."""

    def finish(self) -> dict[str, object]:
        """Stop; its own counters."""


class _SixlabReflector:
    def __init__(self, tb: BenchTestbed, plane: str, cpu: int) -> None:
        self.name = plane
        self.proc = ReflectorProcess(tb, plane, cpu=cpu)

    def prepare(self, ssid: int, count: int, t1_ns: int) -> None:
        del ssid, count, t1_ns  # the default session answers every SSID

    def handled(self, ssid: int) -> tuple[int, int]:
        raise NotImplementedError("a reflector's answers are counted at the generator")

    def finish(self) -> dict[str, object]:
        return self.proc.finish()


class _SixlabCollector:
    def __init__(self, tb: BenchTestbed, plane: str, cpu: int) -> None:
        self.name = plane
        self.proc = CollectorProcess(tb, plane, peer=tb.gen_addr, cpu=cpu)

    def prepare(self, ssid: int, count: int, t1_ns: int) -> None:
        self.proc.session(ssid, count, t1_ns)

    def handled(self, ssid: int) -> tuple[int, int]:
        r = self.proc.records(ssid)
        engine = r.get("engine")
        took = int(engine["received"]) if isinstance(engine, dict) else 0
        return int(str(r.get("records", 0))), took

    def finish(self) -> dict[str, object]:
        return self.proc.finish()


class _External:
    """An external implementation: its command in the SUT namespace, pinned to the CPU."""

    def __init__(
        self, tb: BenchTestbed, impl: Implementation, cpu: int, log: IO[bytes] | None
    ) -> None:
        assert impl.command is not None
        self.name = impl.name
        self.tb = tb
        self.impl = impl
        self.values = {"interface": tb.sut_if, "address": tb.sut_addr,
                       "port": str(STAMP_PORT), "ssid": str(EXTERNAL_SSID)}  # fmt: skip
        argv = shlex.split(impl.command.format(**self.values))
        sink: int | IO[bytes] = log if log is not None else subprocess.DEVNULL
        self.proc = tb.run_pinned(tb.sut, argv, cpu, stdin=subprocess.DEVNULL,
                                  stdout=sink, stderr=sink)  # fmt: skip

    def prepare(self, ssid: int, count: int, t1_ns: int) -> None:
        del ssid, count, t1_ns

    def handled(self, ssid: int) -> tuple[int, int]:
        del ssid
        if self.impl.records is None:
            raise ValueError(f"{self.name}: no --external-records command")
        argv = shlex.split(self.impl.records.format(**self.values))
        done = self.tb.testbed.exec_in(self.tb.sut, argv, check=False)
        out = done.stdout.strip()
        words = out.split()
        if done.returncode != 0 or not words or not words[-1].isdigit():
            error = done.stderr.strip()
            raise GeneratorError(f"{self.name}: the records command failed ({done.returncode}) "
                                 f"or printed no count: {out!r} {error!r}")  # fmt: skip
        n = int(words[-1])
        return n, n

    def finish(self) -> dict[str, object]:
        if self.proc.poll() is not None:
            return {"exited": self.proc.returncode}
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return {"terminated": True}


# ------------------------------------------------------------------------------ trials


@dataclass(frozen=True, slots=True)
class PaperTrial:
    """One trial of mixed traffic: what was offered and what the SUT did with it."""

    rate: float
    seconds: float
    fraction: float
    offered: int
    stamp_offered: int
    data_received: int
    stamp_handled: int
    input_drops: int
    stale: int
    elapsed_s: float

    @property
    def received(self) -> int:
        return self.data_received + self.stamp_handled

    @property
    def loss_ratio(self) -> float:
        return max(0.0, 1.0 - self.received / self.offered) if self.offered > 0 else 0.0


class PaperBench:
    """The forwarding bench set up for the paper's trials (module doc)."""

    def __init__(
        self,
        tb: BenchTestbed,
        *,
        gen_cpu: int = 0,
        sut_cpu: int = 1,
        rx_path: Literal["napi", "rps"] = "napi",
        napi_priority: int = NAPI_FIFO_PRIORITY,
        residual_s: float = RESIDUAL_S,
        batch: int = DEFAULT_BATCH,
        tick_us: float = DEFAULT_TICK_US,
        log: Callable[[str], None] = print,
    ) -> None:
        from sixlab.dataplane.xdp_plane import attach_xdp_pass  # noqa: PLC0415

        if tb.sink is None:
            raise ValueError("the paper's bench is two_node_bench(forward=True)")
        self.tb = tb
        self.gen_cpu = gen_cpu
        self.sut_cpu = sut_cpu
        self.rx_path = rx_path
        self.residual_s = residual_s
        self.batch = batch
        self.tick_us = tick_us
        self.log = log
        self.binary = build_generator()
        setup_forwarding(tb)
        with entered(tb.gen.ns):
            attach_xdp_pass(tb.gen_if)
        self.napi_pid: int | None = None
        rps = f"{1 << sut_cpu:x}" if rx_path == "rps" else "0"
        tb.testbed.exec_in(
            tb.sut, ["sh", "-c", f"echo {rps} > /sys/class/net/{tb.sut_if}/queues/rx-0/rps_cpus"]
        )
        if rx_path == "napi":
            self.napi_pid = threaded_napi(
                tb, tb.sut, tb.sut_if, sut_cpu, fifo_priority=napi_priority
            )
        self.napi_priority = napi_priority if rx_path == "napi" else 0
        self.sink = SinkCounter(tb)
        nft(
            tb,
            tb.gen,
            f"table netdev {_REPLY_TABLE} {{\n  counter replies {{}}\n  counter stale {{}}\n"
            f"  chain ingress {{ type filter hook ingress device {tb.gen_if} priority -500; }}\n"
            "}\n",
        )
        self.src_mac = interface_mac(tb, tb.gen, tb.gen_if)
        self.dst_mac = interface_mac(tb, tb.sut, tb.sut_if)
        self._tag = 0
        self.ceiling: list[float] = []

    # -- where the work runs -------------------------------------------------------

    def where(self, rate: float = 50_000.0, seconds: float = 1.0) -> dict[str, object]:
        """Where the receive path ran during a data-only trial: frames per CPU."""
        before = softnet_processed()
        trial = self._run(None, None, 0.0, rate, seconds)
        after = softnet_processed()
        out: dict[str, object] = {
            "rx_path": self.rx_path,
            "forwarded": trial.data_received,
            "softnet_processed_per_cpu": [b - a for a, b in zip(before, after, strict=True)],
        }
        if self.napi_pid is not None:
            out["napi_kthread"] = self.napi_pid
            out["napi_cpus"] = allowed_cpus(self.napi_pid)
        return out

    def xdp_note(self) -> str:
        if self.rx_path == "napi":
            policy = (f"SCHED_FIFO {self.napi_priority}" if self.napi_priority
                      else "SCHED_OTHER")  # fmt: skip
            return (f"receive path: threaded NAPI on {self.tb.sut_if} (kthread "
                    f"{self.napi_pid}, CPU {self.sut_cpu}, {policy}): the SUT's forwarding and "
                    f"the xdp and afxdp planes' XDP programs run on the SUT's CPU "
                    f"{self.sut_cpu}")  # fmt: skip
        return (f"receive path: RPS to CPU {self.sut_cpu}; on a veth an XDP program runs on "
                f"the CPU that sent the frame: the xdp and afxdp planes' XDP programs run "
                f"on the GENERATOR's CPU {self.gen_cpu}, their figures are not the SUT's "
                "(use --rx-path napi)")  # fmt: skip

    def measure_ceiling(self, seconds: float = 2.0) -> float:
        """Frames/s the generator offers flat out (data frames, nothing else running)."""
        trial = self._run(None, None, 0.0, 1e9, seconds)
        rate = trial.offered / trial.elapsed_s if trial.elapsed_s else 0.0
        self.ceiling.append(rate)
        return rate

    # -- one trial -----------------------------------------------------------------

    def _reply_counters(self) -> tuple[int, int]:
        out = self.tb.testbed.exec_in(
            self.tb.gen, ["nft", "-j", "list", "counters", "table", "netdev", _REPLY_TABLE]
        ).stdout
        values = {
            item["counter"]["name"]: int(item["counter"]["packets"])
            for item in json.loads(out)["nftables"]
            if "counter" in item
        }
        return values.get("replies", 0), values.get("stale", 0)

    def _arm(self, port: int) -> None:
        self.sink.arm(port)
        udp = f"@nh,48,8 {_IPPROTO_UDP}"
        nft(
            self.tb,
            self.tb.gen,
            f"flush chain netdev {_REPLY_TABLE} ingress\n"
            f"reset counters table netdev {_REPLY_TABLE}\n"
            f"add rule netdev {_REPLY_TABLE} ingress meta protocol ip6 {udp} "
            f"@nh,336,16 {port} counter name replies drop\n"
            f"add rule netdev {_REPLY_TABLE} ingress meta protocol ip6 {udp} "
            "counter name stale drop\n",
        )

    def _snapshot(self, role: Role | None, sut: Sut | None, ssid: int) -> tuple[int, ...]:
        data, data_stale = self.sink.counters()
        replies, stale = self._reply_counters()
        if role == "collector" and sut is not None:
            return (data, data_stale, replies, stale, *sut.handled(ssid))
        return data, data_stale, replies, stale

    def _settle(
        self, role: Role | None, sut: Sut | None, ssid: int, limit_s: float
    ) -> tuple[int, ...]:
        """The counters once they have stood still for ``_SETTLE_S``, or at ``limit_s``."""
        deadline = time.monotonic() + limit_s
        last = self._snapshot(role, sut, ssid)
        while time.monotonic() < deadline:
            time.sleep(min(_SETTLE_S, max(0.0, deadline - time.monotonic())))
            now = self._snapshot(role, sut, ssid)
            if now == last:
                break
            last = now
        return last

    def trial(self, role: Role, sut: Sut | None, fraction: float, rate: float,
              seconds: float) -> PaperTrial:  # fmt: skip
        """Offer ``rate`` frames/s, ``fraction`` of them STAMP for ``sut`` in ``role``."""
        return self._run(role, sut, fraction, rate, seconds)

    def _run(self, role: Role | None, sut: Sut | None, fraction: float, rate: float,
             seconds: float) -> PaperTrial:  # fmt: skip
        if fraction > 0 and (role is None or sut is None):
            raise ValueError("STAMP traffic needs a role and an implementation")
        external = isinstance(sut, _External)
        # The previous trial's backlog first: nothing of it may land in this one.
        self._settle(role, sut, EXTERNAL_SSID if external else self._tag, _SETTLE_MAX_S)
        self._tag = self._tag % _TAGS + 1
        tag, port = self._tag, TAG_PORT_BASE + self._tag
        ssid = EXTERNAL_SSID if external else tag
        self._arm(port)
        mix = None
        tb = self.tb
        count = t1_ns = 0
        if fraction > 0:
            if role == "reflector":
                frame = reflector_probe_frame(self.src_mac, self.dst_mac, tb.gen_addr,
                                              tb.sut_addr, sport=port, ssid=ssid)  # fmt: skip
                mix = Mix(frame, fraction)
            else:
                count = math.ceil(rate * seconds * fraction) + _PRIME_SLACK
                t1_ns = (int(time.time()) - count - 100) * 1_000_000_000
                frame, fields = collector_frame(self.src_mac, self.dst_mac, tb.gen_addr,
                                                tb.sut_addr, dport=STAMP_PORT, ssid=ssid,
                                                t1_ns=t1_ns)  # fmt: skip
                mix = Mix(frame, fraction, fields)
        if role == "collector" and sut is not None:
            # A session in every collector trial, idle at 0 %: the plane is attached
            # (the xdp plane loads its collector program with the first session).
            sut.prepare(ssid, count if mix is not None else 0, t1_ns if mix is not None else 0)
        before = (0, 0)
        if role == "collector" and sut is not None:
            before = sut.handled(ssid)
        data = data_frame(self.src_mac, self.dst_mac, tb.gen_addr, str(tb.sink_addr), sport=port)
        stats = run_generator(tb, self.binary, data, rate, seconds, cpu=self.gen_cpu,
                              batch=self.batch, tick_us=self.tick_us, mix=mix)  # fmt: skip
        after = self._settle(role, sut, ssid, self.residual_s)
        data_received, data_stale, replies, stale = after[:4]
        if role == "collector" and sut is not None:
            handled = after[4] - before[0]
        elif role == "reflector":
            handled = replies
        else:
            handled = 0
        return PaperTrial(
            rate=rate,
            seconds=seconds,
            fraction=fraction,
            offered=int(stats["offered"]),
            stamp_offered=int(stats.get("mix_offered", 0)),
            data_received=data_received,
            stamp_handled=handled,
            input_drops=int(stats["input_drops"]),
            stale=data_stale + stale,
            elapsed_s=float(stats["elapsed_s"]),
        )

    def start(self, impl: Implementation, role: Role, log: IO[bytes] | None = None) -> Sut | None:
        """Start ``impl`` in ``role`` on the SUT's CPU (None for the baseline)."""
        if impl.kind == "baseline":
            return None
        if impl.kind == "external":
            return _External(self.tb, impl, self.sut_cpu, log)
        assert impl.plane is not None
        if role == "reflector":
            return _SixlabReflector(self.tb, impl.plane, self.sut_cpu)
        return _SixlabCollector(self.tb, impl.plane, self.sut_cpu)

    def preflight(self, role: Role, sut: Sut | None, *, attempts: int = 20) -> PaperTrial:
        """A light trial that must pass (half of it STAMP unless baseline): the SUT is up
        and the counting works; :class:`GeneratorError` with the reason if not."""
        fraction = 0.0 if sut is None else 0.5
        last: PaperTrial | GeneratorError | None = None
        for _ in range(attempts):
            try:
                last = self._run(role, sut, fraction, PREFLIGHT_RATE, 0.5)
            except GeneratorError as exc:  # an external still starting, say
                last = exc
            else:
                stamp_ok = last.stamp_handled >= 0.95 * last.stamp_offered
                data_ok = last.data_received >= 0.99 * (last.offered - last.stamp_offered)
                if stamp_ok and data_ok:
                    return last
            time.sleep(0.5)
        raise GeneratorError(f"{getattr(sut, 'name', BASELINE)} ({role}): a light trial "
                             f"does not pass: {last}")  # fmt: skip


# ------------------------------------------------------------------------------ the run


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """The PDR search (``sixlab.bench.pdr``) of every point."""

    loss_ratio: float = DEFAULT_LOSS_RATIO
    precision: float = 0.02
    trial_seconds: float = 1.0
    final_seconds: float = 2.0
    #: The lowest rate searched: below the slowest figure of the paper (its Scapy
    #: reflector at 100 % STAMP, 470 frames/s), so that a plane as slow still has a PDR.
    min_rate: float = 100.0
    max_rate: float = 0.0  # 0: the generator's ceiling
    method: Literal["mlrsearch", "bisect"] = "mlrsearch"


@dataclass(slots=True)
class PaperPoint:
    """One PDR search: an implementation in a role at a STAMP fraction, one repetition."""

    role: str
    impl: str
    fraction: float
    repetition: int
    pdr: float
    trials: list[PaperTrial] = field(default_factory=list)
    seconds: float = 0.0
    max_rate: float = 0.0
    #: The machine's 1-minute load average when the search began (the SUT and the
    #: generator themselves add up to 2 while they run).
    loadavg: float = 0.0


def _pdr_point(
    bench: PaperBench,
    role: Role,
    sut: Sut | None,
    impl: Implementation,
    fraction: float,
    *,
    repetition: int,
    settings: SearchSettings,
    max_rate: float,
    log: Callable[[str], None] | None,
) -> PaperPoint:
    trials: list[PaperTrial] = []

    def trial(rate: float, seconds: float) -> TrialResult:
        t = bench.trial(role, sut, fraction, rate, seconds)
        trials.append(t)
        return TrialResult(rate=rate, seconds=seconds, offered=t.offered, received=t.received,
                           input_drops=t.input_drops, stale=t.stale,
                           elapsed_s=t.elapsed_s)  # fmt: skip

    started = time.monotonic()
    loadavg = os.getloadavg()[0]
    result = search_pdr(
        trial,
        min_rate=settings.min_rate,
        max_rate=max_rate,
        loss_ratio=settings.loss_ratio,
        precision=settings.precision,
        trial_seconds=settings.trial_seconds,
        final_seconds=settings.final_seconds,
        method=settings.method,
        log=log,
    )
    return PaperPoint(role, impl.name, fraction, repetition, result.pdr, trials,
                      time.monotonic() - started, max_rate, loadavg)  # fmt: skip


def run_paper(
    tb: BenchTestbed,
    implementations: Sequence[Implementation],
    *,
    roles: Sequence[Role] = ROLES,
    fractions: Sequence[float] = PAPER_FRACTIONS,
    repeat: int = 1,
    settings: SearchSettings | None = None,
    rx_path: Literal["napi", "rps"] = "napi",
    napi_priority: int = NAPI_FIFO_PRIORITY,
    residual_s: float = RESIDUAL_S,
    on_point: Callable[[PaperPoint], None] | None = None,
    log: Callable[[str], None] = print,
    search_log: Callable[[str], None] | None = None,
    out: Path | None = None,
    preflight_attempts: int = 20,
) -> tuple[list[PaperPoint], dict[str, object]]:
    """Every point of Figs 12–16: each repetition, role, implementation and fraction.

    The implementations' order rotates with the repetition (so drift of the machine
    does not favour one); an implementation is started once per role and repetition
    and serves every fraction. The baseline has only the 0 % point. An implementation
    that does not pass the light trial before its searches (``preflight``, up to
    ``preflight_attempts`` times) gets none in that role and repetition: the reason is
    in ``failed`` and the run goes on. Returns the points and what the run found about
    the bench (ceiling, where the work ran, what failed).
    """
    settings = settings or SearchSettings()
    bench = PaperBench(
        tb, rx_path=rx_path, napi_priority=napi_priority, residual_s=residual_s, log=log
    )
    failed: dict[str, str] = {}
    info: dict[str, object] = {"rx_path": rx_path, "xdp_note": bench.xdp_note(),
                               "failed": failed}  # fmt: skip
    log(bench.xdp_note())
    ceiling = bench.measure_ceiling()
    log(f"generator ceiling: {ceiling:,.0f} frames/s (data only, flat out)")
    info["where"] = bench.where()
    log(f"where: {info['where']}")
    max_rate = settings.max_rate or ceiling
    points: list[PaperPoint] = []
    for rep in range(repeat):
        shift = rep % max(len(implementations), 1)
        order = list(implementations[shift:]) + list(implementations[:shift])
        for role in roles:
            for impl in order:
                if role not in impl.roles():
                    log(f"{impl.name}: no {role} figure (no --external-records command)")
                    continue
                impl_fractions = [0.0] if impl.kind == "baseline" else list(fractions)
                logfile = None
                if impl.kind == "external" and out is not None:
                    logfile = (out / f"{impl.name}-{role}.log").open("ab")
                sut = bench.start(impl, role, logfile)
                handled = 0
                try:
                    try:
                        handled += bench.preflight(
                            role, sut, attempts=preflight_attempts
                        ).stamp_handled
                    except GeneratorError as exc:
                        # Its points stay missing (``check`` names them); the run goes on.
                        log(f"rep {rep + 1}, {role:9} {impl.name:10}: no searches: {exc}")
                        failed[f"{rep}/{role}/{impl.name}"] = str(exc)
                        impl_fractions = []
                    for fraction in impl_fractions:
                        point = _pdr_point(bench, role, sut, impl, fraction, repetition=rep,
                                           settings=settings, max_rate=max_rate,
                                           log=search_log)  # fmt: skip
                        points.append(point)
                        handled += sum(t.stamp_handled for t in point.trials)
                        log(f"rep {rep + 1}, {role:9} {impl.name:10} {fraction:8.2%} STAMP: "
                            f"PDR {point.pdr:12,.0f} frames/s ({len(point.trials)} trials, "
                            f"{point.seconds:.0f} s, load {point.loadavg:.1f})")  # fmt: skip
                        if on_point is not None:
                            on_point(point)
                finally:
                    counters = sut.finish() if sut is not None else {}
                    if logfile is not None:
                        logfile.close()
                info.setdefault("sut_counters", {})
                sut_counters = info["sut_counters"]
                assert isinstance(sut_counters, dict)
                # What the bench counted as handled over every trial, next to what the
                # implementation says it did (``check``).
                sut_counters[f"{rep}/{role}/{impl.name}"] = {"handled": handled, **counters}
    info["ceiling"] = [*bench.ceiling, bench.measure_ceiling()]
    return points, info


# ------------------------------------------------------------------------------ summary

#: Two-sided 95 % quantiles of Student's t by degrees of freedom (1..30); 1.96 beyond.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Summary:
    """Mean PDR of a point over its repetitions and the 95 % confidence half-width (t)."""

    role: str
    impl: str
    fraction: float
    n: int
    mean: float
    ci95: float


def summarize(points: Iterable[PaperPoint]) -> list[Summary]:
    """Per (role, implementation, fraction): mean and 95 % CI (Student's t; 0 for n=1)."""
    groups: dict[tuple[str, str, float], list[float]] = {}
    for p in points:
        groups.setdefault((p.role, p.impl, p.fraction), []).append(p.pdr)
    out = []
    for (role, impl, fraction), values in groups.items():
        n = len(values)
        mean = statistics.fmean(values)
        ci = 0.0
        if n > 1:
            t = _T95[n - 2] if n - 1 <= len(_T95) else 1.96
            ci = t * statistics.stdev(values) / math.sqrt(n)
        out.append(Summary(role, impl, fraction, n, mean, ci))
    return out


def point_dict(point: PaperPoint) -> dict[str, Any]:
    d = asdict(point)
    for t, raw in zip(point.trials, d["trials"], strict=True):
        raw["loss_ratio"] = t.loss_ratio
    return d


def write_results(points: Sequence[PaperPoint], meta: dict[str, Any], path: Path) -> None:
    """Every point and every trial, and how the run was made, as one JSON document."""
    document = {
        "meta": meta,
        "points": [point_dict(p) for p in points],
        "summary": [asdict(s) for s in summarize(points)],
    }
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(document, indent=1, default=str))
    tmp.replace(path)


def load_points(path: Path) -> tuple[list[PaperPoint], dict[str, Any]]:
    """The points and meta of a document :func:`write_results` wrote."""
    document = json.loads(path.read_text())
    points = []
    for raw in document["points"]:
        trials = [
            PaperTrial(**{k: v for k, v in t.items() if k != "loss_ratio"})
            for t in raw.pop("trials")
        ]
        points.append(PaperPoint(**raw, trials=trials))
    return points, document["meta"]


#: ``check``: at 100 % STAMP the xdp plane must reach at least this share of the best
#: user-space plane's PDR (``compare_speed``). The reflector answers in the kernel and
#: is far ahead on a quiet machine; the collector hands every record to the same Python
#: engine as the others, through a ring buffer instead of a socket, so it is ahead by
#: less. A speed, so asserted only on the full runs, made on a quiet machine: on a
#: loaded one (the CI's ``--quick``) the hypervisor's scheduling moves single searches by
#: several times (seen: the xdp reflector at 13 k/s and the socket one at 43 k/s while
#: 19 other test runs shared the two CPUs).
XDP_SHARE_OF_USER_SPACE = 0.5
#: ``check``, always: of the STAMP packets the bench counted as handled by the xdp plane,
#: at least this share its kernel program handled (``reflected``, ``collected``): the
#: plane did not fall back to its user-space path wholesale (a program that does not
#: load, attach or match), which is what "xdp is at least the user-space planes"
#: guards against, and which no load on the machine changes. (The collector's ring
#: buffer may overflow in an overload trial; those replies then take the socket.)
XDP_KERNEL_SHARE = 0.5


def _sut_total(counters: dict[str, Any], role: str) -> int | None:
    """What a sixlab implementation says it did: replies sent (engine and kernel) or
    datagrams its engine took (None: counters of no sixlab implementation)."""
    plane = counters.get("plane")
    plane = plane if isinstance(plane, dict) else {}
    if role == "reflector" and "reflected" in counters:
        return int(counters["reflected"]) + int(plane.get("reflected", 0))
    engine = counters.get("engine")
    if role == "collector" and isinstance(engine, dict):
        return int(engine["received"])
    return None


def check(
    points: Sequence[PaperPoint],
    meta: dict[str, Any],
    implementations: Sequence[Implementation],
    roles: Sequence[str],
    fractions: Sequence[float],
    *,
    compare_speed: bool = True,
) -> list[str]:
    """The harness's invariants over a run; what does not hold, one line each.

    * every configuration (role, implementation, fraction; the baseline at 0 % only)
      has a point in every repetition, with a PDR above zero; an implementation that
      failed its light trial (``failed`` in ``meta``) is named with the reason;
    * every trial's counts add up: the STAMP frames are the requested share of those
      offered (to one frame), nothing is received or handled that was not offered, and
      nothing is handled at 0 % STAMP;
    * what the bench counted as handled is no more than the implementation says it did
      (sixlab's: replies sent by its engine and kernel program; datagrams its engine
      took, of which records are a part);
    * the xdp plane's kernel program handled at least ``XDP_KERNEL_SHARE`` of what the
      bench counted as handled by that plane, in each role and repetition;
    * with ``compare_speed``, at 100 % STAMP the xdp plane reaches
      ``XDP_SHARE_OF_USER_SPACE`` of the best user-space plane (``scapy``, ``mmap``,
      ``socket``; not ``afxdp``, whose frames an XDP program steers too), in each role.
    """
    problems: list[str] = []
    repeat = int(meta.get("repeat", 1))
    have: dict[tuple[str, str, float], list[PaperPoint]] = {}
    for p in points:
        have.setdefault((p.role, p.impl, p.fraction), []).append(p)
    for role in roles:
        for impl in implementations:
            if role not in impl.roles():
                continue
            for f in [0.0] if impl.kind == "baseline" else fractions:
                got = have.get((role, impl.name, f), [])
                if len(got) != repeat:
                    problems.append(f"{role}/{impl.name}/{f:.2%}: {len(got)} of {repeat} points")
                problems += [f"{role}/{impl.name}/{f:.2%}: PDR 0 (rep {p.repetition + 1})"
                             for p in got if p.pdr <= 0]  # fmt: skip
    for p in points:
        where = f"{p.role}/{p.impl}/{p.fraction:.2%}"
        for t in p.trials:
            data_offered = t.offered - t.stamp_offered
            if abs(t.stamp_offered - p.fraction * t.offered) > 1:
                problems.append(f"{where}: {t.stamp_offered} STAMP of {t.offered} offered")
            if not 0 <= t.data_received <= data_offered:
                problems.append(f"{where}: {t.data_received} data received of {data_offered}")
            if not 0 <= t.stamp_handled <= t.stamp_offered:
                problems.append(f"{where}: {t.stamp_handled} STAMP handled of "
                                f"{t.stamp_offered}")  # fmt: skip
            if t.input_drops > t.offered:
                problems.append(f"{where}: {t.input_drops} input drops of {t.offered}")
    problems += [f"{key}: no searches ({why})" for key, why in meta.get("failed", {}).items()]
    sut_counters = meta.get("sut_counters", {})
    for key, counters in sut_counters.items():
        role = key.split("/")[1]
        total = _sut_total(counters, role)
        if total is not None and counters["handled"] > total:
            problems.append(f"{key}: the bench counted {counters['handled']} handled, "
                            f"the implementation {total}")  # fmt: skip
        plane = counters.get("plane")
        if key.endswith("/xdp") and isinstance(plane, dict):
            kernel = int(plane.get("reflected" if role == "reflector" else "collected", 0))
            if kernel < XDP_KERNEL_SHARE * counters["handled"]:
                problems.append(f"{key}: the kernel program handled {kernel} of the "
                                f"{counters['handled']} STAMP packets counted")  # fmt: skip
    for role in roles if compare_speed else ():
        by_impl = {
            p.impl: statistics.fmean(x.pdr for x in have[(role, p.impl, 1.0)])
            for p in points
            if p.role == role and p.fraction == 1.0
        }
        user = [by_impl[n] for n in ("scapy", "mmap", "socket") if n in by_impl]
        if "xdp" in by_impl and user and by_impl["xdp"] < XDP_SHARE_OF_USER_SPACE * max(user):
            problems.append(f"{role}: xdp at 100 % STAMP {by_impl['xdp']:,.0f}/s, below "
                            f"{XDP_SHARE_OF_USER_SPACE:.0%} of the best user-space plane "
                            f"{max(user):,.0f}/s")  # fmt: skip
    return problems


def machine_state() -> dict[str, object]:
    """Load average and whether other test runs are going on (for the record)."""
    busy = subprocess.run(["pgrep", "-fc", "pytest"], capture_output=True, text=True, check=False)
    with contextlib.suppress(OSError):
        return {"loadavg": os.getloadavg(), "pytest_processes": int(busy.stdout.strip() or 0)}
    return {}
