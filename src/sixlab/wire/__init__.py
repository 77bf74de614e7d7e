"""Pure codecs: bytes in, typed values out, and back. No I/O, no clocks.

Every decoder returns a value or raises ``WireError`` (a ``ValueError``).
"""

from sixlab.wire._errors import ChecksumError, InvalidFieldError, TruncatedError, WireError

__all__ = ["ChecksumError", "InvalidFieldError", "TruncatedError", "WireError"]
