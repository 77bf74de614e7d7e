"""The controller's northbound API: a gRPC server (``controller.proto``) over ``Controller``.

Theory of operation
-------------------
The servicer is thin, like the agent's: it turns a request into the controller's
terms (a ``SessionSpec``, a role, Init parameters), checking the fields that the proto
cannot (enums, optional fields, required names) before anything changes, then calls
``Controller`` and reads ``Store``. Calls that change something run one at a time
under a lock, so a check and the change it guards (a state test, then a start) are
never split by another call; reads run beside them (the store serialises itself).

Failures become gRPC statuses in one place (``_status_of``):

=======================================  ==============================================
``RequestRefusedError`` (own checks)     its code
``ControllerError``, ``StoreError``      by subclass (``_CODES``): not found →
                                         NOT_FOUND, already exists → ALREADY_EXISTS,
                                         a session in the wrong state or a node in
                                         use → FAILED_PRECONDITION, no SSID left →
                                         RESOURCE_EXHAUSTED, a destroy recorded but
                                         not carried out in time by the replica that
                                         owns the sender → DEADLINE_EXCEEDED; the
                                         bases (a bad field) → INVALID_ARGUMENT
``StoreUnavailableError``                UNAVAILABLE, the message prefixed
                                         ``database:``: the store's database out of
                                         reach for now (PostgreSQL down, the SQLite
                                         file's writer lock held too long); the call
                                         may be tried again
``SouthboundError`` (an agent refused)   INVALID_ARGUMENT if the agent refused a value
                                         the caller chose; UNAVAILABLE if it could not
                                         be reached; else FAILED_PRECONDITION. The
                                         message is the agent's, prefixed ``agent:``.
=======================================  ==============================================

A refused call changes no node or session. It may refresh health observations (an
agent that answered a refused Init was seen alive; one that did not is unhealthy).
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import grpc

from sixlab.controller import apply
from sixlab.controller._generated import controller_pb2 as pb
from sixlab.controller._generated import controller_pb2_grpc as pb_grpc
from sixlab.controller.apply import key_sha256
from sixlab.controller.core import (
    CollectMode,
    Controller,
    ControllerError,
    DestroyPendingError,
    EpochStats,
    NoFreeSsidError,
    SessionExistsError,
    SessionSpec,
    WrongStateError,
)
from sixlab.controller.store import (
    AlreadyExistsError,
    InUseError,
    NodeRow,
    NotFoundError,
    SessionRow,
    StoreError,
    StoreUnavailableError,
)
from sixlab.southbound.client import SouthboundError
from sixlab.southbound.rpcserver import claim_unix_address, server_credentials, unary
from sixlab.stamp import StampResult
from sixlab.stamp.stats import DelaySummary

__all__ = [
    "DEFAULT_MAX_WORKERS",
    "DEFAULT_RESULTS_LIMIT",
    "MAX_MESSAGE_BYTES",
    "MAX_RESULTS",
    "ControllerServer",
    "ControllerServicer",
    "RequestRefusedError",
    "epoch_to_proto",
    "node_to_proto",
    "record_to_proto",
    "serve_controller",
    "session_to_proto",
    "summary_to_proto",
]

log = logging.getLogger(__name__)
Code = grpc.StatusCode

#: gRPC worker threads: a handful of CLI users and a dashboard at once.
DEFAULT_MAX_WORKERS = 8
#: Agents asked at once by ListNodes with ``check``.
MAX_HEALTH_CHECKS = 16
#: Results per GetResults when the request sets no limit, and the most it may ask for.
#: A Record is about 80 bytes encoded: 100 000 of them stay under 10 MiB.
DEFAULT_RESULTS_LIMIT = 10_000
MAX_RESULTS = 100_000
#: ListEvents: how many by default and at most; GetPathStats: data-loss intervals sent.
DEFAULT_EVENTS_LIMIT = 1000
MAX_EVENTS = 100_000
MAX_DATA_INTERVALS = 100
#: Longest node or session name: they label metrics and table rows, and are typed.
MAX_NAME = 64
#: gRPC target schemes passed through as they are (gRPC's naming doc); anything else
#: must be host:port.
_SCHEMES = ("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:")
#: Largest request accepted and reply sent (bytes): the largest reply is a full page of
#: results (see MAX_RESULTS); requests are tiny.
MAX_MESSAGE_BYTES = 16 << 20
_U64_MAX = 2**64 - 1
#: Most packets a session may be asked to send: the STAMP sequence space.
MAX_COUNT = 0xFFFF_FFFF
_I64_MAX = 2**63 - 1
#: Default STAMP timing when a CreateSession leaves the optional fields out.
_SPEC_DEFAULTS = SessionSpec(name="", sender="", reflector="", reflector_address="")

_ROLES = {pb.NODE_ROLE_SENDER: "sender", pb.NODE_ROLE_REFLECTOR: "reflector"}
_ROLES_PB = {v: k for k, v in _ROLES.items()}
_COLLECT = {pb.COLLECT_MODE_POLL: CollectMode.POLL, pb.COLLECT_MODE_STREAM: CollectMode.STREAM}
_COLLECT_PB = {v: k for k, v in _COLLECT.items()}
_STATES_PB = {
    "created": pb.SESSION_STATE_CREATED,
    "running": pb.SESSION_STATE_RUNNING,
    "stopping": pb.SESSION_STATE_STOPPING,
    "stopped": pb.SESSION_STATE_STOPPED,
    "finished": pb.SESSION_STATE_FINISHED,
    "destroyed": pb.SESSION_STATE_DESTROYED,
    "destroying": pb.SESSION_STATE_DESTROYING,
    "starting": pb.SESSION_STATE_STARTING,
}

#: The core's and the store's refusals, and the status each means; any other
#: ControllerError or StoreError is a bad field (INVALID_ARGUMENT).
_CODES: tuple[tuple[type[Exception] | tuple[type[Exception], ...], grpc.StatusCode], ...] = (
    ((AlreadyExistsError, SessionExistsError), Code.ALREADY_EXISTS),
    (NotFoundError, Code.NOT_FOUND),
    ((WrongStateError, InUseError), Code.FAILED_PRECONDITION),
    (NoFreeSsidError, Code.RESOURCE_EXHAUSTED),
    (DestroyPendingError, Code.DEADLINE_EXCEEDED),
)


class RequestRefusedError(ControllerError):
    """A request this servicer refuses itself, with its status code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _invalid(message: str) -> RequestRefusedError:
    return RequestRefusedError(Code.INVALID_ARGUMENT, message)


