"""The controller's configuration file (TOML) for ``sixlab controller apply`` / ``export``.

::

    [nodes.s1]
    address = "[fc00:1::1]:50051"      # the agent (an address alone: port 50051)
    role = "sender"
    [nodes.s1.init]                    # optional: initialise the agent (node init)
    dataplane = "socket"
    port = 0
    source = "fc00:1::1"

    [sessions.path-a]
    sender = "s1"
    reflector = "r1"
    reflector-address = "fc00:3::1"
    segments = ["fc00:2::a", "fc00:3::1"]
    return-segments = ["fc00:2::b", "fc00:1::1"]
    interval = 1.0                     # seconds, as the CLI flags
    state = "running"                  # or "stopped"

Keys are the long flags of ``node add`` / ``node init`` / ``session create``, with the
same defaults and bounds; ``state`` says whether the session should run. Times are
seconds written as decimals and read exactly (a TOML float is parsed as a ``Decimal``),
so ``export`` and ``apply`` round-trip to the nanosecond. ``export`` never knows a key:
it writes ``key-sha256``, which ``apply`` takes as "keep the key with this hash".
"""

from __future__ import annotations

import argparse
import json
import re
import tomllib
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from sixlab.cli import _argtypes as argtypes
from sixlab.controller.client import messages as pb

__all__ = ["dump", "load", "loads"]

NS_PER_S = 1_000_000_000
#: Port of an agent given by its address alone (``sixlab stamp agent``'s default).
AGENT_PORT = 50051
_ROLES = {"sender": pb.NODE_ROLE_SENDER, "reflector": pb.NODE_ROLE_REFLECTOR}
_ROLE_NAMES = {v: k for k, v in _ROLES.items()}
_COLLECT = {"poll": pb.COLLECT_MODE_POLL, "stream": pb.COLLECT_MODE_STREAM}
_COLLECT_NAMES = {v: k for k, v in _COLLECT.items()}
_NODE_KEYS = {"address", "role", "init"}
_INIT_KEYS = {"dataplane", "port", "interface", "source"}
_SESSION_KEYS = {
    "sender", "reflector", "reflector-address", "segments", "return-segments",
    "return-path-tlv", "port", "source", "interval", "count", "duration", "loss-timeout",
    "ptp", "auth-key", "key-sha256", "stateful", "strict-ssid", "collect", "state",
    # SR performance measurement (docs/srpm.md)
    "loopback", "flow-labels", "dm-sender-sent", "dm-sender-received", "dm-reflector-sent",
    "dm-reflector-received", "max-delay-ms", "max-jitter-ms", "max-loss", "event-window",
}  # fmt: skip
#: The SR session keys that are text (direct-mode loss matches) and numbers (thresholds).
_DM_KEYS = ("dm-sender-sent", "dm-sender-received", "dm-reflector-sent", "dm-reflector-received")
_THRESHOLD_KEYS = {
    "max-delay-ms": "max_delay_ms",
    "max-jitter-ms": "max_jitter_ms",
    "max-loss": "max_loss_ratio",
}
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class _ConfigFileError(ValueError):
    """The file cannot be applied; the message names the key."""


def load(path: Path) -> pb.ApplyRequest:
    try:
        text = path.read_bytes().decode()
    except OSError as exc:
        raise _ConfigFileError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise _ConfigFileError(f"{path}: not UTF-8 text") from None
    return loads(text)


def loads(text: str) -> pb.ApplyRequest:
    try:
        doc = tomllib.loads(text, parse_float=Decimal)
    except tomllib.TOMLDecodeError as exc:
        raise _ConfigFileError(f"not TOML: {exc}") from None
    _keys("", doc, {"nodes", "sessions"})
    out = pb.ApplyRequest()
    for name, node in _table("nodes", doc.get("nodes", {})).items():
        out.nodes.append(_node(name, _table(f"nodes.{name}", node)))
    for name, session in _table("sessions", doc.get("sessions", {})).items():
        out.sessions.append(_session(name, _table(f"sessions.{name}", session)))
    return out


