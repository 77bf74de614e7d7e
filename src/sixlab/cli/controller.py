"""``sixlab controller``: run the SDN controller, and drive it through its northbound API.

::

    sixlab controller serve --db /var/lib/sixlab/controller.db --metrics 127.0.0.1:9464
    sixlab controller node add s1 '[::1]:50051' --role sender
    sixlab controller node add r1 '[::1]:50052' --role reflector
    sixlab controller node init s1 --source ::1
    sixlab controller node init r1 --source ::1
    sixlab controller session create path-a --sender s1 --reflector r1 \\
        --reflector-address fc00:3::1 --segments fc00:2::100,fc00:3::1 --count 100
    sixlab controller session start path-a
    sixlab controller session wait path-a --timeout 30
    sixlab controller stats path-a           # a table; --json for programs
    sixlab controller results path-a --json

``serve`` opens the store (SQLite, WAL), resumes collecting the sessions that were
running when it last stopped (or was killed), serves the northbound gRPC API and,
with ``--metrics``, Prometheus metrics over HTTP. Once it listens it prints one line to
stdout, ``controller: grpc=ADDR db=PATH resumed=N``, so a supervisor (or a test) knows
it is ready. SIGTERM and SIGINT stop it cleanly: the gRPC server first, then the
collectors (what they stored stays; agents keep the rest), then the store.

Every other subcommand is a client of a running controller: ``--controller ADDR``,
default ``$SIXLAB_CONTROLLER``, else ``unix:/run/sixlab/controller.sock`` (when /run is
writable, as for root) or ``unix:$TMPDIR/sixlab-$UID/controller.sock`` (see
``sixlab.controller.client.default_address``). A refused request prints one line on
stderr, ``sixlab controller: CODE: message``, and exits 1; bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import logging
import sqlite3
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sixlab.cli import _argtypes as argtypes
from sixlab.controller.client import (
    ControllerClient,
    NodeInfo,
    NorthboundError,
    ResultPage,
    SessionInfo,
    SessionStats,
    default_address,
)
from sixlab.controller.core import CollectMode, SessionSpec
from sixlab.linux.signals import StopOnSignal
from sixlab.stamp import StampResult
from sixlab.stamp.stats import DelaySummary

__all__ = [
    "add_parsers",
    "main",
    "node_json",
    "parse_metrics_address",
    "record_json",
    "session_json",
    "stats_json",
]

PROG = "sixlab controller"
NS_PER_S = 1_000_000_000
#: Seconds between polls of a sender's results (the controller's --poll-interval).
DEFAULT_POLL_INTERVAL_S = 0.5
#: Prometheus exporters listen on loopback unless told otherwise.
DEFAULT_METRICS_HOST = "127.0.0.1"


# ---------------------------------------------------------------------- argument types


def _address(text: str) -> str:
    return str(argtypes.ip(text))


def _segments(text: str) -> tuple[str, ...]:
    return tuple(str(sid) for sid in argtypes.sid_list(text))


_port = argtypes.port
_seconds = argtypes.seconds
_count = argtypes.count


def _hex_key(text: str) -> str:
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise argparse.ArgumentTypeError("the key must be hexadecimal") from None
    if not key:
        raise argparse.ArgumentTypeError("the key is empty")
    return key.hex()


def parse_metrics_address(text: str) -> tuple[str, int]:
    """``[::1]:9464``, ``127.0.0.1:9464``, ``:9464`` or ``9464`` → (host, port)."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "", text
    host = host.removeprefix("[").removesuffix("]") or DEFAULT_METRICS_HOST
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not ADDR:PORT with an IP address: {text!r}") from None
    port = _port(port_text)
    if port == 0:
        raise argparse.ArgumentTypeError("the metrics port must not be 0")
    return host, port


# --------------------------------------------------------------------------- parsers


