"""``sixlab stamp agent``: run a STAMP agent (the southbound gRPC server) in the foreground.

::

    sixlab stamp agent --role reflector --grpc '[::1]:50052' --dataplane socket
    sixlab stamp agent --role sender --grpc '[::]:50051' \\
        --tls-cert agent.pem --tls-key agent.key --tls-ca ca.pem     # mTLS

When it listens it prints one line to stdout,
``stamp agent: role=ROLE grpc=ADDR port=PORT dataplane=NAME``, so a supervisor (or a
test) started with port 0 learns the port. SIGTERM and SIGINT stop it: the gRPC server
first, then the agent is Reset (no socket left behind).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sixlab.dataplane.base import available
from sixlab.linux.signals import StopOnSignal
from sixlab.southbound.agent import DEFAULT_MAX_WORKERS, Role, TlsFiles, serve

__all__ = ["add_parsers", "run_agent"]

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
    parser.add_argument("--tls-cert", type=Path, metavar="PATH", help="server certificate (PEM)")
    parser.add_argument("--tls-key", type=Path, metavar="PATH", help="server private key (PEM)")
    parser.add_argument(
        "--tls-ca",
        type=Path,
        metavar="PATH",
        help="CA certificate (PEM): require client certificates signed by it (mTLS)",
    )
    parser.add_argument(
        "--max-workers", type=int, default=DEFAULT_MAX_WORKERS, help="gRPC worker threads"
    )
    parser.set_defaults(handler=run_agent)


def _tls(args: argparse.Namespace) -> TlsFiles | None:
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_ca is not None:
            raise ValueError("--tls-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise ValueError("--tls-cert and --tls-key go together")
    return TlsFiles(args.tls_cert, args.tls_key, args.tls_ca)


def run_agent(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; 0 on a clean stop, 2 on bad options or address."""
    try:
        server = serve(
            args.grpc, args.role, args.dataplane, tls=_tls(args), max_workers=args.max_workers
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
            stop.wait()
        finally:
            server.stop()
    return 0
