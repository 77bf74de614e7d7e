"""The ILNP paper's ILCC study, rerun: a growing crowd of correspondents, per policy.

Theory of operation
-------------------
"Performance Analysis of Identifier Locator Communication Cache Effects on ILNPv6 Stack"
(the ILNP paper, docs/papers.md) compares two ILNPv6 kernels that differ only in how
their identifier-locator communication cache (ILCC) adopts entries. Its transport-layer
test: a target runs an echo service; one source sends identical echo
requests from a fixed I-LV (1,280 packets/s in Test0), and *load processes* send UDP
datagrams from a random source NID each, every one a new correspondent; TestK runs K
load processes (K = 0..10, 66 datagrams/s each: 1,940 packets/s in Test10) for 60 s,
and the target's ILCC size, latency, and service and drop rates are recorded per test.

Here the target is ``sixlab ilnp host`` with ``udpecho`` (:class:`IlnpEchoSut`, one
daemon per test, so each test starts from an empty ILCC), on ``two_node_bench()``:

* the echo flow is the C generator's fixed ILNPv6 frame (:class:`IlnpEchoTrialRunner`),
  offered at ``base_rate`` for the test's duration, its echoes counted by nftables at
  the generator (the trial's tag);
* the load (:class:`CrowdLoad`) is a thread of this process, pinned to the generator's
  CPU, on a packet socket in the generator's namespace: echo requests to the same
  service, each from a fresh random NID on the generator's locator with its own random
  nonce, paced at ``rank * per_process_rate``; their echoes are counted as the trial's
  ``stale`` answers (they carry no trial tag).

The random correspondents "live" behind the generator: the SUT's route to the shared
/64 is set *via* the generator's address (``onlink``), so the SUT's answers to them
need one neighbour entry, not one Neighbour Discovery per NID. Without it no host
answers those solicitations, the answers wait in neighbour queues holding the daemon's
raw socket's send buffer, and its sends to every correspondent fail: worth knowing,
but a test of the neighbour table, not of the ILCC.

During the trial :class:`CpuBusy` measures the SUT CPU's busy share; after it the
daemon's ``status`` gives the ILCC size, its per-packet time (ring read to TUN write,
wall clock, p50/p99 of its last samples: the analogue of the paper's "kernel latency")
and its drop counters; the SUT kernel gives the link's drops.

The configurations (:data:`CONFIGS`): the paper's two kernels — ``st-andrews`` (no
admission policy, a linear ILCC scanned on every lookup, like the St Andrews code)
and ``socket`` (the paper's policy: adopt only where a connected UDP socket is
involved, same linear ILCC) — and sixlab's own, ``sixlab`` (bounded LRU policy,
hash ILCC, kernel fast path). ``none-hash`` separates the store's effect from the
policy's.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from sixlab.bench.generator import GeneratorError, interface_mac
from sixlab.bench.ilnp_echo import (
    IlnpEchoSut,
    IlnpEchoTrialRunner,
    ilnp_echo_frame,
    preflight,
)
from sixlab.testbed import BenchTestbed
from sixlab.wire.ilnp import ILV, Nonce

__all__ = [
    "CONFIGS",
    "CpuBusy",
    "CrowdLoad",
    "StudyConfig",
    "StudyPoint",
    "cpu_idle",
    "crowd_frame",
    "plot_study",
    "route_crowd_via_generator",
    "run_point",
    "write_results",
]

#: The ILNP paper's rates: 1,280 echo requests/s alone (Test0), 66/s more per load
#: process, 60 s per test.
SEED_BASE_RATE = 1280.0
SEED_PER_PROCESS_RATE = 66.0
SEED_SECONDS = 60.0
#: The load thread wakes this often and sends what is due (a NIC-like burst).
_LOAD_TICK_S = 0.002
#: NIDs the bench itself uses (generator 1, SUT 2) are never drawn for the crowd.
_RESERVED_NIDS = frozenset({0, 1, 2})


@dataclass(frozen=True, slots=True)
class StudyConfig:
    """One ILNP host configuration under study."""

    name: str
    policy: str
    store: str
    fastpath: str
    label: str


CONFIGS: dict[str, StudyConfig] = {
    c.name: c
    for c in (
        StudyConfig("st-andrews", "none", "linear", "off", "no policy, linear ILCC (St Andrews)"),
        StudyConfig("socket", "socket", "linear", "off", "socket policy, linear ILCC (ILNP paper)"),
        StudyConfig("none-hash", "none", "hash", "off", "no policy, hash ILCC"),
        StudyConfig("sixlab", "bounded", "hash", "on", "bounded policy, hash ILCC, fast path"),
    )
}


@dataclass(slots=True)
class StudyPoint:
    """What one test (one configuration, one rank, one repetition) measured."""

    config: str
    rank: int
    repetition: int
    seconds: float
    base_offered: int
    base_echoed: int
    load_sent: int
    load_echoed: int
    ilcc_size: int | None
    latency_p50_us: float | None
    latency_p99_us: float | None
    latency_samples: int
    daemon_drops: dict[str, int] = field(default_factory=dict)
    ring_drops: int = 0
    link_rx_dropped: int = 0
    #: Share of the test the SUT's CPU was busy (the daemon, udpecho, the kernel's
    #: packet work, and the generator's receive of the answers: ``prepare_bench``).
    sut_cpu_busy: float | None = None
    #: The daemon's raw-socket sends that failed (``wire.tx_error``).
    tx_errors: int = 0

    @property
    def base_served(self) -> float:
        """Share of the echo flow's requests that came back."""
        return self.base_echoed / self.base_offered if self.base_offered else 0.0

    @property
    def load_served(self) -> float:
        """Share of the crowd's requests that came back."""
        return self.load_echoed / self.load_sent if self.load_sent else 0.0


