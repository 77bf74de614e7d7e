"""argparse value types shared by every ``sixlab`` command.

Each turns one command-line string into a checked value or raises
``argparse.ArgumentTypeError`` with a message naming what is wrong, so a bad argument is
one clear line and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import ipaddress

from sixlab.linux import FlowMatch
from sixlab.stamp import SessionConfigError, check_flow_labels

__all__ = [
    "count",
    "flow_labels",
    "flow_match",
    "hex_key",
    "ip",
    "ipv6",
    "port",
    "seconds",
    "sid_list",
    "ssid",
]


def ipv6(text: str) -> ipaddress.IPv6Address:
    try:
        return ipaddress.IPv6Address(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IPv6 address: {text!r}") from None


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IPv4 or IPv6 address."""
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IPv4 or IPv6 address: {text!r}") from None


def sid_list(text: str) -> tuple[ipaddress.IPv6Address, ...]:
    """``S1,S2,...``: an SRv6 SID list in travel order."""
    segs = tuple(ipv6(s.strip()) for s in text.split(",") if s.strip())
    if not segs:
        raise argparse.ArgumentTypeError("the SID list is empty")
    return segs


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 0xFFFF:
        raise argparse.ArgumentTypeError(f"port {value} is not in 0..65535")
    return value


def seconds(text: str) -> float:
    """A positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"{text} s: must be positive")
    return value


def count(text: str) -> int:
    """A non-negative integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: must not be negative")
    return value


def ssid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an SSID: {text!r}") from None
    if not 0 <= value <= 0xFFFF:
        raise argparse.ArgumentTypeError(f"SSID {value} is not a 16-bit value")
    return value


def hex_key(text: str) -> bytes:
    """An HMAC key written in hexadecimal."""
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise argparse.ArgumentTypeError("the key must be hexadecimal") from None
    if not key:
        raise argparse.ArgumentTypeError("the key is empty")
    return key


def flow_labels(text: str) -> tuple[int, ...]:
    """``N`` (labels 1..N) or ``L1,L2,...`` (decimal or 0x hex; ``L1,`` for one label):
    IPv6 flow labels (ECMP coverage, docs/srpm.md)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = [int(p, 0) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a count or a list of flow labels: {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("no flow label given")
    labels = tuple(range(1, values[0] + 1)) if len(values) == 1 and "," not in text else values
    try:
        return check_flow_labels(labels)
    except SessionConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def flow_match(text: str) -> FlowMatch:
    """``PREFIX[,udp|tcp[,PORT]]``: a data flow to count (direct-mode loss, docs/srpm.md)."""
    parts = [p.strip() for p in text.split(",")]
    if not 1 <= len(parts) <= 3 or not parts[0]:
        raise argparse.ArgumentTypeError(f"expected PREFIX[,udp|tcp[,PORT]], got {text!r}")
    try:
        port_number = int(parts[2]) if len(parts) == 3 else 0
        return FlowMatch.parse(parts[0], parts[1] if len(parts) > 1 else "", port_number)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
