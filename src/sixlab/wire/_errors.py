"""The exception tree of ``sixlab.wire``.

::

    ValueError
     └── WireError              any byte string a decoder refuses
          ├── TruncatedError    the buffer ends before a field it must hold
          └── InvalidFieldError a field holds a value the format forbids
               └── ChecksumError  a checksum that does not verify (callers count it apart)

Every decoder either returns a value or raises a ``WireError``; nothing else escapes
(no ``IndexError``, no ``struct.error``). Encoders raise ``WireError`` too when given a
value that cannot be represented on the wire.
"""

from __future__ import annotations

__all__ = ["ChecksumError", "InvalidFieldError", "TruncatedError", "WireError", "check_uint"]


class WireError(ValueError):
    """A byte string that does not decode, or a value that does not encode."""


class TruncatedError(WireError):
    """The buffer ends before a field that must be present."""


class InvalidFieldError(WireError):
    """A field holds a value that the format does not allow."""


class ChecksumError(InvalidFieldError):
    """A checksum field that does not verify over the bytes it covers."""


def check_uint(name: str, value: int, bits: int) -> None:
    """Raise ``InvalidFieldError`` unless ``value`` fits an unsigned ``bits``-bit field."""
    if not 0 <= value < 1 << bits:
        raise InvalidFieldError(f"{name} {value} does not fit in {bits} bits")
