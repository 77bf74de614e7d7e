"""Sans-I/O STAMP (RFC 8762, RFC 8972): Session-Sender, Session-Reflector, delay maths.

- :mod:`sixlab.stamp.sender`: :class:`SenderSession`, one Session-Sender session.
- :mod:`sixlab.stamp.reflector`: :class:`Reflector`, a Session-Reflector answering the
  sessions it holds (and a default one).
- :mod:`sixlab.stamp.stats`: delay summaries and per-path statistics over results.

What the core gives out (result records, events, drop reasons) and its errors are
exported here; the engines of :mod:`sixlab.dataplane.engine` join the core to a data
plane.

Errors
------
::

    StampError                 misuse of the core by its caller (not bad packets)
     ├── SessionStateError     an input the session's state table does not accept
     └── SessionConfigError    a session configuration that cannot work (ValueError)

Bad *packets* never raise out of the core: they become a ``PacketDropped`` event and a
count under a ``DropReason``.
"""

from sixlab.stamp._events import (
    DropReason,
    DuplicateReceived,
    Event,
    PacketDropped,
    PacketLost,
    PacketSent,
    SessionConfigError,
    SessionFinished,
    SessionStateError,
    StampError,
    StampResult,
)
from sixlab.stamp.reflector import (
    PacketContext,
    Reflection,
    Reflector,
    ReflectorCounters,
    ReflectorMode,
    ReflectorSessionConfig,
    ReturnPath,
)
from sixlab.stamp.sender import SenderConfig, SenderCounters, SenderSession
from sixlab.stamp.stats import DelaySummary, PathStats, path_stats, summarize

__all__ = [
    "DelaySummary",
    "DropReason",
    "DuplicateReceived",
    "Event",
    "PacketContext",
    "PacketDropped",
    "PacketLost",
    "PacketSent",
    "PathStats",
    "Reflection",
    "Reflector",
    "ReflectorCounters",
    "ReflectorMode",
    "ReflectorSessionConfig",
    "ReturnPath",
    "SenderConfig",
    "SenderCounters",
    "SenderSession",
    "SessionConfigError",
    "SessionFinished",
    "SessionStateError",
    "StampError",
    "StampResult",
    "path_stats",
    "summarize",
]
