"""The ``sixlab`` command.

One module per command group (``demo``, ``stamp`` with ``agent``, ``controller``,
``ilnp``, ``install-units``), each thin over the library: it exposes ``add_parsers`` and
sets a ``handler`` on its parser, so this file stays a dispatcher. The daemons also take
their flags from ``--config FILE`` (``sixlab.cli._config``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sixlab import __version__

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from sixlab.cli import agent, controller, demo, ilnp, install, stamp  # noqa: PLC0415 - keeps `--version` instant

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
    install.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from sixlab.cli._config import apply_config_file  # noqa: PLC0415

    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    apply_config_file(parser, argv)
    args = parser.parse_args(argv)
    try:
        rc: int = args.handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 0
    return rc
