"""The root of every error ``sixlab.linux`` raises (see the package docstring's tree)."""

from __future__ import annotations

__all__ = ["LinuxError"]


class LinuxError(RuntimeError):
    """A kernel facility or system tool failed or is missing; the message says which."""
