"""``sixlab stamp sender`` and ``sixlab stamp reflector``: one measurement, now.

Like ping or twping: the reflector answers any RFC 8762 Session-Sender until
interrupted; the sender runs one session, prints each result as it arrives and a
summary (or one JSON document with ``--json``).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from sixlab import stamp as ev
from sixlab.cli import _argtypes as at
from sixlab.dataplane.base import DataplaneConfig, DataplaneError, available, create
from sixlab.dataplane.engine import (
    ReflectorEngine,
    SenderEngine,
    SenderSessionSpec,
    SessionSnapshot,
)
from sixlab.linux import FlowCounters, LinuxError
from sixlab.linux.signals import StopOnSignal
from sixlab.stamp import DataLoss, data_loss_total, per_flow_stats
from sixlab.stamp.reflector import (
    Reflector,
    ReflectorCounters,
    ReflectorMode,
    ReflectorSessionConfig,
)
from sixlab.stamp.sender import SenderConfig, SenderCounters
from sixlab.stamp.stats import DelaySummary, PathStats, summarize
from sixlab.wire import stamp_tlv as tlv
from sixlab.wire.stamp import STAMP_PORT
from sixlab.wire.timestamp import TimestampFormat

__all__ = ["add_parsers"]

IPv6Address = ipaddress.IPv6Address
NS_PER_S = 1_000_000_000


def add_parsers(stamp: Any) -> None:
    planes = available()
    r = stamp.add_parser("reflector", help="answer STAMP Session-Senders until interrupted")
    r.add_argument(
        "--listen", type=at.ip, default=None, help="IPv4 or IPv6 address to listen on (any)"
    )
    r.add_argument("--port", type=at.port, default=STAMP_PORT)
    r.add_argument("--dataplane", choices=planes, default="socket")
    r.add_argument(
        "--interface", type=at.text, default=None, help="interface to capture on (capture planes)"
    )
    r.add_argument("--stateful", action="store_true", help="own Seq counter (RFC 8762 §4.3.1)")
    r.add_argument(
        "--auth-key", type=at.hex_key, default=None, help="HMAC key, hex (authenticated)"
    )
    r.add_argument("--ptp", action="store_true", help="PTPv2 timestamps (default NTP)")
    r.add_argument("--return-segments", type=at.sid_list, default=None, help="return SID list")
    r.add_argument("--ssid", type=at.ssid, default=None, help="answer only this SSID")
    _dm_arguments(r, "reflector")
    r.set_defaults(handler=_run_reflector)

    s = stamp.add_parser("sender", help="run one STAMP session and print the delays")
    s.add_argument(
        "reflector",
        type=at.ip,
        nargs="?",
        default=None,
        help="the reflector's IPv4 or IPv6 address (none with --loopback)",
    )
    s.add_argument("--port", type=at.port, default=STAMP_PORT, help="the reflector's port")
    s.add_argument("--source", type=at.ip, default=None)
    s.add_argument("--source-port", type=at.port, default=0)
    s.add_argument("--segments", type=at.sid_list, default=None, help="SID list to the reflector")
    s.add_argument(
        "--return-segments",
        type=at.sid_list,
        default=None,
        help="ask the reflector to answer along this SID list (RFC 9503 Return Path TLV)",
    )
    s.add_argument(
        "--count",
        type=at.integer(1, at.MAX_COUNT, "a packet count"),
        default=10,
        help="packets to send (default 10)",
    )
    s.add_argument(
        "--interval", type=at.interval, default=1.0, help="seconds between packets (default 1)"
    )
    s.add_argument(
        "--timeout", type=at.timeout, default=2.0, help="loss timeout, seconds (default 2)"
    )
    s.add_argument("--ssid", type=at.ssid, default=1)
    s.add_argument("--auth-key", type=at.hex_key, default=None)
    s.add_argument(
        "--strict-ssid",
        action="store_true",
        help="refuse replies whose SSID is 0 (by default they are accepted when address, "
        "port, Seq and T1 match: an RFC 8762-only reflector returns the SSID as 0)",
    )
    s.add_argument(
        "--stateful-reflector",
        action="store_true",
        help="the reflector is stateful (RFC 8762 §4.3.1): split the loss into forward "
        "and backward",
    )
    s.add_argument("--ptp", action="store_true")
    s.add_argument("--dataplane", choices=planes, default="socket")
    s.add_argument(
        "--interface", type=at.text, default=None, help="interface to capture on (capture planes)"
    )
    s.add_argument("--json", action="store_true", help="one JSON document at the end")
    s.add_argument(
        "--loopback",
        action="store_true",
        help="loopback mode (docs/srpm.md): --segments lead the packets back to --source, "
        "no reflector; only the round trip is measured",
    )
    s.add_argument(
        "--flow-labels",
        type=at.flow_labels,
        default=(),
        metavar="N|L1,L2,...",
        help="spread the packets over IPv6 flow labels (N: labels 1..N) and report each "
        "label apart (ECMP coverage)",
    )
    _dm_arguments(s, "sender")
    s.set_defaults(handler=_run_sender)


def _dm_arguments(parser: Any, role: str) -> None:
    """Direct-mode loss (RFC 8972 §4.5, docs/srpm.md): the data flow this side counts."""
    parser.add_argument(
        "--dm-sent",
        type=at.flow_match,
        default=None,
        metavar="PREFIX[,udp|tcp[,PORT]]",
        help=f"direct-mode loss: data packets this {role} sends to PREFIX (nftables counts "
        "them; needs root)",
    )
    parser.add_argument(
        "--dm-received",
        type=at.flow_match,
        default=None,
        metavar="PREFIX[,udp|tcp[,PORT]]",
        help=f"direct-mode loss: data packets this {role} receives for PREFIX",
    )


def _counters(args: argparse.Namespace, role: str) -> FlowCounters | None:
    """The data-flow counters the arguments ask for, installed (or None)."""
    if args.dm_sent is None and args.dm_received is None:
        return None
    counters = FlowCounters(f"sixlab_dm_cli_{role}", tx=args.dm_sent, rx=args.dm_received)
    counters.install()
    return counters


def _fmt(ptp: bool) -> TimestampFormat:
    return TimestampFormat.PTP if ptp else TimestampFormat.NTP


def _run_reflector(args: argparse.Namespace) -> int:
    config = ReflectorSessionConfig(
        ssid=args.ssid,
        mode=ReflectorMode.STATEFUL if args.stateful else ReflectorMode.STATELESS,
        key=args.auth_key,
        fmt=_fmt(args.ptp),
        return_segments=args.return_segments,
    )
    plane = create(
        args.dataplane,
        DataplaneConfig(port=args.port, interface=args.interface, source=args.listen),
    )
    try:
        plane.open()
    except DataplaneError as exc:
        print(f"sixlab stamp reflector: {exc}", file=sys.stderr)
        return 1
    reflector = Reflector()
    engine = ReflectorEngine(plane, reflector)
    try:
        counters = _counters(args, "reflector")
    except LinuxError as exc:
        plane.close()
        print(f"sixlab stamp reflector: {exc}", file=sys.stderr)
        return 1
    if counters is not None and args.ssid is None:
        plane.close()
        counters.remove()
        print("sixlab stamp reflector: --dm-sent/--dm-received need --ssid", file=sys.stderr)
        return 2
    try:  # through the engine: a plane that answers in the kernel needs the session too
        if args.ssid is None:
            engine.set_default(config)
        else:
            engine.add_session(config, data_counters=counters.read if counters else None)
    except DataplaneError as exc:
        plane.close()
        if counters is not None:
            counters.remove()
        print(f"sixlab stamp reflector: {exc}", file=sys.stderr)
        return 1
    kernel: dict[str, int] = {}
    with StopOnSignal() as stop:
        engine.start()
        print(
            f"reflecting on [{args.listen or '::'}]:{args.port} with the {args.dataplane} "
            "data plane",
            file=sys.stderr,
        )
        try:
            stop.wait(alive=lambda: engine.running)
        finally:
            engine.shutdown()
            with contextlib.suppress(DataplaneError):
                kernel = plane.counters()
            plane.close()
            if counters is not None:
                counters.remove()
    _print_reflector_counters(args, reflector.counters, kernel)
    if engine.error is not None:
        print(f"sixlab stamp reflector: {engine.error}", file=sys.stderr)
        return 1
    return 0


def _print_reflector_counters(
    args: argparse.Namespace, c: ReflectorCounters, kernel: dict[str, int]
) -> None:
    drops = ", ".join(f"{k}={v}" for k, v in sorted(c.dropped.items())) or "none"
    print(f"received {c.received}, reflected {c.reflected}, dropped: {drops}", file=sys.stderr)
    if c.integrity_failed:  # answered without acting on their TLVs (RFC 8972 §4.8)
        print(f"HMAC TLV failures: {c.integrity_failed}", file=sys.stderr)
    if kernel:  # packets the plane answered or dropped itself (xdp), never seen above
        handled = ", ".join(f"{k}={v}" for k, v in sorted(kernel.items()))
        print(f"{args.dataplane} data plane: {handled}", file=sys.stderr)


def _summary_json(s: DelaySummary | None) -> dict[str, int] | None:
    if s is None:
        return None
    return {"min": s.min_ns, "mean": s.mean_ns, "p50": s.p50_ns, "p99": s.p99_ns, "max": s.max_ns}


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.3f}"


def _hostport(address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    return f"{address}:{port}" if address.version == 4 else f"[{address}]:{port}"


def _notes(c: SenderCounters) -> list[str]:
    """The summary lines beyond the counts: loss split, SSID 0, integrity, drops."""
    out = []
    if c.forward_lost is not None:
        out.append(
            f"loss: {c.forward_lost} forward, {c.backward_lost} backward, "
            f"{c.unclassified_lost} not yet placed (lost after the last reply)"
        )
    if c.reflector_ssid_zero:
        out.append(
            f"reflector_ssid_zero: {c.ssid_zero} replies had SSID 0: the reflector implements "
            "RFC 8762 but not RFC 8972 (matched by address, port, Seq and T1; --strict-ssid "
            "refuses them)"
        )
    refused = c.dropped.get(ev.DropReason.SSID_ZERO, 0)
    if refused:
        out.append(
            f"{refused} replies had SSID 0 (an RFC 8762-only reflector) and were refused "
            "(--strict-ssid)"
        )
    if c.integrity_reported:
        out.append(
            f"integrity: the reflector could not verify our HMAC TLV in {c.integrity_reported} "
            "replies (I flag)"
        )
    if c.dropped:
        drops = ", ".join(f"{k}={v}" for k, v in sorted(c.dropped.items()))
        out.append(f"replies dropped: {drops}")
    return out


def _sender_config(args: argparse.Namespace, tlvs: bytes) -> SenderConfig:
    return SenderConfig(
        ssid=args.ssid,
        interval_ns=round(args.interval * NS_PER_S),
        count=args.count,
        fmt=_fmt(args.ptp),
        key=args.auth_key,
        tlvs=tlvs,
        loss_timeout_ns=round(args.timeout * NS_PER_S),
        reflector_stateful=args.stateful_reflector,
        strict_ssid=args.strict_ssid,
        loopback=args.loopback,
        flow_labels=args.flow_labels,
        direct_measurement=args.dm_sent is not None or args.dm_received is not None,
    )


def _address_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the sender's addresses (``args.reflector`` is set to the
    source in loopback mode), or None."""
    if args.loopback:
        if args.reflector is not None or args.source is None or not args.segments:
            return (
                "--loopback takes no REFLECTOR; it needs --source (this host's address, "
                "where the packets come back) and --segments (the loop)"
            )
        args.reflector = args.source
    elif args.reflector is None:
        return "REFLECTOR is required (or --loopback)"
    ipv4 = [a for a in (args.reflector, args.source) if isinstance(a, ipaddress.IPv4Address)]
    if ipv4 and (args.segments or args.return_segments):
        return "SRv6 segments need IPv6 addresses"
    if args.source is not None and args.source.version != args.reflector.version:
        return "--source and REFLECTOR are of different families"
    return None