def add_parsers(sub: Any) -> None:
    """Add the ``controller`` command group to ``sixlab``'s subparsers."""
    group = sub.add_parser(
        "controller",
        help="the SDN controller: serve it, register nodes, run sessions, read results",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    cmds = group.add_subparsers(dest="controller_command", required=True, metavar="COMMAND")

    serve = cmds.add_parser("serve", help="run the controller (northbound gRPC, metrics)")
    serve.add_argument("--db", type=Path, required=True, help="SQLite store (created if missing)")
    serve.add_argument(
        "--grpc",
        metavar="ADDR",
        default=None,
        help="northbound gRPC address, e.g. 'unix:/run/sixlab/controller.sock' or '[::1]:50050' "
        "(default: $SIXLAB_CONTROLLER, else /run/sixlab/controller.sock if /run is writable, "
        "else $TMPDIR/sixlab-$UID/controller.sock)",
    )
    serve.add_argument(
        "--metrics",
        metavar="ADDR:PORT",
        type=parse_metrics_address,
        help="serve Prometheus metrics over HTTP here (e.g. 127.0.0.1:9464)",
    )
    serve.add_argument(
        "--poll-interval",
        metavar="S",
        type=_seconds,
        default=DEFAULT_POLL_INTERVAL_S,
        help=f"seconds between result polls (default {DEFAULT_POLL_INTERVAL_S})",
    )
    serve.add_argument("--verbose", "-v", action="store_true", help="log collection events")
    serve.set_defaults(handler=run_serve)

    client = argparse.ArgumentParser(add_help=False)
    client.add_argument(
        "--controller",
        metavar="ADDR",
        default=None,
        help="the controller's gRPC address (default: $SIXLAB_CONTROLLER, else the "
        "default socket: /run/sixlab/controller.sock or $TMPDIR/sixlab-$UID/controller.sock)",
    )
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON instead of a table")

    node = cmds.add_parser("node", help="register, initialise and list nodes (agents)")
    node_cmds = node.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    add = node_cmds.add_parser("add", parents=[client], help="register a node's agent")
    add.add_argument("name")
    add.add_argument("address", help="the agent's gRPC address, e.g. '[::1]:50051'")
    add.add_argument("--role", choices=("sender", "reflector"), required=True)
    add.set_defaults(handler=_client_handler(_node_add))
    init = node_cmds.add_parser(
        "init", parents=[client, as_json], help="initialise a node's agent (open its data plane)"
    )
    init.add_argument("name")
    init.add_argument("--dataplane", default="", help="data plane (default: the agent's)")
    init.add_argument(
        "--port", type=_port, help="STAMP UDP port (default: 862 on a reflector, any on a sender)"
    )
    init.add_argument("--interface", default="", help="interface, for capture data planes")
    init.add_argument("--source", type=_address, help="source IPv4 or IPv6 address")
    init.set_defaults(handler=_client_handler(_node_init))
    ls = node_cmds.add_parser("list", parents=[client, as_json], help="nodes and their health")
    ls.set_defaults(handler=_client_handler(_node_list))

    session = cmds.add_parser("session", help="create, start, stop, destroy and list sessions")
    s_cmds = session.add_subparsers(dest="session_command", required=True, metavar="ACTION")
    create = s_cmds.add_parser(
        "create", parents=[client, as_json], help="create a session on a sender/reflector pair"
    )
    create.add_argument("name")
    create.add_argument("--sender", required=True, help="sender node")
    create.add_argument("--reflector", required=True, help="reflector node")
    create.add_argument(
        "--reflector-address", type=_address, required=True, help="where test packets go"
    )
    create.add_argument(
        "--segments", type=_segments, default=(), help="forward SID list, travel order: S1,S2"
    )
    create.add_argument(
        "--return-segments", type=_segments, default=(), help="return SID list, travel order"
    )
    create.add_argument(
        "--return-path-tlv",
        action="store_true",
        help="request the return path per packet (RFC 9503) instead of configuring it",
    )
    create.add_argument("--port", type=_port, default=862, help="the reflector's UDP port")
    create.add_argument("--source", type=_address, help="source IPv4 or IPv6 address")
    create.add_argument(
        "--interval", type=_seconds, default=0.1, help="seconds between packets (default 0.1)"
    )
    create.add_argument("--count", type=_count, default=0, help="packets to send (0: no limit)")
    create.add_argument(
        "--duration", type=_seconds, default=None, help="seconds to send (default: no limit)"
    )
    create.add_argument(
        "--loss-timeout", type=_seconds, default=2.0, help="seconds until a packet is lost"
    )
    create.add_argument("--ptp", action="store_true", help="PTPv2 timestamps")
    create.add_argument("--auth-key", type=_hex_key, help="HMAC key (hex)")
    create.add_argument(
        "--stateful", action="store_true", help="stateful reflector (forward/backward loss)"
    )
    create.add_argument(
        "--strict-ssid",
        action="store_true",
        help="refuse replies with SSID 0 (by default an RFC 8762-only reflector's replies "
        "are accepted when address, port, Seq and T1 match)",
    )
    create.add_argument("--collect", choices=CollectMode.ALL, default=CollectMode.POLL)
    create.set_defaults(handler=_client_handler(_session_create))
    for action, help_text in (
        ("start", "start a session"),
        ("stop", "stop sending (in-flight results are still collected)"),
        ("destroy", "remove a session from its agents (its results stay)"),
    ):
        p = s_cmds.add_parser(action, parents=[client], help=help_text)
        p.add_argument("name")
        p.set_defaults(handler=_client_handler(_session_action(action)))
    wait = s_cmds.add_parser(
        "wait", parents=[client, as_json], help="wait until a session has finished"
    )
    wait.add_argument("name")
    wait.add_argument(
        "--timeout", type=_seconds, default=60.0, help="give up after this long (default 60 s)"
    )
    wait.set_defaults(handler=_client_handler(_session_wait))
    s_ls = s_cmds.add_parser("list", parents=[client, as_json], help="sessions and counters")
    s_ls.add_argument("--all", action="store_true", help="also destroyed sessions")
    s_ls.set_defaults(handler=_client_handler(_session_list))

    results = cmds.add_parser("results", parents=[client, as_json], help="stored results")
    results.add_argument("name")
    results.add_argument("--since-ns", type=_count, default=None, help="only T1 >= this (Unix ns)")
    results.add_argument("--limit", type=_count, default=0, help="at most this many (0: 10000)")
    results.set_defaults(handler=_client_handler(_results))

    stats = cmds.add_parser("stats", parents=[client, as_json], help="delay, jitter and loss")
    stats.add_argument("name")
    stats.add_argument("--since-ns", type=_count, default=None, help="only T1 >= this (Unix ns)")
    stats.set_defaults(handler=_client_handler(_stats))


def main(argv: Sequence[str] | None = None) -> int:
    """``sixlab controller`` alone (``python -m`` style), for tests and for scripts."""
    parser = argparse.ArgumentParser(prog="sixlab")
    add_parsers(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    try:
        rc: int = args.handler(args)
    except KeyboardInterrupt:
        return 130
    return rc


# ----------------------------------------------------------------------------- serve


def run_serve(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; 0 on a clean stop, 2 on a bad store or address."""
    from sixlab.controller.core import Controller  # noqa: PLC0415 - clients skip these
    from sixlab.controller.metrics import ControllerMetrics  # noqa: PLC0415
    from sixlab.controller.northbound import serve_controller  # noqa: PLC0415
    from sixlab.controller.store import Store  # noqa: PLC0415

    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    address: str = args.grpc or default_address(server=True)
    socket_path = Path(address.removeprefix("unix:")) if address.startswith("unix:") else None
    if socket_path is not None:
        # /run/sixlab is 0755 (root's; the socket's own mode guards it); a private
        # fallback under /tmp is 0700.
        mode = 0o755 if socket_path.parent.parent == Path("/run") else 0o700
        try:
            socket_path.parent.mkdir(mode=mode, parents=True, exist_ok=True)
        except OSError as exc:
            print(f"{PROG}: cannot create {socket_path.parent}: {exc.strerror}", file=sys.stderr)
            return 2
    try:
        store = Store(args.db)
    except (OSError, sqlite3.Error) as exc:
        print(f"{PROG}: cannot open the store {args.db}: {exc}", file=sys.stderr)
        return 2
    metrics = ControllerMetrics()
    controller = Controller(store, metrics, poll_interval_s=args.poll_interval)
    server = None
    try:
        server = serve_controller(address, controller)
        if args.metrics is not None:
            host, port = args.metrics
            metrics.serve(port, host)
    except OSError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        if server is not None:
            server.stop(0)
        controller.close()
        store.close()
        return 2
    with StopOnSignal() as stop:
        try:
            resumed = controller.resume()
            extra = "" if args.metrics is None else f" metrics={args.metrics[0]}:{args.metrics[1]}"
            print(
                f"controller: grpc={address} db={args.db} resumed={len(resumed)}{extra}",
                flush=True,
            )
            stop.wait()
        finally:
            server.stop(1.0)
            controller.close()
            store.close()
            if socket_path is not None:
                with contextlib.suppress(OSError):
                    socket_path.unlink()
    return 0


# --------------------------------------------------------------------------- clients


def _client_handler(
    fn: Callable[[ControllerClient, argparse.Namespace], None],
) -> Callable[[argparse.Namespace], int]:
    """A subcommand as a call on a client: one clear stderr line and exit 1 if refused."""

    def handler(args: argparse.Namespace) -> int:
        client = ControllerClient(args.controller or default_address())
        try:
            fn(client, args)
        except NorthboundError as exc:
            print(f"{PROG}: {exc.code.name}: {exc.details}", file=sys.stderr)
            return 1
        finally:
            client.close()
        return 0

    return handler


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


def _console() -> Any:
    from rich.console import Console  # noqa: PLC0415 - rich only when drawing tables

    # Wide enough for the results table when stdout is a pipe (rich would assume 80).
    return Console(width=None if sys.stdout.isatty() else 160)


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    from rich.table import Table  # noqa: PLC0415

    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="left" if col in _LEFT else "right")
    for row in rows:
        table.add_row(*("-" if v is None else str(v) for v in row))
    _console().print(table)


_LEFT = frozenset(
    {"name", "address", "role", "state", "sender", "reflector", "path", "error", "delay"}
)


def _ms(ns: int | None) -> str | None:
    return None if ns is None else f"{ns / 1e6:.3f}"


def node_json(n: NodeInfo) -> dict[str, Any]:
    return asdict(n)


def session_json(s: SessionInfo) -> dict[str, Any]:
    out = asdict(s)
    out["segments"] = list(s.segments)
    out["return_segments"] = list(s.return_segments)
    return out


def record_json(r: StampResult) -> dict[str, Any]:
    return dict(r.as_json())


def stats_json(name: str, s: SessionStats) -> dict[str, Any]:
    def summary(d: DelaySummary | None) -> dict[str, int] | None:
        return None if d is None else asdict(d)

    return {
        "session": name,
        "direct": summary(s.direct),
        "return": summary(s.backward),
        "rtt": summary(s.rtt),
        "direct_jitter_ns": s.direct_jitter_ns,
        "return_jitter_ns": s.return_jitter_ns,
        "sent": s.sent,
        "received": s.received,
        "lost": s.lost,
        "loss_ratio": s.loss_ratio,
        "forward_lost": s.forward_lost,
        "backward_lost": s.backward_lost,
        "unclassified_lost": s.unclassified_lost,
        "reflector_ssid_zero": s.ssid_zero > 0,
        "max_error_bound_ns": s.max_error_bound_ns,
        "unknown": s.unknown,
        "epochs": [asdict(e) for e in s.epochs],
        "schedule_skipped": s.schedule_skipped,
        "schedule_late_mean_ns": s.schedule_late_mean_ns,
        "schedule_late_max_ns": s.schedule_late_max_ns,
    }


def _node_add(c: ControllerClient, args: argparse.Namespace) -> None:
    node = c.register_node(args.name, args.address, args.role)
    health = "healthy" if node.healthy else f"not answering: {node.last_error}"
    print(f"node {node.name} registered ({node.role} at {node.address}, {health})")


def _node_init(c: ControllerClient, args: argparse.Namespace) -> None:
    port = c.init_node(
        args.name,
        dataplane=args.dataplane,
        port=args.port,
        interface=args.interface,
        source=args.source or "",
    )
    if args.json:
        _print_json({"name": args.name, "port": port})
    else:
        print(f"node {args.name} initialised: STAMP on UDP port {port}")


def _node_list(c: ControllerClient, args: argparse.Namespace) -> None:
    nodes = c.nodes()
    if args.json:
        _print_json([node_json(n) for n in nodes])
        return
    _table(
        "nodes",
        ("name", "role", "address", "healthy", "initialised", "error"),
        [
            (n.name, n.role, n.address, n.healthy, n.initialized, n.last_error or None)
            for n in nodes
        ],
    )


def _session_create(c: ControllerClient, args: argparse.Namespace) -> None:
    spec = SessionSpec(
        name=args.name,
        sender=args.sender,
        reflector=args.reflector,
        reflector_address=args.reflector_address,
        segments=args.segments,
        return_segments=args.return_segments,
        return_path_tlv=args.return_path_tlv,
        reflector_port=args.port,
        source_address=args.source or "",
        interval_ns=round(args.interval * NS_PER_S),
        count=args.count,
        duration_ns=0 if args.duration is None else round(args.duration * NS_PER_S),
        ptp=args.ptp,
        key_hex=args.auth_key or "",
        stateful=args.stateful,
        strict_ssid=args.strict_ssid,
        loss_timeout_ns=round(args.loss_timeout * NS_PER_S),
        collect=args.collect,
    )
    info = c.create_session(spec)
    if args.json:
        _print_json(session_json(info))
    else:
        print(f"session {info.name} created: SSID {info.ssid}, {info.sender} -> {info.reflector}")


def _session_action(action: str) -> Callable[[ControllerClient, argparse.Namespace], None]:
    def run(c: ControllerClient, args: argparse.Namespace) -> None:
        getattr(c, f"{action}_session")(args.name)
        done = {"start": "started", "stop": "stopping", "destroy": "destroyed"}[action]
        print(f"session {args.name} {done}")

    return run


def _session_wait(c: ControllerClient, args: argparse.Namespace) -> None:
    """Exit 0 once the session finished (or was destroyed), 1 with a line on timeout."""
    info = c.wait_state(args.name, ("finished", "destroyed"), args.timeout)
    if args.json:
        _print_json(session_json(info))
    else:
        print(
            f"session {info.name} {info.state}: sent {info.sent}, lost {info.lost}, "
            f"stored {info.stored}"
        )


def _session_list(c: ControllerClient, args: argparse.Namespace) -> None:
    sessions = c.sessions(include_destroyed=args.all)
    if args.json:
        _print_json([session_json(s) for s in sessions])
        return
    _table(
        "sessions",
        ("name", "ssid", "state", "sender", "reflector", "path", "sent", "lost", "stored"),
        [
            (
                s.name,
                s.ssid,
                s.state,
                s.sender,
                s.reflector,
                ",".join(s.segments) or s.reflector_address,
                s.sent,
                s.lost,
                s.stored,
            )
            for s in sessions
        ],
    )


def _results(c: ControllerClient, args: argparse.Namespace) -> None:
    page: ResultPage = c.results(args.name, since_ns=args.since_ns, limit=args.limit)
    if args.json:
        _print_json(
            {
                "session": args.name,
                "records": [
                    {"epoch": epoch, **record_json(r)}
                    for r, epoch in zip(page.records, page.epochs, strict=True)
                ],
                "more": page.more,
            }
        )
        return
    _table(
        f"results of {args.name}" + (" (more: use --since-ns or --limit)" if page.more else ""),
        ("seq", "t1_ns", "direct ms", "return ms", "rtt ms", "ttl", "error ms"),
        [
            (
                r.seq,
                r.t1_ns,
                _ms(r.direct_ns),
                _ms(r.return_ns),
                _ms(r.rtt_ns),
                r.ses_sender_ttl,
                _ms(r.error_bound_ns),
            )
            for r in page.records
        ],
    )


def _stats(c: ControllerClient, args: argparse.Namespace) -> None:
    s = c.stats(args.name, since_ns=args.since_ns)
    if args.json:
        _print_json(stats_json(args.name, s))
        return
    rows: list[tuple[object, ...]] = []
    for label, d, jitter in (
        ("direct", s.direct, s.direct_jitter_ns),
        ("return", s.backward, s.return_jitter_ns),
        ("rtt", s.rtt, None),
    ):
        if d is None:
            rows.append((label, 0, None, None, None, None, None, None, _ms(jitter)))
        else:
            rows.append(
                (
                    label,
                    d.count,
                    _ms(d.min_ns),
                    _ms(d.mean_ns),
                    _ms(d.p50_ns),
                    _ms(d.p90_ns),
                    _ms(d.p99_ns),
                    _ms(d.max_ns),
                    _ms(jitter),
                )
            )
    _table(
        f"{args.name}: delay (ms)",
        ("delay", "n", "min", "mean", "p50", "p90", "p99", "max", "jitter"),
        rows,
    )
    split = ""
    if s.forward_lost is not None and s.backward_lost is not None:
        split = f" (forward {s.forward_lost}, backward {s.backward_lost}"
        split += f", not yet placed {s.unclassified_lost})" if s.unclassified_lost else ")"
    bound = (
        "" if s.max_error_bound_ns is None else f"; error bound <= {_ms(s.max_error_bound_ns)} ms"
    )
    unknown = f", unknown {s.unknown} (agent outages)" if s.unknown else ""
    print(
        f"sent {s.sent}, received {s.received}, lost {s.lost}{split}{unknown}, "
        f"loss {s.loss_ratio:.2%}{bound}"
    )
    if s.ssid_zero:
        print(
            f"reflector_ssid_zero: {s.ssid_zero} replies had SSID 0: the reflector implements "
            "RFC 8762 but not RFC 8972"
        )
    if s.schedule_skipped:
        print(
            f"sender behind schedule: {s.schedule_skipped} slots skipped, packets late by "
            f"{_ms(s.schedule_late_mean_ns)} ms on average, {_ms(s.schedule_late_max_ns)} at most"
        )
    for e in s.epochs:
        if e.unknown:
            print(
                f"epoch {e.epoch} ({e.end_reason}): sent {e.sent}, received {e.received}, "
                f"lost {e.lost}, unknown {e.unknown}"
            )
