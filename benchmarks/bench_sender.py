"""One sender agent's engine with many sessions on the socket plane: CPU and schedule slip
(issue 15).

A ``SenderEngine`` on the ``socket`` data plane (the probe path: a UDP socket, T4 from
``SO_TIMESTAMPNS``) runs N sessions at R packets/s each against a socket-plane
``ReflectorEngine`` in another process on loopback. The sessions are started one after
another across one interval, so their slots are spread evenly as a controller starting
them one by one spreads them. After a warm-up the benchmark reports, over its measuring
window: the sender process's CPU (share of one core: user + system, the engine thread
and the kernel's work for its sockets), packets sent and results received per second,
and the schedule slip of every packet (how long after its slot, start + k × interval
with the engine's own origin, its T1 was taken: the T1 of its ``PacketSent`` event
less the wall clock's offset from the monotonic one, read once as the window opens,
since the compiled run loop reports its packets after the fact), p50/p99/max, and the
slots skipped,
with the garbage collector's passes in the window (how many, their time, the full ones
and the longest full one: a full pass stops the engine for as long as it takes).

    sudo .venv/bin/python benchmarks/bench_sender.py --sessions 10000 --rate 1 --seconds 20

``--paths`` runs the engine once per path in turn, side by side against one reflector:
``loop`` (the compiled run loop, ``SenderEngine(compiled_loop=True)``), ``loop-thread``
(the same on a thread of its own, ``loop_thread``), ``compiled``
(sendmmsg/recvmmsg with the Python schedule), ``python`` (no C at all).

Beside the engine, at the same rate and tick: ``--floor``, bare ``sendto`` + ``recvmsg``
from Python, and ``--c-floor``, ``sender_floor.c`` (``sendmmsg``/``recvmmsg`` batches per
tick, replies decoded and matched, no Python in the loop): what the kernel alone takes
per probe and per wake-up. ``--no-engine`` runs only those.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from array import array
from ipaddress import IPv6Address
from pathlib import Path
from typing import Any


def _reflector(port: int) -> None:
    from sixlab.dataplane.base import DataplaneConfig, create  # noqa: PLC0415
    from sixlab.dataplane.engine import ReflectorEngine  # noqa: PLC0415
    from sixlab.stamp.reflector import Reflector, ReflectorSessionConfig  # noqa: PLC0415

    dp = create("socket", DataplaneConfig(port=port))
    dp.open()
    engine = ReflectorEngine(dp, Reflector(ReflectorSessionConfig(None)))
    engine.start()
    print("ready", dp.local_port, flush=True)
    sys.stdin.read()
    engine.shutdown()


def _cpu_ticks() -> list[int]:
    """The machine's CPU time so far by kind (/proc/stat: user, nice, system, idle,
    iowait, irq, softirq, steal), in clock ticks."""
    first = Path("/proc/stat").read_text().split("\n", 1)[0]
    return [int(x) for x in first.split()[1:9]]


def _pct(data: list[int], p: float) -> int:
    data = sorted(data)
    return data[min(len(data) - 1, max(0, -(-int(p * len(data)) // 100) - 1))]


def run(args: argparse.Namespace, tick_us: float, path: str | None = None) -> dict[str, Any]:
    from sixlab.dataplane.base import DataplaneConfig, create  # noqa: PLC0415
    from sixlab.dataplane.engine import SenderEngine, SenderSessionSpec  # noqa: PLC0415
    from sixlab.stamp import PacketSent, StampResult  # noqa: PLC0415
    from sixlab.stamp.sender import SenderConfig  # noqa: PLC0415

    interval = int(1e9 / args.rate)
    base: dict[int, int] = {}
    slips: list[int] = []
    counts = {"sent": 0, "results": 0}
    measuring = [False]
    offset = [0]  # wall - monotonic, ns

    sent_at: list[int] = []  # with --trace: each packet's send time (monotonic ns)

    def on_event(event: object) -> None:
        if isinstance(event, PacketSent):
            origin = base.get(event.ssid)
            if measuring[0] and origin is not None:
                slips.append((event.t1_ns - offset[0] - origin) % interval)
                counts["sent"] += 1
                if args.trace:
                    sent_at.append(event.t1_ns - offset[0])
        elif isinstance(event, StampResult) and measuring[0]:
            counts["results"] += 1

    dp = create("socket", DataplaneConfig(port=0))
    dp.open()
    # Nobody reads the results here: FIFOs of 2 records, as short as a collecting
    # controller keeps them. (With 64 per session, 640,000 records waited, and the
    # garbage collector's full passes over them slipped packets by up to 190 ms.)
    # (Trees before the C path have no ``compiled``: they run with no extra argument.)
    extra: dict[str, Any] = {"compiled": False} if args.python_path or path == "python" else {}
    if path == "compiled":
        extra["compiled_loop"] = False
    if args.timer_slack_ns is not None:
        extra["timer_slack_ns"] = args.timer_slack_ns or None
    if args.realtime_priority is not None:
        extra["realtime_priority"] = args.realtime_priority
    engine = SenderEngine(
        dp, on_event=on_event, fifo_capacity=2, tick_ns=int(tick_us * 1e3), **extra
    )
    if args.loop_slice_ms is not None:
        engine.loop_slice_ns = int(args.loop_slice_ms * 1e6)
    if path == "loop-thread":
        engine.loop_thread = True
    if args.no_loop_passes:
        engine.loop_passes = False
    engine.start()
    tid = engine._thread.native_id or 0
    if args.slice_us is not None:
        _set_slice(tid, int(args.slice_us * 1e3))
    if args.fifo_priority is not None:  # the engine thread alone, not the reflector
        os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(args.fifo_priority))
    realtime = getattr(engine, "realtime", None)
    trace = _Trace(engine, measuring) if args.trace and looped_at_start(engine) else None
    # The batched C path (sendmmsg/recvmmsg) when this tree has it and it was built.
    compiled = getattr(engine, "probe_io", None) is not None
    looped = getattr(engine, "send_loop", None) is not None
    n = args.sessions
    for ssid in range(1, n + 1):
        config = SenderConfig(ssid, interval_ns=interval, loss_timeout_ns=2 * interval)
        engine.add_session(SenderSessionSpec(config, IPv6Address("::1"), args.port))
    # Starts spread across one interval: session k at k/n of it.
    t0 = time.monotonic_ns()
    for ssid in range(1, n + 1):
        due = t0 + (ssid - 1) * interval // n
        while (ahead := due - time.monotonic_ns()) > 0:
            time.sleep(ahead / 1e9)
        engine.start_session(ssid)
    # Each schedule's origin, start + k x interval (monotonic ns), as the engine keeps it.
    with engine.lock:
        for ssid, entry in engine._entries.items():
            assert entry.start is not None
            base[ssid] = entry.start
    if args.gc_freeze:
        gc.freeze()  # the sessions' objects: out of every later collection
    time.sleep(args.warmup)
    skipped0 = sum(engine.snapshot(s).schedule.skipped for s in range(1, n + 1))
    pauses: list[tuple[int, int]] = []  # (generation, ns) of each collection measured
    began = [0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter_ns()
        else:
            pauses.append((info["generation"], time.perf_counter_ns() - began[0]))

    offset[0] = time.time_ns() - time.monotonic_ns()
    measuring[0] = True
    gc.callbacks.append(on_gc)
    if trace is not None:
        gc.callbacks.append(trace.on_gc)
    s0, c0, w0 = _cpu_ticks(), os.times(), time.monotonic()
    time.sleep(args.seconds)
    s1, c1, w1 = _cpu_ticks(), os.times(), time.monotonic()
    gc.callbacks.remove(on_gc)
    measuring[0] = False
    if trace is not None:
        gc.callbacks.remove(trace.on_gc)
    skipped = sum(engine.snapshot(s).schedule.skipped for s in range(1, n + 1)) - skipped0
    engine.shutdown()
    dp.close()
    if args.gc_freeze:
        gc.unfreeze()
    full = [ns for generation, ns in pauses if generation == 2]
    traced = {} if trace is None else trace.report(sent_at, slips)
    span = w1 - w0
    user, system = c1.user - c0.user, c1.system - c0.system
    sent = max(counts["sent"], 1)
    return {
        "tick_us": tick_us,
        "path": (
            ("C run loop, own thread" if path == "loop-thread" else "C run loop")
            if looped
            else "C (sendmmsg/recvmmsg)"
            if compiled
            else "Python"
        ),
        "sixlab": str(Path(sys.modules["sixlab"].__file__ or "").parent.parent),
        "sessions": n,
        "rate_per_session": args.rate,
        "offered_pps": n * args.rate,
        "sent_pps": round(counts["sent"] / span),
        "results_per_s": round(counts["results"] / span),
        "cpu_of_one_core": round((user + system) / span, 3),
        "cpu_us_per_probe": round((user + system) / sent * 1e6, 1),
        "user_us_per_probe": round(user / sent * 1e6, 1),
        "system_us_per_probe": round(system / sent * 1e6, 1),
        "slip_us_p50": round(_pct(slips, 50) / 1e3, 1) if slips else None,
        "slip_us_p99": round(_pct(slips, 99) / 1e3, 1) if slips else None,
        "slip_us_max": round(max(slips) / 1e3, 1) if slips else None,
        "skipped_slots": skipped,
        "gc_collections": len(pauses),
        "gc_ms_total": round(sum(ns for _, ns in pauses) / 1e6, 1),
        "gc_full_collections": len(full),
        "gc_full_ms_max": round(max(full, default=0) / 1e6, 1),
        "gc_freeze": args.gc_freeze,
        "load_average": os.getloadavg()[0],
        # Of all the guest's CPU time in the window: what the host took (steal), and
        # what went to interrupts: neither waits for a real-time thread.
        "host_steal_share": round((s1[7] - s0[7]) / max(1, sum(s1) - sum(s0)), 3),
        "irq_softirq_share": round((s1[5] + s1[6] - s0[5] - s0[6]) / max(1, sum(s1) - sum(s0)), 3),
        "sched_fifo": os.sched_getscheduler(0) == os.SCHED_FIFO,
        "engine_fifo_priority": args.fifo_priority,
        "engine_realtime": realtime,
        "loop_passes": getattr(engine, "loop_passes", None),
        "engine_slice_us": args.slice_us,
        "timer_slack_ns": getattr(engine, "timer_slack_ns", None) or "kernel default",
        "loop_slice_ms": getattr(engine, "loop_slice_ns", 0) / 1e6 if looped else None,
        **traced,
    }


def _set_slice(tid: int, ns: int) -> None:
    """``--slice-us``: the thread's EEVDF slice (``sched_setattr`` with SCHED_OTHER and
    ``sched_runtime``, Linux 6.12 on): a shorter one gives its wake-ups an earlier
    deadline, so they preempt the task on the CPU sooner."""
    import ctypes  # noqa: PLC0415
    import struct  # noqa: PLC0415

    attr = ctypes.create_string_buffer(struct.pack("=IIQiIQQQ", 48, 0, 0, 0, 0, ns, 0, 0))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(314, tid, attr, 0) != 0:  # SYS_sched_setattr on x86_64
        raise OSError(ctypes.get_errno(), "sched_setattr")


def looped_at_start(engine: Any) -> bool:
    return getattr(engine, "send_loop", None) is not None


class _Trace:
    """``--trace``: when the engine thread was in the run loop's C call (a pass while
    the engine files counts as one) and when in Python between two (filing what a call
    did, the Python timers), how late each call with a deadline returned, what each
    take held, and the garbage collector's passes, all on the monotonic clock; then,
    for every packet sent more than 1 ms after its slot, whether its slot fell in a
    Python gap (the loop sends nothing then) or while C was running."""

    def __init__(self, engine: Any, measuring: list[bool]) -> None:
        # Flat arrays, no tuples: tuples kept would be the garbage collector's work and
        # set off the passes this is to find.
        self.enters, self.exits, self.whys = array("q"), array("q"), array("q")
        self.overrun = array("q")  # how long after its ``until`` each call returned
        self.take_records = array("q")
        self.gcs: list[tuple[int, int, int]] = []  # (start, stop, generation)
        self._gc_start = 0
        loop = engine.send_loop
        run, take = loop.run, engine._take
        enters, exits, whys, overrun = self.enters, self.exits, self.whys, self.overrun
        take_records, clock = self.take_records, time.monotonic_ns

        def traced_run(*a: Any, **k: Any) -> int:
            t = clock()
            why: int = run(*a, **k)
            if measuring[0]:
                left = clock()
                enters.append(t)
                exits.append(left)
                whys.append(why)
                if a[1] > 0:  # not a pass while the engine files (``until`` 0)
                    overrun.append(left - a[1])
            return why

        def traced_take(loop: Any) -> Any:
            took = take(loop)
            if measuring[0]:
                take_records.append(took[0].records)
            return took

        loop.run = traced_run
        engine._take = traced_take

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.monotonic_ns()
        else:
            self.gcs.append((self._gc_start, time.monotonic_ns(), info["generation"]))

    def report(self, sent_at: list[int], slips: list[int]) -> dict[str, Any]:
        import bisect  # noqa: PLC0415

        enters, exits = self.enters, self.exits
        calls = list(zip(enters, exits, self.whys, strict=True))
        lens = [enters[i + 1] - exits[i] for i in range(len(calls) - 1)]
        in_c = [b - a for a, b in zip(enters, exits, strict=True)]
        late = waited = waited_gc = 0
        waited_gaps: list[int] = []
        in_call: list[int] = []  # how long after its call began a late packet's slot was
        for t, slip in zip(sent_at, slips, strict=True):
            if slip <= 1_000_000:
                continue
            late += 1
            slot = t - slip
            i = bisect.bisect_right(enters, t) - 1  # the call that sent it
            if i < 0:
                continue
            if slot < calls[i][0] and i > 0:  # due before that call: it waited the gap
                waited += 1
                a, b = calls[i - 1][1], calls[i][0]
                waited_gaps.append(b - a)
                if any(s < b and e > a for s, e, _ in self.gcs):
                    waited_gc += 1
            else:
                in_call.append(slot - calls[i][0])
        recs = list(self.take_records)
        whys: dict[int, int] = {}
        for _, _, why in calls:
            whys[why] = whys.get(why, 0) + 1
        return {
            "trace_calls": len(calls),
            "trace_returns_by_why": whys,
            "trace_in_c_us_p50": round(_pct(in_c, 50) / 1e3, 1) if in_c else None,
            "trace_gap_us_p50_p99_max": [
                round(_pct(lens, 50) / 1e3, 1),
                round(_pct(lens, 99) / 1e3, 1),
                round(max(lens) / 1e3, 1),
            ]
            if lens
            else None,
            "trace_overrun_us_p50_p99_max": [
                round(_pct(list(self.overrun), 50) / 1e3, 1),
                round(_pct(list(self.overrun), 99) / 1e3, 1),
                round(max(self.overrun) / 1e3, 1),
            ]
            if self.overrun
            else None,
            "trace_gc_ms_by_generation": {
                g: [round((e - s) / 1e6, 2) for s, e, gen in self.gcs if gen == g]
                for g in (0, 1, 2)
            },
            "trace_calls_overrun_over_500us": sum(o > 500_000 for o in self.overrun),
            "trace_gap_share": round(sum(lens) / max(1, calls[-1][1] - calls[0][0]), 3)
            if calls
            else None,
            "trace_records_per_take_p50_max": [_pct(recs, 50), max(recs)] if recs else None,
            "trace_late_over_1ms": late,
            "trace_late_due_before_its_call": waited,
            "trace_late_waited_gap_with_gc": waited_gc,
            "trace_late_waited_gap_us_p50": round(_pct(waited_gaps, 50) / 1e3, 1)
            if waited_gaps
            else None,
            "trace_late_due_in_its_call_us_after_entry_p50": round(_pct(in_call, 50) / 1e3, 1)
            if in_call
            else None,
        }


def floor(args: argparse.Namespace, tick_us: float) -> dict[str, Any]:
    """The same packets at the same rate and tick through the kernel with no engine: one
    ``sendto`` per probe and ``recvmsg`` until the socket is empty, once per tick, on a
    socket with the socket plane's options. What is left per probe is the kernel's send
    (on loopback it also delivers to the reflector's socket) and receive, the wake-ups,
    and the least Python can do around them."""
    import socket  # noqa: PLC0415
    import struct  # noqa: PLC0415

    from sixlab.dataplane import udpsocket as u  # noqa: PLC0415

    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, u.SO_TIMESTAMPNS, 1)
    for option in (u.IPV6_RECVHOPLIMIT, u.IPV6_RECVPKTINFO, u.IPV6_RECVTCLASS):
        sock.setsockopt(socket.IPPROTO_IPV6, option, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(("::", 0))
    sock.setblocking(False)
    head = struct.Struct("!IQHH28x")
    pps = args.sessions * args.rate
    tick = max(tick_us * 1e-6, 1 / pps)
    address = ("::1", args.port)

    def drain() -> int:
        got = 0
        while True:
            try:
                sock.recvmsg(9000, 256)
            except BlockingIOError:
                return got
            got += 1

    sent = received = 0
    begin = time.monotonic()
    end = begin + args.warmup + args.seconds
    c0 = w0 = None
    n0 = r0 = 0
    while (now := time.monotonic()) < end:
        if c0 is None and now >= begin + args.warmup:
            c0, w0, n0, r0 = os.times(), now, sent, received
        for _ in range(int((now - begin) * pps) - sent):
            sock.sendto(head.pack(sent & 0xFFFF_FFFF, 0, 1, 1 + sent % 1000), address)
            sent += 1
        received += drain()
        time.sleep(max(0.0, begin + (int((now - begin) / tick) + 1) * tick - time.monotonic()))
    c1, w1 = os.times(), time.monotonic()
    sock.close()
    assert c0 is not None
    assert w0 is not None
    span, n = w1 - w0, max(sent - n0, 1)
    user, system = c1.user - c0.user, c1.system - c0.system
    return {
        "floor": "sendto + recvmsg, no engine",
        "tick_us": tick_us,
        "offered_pps": pps,
        "sent_pps": round((sent - n0) / span),
        "results_per_s": round((received - r0) / span),
        "cpu_of_one_core": round((user + system) / span, 3),
        "cpu_us_per_probe": round((user + system) / n * 1e6, 1),
        "user_us_per_probe": round(user / n * 1e6, 1),
        "system_us_per_probe": round(system / n * 1e6, 1),
        "load_average": os.getloadavg()[0],
    }


def c_floor(args: argparse.Namespace, tick_us: float) -> dict[str, Any]:
    """The same probes at the same rate and tick from ``sender_floor.c`` (built with
    ``sixlab.linux.ccbuild.build_c``): ``sendmmsg`` batches per tick, ``recvmmsg``
    draining with the control messages and reply fields decoded and matched, no Python
    in the loop. What the engine's C path would cost with nothing but that I/O."""
    from sixlab.linux.ccbuild import build_c, cache_dir  # noqa: PLC0415

    binary = build_c(Path(__file__).with_name("sender_floor.c"), cache_dir("bench"))
    pps = args.sessions * args.rate
    argv = [str(binary), str(args.port), str(pps), str(tick_us)]
    argv += [str(args.warmup), str(args.seconds), str(args.sessions)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    out = json.loads(done.stdout)
    span, n = out["span_s"], max(out["sent"], 1)
    user, system = out["user_s"], out["system_s"]
    return {
        "floor": "C: sendmmsg + recvmmsg per tick, no Python",
        "tick_us": tick_us,
        "offered_pps": pps,
        "sent_pps": round(out["sent"] / span),
        "results_per_s": round(out["matched"] / span),
        "cpu_of_one_core": round((user + system) / span, 3),
        "cpu_us_per_probe": round((user + system) / n * 1e6, 1),
        "user_us_per_probe": round(user / n * 1e6, 1),
        "system_us_per_probe": round(system / n * 1e6, 1),
        "wakeups_per_s": round(out["wakeups"] / span),
        "slip_us_p50": out["slip_us_p50"],
        "slip_us_p99": out["slip_us_p99"],
        "slip_us_max": out["slip_us_max"],
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "reflector":
        _reflector(int(sys.argv[2]))
        return
    from sixlab.dataplane.engine import DEFAULT_TICK_NS  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=10.0, help="packets/s per session")
    parser.add_argument("--seconds", type=float, default=20.0, help="measuring window")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument(
        "--port", type=int, default=0,
        help="the reflector's UDP port on ::1 (default: an ephemeral one, so that two runs"
        " on one machine do not collide)",
    )  # fmt: skip
    parser.add_argument(
        "--tick-us", default=str(DEFAULT_TICK_NS / 1e3),
        help="the engine's tick (µs); a comma-separated list runs each in turn, side by side",
    )  # fmt: skip
    parser.add_argument("--repeat", type=int, default=1, help="rounds over the tick list")
    parser.add_argument(
        "--timer-slack-ns", type=int, default=None,
        help="the engine thread's timer slack in ns (PR_SET_TIMERSLACK; unset or 0: "
        "the kernel's default, 50 µs)",
    )  # fmt: skip
    parser.add_argument(
        "--python-path", action="store_true",
        help="the engine's pure-Python probe path even where the C one builds",
    )  # fmt: skip
    parser.add_argument(
        "--paths", default=None,
        help="comma-separated engine paths to run in turn for each tick: loop (the compiled"
        " run loop), loop-thread (the same on a thread of its own), compiled (C send/receive,"
        " Python schedule), python",
    )  # fmt: skip
    parser.add_argument(
        "--loop-slice-ms", type=float, default=None,
        help="the longest one call of the compiled run loop lasts (engine default: 2 ms)",
    )  # fmt: skip
    parser.add_argument(
        "--gc-freeze", action="store_true",
        help="gc.freeze() once the sessions are started: what the garbage collector's "
        "full passes over them cost the schedule",
    )  # fmt: skip
    parser.add_argument(
        "--slice-us", type=float, default=None,
        help="the engine thread's EEVDF slice in µs (sched_setattr; default: the kernel's)",
    )  # fmt: skip
    parser.add_argument(
        "--realtime-priority", type=int, default=None,
        help="SenderEngine(realtime_priority=...): the engine thread under SCHED_FIFO",
    )  # fmt: skip
    parser.add_argument(
        "--fifo-priority", type=int, default=None,
        help="run the engine thread alone (not the process, not the reflector) as SCHED_FIFO"
        " at this priority",
    )  # fmt: skip
    parser.add_argument(
        "--no-loop-passes", action="store_true",
        help="no passes of the run loop while the engine files a call's records",
    )  # fmt: skip
    parser.add_argument(
        "--trace", action="store_true",
        help="with the run loop: time in C and in Python between its calls, and where each"
        " packet sent over 1 ms late had its slot (in a Python gap or while C ran)",
    )  # fmt: skip
    parser.add_argument(
        "--floor", action="store_true",
        help="also run each tick with bare sendto/recvmsg and no engine (the kernel's share)",
    )  # fmt: skip
    parser.add_argument(
        "--c-floor", action="store_true",
        help="also run each tick from sender_floor.c: sendmmsg/recvmmsg batches per tick, "
        "replies decoded and matched, no Python (what the kernel alone takes)",
    )  # fmt: skip
    parser.add_argument(
        "--no-engine", action="store_true",
        help="run only the floors asked for (--floor, --c-floor), not the engine",
    )  # fmt: skip
    args = parser.parse_args()
    ticks = [float(x) for x in args.tick_us.split(",")]
    paths: list[str | None] = list(args.paths.split(",")) if args.paths else [None]
    if not set(paths) <= {None, "loop", "loop-thread", "compiled", "python"}:
        parser.error(f"--paths: loop, loop-thread, compiled or python, not {args.paths}")
    reflector = subprocess.Popen(
        [sys.executable, __file__, "reflector", str(args.port)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert reflector.stdout is not None
        ready = reflector.stdout.readline().split()
        if ready[:1] != ["ready"]:
            sys.exit(f"bench_sender: the reflector did not start: {' '.join(ready)!r}")
        args.port = int(ready[1])
        for _ in range(args.repeat):
            for tick in ticks:
                if not args.no_engine:
                    for path in paths:
                        print(json.dumps(run(args, tick, path)), flush=True)
                if args.floor:
                    print(json.dumps(floor(args, tick)), flush=True)
                if args.c_floor:
                    print(json.dumps(c_floor(args, tick)), flush=True)
    finally:
        assert reflector.stdin is not None
        reflector.stdin.close()
        reflector.wait(10)


if __name__ == "__main__":
    main()