def _printer(args: argparse.Namespace) -> Callable[[ev.Event], None]:
    """What the sender prints per result and lost packet (nothing with --json)."""

    def show(event: ev.Event) -> None:
        if args.json:
            return
        if isinstance(event, ev.StampResult):
            label = "" if event.flow_label is None else f" flow_label={event.flow_label:#x}"
            if event.loopback:
                print(f"seq={event.seq} rtt={_ms(event.rtt_ns)} ms{label}", flush=True)
                return
            print(
                f"seq={event.seq} direct={_ms(event.direct_ns)} ms "
                f"return={_ms(event.return_ns)} ms rtt={_ms(event.rtt_ns)} ms "
                f"ttl={event.ses_sender_ttl}{label}",
                flush=True,
            )
        elif isinstance(event, ev.PacketLost):
            print(f"seq={event.seq} lost", flush=True)

    return show


def _srpm_json(flows: dict[int, PathStats], data: DataLoss | None) -> dict[str, Any]:
    """The ``--json`` keys of per-flow-label results and direct-mode loss (docs/srpm.md)."""
    return {
        "flows": {
            str(label): {
                "received": st.received,
                "lost": st.lost,
                "direct": _summary_json(st.direct),
                "rtt": _summary_json(st.rtt),
            }
            for label, st in flows.items()
        },
        "data_loss": None
        if data is None
        else {
            "forward_sent": data.forward_sent,
            "forward_lost": data.forward_lost,
            "backward_sent": data.backward_sent,
            "backward_lost": data.backward_lost,
        },
    }