def _status_of(exc: Exception) -> tuple[grpc.StatusCode, str] | None:
    """The one mapping from the controller's and the agents' errors to gRPC statuses."""
    if isinstance(exc, RequestRefusedError):
        return exc.code, str(exc)
    if isinstance(exc, SouthboundError):
        if exc.code in (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED):
            code = Code.UNAVAILABLE
        elif exc.code is Code.INVALID_ARGUMENT:
            code = Code.INVALID_ARGUMENT
        else:
            code = Code.FAILED_PRECONDITION
        return code, f"agent: {exc.code.name}: {exc.details}"
    if isinstance(exc, StoreUnavailableError):
        # Said apart from a controller that cannot be reached (ControllerClient).
        return Code.UNAVAILABLE, f"database: {exc}"
    if isinstance(exc, ControllerError | StoreError):
        code = next((c for kind, c in _CODES if isinstance(exc, kind)), Code.INVALID_ARGUMENT)
        return code, str(exc)
    return None


_S = TypeVar("_S", bound="ControllerServicer")
_Req = TypeVar("_Req")
_Rep = TypeVar("_Rep")


def _unexpected(method: str) -> None:
    log.exception("northbound %s failed", method)


def _handler(
    *, changes: bool
) -> Callable[[Callable[[_S, _Req], _Rep]], Callable[[_S, _Req, Any], _Rep]]:
    """Wrap a unary method: serialise it if it ``changes`` state, map its errors."""
    return unary(_status_of, locked=changes, unexpected=_unexpected)


