"""The SDN controller: nodes, sessions on sender/reflector pairs, result collection.

Theory of operation
-------------------
Nodes are agents (``sixlab stamp agent``) registered by name, gRPC address and role.
A session is one SRv6 path under measurement: a sender node, a reflector node, the
forward SID list and the return SID list (configured on the reflector, as "High
Performance Delay Monitoring for SRv6 Based SD-WANs" does, docs/papers.md, or requested
per packet with the RFC 9503 Return Path TLV). The controller picks an SSID free on both
nodes, creates the session on the reflector, then on the sender (undoing the first if
the second fails), and starts them.

Collection. Results are read in cursor mode (records stay on the agent until
acknowledged), either by polling (``GetStampSessionResults``, the paper's way) or by a
server stream (push). Either way one thread per sender agent, not per session, collects:
a poller polls all the agent's poll-mode sessions in rounds (the calls of a round in
flight together on the agent's channel), and one ``StreamResults`` carries all its
stream-mode sessions, reopened from the stored cursors whenever that set changes (an
agent spends a worker thread per open stream, so one per session would exhaust it); a
reader thread takes its messages off as they come. What a round, or the stream
messages there when the sender's turn at the commit slot comes (group commit,
``_store_messages``), bring for all its sessions is stored with their new cursors and
the sender's counters in one transaction (``Store.store_many``), then acknowledged in
one call; so a result is stored exactly once, even if the controller is killed at any
point and restarted (``resume`` restarts collection from the stored cursors).

Health and repair. A supervisor thread asks every node's agent how it is
(``GetAgentInfo``) every ``supervise_interval_s``; the answer, or its absence, is the
node's health (store and the ``sixlab_agent_up`` metric). The answer carries the agent's
``epoch``, chosen at random each time an agent starts: a new epoch means the agent
restarted and lost its Init and its sessions, whichever role it has, even when no call
failed in between. The controller then replays the node's Init (with the UDP port it
bound before, so that senders still reach a reflector) and creates the node's sessions
again (``reconcile_node``). A session missing from an agent that did not restart (it
was Reset, or a collector got NOT_FOUND) is created again the same way. The node's
sessions in the store are read for that only when the answer or the store changed since
the last look, or every ``FULL_CHECK_S``: not a row per session every second.

- On a reflector, the session is created and, if it was started, started again; its
  sender never stopped, so measurement simply resumes (what was sent meanwhile is lost).
  A stateful reflector's count starts over with it, which the sender would misread as
  forward loss: such a session's sender is stopped, drained and collected, then the
  session starts afresh on both agents in a new epoch (``reflector-lost``).
- On a sender, the session's records start over from id 1: the controller opens a new
  epoch (``Store.begin_epoch``), creates the session on both agents again (a stateful
  reflector's count must restart with the sender's Seq) and starts it.

SR performance measurement (docs/srpm.md). A ``loopback`` session has only a sender
node: its probes follow the SID list back to the sender, the far end only forwarding
them, and no reflector session exists anywhere (its store row names the sender in the
reflector column). ``flow_labels`` spread a session's probes over IPv6 flow labels
(``flow_stats`` gives each label's delay and loss), and ``dm_*`` make both agents count
a data flow for direct-mode loss (``data_loss``). Thresholds (``max_delay_ms``,
``max_jitter_ms``, ``max_loss_ratio``) are judged after every stored batch over the
last ``event_window_s`` (``sixlab.controller.events``): events are stored, logged and
exported as metrics.

Replicas (``sixlab.controller.replica``). A destroy is recorded as the ``destroying``
state by whichever replica receives it and carried out by the replica holding the
sender node's lease, told at once by the store's notice (``Store.subscribe``; its
supervisor's round is the fallback); a start runs in the ``starting`` state, claimed
by its replica (a second start is refused; the sender's owner finishes it if that
replica dies); a stop is recorded before the sender is told and stands if the sender
cannot be told (the sender's owner tells it again while it still runs the session); a
restart after a drain is recorded with the row; repairs leave ``destroying`` and
``starting`` rows alone, and destroy a session of an agent that no row refers to once
it has been so for ``ORPHAN_GRACE_S`` (docs/architecture.md, "Session lifecycle across
replicas", "Orphan sessions").

Collectors and repairs of a session take the session's lock: a batch is read, stored
and acknowledged within one epoch, and a repair never slips in between (an
acknowledgement of the old epoch's ids would remove unstored records of the new one).
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import itertools
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import grpc

from sixlab.controller.errors import ControllerError
from sixlab.controller.events import (
    DEFAULT_WINDOW_S,
    EventKind,
    LossWindow,
    SessionEvent,
    ThresholdMonitor,
    Thresholds,
    window_sample,
)
from sixlab.controller.metrics import ControllerMetrics, NodeTotals, PathTotals, Totals
from sixlab.controller.rollup import I64_MAX, merged_stats, roll_up, saturate
from sixlab.controller.store import (
    CHANGED,
    DESTROYED,
    DESTROYING,
    OUTAGES_IN_ONE_LINE,
    RESYNC,
    AlreadyExistsError,
    Counters,
    EpochRow,
    EventRow,
    Fence,
    FencedError,
    NodeRow,
    NotFoundError,
    ResultBatch,
    SessionRow,
    Store,
    StoreUnavailableError,
)
from sixlab.linux import FlowMatch
from sixlab.southbound import stamp_pb2 as pb
from sixlab.southbound.agentinfo import ssids_digest
from sixlab.southbound.budget import MIN_REPLY_BUDGET_BYTES, REPLY_BUDGET_BYTES
from sixlab.southbound.client import (
    AgentClient,
    ReflectorSession,
    ResultStream,
    SenderSession,
    SouthboundError,
)
from sixlab.stamp import (
    DataLoss,
    SessionConfigError,
    StampResult,
    check_flow_labels,
    data_loss,
    data_loss_total,
    per_flow_stats,
)
from sixlab.stamp.stats import PathStats, path_stats

__all__ = [
    "REFLECTOR_LOST",
    "SENDER_LOST",
    "CollectMode",
    "Controller",
    "ControllerError",
    "DestroyPendingError",
    "EpochStats",
    "NoFreeSsidError",
    "SessionExistsError",
    "SessionSpec",
    "WrongStateError",
    "epoch_stats",
]

log = logging.getLogger(__name__)
log.addFilter(OUTAGES_IN_ONE_LINE)  # a database outage: a line a round

#: Records per poll or stream batch: large enough to keep up with 10 kpps at 2 polls/s.
BATCH = 5000
#: At most one log line a node per this many seconds about records refused as out of
#: range (``Controller._refused``); the metric counts every one.
REFUSED_LOG_S = 10.0

#: Back-off between retries to a node that does not answer (doubling, capped).
RETRY_MIN_S = 0.2
RETRY_MAX_S = 5.0
#: How long an agent gathers records into one stream message (ns): fewer, larger
#: messages cost the controller less per record.
STREAM_WINDOW_NS = 250_000_000
#: How often an agent sends each session's counters on the stream (ns): sent and lost
#: totals are this fresh (a session's last batch always has them).
STREAM_COUNTERS_NS = 2_000_000_000
#: Stream messages are gathered for up to this long (s) into one transaction; 0: group
#: commit (a message is stored as soon as the commit slot is free, together with those
#: that came while it was not: ``Controller._store_messages``).
COMMIT_INTERVAL_S = 0.0
#: Stream transactions that may run at once (``Controller._store_messages``). On SQLite
#: they are one at a time whatever this says (one connection); on PostgreSQL each has a
#: connection of the pool, and while the server works on one, another can be built.
COMMIT_SLOTS = 1
#: How long a thread of the controller's process holds Python's GIL while others wait
#: for it (s; ``sys.setswitchinterval``, set by ``controller serve``). Collection runs a
#: reader and a storer thread per sender agent beside gRPC's: at CPython's default of
#: 5 ms, one controller on SQLite stored 44,164-45,388 results/s of 50,000 offered
#: (10,000 sessions, 10 agents), at 20 ms 47,685-50,751 with the same CPU, alternated,
#: and at 50 ms 45,932; the collection lag at 1 pps did not move (benchmarks/README.md,
#: "The SQLite store at 10,000 sessions").
SWITCH_INTERVAL_S = 0.02
#: Stream messages read but not stored yet, at most, per sender: beyond them the reader
#: stops reading and gRPC's flow control holds the rest on the agent.
STREAM_INBOX = 64
#: Poll-mode sessions of one sender polled, stored and acknowledged together.
POLL_ROUND = 256
#: Reply bytes (serialized) a poll round holds at most: its sessions share them, each
#: reply asking for its part (stamp.proto ``max_bytes``; ``round_max_bytes``), so that a
#: round of large records holds this much rather than ``POLL_ROUND`` full byte budgets
#: (768 MiB) (docs/architecture.md, "Results messages: the byte budget").
POLL_ROUND_BYTES = 64 << 20
#: After a round of a sender's poll-mode sessions, those whose reply said more records
#: wait (stamp.proto ``remaining``: the reply was cut by ``BATCH`` or by the agent's
#: byte budget, e.g. records with large TLVs) are polled again at once, each once per
#: pass, for at most this many passes before the poll interval's wait: a session that
#: fell behind catches up within a few intervals, and the others' next round is not
#: held up for long.
CATCH_UP_PASSES = 8
#: A sender's stream, changed, is reopened after this pause (s), once for a burst.
REOPEN_DEBOUNCE_S = 0.05
#: A healthy node's ``last_seen`` is written at most this often (ns).
HEALTH_WRITE_NS = 1_000_000_000
#: ``stats`` over a range longer than this reads the per-minute rollups (ns).
RAW_STATS_NS = 3600 * 1_000_000_000
#: How long ``destroy_session`` waits for the replica that owns the session's sender to
#: carry the destroy out (s): its supervisor does within a round, or a replica that
#: takes the lease over after it died, within the lease time and a heartbeat. Shorter
#: than a northbound client's deadline (``client.DEFAULT_TIMEOUT_S``), so that the
#: caller hears why.
DESTROY_WAIT_S = 20.0
#: How often ``destroy_session`` looks at the store while it waits, should no notice of
#: the destroy come (s): the owner's notice (``Store.subscribe``) normally wakes it.
DESTROY_POLL_S = 1.0
#: A session on an agent that no live row refers to (an orphan) is destroyed once it has
#: been one for this long (s): a creation through another replica puts the halves on
#: the agents before it stores the row, and must not lose them meanwhile
#: (docs/architecture.md, "Orphan sessions").
ORPHAN_GRACE_S = 60.0
#: A ``stopping`` session is first asked of its sender this long (s) after the owner's
#: supervisor saw it so: a stop that reached the sender has drained by then, mostly
#: (docs/architecture.md, "A stop the sender did not get").
STOP_CHECK_S = 5.0
#: The stop is sent again, while the sender still runs the session, after a back-off
#: doubling from ``STOP_CHECK_S`` up to this (s), for as long as the row is stopping.
STOP_RETRY_MAX_S = 20.0
#: A destroy collects what the session's sender still holds until a reply says nothing
#: remains, but not more than this many records (a full FIFO of an agent,
#: ``sixlab.dataplane.engine.DEFAULT_FIFO_CAPACITY``): a session still running fast
#: is not chased for ever. Reaching it is logged, with what was left.
FINAL_RECORDS_MAX = 100_000
#: SSIDs a creation tries on its nodes: another replica creating a session there at the
#: same time may have taken the first (its row not stored yet when it was picked).
SSID_TRIES = 3
#: How often the supervisor asks every agent how it is (s).
SUPERVISE_INTERVAL_S = 1.0
#: The supervisor compares a node's sessions in the store with its agent's at least this
#: often (s), and otherwise only when the agent's answer or the store changed
#: (``Controller.reconcile_node``, ``full``).
FULL_CHECK_S = 10.0
#: Deadline of the supervisor's GetAgentInfo: a node that does not answer within it is
#: unhealthy, and must not hold up the checks of the others for long.
INFO_TIMEOUT_S = 3.0
#: Session states in which the session exists on each agent (as far as the controller
#: is concerned): a finished sender session is created again when it is started.
_ON_REFLECTOR = ("created", "running", "stopping", "stopped", "finished")
_ON_SENDER = ("created", "running", "stopping")
#: Why an epoch ended when its sender agent restarted or lost the session.
SENDER_LOST = "sender-lost"
#: Why an epoch of a stateful session ended when its reflector agent restarted.
REFLECTOR_LOST = "reflector-lost"
#: Why an epoch ended that a controller began in a start it did not finish (it died).
START_INTERRUPTED = "start-interrupted"
#: Why a start is refused once another controller took it over (``_recover_starts``).
_TAKEN_OVER = "name: session {name!r}: another controller took its start over"
#: gRPC statuses that say the agent could not be reached.
_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
#: gRPC statuses that say the agent does not have what the controller expects.
_MISSING = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)


class SessionExistsError(ControllerError):
    """A session of that name exists already."""


class WrongStateError(ControllerError):
    """The session's state forbids the request (start a running one, stop a stopped one)."""


class NoFreeSsidError(ControllerError):
    """Every SSID is taken on the sender or the reflector."""


class DestroyPendingError(ControllerError):
    """The destroy is recorded but the replica that owns the session's sender has not
    carried it out within the wait (it will, or the replica that takes its lease over)."""


