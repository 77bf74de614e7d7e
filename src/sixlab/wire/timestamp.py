"""STAMP timestamps and the Error Estimate field (RFC 8762 §4.2.1, RFC 5357 §4.1.2).

Timestamps travel as 64-bit integers in one of two formats, chosen by the Z bit of the
Error Estimate:

- NTP (Z = 0): 32-bit seconds since 1900-01-01 UTC, 32-bit fraction in 2^-32 s.
- PTPv2 truncated (Z = 1): 32-bit seconds and 32-bit nanoseconds since 1970-01-01 TAI.

Inside sixlab every instant is an integer count of nanoseconds since the Unix epoch on
the timescale of the format (UTC for NTP, TAI for PTP). Conversions are exact integer
arithmetic: ``ns_from_ntp(ntp_from_ns(n)) == n`` for every representable ``n`` (an NTP
fraction unit, 2^-32 s ≈ 0.23 ns, is finer than a nanosecond, and both directions round to
nearest). The 32-bit NTP seconds wrap in 2036; following RFC 4330 §3 a value whose top
bit is clear is read as NTP era 1, so instants from 1968-01-20 to 2104-02-26 round-trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from fractions import Fraction

from sixlab.wire._errors import InvalidFieldError

__all__ = [
    "NTP_MAX_NS",
    "NTP_MIN_NS",
    "NTP_UNIX_OFFSET_S",
    "PTP_MAX_NS",
    "ErrorEstimate",
    "TimestampFormat",
    "decode_timestamp",
    "encode_timestamp",
    "ns_from_ntp",
    "ns_from_ptp",
    "ntp_from_ns",
    "ptp_from_ns",
]

NS_PER_S = 1_000_000_000
#: Seconds from the NTP epoch (1900-01-01) to the Unix epoch (1970-01-01), RFC 868.
NTP_UNIX_OFFSET_S = 2_208_988_800
_ERA_S = 1 << 32
_HALF_ERA_S = 1 << 31
_FRAC_ONE = 1 << 32
#: First instant NTP can carry under the RFC 4330 pivot (era 0, top bit set): 1968-01-20.
NTP_MIN_NS = (_HALF_ERA_S - NTP_UNIX_OFFSET_S) * NS_PER_S
#: First instant past NTP's reach (end of the era-1 half): 2104-02-26.
NTP_MAX_NS = (_ERA_S + _HALF_ERA_S - NTP_UNIX_OFFSET_S) * NS_PER_S
#: First instant past the reach of PTPv2 truncated seconds (2106-02-07 TAI).
PTP_MAX_NS = _ERA_S * NS_PER_S


class TimestampFormat(IntEnum):
    """The Z bit of the Error Estimate (RFC 8762 §4.2.1)."""

    NTP = 0
    PTP = 1


def ntp_from_ns(ns: int) -> int:
    """Unix-epoch UTC nanoseconds to a 64-bit NTP timestamp (fraction rounded to nearest)."""
    if not NTP_MIN_NS <= ns < NTP_MAX_NS:
        raise InvalidFieldError(f"instant {ns} ns is outside the NTP timestamp range")
    seconds, nanos = divmod(ns, NS_PER_S)
    # nanos * 2^32 / 10^9 rounded to nearest; at most 4294967292 for nanos < 10^9, no carry.
    fraction = (nanos * _FRAC_ONE + NS_PER_S // 2) // NS_PER_S
    return (((seconds + NTP_UNIX_OFFSET_S) % _ERA_S) << 32) | fraction


def ns_from_ntp(timestamp: int) -> int:
    """A 64-bit NTP timestamp to Unix-epoch UTC nanoseconds (RFC 4330 §3 era pivot)."""
    _check_u64(timestamp)
    seconds, fraction = timestamp >> 32, timestamp & 0xFFFF_FFFF
    if not seconds & _HALF_ERA_S:
        seconds += _ERA_S  # era 1: 2036-02-07 onwards
    ns = (seconds - NTP_UNIX_OFFSET_S) * NS_PER_S + ((fraction * NS_PER_S + _FRAC_ONE // 2) >> 32)
    # Rounding the last fraction units of the window's last second up would name the
    # first instant past the window, which no NTP timestamp can carry back: stay inside.
    return min(ns, NTP_MAX_NS - 1)


def ptp_from_ns(ns: int) -> int:
    """Unix-epoch TAI nanoseconds to a 64-bit PTPv2 truncated timestamp."""
    if not 0 <= ns < PTP_MAX_NS:
        raise InvalidFieldError(f"instant {ns} ns is outside the PTP timestamp range")
    seconds, nanos = divmod(ns, NS_PER_S)
    return (seconds << 32) | nanos


def ns_from_ptp(timestamp: int) -> int:
    """A 64-bit PTPv2 truncated timestamp to Unix-epoch TAI nanoseconds."""
    _check_u64(timestamp)
    seconds, nanos = timestamp >> 32, timestamp & 0xFFFF_FFFF
    if nanos >= NS_PER_S:
        raise InvalidFieldError(f"PTP nanoseconds field {nanos} is not below 10^9")
    return seconds * NS_PER_S + nanos


def encode_timestamp(ns: int, fmt: TimestampFormat) -> int:
    """Nanoseconds on the format's timescale to the 64-bit wire value."""
    return ptp_from_ns(ns) if fmt is TimestampFormat.PTP else ntp_from_ns(ns)