# ------------------------------------------------------------------------ conversions


def _required(name: str, value: str) -> str:
    if not value:
        raise _invalid(f"{name}: required")
    return value


def _new_name(field: str, value: str) -> str:
    """A name for something new: non-empty, at most MAX_NAME printable non-blank chars."""
    _required(field, value)
    if len(value) > MAX_NAME:
        raise _invalid(f"{field}: {len(value)} characters, at most {MAX_NAME}")
    if not value.isprintable() or any(c.isspace() for c in value):
        raise _invalid(f"{field}: {value!r} has blanks or control characters")
    return value


def _agent_address(text: str) -> str:
    """A gRPC target: a known scheme, or host:port (IPv6 literal hosts in brackets)."""
    if text.startswith(_SCHEMES):
        if not text.partition(":")[2]:
            raise _invalid(f"address: {text!r} names no socket or host")
        return text
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 0xFFFF:
        raise _invalid(f"address: {text!r} is not host:port, [v6]:port or unix:PATH")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise _invalid(f"address: {text!r}: an IPv6 host goes in brackets, [{host}]:{port}")
    return text


def _ip(name: str, text: str) -> None:
    """An IPv4 or IPv6 address (STAMP runs over both)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise _invalid(f"{name}: {text!r} is not an IPv4 or IPv6 address") from None


def node_to_proto(row: NodeRow) -> pb.Node:
    out = pb.Node(
        name=row.name,
        address=row.address,
        role=_ROLES_PB.get(row.role, pb.NODE_ROLE_UNSPECIFIED),
        healthy=row.healthy,
        last_error=row.last_error or "",
        initialized=row.init is not None,
        agent_epoch=row.agent_epoch or "",
        restarts=row.restarts,
    )
    if row.last_seen is not None:
        out.last_seen_ns = row.last_seen
    if row.init is not None:
        out.init.CopyFrom(init_to_proto(row.init))
    if row.agent_started_ns is not None:
        out.agent_started_ns = row.agent_started_ns
    return out


def init_to_proto(init: dict[str, Any]) -> pb.NodeInit:
    out = pb.NodeInit(
        dataplane=init.get("dataplane") or "",
        interface=init.get("interface") or "",
        source=init.get("source") or "",
    )
    if init.get("port") is not None:
        out.port = init["port"]
    return out


def _init_from_proto(field: str, init: pb.NodeInit) -> dict[str, Any]:
    """NodeInit as the store keeps it (``Controller.init_node``'s keyword arguments)."""
    port = init.port if init.HasField("port") else None
    if port is not None and port > 0xFFFF:
        raise _invalid(f"{field}.port: {port} is not a UDP port (0..65535)")
    if init.source:
        _ip(f"{field}.source", init.source)
    return {
        "dataplane": init.dataplane,
        "port": port,
        "interface": init.interface,
        "source": init.source,
    }


def session_to_proto(row: SessionRow, stored: int, raised: Sequence[str] = ()) -> pb.Session:
    p = row.params
    loopback = bool(p.get("loopback", False))
    out = pb.Session(
        name=row.name,
        ssid=row.ssid,
        state=_STATES_PB.get(row.state, pb.SESSION_STATE_UNSPECIFIED),
        sender=row.sender,
        reflector="" if loopback else row.reflector,  # the store names the sender there
        reflector_address=p["reflector_address"],
        segments=p["segments"],
        return_segments=p["return_segments"],
        return_path_tlv=p["return_path_tlv"],
        reflector_port=p["reflector_port"],
        source_address=p["source_address"],
        interval_ns=p["interval_ns"],
        count=p["count"],
        duration_ns=p["duration_ns"],
        ptp=p["ptp"],
        authenticated=bool(p["key_hex"]),
        stateful=p["stateful"],
        strict_ssid=p.get("strict_ssid", False),
        loss_timeout_ns=p["loss_timeout_ns"],
        collect=_COLLECT_PB.get(p["collect"], pb.COLLECT_MODE_POLL),
        created_ns=row.created_ns,
        epoch=row.epoch,
        sent=row.sent,
        lost=row.lost,
        overflow=row.overflow,
        stored=stored,
        loopback=loopback,
        flow_labels=p.get("flow_labels", ()),
        dm_sender_sent=p.get("dm_sender_sent", ""),
        dm_sender_received=p.get("dm_sender_received", ""),
        dm_reflector_sent=p.get("dm_reflector_sent", ""),
        dm_reflector_received=p.get("dm_reflector_received", ""),
        events_raised=raised,
    )
    if row.forward_lost is not None:
        out.forward_lost = row.forward_lost
    out.key_sha256 = key_sha256(p["key_hex"])
    for name in ("max_delay_ms", "max_jitter_ms", "max_loss_ratio", "event_window_s"):
        if p.get(name) is not None:
            setattr(out, name, p[name])
    return out


def spec_to_request(spec: SessionSpec) -> pb.CreateSessionRequest:
    """A SessionSpec as CreateSession takes it (the key included)."""
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
        key=bytes.fromhex(spec.key_hex),
        stateful=spec.stateful,
        strict_ssid=spec.strict_ssid,
        loss_timeout_ns=spec.loss_timeout_ns,
        collect=_COLLECT_PB[spec.collect],
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


def epoch_to_proto(e: EpochStats) -> pb.EpochStats:
    out = pb.EpochStats(
        epoch=e.epoch,
        started_ns=e.started_ns,
        end_reason=e.end_reason or "",
        sender_agent=e.sender_agent or "",
        sent=e.sent,
        received=e.received,
        lost=e.lost,
        unknown=e.unknown,
        schedule_skipped=e.skipped,
    )
    if e.ended_ns is not None:
        out.ended_ns = e.ended_ns
    return out


def record_to_proto(r: StampResult, epoch: int = 0) -> pb.Record:
    return pb.Record(
        epoch=epoch,
        seq=r.seq,
        t1_ns=r.t1_ns,
        t2_ns=r.t2_ns,
        t3_ns=r.t3_ns,
        t4_ns=r.t4_ns,
        direct_ns=_i64(r.direct_ns),
        return_ns=_i64(r.return_ns),
        rtt_ns=_i64(r.rtt_ns),
        ttl=r.ses_sender_ttl,
        reflector_seq=r.reflector_seq,
        sender_error_estimate=r.sender_error.to_int(),
        reflector_error_estimate=r.reflector_error.to_int(),
        sender_error_ns=_u64(r.sender_error.error_ns),
        reflector_error_ns=_u64(r.reflector_error.error_ns),
        error_bound_ns=_u64(r.error_bound_ns),
        loopback=r.loopback,
        flow_label=r.flow_label,
    )


def _u64(value: int) -> int:
    """Error bounds can exceed uint64 (255 × 2^31 s, RFC 4656 §4.1.2): saturate."""
    return min(value, _U64_MAX)


def _i64(value: int) -> int:
    """Delays of absurd timestamps (uint64 each) can leave sint64: saturate, not fail."""
    return max(min(value, _I64_MAX), -_I64_MAX - 1)


def summary_to_proto(s: DelaySummary) -> pb.DelaySummary:
    return pb.DelaySummary(
        count=s.count,
        min_ns=_i64(s.min_ns),
        mean_ns=_i64(s.mean_ns),
        p50_ns=_i64(s.p50_ns),
        p90_ns=_i64(s.p90_ns),
        p99_ns=_i64(s.p99_ns),
        max_ns=_i64(s.max_ns),
    )


def _wanted_node(index: int, node: pb.NodeConfig) -> apply.WantedNode:
    field = f"nodes[{index}]"
    _new_name(f"{field}.name", node.name)
    try:
        _agent_address(node.address)
    except RequestRefusedError as exc:
        raise _invalid(f"{field}.{exc}") from None
    role = _ROLES.get(node.role)
    if role is None:
        raise _invalid(f"{field}.role: {node.role} is neither NODE_ROLE_SENDER nor REFLECTOR")
    init = _init_from_proto(f"{field}.init", node.init) if node.HasField("init") else None
    return apply.WantedNode(node.name, node.address, role, init)


def _wanted_session(config: pb.SessionConfig) -> apply.WantedSession:
    spec = _spec(config.spec)
    digest = config.key_sha256.lower()
    if digest and (
        len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest) or spec.key_hex
    ):
        raise _invalid(f"sessions.{spec.name}.key_sha256: 64 hex digits, and only without a key")
    return apply.WantedSession(spec, digest, config.running)


