"""The root of every error ``sixlab.linux`` raises (see the package docstring's tree)."""

from __future__ import annotations

import errno
import os

__all__ = ["LinuxError", "XskError"]


class LinuxError(RuntimeError):
    """A kernel facility or system tool failed or is missing; the message says which."""


class XskError(LinuxError):
    """An AF_XDP call failed (``sixlab.linux.xsk``); ``errno`` is the positive error number."""

    def __init__(self, op: str, err: int) -> None:
        self.op = op
        self.errno = err
        name = errno.errorcode.get(err, str(err))
        super().__init__(f"af_xdp: {op} failed: {name} ({os.strerror(err)})")
