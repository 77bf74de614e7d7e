"""``sixlab install-units``: install the systemd units of the daemons, and example configs.

::

    sixlab install-units                 # /etc/systemd/system and /etc/sixlab
    systemctl daemon-reload
    systemctl enable --now sixlab-controller sixlab-agent@sender

Copies ``deploy/systemd/*.service`` (``sixlab-agent@.service``,
``sixlab-controller.service``, ``sixlab-ilnp@.service``) into the unit directory, with
``ExecStart`` pointing at the Python that runs this command (``PYTHON -m sixlab``, so a
virtual environment's sixlab is the one started), and ``deploy/config/*.toml`` into
``/etc/sixlab`` as examples, never over a file that exists. ``--root DIR`` installs
under DIR instead of ``/`` (packaging, tests). The files come from the source tree
this sixlab runs from (``./run`` installs it in place); ``--from DIR`` names another
``deploy/`` folder.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parsers", "install_units"]

#: Where the units say sixlab is, before installation points them at the real one.
PLACEHOLDER = "/usr/local/bin/sixlab"
UNIT_DIR = Path("etc/systemd/system")
CONFIG_DIR = Path("etc/sixlab")


def _deploy_dir() -> Path:
    return Path(__file__).resolve().parents[3] / "deploy"


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "install-units",
        help="install the systemd units of the agent, the controller and the ILNP host",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("--root", type=Path, default=Path("/"), help="install under DIR (default /)")
    p.add_argument(
        "--from",
        dest="source",
        type=Path,
        default=None,
        metavar="DIR",
        help="the deploy/ folder to install from (default: this source tree's)",
    )
    p.set_defaults(handler=_run)


def install_units(root: Path, source: Path | None = None) -> list[Path]:
    """Install the units and example configs under ``root``; the files written."""
    deploy = source or _deploy_dir()
    units = sorted((deploy / "systemd").glob("*.service"))
    if not units:
        raise FileNotFoundError(f"no systemd units in {deploy / 'systemd'} (use --from DIR)")
    command = f"{shlex.quote(sys.executable)} -m sixlab"
    written = []
    unit_dir = root / UNIT_DIR
    unit_dir.mkdir(parents=True, exist_ok=True)
    for unit in units:
        target = unit_dir / unit.name
        target.write_text(unit.read_text().replace(PLACEHOLDER, command))
        written.append(target)
    config_dir = root / CONFIG_DIR
    config_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    for example in sorted((deploy / "config").glob("*.toml")):
        target = config_dir / example.name
        if not target.exists():
            target.write_text(example.read_text())
            written.append(target)
    return written


def _run(args: argparse.Namespace) -> int:
    try:
        written = install_units(args.root, args.source)
    except OSError as exc:
        print(f"sixlab install-units: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"installed {path}")
    print(
        "next: edit /etc/sixlab/*.toml, then `systemctl daemon-reload` and e.g. "
        "`systemctl enable --now sixlab-controller sixlab-agent@sender`"
    )
    return 0
