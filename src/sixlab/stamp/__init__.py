"""Sans-I/O STAMP (RFC 8762, RFC 8972): Session-Sender, Session-Reflector, delay maths.

- :mod:`sixlab.stamp.sender`: :class:`SenderSession`, one Session-Sender session.
- :mod:`sixlab.stamp.reflector`: :class:`Reflector`, a Session-Reflector answering the
  sessions it holds (and a default one).
- :mod:`sixlab.stamp.stats`: delay summaries and per-path statistics over results.
- :mod:`sixlab.stamp.loopback`: loopback measurement mode (draft-ietf-spring-stamp-srpm):
  the Sender's own packet back, no Reflector.
- :mod:`sixlab.stamp.flows`: ECMP coverage, test packets spread over flow labels and
  statistics per label.
- :mod:`sixlab.stamp.direct`: direct-mode data loss from the Direct Measurement TLV's
  counters (RFC 8972 §4.5).

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
from sixlab.stamp.direct import DataCounters, DataLoss, data_loss, data_loss_total
from sixlab.stamp.flows import check_flow_labels, flow_label_for, per_flow_stats, spread_labels
from sixlab.stamp.loopback import LoopedPacket, decode_looped
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
    "DataCounters",
    "DataLoss",
    "DelaySummary",
    "DropReason",
    "DuplicateReceived",
    "Event",
    "LoopedPacket",
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
    "check_flow_labels",
    "data_loss",
    "data_loss_total",
    "decode_looped",
    "flow_label_for",
    "path_stats",
    "per_flow_stats",
    "spread_labels",
    "summarize",
]