def _change(step: apply.Step) -> pb.Change:
    return pb.Change(action=step.action, kind=step.kind, name=step.name, detail=step.detail)


def _spec(request: pb.CreateSessionRequest) -> SessionSpec:
    """The controller's SessionSpec for a request (its ``validate`` checks the rest)."""
    _new_name("name", request.name)
    _required("sender", request.sender)
    if not request.loopback:  # a loopback session has no reflector (docs/srpm.md)
        _required("reflector", request.reflector)
        _required("reflector_address", request.reflector_address)
    collect = _COLLECT.get(request.collect)
    if collect is None:
        raise _invalid(f"collect: unknown value {request.collect}")
    d = _SPEC_DEFAULTS
    loss_timeout = (
        request.loss_timeout_ns if request.HasField("loss_timeout_ns") else d.loss_timeout_ns
    )
    if loss_timeout <= 0:
        raise _invalid("loss_timeout_ns: must be positive")
    if request.count > MAX_COUNT:
        # A count past the 32-bit Sequence Number (RFC 8762 §4.2.1) is never reached.
        raise _invalid(f"count: {request.count}, at most {MAX_COUNT}")
    return SessionSpec(
        name=request.name,
        sender=request.sender,
        reflector=request.reflector,
        reflector_address=request.reflector_address,
        segments=tuple(request.segments),
        return_segments=tuple(request.return_segments),
        return_path_tlv=request.return_path_tlv,
        reflector_port=(
            request.reflector_port if request.HasField("reflector_port") else d.reflector_port
        ),
        source_address=request.source_address,
        interval_ns=request.interval_ns if request.HasField("interval_ns") else d.interval_ns,
        count=request.count,
        duration_ns=request.duration_ns,
        ptp=request.ptp,
        key_hex=bytes(request.key).hex(),
        stateful=request.stateful,
        loss_timeout_ns=loss_timeout,
        collect=collect,
        strict_ssid=request.strict_ssid,
        loopback=request.loopback,
        flow_labels=tuple(request.flow_labels),
        dm_sender_sent=request.dm_sender_sent,
        dm_sender_received=request.dm_sender_received,
        dm_reflector_sent=request.dm_reflector_sent,
        dm_reflector_received=request.dm_reflector_received,
        max_delay_ms=request.max_delay_ms if request.HasField("max_delay_ms") else None,
        max_jitter_ms=request.max_jitter_ms if request.HasField("max_jitter_ms") else None,
        max_loss_ratio=request.max_loss_ratio if request.HasField("max_loss_ratio") else None,
        event_window_s=(
            request.event_window_s if request.HasField("event_window_s") else d.event_window_s
        ),
    )