def _srpm_lines(flows: dict[int, PathStats], data: DataLoss | None) -> list[str]:
    """The summary lines of per-flow-label results and direct-mode loss."""
    out = []
    for label, st in flows.items():
        one_way = "" if st.direct is None else f" direct mean {_ms(st.direct.mean_ns)} ms,"
        trip = "—" if st.rtt is None else f"{_ms(st.rtt.mean_ns)} ms"
        out.append(
            f"flow label {label:#x}:{one_way} round trip mean {trip}, "
            f"{st.received} received, {st.lost} lost"
        )
    if data is not None:
        back_lost = "?" if data.backward_lost is None else data.backward_lost
        out.append(
            f"data loss: forward {data.forward_lost} of {data.forward_sent}, "
            f"backward {back_lost} of {data.backward_sent} (Direct Measurement, RFC 8972 §4.5)"
        )
    return out


def _report_sender(
    args: argparse.Namespace,
    port: int,
    snap: SessionSnapshot,
    *,
    records: list[ev.StampResult],
    lost_seqs: list[int],
    kernel: dict[str, int],
) -> None:
    """The sender's summary: one JSON document, or text lines."""
    c = snap.counters
    flows = per_flow_stats(records, args.flow_labels, lost_seqs) if args.flow_labels else {}
    data = data_loss_total((r.seq, r.t1_ns, r.data) for r in records if r.data is not None)
    if args.loopback:
        records = [r for r in records if r.loopback]
    direct = None if args.loopback else summarize(r.direct_ns for r in records)
    back = None if args.loopback else summarize(r.return_ns for r in records)
    rtt = summarize(r.rtt_ns for r in records)
    if args.json:
        doc = {
            "sent": c.sent,
            "received": c.received,
            "lost": c.lost,
            "duplicates": c.duplicates,
            "reordered": c.reordered,
            "forward_lost": c.forward_lost,
            "backward_lost": c.backward_lost,
            "unclassified_lost": c.unclassified_lost,
            "reflector_ssid_zero": c.reflector_ssid_zero,
            "ssid_zero_replies": c.ssid_zero,
            "integrity_reported": c.integrity_reported,
            "dropped": {str(k): v for k, v in sorted(c.dropped.items())},
            "dataplane": kernel,
            "records": [r.as_json() for r in records],
            "summary": {
                "direct": _summary_json(direct),
                "return": _summary_json(back),
                "rtt": _summary_json(rtt),
            },
            "loopback": args.loopback,
            **_srpm_json(flows, data),
        }
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        where = _hostport(args.reflector, port)
        print(f"--- {'loopback to ' if args.loopback else ''}{where} STAMP statistics ---")
        print(f"{c.sent} sent, {c.received} received, {c.lost} lost, {c.duplicates} duplicates")
        for line in _notes(c):
            print(line)
        if kernel:  # replies the plane collected itself (xdp), before the session saw them
            handled = ", ".join(f"{k}={v}" for k, v in sorted(kernel.items()))
            print(f"{args.dataplane} data plane: {handled}")
        for name, s in (("direct", direct), ("return", back), ("round trip", rtt)):
            if s is not None:
                print(
                    f"{name}: min/mean/p50/p99/max = {_ms(s.min_ns)}/{_ms(s.mean_ns)}/"
                    f"{_ms(s.p50_ns)}/{_ms(s.p99_ns)}/{_ms(s.max_ns)} ms"
                )
        for line in _srpm_lines(flows, data):
            print(line)


