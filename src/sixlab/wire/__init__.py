"""Pure codecs: bytes in, typed values out, and back. No I/O, no clocks.

One public module per format; each holds its own ``__all__``:

- :mod:`sixlab.wire.ipv6`: the IPv6 fixed header (RFC 8200 §3), Next Header numbers.
- :mod:`sixlab.wire.srh`: the Segment Routing Header (RFC 8754 §2).
- :mod:`sixlab.wire.udp`, :mod:`sixlab.wire.checksum`: UDP (RFC 768) and the Internet
  checksum (RFC 1071, RFC 1624) with the IPv6 pseudo-header.
- :mod:`sixlab.wire.packet`: whole IPv6/UDP packets, optionally with an SRH.
- :mod:`sixlab.wire.stamp`, :mod:`sixlab.wire.stamp_tlv`, :mod:`sixlab.wire.stamp_auth`,
  :mod:`sixlab.wire.timestamp`: STAMP packets (RFC 8762), TLVs (RFC 8972), HMAC and
  timestamps.
- :mod:`sixlab.wire.ilnp`: ILNPv6 (RFC 6740-6744): I-LVs, the Nonce option, Locator
  Updates.

Errors
------
Every decoder returns a value or raises ``WireError`` (a ``ValueError``)::

    ValueError
     └── WireError              any byte string a decoder refuses
          ├── TruncatedError    the buffer ends before a field it must hold
          └── InvalidFieldError a field holds a value the format forbids
               └── ChecksumError  a checksum that does not verify (callers count it apart)
"""

from sixlab.wire._errors import ChecksumError, InvalidFieldError, TruncatedError, WireError

__all__ = ["ChecksumError", "InvalidFieldError", "TruncatedError", "WireError"]