def _keys(where: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    for key in table:
        if key not in allowed:
            known = ", ".join(sorted(allowed))
            raise _ConfigFileError(f"{where}{key}: unknown key (known: {known})")


def _table(where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _ConfigFileError(f"{where}: must be a table")
    return value


def _arg(where: str, value: Any, parse: Callable[[str], Any], kind: type | tuple[type, ...]) -> Any:
    if isinstance(value, bool) or not isinstance(value, kind):
        raise _ConfigFileError(f"{where}: {value!r} is not {_kind(kind)}")
    try:
        return parse(str(value))
    except argparse.ArgumentTypeError as exc:
        raise _ConfigFileError(f"{where}: {exc}") from None


def _kind(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({str: "a string", int: "an integer", Decimal: "a number"}[k] for k in kinds)


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _ConfigFileError(f"{where}: {value!r} is not true or false")
    return value


def _seconds_ns(where: str, value: Any, parse: Callable[[str], float], zero: bool) -> int:
    """Seconds (an integer or a decimal) as exact ns, within ``parse``'s bounds."""
    if zero and value == 0 and not isinstance(value, bool):
        return 0
    _arg(where, value, parse, (int, Decimal))
    try:
        ns = Decimal(value) * NS_PER_S
    except InvalidOperation:
        raise _ConfigFileError(f"{where}: {value!r} is not a number of seconds") from None
    if ns != ns.to_integral_value():
        raise _ConfigFileError(f"{where}: {value} s is finer than a nanosecond")
    return int(ns)


def _choice(where: str, value: Any, table: Mapping[str, Any]) -> Any:
    if not isinstance(value, str) or value not in table:
        raise _ConfigFileError(f"{where}: {value!r} is not one of {', '.join(table)}")
    return table[value]


def _sids(where: str, value: Any) -> list[str]:
    if not isinstance(value, list):
        raise _ConfigFileError(f"{where}: must be a list of IPv6 addresses")
    return [str(_arg(f"{where}[{i}]", v, argtypes.ipv6, str)) for i, v in enumerate(value)]


def _node(name: str, node: dict[str, Any]) -> pb.NodeConfig:
    where = f"nodes.{name}."
    _arg(f"nodes.{name}", name, argtypes.name, str)
    _keys(where, node, _NODE_KEYS)
    for key in ("address", "role"):
        if key not in node:
            raise _ConfigFileError(f"{where}{key}: required")
    from sixlab.cli.controller import agent_target  # noqa: PLC0415 - no import cycle at load

    out = pb.NodeConfig(
        name=name,
        address=_arg(f"{where}address", node["address"], agent_target, str),
        role=_choice(f"{where}role", node["role"], _ROLES),
    )
    if "init" in node:
        init = _table(f"{where}init", node["init"])
        _keys(f"{where}init.", init, _INIT_KEYS)
        out.init.SetInParent()
        if "dataplane" in init:
            out.init.dataplane = _arg(
                f"{where}init.dataplane", init["dataplane"], argtypes.text, str
            )
        if "port" in init:
            out.init.port = _arg(f"{where}init.port", init["port"], argtypes.port, int)
        if "interface" in init:
            iface = _arg(f"{where}init.interface", init["interface"], argtypes.text, str)
            out.init.interface = iface
        if init.get("source"):
            out.init.source = str(_arg(f"{where}init.source", init["source"], argtypes.ip, str))
    return out


def _session(name: str, s: dict[str, Any]) -> pb.SessionConfig:
    where = f"sessions.{name}."
    _arg(f"sessions.{name}", name, argtypes.name, str)
    _keys(where, s, _SESSION_KEYS)
    loopback = _bool(f"{where}loopback", s.get("loopback", False))
    for key in ("sender",) if loopback else ("sender", "reflector", "reflector-address"):
        if key not in s:
            raise _ConfigFileError(f"{where}{key}: required")
    reflector = s.get("reflector", "")
    address = s.get("reflector-address", "")
    spec = pb.CreateSessionRequest(
        name=name,
        sender=_arg(f"{where}sender", s["sender"], argtypes.name, str),
        reflector=_arg(f"{where}reflector", reflector, argtypes.name, str) if reflector else "",
        reflector_address=str(_arg(f"{where}reflector-address", address, argtypes.ip, str))
        if address
        else "",
        segments=_sids(f"{where}segments", s.get("segments", [])),
        return_segments=_sids(f"{where}return-segments", s.get("return-segments", [])),
        return_path_tlv=_bool(f"{where}return-path-tlv", s.get("return-path-tlv", False)),
        reflector_port=_arg(f"{where}port", s.get("port", 862), argtypes.port, int),
        interval_ns=_seconds_ns(f"{where}interval", s.get("interval", 1), argtypes.interval, False),
        count=_arg(f"{where}count", s.get("count", 0), argtypes.count, int),
        duration_ns=_seconds_ns(f"{where}duration", s.get("duration", 0), argtypes.duration, True),
        loss_timeout_ns=_seconds_ns(
            f"{where}loss-timeout", s.get("loss-timeout", 2), argtypes.timeout, False
        ),
        ptp=_bool(f"{where}ptp", s.get("ptp", False)),
        stateful=_bool(f"{where}stateful", s.get("stateful", False)),
        strict_ssid=_bool(f"{where}strict-ssid", s.get("strict-ssid", False)),
        collect=_choice(f"{where}collect", s.get("collect", "poll"), _COLLECT),
    )
    if s.get("source"):
        spec.source_address = str(_arg(f"{where}source", s["source"], argtypes.ip, str))
    _srpm_session(where, s, spec)
    if "auth-key" in s:
        spec.key = _arg(f"{where}auth-key", s["auth-key"], argtypes.hex_key, str)
    digest = s.get("key-sha256", "")
    if not isinstance(digest, str) or (digest and not re.fullmatch(r"[0-9a-fA-F]{64}", digest)):
        raise _ConfigFileError(f"{where}key-sha256: {digest!r} is not 64 hex digits")
    if digest and "auth-key" in s:
        raise _ConfigFileError(f"{where}key-sha256: give auth-key or key-sha256, not both")
    running = _choice(f"{where}state", s.get("state", "running"), {"running": 1, "stopped": 0})
    return pb.SessionConfig(spec=spec, key_sha256=digest, running=bool(running))


def _srpm_session(where: str, s: dict[str, Any], spec: pb.CreateSessionRequest) -> None:
    """The SR performance-measurement keys of a session (docs/srpm.md) into ``spec``."""
    spec.loopback = _bool(f"{where}loopback", s.get("loopback", False))
    labels = s.get("flow-labels", [])
    if not isinstance(labels, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in labels
    ):
        raise _ConfigFileError(f"{where}flow-labels: a list of integers")
    spec.flow_labels.extend(labels)
    for key in _DM_KEYS:
        value = s.get(key, "")
        if not isinstance(value, str):
            raise _ConfigFileError(f"{where}{key}: text, PREFIX[,udp|tcp[,PORT]]")
        setattr(spec, key.replace("-", "_"), value)
    for key, field_name in _THRESHOLD_KEYS.items():
        if key in s:
            value = s[key]
            # Floats come as Decimal (``loads`` reads them exactly).
            if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
                raise _ConfigFileError(f"{where}{key}: a number")
            setattr(spec, field_name, float(value))
    if "event-window" in s:
        window = _seconds_ns(f"{where}event-window", s["event-window"], argtypes.timeout, False)
        spec.event_window_s = window / NS_PER_S


# ------------------------------------------------------------------------------ export


def _key(name: str) -> str:
    return name if _BARE_KEY.match(name) else json.dumps(name)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(value)


def _seconds(ns: int) -> str:
    """Exact decimal seconds, always with a point (a TOML float)."""
    whole, frac = divmod(ns, NS_PER_S)
    return f"{whole}.{f'{frac:09d}'.rstrip('0') or '0'}"


def dump(config: pb.ApplyRequest) -> str:
    """The configuration as TOML that ``loads`` reads back to the same request."""
    lines = ["# sixlab controller configuration (sixlab controller export)", ""]
    for node in config.nodes:
        lines.append(f"[nodes.{_key(node.name)}]")
        lines.append(f"address = {_value(node.address)}")
        lines.append(f"role = {_value(_ROLE_NAMES[node.role])}")
        if node.HasField("init"):
            lines.append(f"[nodes.{_key(node.name)}.init]")
            lines.append(f"dataplane = {_value(node.init.dataplane)}")
            if node.init.HasField("port"):
                lines.append(f"port = {node.init.port}")
            lines.append(f"interface = {_value(node.init.interface)}")
            lines.append(f"source = {_value(node.init.source)}")
        lines.append("")
    for session in config.sessions:
        spec = session.spec
        lines += [
            f"[sessions.{_key(spec.name)}]",
            f"sender = {_value(spec.sender)}",
            f"reflector = {_value(spec.reflector)}",
            f"reflector-address = {_value(spec.reflector_address)}",
            f"segments = {_value(list(spec.segments))}",
            f"return-segments = {_value(list(spec.return_segments))}",
            f"return-path-tlv = {_value(spec.return_path_tlv)}",
            f"port = {spec.reflector_port}",
            f"source = {_value(spec.source_address)}",
            f"interval = {_seconds(spec.interval_ns)}",
            f"count = {spec.count}",
            f"duration = {_seconds(spec.duration_ns)}",
            f"loss-timeout = {_seconds(spec.loss_timeout_ns)}",
            f"ptp = {_value(spec.ptp)}",
            f"stateful = {_value(spec.stateful)}",
            f"strict-ssid = {_value(spec.strict_ssid)}",
            f"collect = {_value(_COLLECT_NAMES[spec.collect])}",
        ]
        lines += _srpm_lines(spec)
        if session.key_sha256:
            lines.append(f"key-sha256 = {_value(session.key_sha256)}")
        lines.append(f"state = {_value('running' if session.running else 'stopped')}")
        lines.append("")
    return "\n".join(lines)


def _srpm_lines(spec: pb.CreateSessionRequest) -> list[str]:
    """The SR performance-measurement keys of a session that differ from the defaults."""
    lines = []
    if spec.loopback:
        lines.append("loopback = true")
    if spec.flow_labels:
        lines.append(f"flow-labels = {_value(list(spec.flow_labels))}")
    for key in _DM_KEYS:
        value = getattr(spec, key.replace("-", "_"))
        if value:
            lines.append(f"{key} = {_value(value)}")
    for key, field_name in _THRESHOLD_KEYS.items():
        if spec.HasField(field_name):  # type: ignore[arg-type]
            lines.append(f"{key} = {getattr(spec, field_name)!r}")
    if spec.HasField("event_window_s"):
        lines.append(f"event-window = {_seconds(round(spec.event_window_s * NS_PER_S))}")
    return lines