class CrowdLoad:
    """The paper's load processes as one paced thread: each frame a new correspondent.

    A context manager: entering starts the thread, leaving stops it and keeps the
    number of frames sent in :attr:`sent`. Frames are whole ILNPv6 echo requests
    (:func:`ilnp_echo_frame`) from ``locator``/random NID with a random 32-bit nonce,
    to the SUT's I-LV; the tag is 0, which no trial uses. With ``cpu`` the thread runs
    on that CPU only (the generator's): unpinned, the scheduler moves it to the SUT's CPU
    whenever the spinning generator keeps its own busy.
    """

    def __init__(
        self,
        tb: BenchTestbed,
        rate: float,
        *,
        locator: int,
        target: ILV,
        payload_size: int,
        seed: int = 0,
        cpu: int | None = None,
    ) -> None:
        self.rate = rate
        self._cpu = cpu
        self.sent = 0
        self.error: BaseException | None = None
        self._locator = locator
        self._target = target
        self._payload_size = payload_size
        self._rng = random.Random(seed)  # noqa: S311 (test traffic, reproducible by seed)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._src_mac = self._dst_mac = b""
        if rate > 0:
            self._src_mac = interface_mac(tb, tb.gen, tb.gen_if)
            self._dst_mac = interface_mac(tb, tb.sut, tb.sut_if)
            self._sock = tb.gen.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            self._sock.bind((tb.gen_if, 0))

    def frame(self) -> bytes:
        """The next request (:func:`crowd_frame`)."""
        return crowd_frame(
            self._rng,
            self._src_mac,
            self._dst_mac,
            locator=self._locator,
            target=self._target,
            payload_size=self._payload_size,
        )

    def _run(self) -> None:
        assert self._sock is not None
        if self._cpu is not None:  # this thread only: the generator's side, not the SUT's
            os.sched_setaffinity(0, {self._cpu})
        start = time.monotonic()
        try:
            while not self._stop.is_set():
                due = int(self.rate * (time.monotonic() - start))
                while self.sent < due:
                    self._sock.send(self.frame())
                    self.sent += 1
                self._stop.wait(_LOAD_TICK_S)
        except OSError as exc:  # reported by __exit__: a load that died is no result
            self.error = exc

    def __enter__(self) -> Self:
        if self._sock is not None:
            self._thread = threading.Thread(target=self._run, name="crowd-load", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._sock is not None:
            self._sock.close()
        if self.error is not None and exc is None:
            raise GeneratorError(f"bench: crowd load failed: {self.error}") from self.error


def crowd_frame(
    rng: random.Random,
    src_mac: bytes,
    dst_mac: bytes,
    *,
    locator: int,
    target: ILV,
    payload_size: int,
) -> bytes:
    """An echo request from a new correspondent: a random NID the bench never uses
    (:data:`_RESERVED_NIDS`) on ``locator``, a random 32-bit nonce, trial tag 0."""
    nid = rng.getrandbits(64)
    while nid in _RESERVED_NIDS:
        nid = rng.getrandbits(64)
    nonce = Nonce(rng.getrandbits(32).to_bytes(4, "big"))
    return ilnp_echo_frame(
        src_mac, dst_mac, ILV(locator, nid), target, tag=0, nonce=nonce, payload_size=payload_size
    )


def cpu_idle(cpu: int, stat: str = "/proc/stat") -> tuple[int, int]:
    """(idle + iowait, steal) of ``cpu`` since boot, in USER_HZ ticks, from ``/proc/stat``.

    Fields (proc(5)): user nice system idle iowait irq softirq steal guest guest_nice.
    Only idle and steal are read, and for a reason: under NOHZ the busy fields are
    *sampled* at the scheduler tick, which is stopped while the CPU idles, so short
    bursts of work between idle periods go uncounted (``bench_ilnp.py cpucheck`` shows
    it against a thread's own CPU clock), while idle time is measured at each idle
    entry and exit. The file is the whole machine's, whatever the
    namespace.
    """
    prefix = f"cpu{cpu} "
    for line in Path(stat).read_text().splitlines():
        if line.startswith(prefix):
            ticks = [int(v) for v in line.split()[1:]] + [0] * 10
            return ticks[3] + ticks[4], ticks[7]
    raise GeneratorError(f"bench: no cpu{cpu} in {stat}")


class CpuBusy:
    """A context manager: the share of time ``cpu`` was busy while inside (:attr:`busy`).

    Busy is what was neither idle (:func:`cpu_idle`) nor stolen by the hypervisor
    (time the VM's CPU did not run at all is no work of this machine's), over the
    wall-clock length of the window. Resolution: one USER_HZ tick (10 ms) at each end.
    """

    def __init__(self, cpu: int, stat: str = "/proc/stat") -> None:
        self.cpu = cpu
        self.stat = stat
        self.busy: float | None = None
        self._start = (0, 0)
        self._t0 = 0.0

    def __enter__(self) -> Self:
        self._start = cpu_idle(self.cpu, self.stat)
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        idle, steal = cpu_idle(self.cpu, self.stat)
        wall = (time.monotonic() - self._t0) * os.sysconf("SC_CLK_TCK")
        if wall <= 0:
            return
        share = 1.0 - (idle - self._start[0] + steal - self._start[1]) / wall
        self.busy = min(1.0, max(0.0, share))


@contextlib.contextmanager
def _together(*managers: contextlib.AbstractContextManager[Any]) -> Iterator[None]:
    """Enter ``managers`` in order, leave them in reverse."""
    with contextlib.ExitStack() as stack:
        for manager in managers:
            stack.enter_context(manager)
        yield


def route_crowd_via_generator(tb: BenchTestbed) -> None:
    """Send the SUT's traffic for the shared /64 through the generator (module doc)."""
    prefix = ILV.from_address(tb.gen_addr).locator
    net = f"{ILV(prefix, 0).address}/64"
    tb.testbed.exec_in(
        tb.sut,
        # Metric 1: preferred over the kernel's on-link prefix route (metric 256).
        ["ip", "-6", "route", "replace", net, "via", tb.gen_addr, "dev", tb.sut_if, "onlink",
         "metric", "1"],
    )  # fmt: skip


def run_point(
    tb: BenchTestbed,
    runner: IlnpEchoTrialRunner,
    config: StudyConfig,
    rank: int,
    *,
    repetition: int = 0,
    seconds: float = SEED_SECONDS,
    base_rate: float = SEED_BASE_RATE,
    per_process_rate: float = SEED_PER_PROCESS_RATE,
    sut_cpu: int = 1,
) -> StudyPoint:
    """One test: a fresh daemon, the echo flow and ``rank`` load processes' worth."""
    gen = ILV.from_address(tb.gen_addr)
    with IlnpEchoSut(
        tb, policy=config.policy, store=config.store, fastpath=config.fastpath, cpu=sut_cpu
    ) as sut:
        preflight(runner, sut)
        load = CrowdLoad(
            tb,
            rank * per_process_rate,
            locator=gen.locator,
            target=runner.sut_ilv,
            payload_size=runner.payload_size,
            seed=rank * 1000 + repetition,
            cpu=runner.gen_cpu,
        )
        busy = CpuBusy(sut_cpu)
        # Both entered by the trial once its counters are armed and left when the
        # generator is done: the crowd and the CPU window span the echo flow.
        result = runner.trial(base_rate, seconds, background=_together(busy, load))
        status: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            status = sut.status()
        kernel = sut.kernel_counters()
    latency = status.get("latency_us", {})
    rings = status.get("rings", {})
    return StudyPoint(
        config=config.name,
        rank=rank,
        repetition=repetition,
        seconds=seconds,
        base_offered=result.offered,
        base_echoed=result.received,
        load_sent=load.sent,
        load_echoed=result.stale,
        ilcc_size=status.get("ilcc_size"),
        latency_p50_us=latency.get("p50"),
        latency_p99_us=latency.get("p99"),
        latency_samples=int(latency.get("samples") or 0),
        daemon_drops={k: int(v) for k, v in status.get("drops", {}).items()},
        ring_drops=sum(int(r.get("drops", 0)) for r in rings.values()),
        link_rx_dropped=kernel.get("link_rx_dropped", 0),
        sut_cpu_busy=busy.busy,
        tx_errors=int(status.get("wire", {}).get("tx_error", 0)),
    )


def _series(
    points: Sequence[StudyPoint], config: str, value: Callable[[StudyPoint], float | None]
) -> tuple[list[int], list[float]]:
    """Per rank, the mean over repetitions of ``value`` (ranks without a value left out)."""
    by_rank: dict[int, list[float]] = {}
    for p in points:
        v = value(p)
        if p.config == config and v is not None:
            by_rank.setdefault(p.rank, []).append(float(v))
    ranks = sorted(by_rank)
    return ranks, [statistics.fmean(by_rank[r]) for r in ranks]


#: A latency percentile of fewer samples than this is not plotted (with the fast path the
#: daemon sees only the first packets of the echo flow at rank 0).
MIN_LATENCY_SAMPLES = 100


def _latency_p50(point: StudyPoint) -> float | None:
    return point.latency_p50_us if point.latency_samples >= MIN_LATENCY_SAMPLES else None


def _latency_p99(point: StudyPoint) -> float | None:
    return point.latency_p99_us if point.latency_samples >= MIN_LATENCY_SAMPLES else None


def _cpu_busy(point: StudyPoint) -> float | None:
    return None if point.sut_cpu_busy is None else 100 * point.sut_cpu_busy


def _crowd_served(point: StudyPoint) -> float | None:
    return 100 * point.load_served if point.load_sent else None  # rank 0 has no crowd


def plot_study(points: Sequence[StudyPoint], configs: Sequence[StudyConfig], png: Path) -> Path:
    """The paper's figures for these runs: ILCC size, service, latency, crowd service."""
    import matplotlib as mpl  # noqa: PLC0415

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(2, 3, figsize=(15, 7), sharex=True)
    panels: list[tuple[Any, str, Callable[[StudyPoint], float | None], bool]] = [
        (axes[0][0], "ILCC entries at the end", lambda p: p.ilcc_size, False),
        (axes[0][1], "echo flow served (%)", lambda p: 100 * p.base_served, False),
        (axes[0][2], "crowd requests served (%)", _crowd_served, False),
        (axes[1][0], "SUT CPU busy (%)", _cpu_busy, False),
        (axes[1][1], "daemon per-packet time p50 (µs)", _latency_p50, True),
        (axes[1][2], "daemon per-packet time p99 (µs)", _latency_p99, True),
    ]
    for ax, title, value, log in panels:
        for c in configs:
            xs, ys = _series(points, c.name, value)
            ax.plot(xs, ys, "o-", markersize=3, linewidth=1, label=c.label)
        ax.set_title(title, fontsize=10)
        ax.grid(visible=True, alpha=0.3)
        if log:
            ax.set_yscale("log")
    for ax in axes[1]:
        ax.set_xlabel("test rank (load processes)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("sixlab — ILCC study: one echo flow and a growing crowd of correspondents")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def write_results(points: Sequence[StudyPoint], meta: dict[str, Any], path: Path) -> None:
    """Every point, and how they were made, as one JSON document."""
    document = {"meta": meta, "points": [asdict(p) for p in points]}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(document, indent=1))
    tmp.replace(path)