def decode_timestamp(timestamp: int, fmt: TimestampFormat) -> int:
    """The 64-bit wire value to nanoseconds on the format's timescale."""
    return ns_from_ptp(timestamp) if fmt is TimestampFormat.PTP else ns_from_ntp(timestamp)


def _check_u64(value: int) -> None:
    if not 0 <= value < 1 << 64:
        raise InvalidFieldError(f"timestamp {value} does not fit in 64 bits")


_S_BIT = 0x8000
_Z_BIT = 0x4000
_SCALE_MASK = 0x3F00
_MULT_MASK = 0x00FF


@dataclass(frozen=True, slots=True)
class ErrorEstimate:
    """The 16-bit Error Estimate: ``S(1) Z(1) Scale(6) Multiplier(8)`` (RFC 4656 §4.1.2).

    The error is ``multiplier * 2**(scale - 32)`` seconds. A Multiplier of 0 is not valid
    on the wire (RFC 4656 §4.1.2: "MUST NOT be set to zero"); it decodes, so that a
    receiver can count the packet, but ``is_valid`` is false and reflectors drop it.
    """

    synchronized: bool = False
    fmt: TimestampFormat = TimestampFormat.NTP
    scale: int = 0
    multiplier: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.scale <= 63:
            raise InvalidFieldError(f"Error Estimate scale {self.scale} is not in 0..63")
        if not 0 <= self.multiplier <= 255:
            raise InvalidFieldError(f"Error Estimate multiplier {self.multiplier} not in 0..255")

    @property
    def is_valid(self) -> bool:
        return self.multiplier != 0

    def to_int(self) -> int:
        return (
            (_S_BIT if self.synchronized else 0)
            | (_Z_BIT if self.fmt is TimestampFormat.PTP else 0)
            | (self.scale << 8)
            | self.multiplier
        )

    @classmethod
    def from_int(cls, value: int) -> ErrorEstimate:
        if not 0 <= value <= 0xFFFF:
            raise InvalidFieldError(f"Error Estimate {value} does not fit in 16 bits")
        return cls(
            synchronized=bool(value & _S_BIT),
            fmt=TimestampFormat.PTP if value & _Z_BIT else TimestampFormat.NTP,
            scale=(value & _SCALE_MASK) >> 8,
            multiplier=value & _MULT_MASK,
        )

    @property
    def error(self) -> Fraction:
        """The estimated error in seconds, exactly."""
        return self.multiplier * Fraction(2) ** (self.scale - 32)

    @property
    def error_ns(self) -> int:
        """The estimated error in nanoseconds, rounded up (an error bound never shrinks)."""
        err = self.error * NS_PER_S
        return -(-err.numerator // err.denominator)

    @classmethod
    def for_error_ns(
        cls,
        error_ns: int,
        *,
        synchronized: bool = False,
        fmt: TimestampFormat = TimestampFormat.NTP,
    ) -> ErrorEstimate:
        """The smallest estimate whose error is at least ``error_ns`` (at least 2^-32 s)."""
        if error_ns < 0:
            raise InvalidFieldError("an error bound cannot be negative")
        target = Fraction(error_ns, NS_PER_S)
        for scale in range(64):
            unit = Fraction(2) ** (scale - 32)
            multiplier = max(
                1, -(-target.numerator * unit.denominator // (target.denominator * unit.numerator))
            )
            if multiplier <= 255:
                return cls(synchronized, fmt, scale, multiplier)
        raise InvalidFieldError(f"error {error_ns} ns exceeds what an Error Estimate can carry")
