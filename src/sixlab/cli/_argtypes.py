"""argparse value types shared by every ``sixlab`` command.

Each turns one command-line string into a checked value or raises
``argparse.ArgumentTypeError`` with a message naming what is wrong, so a bad argument is
one clear line and exit status 2, never a traceback. Every number has bounds: what a
later conversion (seconds to ns in a uint64 protobuf field, a 32-bit sequence number,
a thread pool) could not take is refused here, with the bound in the message.

Text arguments pass through :func:`text` (or a type built on it): Python hands
command-line bytes that are not UTF-8 over as lone surrogates, which no protobuf string,
gRPC target or file name in a message can carry.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
from collections.abc import Callable

from sixlab.linux import FlowMatch
from sixlab.stamp import SessionConfigError, check_flow_labels

__all__ = [
    "MAX_COUNT",
    "MAX_NAME",
    "count",
    "duration",
    "flow_labels",
    "flow_match",
    "hex_key",
    "integer",
    "interval",
    "ip",
    "ipv6",
    "name",
    "port",
    "seconds",
    "seconds_in",
    "sid_list",
    "ssid",
    "text",
    "timeout",
    "timeout_or_zero",
    "u64",
    "workers",
]

#: A STAMP Sequence Number is 32 bits (RFC 8762 §4.2.1): a session of more packets
#: would reuse numbers, and one that must stop after more never reaches its count.
MAX_COUNT = 0xFFFF_FFFF
#: Node and session names label metrics and table rows (as the northbound API checks).
MAX_NAME = 64
#: Bounds of time arguments, in seconds. The shortest interval is the agent's
#: (1 µs); a day between packets or a year of sending is already more than any
#: measurement wants, and keeps every value well inside a uint64 of ns.
MIN_INTERVAL_S = 1e-6
MAX_INTERVAL_S = 86_400.0
MAX_DURATION_S = 366 * 86_400.0
MAX_TIMEOUT_S = 86_400.0
MAX_WORKERS = 1024


def text(value: str) -> str:
    """Any text, if it is valid UTF-8 (refuses the surrogates of undecodable bytes)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        shown = value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise argparse.ArgumentTypeError(f"not valid UTF-8: '{shown}'") from None
    return value


def name(value: str) -> str:
    """A node or session name: 1 to 64 printable characters, no blanks."""
    value = text(value)
    if not value:
        raise argparse.ArgumentTypeError("a name cannot be empty")
    if len(value) > MAX_NAME:
        raise argparse.ArgumentTypeError(f"{len(value)} characters, at most {MAX_NAME}")
    if not value.isprintable() or any(c.isspace() for c in value):
        raise argparse.ArgumentTypeError(f"{value!r} has blanks or control characters")
    return value


def ipv6(value: str) -> ipaddress.IPv6Address:
    try:
        return ipaddress.IPv6Address(text(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IPv6 address: {value!r}") from None


def ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IPv4 or IPv6 address."""
    try:
        return ipaddress.ip_address(text(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IPv4 or IPv6 address: {value!r}") from None


def sid_list(value: str) -> tuple[ipaddress.IPv6Address, ...]:
    """``S1,S2,...``: an SRv6 SID list in travel order."""
    segs = tuple(ipv6(s.strip()) for s in value.split(",") if s.strip())
    if not segs:
        raise argparse.ArgumentTypeError("the SID list is empty")
    return segs


def integer(lo: int, hi: int, what: str = "an integer") -> Callable[[str], int]:
    """An integer in ``lo..hi``."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {value!r}") from None
        if not lo <= number <= hi:
            raise argparse.ArgumentTypeError(f"{number} is not in {lo}..{hi}")
        return number

    parse.__name__ = what
    return parse


def port(value: str) -> int:
    return integer(0, 0xFFFF, "a port number")(value)


def count(value: str) -> int:
    """A packet count: 0..2^32-1 (the STAMP Sequence Number's range)."""
    return integer(0, MAX_COUNT, "an integer")(value)


def u64(value: str) -> int:
    """A non-negative integer that fits 64 bits (e.g. a Unix time in ns)."""
    return integer(0, 2**64 - 1, "an integer")(value)


def workers(value: str) -> int:
    """A thread-pool size."""
    return integer(1, MAX_WORKERS, "a number of threads")(value)


def ssid(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an SSID: {value!r}") from None
    if not 0 <= number <= 0xFFFF:
        raise argparse.ArgumentTypeError(f"SSID {number} is not a 16-bit value")
    return number


def seconds_in(lo: float, hi: float, *, zero: bool = False) -> Callable[[str], float]:
    """A number of seconds in ``lo..hi`` (and 0 if ``zero``); refuses NaN and infinity."""

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
        if zero and number == 0:
            return 0.0
        if not math.isfinite(number) or number <= 0:
            raise argparse.ArgumentTypeError(f"{value} s: must be a positive number")
        if number < lo:
            raise argparse.ArgumentTypeError(f"{value} s: at least {lo:g} s")
        if number > hi:
            raise argparse.ArgumentTypeError(f"{value} s: at most {_span(hi)}")
        return number

    parse.__name__ = "seconds"
    return parse


def _span(s: float) -> str:
    """``s`` seconds as written, and in days from a day up (``86400 s (1 day)``)."""
    if s < 86_400:
        return f"{s:g} s"
    return f"{s:.0f} s ({s / 86_400:g} day" + ("" if s == 86_400 else "s") + ")"


#: Time between test packets.
interval = seconds_in(MIN_INTERVAL_S, MAX_INTERVAL_S)
#: How long a session sends.
duration = seconds_in(MIN_INTERVAL_S, MAX_DURATION_S)
#: Loss timeouts, waits, poll periods.
timeout = seconds_in(1e-3, MAX_TIMEOUT_S)
#: The same, or 0 (none).
timeout_or_zero = seconds_in(1e-3, MAX_TIMEOUT_S, zero=True)
#: Any positive, finite duration up to a year.
seconds = seconds_in(1e-9, MAX_DURATION_S)


def hex_key(value: str) -> bytes:
    """An HMAC key written in hexadecimal."""
    try:
        key = bytes.fromhex(text(value))
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
