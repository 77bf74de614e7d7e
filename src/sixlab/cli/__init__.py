"""The ``sixlab`` command.

One module per command group (``demo``, ``stamp`` with ``agent``, ``controller``,
``ilnp``), each thin over the library: it exposes ``add_parsers`` and sets a ``handler``
on its parser, so this file stays a dispatcher.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sixlab import __version__

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from sixlab.cli import agent, controller, demo, ilnp, stamp  # noqa: PLC0415 - keeps `--version` instant

    parser = argparse.ArgumentParser(
        prog="sixlab",
        description="STAMP delay monitoring for SRv6, ILNPv6 hosts, and their lab.",
    )
    parser.add_argument("--version", action="version", version=f"sixlab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo.add_parsers(sub)
    tools = sub.add_parser("stamp", help="STAMP tools: sender, reflector, agent").add_subparsers(
        dest="stamp_command", required=True, metavar="TOOL"
    )
    stamp.add_parsers(tools)
    agent.add_parsers(tools)
    controller.add_parsers(sub)
    ilnp.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc: int = args.handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 0
    return rc