class CollectMode:
    POLL = "poll"
    STREAM = "stream"
    ALL = (POLL, STREAM)


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """What a user asks to measure. Addresses are text; SID lists in travel order."""

    name: str
    sender: str
    reflector: str
    reflector_address: str
    segments: tuple[str, ...] = ()
    return_segments: tuple[str, ...] = ()
    #: Ask for the return path with the RFC 9503 Return Path TLV instead of configuring
    #: it on the reflector.
    return_path_tlv: bool = False
    reflector_port: int = 862
    source_address: str = ""
    interval_ns: int = 1_000_000_000  # one packet a second, as the agent and the CLIs
    count: int = 0
    duration_ns: int = 0
    ptp: bool = False
    key_hex: str = ""
    stateful: bool = False
    loss_timeout_ns: int = 2_000_000_000
    collect: str = CollectMode.POLL
    #: Refuse replies with SSID 0 (an RFC 8762-only reflector); accepted by default.
    strict_ssid: bool = False
    #: Loopback measurement mode: no reflector node (``reflector`` and, unless it is the
    #: sender's own address, ``reflector_address`` empty); ``segments`` lead the probes
    #: back to the sender (docs/srpm.md).
    loopback: bool = False
    #: IPv6 Flow Labels the probes take in turn (ECMP coverage).
    flow_labels: tuple[int, ...] = ()
    #: Direct-mode loss: the data flow each agent counts, ``PREFIX[,udp|tcp[,PORT]]``
    #: (empty: none) — sent and received on the sender's node and the reflector's.
    dm_sender_sent: str = ""
    dm_sender_received: str = ""
    dm_reflector_sent: str = ""
    dm_reflector_received: str = ""
    #: Thresholds that raise and clear events (None: not watched), over the last
    #: ``event_window_s`` seconds: mean round-trip delay, mean |IPDV| (ms), loss ratio.
    max_delay_ms: float | None = None
    max_jitter_ms: float | None = None
    max_loss_ratio: float | None = None
    event_window_s: float = DEFAULT_WINDOW_S

    def __post_init__(self) -> None:
        # Labels stored as JSON come back as a list; a spec compares equal either way.
        object.__setattr__(self, "flow_labels", tuple(self.flow_labels))

    @property
    def direct_measurement(self) -> bool:
        return any(
            (self.dm_sender_sent, self.dm_sender_received, self.dm_reflector_sent,
             self.dm_reflector_received)
        )  # fmt: skip

    def thresholds(self) -> Thresholds | None:
        """The session's thresholds, or None when it has none."""
        th = Thresholds(
            self.max_delay_ms, self.max_jitter_ms, self.max_loss_ratio, self.event_window_s
        )
        return th if th.any else None

    def validate(self) -> None:
        if not self.name:
            raise ControllerError("name: a session needs a name")
        self._validate_srpm()
        if self.loopback:
            for sid in self.segments:
                _v6("segments", sid)
            if self.source_address:
                _v6("source_address", self.source_address)
            if self.reflector_address and self.reflector_address != self.source_address:
                raise ControllerError(
                    "reflector_address: a loopback session's is its own (source_address)"
                )
            if self.interval_ns <= 0:
                raise ControllerError("interval_ns: must be positive")
            if self.count < 0 or self.duration_ns < 0:
                raise ControllerError("count/duration_ns: must not be negative")
            if self.collect not in CollectMode.ALL:
                raise ControllerError(f"collect: {self.collect!r} is neither poll nor stream")
            return
        family = _ip("reflector_address", self.reflector_address)
        if self.source_address and _ip("source_address", self.source_address) != family:
            raise ControllerError("source_address: not of the reflector_address's family")
        if family == 4 and (self.segments or self.return_segments):
            raise ControllerError("segments: SRv6 needs an IPv6 reflector_address")
        for sid in self.segments:
            _v6("segments", sid)
        for sid in self.return_segments:
            _v6("return_segments", sid)
        if self.return_path_tlv and not self.return_segments:
            raise ControllerError("return_segments: the Return Path TLV needs a SID list")
        if self.interval_ns <= 0:
            raise ControllerError("interval_ns: must be positive")
        if self.count < 0 or self.duration_ns < 0:
            raise ControllerError("count/duration_ns: must not be negative")
        if not 0 < self.reflector_port <= 0xFFFF:
            raise ControllerError(f"reflector_port: {self.reflector_port} is not a port")
        if self.collect not in CollectMode.ALL:
            raise ControllerError(f"collect: {self.collect!r} is neither poll nor stream")
        try:
            bytes.fromhex(self.key_hex)
        except ValueError:
            raise ControllerError("key_hex: not hexadecimal") from None

    def _validate_srpm(self) -> None:
        """The fields of the SR performance-measurement modes (docs/srpm.md)."""
        try:
            check_flow_labels(self.flow_labels)
        except SessionConfigError as exc:
            raise ControllerError(str(exc)) from None
        for name in ("dm_sender_sent", "dm_sender_received", "dm_reflector_sent",
                     "dm_reflector_received"):  # fmt: skip
            text = getattr(self, name)
            if text:
                _flow_match(name, text)
        self.thresholds()  # refuses impossible values, naming them
        if not self.loopback:
            return
        if self.reflector:
            raise ControllerError("reflector: a loopback session has no reflector node")
        if not self.segments:
            raise ControllerError("segments: a loopback session needs the SID list of its loop")
        if self.stateful or self.return_segments or self.return_path_tlv:
            raise ControllerError(
                "stateful/return_segments: a loopback session has no reflector to configure"
            )
        if self.direct_measurement:
            raise ControllerError("dm_*: direct-mode loss needs a reflector's counters")


def _taken(exc: Exception | None) -> bool:
    """Did an agent refuse a creation because the SSID is in use there?"""
    return isinstance(exc, SouthboundError) and exc.code is grpc.StatusCode.ALREADY_EXISTS


def _not_startable(name: str, state: str) -> WrongStateError:
    """Why a start of a session in ``state`` is refused (through any replica)."""
    if state == "destroying":
        return WrongStateError(f"name: session {name!r} is being destroyed, not startable")
    if state == "stopping":
        return WrongStateError(
            f"name: session {name!r} is stopping (results in flight are being collected);"
            " start it again once it has finished"
        )
    return WrongStateError(f"name: session {name!r} is {state}, not startable")


def _flow_match(name: str, text: str) -> FlowMatch:
    """``PREFIX[,udp|tcp[,PORT]]`` as a data-flow match (direct-mode loss)."""
    parts = [p.strip() for p in text.split(",")]
    if not 1 <= len(parts) <= 3:
        raise ControllerError(f"{name}: {text!r}: expected PREFIX[,udp|tcp[,PORT]]")
    try:
        port = int(parts[2]) if len(parts) == 3 else 0
        return FlowMatch.parse(parts[0], parts[1] if len(parts) > 1 else "", port)
    except ValueError as exc:
        raise ControllerError(f"{name}: {text!r}: {exc}") from None


def _dm(sent: str, received: str) -> pb.DirectMeasurement | None:
    """The agent API's DirectMeasurement for a node's two matches (None: neither)."""
    if not sent and not received:
        return None
    out = pb.DirectMeasurement()
    for field_name, text in (("sent", sent), ("received", received)):
        if text:
            m = _flow_match(field_name, text)
            getattr(out, field_name).CopyFrom(
                pb.DataFlowMatch(prefix=str(m.prefix), protocol=m.protocol or "", port=m.port or 0)
            )
    return out


def _log_event(event: SessionEvent) -> None:
    unit = "" if event.kind == EventKind.LOSS else " ms"
    log.warning(
        "session %s: %s %s (%.4g%s, threshold %.4g%s)",
        event.session, event.kind, event.state, event.value, unit, event.threshold, unit,
    )  # fmt: skip


def _agent_state(info: pb.GetAgentInfoReply) -> tuple[int, bool, int, int]:
    """What of an agent's GetAgentInfo answer a comparison with the store depends on: its
    run, its Init, and its sessions' count and digest (computed here from the list if
    the agent did not send them)."""
    if info.HasField("ssids_digest"):
        return (info.epoch, info.initialized, info.ssid_count, info.ssids_digest)
    return (info.epoch, info.initialized, len(info.ssids), ssids_digest(info.ssids))


def _is_loopback(row: SessionRow) -> bool:
    return bool(row.params.get("loopback", False))


def _ip(label: str, text: str) -> int:
    """The IP version of an IPv4 or IPv6 address (STAMP runs over both)."""
    try:
        return ipaddress.ip_address(text).version
    except ValueError:
        raise ControllerError(f"{label}: {text!r} is not an IPv4 or IPv6 address") from None


def _v6(label: str, text: str) -> None:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        raise ControllerError(f"{label}: {text!r} is not an IPv6 address") from None


@dataclass
class _Poller:
    """The poll loop of one sender node, polling all its poll-mode sessions in rounds."""

    node: str
    #: The sessions it polls (their names).
    names: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread = field(init=False)
    #: Sessions the agent said it does not have: when to poll them again (monotonic s)
    #: and the back-off after that.
    retry: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: False once a reply was larger than its request's ``max_bytes``: the agent
    #: predates that field, and its rounds are cut so that full byte budgets fit
    #: ``POLL_ROUND_BYTES``.
    max_bytes: bool = True


def _stop_check_request(ssid: int) -> pb.GetStampSessionResultsRequest:
    """The stop check's call (``_complete_stops``): the session's state on its sender is
    the point, so it takes one record at most and removes nothing, neither records
    (``after_id`` 0) nor loss reports (``after_loss_id`` 0), which stay for whoever
    collects them; and its reply is of the smallest byte budget (the loss reports it
    carries otherwise take up to half of the agent's 3 MiB), so that a round of
    ``POLL_ROUND`` of them holds at most 16 MiB."""
    return pb.GetStampSessionResultsRequest(
        ssid=ssid, max_results=1, after_id=0, after_loss_id=0, max_bytes=MIN_REPLY_BUDGET_BYTES
    )


def round_max_bytes(sessions: int) -> int:
    """Each reply's ``max_bytes`` in a poll round of ``sessions`` sessions: its part of
    ``POLL_ROUND_BYTES``, within the agents' byte budget and not below its minimum (which
    ``POLL_ROUND`` of fit in ``POLL_ROUND_BYTES``)."""
    share = POLL_ROUND_BYTES // max(1, sessions)
    return max(MIN_REPLY_BUDGET_BYTES, min(REPLY_BUDGET_BYTES, share))


@dataclass
class _Streamer:
    """The results stream of one sender node, carrying all its stream-mode sessions."""

    node: str
    #: The sessions it carries (their names); a change reopens the stream.
    names: set[str] = field(default_factory=set)
    changed: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread = field(init=False)
    #: The stream being read, cancelled to reopen (or stop) at once.
    call: ResultStream[pb.ResultBatches] | None = None

    def poke(self) -> None:
        """Reopen the stream with the sessions (and cursors) as they are now."""
        self.changed.set()
        call = self.call
        if call is not None:
            call.cancel()


@dataclass(frozen=True, slots=True)
class EpochStats:
    """What became of one epoch's probes (``Controller.epochs``)."""

    epoch: int
    started_ns: int
    ended_ns: int | None
    #: ``finished``, ``sender-lost`` (its sender agent restarted or lost the session),
    #: ``destroyed``; None while it is the current epoch.
    end_reason: str | None
    #: The sender agent's run it ran on (GetAgentInfo.epoch, hex).
    sender_agent: str | None
    sent: int
    received: int
    lost: int
    #: Probes whose outcome no agent reported: neither stored nor declared lost (see
    #: ``epoch_stats``). 0 for the current epoch, whose packets may be in flight.
    unknown: int
    #: The sender's schedule: slots skipped, lateness of its packets in total and at most.
    skipped: int = 0
    late_ns_total: int = 0
    late_ns_max: int = 0


@dataclass(slots=True)
class _PathCounts:
    """A session's totals for the metrics, kept in memory (``Controller._metric_totals``)."""

    name: str
    sender: str
    spec: SessionSpec
    #: By epoch, as stored: updated as this controller stores results.
    epochs: dict[int, EpochRow]
    raised: tuple[str, ...]
    event_counts: dict[tuple[str, str], int]

    def totals(self) -> PathTotals:
        stats = [epoch_stats(e, self.spec) for _, e in sorted(self.epochs.items())]
        recreations: dict[str, int] = {}
        for before, _after in itertools.pairwise(stats):
            reason = before.end_reason or ""
            if reason not in (SENDER_LOST, REFLECTOR_LOST):
                reason = "started-again"
            recreations[reason] = recreations.get(reason, 0) + 1
        forward = [e.forward_lost for e in self.epochs.values() if e.forward_lost is not None]
        return PathTotals(
            path=self.name,
            sent=sum(e.sent for e in stats),
            received=sum(e.received for e in stats),
            lost=sum(e.lost for e in stats),
            unknown=sum(e.unknown for e in stats),
            forward_lost=sum(forward) if forward else None,
            recreations=recreations,
            skipped=sum(e.skipped for e in stats),
            late_ns_total=sum(e.late_ns_total for e in stats),
            events_raised=self.raised,
            event_counts=self.event_counts,
        )

    def stored(self, batch: ResultBatch, new: int, now: int) -> bool:
        """Count a batch this controller stored (``new`` rows of it new, at ``now``);
        False if its epoch is not known here (the totals are to be read again). Counting
        one twice is harmless: a batch whose records the epoch's top already covers was
        read with it, and an older snapshot of the counters does not replace a newer."""
        e = self.epochs.get(batch.epoch)
        if e is None:
            return False
        received, top = e.received, e.top
        rows = batch.result_rows()
        last = max(rows[-1][2] if rows else 0, batch.top)
        if last > top:
            received, top = received + new, last
        c = batch.counters
        if c is not None and (e.seen_ns is None or now >= e.seen_ns):
            self.epochs[batch.epoch] = EpochRow(
                e.epoch, e.started_ns, e.stopped_ns, e.ended_ns, e.end_reason, e.sender_agent,
                c.sent, c.lost, c.forward_lost, c.overflow, now, c.skipped, c.late_ns_total,
                c.late_ns_max, received, top,
            )  # fmt: skip
        elif top != e.top:
            self.epochs[batch.epoch] = EpochRow(
                e.epoch,
                e.started_ns,
                e.stopped_ns,
                e.ended_ns,
                e.end_reason,
                e.sender_agent,
                e.sent,
                e.lost,
                e.forward_lost,
                e.overflow,
                e.seen_ns,
                e.skipped,
                e.late_ns_total,
                e.late_ns_max,
                received,
                top,
            )  # fmt: skip (positional: ``replace`` looks the fields up at every call)
        return True


