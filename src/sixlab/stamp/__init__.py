"""Sans-I/O STAMP (RFC 8762, RFC 8972): sessions, Session-Sender, Session-Reflector, delay maths."""
