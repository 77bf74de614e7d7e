"""Pure codecs: bytes in, typed values out, and back. No I/O, no clocks."""
