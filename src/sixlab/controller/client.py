"""A typed client for the controller's northbound gRPC API (``controller.proto``).

Every method is one RPC with a deadline and returns plain values (frozen dataclasses,
``StampResult`` records, ``DelaySummary``). A refused call raises ``NorthboundError``
carrying the gRPC status code and the controller's message (which names the field)::

    with ControllerClient(default_address()) as ctl:
        ctl.register_node("s", "[::1]:50051", "sender")
        ctl.register_node("r", "[::1]:50052", "reflector")
        ctl.init_node("s", source="::1", port=0)
        port = ctl.init_node("r", source="::1", port=0)
        ctl.create_session(SessionSpec("p", "s", "r", "::1", reflector_port=port, count=50))
        ctl.start_session("p")
        ctl.wait_state("p", ("finished",), timeout=30)
        print(ctl.stats("p").rtt)

Where the controller listens by default (``default_address``): the environment variable
``SIXLAB_CONTROLLER`` if set; else ``unix:/run/sixlab/controller.sock`` where /run is
writable (root, or a service user given /run/sixlab), and otherwise
``unix:$TMPDIR/sixlab-$UID/controller.sock``. A client takes whichever of the two
sockets exists, /run first, so an unprivileged user reaches a root controller.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from sixlab.controller._generated import controller_pb2 as pb
from sixlab.controller._generated import controller_pb2_grpc as pb_grpc
from sixlab.controller.core import SessionSpec
from sixlab.controller.errors import ControllerError
from sixlab.southbound.client import ClientTls
from sixlab.southbound.rpcclient import GrpcClient, RpcError
from sixlab.stamp import DataLoss, StampResult
from sixlab.stamp.stats import DelaySummary
from sixlab.wire import WireError
from sixlab.wire.timestamp import ErrorEstimate

__all__ = [
    "RUN_SOCKET",
    "ControllerClient",
    "DataLossInfo",
    "EpochInfo",
    "EventInfo",
    "FlowInfo",
    "NodeInfo",
    "NorthboundError",
    "ResultPage",
    "SessionInfo",
    "SessionStats",
    "default_address",
    "default_socket",
    "messages",
    "node_from_proto",
    "record_from_proto",
    "session_from_proto",
    "spec_to_proto",
    "stats_from_proto",
]

#: The northbound API's messages: ``apply`` takes and ``export`` returns an
#: ``ApplyRequest`` (``NodeConfig``, ``SessionConfig``, ``CreateSessionRequest``).
messages = pb

#: Deadline of one call (s). Calls that reach agents (Init, Create, Start) take a few of
#: their round trips; an agent's own deadline is 10 s, so this leaves room for two.
DEFAULT_TIMEOUT_S = 30.0
#: Largest reply accepted: a full page of results (northbound.MAX_RESULTS records).
MAX_MESSAGE_BYTES = 16 << 20
#: The controller's socket when it may write /run (FHS: runtime data of system daemons).
RUN_SOCKET = Path("/run/sixlab/controller.sock")
ENV_ADDRESS = "SIXLAB_CONTROLLER"

_ROLES = {"sender": pb.NODE_ROLE_SENDER, "reflector": pb.NODE_ROLE_REFLECTOR}
_ROLE_NAMES = {v: k for k, v in _ROLES.items()}
_COLLECT = {"poll": pb.COLLECT_MODE_POLL, "stream": pb.COLLECT_MODE_STREAM}
_COLLECT_NAMES = {v: k for k, v in _COLLECT.items()}
_STATE_NAMES = {
    pb.SESSION_STATE_CREATED: "created",
    pb.SESSION_STATE_RUNNING: "running",
    pb.SESSION_STATE_STOPPING: "stopping",
    pb.SESSION_STATE_STOPPED: "stopped",
    pb.SESSION_STATE_FINISHED: "finished",
    pb.SESSION_STATE_DESTROYED: "destroyed",
    pb.SESSION_STATE_DESTROYING: "destroying",
    pb.SESSION_STATE_STARTING: "starting",
}


def _reason(details: str) -> str:
    """The last, most specific part of gRPC's connection error ("Connection refused")."""
    reason = details.rsplit(": ", 1)[-1].strip()
    return reason or "not answering"


def _tmp_socket() -> Path:
    return Path(tempfile.gettempdir()) / f"sixlab-{os.getuid()}" / "controller.sock"


