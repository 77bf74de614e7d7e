"""``sixlab stamp agent``: run a STAMP agent (the southbound gRPC server) in the foreground.

::

    sixlab stamp agent --role reflector --grpc '[::1]:50052' --dataplane socket
    sixlab stamp agent --role sender --grpc '[::]:50051' \\
        --tls-cert agent.pem --tls-key agent.key --tls-ca ca.pem     # mTLS
    sixlab stamp agent --config /etc/sixlab/agent.toml

On a network address (anything but a unix socket or loopback) the agent serves only
with mutual TLS (``--tls-ca``: the CA that signs the controller's certificate), or with
``--insecure`` and a warning (``sixlab.cli._daemon``): whoever can call it can make the
node send packets anywhere.

When it listens it prints one line to stdout,
``stamp agent: role=ROLE grpc=ADDR port=PORT dataplane=NAME``, so a supervisor (or a
test) started with port 0 learns the port. SIGTERM and SIGINT stop it: the gRPC server
first, then the agent is Reset (no socket left behind).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from sixlab.cli import _argtypes as argtypes
from sixlab.cli import _daemon
from sixlab.dataplane.base import available
from sixlab.linux.signals import StopOnSignal
from sixlab.southbound.agent import DEFAULT_MAX_WORKERS, Role, TlsFiles, serve

__all__ = ["add_parsers", "run_agent"]

log = logging.getLogger("sixlab.agent")

#: Default gRPC address: loopback only, so an agent started by hand is not reachable
#: from the network until asked to be.
DEFAULT_GRPC = "[::1]:50051"


def add_parsers(stamp_subparsers: Any) -> None:
    """Add the ``agent`` subcommand to ``sixlab stamp``'s subparsers."""
    parser = stamp_subparsers.add_parser(
        "agent",
        help="run a STAMP agent serving the southbound gRPC API",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument(
        "--role", choices=[r.value for r in Role], required=True, help="sender or reflector"
    )
    parser.add_argument(
        "--grpc",
        metavar="ADDR",
        default=DEFAULT_GRPC,
        help=f"address to serve gRPC on, e.g. '[::]:50051' or 'unix:/run/a.sock' "
        f"(port 0: any free port; default {DEFAULT_GRPC})",
    )
    parser.add_argument(
        "--dataplane",
        metavar="NAME",
        default="socket",
        help="default data plane for Init (registered: " + ", ".join(available()) + ")",
    )
    _daemon.add_server_tls_arguments(parser, "southbound API")
    parser.add_argument(
        "--max-workers",
        type=argtypes.workers,
        default=DEFAULT_MAX_WORKERS,
        help=f"gRPC worker threads, each open result stream holds one "
        f"(default {DEFAULT_MAX_WORKERS})",
    )
    parser.add_argument(
        "--realtime-priority",
        type=argtypes.integer(1, 99, "a SCHED_FIFO priority"),
        default=None,
        metavar="N",
        help="run a sender's engine thread under SCHED_FIFO at priority N (needs "
        "CAP_SYS_NICE; keeps the send schedule on a loaded host; refused: logged, and "
        "the engine runs unprioritized)",
    )
    _daemon.add_logging_arguments(parser, default_level="info")
    parser.add_argument("--config", metavar="FILE", help="TOML file of flags (keys: long names)")
    parser.set_defaults(handler=run_agent)


def run_agent(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; 0 on a clean stop, 2 on bad options or address."""
    with _daemon.daemon_logging(args.log_format, args.log_level):
        return _run_agent(args)


def _run_agent(args: argparse.Namespace) -> int:
    try:
        files = _daemon.server_tls_files(args)
        warning = _daemon.exposure_warning(
            args.grpc, files, insecure=args.insecure, api="southbound API"
        )
        tls = None if files is None else TlsFiles(*files)
        if warning is not None:
            log.warning("%s", warning)
        server = serve(
            args.grpc,
            args.role,
            args.dataplane,
            tls=tls,
            max_workers=args.max_workers,
            realtime_priority=args.realtime_priority,
        )
    except (ValueError, OSError) as exc:
        print(f"sixlab stamp agent: {exc}", file=sys.stderr)
        return 2
    with StopOnSignal() as stop:
        try:
            print(
                f"stamp agent: role={args.role} grpc={args.grpc} port={server.port} "
                f"dataplane={args.dataplane}",
                flush=True,
            )
            log.info(
                "serving the southbound API on %s (port %d), role %s, data plane %s",
                args.grpc,
                server.port,
                args.role,
                args.dataplane,
            )
            stop.wait()
        finally:
            log.info("stopping")
            server.stop()
    return 0
