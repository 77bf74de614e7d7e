"""``--config FILE`` for the daemons: a TOML file whose keys are long flag names.

::

    # /etc/sixlab/agent.toml
    role = "sender"
    grpc = "[::]:50051"
    tls-cert = "/etc/sixlab/tls/agent.pem"
    tls-key = "/etc/sixlab/tls/agent.key"
    tls-ca = "/etc/sixlab/tls/ca.pem"
    log-format = "json"

Each key is a flag of the command without its dashes (``tls-cert`` for ``--tls-cert``);
its value goes through the flag's own type and bounds, as if it had been typed. A flag
given on the command line wins over the file (for a repeatable flag, all of the file's
values give way). ``true``/``false`` set switches (``insecure = true``); a list gives a
repeatable flag (``interface = ["eth0", "eth1"]``). An unknown key, a bad value or an
unreadable file is one line and exit status 2, as for a bad flag.

How: before parsing, :func:`apply_config_file` finds ``--config`` and the subcommand
on the command line, reads the file and sets each key's value as its flag's default
(and drops ``required``), so argparse does everything else as usual.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Sequence
from typing import Any

__all__ = ["apply_config_file"]

OPTION = "--config"


def _config_path(argv: Sequence[str]) -> str | None:
    path = None
    for i, token in enumerate(argv):
        if token == "--":  # noqa: S105 - the end of options, not a password
            break
        if token == OPTION and i + 1 < len(argv):
            path = argv[i + 1]
        elif token.startswith(OPTION + "="):
            path = token.partition("=")[2]
    return path


def _subparser(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The (sub)parser the command line's leading words select."""
    current = parser
    for token in argv:
        if token.startswith("-"):
            continue
        actions = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or token not in actions[0].choices:
            break
        current = actions[0].choices[token]
    return current


def _given(action: argparse.Action, argv: Sequence[str]) -> bool:
    return any(
        token == opt or token.startswith(opt + "=")
        for token in argv
        for opt in action.option_strings
    )


def apply_config_file(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Make the values of ``--config FILE`` the defaults of the selected command."""
    path = _config_path(argv)
    if path is None:
        return
    target = _subparser(parser, argv)
    if not any(OPTION in a.option_strings for a in target._actions):
        return  # argparse refuses --config for this command itself
    try:
        with open(path, "rb") as f:  # noqa: PTH123 - a path given by the user
            doc = tomllib.load(f)
    except OSError as exc:
        target.error(f"{OPTION} {path}: {exc.strerror}")
    except tomllib.TOMLDecodeError as exc:
        target.error(f"{OPTION} {path}: not TOML: {exc}")
    actions = {
        opt[2:]: a for a in target._actions for opt in a.option_strings if opt.startswith("--")
    }
    for key, value in doc.items():
        action = actions.get(key)
        if action is None or key in ("config", "help"):
            known = ", ".join(sorted(k for k in actions if k not in ("config", "help")))
            target.error(f"{OPTION} {path}: unknown key {key!r} (known: {known})")
        if _given(action, argv):
            continue
        try:
            action.default = _convert(action, value)
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            target.error(f"{OPTION} {path}: {key}: {exc}")
        action.required = False


def _convert(action: argparse.Action, value: Any) -> Any:
    if action.nargs == 0:  # a switch (store_true/store_false)
        if not isinstance(value, bool):
            raise ValueError(f"{value!r} is not true or false")
        return value if action.const is True else not value if action.const is False else value
    if isinstance(value, bool | dict):
        raise TypeError(f"{value!r} is not a value for this flag")
    if isinstance(action, argparse._AppendAction):
        values = value if isinstance(value, list) else [value]
        return [_one(action, v) for v in values]
    if isinstance(value, list):
        raise TypeError("one value, not a list")
    return _one(action, value)


def _one(action: argparse.Action, value: Any) -> Any:
    if isinstance(value, bool | dict | list):
        raise TypeError(f"{value!r} is not a value for this flag")
    text = str(value)
    converted = action.type(text) if callable(action.type) else text
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ValueError(f"{text!r} is not one of {choices}")
    return converted
