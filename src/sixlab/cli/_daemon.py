"""What the long-running commands share: TLS flags with the exposure rule, and logging.

The daemons (``sixlab stamp agent``, ``sixlab controller serve``, ``sixlab ilnp
host``) take their flags from a config file too (``--config``, :mod:`sixlab.cli._config`).

Exposure rule. A gRPC server that takes orders (an agent's southbound API, the
controller's northbound API) listens in clear only where nobody else can reach it: a
unix socket or a loopback address (``sixlab.southbound.rpcserver.is_local``). On any
other address it needs mutual TLS (``--tls-cert``, ``--tls-key`` and ``--tls-ca``, the
CA that signs the clients allowed to call: for an agent, the controller's certificate)
unless the operator says ``--insecure``, which serves as asked with a warning. Server-only
TLS (no ``--tls-ca``) encrypts but lets anyone who reaches the port call, so it counts
as exposed too.

Logs. ``--log-format json`` writes one JSON object a line on stderr (``ts``, ``level``,
``logger``, ``msg``, and ``exc`` with a traceback), for journald and log shippers;
``text`` (the default) is for people. ``--log-level`` picks the threshold.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sixlab.southbound.rpcserver import is_local

__all__ = [
    "JsonFormatter",
    "add_logging_arguments",
    "add_server_tls_arguments",
    "daemon_logging",
    "exposure_warning",
    "server_tls_files",
]

LOG_LEVELS = ("debug", "info", "warning", "error")


def add_server_tls_arguments(parser: argparse.ArgumentParser, api: str) -> None:
    """``--tls-cert``, ``--tls-key``, ``--tls-ca`` and ``--insecure`` for a gRPC server."""
    parser.add_argument(
        "--tls-cert", type=Path, metavar="PATH", help=f"{api}: server certificate chain (PEM)"
    )
    parser.add_argument("--tls-key", type=Path, metavar="PATH", help=f"{api}: server key (PEM)")
    parser.add_argument(
        "--tls-ca",
        type=Path,
        metavar="PATH",
        help=f"{api}: CA (PEM) that signs the clients allowed to call (mutual TLS)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help=f"serve the {api} on a network address without mutual TLS (anyone who "
        "reaches it can call it); not needed on loopback or unix sockets",
    )


def server_tls_files(args: argparse.Namespace) -> tuple[Path, Path, Path | None] | None:
    """(cert, key, ca) from the TLS flags, or None; ValueError names a bad combination."""
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_ca is not None:
            raise ValueError("--tls-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise ValueError("--tls-cert and --tls-key go together")
    return args.tls_cert, args.tls_key, args.tls_ca


def exposure_warning(
    address: str, tls: tuple[Path, Path, Path | None] | None, *, insecure: bool, api: str
) -> str | None:
    """Apply the exposure rule: None if fine, a warning if ``--insecure`` allows it.

    Raises ValueError (the message says what to add) if the address is exposed.
    """
    if is_local(address) or (tls is not None and tls[2] is not None):
        return None
    what = "without TLS" if tls is None else "with TLS but without --tls-ca (any client)"
    if insecure:
        return (
            f"serving the {api} on {address} {what} (--insecure): anyone who can "
            "reach this address can call it"
        )
    raise ValueError(
        f"{address} is reachable from the network: serving the {api} there needs mutual "
        "TLS (--tls-cert, --tls-key and --tls-ca, the CA of the allowed clients), or "
        "--insecure to serve it anyway; a unix: socket or loopback address needs neither"
    )


def add_logging_arguments(parser: argparse.ArgumentParser, *, default_level: str) -> None:
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="log lines on stderr: text, or one JSON object a line (default text)",
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=default_level,
        help=f"least severe level logged (default {default_level})",
    )


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (RFC 3339, UTC), level, logger, msg[, exc]."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC).isoformat(
                timespec="microseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes (a test may swap it)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


@contextmanager
def daemon_logging(log_format: str, level: str) -> Iterator[None]:
    """While a daemon runs: the root logger's records go to stderr in ``log_format``
    from ``level`` up. On exit the root logger is as it was (a command run in-process,
    by a test, leaves no handler behind)."""
    handler = _StderrHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    saved = root.level
    root.addHandler(handler)
    root.setLevel(level.upper())
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(saved)
