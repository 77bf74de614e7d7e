"""The exception tree of ``sixlab.ilnp``.

::

    Exception
     └── IlnpError                 never a bad packet: a bug, a setting, or a system that
          │                        lacks what the daemon needs
          ├── InvalidTransitionError    a (state, event) pair missing from a state table
          ├── UnknownBackendError  no store or admission policy of that name (LookupError)
          ├── ConfigError          a setting that cannot work: no locator, a duplicate
          │                        one, a missing interface... (ValueError)
          ├── ResolveError         a name or NID no source resolves, a hosts file that
          │                        cannot be read or parsed (LookupError)
          ├── ControlError         a control socket reply that is missing or not JSON
          └── DaemonError          the system refused the daemon something (root, the TUN
                                   device, nftables, a socket); the cause is chained

Malformed or unwelcome packets are not exceptions: the host drops them, counts the
reason and emits a ``Dropped`` event (docs/architecture.md, "Errors and drops").
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ControlError",
    "DaemonError",
    "IlnpError",
    "InvalidTransitionError",
    "ResolveError",
    "UnknownBackendError",
]


class IlnpError(Exception):
    """Base of every error raised by ``sixlab.ilnp``."""


class InvalidTransitionError(IlnpError):
    """An event that the current state's table row does not allow."""


class UnknownBackendError(IlnpError, LookupError):
    """No ILCC store or admission policy is registered under that name."""


class ConfigError(IlnpError, ValueError):
    """A host or daemon setting that cannot work; the message names the setting."""


class ResolveError(IlnpError, LookupError):
    """A name or NID that no source could resolve, or a malformed hosts file line."""


class ControlError(IlnpError):
    """The daemon's control socket gave no reply, or one that is not a JSON object."""


class DaemonError(IlnpError):
    """The system refused the daemon what it needs; ``__cause__`` is the original error."""
