"""The ``sixlab`` command.

Subcommands live in the modules that implement them; each exposes ``add_parsers`` and
sets a ``handler`` on its parser, so this file stays a dispatcher.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sixlab import __version__

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from sixlab import _cli_demo, _cli_stamp  # noqa: PLC0415 - keeps `--version` instant
    from sixlab.controller import _cli as _cli_controller  # noqa: PLC0415
    from sixlab.ilnp import _cli as _cli_ilnp  # noqa: PLC0415
    from sixlab.southbound import _cli as _cli_agent  # noqa: PLC0415

    parser = argparse.ArgumentParser(
        prog="sixlab",
        description="STAMP delay monitoring for SRv6, ILNPv6 hosts, and their lab.",
    )
    parser.add_argument("--version", action="version", version=f"sixlab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _cli_demo.add_parsers(sub)
    stamp = sub.add_parser("stamp", help="STAMP tools: sender, reflector, agent").add_subparsers(
        dest="stamp_command", required=True, metavar="TOOL"
    )
    _cli_stamp.add_parsers(stamp)
    _cli_agent.add_parsers(stamp)
    _cli_controller.add_parsers(sub)
    _cli_ilnp.add_parsers(sub)
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
