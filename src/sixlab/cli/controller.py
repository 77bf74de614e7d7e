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
import datetime
import ipaddress
import json
import logging
import sqlite3
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc

from sixlab.cli import _argtypes as argtypes
from sixlab.cli import _daemon
from sixlab.controller.client import (
    ControllerClient,
    NodeInfo,
    NorthboundError,
    ResultPage,
    SessionInfo,
    SessionStats,
    default_address,
)
from sixlab.controller.core import (
    COMMIT_INTERVAL_S,
    COMMIT_SLOTS,
    STREAM_WINDOW_NS,
    SWITCH_INTERVAL_S,
    CollectMode,
    SessionSpec,
)
from sixlab.controller.northbound import DEFAULT_MAX_WORKERS, DEFAULT_RESULTS_LIMIT, MAX_RESULTS
from sixlab.linux.signals import StopOnSignal
from sixlab.southbound.client import ClientTls
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
log = logging.getLogger("sixlab.controller")
NS_PER_S = 1_000_000_000
#: Seconds between polls of a sender's results (the controller's --poll-interval).
DEFAULT_POLL_INTERVAL_S = 0.5
#: The port of an agent given by its address alone (``sixlab stamp agent``'s default).
AGENT_DEFAULT_PORT = 50051
#: Seconds between test packets unless told: one a second, as ``sixlab stamp sender``,
#: the agent and the northbound API take it.
DEFAULT_INTERVAL_S = 1.0
#: A dead replica's nodes are taken over after this long (s).
DEFAULT_LEASE_TTL_S = 5.0
#: Seconds between roll-up and retention passes.
DEFAULT_HOUSEKEEPING_S = 60.0
#: ``Retention.duty``'s default (the controller's modules load when a command runs).
DEFAULT_HOUSEKEEPING_DUTY = 0.1
#: Prometheus exporters listen on loopback unless told otherwise.
DEFAULT_METRICS_HOST = "127.0.0.1"


# ---------------------------------------------------------------------- argument types


def _address(text: str) -> str:
    return str(argtypes.ip(text))


def _segments(text: str) -> tuple[str, ...]:
    return tuple(str(sid) for sid in argtypes.sid_list(text))


_port = argtypes.port
_name = argtypes.name


def _path(text: str) -> Path:
    """A file name that can be printed (the ready line names the store)."""
    return Path(argtypes.text(text))


def _db(text: str) -> str:
    """``--db``: a PostgreSQL URL as given, or a SQLite file name (printable); not a
    ``Path``, which would fold the URL's ``//``."""
    return argtypes.text(text)


def _hex_key(text: str) -> str:
    return argtypes.hex_key(text).hex()


def agent_target(text: str) -> str:
    """An agent's gRPC address as ``node add`` takes it.

    ``[v6]:port``, ``v4:port``, ``host:port`` and ``unix:PATH`` are used as given; a bare
    IP address (``fc00::9``, ``192.0.2.1``) means the agent's default port,
    ``[fc00::9]:50051``. An IPv6 address with a port must be in brackets.
    """
    text = argtypes.text(text)
    if text.startswith(("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:")):
        return text
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        pass
    else:
        host = f"[{ip}]" if ip.version == 6 else str(ip)
        return f"{host}:{AGENT_DEFAULT_PORT}"
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(
            f"not an agent address: {text!r} (HOST:PORT, [IPv6]:PORT, an IP address alone "
            f"for port {AGENT_DEFAULT_PORT}, or unix:PATH)"
        )
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise argparse.ArgumentTypeError(
            f"not an agent address: {text!r}: an IPv6 address with a port goes in brackets, "
            f"e.g. [fc00::9]:{AGENT_DEFAULT_PORT}"
        )
    if not port.isdigit() or not 0 < int(port) <= 0xFFFF:
        raise argparse.ArgumentTypeError(f"not an agent address: {text!r}: port {port!r}")
    return text


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
    _add_serve(cmds)
    client, as_json = _client_parents()
    _add_node(cmds, client, as_json)
    _add_session(cmds, client, as_json)
    _add_results(cmds, client, as_json)
    _add_apply_export(cmds, client, as_json)
    _add_stats_events(cmds, client, as_json)