def default_socket(*, server: bool = False) -> Path:
    """The controller's default unix socket: the server's choice, or the client's guess.

    A server takes /run/sixlab when it can write there. A client takes the socket that
    exists (/run first), else the path a server run by this user would choose.
    """
    run_dir = RUN_SOCKET.parent
    writable = os.access(run_dir, os.W_OK) if run_dir.exists() else os.access("/run", os.W_OK)
    if not server:
        for candidate in (RUN_SOCKET, _tmp_socket()):
            if candidate.exists():
                return candidate
    return RUN_SOCKET if writable else _tmp_socket()


def default_address(*, server: bool = False) -> str:
    """``$SIXLAB_CONTROLLER`` if set, else ``unix:`` + ``default_socket``."""
    return os.environ.get(ENV_ADDRESS) or f"unix:{default_socket(server=server)}"


class NorthboundError(RpcError, ControllerError):
    """The controller refused a call (or could not be reached); ``code`` is the status."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    address: str
    role: str
    healthy: bool
    last_seen_ns: int | None
    last_error: str
    initialized: bool
    #: Its agent's run last seen (16 hex digits; empty: never), when that run started,
    #: and how many restarts (new runs) were seen.
    agent_epoch: str = ""
    agent_started_ns: int | None = None
    restarts: int = 0


@dataclass(frozen=True, slots=True)
class SessionInfo:
    name: str
    ssid: int
    state: str
    sender: str
    reflector: str
    reflector_address: str
    segments: tuple[str, ...]
    return_segments: tuple[str, ...]
    return_path_tlv: bool
    reflector_port: int
    source_address: str
    interval_ns: int
    count: int
    duration_ns: int
    ptp: bool
    authenticated: bool
    stateful: bool
    loss_timeout_ns: int
    collect: str
    created_ns: int
    epoch: int
    sent: int
    lost: int
    forward_lost: int | None
    overflow: int
    stored: int


@dataclass(frozen=True, slots=True)
class ResultPage:
    """Stored results, oldest first; ``more`` if the limit cut the answer short.

    ``epochs[i]`` is the epoch of ``records[i]`` (Seq numbers start over in each)."""

    records: tuple[StampResult, ...]
    more: bool
    epochs: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class EpochInfo:
    """One epoch of a session and what became of its probes (``EpochStats`` in the API)."""

    epoch: int
    started_ns: int
    ended_ns: int | None
    end_reason: str
    sender_agent: str
    sent: int
    received: int
    lost: int
    unknown: int
    schedule_skipped: int = 0


@dataclass(frozen=True, slots=True)
class FlowInfo:
    """One flow label's share of a session (ECMP coverage, docs/srpm.md)."""

    flow_label: int
    direct: DelaySummary | None
    rtt: DelaySummary | None
    received: int
    jitter_ns: int | None


@dataclass(frozen=True, slots=True)
class DataLossInfo:
    """Direct-mode data loss (RFC 8972 §4.5): totals and the last intervals."""

    forward_sent: int
    forward_lost: int
    backward_sent: int
    backward_lost: int | None
    intervals: tuple[DataLoss, ...] = ()


@dataclass(frozen=True, slots=True)
class EventInfo:
    """A threshold event (``sixlab controller events``)."""

    session: str
    kind: str
    state: str
    value: float
    threshold: float
    at_ns: int


@dataclass(frozen=True, slots=True)
class SessionStats:
    """A path's delays (``None`` until a result is stored), jitter and loss."""

    direct: DelaySummary | None
    backward: DelaySummary | None
    rtt: DelaySummary | None
    direct_jitter_ns: int | None
    return_jitter_ns: int | None
    received: int
    lost: int
    loss_ratio: float
    forward_lost: int | None
    backward_lost: int | None
    max_error_bound_ns: int | None
    sent: int
    unclassified_lost: int | None = None
    ssid_zero: int = 0
    #: Probes of unknown outcome (agent outages), summed over the epochs.
    unknown: int = 0
    epochs: tuple[EpochInfo, ...] = ()
    #: How the sender kept its schedule: slots skipped, lateness mean (None: nothing
    #: sent) and most.
    schedule_skipped: int = 0
    schedule_late_mean_ns: int | None = None
    schedule_late_max_ns: int = 0
    #: Per flow label (sessions with flow labels) and direct-mode data loss.
    flows: tuple[FlowInfo, ...] = ()
    data_loss: DataLossInfo | None = None