# --------------------------------------------------------------------------- servicer


class ControllerServicer(pb_grpc.ControllerServicer):
    """The ``Controller`` gRPC service over one ``Controller`` (not owned: not closed)."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.store = controller.store
        self._lock = threading.Lock()

    # -- nodes ------------------------------------------------------------------------

    @_handler(changes=True)
    def RegisterNode(self, request: pb.RegisterNodeRequest) -> pb.RegisterNodeReply:  # noqa: N802
        _new_name("name", request.name)
        _agent_address(request.address)
        role = _ROLES.get(request.role)
        if role is None:
            raise _invalid(f"role: {request.role} is neither NODE_ROLE_SENDER nor REFLECTOR")
        self.controller.register_node(request.name, request.address, role)
        return pb.RegisterNodeReply(node=node_to_proto(self.store.node(request.name)))

    @_handler(changes=True)
    def InitNode(self, request: pb.InitNodeRequest) -> pb.InitNodeReply:  # noqa: N802
        self.store.node(_required("name", request.name))  # NOT_FOUND before any call
        port = request.port if request.HasField("port") else None
        if port is not None and port > 0xFFFF:
            raise _invalid(f"port: {port} is not a UDP port (0..65535)")
        if request.source:
            _ip("source", request.source)
        bound = self.controller.init_node(
            request.name,
            dataplane=request.dataplane,
            port=port,
            interface=request.interface,
            source=request.source,
        )
        return pb.InitNodeReply(port=bound)

    @_handler(changes=False)
    def ListNodes(self, request: pb.ListNodesRequest) -> pb.ListNodesReply:  # noqa: N802
        if request.check:
            names = [r.name for r in self.store.nodes()]
            if names:
                with futures.ThreadPoolExecutor(
                    min(len(names), MAX_HEALTH_CHECKS), thread_name_prefix="health"
                ) as pool:
                    list(pool.map(self.controller.check_node, names))
        return pb.ListNodesReply(nodes=[node_to_proto(r) for r in self.store.nodes()])

    # -- sessions ---------------------------------------------------------------------

    @_handler(changes=True)
    def CreateSession(self, request: pb.CreateSessionRequest) -> pb.CreateSessionReply:  # noqa: N802
        row = self.controller.create_session(_spec(request))
        return pb.CreateSessionReply(session=session_to_proto(row, 0))

    @_handler(changes=True)
    def StartSession(self, request: pb.StartSessionRequest) -> pb.StartSessionReply:  # noqa: N802
        self.controller.start_session(_required("name", request.name))
        return pb.StartSessionReply()

    @_handler(changes=True)
    def StopSession(self, request: pb.StopSessionRequest) -> pb.StopSessionReply:  # noqa: N802
        pending = self.controller.stop_session(_required("name", request.name))
        return pb.StopSessionReply(pending=pending)

    @_handler(changes=True)
    def DestroySession(  # noqa: N802
        self, request: pb.DestroySessionRequest
    ) -> pb.DestroySessionReply:
        self.controller.destroy_session(_required("name", request.name))
        return pb.DestroySessionReply()

    @_handler(changes=False)
    def ListSessions(self, request: pb.ListSessionsRequest) -> pb.ListSessionsReply:  # noqa: N802
        rows = self.store.sessions(include_destroyed=request.include_destroyed)
        return pb.ListSessionsReply(
            sessions=[
                session_to_proto(r, self.store.count_results(r.id), self.store.raised(r.id))
                for r in rows
            ]
        )

    # -- results ----------------------------------------------------------------------

    @_handler(changes=False)
    def GetResults(self, request: pb.GetResultsRequest) -> pb.GetResultsReply:  # noqa: N802
        row = self.store.session(_required("name", request.name))
        limit = request.limit or DEFAULT_RESULTS_LIMIT
        if limit > MAX_RESULTS:
            raise _invalid(f"limit: {limit}, at most {MAX_RESULTS}")
        since = request.since_ns if request.HasField("since_ns") else None
        records = self.store.records(row.id, since_ns=since, limit=limit + 1)
        return pb.GetResultsReply(
            records=[record_to_proto(r, epoch) for epoch, r in records[:limit]],
            more=len(records) > limit,
        )

    # -- declarative ------------------------------------------------------------------

    @_handler(changes=True)
    def Apply(self, request: pb.ApplyRequest) -> pb.ApplyReply:  # noqa: N802
        nodes = [_wanted_node(i, n) for i, n in enumerate(request.nodes)]
        sessions = [_wanted_session(s) for s in request.sessions]
        steps = apply.plan(self.controller, nodes, sessions, prune=request.prune)
        reply = pb.ApplyReply()
        if request.dry_run:
            reply.changes.extend(_change(s) for s in steps)
            return reply
        try:
            done = apply.execute(steps, self.controller)
        except Exception as exc:
            status = _status_of(exc)
            if status is None:
                raise
            reply.changes.extend(_change(s) for s in getattr(exc, "done", []))
            reply.error = f"{status[0].name}: {status[1]}"
            return reply
        reply.changes.extend(_change(s) for s in done)
        return reply

    @_handler(changes=False)
    def Export(self, _request: pb.ExportRequest) -> pb.ApplyRequest:  # noqa: N802
        out = pb.ApplyRequest()
        for row in self.store.nodes():
            node = pb.NodeConfig(name=row.name, address=row.address, role=_ROLES_PB[row.role])
            if row.init is not None:
                node.init.CopyFrom(init_to_proto(row.init))
            out.nodes.append(node)
        for srow in self.store.sessions():
            spec = apply.spec_of(srow)
            request = spec_to_request(replace(spec, key_hex=""))
            out.sessions.append(
                pb.SessionConfig(
                    spec=request,
                    key_sha256=key_sha256(spec.key_hex),
                    running=srow.state in ("running", "starting", "finished"),
                )
            )
        return out

    @_handler(changes=False)
    def GetPathStats(self, request: pb.GetPathStatsRequest) -> pb.GetPathStatsReply:  # noqa: N802
        name = _required("name", request.name)
        row = self.store.session(name)
        since = request.since_ns if request.HasField("since_ns") else None
        stats = self.controller.stats(name, since_ns=since)
        out = pb.GetPathStatsReply(
            received=stats.received, lost=stats.lost, loss_ratio=stats.loss_ratio, sent=row.sent
        )
        for field, summary in (
            ("direct_delay", stats.direct),
            ("return_delay", stats.backward),
            ("round_trip_delay", stats.rtt),
        ):
            if summary is not None:
                getattr(out, field).CopyFrom(summary_to_proto(summary))
        if stats.direct_jitter_ns is not None:
            out.direct_jitter_ns = _u64(stats.direct_jitter_ns)
        if stats.return_jitter_ns is not None:
            out.return_jitter_ns = _u64(stats.return_jitter_ns)
        if stats.max_error_bound_ns is not None:
            out.max_error_bound_ns = _u64(stats.max_error_bound_ns)
        if since is None:
            epochs = self.controller.epochs(name)
            out.epochs.extend(epoch_to_proto(e) for e in epochs)
            out.unknown = sum(e.unknown for e in epochs)
            out.schedule_skipped = sum(e.skipped for e in epochs)
            out.schedule_late_max_ns = max((e.late_ns_max for e in epochs), default=0)
            sent = sum(e.sent for e in epochs)
            if sent:
                out.schedule_late_mean_ns = sum(e.late_ns_total for e in epochs) // sent
        if since is None and row.forward_lost is not None:
            # A stateful reflector numbers what it received (RFC 8762 §4.3): the sender
            # splits its losses; what was not lost forward was lost on the way back,
            # except the losses after the last reply, which nothing places yet.
            unclassified = row.unclassified_lost or 0
            out.forward_lost = row.forward_lost
            out.backward_lost = max(row.lost - row.forward_lost - unclassified, 0)
            out.unclassified_lost = unclassified
        out.ssid_zero = row.ssid_zero
        for label, st in sorted(self.controller.flow_stats(name, since_ns=since).items()):
            flow = out.flows.add(flow_label=label, received=st.received)
            if st.direct is not None:
                flow.direct_delay.CopyFrom(summary_to_proto(st.direct))
            if st.rtt is not None:
                flow.round_trip_delay.CopyFrom(summary_to_proto(st.rtt))
            if st.direct_jitter_ns is not None:
                flow.jitter_ns = _u64(st.direct_jitter_ns)
        total, intervals = self.controller.data_loss(name, since_ns=since)
        if total is not None:
            dl = out.data_loss
            dl.forward_sent, dl.forward_lost = total.forward_sent, total.forward_lost
            dl.backward_sent = total.backward_sent
            if total.backward_lost is not None:
                dl.backward_lost = total.backward_lost
            for i in intervals[-MAX_DATA_INTERVALS:]:
                item = dl.intervals.add(
                    start_ns=i.start_ns, end_ns=i.end_ns, forward_sent=i.forward_sent,
                    forward_lost=i.forward_lost, backward_sent=i.backward_sent,
                )  # fmt: skip
                if i.backward_lost is not None:
                    item.backward_lost = i.backward_lost
        return out

    @_handler(changes=False)
    def ListEvents(self, request: pb.ListEventsRequest) -> pb.ListEventsReply:  # noqa: N802
        limit = request.limit or DEFAULT_EVENTS_LIMIT
        if limit > MAX_EVENTS:
            raise _invalid(f"limit: {limit}, at most {MAX_EVENTS}")
        since = request.since_ns if request.HasField("since_ns") else None
        rows = self.store.events(request.name or None, since_ns=since, limit=limit)
        return pb.ListEventsReply(
            events=[
                pb.Event(
                    session=e.session,
                    kind=e.kind,
                    state=e.state,
                    value=e.value,
                    threshold=e.threshold,
                    at_ns=e.at_ns,
                )
                for e in rows
            ]
        )


# ------------------------------------------------------------------------------ server


class ControllerServer:
    """A running northbound server. ``stop`` ends it; the controller stays the caller's."""

    def __init__(self, server: Any, servicer: ControllerServicer, port: int) -> None:
        self.server = server
        self.servicer = servicer
        #: The TCP port gRPC listens on (0 for a unix: address).
        self.port = port

    def stop(self, grace: float | None = 1.0) -> None:
        self.server.stop(grace).wait()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops; False if ``timeout`` passed first."""
        return bool(self.server.wait_for_termination(timeout))

    def __enter__(self) -> ControllerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_controller(
    address: str,
    controller: Controller,
    *,
    max_workers: int = DEFAULT_MAX_WORKERS,
    tls: tuple[Path, Path, Path | None] | None = None,
) -> ControllerServer:
    """Serve the northbound API of ``controller`` on ``address`` (``"[::1]:50050"``,
    ``"unix:/run/sixlab/controller.sock"``; port 0 picks a free port).

    With ``tls`` = (certificate chain, key, CA or None), PEM files, the server speaks
    TLS, and requires client certificates signed by the CA if one is given (mutual
    TLS). Returns once the server accepts calls. Raises
    OSError if it cannot listen (a ``unix:`` path a live server answers on is refused,
    a dead one's socket replaced: :func:`~sixlab.southbound.rpcserver.claim_unix_address`),
    ValueError if a TLS file cannot be read.
    """
    credentials = None if tls is None else server_credentials(*tls)
    claim_unix_address(address)
    servicer = ControllerServicer(controller)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="controller-nb"),
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ],
    )
    pb_grpc.add_ControllerServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        server.stop(None)
        raise OSError(f"grpc: cannot listen on {address}: {exc}") from exc
    server.start()
    return ControllerServer(server, servicer, int(port))