def _slots(spec: SessionSpec, span_ns: int) -> int:
    """Send slots of the session's schedule in its first ``span_ns`` (its sender sends
    at start + k × interval, up to its count and duration)."""
    slots = -(-max(span_ns, 0) // spec.interval_ns)
    if spec.count:
        slots = min(slots, spec.count)
    if spec.duration_ns:
        slots = min(slots, -(-spec.duration_ns // spec.interval_ns))
    return slots


def epoch_stats(e: EpochRow, spec: SessionSpec) -> EpochStats:
    """An epoch's accounting. Its probes are received (stored), lost (declared by the
    sender) or unknown:

    - an epoch that ended with its sender agent (``sender-lost``): every slot of its
      schedule from its start until the next epoch began (or until a user stopped it)
      was due; whatever is not stored or declared lost died with the agent (sent but
      never reported, or never sent while the agent was down). The start is the
      controller's clock, so this is an estimate within a slot or so;
    - any other ended epoch: sent but neither stored nor lost (e.g. FIFO overflow);
    - the current epoch: 0 (its packets may still be in flight or uncollected).
    """
    unknown = 0
    if e.ended_ns is not None:
        due = e.sent
        if e.end_reason == SENDER_LOST:
            end = e.ended_ns if e.stopped_ns is None else min(e.ended_ns, e.stopped_ns)
            due = max(due, _slots(spec, end - e.started_ns))
        unknown = max(0, due - e.received - e.lost)
    return EpochStats(
        e.epoch, e.started_ns, e.ended_ns, e.end_reason, e.sender_agent,
        e.sent, e.received, e.lost, unknown, e.skipped, e.late_ns_total, e.late_ns_max,
    )  # fmt: skip


def _batch(
    row: SessionRow, results: Sequence[pb.StampResult], counters: pb.SessionCounters | None
) -> tuple[ResultBatch, list[pb.StampResult]]:
    """A batch read from the session's sender, as the store takes it (``counters`` None:
    the batch came without them): its records as result rows (``_rows``), its cursor
    past the records refused; and the records refused (``_rows``)."""
    rows, bad = _rows(row.id, row.epoch, results)
    batch = ResultBatch(
        row.id,
        row.epoch,
        (),
        None if counters is None else _counters(counters),
        rows,
        _top(bad),
    )
    return batch, bad


#: The widest value of each record field a STAMP packet can carry (RFC 8762 §4.1.1 /
#: RFC 4656 §4.1.2: a 16-bit Error Estimate; RFC 8762 §4.3.1: a one-octet Ses-Sender
#: TTL; RFC 8200 §6: a 20-bit flow label); a record id must fit the signed 64-bit
#: columns (the cursor). A record past one of them comes from a broken or hostile agent:
#: it is refused (``_rows``).
_EE_MAX = 0xFFFF
_TTL_MAX = 0xFF
_LABEL_MAX = 0xFFFFF


def _refusal(r: pb.StampResult) -> str:
    """Why ``_rows`` refused a record (for the log)."""
    if r.record_id > I64_MAX:
        return f"record id {r.record_id} past 2^63 - 1"
    if max(r.sender_error_estimate, r.reflector_error_estimate) > _EE_MAX:
        ee = max(r.sender_error_estimate, r.reflector_error_estimate)
        return f"Error Estimate {ee:#x} wider than 16 bits"
    if r.ses_sender_ttl > _TTL_MAX:
        return f"TTL {r.ses_sender_ttl} past 255"
    return f"flow label {r.flow_label:#x} wider than 20 bits"


def _top(bad: Sequence[pb.StampResult]) -> int:
    """The highest id of refused records the cursor can move past (0: none): one past
    2^63 - 1 cannot be a cursor, and is acknowledged only."""
    return max((r.record_id for r in bad if r.record_id <= I64_MAX), default=0)


def _rows(
    sid: int, epoch: int, results: Sequence[pb.StampResult]
) -> tuple[list[tuple[Any, ...]], list[pb.StampResult]]:
    """API records as ``results`` rows (``store.RESULT_COLUMNS``), read straight off the
    messages: a controller stores tens of thousands a second, and a ``StampResult``
    (with two ``ErrorEstimate``) per record cost as much again as the row. The Error
    Estimates are stored as on the wire (RFC 8762 §4.1.1: 16 bits).

    A record with a field no STAMP packet can carry, or an id past the columns'
    2^63 - 1, is refused: not a row but in the second list, for the caller to count,
    acknowledge and move the cursor past (docs/architecture.md, "Records out of
    range"); failing the transaction instead would fail it for every session of the
    agent, again at each retry. The API's timestamps and S_RxC are uint64, the columns
    signed 64-bit: a value past 2^63 - 1 (no STAMP timestamp converts to one: that is
    past the year 2262) is stored saturated at it, "at least this" (``rollup.saturate``)."""
    out: list[tuple[Any, ...]] = []
    bad: list[pb.StampResult] = []
    append = out.append
    for r in results:
        rid = r.record_id
        ee_s, ee_r = r.sender_error_estimate, r.reflector_error_estimate
        ttl, label = r.ses_sender_ttl, r.flow_label
        if rid > I64_MAX or (ee_s | ee_r) > _EE_MAX or ttl > _TTL_MAX or label > _LABEL_MAX:
            bad.append(r)
            continue
        t1, t2, t3, t4 = r.t1_ns, r.t2_ns, r.t3_ns, r.t4_ns
        if (t1 | t2 | t3 | t4) > I64_MAX:
            t1, t2, t3, t4 = saturate(t1), saturate(t2), saturate(t3), saturate(t4)
        if r.HasField("data"):
            d = r.data
            data: tuple[int | None, ...] = (
                d.s_txc, d.r_rxc, d.r_txc, saturate(d.s_rxc) if d.HasField("s_rxc") else None,
            )  # fmt: skip
        else:
            data = _NO_DATA
        append(
            (sid, epoch, rid, r.seq, t1, t2, t3, t4, ee_s, ee_r, ttl, r.reflector_seq,
             label if r.HasField("flow_label") else None, int(r.loopback), *data)
        )  # fmt: skip
    return out, bad


_NO_DATA: tuple[int | None, ...] = (None, None, None, None)


@dataclass(slots=True)
class _Gathered:
    """A session's records gathered from one transaction's stream messages, as rows
    (``_rows``), and the latest of the rest: a session's records in several messages are
    joined as rows, never by copying the messages' records. ``lost_top``: the highest
    ``loss_id`` of its loss reports (0: none), acknowledged with the records.
    ``refused``: its records ``_rows`` refused; ``last_id``: the id of its last record
    (refused or not; 0: none), acknowledged."""

    ssid: int
    rows: list[tuple[Any, ...]]
    counters: pb.SessionCounters | None
    final: bool
    gone: bool
    lost_top: int = 0
    refused: list[pb.StampResult] = field(default_factory=list)
    last_id: int = 0


def _gather_rows(
    pending: dict[int, _Gathered], subs: dict[int, SessionRow], message: pb.ResultBatches
) -> list[int]:
    """Add a stream message's batches of ``subs``' sessions to ``pending`` (one per
    session: rows appended, the latest counters and loss report id kept, ``final`` and
    ``gone`` if any said so); the T4 of its records (for
    ``ControllerMetrics.collection_stages``)."""
    t4s: list[int] = []
    for b in message.batches:
        sub = subs.get(b.ssid)
        if sub is None:
            continue
        rows, bad = _rows(sub.id, sub.epoch, b.results)
        t4s += [row[7] for row in rows]
        counters = b.counters if b.HasField("counters") else None
        lost_top = b.lost[-1].loss_id if b.lost else 0
        last_id = b.results[-1].record_id if b.results else 0
        into = pending.get(b.ssid)
        if into is None:
            pending[b.ssid] = _Gathered(
                b.ssid, rows, counters, b.final, b.gone, lost_top, bad, last_id
            )
            continue
        into.rows += rows
        into.refused += bad
        if last_id:
            into.last_id = last_id
        if counters is not None:
            into.counters = counters
        into.lost_top = max(into.lost_top, lost_top)
        into.final = into.final or b.final
        into.gone = into.gone or b.gone
    return t4s


def _counters(counters: pb.SessionCounters) -> Counters:
    """A sender's counters as the store takes them: each uint64 of the API saturated at
    the columns' 2^63 − 1 ("at least this", ``rollup.saturate``)."""
    c = counters
    return Counters(
        saturate(c.sent),
        saturate(c.lost),
        saturate(c.forward_lost) if c.HasField("forward_lost") else None,
        saturate(c.overflow),
        saturate(c.schedule_skipped),
        saturate(c.schedule_late_ns_total),
        saturate(c.schedule_late_ns_max),
        saturate(c.unclassified_lost) if c.HasField("unclassified_lost") else None,
        saturate(c.ssid_zero),
    )


def _check_spec(spec: SessionSpec, nodes: dict[str, NodeRow]) -> None:
    """What ``create_session`` refuses before any call: a bad spec, unknown nodes, a node
    of the wrong role."""
    spec.validate()
    for field_name in ("sender",) if spec.loopback else ("sender", "reflector"):
        name = getattr(spec, field_name)
        node = nodes.get(name)
        if node is None:
            raise NotFoundError(f"{field_name}: no node named {name!r}")
        if node.role != field_name:
            raise ControllerError(f"{field_name}: node {name!r} is a {node.role}")


def _reflector_request(spec: SessionSpec, ssid: int) -> pb.CreateStampSessionRequest:
    return ReflectorSession(
        ssid,
        stateful=spec.stateful,
        key=bytes.fromhex(spec.key_hex) or None,
        ptp=spec.ptp,
        return_sid_list=() if spec.return_path_tlv else spec.return_segments,
        direct_measurement=_dm(spec.dm_reflector_sent, spec.dm_reflector_received),
    ).request()


def _sender_request(spec: SessionSpec, ssid: int) -> pb.CreateStampSessionRequest:
    return SenderSession(
        ssid,
        spec.reflector_address,
        sid_list=spec.segments,
        interval_ns=spec.interval_ns,
        count=spec.count,
        duration_ns=spec.duration_ns,
        source=spec.source_address or None,
        reflector_port=spec.reflector_port,
        key=bytes.fromhex(spec.key_hex) or None,
        ptp=spec.ptp,
        stateful_reflector=spec.stateful,
        return_sid_list=spec.return_segments if spec.return_path_tlv else (),
        loss_timeout_ns=spec.loss_timeout_ns,
        strict_ssid=spec.strict_ssid,
        loopback=spec.loopback,
        flow_labels=spec.flow_labels,
        direct_measurement=_dm(spec.dm_sender_sent, spec.dm_sender_received),
    ).request()


ClientFactory = Callable[[str], AgentClient]


def _destroy(client: AgentClient, *, ssid: int) -> None:
    client.destroy_session(ssid)


def _open_stream(
    client: AgentClient, *, after: dict[int, int], window_ns: int
) -> ResultStream[pb.ResultBatches]:
    """The sessions' stream, each from its record cursor, with its loss reports from the
    first still queued (those acknowledged are gone: loss id 0 asks for the rest)."""
    return client.stream_many(
        after,
        max_batch=BATCH,
        batch_window_ns=window_ns,
        counters_interval_ns=STREAM_COUNTERS_NS,
        after_loss_ids=dict.fromkeys(after, 0),
    )


#: What the reader of a stream hands its collector: a message and when it came (Unix
#: ns); then how the stream ended: StopIteration, or the exception that ended it.
_Inbound = tuple[int, pb.ResultBatches] | BaseException


#: How often a storer letting go of a stream looks whether its reader has ended (s).
READER_END_POLL_S = 0.05


def _read_stream(stream: ResultStream[pb.ResultBatches], inbox: queue.Queue[_Inbound]) -> None:
    """Put the stream's messages into ``inbox`` as they come, then how it ended."""
    try:
        for message in stream:
            inbox.put((time.time_ns(), message))
    except BaseException as exc:  # noqa: BLE001 - handed to the collector, which raises it
        inbox.put(exc)
        return
    inbox.put(StopIteration())


class Controller:
    def __init__(
        self,
        store: Store,
        metrics: ControllerMetrics | None = None,
        *,
        client_factory: ClientFactory = AgentClient,
        clock: Callable[[], int] = time.time_ns,
        poll_interval_s: float = 0.5,
        supervise_interval_s: float | None = SUPERVISE_INTERVAL_S,
        commit_interval_s: float = COMMIT_INTERVAL_S,
        commit_slots: int = COMMIT_SLOTS,
        stream_window_s: float = STREAM_WINDOW_NS / 1e9,
    ) -> None:
        """``clock`` gives the Unix ns stored with nodes and sessions. ``supervise_interval_s``
        None: no supervisor thread (health and repairs only through ``check_node``)."""
        self.store = store
        self.metrics = metrics or ControllerMetrics()
        self.clock = clock
        self.poll_interval_s = poll_interval_s
        #: A sender's stream messages are stored together for up to this long (s).
        self.commit_interval_s = commit_interval_s
        #: A sender agent gathers records this long into one stream message (s).
        self.stream_window_s = stream_window_s
        self.supervise_interval_s = supervise_interval_s
        self._client_factory = client_factory
        self._clients: dict[str, AgentClient] = {}
        #: Poll-mode sessions being collected (by name), and each sender node's poller.
        self._collectors: dict[str, _Poller] = {}
        self._pollers: dict[str, _Poller] = {}
        self._streamers: dict[str, _Streamer] = {}
        self._lock = threading.RLock()
        #: Slots skipped by each (session id, epoch)'s sender, last seen (for warnings).
        self._skipped: dict[tuple[int, int], int] = {}
        #: The most reply bytes (serialized) one poll round has held, over all rounds.
        self.poll_peak_bytes = 0
        #: Notified when a session finishes (``wait_finished``).
        self._finished = threading.Condition(self._lock)
        #: Serialises what changes sessions on agents: user requests and repairs.
        self._ops = threading.RLock()
        self._session_locks: dict[str, threading.Lock] = {}
        #: Who this controller is in the store (a ``starting`` row's claimer): its
        #: replica id, else one of its own (``set_ownership``).
        self.replica_id = f"controller-{random.getrandbits(64):016x}"
        self._wake = threading.Event()
        #: Sender nodes whose recorded destroys this controller is to carry out now (the
        #: store's DESTROYING notices), and the thread that does (``_destroy_loop``).
        self._to_destroy: set[str] = set()
        self._destroy_wake = threading.Event()
        self._destroyer: threading.Thread | None = None
        #: Counts the store's DESTROYED notices: a destroy's waiter wakes on a change.
        self._destroyed = threading.Condition(threading.Lock())
        self._destroyed_seen = 0
        #: Stream transactions run ``commit_slots`` at a time (``_store_messages``).
        self._commit_slot = threading.BoundedSemaphore(commit_slots)
        self._closed = False
        #: Each node's health as last written to the store, and when (``_health``).
        self._health_seen: dict[str, tuple[bool, int]] = {}
        #: ``stats`` over a longer range reads rollups rather than raw results (ns).
        self.raw_stats_ns = RAW_STATS_NS
        #: Orphans are destroyed once they have been for this long (s), and when each
        #: (node, SSID) was first seen as one, in which run of the agent.
        self.orphan_grace_s = ORPHAN_GRACE_S
        self._orphans: dict[tuple[str, int], tuple[int, float]] = {}
        #: The store and each agent's answer are compared at least this often (s).
        self.full_check_s = FULL_CHECK_S
        #: Counts the store's notices: a change of it since a node's last comparison
        #: calls for another (several threads may add at once; any change is enough).
        self._store_gen = 0
        #: Each node whose last comparison found nothing to do: the agent's answer then
        #: (``_agent_state``), ``_store_gen`` read before its store read, and when.
        self._settled: dict[str, tuple[tuple[int, bool, int, int], int, float]] = {}
        #: Per node: when its last line about refused records was logged, and how many
        #: were refused since (``_refused``).
        self._refused_log: dict[str, tuple[float, int]] = {}
        #: Each ``stopping`` (sender, name, epoch) seen by this owner's supervisor: when
        #: to ask its sender next, and the back-off (``_complete_stops``).
        self._stops: dict[tuple[str, str, int], tuple[float, float]] = {}
        #: The nodes this controller acts on (supervises; collects, for a sender): all of
        #: them, unless a ReplicaManager shares them among replicas (``set_ownership``).
        self._owns: Callable[[str], bool] = lambda _node: True
        #: The fencing token results of a node are stored under (None: no replicas).
        self._fence: Callable[[str], Fence | None] = lambda _node: None
        self._supervisor: threading.Thread | None = None
        #: Threshold events: which are raised, and each (session id, epoch)'s loss
        #: window and stored-record count (``_judge``).
        self._monitor = ThresholdMonitor()
        self._restored: set[int] = set()
        #: The sessions' and nodes' totals for the metrics, read from the store once and
        #: then kept as results are stored (``_metric_totals``); stale: to read again.
        self._counts: dict[int, _PathCounts] = {}
        self._node_totals: list[NodeTotals] = []
        self._counts_stale = True
        self._counts_lock = threading.Lock()
        self._loss_windows: dict[tuple[int, int], LossWindow] = {}
        self._received: dict[tuple[int, int], int] = {}
        self.metrics.bind(self._metric_totals)
        store.subscribe(self._on_notice)
        if supervise_interval_s is not None:
            self._supervisor = threading.Thread(
                target=self._supervise, name="controller-supervisor", daemon=True
            )
            self._supervisor.start()

    # -- nodes --------------------------------------------------------------------------

    def client(self, node: str) -> AgentClient:
        with self._lock:
            client = self._clients.get(node)
            if client is None:
                client = self._client_factory(self.store.node(node).address)
                self._clients[node] = client
            return client

    def register_node(self, name: str, address: str, role: str) -> None:
        self.store.add_node(name, address, role)
        self.check_node(name)

    def remove_node(self, name: str, *, prune: bool = False) -> None:
        """Forget a node that carries no live session (and close its agent client);
        ``prune``: with the stored history of its destroyed sessions (``Store.remove_node``)."""
        self.store.remove_node(name, prune=prune)
        self._forget_client(name)

    def replace_node(self, name: str, address: str, role: str) -> None:
        """Point a node (that carries no live session) at another agent or role."""
        self.store.update_node(name, address, role)
        self._forget_client(name)
        self.check_node(name)

    def _forget_client(self, name: str) -> None:
        with self._lock:
            client = self._clients.pop(name, None)
        if client is not None:
            client.close()

    def init_node(
        self,
        name: str,
        *,
        dataplane: str = "",
        port: int | None = None,
        interface: str = "",
        source: str = "",
    ) -> int:
        """Init the node's agent (and remember the parameters to replay after a restart)."""
        init = {"dataplane": dataplane, "port": port, "interface": interface, "source": source}
        with self._ops:
            bound = self._init(name, init)
            self.store.set_init(name, init, bound)
            self._observe(name)
        return bound

    def _init(self, name: str, init: dict[str, Any]) -> int:
        port = self._call(
            name,
            lambda c: c.init(
                port=init["port"],
                interface=init["interface"],
                source=init["source"] or None,
                dataplane=init["dataplane"],
            ),
        )
        assert isinstance(port, int)
        return port

    def _replay_init(self, node: NodeRow) -> None:
        """Init a restarted agent as it was: with the port it bound, so that the senders'
        sessions still reach a reflector that had asked for any free port."""
        if node.init is None:
            raise SouthboundError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"node {node.name} is not initialised and was never initialised by us",
            )
        init = dict(node.init)
        if node.role == "reflector" and not init.get("port") and node.port:
            init["port"] = node.port
        log.warning("node %s: initialising its agent again", node.name)
        self._init(node.name, init)

    def _observe(self, name: str) -> pb.GetAgentInfoReply:
        """GetAgentInfo, recording the agent's run without acting on a change."""
        info: pb.GetAgentInfoReply = self._call(name, lambda c: c.info(INFO_TIMEOUT_S))
        self.store.observe_agent(name, info.epoch, info.started_ns)
        return info

    def check_node(self, name: str, *, full: bool = True) -> bool:
        """Ask the node's agent how it is; repair it if it restarted or lost sessions
        (``full``: as ``reconcile_node``).

        Returns its health. Repairs that fail are logged and retried at the next check.
        """
        was_healthy = self.store.node(name).healthy
        try:
            self.reconcile_node(name, full=full)
        except SouthboundError as exc:
            healthy = self.store.node(name).healthy
            # Once per outage, not at every check of a node that stays down.
            log.log(logging.WARNING if was_healthy or healthy else logging.DEBUG,
                    "node %s: %s", name, exc)  # fmt: skip
        return self.store.node(name).healthy

    def reconcile_node(self, name: str, *, full: bool = True) -> None:
        """Make the node's agent carry what the store says it carries (module doc); the
        owner of a sender node first carries out the destroys recorded for its sessions
        (``destroy_sessions``).

        ``full`` False (the supervisor's rounds): the agent is asked how it is, but its
        sessions are compared with the store's only if something changed since the last
        comparison that found nothing to do (the agent's answer: its run, Init, SSIDs;
        a notice of the store, ``Store.subscribe``), if an orphan is pending, or once
        ``full_check_s`` has passed (a notice may be lost): reading a node's sessions
        every second costs a row per session a second (docs/architecture.md, "Orphan
        sessions")."""
        if self._owns(name) and self.store.node(name).role == "sender":
            self._carry_out_destroys(name)
            self._recover_starts(name)
            self._complete_stops(name)
        # Asked outside the lock first: a node that does not answer must not hold up
        # requests. Whatever looks amiss is asked again under the lock.
        info: pb.GetAgentInfoReply = self._call(name, lambda c: c.info(INFO_TIMEOUT_S, ssids=full))
        if not full:
            if self._unchanged(name, info):
                return
            if info.HasField("ssids_digest"):  # the list was left out: the comparison needs it
                info = self._call(name, lambda c: c.info(INFO_TIMEOUT_S))
        with self._ops:
            gen = self._store_gen  # before the store is read: a later change is seen
            # The store is read BEFORE the answer it is compared with. Whoever creates a
            # session (this controller or another replica on the same database, whose
            # requests ``_ops`` does not serialise) creates it on the agents first and
            # stores its row after; so a session listed before the agent answered was
            # on the agent before it answered, and one missing from that answer is
            # lost. A session stored after the answer may be one being created right
            # now: it is left alone here and checked at the next round.
            node = self.store.node(name)
            wanted = self._wanted_ssids(node)
            if self._amiss(node, info, wanted):
                wanted = self._wanted_ssids(node)
                info = self._call(name, lambda c: c.info(INFO_TIMEOUT_S))
            restarted = self.store.observe_agent(name, info.epoch, info.started_ns)
            if restarted:
                log.warning(
                    "node %s: its agent restarted (epoch %016x); restoring its sessions",
                    name,
                    info.epoch,
                )
            else:
                self._remove_orphans(node, info, wanted)
            carried = info.initialized and wanted <= set(info.ssids)
            if not restarted and (carried or not wanted):
                self._settle(name, info, gen)
            if not wanted:
                return
            if carried and not restarted:
                return  # the agent carries every one of them
            node = self.store.node(name)
            expected = [r for r in self._expected(node) if r.ssid in wanted]
            if not info.initialized:
                self._replay_init(node)
                info = self._call(name, lambda c: c.info(INFO_TIMEOUT_S))
            present = set(info.ssids)
            for row in expected:
                if restarted or row.ssid not in present:
                    if node.role == "sender":
                        self._repair_sender_half(row)
                    else:
                        self._repair_reflector_half(row, present=row.ssid in present)

    def _complete_stops(self, sender: str) -> None:
        """Tell the sender again to stop the sessions recorded ``stopping`` that it still
        runs: the stop did not reach it (the replica that recorded it could not reach
        the sender, or the call was lost or ignored). Each is asked
        ``STOP_CHECK_S`` after this owner first saw it stopping, then again after a
        back-off doubling up to ``STOP_RETRY_MAX_S``, for as long as it stays stopping;
        one whose sender is draining or finished it is left to its collector, which
        ends it ``finished`` (docs/architecture.md, "A stop the sender did not get").
        The calls of a round are pipelined; a stop is idempotent on the agent."""
        seen = self.store.stopping(sender)
        now = time.monotonic()
        due: list[str] = []
        with self._lock:
            keys = {(sender, name, epoch) for name, epoch in seen}
            for key in [k for k in self._stops if k[0] == sender and k not in keys]:
                del self._stops[key]
            for key in sorted(keys):
                entry = self._stops.get(key)
                if entry is None:
                    self._stops[key] = (now + STOP_CHECK_S, STOP_CHECK_S)
                elif entry[0] <= now:
                    due.append(key[1])
                    delay = min(entry[1] * 2, STOP_RETRY_MAX_S)
                    self._stops[key] = (now + delay, delay)
        if not due:
            return
        # The sessions' locks are held from the read of their rows to the end: on the
        # owner, a row leaves ``stopping`` only under its lock (its last batch, a lost
        # half), so no stop goes to a session started again meanwhile in a new epoch.
        with contextlib.ExitStack() as locks:
            for name in sorted(due):
                locks.enter_context(self._session_lock(name))
            rows = [r for r in self.store.sessions_named(due) if r.state == "stopping"]
            running: list[SessionRow] = []
            # ``POLL_ROUND`` at a time: only the states are kept, not the replies.
            for i in range(0, len(rows), POLL_ROUND):
                chunk = rows[i : i + POLL_ROUND]
                replies = self.client(sender).call_many(
                    "GetStampSessionResults", [_stop_check_request(r.ssid) for r in chunk]
                )
                for row, reply in zip(chunk, replies, strict=True):
                    if isinstance(reply, SouthboundError):
                        if reply.code in _UNREACHABLE:
                            self._health(sender, healthy=False, error=reply.details)
                            log.info(
                                "session %s: stop not completed yet: %s", row.name, reply.details
                            )
                        # Otherwise lost by the sender: its repair ends the epoch.
                        continue
                    if reply.state in (pb.SESSION_STATE_RUNNING, pb.SESSION_STATE_IDLE):
                        running.append(row)
            if not running:
                return
            for row in running:
                log.warning(
                    "session %s: stopping, but its sender %s still runs it; telling it again",
                    row.name, sender,
                )  # fmt: skip
            replies = self.client(sender).call_many(
                "StopStampSession", [pb.StopStampSessionRequest(ssid=r.ssid) for r in running]
            )
            for row, reply in zip(running, replies, strict=True):
                if isinstance(reply, SouthboundError) and reply.code not in _MISSING:
                    log.info("session %s: stop not completed yet: %s", row.name, reply.details)
                else:
                    self.store.stop_epoch(row.name, self.clock())

    def _remove_orphans(self, node: NodeRow, info: pb.GetAgentInfoReply, wanted: set[int]) -> None:
        """Destroy the sessions of the node's agent that no live row refers to, once they
        have been so for ``orphan_grace_s`` (hold ``_ops``): left by a replica that died
        between creating them and storing their row, or by a destroy whose call to the
        agent failed (docs/architecture.md, "Orphan sessions").

        The store is read AFTER the agent's answer (``info``): a session created by
        another replica, whose row is stored after the agents have it, may be taken for
        an orphan for as long as the creation takes, which the grace outlasts."""
        extra = set(info.ssids) - wanted
        live: set[int] = set()
        if extra:  # a finished or stopped session also stays on its agents
            live = {ssid for ssid, _ in self.store.ssids_of(node.name, role=node.role)}
        now = time.monotonic()
        due: list[int] = []
        with self._lock:
            before = {k: v for k, v in self._orphans.items() if k[0] == node.name}
            for key in before:
                del self._orphans[key]
            for ssid in extra - live:
                first = before.get((node.name, ssid))
                if first is None or first[0] != info.epoch:  # new, or another run's
                    first = (info.epoch, now)
                self._orphans[(node.name, ssid)] = first
                if now - first[1] >= self.orphan_grace_s:
                    due.append(ssid)
        for ssid in sorted(due):
            log.warning(
                "node %s: destroying session SSID %d on its agent: no session of the store"
                " refers to it (for %.0f s)", node.name, ssid, self.orphan_grace_s,
            )  # fmt: skip
            try:
                self._call(node.name, functools.partial(_destroy, ssid=ssid))
            except SouthboundError as exc:
                if exc.code not in _MISSING:  # tried again at the next check
                    log.info("node %s: SSID %d not destroyed: %s", node.name, ssid, exc.details)
                    continue
            with self._lock:
                self._orphans.pop((node.name, ssid), None)

    def _unchanged(self, name: str, info: pb.GetAgentInfoReply) -> bool:
        """Whether the node's last comparison still stands (``reconcile_node``)."""
        with self._lock:
            seen = self._settled.get(name)
        if seen is None:
            return False
        state, gen, at = seen
        return (
            gen == self._store_gen
            and time.monotonic() - at < self.full_check_s
            and state == _agent_state(info)
        )

    def _settle(self, name: str, info: pb.GetAgentInfoReply, gen: int) -> None:
        """The node's comparison found nothing to do: unless an orphan of it awaits its
        grace (to be looked at every round), the next rounds skip it while nothing
        changes."""
        with self._lock:
            if any(key[0] == name for key in self._orphans):
                self._settled.pop(name, None)
            else:
                self._settled[name] = (_agent_state(info), gen, time.monotonic())

    def _expected(self, node: NodeRow) -> list[SessionRow]:
        """The sessions the node's agent should carry (the node's only: every node is
        checked every second, and reading every session for each would cost nodes x
        sessions rows a second)."""
        on = _ON_SENDER if node.role == "sender" else _ON_REFLECTOR
        return [r for r in self.store.sessions_of(node.name, role=node.role) if r.state in on]

    def _wanted_ssids(self, node: NodeRow) -> set[int]:
        """The SSIDs of ``_expected``, without reading whole rows (the common check)."""
        on = _ON_SENDER if node.role == "sender" else _ON_REFLECTOR
        return {ssid for ssid, state in self.store.ssids_of(node.name, role=node.role)
                if state in on}  # fmt: skip

    def _amiss(self, node: NodeRow, info: pb.GetAgentInfoReply, wanted: set[int]) -> bool:
        """Whether the agent's answer calls for a repair (a new run, no Init, a session
        of ``wanted`` missing)."""
        if node.agent_epoch is not None and node.agent_epoch != f"{info.epoch:016x}":
            return True
        return bool(wanted) and (not info.initialized or not wanted <= set(info.ssids))

    def _repair_reflector_half(self, row: SessionRow, *, present: bool) -> None:
        """The reflector lost the session: create it again, started if it was."""
        log.warning("session %s: creating it again on reflector %s", row.name, row.reflector)
        spec = self._spec(row)
        afresh = spec.stateful and row.state == "running"
        if afresh:
            # A stateful reflector's count starts over while the sender's Seq goes on:
            # Seq - reflector Seq would read as forward loss. The sender stops before
            # the reflector answers again and drains (nothing collected is lost); then
            # both start afresh in a new epoch (``_restart_drained``).
            # The restart is recorded with the row: whichever replica owns the sender
            # when the drain ends carries it out.
            self._call(row.sender, lambda c: c.stop_session(row.ssid))
            self.store.mark_restart(row.name, REFLECTOR_LOST)
        if present:  # an agent that restarted cannot have it: someone else made this one
            with contextlib.suppress(SouthboundError):
                self._call(row.reflector, lambda c: c.destroy_session(row.ssid))
        self._create_reflector_half(spec, row.ssid)
        if self._undo_if_destroyed(row):
            return  # a destroy was recorded meanwhile (another replica carries it out)
        if row.state != "created" and not afresh:
            self._call(row.reflector, lambda c: c.start_session(row.ssid))

    def _repair_sender_half(self, row: SessionRow) -> None:
        """The sender lost the session: create it again on both agents, in a new epoch."""
        log.warning("session %s: creating it again on sender %s", row.name, row.sender)
        with self._session_lock(row.name):
            row = self.store.session(row.name)
            stopping = row.state == "stopping"
            if stopping:
                # It was told to stop: what was in flight died with the agent.
                self.store.end_epoch(row.name, self.clock(), SENDER_LOST)
                self.store.set_state(row.name, "finished")
        if stopping:
            self._stop_collector(row.name)
            return
        with self._session_lock(row.name):
            row = self.store.session(row.name)
            if row.state not in _ON_SENDER:
                return
            if row.state == "created":
                self._destroy_on_agents(row)
                self._create_on_agents(self._spec(row), row.ssid)
                return
        self._restart(row, SENDER_LOST)
        self._start_collector(row.name)  # a stream reopens with the new epoch
        if self.store.states([row.id]).get(row.id) == "stopping":
            # A stop was recorded meanwhile (through another replica, which may have
            # found the sender's half lost or not yet started): the stop wins.
            try:
                self._call(row.sender, lambda c: c.stop_session(row.ssid))
            except SouthboundError as exc:
                if exc.code not in _MISSING:  # else it was stopped already
                    raise
            self.store.stop_epoch(row.name, self.clock())

    def _destroy_on_agents(self, row: SessionRow) -> None:
        for node in (row.sender,) if _is_loopback(row) else (row.sender, row.reflector):
            with contextlib.suppress(SouthboundError):
                self._call(node, lambda c: c.destroy_session(row.ssid))

    def _session_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._session_lock_held(name)

    def _session_lock_held(self, name: str) -> threading.Lock:
        """``_session_lock`` with ``self._lock`` held."""
        lock = self._session_locks.get(name)
        if lock is None:
            lock = self._session_locks[name] = threading.Lock()
        return lock

    def _restart_drained(self) -> None:
        """Start afresh the sessions of the senders owned here that were drained to be
        restarted (supervisor; the restart pending is in the store, so the replica that
        owns the sender when the drain ends does it, whoever began it)."""
        for name, sender, state, reason in self.store.restarts():
            if state != "finished" or not self._owns(sender):
                continue  # still draining, or another replica's
            with self._ops:
                with self._lock:
                    if name in self._collectors:  # its poll loop is still ending
                        continue
                row = self.store.session(name)
                log.warning("session %s: starting it afresh (%s)", name, reason)
                try:
                    self._start_again(row, restart=True)
                except WrongStateError as exc:  # started, stopped or destroyed meanwhile
                    log.info("session %s: %s", name, exc)
                    continue
                self._start_collector(name)

    def _supervise(self) -> None:
        assert self.supervise_interval_s is not None
        while not self._closed:
            # The thread must outlive any round: a database down for a while ended it,
            # and with it every repair until the controller restarted.
            try:
                self._supervise_round()
            except Exception:
                log.exception("supervisor: its round failed; retrying")
            self._wake.wait(self.supervise_interval_s)
            self._wake.clear()

    def _supervise_round(self) -> None:
        try:
            self._restart_drained()
        except StoreUnavailableError:
            raise  # nothing of the round can be done: the caller says so once
        except Exception:
            log.exception("restarting drained sessions failed; retrying")
        for node in self.store.nodes():
            if self._closed:
                return
            if not self._owns(node.name):
                with self._lock:  # compared afresh if it comes back
                    self._settled.pop(node.name, None)
                continue
            try:
                self.check_node(node.name, full=False)
            except NotFoundError:
                if self._node_exists(node.name):
                    log.exception("node %s: check failed", node.name)
                # else removed since the list was read (another replica's prune)
            except Exception:
                log.exception("node %s: check failed", node.name)

    def _node_exists(self, name: str) -> bool:
        try:
            self.store.node(name)
        except NotFoundError:
            return False
        return True

    def _call(self, node: str, fn: Callable[[AgentClient], Any], *, refresh: bool = True) -> Any:
        """One call to a node's agent; its health follows the outcome (``refresh``
        False: a healthy node's ``last_seen`` is left to other calls)."""
        try:
            out = fn(self.client(node))
        except SouthboundError as exc:
            if exc.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self._health(node, healthy=False, error=exc.details)
            raise
        self._health(node, healthy=True, refresh=refresh)
        return out

    def _health(
        self, node: str, *, healthy: bool, error: str | None = None, refresh: bool = True
    ) -> None:
        """Record the node's health: in the store when it changes, and at most once a
        second while it stays healthy (``last_seen``), not at every call.

        Collection passes ``refresh`` False: a write of ``last_seen`` would queue behind
        the other agents' result transactions (SQLite has one writer) between storing
        and acknowledging, while the sessions' locks are held; the supervisor's
        GetAgentInfo refreshes it every second anyway."""
        now = self.clock()
        with self._lock:
            last = self._health_seen.get(node)
            if (
                last is not None
                and healthy
                and last[0]
                and (not refresh or now - last[1] < HEALTH_WRITE_NS)
            ):
                return
            self._health_seen[node] = (healthy, now)
        self.store.set_health(node, healthy, now, error)
        self.metrics.set_agent_up(node, healthy)

    # -- sessions -----------------------------------------------------------------------

    def create_session(self, spec: SessionSpec) -> SessionRow:
        spec.validate()
        sender = self.store.node(spec.sender)
        if sender.role != "sender":
            raise ControllerError(f"sender: node {spec.sender!r} is a {sender.role}")
        # A loopback session's row names its sender as its reflector (module doc).
        reflector_node = spec.sender if spec.loopback else spec.reflector
        reflector = self.store.node(reflector_node)
        if not spec.loopback and reflector.role != "reflector":
            raise ControllerError(f"reflector: node {spec.reflector!r} is a {reflector.role}")
        with self._ops:
            try:
                live = self.store.session(spec.name).state != "destroyed"
            except NotFoundError:
                live = False
            if live:  # a destroyed session's name can be used again
                raise SessionExistsError(f"name: session {spec.name!r} already exists")
            ssid = self._create_with_free_ssid(spec, reflector_node)
            params = asdict(spec)
            try:
                return self.store.add_session(
                    spec.name,
                    ssid,
                    sender=spec.sender,
                    reflector=reflector_node,
                    params=params,
                    now_ns=self.clock(),
                )
            except AlreadyExistsError:
                # Another replica created a session of that name meanwhile (the check
                # above is not a lock across replicas): its row won; ours goes.
                self._undo_create(spec, ssid)
                raise SessionExistsError(f"name: session {spec.name!r} already exists") from None

    def _create_with_free_ssid(self, spec: SessionSpec, reflector_node: str) -> int:
        """Create the session on its agents with an SSID free on both nodes; the SSID."""
        avoid: set[int] = set()
        while True:
            used = self.store.used_ssids(spec.sender) | self.store.used_ssids(reflector_node)
            used |= avoid
            ssid = next((i for i in range(1, 0x10000) if i not in used), None)
            if ssid is None:
                raise NoFreeSsidError("ssid: no free SSID left on these nodes")
            try:
                self._create_on_agents(spec, ssid)
            except SouthboundError as exc:
                if not _taken(exc) or len(avoid) + 1 >= SSID_TRIES:
                    raise
                avoid.add(ssid)  # another replica is creating a session with it
                continue
            return ssid

    def _undo_create(self, spec: SessionSpec, ssid: int) -> None:
        """Destroy the halves of a session created on the agents whose row the store
        refused."""
        for node in (spec.sender,) if spec.loopback else (spec.sender, spec.reflector):
            with contextlib.suppress(SouthboundError):
                self._call(node, lambda c: c.destroy_session(ssid))

    def create_sessions(
        self, specs: Sequence[SessionSpec]
    ) -> tuple[list[SessionRow], dict[str, Exception]]:
        """``create_session`` for many sessions at once: the calls to each agent in
        flight together (``AgentClient.call_many``), the rows stored in one transaction.

        Returns the sessions created and, by name, why the others were not (a refused
        spec, a taken name, an agent's refusal); one failure does not stop the others.
        """
        errors: dict[str, Exception] = {}
        wanted: list[SessionSpec] = []
        nodes = {n.name: n for n in self.store.nodes()}
        for spec in specs:
            try:
                _check_spec(spec, nodes)
            except ControllerError as exc:
                errors[spec.name] = exc
                continue
            wanted.append(spec)
        with self._ops:
            live = self.store.live_names([w.name for w in wanted])
            pending: list[SessionSpec] = []
            seen: set[str] = set()
            for spec in wanted:
                if spec.name in live or spec.name in seen:
                    errors[spec.name] = SessionExistsError(
                        f"name: session {spec.name!r} already exists"
                    )
                    continue
                seen.add(spec.name)
                pending.append(spec)
            used: dict[str, set[int]] = {}
            #: Per (sender, reflector): SSIDs below this are taken (the sets only grow).
            floor: dict[tuple[str, str], int] = {}
            done: list[tuple[SessionSpec, int]] = []
            for attempt in range(SSID_TRIES):
                todo = self._pick_ssids(pending, used, floor, errors)
                done += self._create_many(todo, errors)
                # An SSID another replica took meanwhile (its row not stored yet when
                # the SSIDs in use were read): those sessions try the next free one.
                clash = [sp for sp, _ in todo if _taken(errors.get(sp.name))]
                if not clash or attempt == SSID_TRIES - 1:
                    break
                for spec in clash:
                    del errors[spec.name]
                for node in used:
                    used[node] |= self.store.used_ssids(node)
                pending = clash
            now = self.clock()
            items = [
                (sp.name, i, sp.sender, sp.sender if sp.loopback else sp.reflector, asdict(sp))
                for sp, i in done
            ]
            try:
                rows = self.store.add_sessions(items, now_ns=now)
            except AlreadyExistsError:
                # Another replica created one of these names meanwhile: one by one, and
                # the halves of those refused are destroyed (``create_session``).
                rows = []
                for item, (spec, ssid) in zip(items, done, strict=True):
                    name, _, sender, reflector, params = item
                    try:
                        rows.append(self.store.add_session(
                            name, ssid, sender=sender, reflector=reflector, params=params,
                            now_ns=now,
                        ))  # fmt: skip
                    except AlreadyExistsError:
                        self._undo_create(spec, ssid)
                        errors[name] = SessionExistsError(f"name: session {name!r} already exists")
        return rows, errors

    def _pick_ssids(
        self,
        specs: Sequence[SessionSpec],
        used: dict[str, set[int]],
        floor: dict[tuple[str, str], int],
        errors: dict[str, Exception],
    ) -> list[tuple[SessionSpec, int]]:
        """An SSID free on both nodes for each session (``used``: the SSIDs in use per
        node, read on first need and added to; ``floor``: per node pair, the SSIDs
        below it are taken)."""
        todo: list[tuple[SessionSpec, int]] = []
        for spec in specs:
            # A loopback session's row names its sender as its reflector.
            reflector = spec.sender if spec.loopback else spec.reflector
            for node in (spec.sender, reflector):
                if node not in used:
                    used[node] = self.store.used_ssids(node)
            a, b = used[spec.sender], used[reflector]
            pair = (spec.sender, reflector)
            ssid = next(
                (i for i in range(floor.get(pair, 1), 0x10000) if i not in a and i not in b),
                None,
            )
            if ssid is None:
                errors[spec.name] = NoFreeSsidError("ssid: no free SSID left on these nodes")
                continue
            floor[pair] = ssid + 1
            a.add(ssid)
            b.add(ssid)
            todo.append((spec, ssid))
        return todo

    def _create_many(
        self, todo: list[tuple[SessionSpec, int]], errors: dict[str, Exception]
    ) -> list[tuple[SessionSpec, int]]:
        """Create the sessions on their agents, reflectors first; those created on both
        (a reflector half whose sender half failed is destroyed again)."""
        # A loopback session has no reflector half (docs/srpm.md).
        made = [t for t in todo if t[0].loopback] + self._many(
            [t for t in todo if not t[0].loopback], "reflector", _reflector_request, errors
        )
        done = self._many(made, "sender", _sender_request, errors)
        # By name (unique in a batch): a scan of ``done`` per session made the
        # creation of n sessions cost n² spec comparisons.
        created = {sp.name for sp, _ in done}
        undo = [(sp, i) for sp, i in made if sp.name not in created and not sp.loopback]
        self._many_calls(undo, "reflector", "DestroyStampSession",
                         lambda _sp, i: pb.DestroyStampSessionRequest(ssid=i))  # fmt: skip
        return done

    def _many(
        self,
        items: list[tuple[SessionSpec, int]],
        side: str,
        request: Callable[[SessionSpec, int], pb.CreateStampSessionRequest],
        errors: dict[str, Exception],
    ) -> list[tuple[SessionSpec, int]]:
        """CreateStampSession for every item on its ``side`` node; those that succeeded
        (the others' errors go to ``errors``)."""
        outcome = self._many_calls(items, side, "CreateStampSession", request)
        ok = []
        for (spec, ssid), result in zip(items, outcome, strict=True):
            if isinstance(result, Exception):
                errors[spec.name] = result
            else:
                ok.append((spec, ssid))
        return ok

    def _many_calls(
        self,
        items: list[tuple[SessionSpec, int]],
        side: str,
        method: str,
        request: Callable[[SessionSpec, int], Any],
    ) -> list[Any]:
        """One call per item to its ``side`` node, pipelined per node; per item, in
        order, the reply or the error."""
        by_node: dict[str, list[int]] = {}
        for k, (spec, _) in enumerate(items):
            by_node.setdefault(getattr(spec, side), []).append(k)
        out: list[Any] = [None] * len(items)
        for node, indexes in by_node.items():
            replies = self.client(node).call_many(method, [request(*items[k]) for k in indexes])
            failed = [r for r in replies if isinstance(r, SouthboundError)]
            down = [r for r in failed if r.code in _UNREACHABLE]
            if down:
                self._health(node, healthy=False, error=down[0].details)
            elif len(failed) < len(replies):
                self._health(node, healthy=True)
            for k, reply in zip(indexes, replies, strict=True):
                out[k] = reply
        return out

    def start_sessions(self, names: Sequence[str]) -> dict[str, Exception]:
        """``start_session`` for many sessions: those created are started with their
        calls pipelined per agent, one transaction for their epochs and states, and one
        reopening of each sender's stream; the others one by one. Returns, by name, why
        a session was not started."""
        errors: dict[str, Exception] = {}
        with self._ops:
            rows = {r.name: r for r in self.store.sessions_named(names)}
            fresh: list[SessionRow] = []
            for name in names:
                row = rows.get(name)
                if row is None:
                    errors[name] = NotFoundError(f"session: no session named {name!r}")
                elif row.state == "created":
                    fresh.append(row)
                else:
                    try:
                        self.start_session(name)
                    except (ControllerError, SouthboundError) as exc:
                        errors[name] = exc
            if fresh:
                errors.update(self._start_created(fresh))
        return errors

    def _start_created(self, fresh: list[SessionRow]) -> dict[str, Exception]:
        """Start created sessions together (hold ``_ops``), each claimed ``created`` →
        ``starting`` by this controller as its epoch begins (one transaction): a session
        another replica started meanwhile (its row read as created before) is refused as
        a running one is, and its epoch is left alone. Those started move to ``running``
        while the claim is still this controller's; the others go back to ``created``.
        Returns, by name, why a session was not started."""
        errors: dict[str, Exception] = {}
        me = self.replica_id
        now = self.clock()
        agents = {n.name: n.agent_epoch for n in self.store.nodes()}
        begun = self.store.begin_epochs(
            [(r.name, agents.get(r.sender)) for r in fresh], now, claimer=me
        )
        if len(begun) < len(fresh):
            # Started, or destroyed (or being destroyed) through any replica meanwhile.
            states = self.store.states([r.id for r in fresh if r.name not in begun])
            for row in fresh:
                if row.name not in begun:
                    state = states.get(row.id, "destroyed")
                    errors[row.name] = _not_startable(
                        row.name, "destroying" if state == "destroyed" else state
                    )
        fresh = [r for r in fresh if r.name in begun]
        try:
            items = [(self._spec(r), r.ssid) for r in fresh]
            for side in ("reflector", "sender"):
                # A loopback session has no reflector half to start (docs/srpm.md).
                ask = [k for k, (sp, _) in enumerate(items) if side == "sender" or not sp.loopback]
                replies: list[Any] = [None] * len(items)
                for k, reply in zip(ask, self._many_calls(
                    [items[k] for k in ask], side, "StartStampSession",
                    lambda _sp, i: pb.StartStampSessionRequest(ssid=i),
                ), strict=True):  # fmt: skip
                    replies[k] = reply
                keep = []
                for row, item, reply in zip(fresh, items, replies, strict=True):
                    if isinstance(reply, Exception):
                        errors[row.name] = reply
                    else:
                        keep.append((row, item))
                fresh, items = [r for r, _ in keep], [i for _, i in keep]
        except BaseException:
            self.store.claim_states([r.name for r in fresh], "starting", "created", holder=me)
            raise
        finally:
            failed = [n for n in begun if n in errors]
            self.store.claim_states(failed, "starting", "created", holder=me)
        moved = self.store.claim_states([r.name for r in fresh], "starting", "running", holder=me)
        for row in fresh:
            if row.name not in moved:  # destroyed meanwhile, or taken over
                state = self.store.states([row.id]).get(row.id, "destroyed")
                errors[row.name] = (
                    _not_startable(row.name, "destroying")
                    if state in ("destroying", "destroyed")
                    else WrongStateError(_TAKEN_OVER.format(name=row.name))
                )
        self._start_collectors([r for r in fresh if r.name in moved])
        return errors

    def _start_collectors(self, rows: Sequence[SessionRow]) -> None:
        """``_start_collector`` for many sessions: one reopening per sender's stream."""
        poked: dict[str, _Streamer] = {}
        for row in rows:
            if row.params["collect"] != CollectMode.STREAM:
                self._start_collector(row.name)
                continue
            if not self._owns(row.sender):
                continue
            with self._lock:
                if self._closed:
                    return
                st = self._streamer(row.sender)
                st.names.add(row.name)
                poked[row.sender] = st
        for st in poked.values():
            st.poke()

    def _create_reflector_half(self, spec: SessionSpec, ssid: int) -> None:
        if spec.loopback:
            return  # no reflector takes part (docs/srpm.md)
        self._call(spec.reflector, lambda c: c.create_session(_reflector_request(spec, ssid)))

    def _create_on_agents(self, spec: SessionSpec, ssid: int) -> None:
        self._create_reflector_half(spec, ssid)
        try:
            self._call(spec.sender, lambda c: c.create_session(_sender_request(spec, ssid)))
        except SouthboundError:
            if not spec.loopback:
                with contextlib.suppress(SouthboundError):
                    self._call(spec.reflector, lambda c: c.destroy_session(ssid))
            raise

    def _spec(self, row: SessionRow) -> SessionSpec:
        """The session's spec as created (fields a row lacks take their defaults)."""
        params: dict[str, Any] = {
            "name": row.name,
            "sender": row.sender,
            "reflector": row.reflector,
            "reflector_address": "",
        }
        params.update(row.params)
        for key in ("segments", "return_segments", "flow_labels"):
            params[key] = tuple(params.get(key, ()))
        if params.get("loopback"):
            params["reflector"] = ""
        return SessionSpec(**params)

    def start_session(self, name: str) -> None:
        """Start a created session, or start a stopped or finished one again.

        Started again, the session begins a new epoch: the sender's session is created
        afresh (its Seq and record ids start over; a finished STAMP session cannot be
        resumed), and so is the reflector's (a stateful reflector's count with it).
        """
        with self._ops:
            row = self.store.session(name)
            if row.state not in ("created", "stopped", "finished"):
                raise _not_startable(name, row.state)
            if row.state == "created":
                error = self._start_created([row]).get(name)
                if error is not None:
                    raise error
                return
            self._start_again(row)
            self._start_collector(name)

    def _start_again(self, row: SessionRow, *, restart: bool = False) -> None:
        """``_restart`` a stopped or finished session, in the ``starting`` state claimed
        by this controller: the repairs of the replicas that own its nodes leave it alone
        while its halves are destroyed and created again, and a second start (through
        another replica) is refused. A destroy recorded meanwhile wins: what this start
        created on the agents is destroyed again; if this controller dies meanwhile, the
        owner of the sender finishes the start (``_recover_starts``; docs/architecture.md,
        "Session lifecycle across replicas"). ``restart``: only if the restart after a
        drain is still pending (a stop cancels it)."""
        me = self.replica_id
        if not self.store.claim_state(row.name, row.state, "starting", claimer=me, restart=restart):
            raise _not_startable(row.name, self.store.session(row.name).state)
        try:
            self._restart(row, claim=me)
        except BaseException:
            self.store.claim_state(row.name, "starting", row.state, holder=me)
            self._undo_if_destroyed(row)
            raise
        if not self.store.claim_state(row.name, "starting", "running", holder=me):
            if self._undo_if_destroyed(row):
                raise WrongStateError(f"name: session {row.name!r} was destroyed while it started")
            raise WrongStateError(_TAKEN_OVER.format(name=row.name))

    def _recover_starts(self, sender: str) -> None:
        """Finish the starts of this sender's sessions left ``starting`` by a controller
        that died (a replica no longer alive, or a controller before this one restarted):
        the owner of the sender takes the claim over (``Store.take_over_start``) and
        finishes the start (``_finish_start``). One that fails is retried next round."""
        stuck = self.store.starting(sender)
        if not stuck:
            return
        live = {r.id for r in self.store.replicas()} | {self.replica_id}
        for name, claimer in stuck:
            if claimer in live or not self.store.take_over_start(name, claimer, self.replica_id):
                continue
            log.warning(
                "session %s: its start through %s was left unfinished; finishing it",
                name, claimer or "another controller",
            )  # fmt: skip
            try:
                with self._ops:
                    self._finish_start(self.store.session(name))
            except (ControllerError, SouthboundError) as exc:
                log.warning("session %s: start not finished yet: %s", name, exc)
                self.store.take_over_start(name, self.replica_id, None)

    def _finish_start(self, row: SessionRow) -> None:
        """Finish a start taken over (hold ``_ops``). If the dead controller got as far as
        starting the sender in a new epoch, the session runs: it moves to ``running`` and
        is collected from its cursor (nothing it sent is lost). Otherwise nothing was
        sent in that start: it is carried out again (``_restart``; an epoch the dead
        controller began ends as ``start-interrupted``)."""
        epochs = self.store.epochs(row.id)
        begun = bool(epochs) and epochs[-1].epoch == row.epoch and epochs[-1].ended_ns is None
        started = False
        if begun:
            try:
                # One record at most: the session's state is the point.
                reply = self._call(
                    row.sender, lambda c: c.results(row.ssid, 1, after_id=row.cursor)
                )
                started = reply.state != pb.SESSION_STATE_IDLE
            except SouthboundError as exc:
                if exc.code not in _MISSING:
                    raise
        if not started:
            self._restart(row, START_INTERRUPTED, claim=self.replica_id)
        if self.store.claim_state(row.name, "starting", "running", holder=self.replica_id):
            self._start_collector(row.name)
        else:
            self._undo_if_destroyed(row)

    def _undo_if_destroyed(self, row: SessionRow) -> bool:
        """If a destroy of the session was recorded, destroy its halves on the agents
        (created by a start that ran meanwhile); whether it was."""
        if self.store.states([row.id]).get(row.id) not in ("destroying", "destroyed"):
            return False
        self._destroy_on_agents(row)
        return True

    def _agent(self, node: str) -> str | None:
        return self.store.node(node).agent_epoch

    def _restart(self, row: SessionRow, reason: str = "", *, claim: str | None = None) -> None:
        """Create the session again on both agents in a new epoch, and start it; an
        epoch still open ends with ``reason``. The row's state is the caller's.

        ``claim``: a start's claimer (``starting``). Each step first makes sure the start
        is still its own, and the epoch begins only if it is (in the same transaction):
        a controller paused past its heartbeat, whose start the sender's owner took over
        meanwhile, goes no further than the call it was in."""

        def still_mine() -> None:
            if claim is not None and dict(self.store.starting(row.sender)).get(row.name) != claim:
                raise WrongStateError(_TAKEN_OVER.format(name=row.name))

        with self._session_lock(row.name):
            still_mine()
            self._destroy_on_agents(row)
            still_mine()
            self._create_on_agents(self._spec(row), row.ssid)
            self.store.begin_epoch(
                row.name, self.clock(), sender_agent=self._agent(row.sender), reason=reason,
                claimer=claim,
            )  # fmt: skip
            if not _is_loopback(row):
                still_mine()
                self._call(row.reflector, lambda c: c.start_session(row.ssid))
            still_mine()
            self._call(row.sender, lambda c: c.start_session(row.ssid))

    def stop_session(self, name: str) -> str:
        """Stop sending; the collector keeps reading until the session has drained.
        Returns "" once the sender was told, else why it was not yet.

        The stop is recorded (``stopping``) before the sender is told, so that a repair
        of the sender running meanwhile (another replica's) finds it and stops what it
        starts; a sender that lost the session, or has not started it yet, is left to
        that repair. The record stands whatever the sender's call answers: a sender this
        controller cannot reach (or that refuses) is told by the owner of its node once
        it can be (``_complete_stops``), and the caller hears that the stop is accepted
        and completes so (docs/architecture.md, "A stop the sender did not get")."""
        with self._ops:
            if self.store.cancel_restart(name):
                return ""  # draining to start afresh: it will just finish
            row = self.store.session(name)
            if row.state != "running" or not self.store.claim_state(name, "running", "stopping"):
                state = self.store.session(name).state
                raise WrongStateError(f"name: session {name!r} is {state}, not running")
            try:
                self._call(row.sender, lambda c: c.stop_session(row.ssid))
            except SouthboundError as exc:
                if exc.code not in _MISSING:
                    pending = (
                        f"sender {row.sender!r} not told yet ({exc.code.name}: {exc.details});"
                        " the stop is recorded (the session is stopping) and the controller"
                        " that owns the sender tells it once it can"
                    )
                    log.warning("session %s: %s", name, pending)
                    return pending
            self.store.stop_epoch(name, self.clock())
            return ""

    def destroy_session(self, name: str, *, wait_s: float = DESTROY_WAIT_S) -> None:
        """Destroy the session (``destroy_sessions``); raises why it was not."""
        errors = self.destroy_sessions([name], wait_s=wait_s)
        if name in errors:
            raise errors[name]

    def destroy_sessions(
        self, names: Sequence[str], *, wait_s: float = DESTROY_WAIT_S
    ) -> dict[str, Exception]:
        """Destroy sessions: each is marked ``destroying`` in the store, then the owner of
        its sender node (this controller, or another replica) collects what its sender
        still holds, destroys it on both agents and marks it ``destroyed``
        (``_carry_out_destroy``; docs/architecture.md, "Session lifecycle across
        replicas"). Returns once every one is destroyed or ``wait_s`` passed: by name,
        why a session was not destroyed (``DestroyPendingError``: recorded, not yet
        carried out)."""
        errors: dict[str, Exception] = {}
        rows = {r.name: r for r in self.store.mark_destroying(names)}
        for name in names:
            if name not in rows:
                try:
                    self.store.session(name)
                except NotFoundError as exc:
                    errors[name] = exc
                else:
                    errors[name] = WrongStateError(f"name: session {name!r} is already destroyed")
        waiting: dict[int, SessionRow] = {}
        failed: dict[str, Exception] = {}
        for row in rows.values():
            if self._owns(row.sender):
                try:
                    with self._ops:
                        self._carry_out_destroy(row)
                except (ControllerError, SouthboundError) as exc:
                    failed[row.name] = exc  # e.g. fenced: its new owner carries it out
            waiting[row.id] = row
        deadline = time.monotonic() + wait_s
        while waiting:
            with self._destroyed:
                seen = self._destroyed_seen
            for sid, state in self.store.states(list(waiting)).items():
                if state == "destroyed":
                    waiting.pop(sid)
            remaining = deadline - time.monotonic()
            if not waiting or remaining <= 0:
                break
            # Woken by the owner's DESTROYED notice; the poll is the fallback.
            with self._destroyed:
                if self._destroyed_seen == seen:
                    self._destroyed.wait(min(remaining, DESTROY_POLL_S))
        for row in waiting.values():
            errors[row.name] = failed.get(
                row.name,
                DestroyPendingError(
                    f"name: session {row.name!r}: the destroy is recorded; the replica that"
                    f" holds sender {row.sender!r} has not carried it out within {wait_s:g} s"
                    " (it will)"
                ),
            )
        return errors

    def _on_notice(self, kind: str, arg: str) -> None:
        """A notice of the store (``Store.subscribe``: this controller's changes, and the
        other replicas' on the same database or SQLite file): act now rather than at the
        next round."""
        self._store_gen += 1  # the supervisor compares the nodes again
        if kind in (CHANGED, RESYNC):
            self._counts_stale = True  # read again at the next scrape
        if kind in (DESTROYING, RESYNC):
            self._wake_destroyer(arg if kind == DESTROYING else None)
        if kind in (DESTROYED, RESYNC):
            with self._destroyed:
                self._destroyed_seen += 1
                self._destroyed.notify_all()

    def _wake_destroyer(self, sender: str | None) -> None:
        """Have the destroys recorded for ``sender`` (None: for every sender node this
        controller owns) carried out now, by ``_destroy_loop``."""
        with self._lock:
            if self._closed:
                return
            if sender is None:
                self._to_destroy.update(n.name for n in self.store.nodes() if n.role == "sender")
            else:
                self._to_destroy.add(sender)
            if self._destroyer is None:
                self._destroyer = threading.Thread(
                    target=self._destroy_loop, name="controller-destroyer", daemon=True
                )
                self._destroyer.start()
        self._destroy_wake.set()

    def _destroy_loop(self) -> None:
        """Carry out the destroys of the sender nodes the notices named, as they come
        (the supervisor's round does too, should a notice be lost)."""
        while not self._closed:
            self._destroy_wake.wait()
            self._destroy_wake.clear()
            with self._lock:
                nodes, self._to_destroy = self._to_destroy, set()
            for node in sorted(nodes):
                if self._closed:
                    return
                if not self._owns(node):
                    continue
                try:
                    self._carry_out_destroys(node)
                except Exception:  # the supervisor's round tries again
                    log.exception("node %s: carrying out destroys failed", node)

    def _carry_out_destroys(self, sender: str) -> None:
        """Carry out the destroys recorded for the sessions of a sender node this
        controller owns (any replica may have recorded them)."""
        names = self.store.destroying(sender)
        if not names:
            return
        for row in self.store.sessions_named(names):
            try:
                with self._ops:
                    self._carry_out_destroy(row)
            except (ControllerError, SouthboundError) as exc:
                log.warning("session %s: destroy not carried out yet: %s", row.name, exc)

    def _carry_out_destroy(self, row: SessionRow) -> None:
        """The owner of the session's sender destroys it (hold ``_ops``): stops
        collecting it, stores what its sender still holds, destroys it on both agents,
        then marks it destroyed. The session's state stays ``destroying`` until then, so
        that no repair (this replica's or another's) creates it again meanwhile."""
        self._stop_collector(row.name)
        with self._session_lock(row.name):
            if self.store.states([row.id]).get(row.id) != "destroying":
                return  # carried out already
            try:
                self._final_collect(row)
            except SouthboundError as exc:
                log.info("session %s: final collection: %s", row.name, exc.details)
            self._destroy_on_agents(row)
            self.store.finish_destroy(row.id, self.clock())
            self.metrics.remove_path(row.name)
        with self._finished:
            self._finished.notify_all()

    def _final_collect(self, row: SessionRow) -> None:
        """Store the records the session's sender still holds (session lock held), reply
        after reply until one says nothing remains (``FINAL_RECORDS_MAX`` at most): its
        results up to the destroy are kept with it."""
        client = self.client(row.sender)
        collected = 0
        while True:
            cur = self.store.session(row.name)
            if cur.id != row.id:
                return
            reply = client.results(cur.ssid, BATCH, after_id=cur.cursor)
            if not reply.results:
                return
            batch = self._read_batch(row.sender, cur, reply.results, reply.counters)
            now = self.clock()
            (new,) = self.store.store_many([batch], now, fence=self._fence(row.sender))
            rows = batch.result_rows()
            if new is None:
                self.metrics.dropped(row.sender, len(rows))
                return
            self._stored(cur, batch, new, now)
            client.acknowledge(cur.ssid, reply.results[-1].record_id)
            collected += len(reply.results)
            if not reply.remaining:
                return
            if collected >= FINAL_RECORDS_MAX:
                log.warning(
                    "session %s: final collection stopped after %d records; the sender"
                    " still held %d, destroyed with the session",
                    row.name,
                    collected,
                    reply.remaining,
                )
                return

    def wait_finished(self, name: str, timeout: float) -> bool:
        """Wait until the session has finished (every result stored) or was destroyed."""
        deadline = time.monotonic() + timeout
        with self._finished:
            while True:
                state = self.store.session(name).state
                if state in ("finished", "destroyed") and name not in self._collectors:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._finished.wait(min(remaining, 0.1))

    def resume(self) -> list[str]:
        """After a restart: collect again for every session that was being collected
        (whose sender node this controller owns)."""
        rows = [
            r
            for r in self.store.sessions()
            if r.state in ("running", "stopping") and self._owns(r.sender)
        ]
        # In bulk: one store query and one stream opening per sender, not one each
        # (each competes with collection for the store).
        self._start_collectors(rows)
        return [r.name for r in rows]

    def epochs(self, name: str) -> list[EpochStats]:
        """The session's epochs, oldest first, with what became of their probes."""
        row = self.store.session(name)
        spec = self._spec(row)
        return [epoch_stats(e, spec) for e in self.store.epochs(row.id)]

    def _metric_totals(self) -> Totals:
        """The totals of the sessions whose sender this controller owns, and of every
        node, at each scrape: from memory (``_PathCounts``), without reading the store
        unless something other than stored results changed since the last scrape (the
        store's CHANGED notices, a node taken over). A scrape then costs no query per
        session, however many there are."""
        with self._counts_lock:
            if self._counts_stale:
                self._read_counts()
            paths = [p.totals() for p in self._counts.values() if self._owns(p.sender)]
            return Totals(paths, list(self._node_totals))

    def _read_counts(self) -> None:
        """Read every live session's and node's totals from the store, in a few queries
        (hold ``_counts_lock``: results stored meanwhile are counted after)."""
        self._counts_stale = False  # a change while reading makes it stale again
        try:
            rows = self.store.sessions()
            epochs = self.store.live_epochs()
            events = self.store.live_events()
            nodes = self.store.nodes()
        except BaseException:
            self._counts_stale = True
            raise
        self._counts = {}
        for row in rows:
            raised, counts = events.get(row.id, ([], {}))
            self._counts[row.id] = _PathCounts(
                row.name, row.sender, self._spec(row),
                {e.epoch: e for e in epochs.get(row.id, [])}, tuple(raised), counts,
            )  # fmt: skip
        self._node_totals = [NodeTotals(n.name, n.restarts, n.agent_started_ns) for n in nodes]

    def _count_stored(self, row: SessionRow, batch: ResultBatch, new: int, now: int) -> None:
        """Keep the metrics' totals of a batch just stored (``_PathCounts.stored``)."""
        with self._counts_lock:
            if self._counts_stale:
                return  # read again with this batch in before the next scrape
            counts = self._counts.get(row.id)
            if counts is None or not counts.stored(batch, new, now):
                self._counts_stale = True

    def stats(self, name: str, since_ns: int | None = None) -> PathStats:
        """The path's statistics since ``since_ns`` (None: over its whole life).

        A range longer than ``raw_stats_ns`` (an hour), or one over which raw results
        were deleted (``Store.expire``), is answered from the per-minute rollups
        (``sixlab.controller.rollup``: percentiles within 1 %, the range widened to whole
        minutes) plus the records not rolled up yet; a shorter one from the raw results,
        exactly.
        """
        row = self.store.session(name)
        start = row.created_ns if since_ns is None else since_ns
        if self.clock() - start > self.raw_stats_ns or self.store.expired(row.id):
            minutes = [m for _, m in self.store.rollups(row.id, since_ns=since_ns)]
            if minutes:
                tail: dict[int, list[tuple[int, StampResult]]] = {}
                for epoch, rid, r in self.store.unrolled(row.id, since_ns=since_ns):
                    tail.setdefault(epoch, []).append((rid, r))
                for recs in tail.values():
                    rolled, _ = roll_up(recs, None)
                    for m in rolled.values():
                        m.lost = 0  # loss is counted by the roll-up passes
                        minutes.append(m)
                return merged_stats(minutes, lost=row.lost if since_ns is None else None)
        records = self.store.results(row.id, since_ns=since_ns)
        return path_stats(records, lost=row.lost if since_ns is None else 0)

    def flow_stats(self, name: str, since_ns: int | None = None) -> dict[int, PathStats]:
        """Delay, jitter and received probes per flow label (ECMP coverage, docs/srpm.md);
        empty for a session without labels. The store keeps no lost Seqs: per-label loss
        is not known here (the agent's records and the sender CLI give it)."""
        row = self.store.session(name)
        labels = tuple(row.params.get("flow_labels", ()))
        if not labels:
            return {}
        return per_flow_stats(self.store.results(row.id, since_ns=since_ns), labels)

    def data_loss(
        self, name: str, since_ns: int | None = None
    ) -> tuple[DataLoss | None, list[DataLoss]]:
        """Direct-mode data loss (RFC 8972 §4.5): over everything stored and per interval
        between consecutive replies, each epoch apart (counters start over with it)."""
        row = self.store.session(name)
        by_epoch: dict[int, list[tuple[int, int, Any]]] = {}
        for epoch, r in self.store.records(row.id, since_ns=since_ns):
            if r.data is not None:
                by_epoch.setdefault(epoch, []).append((r.seq, r.t1_ns, r.data))
        intervals = [i for samples in by_epoch.values() for i in data_loss(samples)]
        totals = [t for samples in by_epoch.values() if (t := data_loss_total(samples))]
        if not totals:
            return None, intervals
        backward = [t.backward_lost for t in totals]
        total = DataLoss(
            start_ns=totals[0].start_ns,
            end_ns=totals[-1].end_ns,
            forward_sent=sum(t.forward_sent for t in totals),
            forward_lost=sum(t.forward_lost for t in totals),
            backward_sent=sum(t.backward_sent for t in totals),
            backward_lost=None if None in backward else sum(b or 0 for b in backward),
        )
        return total, intervals

    def events(self, name: str | None = None, since_ns: int | None = None) -> list[EventRow]:
        """Threshold events, oldest first (of one session, or of all)."""
        return self.store.events(name, since_ns=since_ns)

    def _judge(self, row: SessionRow, batch: ResultBatch, now: int) -> None:
        """Judge the session's thresholds over its last window after a stored batch."""
        p = row.params  # no thresholds: the common case, told cheaply
        if (
            p.get("max_delay_ms") is None
            and p.get("max_jitter_ms") is None
            and (p.get("max_loss_ratio") is None)
        ):
            return
        th = self._spec(row).thresholds()
        if th is None:
            return
        key = (row.id, row.epoch)
        window_ns = round(th.window_s * 1e9)
        with self._lock:
            if row.id not in self._restored:  # raised before a controller restart
                self._restored.add(row.id)
                for kind in self.store.raised(row.id):
                    self._monitor.restore(row.name, EventKind(kind))
            win = self._loss_windows.get(key)
            if win is None:
                win = self._loss_windows[key] = LossWindow(window_ns)
            received = self._received.get(key, 0) + len(batch.result_rows())
            self._received[key] = received
        if batch.counters is not None:
            win.observe(now, received, batch.counters.lost)
        got, lost = win.over(now)
        records = self.store.results(row.id, since_ns=now - window_ns)
        sample = window_sample(records, lost)
        if got and not records:
            sample = replace(sample, received=got)
        for event in self._monitor.judge(row.name, th, sample, now):
            self.store.add_event(row.id, event)
            _log_event(event)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pollers = list(self._pollers.values())
            self._pollers.clear()
            self._collectors.clear()
            streamers = list(self._streamers.values())
            self._streamers.clear()
        self.store.unsubscribe(self._on_notice)
        self._wake.set()
        self._destroy_wake.set()
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join(INFO_TIMEOUT_S + 10)
        destroyer = self._destroyer
        if destroyer is not None and destroyer is not threading.current_thread():
            destroyer.join(INFO_TIMEOUT_S + 10)
        for p in pollers:
            p.stop.set()
        for p in pollers:
            p.thread.join(10)
        for st in streamers:
            st.stop.set()
            st.poke()
        for st in streamers:
            st.thread.join(10)
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()

    # -- collection ---------------------------------------------------------------------

    def _start_collector(self, name: str) -> None:
        """Collect the session's results: a poll loop of its own, or a place on its
        sender's stream (which is reopened, so a new epoch starts from its cursor)."""
        row = self.store.session(name)
        if not self._owns(row.sender):
            return  # its owner (another replica) collects it
        with self._lock:
            if self._closed:
                return
            if row.params["collect"] == CollectMode.STREAM:
                st = self._streamer(row.sender)
                st.names.add(name)
                st.poke()
                return
            if name in self._collectors:
                return
            p = self._pollers.get(row.sender)
            if p is None:
                p = self._pollers[row.sender] = _Poller(row.sender)
                p.thread = threading.Thread(
                    target=self._poll_loop, args=(p,), name=f"poll-{row.sender}", daemon=True
                )
                p.thread.start()
            p.names.add(name)
            self._collectors[name] = p

    # -- ownership (replicas) -------------------------------------------------------------

    def set_ownership(
        self,
        owns: Callable[[str], bool],
        fence: Callable[[str], Fence | None] | None = None,
        replica: str | None = None,
    ) -> None:
        """Act only on the nodes ``owns`` accepts (``sixlab.controller.replica``), store a
        node's results only while ``fence(node)`` holds (``Store.store_many``), and be
        known in the store as ``replica`` (whose liveness the replicas table tells)."""
        self._owns = owns
        self._counts_stale = True
        if fence is not None:
            self._fence = fence
        if replica is not None:
            self.replica_id = replica

    def _fenced(self, node: str, exc: FencedError) -> None:
        """This replica lost the node's lease to another while collecting it (it was
        paused or cut off past the lease): nothing was stored; stop collecting it."""
        log.warning("node %s: %s; another replica collects it, stopping here", node, exc)
        self.metrics.fenced(node)
        self.drop_node(node)

    def collecting(self, name: str) -> bool:
        """Is the session's collection running here (its poll loop or stream)?"""
        with self._lock:
            return name in self._collectors or any(
                name in st.names for st in self._streamers.values()
            )

    def adopt_node(self, node: str, *, check: bool = False) -> None:
        """Collect the node's running sessions that are not collected here yet (a node
        this replica just took, or sessions another replica started on it); ``check``:
        supervise it now rather than at the next round."""
        names = {n for n in self.store.collectable(node) if not self.collecting(n)}
        if names:
            self._start_collectors([r for r in self.store.sessions_of(node) if r.name in names])
        if check:
            self._counts_stale = True  # its sessions' totals are counted here now
            self._wake.set()

    def drop_node(self, node: str) -> None:
        """Stop collecting the node's sessions (another replica owns it now)."""
        with self._lock:
            st = self._streamers.pop(node, None)
            p = self._pollers.pop(node, None)
            if p is not None:
                for name in p.names:
                    self._collectors.pop(name, None)
        for worker in (st, p):
            if worker is None:
                continue
            worker.stop.set()
            if isinstance(worker, _Streamer):
                worker.poke()
            if worker.thread is not threading.current_thread():
                worker.thread.join(10)

    def _stop_collector(self, name: str) -> None:
        """Stop collecting the session; once this returns, no batch of it is being
        stored (a poll round holding its lock has ended)."""
        with self._lock:
            p = self._collectors.pop(name, None)
            if p is not None:
                p.names.discard(name)
                p.retry.pop(name, None)
            for st in self._streamers.values():
                if name in st.names:
                    st.names.discard(name)
                    st.poke()
        if p is not None and p.thread is not threading.current_thread():
            with self._session_lock(name):
                pass

    def _backoff(
        self, what: str, exc: SouthboundError, delay: float, stop: threading.Event
    ) -> float:
        """Wait before retrying after an agent's refusal; the next delay."""
        if exc.code in _MISSING:
            # The sender lost the session (restart, Reset): the supervisor creates it
            # again; let it look now rather than at its next round.
            self._wake.set()
        log.info("%s: %s; retrying in %.1f s", what, exc.details, delay)
        stop.wait(delay + random.uniform(0, delay / 4))  # noqa: S311 - jitter
        return min(delay * 2, RETRY_MAX_S)

    def _poll_loop(self, p: _Poller) -> None:
        """Poll the node's poll-mode sessions in rounds, every ``poll_interval_s``."""
        delay = RETRY_MIN_S
        while not p.stop.is_set():
            now = time.monotonic()
            with self._lock:
                names = sorted(n for n in p.names if n not in p.retry or p.retry[n][0] <= now)
            try:
                behind = self._poll_pass(p, names)
                # Those the agent had more for, again at once (bounded: CATCH_UP_PASSES).
                for _ in range(CATCH_UP_PASSES):
                    if not behind:
                        break
                    behind = self._poll_pass(p, behind)
                if p.stop.is_set():
                    return
            except SouthboundError as exc:
                delay = self._backoff(f"poll of {p.node}", exc, delay, p.stop)
                continue
            except FencedError as exc:
                self._fenced(p.node, exc)
                return
            except Exception:
                # A bug or a store error must not end collection for good: nothing was
                # acknowledged, so retrying later loses nothing.
                log.exception("poll of %s: collection failed; retrying", p.node)
                p.stop.wait(RETRY_MAX_S)
                continue
            delay = RETRY_MIN_S
            p.stop.wait(self.poll_interval_s)

    def _poll_pass(self, p: _Poller, names: Sequence[str]) -> list[str]:
        """Poll ``names`` once each, ``POLL_ROUND`` at a time; those the agent has more
        records for (their reply's ``remaining``), in order."""
        behind: list[str] = []
        i = 0
        while i < len(names):
            if p.stop.is_set():
                return []
            # An agent that ignores ``max_bytes``: as many sessions as full budgets fit.
            step = POLL_ROUND if p.max_bytes else POLL_ROUND_BYTES // REPLY_BUDGET_BYTES
            behind += self._poll_round(p, names[i : i + step])
            i += step
        return behind

    def _poll_round(self, p: _Poller, names: Sequence[str]) -> list[str]:
        """One poll of some of the node's sessions: their results read with the calls in
        flight together, stored in one transaction, acknowledged in one call; the
        sessions stored whose reply said more records wait on the agent.

        The sessions' locks are held from reading their rows to the acknowledgement: a
        batch is read, stored and acknowledged within one epoch.
        """
        behind: list[str] = []
        with contextlib.ExitStack() as locks:
            for name in names:
                locks.enter_context(self._session_lock(name))
            with self._lock:  # stopped meanwhile (``_stop_collector``)
                names = [n for n in names if self._collectors.get(n) is p]
            rows = {r.name: r for r in self.store.sessions_named(names)}
            over = [n for n in names if n not in rows]
            live = [r for n in names if (r := rows.get(n)) is not None]
            over += [r.name for r in live if r.state not in ("running", "stopping")]
            live = [r for r in live if r.state in ("running", "stopping")]
            replies: list[Any] = []
            if live:
                max_bytes = round_max_bytes(len(live))
                requests = [
                    pb.GetStampSessionResultsRequest(
                        ssid=r.ssid, max_results=BATCH, after_id=r.cursor, max_bytes=max_bytes
                    )
                    for r in live
                ]
                replies = self.client(p.node).call_many("GetStampSessionResults", requests)
                self._held(p, replies, max_bytes)
            read_ns = time.time_ns()
            todo: list[tuple[SessionRow, pb.GetStampSessionResultsReply, ResultBatch]] = []
            now_m = time.monotonic()
            for row, reply in zip(live, replies, strict=True):
                if isinstance(reply, SouthboundError):
                    if reply.code in _UNREACHABLE:  # the whole node backs off
                        self._health(p.node, healthy=False, error=reply.details)
                        raise reply
                    if reply.code in _MISSING:
                        # The sender lost the session (restart, Reset): the supervisor
                        # creates it again; let it look now rather than at its next round.
                        self._wake.set()
                    _, before = p.retry.get(row.name, (0.0, RETRY_MIN_S / 2))
                    wait = min(before * 2, RETRY_MAX_S)
                    log.info("session %s: %s; retrying in %.1f s", row.name, reply.details, wait)
                    with self._lock:
                        p.retry[row.name] = (now_m + wait, wait)
                    continue
                with self._lock:
                    p.retry.pop(row.name, None)
                todo.append(
                    (row, reply, self._read_batch(p.node, row, reply.results, reply.counters))
                )
            if live and len(todo) == len(live):
                self._health(p.node, healthy=True, refresh=False)
            now = self.clock()
            news: list[int | None] = []
            if todo:
                begun = time.time_ns()
                news = self.store.store_many(
                    [b for _, _, b in todo], now, fence=self._fence(p.node)
                )
                arrivals = [(read_ns, [r.t4_ns for r in reply.results]) for _, reply, _ in todo]
                self.metrics.collection_stages(arrivals, begun, time.time_ns())
            acks: dict[int, int] = {}
            for (row, reply, stored), new in zip(todo, news, strict=True):
                got = stored.result_rows()
                if new is None:  # the session left that epoch (or was destroyed)
                    self.metrics.dropped(p.node, len(got))
                    continue
                self._stored(row, stored, new, now)
                if reply.results:
                    acks[row.ssid] = reply.results[-1].record_id
                    if reply.remaining:
                        behind.append(row.name)
                elif reply.state == pb.SESSION_STATE_FINISHED:
                    self._finish(row)
                    over.append(row.name)
            if acks:
                self._call(p.node, lambda c: c.acknowledge_many(acks, counts=False), refresh=False)
            if over:
                with self._lock:
                    for name in over:
                        if self._collectors.get(name) is p:
                            del self._collectors[name]
                        p.names.discard(name)
                        p.retry.pop(name, None)
                    self._finished.notify_all()
        return behind

    def _held(self, p: _Poller, replies: Sequence[Any], max_bytes: int) -> None:
        """Count the reply bytes a round holds (``poll_peak_bytes``); an agent whose
        reply was larger than asked ignores ``max_bytes``: its rounds are cut."""
        sizes = [r.ByteSize() for r in replies if not isinstance(r, SouthboundError)]
        with self._lock:
            self.poll_peak_bytes = max(self.poll_peak_bytes, sum(sizes))
            if p.max_bytes and any(size > max_bytes for size in sizes):
                p.max_bytes = False
                log.warning(
                    "poll of %s: its agent ignores max_bytes (a reply of %d bytes, %d asked);"
                    " polling %d sessions a round",
                    p.node, max(sizes), max_bytes, POLL_ROUND_BYTES // REPLY_BUDGET_BYTES,
                )  # fmt: skip

    def _read_batch(
        self,
        node: str,
        row: SessionRow,
        results: Sequence[pb.StampResult],
        counters: pb.SessionCounters | None,
    ) -> ResultBatch:
        """``_batch``, its refused records counted (``_refused``)."""
        batch, bad = _batch(row, results, counters)
        if bad:
            self._refused(node, row.name, bad)
        return batch

    def _refused(self, node: str, session: str, bad: Sequence[pb.StampResult]) -> None:
        """Count records of the node's agent refused as out of range (``_rows``), and
        log it, at most once per ``REFUSED_LOG_S`` a node."""
        self.metrics.refused(node, len(bad))
        now = time.monotonic()
        with self._lock:
            last, since = self._refused_log.get(node, (-REFUSED_LOG_S, 0))
            if now - last < REFUSED_LOG_S:
                self._refused_log[node] = (last, since + len(bad))
                return
            self._refused_log[node] = (now, 0)
        log.warning(
            "node %s: session %s: %d record(s) out of range not stored (record %d: %s);"
            " %d more refused since the last such line",
            node, session, len(bad), bad[0].record_id, _refusal(bad[0]), since,
        )  # fmt: skip

    def _stored(self, row: SessionRow, batch: ResultBatch, new: int, now: int) -> None:
        """What follows a stored batch (``new`` of its rows new): warnings and metrics."""
        self._count_stored(row, batch, new, now)
        if batch.counters is not None:
            self._warn_skips([(row, batch.counters.skipped)])
        self.metrics.observe_rows(row.name, batch.result_rows(), now)
        try:
            self._judge(row, batch, now)
        except Exception:  # events must never stop collection
            log.exception("session %s: judging its thresholds failed", row.name)

    def _stored_many(self, stored: Sequence[tuple[SessionRow, ResultBatch, int]], now: int) -> None:
        """``_stored`` of a transaction's batches (session, batch, how many rows new):
        each lock taken once for all of them, not once per session."""
        with self._counts_lock:
            if not self._counts_stale:
                for row, batch, new in stored:
                    counts = self._counts.get(row.id)
                    if counts is None or not counts.stored(batch, new, now):
                        self._counts_stale = True
                        break
        skips = [(r, b.counters.skipped) for r, b, _ in stored if b.counters is not None]
        if skips:
            self._warn_skips(skips)
        self.metrics.observe_many(
            [(row.name, batch.result_rows()) for row, batch, _ in stored], now
        )
        for row, batch, _ in stored:
            try:
                self._judge(row, batch, now)
            except Exception:  # events must never stop collection
                log.exception("session %s: judging its thresholds failed", row.name)

    def _warn_skips(self, skips: Sequence[tuple[SessionRow, int]]) -> None:
        """Say so when a sender's engine starts skipping slots: it sends less than asked
        (each session with the count of slots its sender skipped this epoch)."""
        more: list[tuple[SessionRow, int, int]] = []
        with self._lock:
            for row, skipped in skips:
                key = (row.id, row.epoch)
                before = self._skipped.get(key, 0)
                self._skipped[key] = skipped
                if skipped > before:
                    more.append((row, skipped - before, skipped))
        for row, new, skipped in more:
            log.warning(
                "session %s: the sender skipped %d slots of its schedule (%d in all this"
                " epoch): it sends less than asked (an overloaded agent?)",
                row.name,
                new,
                skipped,
            )

    def _finish(self, row: SessionRow) -> bool:
        """The session's sender finished and everything was stored (session lock held)."""
        reason = self.store.restart_reason(row.name) or "finished"
        self.store.end_epoch(row.name, self.clock(), reason)
        self.store.set_state(row.name, "finished")
        if reason != "finished":
            self._wake.set()  # the supervisor starts it afresh
        with self._finished:
            self._finished.notify_all()
        return True

    def _streamer(self, sender: str) -> _Streamer:
        """The results stream of ``sender``'s agent, started on first use (hold
        ``self._lock``)."""
        st = self._streamers.get(sender)
        if st is None:
            st = self._streamers[sender] = _Streamer(sender)
            st.thread = threading.Thread(
                target=self._stream_loop, args=(st,), name=f"stream-{sender}", daemon=True
            )
            st.thread.start()
        return st

    def _stream_loop(self, st: _Streamer) -> None:
        """Read the node's stream: open it on the sessions it carries, each from its
        stored cursor; reopen it when they change or it fails."""
        delay = RETRY_MIN_S
        opened = False
        while not st.stop.is_set():
            if opened:
                # Sessions started one after another each change the set: reopen once
                # for a burst of them, not once each.
                st.stop.wait(REOPEN_DEBOUNCE_S)
            opened = True
            st.changed.clear()
            with self._lock:
                names = sorted(st.names)
            try:
                rows = {r.name: r for r in self.store.sessions_of(st.node)}
            except Exception:
                # The thread must outlive it: a database down for longer than a retry
                # ended it, and the node's sessions were never collected again.
                log.exception("stream of %s: reading its sessions failed; retrying", st.node)
                st.changed.wait(RETRY_MAX_S)
                continue
            subs: dict[int, SessionRow] = {}
            for name in names:
                row = rows.get(name)
                if row is not None and row.state in ("running", "stopping"):
                    subs[row.ssid] = row
                else:
                    with self._lock:
                        st.names.discard(name)
            if not subs:
                st.changed.wait(1.0)
                continue
            after = {ssid: row.cursor for ssid, row in subs.items()}
            try:
                stream = self._call(
                    st.node,
                    functools.partial(
                        _open_stream, after=after, window_ns=round(self.stream_window_s * 1e9)
                    ),
                )
                st.call = stream
                if st.changed.is_set():  # changed while it was being opened
                    continue
                self._collect_stream(st, stream, subs)
            except SouthboundError as exc:
                delay = self._backoff(f"stream of {st.node}", exc, delay, st.changed)
                continue
            except FencedError as exc:
                self._fenced(st.node, exc)
                continue
            except grpc.RpcError as exc:  # from an acknowledgement of a cancelled stream
                delay = self._backoff(
                    f"stream of {st.node}", SouthboundError.from_rpc(exc), delay, st.changed
                )
                continue
            except Exception:
                log.exception("stream of %s: collection failed; retrying", st.node)
                st.changed.wait(RETRY_MAX_S)
                continue
            finally:
                call, st.call = st.call, None
                if call is not None:
                    call.cancel()
            delay = RETRY_MIN_S

    def _collect_stream(
        self, st: _Streamer, stream: ResultStream[pb.ResultBatches], subs: dict[int, SessionRow]
    ) -> None:
        """Store the stream's messages until it ends or its sessions change.

        A reader thread takes the messages off the stream as they come. The storer
        waits for the first, then for the commit slot (``_store_messages``), and stores
        every message there by then in one transaction (group commit). With
        ``commit_interval_s``, it gathers that long from the first message before.
        """
        inbox: queue.Queue[_Inbound] = queue.Queue(STREAM_INBOX)
        reader = threading.Thread(
            target=_read_stream, args=(stream, inbox), name=f"stream-read-{st.node}", daemon=True
        )
        reader.start()
        end: BaseException | None = None
        try:
            while end is None:
                got: list[tuple[int, pb.ResultBatches]] = []
                end = self._gather(st, inbox, got, self.commit_interval_s)
                if got:
                    end = self._store_messages(st, subs, inbox, got) or end
                if st.changed.is_set() or not subs:
                    return
            if not isinstance(end, StopIteration):
                raise end
        finally:
            stream.cancel()
            # Let the reader put its last items and end: take them off until its thread
            # has. Not until an end is seen: the storer may have taken that already
            # (``_store_messages`` looks for more messages inside the commit slot) and
            # then failed (an acknowledgement to an agent just gone); waiting for it
            # again waited forever, and the sender was never read again.
            while reader.is_alive():
                with contextlib.suppress(queue.Empty):
                    inbox.get(timeout=READER_END_POLL_S)
            reader.join()

    def _gather(
        self,
        st: _Streamer,
        inbox: queue.Queue[_Inbound],
        got: list[tuple[int, pb.ResultBatches]],
        wait_s: float,
    ) -> BaseException | None:
        """Add the messages in ``inbox`` to ``got``: waiting for one if ``got`` is empty,
        then for more for up to ``wait_s``. How the stream ended, if it did meanwhile
        (``_read_stream``)."""
        deadline = time.monotonic() + wait_s
        while True:
            if got and (st.changed.is_set() or any(b.final or b.gone for b in got[-1][1].batches)):
                return None  # stored at once: the stream is about to change
            try:
                if not got:
                    item = inbox.get()
                else:
                    wait = deadline - time.monotonic()
                    item = inbox.get(timeout=wait) if wait > 0 else inbox.get_nowait()
            except queue.Empty:
                return None
            if not isinstance(item, tuple):
                return item
            got.append(item)

    def _store_messages(
        self,
        st: _Streamer,
        subs: dict[int, SessionRow],
        inbox: queue.Queue[_Inbound],
        got: list[tuple[int, pb.ResultBatches]],
    ) -> BaseException | None:
        """Store gathered stream messages in one transaction (a batch per session), with
        those that came while waiting for the commit slot; observe how long their records
        took to get there, by stage. How the stream ended, if it did meanwhile.

        The slot lets one sender's transaction run at a time, from gathering to commit
        (not the acknowledgement): while it is taken, the other senders' messages pile
        up and go in their next transaction together, so an idle store stores a message
        as soon as it comes and a busy one commits fewer, larger transactions rather
        than falling behind (SQLite's cost is per page written per commit; PostgreSQL's
        per statement and commit).

        The sessions' locks are taken before the slot, never while holding it: a lock
        may be held for long (a destroy's final collection, a repair: both call agents),
        and a sender waiting for one must not hold up the other senders' transactions.
        Messages gathered once the slot is taken go in too if the locks of their
        sessions are free at once; if not, the slot is let go and every lock taken
        again, waiting, before the slot.
        """
        end: BaseException | None = None
        # The rows are built before the slot is taken: the slot is held only for what
        # must be serial, and another sender's Python runs while SQLite or PostgreSQL
        # works for the holder.
        pending: dict[int, _Gathered] = {}
        arrivals = [(at, _gather_rows(pending, subs, m)) for at, m in got]
        names = {subs[ssid].name for ssid in pending}
        slot = self._commit_slot
        while True:
            taken = self._take_session_locks(names)
            try:
                held = True
                slot.acquire()

                def release() -> None:
                    nonlocal held
                    if held:
                        held = False
                        slot.release()

                try:
                    end = self._gather(st, inbox, got, 0.0) or end
                    for at, m in got[len(arrivals) :]:
                        arrivals.append((at, _gather_rows(pending, subs, m)))
                    more = {subs[ssid].name for ssid in pending} - names
                    if more:
                        extra = self._try_session_locks(more)
                        if extra is None:
                            names |= more
                            continue
                        taken += extra
                    begun = time.time_ns()
                    committed = self._store_batches(st, subs, list(pending.values()), release)
                finally:
                    release()
            finally:
                for lock in taken:
                    lock.release()
            break
        self.metrics.collection_stages(arrivals, begun, committed)
        return end

    def _take_session_locks(self, names: Iterable[str]) -> list[threading.Lock]:
        """Take the sessions' locks, waiting, in name order (one order for every
        thread: no deadlock); the locks taken, for the caller to release."""
        with self._lock:
            locks = [self._session_lock_held(name) for name in sorted(names)]
        taken: list[threading.Lock] = []
        try:
            for lock in locks:
                lock.acquire()
                taken.append(lock)
        except BaseException:
            for lock in taken:
                lock.release()
            raise
        return taken

    def _try_session_locks(self, names: Iterable[str]) -> list[threading.Lock] | None:
        """Take the sessions' locks if they are all free (the locks taken), else none."""
        with self._lock:
            locks = [self._session_lock_held(name) for name in sorted(names)]
        taken: list[threading.Lock] = []
        for lock in locks:
            if not lock.acquire(blocking=False):
                for held in taken:
                    held.release()
                return None
            taken.append(lock)
        return taken

    def _store_batches(
        self,
        st: _Streamer,
        subs: dict[int, SessionRow],
        gathered: Iterable[_Gathered],
        committed: Callable[[], None] = lambda: None,
    ) -> int:
        """Store the records gathered for each session in one transaction and
        acknowledge them at once; when the transaction committed (Unix ns).
        ``committed`` is called once it has.

        The batches' loss reports are acknowledged with their records, once committed,
        and not stored: loss is counted from the sender's counters (docs/architecture.md,
        "Loss reports"); left unacknowledged, they would fill the sender's FIFO.

        The caller holds the sessions' locks, from before the epoch checks to after the
        acknowledgement.
        """
        acks: dict[int, int] = {}
        lost_acks: dict[int, int] = {}
        todo: list[tuple[SessionRow, _Gathered, ResultBatch]] = []
        for g in gathered:
            if g.ssid not in subs:
                continue
            if g.refused:
                self._refused(st.node, subs[g.ssid].name, g.refused)
            if g.gone:
                # Gone from the agent, or created again there: the supervisor
                # repairs it; a new epoch's start reopens the stream with it.
                self.metrics.dropped(st.node, len(g.rows))
                del subs[g.ssid]
                self._wake.set()
                continue
            sub = subs[g.ssid]
            counters = None if g.counters is None else _counters(g.counters)
            batch = ResultBatch(sub.id, sub.epoch, (), counters, g.rows, _top(g.refused))
            todo.append((sub, g, batch))
        # One transaction for all the messages; the store checks each epoch.
        now = self.clock()
        news = self.store.store_many([b for _, _, b in todo], now, fence=self._fence(st.node))
        done = time.time_ns()
        committed()
        stored: list[tuple[SessionRow, ResultBatch, int]] = []
        for (sub, g, batch), new in zip(todo, news, strict=True):
            rows = g.rows
            if new is None:  # the session left that epoch, was destroyed or pruned
                self.metrics.dropped(st.node, len(rows))
                del subs[g.ssid]
                continue
            stored.append((sub, batch, new))
            if g.last_id:
                acks[g.ssid] = g.last_id
            if g.lost_top:
                lost_acks[g.ssid] = g.lost_top
        self._stored_many(stored, now)
        for sub, g, _ in todo:
            if g.final and g.ssid in subs:
                del subs[g.ssid]
                with self._lock:
                    st.names.discard(sub.name)
                self._finish(sub)
        if acks or lost_acks:
            self._call(
                st.node,
                lambda c: c.acknowledge_many(acks, lost_acks, counts=False),
                refresh=False,
            )
        return done