def node_from_proto(n: pb.Node) -> NodeInfo:
    return NodeInfo(
        name=n.name,
        address=n.address,
        role=_ROLE_NAMES.get(n.role, "unspecified"),
        healthy=n.healthy,
        last_seen_ns=n.last_seen_ns if n.HasField("last_seen_ns") else None,
        last_error=n.last_error,
        initialized=n.initialized,
        agent_epoch=n.agent_epoch,
        agent_started_ns=n.agent_started_ns if n.HasField("agent_started_ns") else None,
        restarts=n.restarts,
    )


def session_from_proto(s: pb.Session) -> SessionInfo:
    return SessionInfo(
        name=s.name,
        ssid=s.ssid,
        state=_STATE_NAMES.get(s.state, "unspecified"),
        sender=s.sender,
        reflector=s.reflector,
        reflector_address=s.reflector_address,
        segments=tuple(s.segments),
        return_segments=tuple(s.return_segments),
        return_path_tlv=s.return_path_tlv,
        reflector_port=s.reflector_port,
        source_address=s.source_address,
        interval_ns=s.interval_ns,
        count=s.count,
        duration_ns=s.duration_ns,
        ptp=s.ptp,
        authenticated=s.authenticated,
        stateful=s.stateful,
        loss_timeout_ns=s.loss_timeout_ns,
        collect=_COLLECT_NAMES.get(s.collect, "poll"),
        created_ns=s.created_ns,
        epoch=s.epoch,
        sent=s.sent,
        lost=s.lost,
        forward_lost=s.forward_lost if s.HasField("forward_lost") else None,
        overflow=s.overflow,
        stored=s.stored,
    )


def record_from_proto(r: pb.Record, ssid: int = 0) -> StampResult:
    return StampResult(
        ssid=ssid,
        seq=r.seq,
        t1_ns=r.t1_ns,
        t2_ns=r.t2_ns,
        t3_ns=r.t3_ns,
        t4_ns=r.t4_ns,
        sender_error=ErrorEstimate.from_int(r.sender_error_estimate),
        reflector_error=ErrorEstimate.from_int(r.reflector_error_estimate),
        ses_sender_ttl=r.ttl,
        reflector_seq=r.reflector_seq,
        loopback=r.loopback,
        flow_label=r.flow_label if r.HasField("flow_label") else None,
    )


def _summary(reply: pb.GetPathStatsReply | pb.FlowStats, field: str) -> DelaySummary | None:
    if not reply.HasField(field):  # type: ignore[arg-type]
        return None
    s: pb.DelaySummary = getattr(reply, field)
    return DelaySummary(s.count, s.min_ns, s.mean_ns, s.p50_ns, s.p90_ns, s.p99_ns, s.max_ns)


def _data_loss(reply: pb.GetPathStatsReply) -> DataLossInfo | None:
    if not reply.HasField("data_loss"):
        return None
    d = reply.data_loss
    return DataLossInfo(
        d.forward_sent,
        d.forward_lost,
        d.backward_sent,
        d.backward_lost if d.HasField("backward_lost") else None,
        tuple(
            DataLoss(
                i.start_ns,
                i.end_ns,
                i.forward_sent,
                i.forward_lost,
                i.backward_sent,
                i.backward_lost if i.HasField("backward_lost") else None,
            )
            for i in d.intervals
        ),
    )


def stats_from_proto(reply: pb.GetPathStatsReply) -> SessionStats:
    def opt(field: str) -> int | None:
        return int(getattr(reply, field)) if reply.HasField(field) else None  # type: ignore[arg-type]

    return SessionStats(
        direct=_summary(reply, "direct_delay"),
        backward=_summary(reply, "return_delay"),
        rtt=_summary(reply, "round_trip_delay"),
        direct_jitter_ns=opt("direct_jitter_ns"),
        return_jitter_ns=opt("return_jitter_ns"),
        received=reply.received,
        lost=reply.lost,
        loss_ratio=reply.loss_ratio,
        forward_lost=opt("forward_lost"),
        backward_lost=opt("backward_lost"),
        max_error_bound_ns=opt("max_error_bound_ns"),
        sent=reply.sent,
        unclassified_lost=opt("unclassified_lost"),
        ssid_zero=reply.ssid_zero,
        unknown=reply.unknown,
        epochs=tuple(
            EpochInfo(
                epoch=e.epoch,
                started_ns=e.started_ns,
                ended_ns=e.ended_ns if e.HasField("ended_ns") else None,
                end_reason=e.end_reason,
                sender_agent=e.sender_agent,
                sent=e.sent,
                received=e.received,
                lost=e.lost,
                unknown=e.unknown,
                schedule_skipped=e.schedule_skipped,
            )
            for e in reply.epochs
        ),
        schedule_skipped=reply.schedule_skipped,
        schedule_late_mean_ns=opt("schedule_late_mean_ns"),
        schedule_late_max_ns=reply.schedule_late_max_ns,
        flows=tuple(
            FlowInfo(
                f.flow_label,
                _summary(f, "direct_delay"),
                _summary(f, "round_trip_delay"),
                f.received,
                f.jitter_ns if f.HasField("jitter_ns") else None,
            )
            for f in reply.flows
        ),
        data_loss=_data_loss(reply),
    )