def _checked_sender_config(args: argparse.Namespace) -> SenderConfig | str:
    """The sender session's configuration, or what is wrong with the arguments."""
    problem = _address_error(args)
    if problem is not None:
        return problem
    tlvs = b""
    if args.return_segments:
        tlvs = tlv.ReturnPath((tlv.Srv6SegmentList(args.return_segments),)).to_tlv().encode()
    try:
        return _sender_config(args, tlvs)
    except ev.SessionConfigError as exc:
        return str(exc)


def _run_sender(args: argparse.Namespace) -> int:
    config = _checked_sender_config(args)
    if isinstance(config, str):
        print(f"sixlab stamp sender: {config}", file=sys.stderr)
        return 2
    plane = create(
        args.dataplane,
        DataplaneConfig(port=args.source_port, interface=args.interface, source=args.source),
    )
    try:
        plane.open()
    except DataplaneError as exc:
        print(f"sixlab stamp sender: {exc}", file=sys.stderr)
        return 1

    try:
        counters = _counters(args, "sender")
    except LinuxError as exc:
        plane.close()
        print(f"sixlab stamp sender: {exc}", file=sys.stderr)
        return 1
    engine = SenderEngine(plane, on_event=_printer(args))
    port = plane.local_port if args.loopback else args.port
    spec = SenderSessionSpec(
        config,
        args.reflector,
        port,
        args.segments,
        args.source,
        data_counters=counters.read if counters else None,
    )
    try:
        engine.add_session(spec)
    except ev.SessionConfigError as exc:
        plane.close()
        if counters is not None:
            counters.remove()
        print(f"sixlab stamp sender: {exc}", file=sys.stderr)
        return 2
    engine.start()
    try:
        _run_session(args, engine)
    finally:
        records = engine.results(args.ssid)
        snap = engine.snapshot(args.ssid)
        lost_seqs = [p.seq for p in engine.lost(args.ssid)]
        engine.shutdown()
        kernel: dict[str, int] = {}
        with contextlib.suppress(DataplaneError):
            kernel = plane.counters()
        plane.close()
        if counters is not None:
            counters.remove()
    _report_sender(args, port, snap, records=records, lost_seqs=lost_seqs, kernel=kernel)
    if engine.error is not None:
        print(f"sixlab stamp sender: {engine.error}", file=sys.stderr)
        return 1
    return 0 if snap.counters.received else 1


def _run_session(args: argparse.Namespace, engine: SenderEngine) -> None:
    """Start the session; wait until it ends (or Ctrl-C stops it)."""
    try:
        engine.start_session(args.ssid)
        deadline = args.count * args.interval + args.timeout + 5
        start = time.monotonic()
        while not engine.wait_finished(args.ssid, 0.2):
            if time.monotonic() - start > deadline or not engine.running:
                break
    except KeyboardInterrupt:
        engine.stop_session(args.ssid)