def _client_parents() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The parent parsers of the client commands: where the controller is, and --json."""
    client = argparse.ArgumentParser(add_help=False)
    client.add_argument(
        "--controller",
        metavar="ADDR",
        type=argtypes.text,
        default=None,
        help="the controller's gRPC address (default: $SIXLAB_CONTROLLER, else the "
        "default socket: /run/sixlab/controller.sock or $TMPDIR/sixlab-$UID/controller.sock)",
    )
    client.add_argument(
        "--tls-ca", type=Path, metavar="PATH", help="CA (PEM) to verify a TLS controller"
    )
    client.add_argument("--tls-cert", type=Path, metavar="PATH", help="client certificate (mTLS)")
    client.add_argument("--tls-key", type=Path, metavar="PATH", help="client key (mTLS)")
    client.add_argument(
        "--tls-server-name",
        type=argtypes.text,
        metavar="NAME",
        help="name to check the controller's certificate against (default: the host)",
    )
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return client, as_json


def _add_node(cmds: Any, client: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    node = cmds.add_parser("node", help="register, initialise and list nodes (agents)")
    node_cmds = node.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    add = node_cmds.add_parser("add", parents=[client], help="register a node's agent")
    add.add_argument("name", type=_name)
    add.add_argument(
        "address",
        type=agent_target,
        help=f"the agent's gRPC address: [IPv6]:PORT, HOST:PORT, unix:PATH, or an IP "
        f"address alone for port {AGENT_DEFAULT_PORT}",
    )
    add.add_argument("--role", choices=("sender", "reflector"), required=True)
    add.set_defaults(handler=_client_handler(_node_add))
    init = node_cmds.add_parser(
        "init", parents=[client, as_json], help="initialise a node's agent (open its data plane)"
    )
    init.add_argument("name", type=_name)
    _add_init_options(init)
    init.set_defaults(handler=_client_handler(_node_init))
    ls = node_cmds.add_parser(
        "list",
        parents=[client, as_json],
        help="nodes, with their health checked now (each agent is asked)",
    )
    ls.add_argument(
        "--no-check",
        action="store_true",
        help="do not ask the agents: show the health the controller last recorded",
    )
    ls.set_defaults(handler=_client_handler(_node_list))


def _add_session(
    cmds: Any, client: argparse.ArgumentParser, as_json: argparse.ArgumentParser
) -> None:
    session = cmds.add_parser("session", help="create, start, stop, destroy and list sessions")
    s_cmds = session.add_subparsers(dest="session_command", required=True, metavar="ACTION")
    create = s_cmds.add_parser(
        "create", parents=[client, as_json], help="create a session on a sender/reflector pair"
    )
    create.add_argument("name", type=_name)
    _add_session_options(create)
    create.set_defaults(handler=_client_handler(_session_create))
    for action, help_text in (
        ("start", "start a session"),
        ("stop", "stop sending (in-flight results are still collected)"),
        ("destroy", "remove a session from its agents (its results stay)"),
    ):
        p = s_cmds.add_parser(action, parents=[client], help=help_text)
        p.add_argument("name", type=_name)
        p.set_defaults(handler=_client_handler(_session_action(action)))
    wait = s_cmds.add_parser(
        "wait", parents=[client, as_json], help="wait until a session has finished"
    )
    wait.add_argument("name", type=_name)
    wait.add_argument(
        "--timeout",
        type=argtypes.timeout,
        default=60.0,
        help="give up after this long (default 60 s)",
    )
    wait.set_defaults(handler=_client_handler(_session_wait))
    s_ls = s_cmds.add_parser("list", parents=[client, as_json], help="sessions and counters")
    s_ls.add_argument("--all", action="store_true", help="also destroyed sessions")
    s_ls.set_defaults(handler=_client_handler(_session_list))


def _add_results(
    cmds: Any, client: argparse.ArgumentParser, as_json: argparse.ArgumentParser
) -> None:
    results = cmds.add_parser("results", parents=[client, as_json], help="stored results")
    results.add_argument("name", type=_name)
    results.add_argument(
        "--since-ns", type=argtypes.u64, default=None, help="only T1 >= this (Unix ns)"
    )
    results.add_argument(
        "--limit",
        type=argtypes.integer(0, MAX_RESULTS, "a number of results"),
        default=0,
        help=f"at most this many (0: {DEFAULT_RESULTS_LIMIT}; at most {MAX_RESULTS})",
    )
    results.set_defaults(handler=_client_handler(_results))


def _add_apply_export(
    cmds: Any, client: argparse.ArgumentParser, as_json: argparse.ArgumentParser
) -> None:
    apply = cmds.add_parser(
        "apply",
        parents=[client, as_json],
        help="make the nodes and sessions those of a TOML file (creates, updates, destroys)",
        description="Make the controller's nodes and sessions those of FILE, in one call: "
        "what is missing is created, what differs is replaced, what the file does not list "
        "is destroyed. Prints the changes; applying the same file again changes nothing.",
    )
    apply.add_argument("file", type=Path, help="TOML configuration (see `export`)")
    apply.add_argument(
        "--dry-run", action="store_true", help="print the changes without making them"
    )
    apply.add_argument(
        "--prune",
        action="store_true",
        help="remove a node the file does not list even if sessions ran on it, deleting "
        "their stored results (without it, such a node stops the apply before any change)",
    )
    apply.set_defaults(handler=_client_handler(_apply))
    export = cmds.add_parser(
        "export",
        parents=[client],
        help="write the nodes and sessions as a TOML file that `apply` takes",
    )
    export.add_argument(
        "--output", "-o", type=Path, default=None, help="write here instead of stdout"
    )
    export.set_defaults(handler=_client_handler(_export))


def _add_stats_events(
    cmds: Any, client: argparse.ArgumentParser, as_json: argparse.ArgumentParser
) -> None:
    stats = cmds.add_parser("stats", parents=[client, as_json], help="delay, jitter and loss")
    stats.add_argument("name", type=_name)
    stats.add_argument(
        "--since-ns", type=argtypes.u64, default=None, help="only T1 >= this (Unix ns)"
    )
    stats.set_defaults(handler=_client_handler(_stats))

    events = cmds.add_parser(
        "events", parents=[client, as_json], help="threshold events raised and cleared"
    )
    events.add_argument("name", nargs="?", default="", help="only this session's")
    events.add_argument(
        "--since-ns", type=argtypes.u64, default=None, help="only from then (Unix ns)"
    )
    events.add_argument("--limit", type=argtypes.count, default=0, help="the newest N (0: 1000)")
    events.set_defaults(handler=_client_handler(_events))


def _add_serve(cmds: Any) -> None:
    serve = cmds.add_parser(
        "serve",
        help="run the controller (northbound gRPC, metrics)",
        description="Run the controller until SIGTERM/SIGINT. Flags may also come from "
        "--config FILE (TOML, keys = long flag names); flags given here win.",
    )
    serve.add_argument(
        "--db",
        type=_db,
        required=True,
        help="the store: a SQLite file (created if missing) or a postgresql://… URL (a"
        " database several replicas may share)",
    )
    serve.add_argument(
        "--replica",
        metavar="NAME",
        type=argtypes.text,
        help="run as one of several replicas on one PostgreSQL database, or on one SQLite"
        " file of this host (to survive a crashed process: one write lock serves them all;"
        " never over a network filesystem), under this unique name: each takes a fair share"
        " of the nodes by lease, and takes over those of a replica that dies",
    )
    serve.add_argument(
        "--lease-ttl",
        metavar="S",
        type=argtypes.timeout,
        default=DEFAULT_LEASE_TTL_S,
        help=f"with --replica: a dead replica's nodes are taken over after this long"
        f" (default {DEFAULT_LEASE_TTL_S:g})",
    )
    serve.add_argument(
        "--retention",
        metavar="S",
        type=argtypes.timeout,
        help="keep raw results this long (default: for ever); per-minute rollups stay",
    )
    serve.add_argument(
        "--rollup-retention",
        metavar="S",
        type=argtypes.timeout,
        help="keep per-minute rollups this long (default: for ever)",
    )
    serve.add_argument(
        "--housekeeping-interval",
        metavar="S",
        type=argtypes.timeout,
        default=DEFAULT_HOUSEKEEPING_S,
        help=f"seconds between roll-up and retention passes (default {DEFAULT_HOUSEKEEPING_S:g})",
    )
    serve.add_argument(
        "--housekeeping-duty",
        metavar="SHARE",
        type=float,
        default=DEFAULT_HOUSEKEEPING_DUTY,
        help="share of a pass's time spent rolling up, waiting between its reads the rest,"
        f" for a pass's first interval (0 < SHARE <= 1, default {DEFAULT_HOUSEKEEPING_DUTY:g})",
    )
    serve.add_argument(
        "--grpc",
        metavar="ADDR",
        type=argtypes.text,
        default=None,
        help="northbound gRPC address, e.g. 'unix:/run/sixlab/controller.sock' or '[::1]:50050' "
        "(default: $SIXLAB_CONTROLLER, else /run/sixlab/controller.sock if /run is writable, "
        "else $TMPDIR/sixlab-$UID/controller.sock)",
    )
    _daemon.add_server_tls_arguments(serve, "northbound API")
    serve.add_argument(
        "--agent-tls-ca",
        type=Path,
        metavar="PATH",
        help="dial every agent with TLS, verifying its certificate with this CA (PEM)",
    )
    serve.add_argument(
        "--agent-tls-cert",
        type=Path,
        metavar="PATH",
        help="the controller's client certificate for the agents (mTLS)",
    )
    serve.add_argument("--agent-tls-key", type=Path, metavar="PATH", help="its private key (PEM)")
    serve.add_argument(
        "--agent-tls-server-name",
        type=argtypes.text,
        metavar="NAME",
        help="check every agent's certificate against this name instead of its host",
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
        type=argtypes.timeout,
        default=DEFAULT_POLL_INTERVAL_S,
        help=f"seconds between result polls (default {DEFAULT_POLL_INTERVAL_S})",
    )
    serve.add_argument(
        "--stream-window",
        metavar="S",
        type=argtypes.timeout,
        default=STREAM_WINDOW_NS / 1e9,
        help="stream mode: each sender agent gathers records this long into one message"
        f" (default {STREAM_WINDOW_NS / 1e9:g})",
    )
    serve.add_argument(
        "--commit-interval",
        metavar="S",
        type=argtypes.timeout_or_zero,
        default=COMMIT_INTERVAL_S,
        help="stream mode: a sender's messages are stored together in one transaction for"
        " up to this long; 0 (the default): each as soon as it comes, with those that came"
        " while the previous transaction ran. Window and interval both add to collection lag",
    )
    serve.add_argument(
        "--commit-slots",
        metavar="N",
        type=argtypes.workers,
        default=COMMIT_SLOTS,
        help="stream mode: transactions of different senders that may run at once"
        f" (default {COMMIT_SLOTS}; SQLite runs one at a time whatever this says)",
    )
    serve.add_argument(
        "--switch-interval",
        metavar="S",
        type=argtypes.seconds_in(0.0005, 1.0),
        default=SWITCH_INTERVAL_S,
        help="how long one of the process's threads runs Python before another waiting for"
        f" it may (sys.setswitchinterval; default {SWITCH_INTERVAL_S:g}, CPython's own"
        " 0.005): longer means fewer hand-overs between the collection's threads",
    )
    serve.add_argument(
        "--max-workers",
        type=argtypes.workers,
        default=DEFAULT_MAX_WORKERS,
        help=f"northbound gRPC worker threads (default {DEFAULT_MAX_WORKERS})",
    )
    serve.add_argument(
        "--verbose", "-v", action="store_true", help="log everything (--log-level debug)"
    )
    _daemon.add_logging_arguments(serve, default_level="info")
    serve.add_argument("--config", metavar="FILE", help="TOML file of flags (keys: long names)")
    serve.set_defaults(handler=run_serve)


def _add_init_options(init: argparse.ArgumentParser) -> None:
    init.add_argument(
        "--dataplane", type=argtypes.text, default="", help="data plane (default: the agent's)"
    )
    init.add_argument(
        "--port", type=_port, help="STAMP UDP port (default: 862 on a reflector, any on a sender)"
    )
    init.add_argument(
        "--interface", type=argtypes.text, default="", help="interface, for capture data planes"
    )
    init.add_argument("--source", type=_address, help="source IPv4 or IPv6 address")


def _add_session_options(create: argparse.ArgumentParser) -> None:
    create.add_argument("--sender", type=_name, required=True, help="sender node")
    create.add_argument(
        "--reflector", type=_name, default="", help="reflector node (none with --loopback)"
    )
    create.add_argument(
        "--reflector-address",
        type=_address,
        default="",
        help="where test packets go (none with --loopback)",
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
        "--interval",
        type=argtypes.interval,
        default=DEFAULT_INTERVAL_S,
        help=f"seconds between packets (default {DEFAULT_INTERVAL_S:g})",
    )
    create.add_argument(
        "--count", type=argtypes.count, default=0, help="packets to send (0: no limit)"
    )
    create.add_argument(
        "--duration",
        type=argtypes.duration,
        default=None,
        help="seconds to send (default: no limit)",
    )
    create.add_argument(
        "--loss-timeout",
        type=argtypes.timeout,
        default=2.0,
        help="seconds until a packet is lost (default 2)",
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
    _srpm_arguments(create)


def _srpm_arguments(create: Any) -> None:
    """``session create``'s SR performance-measurement options (docs/srpm.md)."""
    create.add_argument(
        "--loopback",
        action="store_true",
        help="loopback mode: no reflector node; --segments lead the probes back to the sender",
    )
    create.add_argument(
        "--flow-labels",
        type=argtypes.flow_labels,
        default=(),
        metavar="N|L1,L2,...",
        help="spread the probes over IPv6 flow labels (N: labels 1..N), stats per label",
    )
    for side in ("sender", "reflector"):
        for what in ("sent", "received"):
            create.add_argument(
                f"--dm-{side}-{what}",
                default="",
                metavar="PREFIX[,udp|tcp[,PORT]]",
                help=f"direct-mode loss: data packets the {side} node counts as {what}",
            )
    create.add_argument("--max-delay-ms", type=float, default=None, help="delay threshold")
    create.add_argument("--max-jitter-ms", type=float, default=None, help="jitter threshold")
    create.add_argument(
        "--max-loss", type=float, default=None, help="loss-ratio threshold, e.g. 0.01"
    )
    create.add_argument(
        "--event-window",
        type=argtypes.timeout,
        default=10.0,
        help="seconds each judgement looks at",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``sixlab controller`` alone (``python -m`` style), for tests and for scripts."""
    from sixlab.cli._config import apply_config_file  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="sixlab")
    add_parsers(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    argv = sys.argv[1:] if argv is None else list(argv)
    apply_config_file(parser, argv)
    args = parser.parse_args(argv)
    try:
        rc: int = args.handler(args)
    except KeyboardInterrupt:
        return 130
    return rc


# ----------------------------------------------------------------------------- serve


def run_serve(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; 0 on a clean stop, 2 on a bad store or address."""
    level = "debug" if args.verbose else args.log_level
    # The process's, for as long as it serves: a caller that serves in its own process
    # (a test) gets its own back.
    before = sys.getswitchinterval()
    sys.setswitchinterval(args.switch_interval)
    try:
        with _daemon.daemon_logging(args.log_format, level):
            return _run_serve(args)
    finally:
        sys.setswitchinterval(before)


def _run_serve(args: argparse.Namespace) -> int:
    from sixlab.controller.core import Controller  # noqa: PLC0415 - clients skip these
    from sixlab.controller.metrics import ControllerMetrics  # noqa: PLC0415
    from sixlab.controller.northbound import serve_controller  # noqa: PLC0415
    from sixlab.controller.store import StoreError, open_store  # noqa: PLC0415

    address: str = args.grpc or default_address(server=True)
    try:
        files = _daemon.server_tls_files(args)
        warning = _daemon.exposure_warning(
            address, files, insecure=args.insecure, api="northbound API"
        )
        agent_factory = _agent_client_factory(args)
        retention = _retention(args)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if warning is not None:
        log.warning("%s", warning)
    try:
        socket_path = _socket_dir(address)
    except OSError as exc:
        print(f"{PROG}: cannot create {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        store = open_store(args.db)
    except (OSError, sqlite3.Error, StoreError) as exc:
        print(f"{PROG}: cannot open the store {args.db}: {exc}", file=sys.stderr)
        return 2
    metrics = ControllerMetrics()
    controller = Controller(
        store,
        metrics,
        poll_interval_s=args.poll_interval,
        stream_window_s=args.stream_window,
        commit_interval_s=args.commit_interval,
        commit_slots=args.commit_slots,
        **agent_factory,
    )
    try:
        replicas, housekeeper = _replicas(args, controller, address, retention)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        controller.close()
        store.close()
        return 2
    server = None
    try:
        server = serve_controller(
            address,
            controller,
            max_workers=args.max_workers,
            tls=files,
        )
        if args.metrics is not None:
            host, port = args.metrics
            metrics.serve(port, host)
    except (OSError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        if server is not None:
            server.stop(0)
        controller.close()
        store.close()
        return 2
    _serve_until_stopped(
        args,
        address,
        server=server,
        controller=controller,
        store=store,
        replicas=replicas,
        housekeeper=housekeeper,
        socket_path=socket_path,
    )
    return 0


def _serve_until_stopped(
    args: argparse.Namespace,
    address: str,
    *,
    server: Any,
    controller: Any,
    store: Any,
    replicas: Any,
    housekeeper: Any,
    socket_path: Path | None,
) -> None:
    """Run the started server until SIGTERM/SIGINT, then close everything."""
    with StopOnSignal() as stop:
        try:
            if replicas is not None:
                replicas.start()
            housekeeper.start()
            resumed = controller.resume()
            extra = "" if args.metrics is None else f" metrics={args.metrics[0]}:{args.metrics[1]}"
            extra += "" if replicas is None else f" replica={replicas.id}"
            print(
                f"controller: grpc={address} db={store.path} resumed={len(resumed)}{extra}",
                flush=True,
            )
            log.info("serving on %s, %d sessions resumed", address, len(resumed))
            stop.wait()
        finally:
            log.info("stopping")
            server.stop(1.0)
            housekeeper.close()
            if replicas is not None:
                replicas.close()
            controller.close()
            store.close()
            if socket_path is not None:
                with contextlib.suppress(OSError):
                    socket_path.unlink()


def _socket_dir(address: str) -> Path | None:
    """The unix socket's path (None: TCP), its directory made if missing: /run/sixlab
    is 0755 (root's; the socket's own mode guards it), a private fallback under /tmp is
    0700."""
    if not address.startswith("unix:"):
        return None
    path = Path(address.removeprefix("unix:"))
    mode = 0o755 if path.parent.parent == Path("/run") else 0o700
    path.parent.mkdir(mode=mode, parents=True, exist_ok=True)
    return path


def _retention(args: argparse.Namespace) -> Any:
    """--retention, --rollup-retention, --housekeeping-interval and -duty, checked."""
    from sixlab.controller.housekeeping import Retention  # noqa: PLC0415

    retention = Retention(
        args.retention, args.rollup_retention, args.housekeeping_interval, args.housekeeping_duty
    )
    retention.validate()
    return retention


def _replicas(
    args: argparse.Namespace, controller: Any, address: str, retention: Any
) -> tuple[Any, Any]:
    """The replica's lease holder (None without --replica) and the housekeeper."""
    from sixlab.controller.housekeeping import Housekeeper  # noqa: PLC0415
    from sixlab.controller.replica import ReplicaManager  # noqa: PLC0415

    if not args.replica:
        return None, Housekeeper(controller.store, retention)
    replicas = ReplicaManager(controller, args.replica, ttl_s=args.lease_ttl, address=address)
    return replicas, Housekeeper(controller.store, retention, owns=replicas.owns)


def _agent_client_factory(args: argparse.Namespace) -> dict[str, Any]:
    """``client_factory`` for the Controller: agents dialled with TLS if asked."""
    from sixlab.southbound.client import AgentClient, ClientTls  # noqa: PLC0415

    if args.agent_tls_ca is None:
        if args.agent_tls_cert is not None or args.agent_tls_key is not None:
            raise ValueError("--agent-tls-cert and --agent-tls-key need --agent-tls-ca")
        return {}
    if (args.agent_tls_cert is None) != (args.agent_tls_key is None):
        raise ValueError("--agent-tls-cert and --agent-tls-key go together")
    tls = ClientTls(
        args.agent_tls_ca, args.agent_tls_cert, args.agent_tls_key, args.agent_tls_server_name
    )
    try:  # read the files now: a missing one is an error at start, not at the first call
        tls.credentials()
    except OSError as exc:
        raise ValueError(f"cannot read {exc.filename}: {exc.strerror}") from None

    def factory(address: str) -> AgentClient:
        return AgentClient(address, tls=tls)

    return {"client_factory": factory}


# --------------------------------------------------------------------------- clients


def _client_handler(
    fn: Callable[[ControllerClient, argparse.Namespace], None],
) -> Callable[[argparse.Namespace], int]:
    """A subcommand as a call on a client: one clear stderr line and exit 1 if refused."""

    def handler(args: argparse.Namespace) -> int:
        try:
            client = ControllerClient(args.controller or default_address(), tls=_client_tls(args))
        except OSError as exc:
            print(f"{PROG}: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
            return 2
        except ValueError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 2
        try:
            fn(client, args)
        except NorthboundError as exc:
            print(f"{PROG}: {exc.code.name}: {exc.details}", file=sys.stderr)
            return 1
        finally:
            client.close()
        return 0

    return handler


def _client_tls(args: argparse.Namespace) -> ClientTls | None:
    if args.tls_ca is None:
        if args.tls_cert is not None or args.tls_key is not None:
            raise ValueError("--tls-cert and --tls-key need --tls-ca")
        return None
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    return ClientTls(args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


def _console() -> Any:
    from rich.console import Console  # noqa: PLC0415 - rich only when drawing tables

    # Wide enough for the results table when stdout is a pipe (rich would assume 80).
    return Console(width=None if sys.stdout.isatty() else 160)


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A rich table; cells are plain text (``[fc00::2]:50052`` is not markup)."""
    from rich.markup import escape  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    table = Table(title=escape(title))
    for col in columns:
        table.add_column(col, justify="left" if col in _LEFT else "right")
    for row in rows:
        table.add_row(*("-" if v is None else escape(str(v)) for v in row))
    _console().print(table)


def utc_time(ns: int | None) -> str | None:
    """A Unix time in ns as ISO 8601 UTC with µs: ``2026-05-09T15:20:01.123456Z``."""
    if ns is None:
        return None
    seconds, rest = divmod(ns, NS_PER_S)
    try:
        t = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    except (OverflowError, ValueError, OSError):  # a timestamp past year 9999
        return f"{ns} ns"
    return t.strftime("%Y-%m-%dT%H:%M:%S") + f".{rest // 1000:06d}Z"


_LEFT = frozenset(
    {
        "name",
        "address",
        "role",
        "state",
        "sender",
        "reflector",
        "path",
        "error",
        "delay",
        "t1 (UTC)",
        "last seen (UTC)",
    }
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
        "flows": [
            {
                "flow_label": f.flow_label,
                "received": f.received,
                "direct": summary(f.direct),
                "rtt": summary(f.rtt),
                "jitter_ns": f.jitter_ns,
            }
            for f in s.flows
        ],
        "data_loss": None if s.data_loss is None else asdict(s.data_loss),
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
    nodes = c.nodes(check=not args.no_check)
    if args.json:
        _print_json([node_json(n) for n in nodes])
        return
    _table(
        "nodes (health: asked now)" if not args.no_check else "nodes (health: last recorded)",
        ("name", "role", "address", "healthy", "initialised", "last seen (UTC)", "error"),
        [
            (
                n.name,
                n.role,
                n.address,
                n.healthy,
                n.initialized,
                utc_time(n.last_seen_ns),
                n.last_error or None,
            )
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
        loopback=args.loopback,
        flow_labels=args.flow_labels,
        dm_sender_sent=args.dm_sender_sent,
        dm_sender_received=args.dm_sender_received,
        dm_reflector_sent=args.dm_reflector_sent,
        dm_reflector_received=args.dm_reflector_received,
        max_delay_ms=args.max_delay_ms,
        max_jitter_ms=args.max_jitter_ms,
        max_loss_ratio=args.max_loss,
        event_window_s=args.event_window,
    )
    info = c.create_session(spec)
    if args.json:
        _print_json(session_json(info))
    else:
        peer = "itself (loopback)" if args.loopback else info.reflector
        print(f"session {info.name} created: SSID {info.ssid}, {info.sender} -> {peer}")


def _session_action(action: str) -> Callable[[ControllerClient, argparse.Namespace], None]:
    def run(c: ControllerClient, args: argparse.Namespace) -> None:
        pending = getattr(c, f"{action}_session")(args.name)
        done = {"start": "started", "stop": "stopping", "destroy": "destroyed"}[action]
        print(f"session {args.name} {done}" + (f": {pending}" if pending else ""))

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
        ("seq", "t1 (UTC)", "direct ms", "return ms", "rtt ms", "ttl", "error ms"),
        [
            (
                r.seq,
                utc_time(r.t1_ns),
                _ms(r.direct_ns),
                _ms(r.return_ns),
                _ms(r.rtt_ns),
                r.ses_sender_ttl,
                _ms(r.error_bound_ns),
            )
            for r in page.records
        ],
    )


_SIGNS = {
    "add": "+",
    "create": "+",
    "remove": "-",
    "destroy": "-",
    "replace": "~",
    "recreate": "~",
    "init": "~",
    "start": ">",
    "stop": "|",
}


def _apply(c: ControllerClient, args: argparse.Namespace) -> None:
    from sixlab.cli._declarative import _ConfigFileError, load  # noqa: PLC0415

    try:
        config = load(args.file)
    except _ConfigFileError as exc:
        raise NorthboundError(grpc.StatusCode.INVALID_ARGUMENT, f"{args.file}: {exc}") from None
    reply = c.apply(config, dry_run=args.dry_run, prune=args.prune)
    if args.json:
        _print_json(
            {
                "dry_run": args.dry_run,
                "changes": [
                    {"action": ch.action, "kind": ch.kind, "name": ch.name, "detail": ch.detail}
                    for ch in reply.changes
                ],
                "error": reply.error or None,
            }
        )
    else:
        for ch in reply.changes:
            print(f"{_SIGNS.get(ch.action, '*')} {ch.kind} {ch.name}: {ch.action} ({ch.detail})")
        verb = "would make" if args.dry_run else "made"
        if not reply.changes:
            print("no changes: the controller matches the file")
        else:
            print(f"{verb} {len(reply.changes)} change{'s' if len(reply.changes) != 1 else ''}")
    if reply.error:
        code, _, message = reply.error.partition(": ")
        raise NorthboundError(
            getattr(grpc.StatusCode, code, grpc.StatusCode.UNKNOWN),
            f"apply stopped: {message} (the changes above were made)",
        )


def _export(c: ControllerClient, args: argparse.Namespace) -> None:
    from sixlab.cli._declarative import dump  # noqa: PLC0415

    text = dump(c.export())
    if args.output is None:
        sys.stdout.write(text)
        return
    try:
        args.output.write_text(text)
    except OSError as exc:
        raise NorthboundError(
            grpc.StatusCode.INVALID_ARGUMENT, f"cannot write {args.output}: {exc.strerror}"
        ) from None


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
    if s.flows:
        _table(
            f"{args.name}: per flow label (ms)",
            ("flow label", "n", "direct mean", "direct p99", "rtt mean", "rtt p99", "jitter"),
            [
                (
                    f"{f.flow_label:#x}",
                    f.received,
                    None if f.direct is None else _ms(f.direct.mean_ns),
                    None if f.direct is None else _ms(f.direct.p99_ns),
                    None if f.rtt is None else _ms(f.rtt.mean_ns),
                    None if f.rtt is None else _ms(f.rtt.p99_ns),
                    _ms(f.jitter_ns),
                )
                for f in s.flows
            ],
        )
    dl = s.data_loss
    if dl is not None:
        back = "?" if dl.backward_lost is None else dl.backward_lost
        print(
            f"data loss (Direct Measurement, RFC 8972 §4.5): forward {dl.forward_lost} of "
            f"{dl.forward_sent}, backward {back} of {dl.backward_sent}"
        )


def _events(c: ControllerClient, args: argparse.Namespace) -> None:
    events = c.events(args.name, since_ns=args.since_ns, limit=args.limit)
    if args.json:
        _print_json([asdict(e) for e in events])
        return
    _table(
        "events" + (f" of {args.name}" if args.name else ""),
        ("at (UTC)", "session", "kind", "state", "value", "threshold"),
        [
            (
                datetime.datetime.fromtimestamp(e.at_ns / 1e9, tz=datetime.UTC).isoformat(
                    timespec="milliseconds"
                ),
                e.session,
                e.kind,
                e.state,
                f"{e.value:.4g}",
                f"{e.threshold:.4g}",
            )
            for e in events
        ],
    )