def spec_to_proto(spec: SessionSpec) -> pb.CreateSessionRequest:
    try:
        key = bytes.fromhex(spec.key_hex)
    except ValueError:
        raise NorthboundError(
            grpc.StatusCode.INVALID_ARGUMENT, "key_hex: not hexadecimal"
        ) from None
    collect = _COLLECT.get(spec.collect)
    if collect is None:
        raise NorthboundError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"collect: {spec.collect!r} is neither poll nor stream",
        )
    return pb.CreateSessionRequest(
        name=spec.name,
        sender=spec.sender,
        reflector=spec.reflector,
        reflector_address=spec.reflector_address,
        segments=spec.segments,
        return_segments=spec.return_segments,
        return_path_tlv=spec.return_path_tlv,
        reflector_port=spec.reflector_port,
        source_address=spec.source_address,
        interval_ns=spec.interval_ns,
        count=spec.count,
        duration_ns=spec.duration_ns,
        ptp=spec.ptp,
        key=key,
        stateful=spec.stateful,
        loss_timeout_ns=spec.loss_timeout_ns,
        collect=collect,
        strict_ssid=spec.strict_ssid,
        loopback=spec.loopback,
        flow_labels=spec.flow_labels,
        dm_sender_sent=spec.dm_sender_sent,
        dm_sender_received=spec.dm_sender_received,
        dm_reflector_sent=spec.dm_reflector_sent,
        dm_reflector_received=spec.dm_reflector_received,
        max_delay_ms=spec.max_delay_ms,
        max_jitter_ms=spec.max_jitter_ms,
        max_loss_ratio=spec.max_loss_ratio,
        event_window_s=spec.event_window_s,
    )


