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
from typing import Any

from sixlab import stamp as ev
from sixlab.cli import _argtypes as at
from sixlab.dataplane.base import DataplaneConfig, DataplaneError, available, create
from sixlab.dataplane.engine import ReflectorEngine, SenderEngine, SenderSessionSpec
from sixlab.linux.signals import StopOnSignal
from sixlab.stamp.reflector import Reflector, ReflectorMode, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig, SenderCounters
from sixlab.stamp.stats import DelaySummary, summarize
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
    r.add_argument("--interface", default=None, help="interface to capture on (capture planes)")
    r.add_argument("--stateful", action="store_true", help="own Seq counter (RFC 8762 §4.3.1)")
    r.add_argument(
        "--auth-key", type=at.hex_key, default=None, help="HMAC key, hex (authenticated)"
    )
    r.add_argument("--ptp", action="store_true", help="PTPv2 timestamps (default NTP)")
    r.add_argument("--return-segments", type=at.sid_list, default=None, help="return SID list")
    r.add_argument("--ssid", type=at.ssid, default=None, help="answer only this SSID")
    r.set_defaults(handler=_run_reflector)

    s = stamp.add_parser("sender", help="run one STAMP session and print the delays")
    s.add_argument("reflector", type=at.ip, help="the reflector's IPv4 or IPv6 address")
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
    s.add_argument("--count", type=int, default=10)
    s.add_argument("--interval", type=at.seconds, default=1.0, help="seconds between packets")
    s.add_argument("--timeout", type=at.seconds, default=2.0, help="loss timeout, seconds")
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
    s.add_argument("--interface", default=None, help="interface to capture on (capture planes)")
    s.add_argument("--json", action="store_true", help="one JSON document at the end")
    s.set_defaults(handler=_run_sender)


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
    try:  # through the engine: a plane that answers in the kernel needs the session too
        if args.ssid is None:
            engine.set_default(config)
        else:
            engine.add_session(config)
    except DataplaneError as exc:
        plane.close()
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
    c = reflector.counters
    drops = ", ".join(f"{k}={v}" for k, v in sorted(c.dropped.items())) or "none"
    print(f"received {c.received}, reflected {c.reflected}, dropped: {drops}", file=sys.stderr)
    if c.integrity_failed:  # answered without acting on their TLVs (RFC 8972 §4.8)
        print(f"HMAC TLV failures: {c.integrity_failed}", file=sys.stderr)
    if kernel:  # packets the plane answered or dropped itself (xdp), never seen above
        handled = ", ".join(f"{k}={v}" for k, v in sorted(kernel.items()))
        print(f"{args.dataplane} data plane: {handled}", file=sys.stderr)
    if engine.error is not None:
        print(f"sixlab stamp reflector: {engine.error}", file=sys.stderr)
        return 1
    return 0


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


def _run_sender(args: argparse.Namespace) -> int:
    if args.count <= 0:
        print("sixlab stamp sender: --count must be positive", file=sys.stderr)
        return 2
    ipv4 = [a for a in (args.reflector, args.source) if isinstance(a, ipaddress.IPv4Address)]
    if ipv4 and (args.segments or args.return_segments):
        print("sixlab stamp sender: SRv6 segments need IPv6 addresses", file=sys.stderr)
        return 2
    if args.source is not None and args.source.version != args.reflector.version:
        print(
            "sixlab stamp sender: --source and REFLECTOR are of different families", file=sys.stderr
        )
        return 2
    tlvs = b""
    if args.return_segments:
        tlvs = tlv.ReturnPath((tlv.Srv6SegmentList(args.return_segments),)).to_tlv().encode()
    config = SenderConfig(
        ssid=args.ssid,
        interval_ns=round(args.interval * NS_PER_S),
        count=args.count,
        fmt=_fmt(args.ptp),
        key=args.auth_key,
        tlvs=tlvs,
        loss_timeout_ns=round(args.timeout * NS_PER_S),
        reflector_stateful=args.stateful_reflector,
        strict_ssid=args.strict_ssid,
    )
    plane = create(
        args.dataplane,
        DataplaneConfig(port=args.source_port, interface=args.interface, source=args.source),
    )
    try:
        plane.open()
    except DataplaneError as exc:
        print(f"sixlab stamp sender: {exc}", file=sys.stderr)
        return 1

    def show(event: ev.Event) -> None:
        if args.json:
            return
        if isinstance(event, ev.StampResult):
            print(
                f"seq={event.seq} direct={_ms(event.direct_ns)} ms "
                f"return={_ms(event.return_ns)} ms rtt={_ms(event.rtt_ns)} ms "
                f"ttl={event.ses_sender_ttl}",
                flush=True,
            )
        elif isinstance(event, ev.PacketLost):
            print(f"seq={event.seq} lost", flush=True)

    engine = SenderEngine(plane, on_event=show)
    spec = SenderSessionSpec(config, args.reflector, args.port, args.segments, args.source)
    engine.add_session(spec)
    engine.start()
    try:
        engine.start_session(args.ssid)
        deadline = args.count * args.interval + args.timeout + 5
        start = time.monotonic()
        while not engine.wait_finished(args.ssid, 0.2):
            if time.monotonic() - start > deadline or not engine.running:
                break
    except KeyboardInterrupt:
        engine.stop_session(args.ssid)
    finally:
        records = engine.results(args.ssid)
        snap = engine.snapshot(args.ssid)
        engine.shutdown()
        kernel: dict[str, int] = {}
        with contextlib.suppress(DataplaneError):
            kernel = plane.counters()
        plane.close()
    c = snap.counters
    direct = summarize(r.direct_ns for r in records)
    back = summarize(r.return_ns for r in records)
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
        }
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        where = _hostport(args.reflector, args.port)
        print(f"--- {where} STAMP statistics ---")
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
    if engine.error is not None:
        print(f"sixlab stamp sender: {engine.error}", file=sys.stderr)
        return 1
    return 0 if c.received else 1
