"""The exception tree of ``sixlab.ilnp``.

::

    Exception
     └── IlnpError                 a bug or a configuration mistake, never a bad packet
          ├── InvalidTransitionError    a (state, event) pair missing from a state table
          └── UnknownBackendError  no store or admission policy of that name (LookupError)

Malformed or unwelcome packets are not exceptions: the host drops them, counts the
reason and emits a ``Dropped`` event (STYLE.md §6).
"""

from __future__ import annotations

__all__ = ["IlnpError", "InvalidTransitionError", "UnknownBackendError"]


class IlnpError(Exception):
    """Base of every error raised by ``sixlab.ilnp``."""


class InvalidTransitionError(IlnpError):
    """An event that the current state's table row does not allow."""


class UnknownBackendError(IlnpError, LookupError):
    """No ILCC store or admission policy is registered under that name."""
