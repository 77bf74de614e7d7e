"""Ephemeral ports for tests that must name a port before the process that binds it
starts (a configuration file, a command line): never a fixed one, which collides when
two test runs share a machine."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "::1", kind: socket.SocketKind = socket.SOCK_DGRAM) -> int:
    """A port the kernel hands out as free on ``host`` for ``kind`` (UDP by default):
    bound to port 0, read, released."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, kind) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port
