"""argparse value types shared by every ``sixlab`` command.

Each turns one command-line string into a checked value or raises
``argparse.ArgumentTypeError`` with a message naming what is wrong, so a bad argument is
one clear line and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import ipaddress

__all__ = ["count", "hex_key", "ip", "ipv6", "port", "seconds", "sid_list", "ssid"]


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