class ControllerClient(GrpcClient):
    """One controller, over one gRPC channel."""

    error = NorthboundError
    peer = "controller"

    def __init__(
        self,
        target: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        tls: ClientTls | None = None,
    ) -> None:
        target = target or default_address()
        options: list[tuple[str, Any]] = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        if tls is None:
            channel = grpc.insecure_channel(target, options=options)
        else:
            if tls.server_name:
                options.append(("grpc.ssl_target_name_override", tls.server_name))
            channel = grpc.secure_channel(target, tls.credentials(), options=options)
        super().__init__(target, channel, timeout)
        self._stub = pb_grpc.ControllerStub(self._channel)  # type: ignore[no-untyped-call]

    def _call(self, method: str, request: Any) -> Any:
        """One RPC; a controller that cannot be reached is one short message."""
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
            # The controller's own UNAVAILABLE names what it could not reach.
            if code is grpc.StatusCode.UNAVAILABLE and not details.startswith(
                ("agent:", "database:")
            ):
                details = f"cannot reach the controller at {self.target}: {_reason(details)}"
            raise NorthboundError(code, details) from None

    # -- nodes ------------------------------------------------------------------------

    def register_node(self, name: str, address: str, role: str) -> NodeInfo:
        """Register an agent; ``role`` is "sender" or "reflector"."""
        if role not in _ROLES:
            raise NorthboundError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"role: {role!r} is neither 'sender' nor 'reflector'",
            )
        request = pb.RegisterNodeRequest(name=name, address=address, role=_ROLES[role])
        reply: pb.RegisterNodeReply = self._call("RegisterNode", request)
        return node_from_proto(reply.node)

    def init_node(
        self,
        name: str,
        *,
        dataplane: str = "",
        port: int | None = None,
        interface: str = "",
        source: str = "",
    ) -> int:
        """Init the node's agent; returns the UDP port its data plane bound."""
        request = pb.InitNodeRequest(
            name=name, dataplane=dataplane, interface=interface, source=source
        )
        if port is not None:
            request.port = port
        reply: pb.InitNodeReply = self._call("InitNode", request)
        return reply.port

    def nodes(self, *, check: bool = False) -> list[NodeInfo]:
        """Registered nodes; with ``check`` the controller asks every agent first."""
        reply: pb.ListNodesReply = self._call("ListNodes", pb.ListNodesRequest(check=check))
        return [node_from_proto(n) for n in reply.nodes]

    # -- sessions ---------------------------------------------------------------------

    def create_session(self, spec: SessionSpec) -> SessionInfo:
        reply: pb.CreateSessionReply = self._call("CreateSession", spec_to_proto(spec))
        return session_from_proto(reply.session)

    def start_session(self, name: str) -> None:
        self._call("StartSession", pb.StartSessionRequest(name=name))

    def stop_session(self, name: str) -> str:
        """Stop the session; "" once its sender was told, else why not yet (the stop is
        accepted, and the controller that owns the sender tells it once it can)."""
        reply: pb.StopSessionReply = self._call("StopSession", pb.StopSessionRequest(name=name))
        return reply.pending

    def destroy_session(self, name: str) -> None:
        self._call("DestroySession", pb.DestroySessionRequest(name=name))

    def sessions(self, *, include_destroyed: bool = False) -> list[SessionInfo]:
        request = pb.ListSessionsRequest(include_destroyed=include_destroyed)
        reply: pb.ListSessionsReply = self._call("ListSessions", request)
        return [session_from_proto(s) for s in reply.sessions]

    def session(self, name: str) -> SessionInfo:
        """The session of that name: the live one, else the last one destroyed (a name
        is free again once its session is destroyed)."""
        named = [s for s in self.sessions(include_destroyed=True) if s.name == name]
        if not named:
            raise NorthboundError(grpc.StatusCode.NOT_FOUND, f"session: no session named {name!r}")
        live = [s for s in named if s.state != "destroyed"]
        return (live or named)[-1]

    def wait_state(self, name: str, states: Iterable[str], timeout: float) -> SessionInfo:
        """Poll until the session is in one of ``states``; NorthboundError on timeout."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        while True:
            info = self.session(name)
            if info.state in wanted:
                return info
            if time.monotonic() >= deadline:
                raise NorthboundError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"session {name!r} is {info.state}, not {'/'.join(sorted(wanted))}, "
                    f"after {timeout} s",
                )
            time.sleep(0.05)

    # -- results ----------------------------------------------------------------------

    def results(self, name: str, *, since_ns: int | None = None, limit: int = 0) -> ResultPage:
        """Stored results (T1 >= ``since_ns``), at most ``limit`` (0: the server's default)."""
        request = pb.GetResultsRequest(name=name, limit=limit)
        if since_ns is not None:
            request.since_ns = since_ns
        reply: pb.GetResultsReply = self._call("GetResults", request)
        records = []
        for r in reply.records:
            try:
                records.append(record_from_proto(r))
            except WireError as exc:  # a 32-bit field where the packet's is 16 bits
                raise NorthboundError(
                    grpc.StatusCode.INTERNAL, f"the controller's record seq {r.seq}: {exc}"
                ) from None
        return ResultPage(tuple(records), reply.more, tuple(r.epoch for r in reply.records))

    # -- declarative ------------------------------------------------------------------

    def apply(
        self, config: pb.ApplyRequest, *, dry_run: bool = False, prune: bool = False
    ) -> pb.ApplyReply:
        """Make the controller's nodes and sessions those of ``config`` (one call);
        ``prune``: remove nodes not listed with their sessions' history (ApplyRequest)."""
        request = pb.ApplyRequest()
        request.CopyFrom(config)
        request.dry_run = dry_run
        request.prune = prune
        reply: pb.ApplyReply = self._call("Apply", request)
        return reply

    def export(self) -> pb.ApplyRequest:
        """The nodes and sessions as a configuration that ``apply`` takes as a no-op."""
        reply: pb.ApplyRequest = self._call("Export", pb.ExportRequest())
        return reply

    def stats(self, name: str, *, since_ns: int | None = None) -> SessionStats:
        request = pb.GetPathStatsRequest(name=name)
        if since_ns is not None:
            request.since_ns = since_ns
        reply: pb.GetPathStatsReply = self._call("GetPathStats", request)
        return stats_from_proto(reply)

    def events(
        self, name: str = "", *, since_ns: int | None = None, limit: int = 0
    ) -> list[EventInfo]:
        """Threshold events, oldest first (of session ``name``; empty: of all)."""
        request = pb.ListEventsRequest(name=name, limit=limit)
        if since_ns is not None:
            request.since_ns = since_ns
        reply: pb.ListEventsReply = self._call("ListEvents", request)
        return [
            EventInfo(e.session, e.kind, e.state, e.value, e.threshold, e.at_ns)
            for e in reply.events
        ]
