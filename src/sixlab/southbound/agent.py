"""The STAMP agent: a gRPC server (``stamp.proto``) in front of one STAMP engine.

Theory of operation
-------------------
One agent runs per node, in a role fixed at start (Session-Sender or Session-Reflector)
and with a default data plane chosen by name (any plane of
``sixlab.dataplane.base.PLANES``)::

    Init ──▶ data plane opened, engine thread started ──▶ sessions ──▶ Reset
              (create(name, DataplaneConfig))                 Create / Start / Stop / Destroy

The servicer is thin: it turns a request into the core's configuration
(``SenderConfig`` / ``ReflectorSessionConfig``), checking every field and naming it in
the error, then calls the engine (``sixlab.dataplane.engine``). Every check happens
before anything changes, so a refused request leaves the agent as it was. Failures
become gRPC statuses in one place (``_status_of``):

=====================================  ==================================================
``AgentError``                         its own code (NOT_FOUND, ALREADY_EXISTS, …)
``SessionConfigError``, ``WireError``  INVALID_ARGUMENT (a value the core refused)
``SessionStateError``                  FAILED_PRECONDITION (e.g. starting a session twice)
``DataplaneError``, ``LinuxError``     UNAVAILABLE (cannot bind, missing system support,
                                       nftables refused a session's data counters)
=====================================  ==================================================

Initialising twice is FAILED_PRECONDITION, not ALREADY_EXISTS: what is missing is the
Reset that must come first.

A reflector session has no life of its own in the core (``Reflector`` answers the
SSIDs it holds), so the agent keeps it here: Create stores the configuration, Start
adds it to the core, Stop removes it (adding its counters to those kept from earlier
runs), Destroy forgets it. Both go through the engine (``ReflectorEngine.add_session``
/ ``remove_session``, ``SenderEngine.add_session`` / ``remove_session``), which also
tells the data plane: the ``xdp`` plane answers (or collects) a session's packets in
the kernel from then on. What a plane handles itself is not in the core's counters;
GetCounters reports it apart, as ``dataplane`` (per session and in total).

SR performance measurement (docs/srpm.md). A sender session may be ``loopback`` (its
packets come back to this agent; the reflector address and port are its own), spread
over ``flow_labels``, or count a data flow for direct-mode loss: the agent then
installs an nftables table of counters for the session (``sixlab.linux.nftcount``,
named ``sixlab_dm_<role>_<ssid>``) at Create and removes it at Destroy or Reset; the
engine reads it per packet.

Results. A sender session's records queue in the engine's bounded FIFO.
GetStampSessionResults drains it (the polling mode of "High Performance Delay Monitoring
for SRv6 Based SD-WANs", docs/papers.md); StreamStampSessionResults waits on it and
pushes batches (the "notification mode" that paper describes but did not build). The
stream ends after the batch with ``final`` set (the session finished and its FIFO is
empty), when the client cancels, and with ABORTED when the session is destroyed or the
agent reset under it. StreamResults does the same for any number of sessions on one
stream: it waits for any change in the engine (``SenderEngine.wait_change``: a record
or loss report queued, a session ended), then cuts one message with a batch for each
session that has records or loss reports it asked for, has finished, or is due its
counters.

Concurrency. gRPC calls run on a thread pool. One lock serialises every unary call, so
a check and the change it guards cannot be split by another call; streams take it
only to look the session up and wait on the engine's condition without it. Every open
stream holds a worker thread for its lifetime, so at most ``max_streams`` are open at
once (the pool less ``RESERVED_WORKERS``): one more is refused, RESOURCE_EXHAUSTED,
instead of queueing the unary calls behind it until their deadlines pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import grpc

from sixlab.dataplane.base import Dataplane, DataplaneConfig, DataplaneError, available, create
from sixlab.dataplane.engine import (
    DEFAULT_FIFO_CAPACITY,
    ReflectorEngine,
    SenderEngine,
    SenderSessionSpec,
)
from sixlab.linux import FlowCounters, FlowMatch, LinuxError
from sixlab.southbound._generated import stamp_pb2 as pb
from sixlab.southbound._generated import stamp_pb2_grpc as pb_grpc
from sixlab.southbound.agentinfo import info_sessions
from sixlab.southbound.budget import (
    MIN_REPLY_BUDGET_BYTES,
    REPLY_BUDGET_BYTES,
    Batches,
    asked_budget,
    fit,
    lost_fitting,
)
from sixlab.southbound.rpcclient import RpcError
from sixlab.southbound.rpcserver import abort_for, claim_unix_address, each, unary
from sixlab.stamp import DropReason, SessionConfigError, SessionStateError, StampResult
from sixlab.stamp.reflector import Reflector, ReflectorMode, ReflectorSessionConfig
from sixlab.stamp.sender import DEFAULT_LOSS_TIMEOUT_NS, NS_PER_S, SenderConfig, State
from sixlab.wire import WireError
from sixlab.wire import stamp as wire
from sixlab.wire.stamp_tlv import ReturnPath, Srv6SegmentList
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_WORKERS",
    "MAX_COUNT",
    "MAX_DURATION_NS",
    "MAX_INTERVAL_NS",
    "MAX_KEY_BYTES",
    "MAX_LOSS_TIMEOUT_NS",
    "MAX_MESSAGE_BYTES",
    "MAX_SIDS",
    "MAX_TLV_BYTES",
    "RESERVED_WORKERS",
    "AgentError",
    "AgentServer",
    "Role",
    "StampAgentServicer",
    "TlsFiles",
    "batch_reply",
    "result_to_proto",
    "serve",
]

IPv6Address = ipaddress.IPv6Address
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Code = grpc.StatusCode

#: gRPC worker threads. Each open results stream holds one for its lifetime, so this
#: bounds concurrent streams plus unary calls (a controller needs a handful).
DEFAULT_MAX_WORKERS = 16
#: Worker threads no results stream may take: streams beyond ``max_workers`` less these
#: are refused (RESOURCE_EXHAUSTED), so that unary calls (Create, Start, Acknowledge...)
#: always find a thread. One StreamResults carries any number of sessions.
RESERVED_WORKERS = 4
#: Largest request accepted (bytes). The biggest legitimate one is a CreateStampSession
#: with a full TLV area and SID lists: well under 64 KiB; 1 MiB leaves room and keeps a
#: hostile client from making the agent buffer gRPC's default 4 MiB per call.
MAX_MESSAGE_BYTES = 1 << 20
#: TLV area of a test packet: the socket plane receives at most 9000-byte payloads
#: (jumbo frames), less the 112-byte authenticated base packet (RFC 8762 §4.2.2).
MAX_TLV_BYTES = 9000 - wire.AUTH_PACKET_SIZE
#: An SRH holds at most 127 SIDs: Hdr Ext Len is 8 bits of 8-octet units (RFC 8754 §2).
MAX_SIDS = 127
#: HMAC keys: RFC 8762 §4.4 leaves key management out; HMAC-SHA-256 hashes longer keys
#: anyway (RFC 2104 §2), so a bound only stops absurd requests.
MAX_KEY_BYTES = 1024
#: Shortest interval accepted: below 1 µs the engine could only send back to back.
MIN_INTERVAL_NS = 1_000
#: Longest interval, duration and loss timeout accepted, as the CLI's (a day between
#: packets, a year of sending): more is no measurement, and the engine adds them to
#: monotonic ns, which must stay far inside 64 bits.
MAX_INTERVAL_NS = 86_400 * NS_PER_S
MAX_DURATION_NS = 366 * 86_400 * NS_PER_S
MAX_LOSS_TIMEOUT_NS = 86_400 * NS_PER_S
#: A STAMP Sequence Number is 32 bits (RFC 8762 §4.2.1): a session stopping after more
#: packets would reuse numbers before it stopped.
MAX_COUNT = 0xFFFF_FFFF
#: TAI−UTC is 37 s today (IERS Bulletin C); accept up to an hour, never negative.
MAX_TAI_UTC_OFFSET_NS = 3600 * NS_PER_S
#: Linux interface names are at most IFNAMSIZ − 1 = 15 characters.
MAX_IFNAME = 15
#: Results stream defaults and bounds (see StreamStampSessionResultsRequest).
DEFAULT_BATCH = 1000
MAX_BATCH = 100_000
DEFAULT_BATCH_WINDOW_NS = 100_000_000
MAX_BATCH_WINDOW_NS = 10 * NS_PER_S
#: GetStampSessionResults: records per reply when max_results is 0, and the most a
#: request may ask for. Whatever the count, a reply stops at the byte budget
#: (``sixlab.southbound.budget``); ``remaining`` tells the client to ask again.
DEFAULT_RESULTS = DEFAULT_BATCH
MAX_RESULTS = 10_000
#: How often a waiting stream looks at its client and its session (s).
_STREAM_POLL_S = 0.25
#: StreamResults: counters of each session at least this often, by default and at most.
DEFAULT_COUNTERS_INTERVAL_NS = NS_PER_S
MAX_COUNTERS_INTERVAL_NS = 60 * NS_PER_S
#: An Error Estimate can claim up to 255 × 2^31 s (RFC 4656 §4.1.2), more ns than a
#: uint64 holds: such errors are reported saturated.
_U64_MAX = 2**64 - 1
#: DataplaneConfig fields set by Init's own fields, not by ``dataplane_options``.
_INIT_FIELDS = frozenset({"port", "interface", "source"})


class Role(StrEnum):
    SENDER = "sender"
    REFLECTOR = "reflector"


_ROLE_PB = {Role.SENDER: pb.ROLE_SENDER, Role.REFLECTOR: pb.ROLE_REFLECTOR}
_STATE_PB = {
    State.IDLE: pb.SESSION_STATE_IDLE,
    State.RUNNING: pb.SESSION_STATE_RUNNING,
    State.DRAINING: pb.SESSION_STATE_DRAINING,
    State.FINISHED: pb.SESSION_STATE_FINISHED,
}
_FORMATS = {
    pb.TIMESTAMP_FORMAT_NTP: TimestampFormat.NTP,
    pb.TIMESTAMP_FORMAT_PTP: TimestampFormat.PTP,
}
_MODES = {
    pb.REFLECTOR_MODE_STATELESS: ReflectorMode.STATELESS,
    pb.REFLECTOR_MODE_STATEFUL: ReflectorMode.STATEFUL,
}


class AgentError(RpcError):
    """A request the agent refuses, with the gRPC status code to refuse it with."""


def _status_of(exc: Exception) -> tuple[grpc.StatusCode, str] | None:
    """The one mapping from the agent's and the core's errors to gRPC statuses."""
    if isinstance(exc, AgentError):
        return exc.code, exc.details
    if isinstance(exc, SessionStateError):
        return Code.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, SessionConfigError | WireError):
        return Code.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, DataplaneError | LinuxError):
        return Code.UNAVAILABLE, str(exc)
    return None


def batch_reply(statuses: Sequence[tuple[grpc.StatusCode, str]]) -> pb.BatchReply:
    """A batch call's reply: the status of each of its requests (``rpcserver.each``)."""
    return pb.BatchReply(
        statuses=[pb.CallStatus(code=code.value[0], message=message) for code, message in statuses]
    )


#: Every unary call runs under the agent lock, its errors mapped by ``_status_of``.
_unary = unary(_status_of)
_Rep = TypeVar("_Rep")


# ------------------------------------------------------------------------ field checks


def _destroyed(ssid: int) -> AgentError:
    return AgentError(Code.ABORTED, f"ssid: session {ssid} was destroyed during the stream")


def _invalid(message: str) -> AgentError:
    return AgentError(Code.INVALID_ARGUMENT, message)


def _ssid(value: int) -> int:
    if not 0 <= value <= 0xFFFF:
        raise _invalid(f"ssid: {value} is not a 16-bit value (RFC 8972 §3)")
    return value


def _port(name: str, value: int) -> int:
    if not 0 <= value <= 0xFFFF:
        raise _invalid(f"{name}: {value} is not a UDP port (0..65535)")
    return value


def _address(name: str, text: str) -> IPAddress:
    """An IPv4 or IPv6 address (STAMP runs over both; SRv6 SIDs are IPv6 only)."""
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        raise _invalid(f"{name}: {text!r} is not an IPv4 or IPv6 address") from None


def _unicast(name: str, text: str) -> IPAddress:
    """A destination: test packets go to one node, so not ``::`` nor a multicast group
    (STAMP is unicast, RFC 8762 §4; a SID is a unicast address, RFC 8986 §3.1)."""
    address = _address(name, text)
    if address.is_unspecified or address.is_multicast:
        raise _invalid(f"{name}: {text!r} is not a unicast address")
    return address


def _sid(name: str, text: str) -> IPv6Address:
    address = _unicast(name, text)
    if not isinstance(address, IPv6Address):
        raise _invalid(f"{name}: {text!r} is not an IPv6 address (an SRv6 SID)")
    return address


def _sid_list(name: str, texts: Sequence[str]) -> tuple[IPv6Address, ...]:
    if len(texts) > MAX_SIDS:
        raise _invalid(f"{name}: {len(texts)} SIDs, an SRH holds at most {MAX_SIDS}")
    return tuple(_sid(f"{name}[{i}]", t) for i, t in enumerate(texts))


def _choice(name: str, value: int, table: Mapping[Any, _Rep]) -> _Rep:
    try:
        return table[value]
    except KeyError:
        raise _invalid(f"{name}: unknown value {value}") from None


def _key(request: pb.CreateStampSessionRequest) -> bytes | None:
    if request.auth_mode == pb.AUTH_MODE_AUTHENTICATED:
        if not request.key:
            raise _invalid("key: authenticated mode needs a key")
        if len(request.key) > MAX_KEY_BYTES:
            raise _invalid(f"key: {len(request.key)} bytes, at most {MAX_KEY_BYTES}")
        return bytes(request.key)
    if request.auth_mode != pb.AUTH_MODE_UNAUTHENTICATED:
        raise _invalid(f"auth_mode: unknown value {request.auth_mode}")
    if request.key:
        raise _invalid("key: set, but auth_mode is unauthenticated")
    return None


def _error_estimate(value: int) -> ErrorEstimate | None:
    if value == 0:
        return None
    if value > 0xFFFF:
        raise _invalid(f"error_estimate: {value} does not fit in 16 bits")
    return ErrorEstimate.from_int(value)


def _tai_offset(request: pb.CreateStampSessionRequest) -> dict[str, Any]:
    if not request.HasField("tai_utc_offset_ns"):
        return {}
    offset = request.tai_utc_offset_ns
    if not 0 <= offset <= MAX_TAI_UTC_OFFSET_NS:
        raise _invalid(f"tai_utc_offset_ns: {offset} is not in 0..{MAX_TAI_UTC_OFFSET_NS}")
    return {"tai_utc_offset_ns": offset}


def _at_most(name: str, value: int, limit: int) -> None:
    if value > limit:
        raise _invalid(f"{name}: {value}, at most {limit}")


def _local_port(name: str, value: int, bound: int) -> None:
    _port(name, value)
    if value not in (0, bound):
        raise _invalid(f"{name}: {value}, but this agent's data plane is bound to port {bound}")


def _dataplane_options(options: Mapping[str, str]) -> dict[str, Any]:
    """``dataplane_options`` as DataplaneConfig keyword arguments, typed by each default."""
    fields = {f.name: f for f in dataclasses.fields(DataplaneConfig) if f.name not in _INIT_FIELDS}
    out: dict[str, Any] = {}
    for key, text in sorted(options.items()):
        spec = fields.get(key)
        if spec is None:
            known = ", ".join(sorted(fields)) or "none"
            raise _invalid(f"dataplane_options: unknown option {key!r} (known: {known})")
        default = spec.default
        name = f"dataplane_options[{key!r}]"
        if isinstance(default, bool):
            if text.lower() not in ("true", "false"):
                raise _invalid(f"{name}: {text!r} is not true or false")
            out[key] = text.lower() == "true"
            continue
        try:
            if isinstance(default, int):
                out[key] = int(text)
            elif isinstance(default, tuple):
                out[key] = tuple(int(part) for part in text.split(",") if part.strip())
            else:
                out[key] = text
        except ValueError:
            raise _invalid(f"{name}: cannot use {text!r} here") from None
    ports = out.get("peer_ports", ())
    for port in ports:
        _port("dataplane_options['peer_ports']", port)
    return out


def _flow_match(name: str, match: pb.DataFlowMatch) -> FlowMatch | None:
    """A DataFlowMatch as nftcount's match; None when it is empty (counts nothing)."""
    if not match.prefix:
        if match.protocol or match.port:
            raise _invalid(f"{name}.prefix: required with a protocol or a port")
        return None
    try:
        return FlowMatch.parse(match.prefix, match.protocol, match.port)
    except ValueError as exc:
        raise _invalid(f"{name}.{exc}") from None


def _direct(request: pb.CreateStampSessionRequest) -> tuple[FlowMatch | None, FlowMatch | None]:
    """The (sent, received) matches of direct_measurement; (None, None) without it."""
    if not request.HasField("direct_measurement"):
        return None, None
    dm = request.direct_measurement
    sent = _flow_match("direct_measurement.sent", dm.sent)
    received = _flow_match("direct_measurement.received", dm.received)
    if sent is None and received is None:
        raise _invalid("direct_measurement: set sent, received or both")
    return sent, received


def _sender_spec(
    request: pb.CreateStampSessionRequest, bound_port: int, init_source: IPAddress | None
) -> tuple[SenderSessionSpec, int]:
    """The engine's session spec for a sender CreateStampSession, and its delay mode."""
    ssid = _ssid(request.ssid)
    segments = _sid_list("sid_list", request.sid_list) or None
    source = (
        _address("source_address", request.source_address)
        if request.source_address
        else init_source
    )
    if request.loopback:
        request = _loopback_request(request, segments, source, bound_port)
    if not request.reflector_address:
        raise _invalid("reflector_address: required on a sender")
    reflector = _unicast("reflector_address", request.reflector_address)
    if segments and not isinstance(reflector, IPv6Address):
        raise _invalid("sid_list: SRv6 needs an IPv6 reflector_address")
    if source is not None and source.version != reflector.version:
        raise _invalid("source_address: not of the reflector_address's family")
    interval = request.interval_ns or NS_PER_S
    if interval < MIN_INTERVAL_NS:
        raise _invalid(f"interval_ns: {interval}, at least {MIN_INTERVAL_NS}")
    _at_most("interval_ns", interval, MAX_INTERVAL_NS)
    _at_most("count", request.count, MAX_COUNT)
    _at_most("duration_ns", request.duration_ns, MAX_DURATION_NS)
    _at_most("loss_timeout_ns", request.loss_timeout_ns, MAX_LOSS_TIMEOUT_NS)
    reflector_port = _port("reflector_udp_port", request.reflector_udp_port) or wire.STAMP_PORT
    _local_port("sender_udp_port", request.sender_udp_port, bound_port)
    fmt = _choice("timestamp_format", request.timestamp_format, _FORMATS)
    mode = _choice("reflector_mode", request.reflector_mode, _MODES)
    delay_mode = _choice(
        "delay_mode",
        request.delay_mode,
        {
            pb.DELAY_MODE_TWO_WAY: pb.DELAY_MODE_TWO_WAY,
            pb.DELAY_MODE_ONE_WAY: pb.DELAY_MODE_ONE_WAY,
        },
    )
    key = _key(request)
    tlvs = _sender_tlvs(request)
    config = SenderConfig(
        ssid=ssid,
        interval_ns=interval,
        count=request.count or None,
        duration_ns=request.duration_ns or None,
        fmt=fmt,
        key=key,
        tlvs=tlvs,
        error_estimate=_error_estimate(request.error_estimate),
        loss_timeout_ns=request.loss_timeout_ns or DEFAULT_LOSS_TIMEOUT_NS,
        reflector_stateful=mode is ReflectorMode.STATEFUL,
        strict_ssid=request.strict_ssid,
        loopback=request.loopback,
        flow_labels=tuple(request.flow_labels),
        direct_measurement=request.HasField("direct_measurement"),
        **_tai_offset(request),
    )
    spec = SenderSessionSpec(config, reflector, reflector_port, segments, source)
    return spec, delay_mode


def _loopback_request(
    request: pb.CreateStampSessionRequest,
    segments: tuple[IPv6Address, ...] | None,
    source: IPAddress | None,
    bound_port: int,
) -> pb.CreateStampSessionRequest:
    """A loopback session's request, checked, with this agent as its reflector."""
    # docs/srpm.md: the packets come back to this agent's own address and port.
    if not segments:
        raise _invalid("sid_list: a loopback session needs the SID list of its loop")
    if source is None:
        raise _invalid(
            "source_address: a loopback session needs this agent's own address "
            "(source_address, or Init's)"
        )
    if (
        request.reflector_address
        and _address("reflector_address", request.reflector_address) != source
    ):
        raise _invalid("reflector_address: a loopback session's is its own (source_address)")
    if request.reflector_mode == pb.REFLECTOR_MODE_STATEFUL:
        raise _invalid("reflector_mode: a loopback session has no reflector")
    request = _copy(request)
    request.reflector_address = str(source)
    request.reflector_udp_port = bound_port
    return request


def _sender_tlvs(request: pb.CreateStampSessionRequest) -> bytes:
    """The TLVs a sender session sends: ``tlvs``, after a Return Path TLV when asked."""
    tlvs = bytes(request.tlvs)
    return_sids = _sid_list("return_sid_list", request.return_sid_list)
    if request.request_return_path:
        if not return_sids:
            raise _invalid("return_sid_list: request_return_path needs a return SID list")
        # RFC 9503 §4: the Return Path TLV with an SRv6 Segment List sub-TLV (§4.4). It
        # goes first so that an HMAC TLV in ``tlvs`` stays last (RFC 8972 §4.8).
        tlvs = ReturnPath((Srv6SegmentList(return_sids),)).to_tlv().encode() + tlvs
    elif return_sids:
        raise _invalid("return_sid_list: a sender uses it only with request_return_path")
    if len(tlvs) > MAX_TLV_BYTES:
        raise _invalid(f"tlvs: {len(tlvs)} bytes of TLVs, at most {MAX_TLV_BYTES}")
    return tlvs


def _copy(request: pb.CreateStampSessionRequest) -> pb.CreateStampSessionRequest:
    out = pb.CreateStampSessionRequest()
    out.CopyFrom(request)
    return out


def _reflector_config(
    request: pb.CreateStampSessionRequest, bound_port: int
) -> ReflectorSessionConfig:
    ssid = _ssid(request.ssid)
    if request.source_address:
        _address("source_address", request.source_address)
    _local_port("reflector_udp_port", request.reflector_udp_port, bound_port)
    if request.loopback:
        raise _invalid("loopback: a reflector takes no part in a loopback session")
    if request.flow_labels:
        raise _invalid("flow_labels: a reflector answers with its own flow label")
    return ReflectorSessionConfig(
        ssid=ssid,
        mode=_choice("reflector_mode", request.reflector_mode, _MODES),
        key=_key(request),
        fmt=_choice("timestamp_format", request.timestamp_format, _FORMATS),
        error_estimate=_error_estimate(request.error_estimate),
        return_segments=_sid_list("return_sid_list", request.return_sid_list) or None,
        **_tai_offset(request),
    )


def result_to_proto(result: StampResult, record_id: int = 0) -> pb.StampResult:
    """A core result record as the API carries it."""
    return pb.StampResult(
        record_id=record_id,
        ssid=result.ssid,
        seq=result.seq,
        t1_ns=result.t1_ns,
        t2_ns=result.t2_ns,
        t3_ns=result.t3_ns,
        t4_ns=result.t4_ns,
        sender_error_estimate=result.sender_error.to_int(),
        sender_error_ns=min(result.sender_error.error_ns, _U64_MAX),
        reflector_error_estimate=result.reflector_error.to_int(),
        reflector_error_ns=min(result.reflector_error.error_ns, _U64_MAX),
        ses_sender_ttl=result.ses_sender_ttl,
        reflector_seq=result.reflector_seq,
        tlvs=result.tlvs,
        loopback=result.loopback,
        flow_label=result.flow_label,
        data=None
        if result.data is None
        else pb.DataCounters(
            s_txc=result.data.s_txc,
            r_rxc=result.data.r_rxc,
            r_txc=result.data.r_txc,
            s_rxc=result.data.s_rxc,
        ),
    )


def _drops(dropped: Mapping[DropReason, int]) -> dict[str, int]:
    return {str(reason): n for reason, n in dropped.items()}


# ----------------------------------------------------------------------------- servicer


@dataclass(slots=True)
class _Runtime:
    """What Init made and Reset undoes."""

    dataplane: Dataplane
    name: str
    port: int
    source: IPAddress | None
    sender: SenderEngine | None = None
    reflector: ReflectorEngine | None = None

    def shutdown(self) -> None:
        engine = self.sender or self.reflector
        if engine is not None:
            engine.shutdown()
        self.dataplane.close()


@dataclass(slots=True)
class _SenderRecord:
    delay_mode: int
    fetched: int = 0
    #: The session's data-flow counters in the kernel (direct measurement), if any.
    counters: FlowCounters | None = None


@dataclass(slots=True)
class _Subscription:
    """One session of a StreamResults: the session it began with, and how far it got."""

    record: _SenderRecord | None
    cursor: int
    #: When its counters are due next (monotonic ns); 0: at once.
    counters_due: int = 0
    #: The loss_id of the last loss report sent (None: the request did not ask for
    #: the session's loss reports).
    loss_cursor: int | None = None

    def lost_waiting(self, engine: SenderEngine, ssid: int) -> bool:
        """Whether loss reports it asked for are queued beyond those sent."""
        return self.loss_cursor is not None and engine.lost_after(ssid, self.loss_cursor)


@dataclass(slots=True)
class _ReflectorRecord:
    config: ReflectorSessionConfig
    state: State = State.IDLE
    #: Counters of earlier runs (Stop removes the session from the core).
    reflected: int = 0
    dropped: dict[DropReason, int] = field(default_factory=dict)
    integrity_failed: int = 0
    counters: FlowCounters | None = None


class StampAgentServicer(pb_grpc.StampAgentServicer):
    """The StampAgent service of one agent; see the module docstring."""

    def __init__(
        self,
        role: Role | str,
        dataplane: str = "socket",
        *,
        fifo_capacity: int = DEFAULT_FIFO_CAPACITY,
        clock: Callable[[], int] = time.time_ns,
        max_streams: int = DEFAULT_MAX_WORKERS - RESERVED_WORKERS,
        reply_budget: int = REPLY_BUDGET_BYTES,
        realtime_priority: int | None = None,
    ) -> None:
        """``realtime_priority``: a sender's engine thread under SCHED_FIFO at this
        priority (``SenderEngine``'s; a refusal is logged and the engine runs on)."""
        if reply_budget < MIN_REPLY_BUDGET_BYTES:
            raise ValueError(
                f"reply_budget: {reply_budget} bytes, at least {MIN_REPLY_BUDGET_BYTES}"
            )
        self.role = Role(role)
        #: The largest results message sent, serialized (``sixlab.southbound.budget``).
        self.reply_budget = reply_budget
        #: Results streams open at once, at most (see RESERVED_WORKERS).
        self.max_streams = max_streams
        self._streams = 0
        self.default_dataplane = dataplane
        self._fifo_capacity = fifo_capacity
        if realtime_priority is not None and not 1 <= realtime_priority <= 99:
            raise ValueError(f"realtime_priority: {realtime_priority}, not 1-99 (SCHED_FIFO)")
        self.realtime_priority = realtime_priority
        self._clock = clock
        #: This run of the agent (GetAgentInfo.epoch): a controller that sees it change
        #: knows the agent restarted and lost its sessions, even if no call failed.
        self.epoch = secrets.randbits(64) or 1
        self.started_ns = clock()
        self._lock = threading.RLock()
        self._rt: _Runtime | None = None
        self._senders: dict[int, _SenderRecord] = {}
        self._reflectors: dict[int, _ReflectorRecord] = {}

    # -- helpers (lock held) -----------------------------------------------------------

    def _runtime(self, call: str) -> _Runtime:
        if self._rt is None:
            raise AgentError(
                Code.FAILED_PRECONDITION, f"{call}: agent not initialised (Init first)"
            )
        return self._rt

    def _sender_only(self, call: str) -> SenderEngine:
        if self.role is not Role.SENDER:
            raise AgentError(
                Code.FAILED_PRECONDITION, f"{call}: this agent is a reflector (sender only)"
            )
        engine = self._runtime(call).sender
        assert engine is not None  # a sender's runtime always has one
        return engine

    def _known(self, ssid: int) -> int:
        _ssid(ssid)
        if ssid not in self._senders and ssid not in self._reflectors:
            raise AgentError(Code.NOT_FOUND, f"ssid: no session {ssid}")
        return ssid

    def _reflector_counts(
        self, ssid: int, rec: _ReflectorRecord
    ) -> tuple[int, dict[str, int], int]:
        """(replies, drops by reason, HMAC TLV failures) of all runs of a session."""
        reflected, dropped, integrity = rec.reflected, dict(rec.dropped), rec.integrity_failed
        rt = self._rt
        if rec.state is State.RUNNING and rt is not None and rt.reflector is not None:
            with rt.reflector.lock:
                live, live_dropped = rt.reflector.reflector.session_counters(ssid)
                integrity += rt.reflector.reflector.session_integrity_failed(ssid)
            reflected += live
            for reason, n in live_dropped.items():
                dropped[reason] = dropped.get(reason, 0) + n
        return reflected, _drops(dropped), integrity

    # -- agent ------------------------------------------------------------------------

    @_unary
    def GetAgentInfo(self, request: pb.GetAgentInfoRequest) -> pb.GetAgentInfoReply:  # noqa: N802
        rt = self._rt
        engine = None if rt is None else rt.sender or rt.reflector
        error = None if engine is None else engine.error
        reply = pb.GetAgentInfoReply(
            role=_ROLE_PB[self.role],
            default_dataplane=self.default_dataplane,
            available_dataplanes=available(),
            initialized=rt is not None,
            dataplane="" if rt is None else rt.name,
            port=0 if rt is None else rt.port,
            engine_error="" if error is None else repr(error),
            epoch=self.epoch,
            started_ns=self.started_ns,
        )
        return info_sessions(reply, request, sorted([*self._senders, *self._reflectors]))

    @_unary
    def Init(self, request: pb.InitRequest) -> pb.InitReply:  # noqa: N802
        if self._rt is not None:
            raise AgentError(
                Code.FAILED_PRECONDITION,
                f"init: already initialised on port {self._rt.port} (Reset first)",
            )
        name = request.dataplane or self.default_dataplane
        if name not in available():
            raise _invalid(
                f"dataplane: unknown data plane {name!r} (available: {', '.join(available())})"
            )
        if request.HasField("port"):
            port = _port("port", request.port)
        else:
            port = wire.STAMP_PORT if self.role is Role.REFLECTOR else 0
        if len(request.interface) > MAX_IFNAME or "/" in request.interface:
            raise _invalid(f"interface: {request.interface!r} is not an interface name")
        source = (
            _address("source_address", request.source_address) if request.source_address else None
        )
        config = DataplaneConfig(port=port, interface=request.interface or None, source=source)
        config = dataclasses.replace(config, **_dataplane_options(request.dataplane_options))
        dataplane = create(name, config)
        dataplane.open()
        try:
            bound = dataplane.local_port
            rt = _Runtime(dataplane, name, bound, source)
            if self.role is Role.SENDER:
                rt.sender = SenderEngine(
                    dataplane,
                    self._clock,
                    self._fifo_capacity,
                    realtime_priority=self.realtime_priority,
                )
                rt.sender.start()
                if rt.sender.realtime_error is not None:
                    log.warning(
                        "sender engine: %s; it runs unprioritized", rt.sender.realtime_error
                    )
            else:
                rt.reflector = ReflectorEngine(dataplane, Reflector(), self._clock)
                rt.reflector.start()
        except BaseException:
            dataplane.close()
            raise
        self._rt = rt
        return pb.InitReply(port=bound, dataplane=name)

    @_unary
    def Reset(self, _request: pb.ResetRequest) -> pb.ResetReply:  # noqa: N802
        return pb.ResetReply(sessions_destroyed=self.reset())

    def reset(self) -> int:
        """Destroy every session and close the data plane; the number of sessions."""
        with self._lock:
            rt, self._rt = self._rt, None
            count = len(self._senders) + len(self._reflectors)
            if rt is not None and rt.sender is not None:
                for ssid in rt.sender.sessions():
                    rt.sender.remove_session(ssid)  # wakes the streams, which then end
            records: list[_SenderRecord | _ReflectorRecord] = [
                *self._senders.values(),
                *self._reflectors.values(),
            ]
            self._senders.clear()
            self._reflectors.clear()
            if rt is not None:
                rt.shutdown()
            for rec in records:
                if rec.counters is not None:
                    rec.counters.remove()
            return count

    # -- sessions ---------------------------------------------------------------------

    @_unary
    def CreateStampSession(  # noqa: N802
        self, request: pb.CreateStampSessionRequest
    ) -> pb.CreateStampSessionReply:
        self._create(request)
        return pb.CreateStampSessionReply()

    @_unary
    def CreateStampSessions(self, request: pb.CreateStampSessionsRequest) -> pb.BatchReply:  # noqa: N802
        return batch_reply(each(_status_of, request.sessions, self._create))

    def _create(self, request: pb.CreateStampSessionRequest) -> None:
        rt = self._runtime("CreateStampSession")
        ssid = _ssid(request.ssid)
        if ssid in self._senders or ssid in self._reflectors:
            raise AgentError(Code.ALREADY_EXISTS, f"ssid: session {ssid} already exists")
        sent, received = _direct(request)
        if rt.sender is not None:
            spec, delay_mode = _sender_spec(request, rt.port, rt.source)
            counters = self._counters(ssid, sent, received)
            if counters is not None:
                spec = dataclasses.replace(spec, data_counters=counters.read)
            try:
                rt.sender.add_session(spec)
            except BaseException:
                if counters is not None:
                    counters.remove()
                raise
            self._senders[ssid] = _SenderRecord(delay_mode, counters=counters)
        else:
            config = _reflector_config(request, rt.port)
            counters = self._counters(ssid, sent, received)
            self._reflectors[ssid] = _ReflectorRecord(config, counters=counters)

    def _counters(
        self, ssid: int, sent: FlowMatch | None, received: FlowMatch | None
    ) -> FlowCounters | None:
        """Install the session's data-flow counters (direct measurement), or None."""
        if sent is None and received is None:
            return None
        counters = FlowCounters(f"sixlab_dm_{self.role}_{ssid}", tx=sent, rx=received)
        counters.install()
        return counters

    @_unary
    def StartStampSession(  # noqa: N802
        self, request: pb.StartStampSessionRequest
    ) -> pb.StartStampSessionReply:
        self._start(request)
        return pb.StartStampSessionReply()

    @_unary
    def StartStampSessions(self, request: pb.StartStampSessionsRequest) -> pb.BatchReply:  # noqa: N802
        return batch_reply(each(_status_of, request.sessions, self._start))

    def _start(self, request: pb.StartStampSessionRequest) -> None:
        rt = self._runtime("StartStampSession")
        ssid = self._known(request.ssid)
        if rt.sender is not None:
            rt.sender.start_session(ssid)
        else:
            assert rt.reflector is not None
            rec = self._reflectors[ssid]
            if rec.state is State.RUNNING:
                raise AgentError(Code.FAILED_PRECONDITION, f"ssid: session {ssid} already running")
            source = rec.counters.read if rec.counters is not None else None
            rt.reflector.add_session(rec.config, data_counters=source)
            rec.state = State.RUNNING

    @_unary
    def StopStampSession(  # noqa: N802
        self, request: pb.StopStampSessionRequest
    ) -> pb.StopStampSessionReply:
        rt = self._runtime("StopStampSession")
        ssid = self._known(request.ssid)
        if rt.sender is not None:
            rt.sender.stop_session(ssid)
        else:
            rec = self._reflectors[ssid]
            if rec.state is not State.RUNNING:
                raise AgentError(Code.FAILED_PRECONDITION, f"ssid: session {ssid} is not running")
            self._stop_reflector(rt, ssid, rec)
        return pb.StopStampSessionReply()

    def _stop_reflector(self, rt: _Runtime, ssid: int, rec: _ReflectorRecord) -> None:
        assert rt.reflector is not None
        with rt.reflector.lock:
            rec.integrity_failed += rt.reflector.reflector.session_integrity_failed(ssid)
        reflected, dropped = rt.reflector.remove_session(ssid)
        rec.reflected += reflected
        for reason, n in dropped.items():
            rec.dropped[reason] = rec.dropped.get(reason, 0) + n
        rec.state = State.FINISHED

    @_unary
    def DestroyStampSession(  # noqa: N802
        self, request: pb.DestroyStampSessionRequest
    ) -> pb.DestroyStampSessionReply:
        rt = self._runtime("DestroyStampSession")
        ssid = self._known(request.ssid)
        record: _SenderRecord | _ReflectorRecord
        if rt.sender is not None:
            rt.sender.remove_session(ssid)
            record = self._senders.pop(ssid)
        else:
            record = self._reflectors[ssid]
            if record.state is State.RUNNING:
                self._stop_reflector(rt, ssid, record)
            del self._reflectors[ssid]
        if record.counters is not None:
            record.counters.remove()
        return pb.DestroyStampSessionReply()

    # -- results ----------------------------------------------------------------------

    @_unary
    def GetStampSessionResults(  # noqa: N802
        self, request: pb.GetStampSessionResultsRequest
    ) -> pb.GetStampSessionResultsReply:
        engine = self._sender_only("GetStampSessionResults")
        ssid = self._known(request.ssid)
        limit = request.max_results or DEFAULT_RESULTS
        if limit > MAX_RESULTS:
            raise _invalid(f"max_results: {limit}, at most {MAX_RESULTS}")
        drain = not request.HasField("after_id")
        budget = asked_budget(self.reply_budget, request.max_bytes)
        # The state before the records: no record comes after FINISHED.
        snap = engine.snapshot(ssid)
        reply = pb.GetStampSessionResultsReply(
            overflow=snap.overflow,
            state=_STATE_PB[snap.state],
            remaining=_U64_MAX,  # counted at its largest until known
            counters=self._session_counters(ssid),
        )
        room = lost_fitting(reply.ByteSize(), budget)
        if request.HasField("after_loss_id"):
            # Cursor mode for loss reports: removed only once acknowledged.
            engine.acknowledge_lost(ssid, request.after_loss_id)
            reply.lost.extend(
                pb.LostPacket(seq=p.seq, t1_ns=p.t1_ns, loss_id=i)
                for i, p in engine.peek_lost(ssid, request.after_loss_id, room)
            )
        else:
            reply.lost.extend(
                pb.LostPacket(seq=p.seq, t1_ns=p.t1_ns) for p in engine.lost(ssid, room)
            )
        if drain:
            items = engine.peek(ssid, 0, limit)
        else:
            items = engine.fetch(ssid, request.after_id, limit)
        protos, _ = fit(
            (result_to_proto(r, 0 if drain else i) for i, r in items), reply.ByteSize(), budget
        )
        if drain and protos:
            engine.acknowledge(ssid, items[len(protos) - 1][0])
        reply.results.extend(protos)
        if drain:
            reply.remaining = engine.snapshot(ssid).fifo_len
        else:
            # What comes after this reply's last record (the ones it carries stay
            # queued until acknowledged): the ids in the FIFO are consecutive.
            last = engine.last_id(ssid)
            before_first = last - engine.snapshot(ssid).fifo_len
            sent = protos[-1].record_id if protos else request.after_id
            reply.remaining = max(0, last - max(sent, before_first))
        self._senders[ssid].fetched += len(protos)
        return reply

    @_unary
    def AcknowledgeStampSessionResults(  # noqa: N802
        self, request: pb.AcknowledgeStampSessionResultsRequest
    ) -> pb.AcknowledgeStampSessionResultsReply:
        engine = self._sender_only("AcknowledgeStampSessionResults")
        ssid = self._known(request.ssid)
        n = engine.acknowledge(ssid, request.through_id)
        lost = engine.acknowledge_lost(ssid, request.through_loss_id)
        return pb.AcknowledgeStampSessionResultsReply(acknowledged=n, acknowledged_lost=lost)

    def StreamStampSessionResults(  # noqa: N802
        self, request: pb.StreamStampSessionResultsRequest, context: Any
    ) -> Iterator[pb.ResultBatch]:
        try:
            with self._stream_slot():
                yield from self._stream(request, context)
        except Exception as exc:
            abort_for(exc, context, _status_of)
            raise

    @contextlib.contextmanager
    def _stream_slot(self) -> Iterator[None]:
        """Count an open results stream; refuse one beyond ``max_streams``."""
        with self._lock:
            if self._streams >= self.max_streams:
                raise AgentError(
                    Code.RESOURCE_EXHAUSTED,
                    f"stream: {self._streams} results streams open, at most {self.max_streams}"
                    " (StreamResults carries many sessions on one)",
                )
            self._streams += 1
        try:
            yield
        finally:
            with self._lock:
                self._streams -= 1

    def _stream(
        self, request: pb.StreamStampSessionResultsRequest, context: Any
    ) -> Iterator[pb.ResultBatch]:
        with self._lock:
            engine = self._sender_only("StreamStampSessionResults")
            ssid = self._known(request.ssid)
            record = self._senders[ssid]
        max_batch = request.max_batch or DEFAULT_BATCH
        if max_batch > MAX_BATCH:
            raise _invalid(f"max_batch: {max_batch}, at most {MAX_BATCH}")
        window_ns = request.batch_window_ns or DEFAULT_BATCH_WINDOW_NS
        if window_ns > MAX_BATCH_WINDOW_NS:
            raise _invalid(f"batch_window_ns: {window_ns}, at most {MAX_BATCH_WINDOW_NS}")
        drain = not request.HasField("after_id")
        # Drain mode reads like cursor mode from the first queued record, and removes
        # what each batch carried as it is sent.
        cursor = 0 if drain else request.after_id
        loss_cursor = request.after_loss_id if request.HasField("after_loss_id") else None
        while context.is_active():
            try:
                items = engine.peek(ssid, cursor, max_batch, _STREAM_POLL_S)
                deadline = time.monotonic() + window_ns / NS_PER_S
                while items and len(items) < max_batch:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not context.is_active():
                        break
                    more = engine.peek(ssid, items[-1][0], max_batch - len(items), remaining)
                    if not more:
                        break
                    items.extend(more)
                batch, cursor, loss_cursor, final = self._stream_batch(
                    engine, record, ssid, items, cursor, loss_cursor=loss_cursor, drain=drain
                )
            except SessionConfigError:
                raise _destroyed(ssid) from None
            if batch is not None:
                yield batch
            if final:
                return

    def _stream_batch(
        self,
        engine: SenderEngine,
        record: _SenderRecord,
        ssid: int,
        items: list[tuple[int, StampResult]],
        cursor: int,
        *,
        loss_cursor: int | None,
        drain: bool,
    ) -> tuple[pb.ResultBatch | None, int, int | None, bool]:
        """The next StreamStampSessionResults batch: the loss reports and the leading
        ``items`` within the byte budget (None if it has nothing to say); the cursor
        and the loss cursor (None: the reports are drained) after it; whether it is the
        session's last."""
        snap = engine.snapshot(ssid)  # before what is waiting: no record after FINISHED
        with self._lock:
            if self._senders.get(ssid) is not record:
                raise _destroyed(ssid)
            counters = self._session_counters(ssid)
        batch = pb.ResultBatch(
            ssid=ssid,
            overflow=snap.overflow,
            state=_STATE_PB[snap.state],
            final=True,  # counted at its largest until known
            counters=counters,
        )
        room = lost_fitting(batch.ByteSize(), self.reply_budget)
        if loss_cursor is None:
            lost = engine.lost(ssid, room)
            batch.lost.extend(pb.LostPacket(seq=p.seq, t1_ns=p.t1_ns) for p in lost)
            lost_pending = room > 0 and len(lost) == room
        else:
            reports = engine.peek_lost(ssid, loss_cursor, room)
            batch.lost.extend(
                pb.LostPacket(seq=p.seq, t1_ns=p.t1_ns, loss_id=i) for i, p in reports
            )
            loss_cursor = reports[-1][0] if reports else loss_cursor
            lost_pending = engine.lost_after(ssid, loss_cursor)
        protos, _ = fit(
            (result_to_proto(r, 0 if drain else i) for i, r in items),
            batch.ByteSize(),
            self.reply_budget,
        )
        if protos:
            cursor = items[len(protos) - 1][0]
            if drain:
                engine.acknowledge(ssid, cursor)
        pending = bool(engine.peek(ssid, cursor, 1)) or lost_pending
        with self._lock:
            if self._senders.get(ssid) is not record:
                raise _destroyed(ssid)
            record.fetched += len(protos)
        final = snap.state is State.FINISHED and not pending
        if not (protos or batch.lost or final):
            return None, cursor, loss_cursor, False
        batch.final = final
        batch.results.extend(protos)
        return batch, cursor, loss_cursor, final

    def StreamResults(  # noqa: N802
        self, request: pb.StreamResultsRequest, context: Any
    ) -> Iterator[pb.ResultBatches]:
        try:
            with self._stream_slot():
                yield from self._stream_many(request, context)
        except Exception as exc:
            abort_for(exc, context, _status_of)
            raise

    def _stream_many(
        self, request: pb.StreamResultsRequest, context: Any
    ) -> Iterator[pb.ResultBatches]:
        with self._lock:
            engine = self._sender_only("StreamResults")
            subs = {
                _ssid(ssid): _Subscription(
                    self._senders.get(ssid), after, loss_cursor=request.after_loss_ids.get(ssid)
                )
                for ssid, after in request.after_ids.items()
            }
        max_batch = request.max_batch or DEFAULT_BATCH
        if max_batch > MAX_BATCH:
            raise _invalid(f"max_batch: {max_batch}, at most {MAX_BATCH}")
        window_ns = request.batch_window_ns or DEFAULT_BATCH_WINDOW_NS
        if window_ns > MAX_BATCH_WINDOW_NS:
            raise _invalid(f"batch_window_ns: {window_ns}, at most {MAX_BATCH_WINDOW_NS}")
        every_ns = request.counters_interval_ns or DEFAULT_COUNTERS_INTERVAL_NS
        if every_ns > MAX_COUNTERS_INTERVAL_NS:
            raise _invalid(f"counters_interval_ns: {every_ns}, at most {MAX_COUNTERS_INTERVAL_NS}")
        ended = threading.Event()
        context.add_callback(ended.set)
        version, more = -1, True
        while subs and context.is_active():
            if not more:
                # Sleep until a record or loss report comes (or the next counters are
                # due), then let the batch window gather more.
                due = min(sub.counters_due for sub in subs.values())
                wait = min(_STREAM_POLL_S, max(0.0, (due - time.monotonic_ns()) / NS_PER_S))
                seen, version = version, engine.wait_change(version, wait)
                if seen != version and ended.wait(window_ns / NS_PER_S):
                    return
            batches, more = self._cut(engine, subs, max_batch, every_ns)
            if batches:
                yield pb.ResultBatches(batches=batches)

    def _cut(
        self, engine: SenderEngine, subs: dict[int, _Subscription], max_batch: int, every_ns: int
    ) -> tuple[list[pb.ResultBatch], bool]:
        """One message of StreamResults: a batch for each session with news or counters
        due; whether records are still waiting (the next message need not wait)."""
        now = time.monotonic_ns()
        out = Batches(self.reply_budget)
        more = False
        served: list[int] = []
        with self._lock:
            for ssid, sub in list(subs.items()):
                record = self._senders.get(ssid)
                if record is None or record is not sub.record:
                    if not out.add(pb.ResultBatch(ssid=ssid, gone=True)):
                        more = True
                        break
                    del subs[ssid]
                    continue
                due = now >= sub.counters_due
                batch, size, cut = self._session_batch(
                    engine, ssid, sub, record, max_batch=max_batch, due=due, room=out.room()
                )
                if batch is None:
                    continue
                if cut is None:  # not even its head fits: the budget is spent
                    more = True
                    break
                out.add(batch, size)  # it fits: its records were cut to the room
                served.append(ssid)
                if due or batch.final:
                    sub.counters_due = now + every_ns
                more = more or (
                    not batch.final
                    and (engine.last_id(ssid) > sub.cursor or sub.lost_waiting(engine, ssid))
                )
                if batch.final:
                    del subs[ssid]
                if cut:
                    more = True
                    break
            Batches.to_back(subs, served)
        return out.batches, more

    def _session_batch(
        self,
        engine: SenderEngine,
        ssid: int,
        sub: _Subscription,
        record: _SenderRecord,
        *,
        max_batch: int,
        due: bool,
        room: int,
    ) -> tuple[pb.ResultBatch | None, int, bool | None]:
        """A session's batch for a StreamResults message, at most ``room`` bytes (lock
        held): None if the session has nothing to say; its serialized size; and whether
        the budget cut its records short (None: not even the batch's head fits, nothing
        was taken)."""
        snap = engine.snapshot(ssid)
        last = engine.last_id(ssid)  # after the state: no record comes after FINISHED
        finished = snap.state is State.FINISHED
        if last <= sub.cursor and not due and not finished and not sub.lost_waiting(engine, ssid):
            return None, 0, False
        batch = pb.ResultBatch(
            ssid=ssid,
            overflow=snap.overflow,
            state=_STATE_PB[snap.state],
            final=finished,  # counted at its largest until known
        )
        if due or finished:
            batch.counters.CopyFrom(self._session_counters(ssid))
        head = batch.ByteSize()
        if head > room:
            return batch, head, None
        if sub.loss_cursor is not None:
            # Left queued until acknowledged (AcknowledgeResults.through_loss_ids).
            lost = engine.peek_lost(ssid, sub.loss_cursor, lost_fitting(head, room))
            if lost:
                batch.lost.extend(
                    pb.LostPacket(seq=p.seq, t1_ns=p.t1_ns, loss_id=i) for i, p in lost
                )
                sub.loss_cursor = lost[-1][0]
                head = batch.ByteSize()
        items = engine.peek(ssid, sub.cursor, max_batch)
        protos, size = fit((result_to_proto(r, i) for i, r in items), head, room)
        if protos:
            sub.cursor = protos[-1].record_id
            record.fetched += len(protos)
        batch.final = finished and last <= sub.cursor and not sub.lost_waiting(engine, ssid)
        if not (due or batch.final):
            batch.ClearField("counters")
        size += batch.ByteSize() - head  # the head as sent; its records are not encoded twice
        batch.results.extend(protos)
        return batch, size, len(protos) < len(items)

    @_unary
    def AcknowledgeResults(  # noqa: N802
        self, request: pb.AcknowledgeResultsRequest
    ) -> pb.AcknowledgeResultsReply:
        engine = self._sender_only("AcknowledgeResults")
        done = {
            ssid: engine.acknowledge(ssid, through)
            for ssid, through in request.through_ids.items()
            if _ssid(ssid) in self._senders
        }
        lost = {
            ssid: engine.acknowledge_lost(ssid, through)
            for ssid, through in request.through_loss_ids.items()
            if _ssid(ssid) in self._senders
        }
        if request.without_counts:
            return pb.AcknowledgeResultsReply()
        return pb.AcknowledgeResultsReply(acknowledged=done, acknowledged_lost=lost)

    # -- counters ---------------------------------------------------------------------

    @_unary
    def GetCounters(self, request: pb.GetCountersRequest) -> pb.GetCountersReply:  # noqa: N802
        if request.HasField("ssid"):
            ssids = [self._known(request.ssid)]
        else:
            ssids = sorted([*self._senders, *self._reflectors])
        reply = pb.GetCountersReply(role=_ROLE_PB[self.role])
        rt = self._rt
        engine = None if rt is None else rt.sender or rt.reflector
        if engine is not None:
            with engine.lock:
                c = engine.counters
                reply.engine.CopyFrom(
                    pb.EngineCounters(
                        received=c.received,
                        no_session=c.no_session,
                        send_failed=c.send_failed,
                        data_counter_failed=c.data_counter_failed,
                        truncated=c.truncated,
                    )
                )
        if self.role is Role.REFLECTOR:
            reply.reflector.SetInParent()
            if rt is not None and rt.reflector is not None:
                with rt.reflector.lock:
                    rc = rt.reflector.reflector.counters
                    reply.reflector.received = rc.received
                    reply.reflector.reflected = rc.reflected
                    reply.reflector.dropped.update(_drops(rc.dropped))
        if rt is not None:
            reply.dataplane.update(rt.dataplane.counters())
        for ssid in ssids:
            reply.sessions.append(self._session_counters(ssid))
        return reply

    def _dataplane_counters(self, ssid: int) -> dict[str, int]:
        rt = self._rt
        return {} if rt is None else rt.dataplane.session_counters(ssid)

    def _session_counters(self, ssid: int) -> pb.SessionCounters:
        rt = self._rt
        if ssid in self._senders:
            assert rt is not None  # sessions live between Init and Reset
            assert rt.sender is not None
            snap = rt.sender.snapshot(ssid)
            c = snap.counters
            out = pb.SessionCounters(
                ssid=ssid,
                state=_STATE_PB[snap.state],
                sent=c.sent,
                received=c.received,
                lost=c.lost,
                duplicates=c.duplicates,
                reordered=c.reordered,
                dropped=_drops(c.dropped),
                queued=snap.fifo_len,
                overflow=snap.overflow,
                fetched=self._senders[ssid].fetched,
                schedule_skipped=snap.schedule.skipped,
                schedule_late_ns_total=snap.schedule.late_ns_total,
                schedule_late_ns_max=snap.schedule.late_ns_max,
            )
            if c.forward_lost is not None:
                out.forward_lost = c.forward_lost
            if c.unclassified_lost is not None:
                out.unclassified_lost = c.unclassified_lost
            out.ssid_zero = c.ssid_zero
            out.integrity_failed = c.integrity_reported
            out.dataplane.update(self._dataplane_counters(ssid))
            return out
        rec = self._reflectors[ssid]
        reflected, dropped, integrity = self._reflector_counts(ssid, rec)
        return pb.SessionCounters(
            ssid=ssid,
            state=_STATE_PB[rec.state],
            reflected=reflected,
            dropped=dropped,
            integrity_failed=integrity,
            dataplane=self._dataplane_counters(ssid),
        )


# ------------------------------------------------------------------------------ server


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for a TLS server: its certificate chain and key; ``ca`` turns on mTLS.

    With ``ca`` the server requires a client certificate signed by it (mutual TLS).
    """

    cert: Path
    key: Path
    ca: Path | None = None

    def credentials(self) -> Any:
        try:
            chain = Path(self.cert).read_bytes()
            key = Path(self.key).read_bytes()
            ca = Path(self.ca).read_bytes() if self.ca is not None else None
        except OSError as exc:
            raise ValueError(f"tls: cannot read {exc.filename}: {exc.strerror}") from exc
        return grpc.ssl_server_credentials(
            [(key, chain)], root_certificates=ca, require_client_auth=ca is not None
        )


class AgentServer:
    """A running agent: its gRPC server and servicer. ``stop`` also Resets the agent."""

    def __init__(self, server: Any, servicer: StampAgentServicer, port: int) -> None:
        self.server = server
        self.servicer = servicer
        #: The TCP port gRPC listens on (0 for a unix: address).
        self.port = port

    def stop(self, grace: float | None = 1.0) -> None:
        self.server.stop(grace).wait()
        self.servicer.reset()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops; False if ``timeout`` passed first."""
        return bool(self.server.wait_for_termination(timeout))

    def __enter__(self) -> AgentServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    address: str,
    role: Role | str,
    dataplane: str = "socket",
    *,
    tls: TlsFiles | None = None,
    max_workers: int = DEFAULT_MAX_WORKERS,
    fifo_capacity: int = DEFAULT_FIFO_CAPACITY,
    reply_budget: int = REPLY_BUDGET_BYTES,
    realtime_priority: int | None = None,
) -> AgentServer:
    """Start an agent serving gRPC on ``address`` (``"[::1]:50051"``, ``"unix:/path"``).

    Port 0 picks a free port (``AgentServer.port``). A unix socket left by a killed
    agent is replaced; one a live server answers on is refused with ``OSError``
    (:func:`~sixlab.southbound.rpcserver.claim_unix_address`). Returns once the server
    accepts calls; the agent is not initialised until a client calls Init.
    ``reply_budget``: the largest results message it sends (``sixlab.southbound.budget``).
    ``realtime_priority``: a sender's engine thread under SCHED_FIFO at this priority.
    """
    if dataplane not in available():
        raise ValueError(
            f"dataplane: unknown data plane {dataplane!r} (available: {', '.join(available())})"
        )
    claim_unix_address(address)
    servicer = StampAgentServicer(
        role,
        dataplane,
        fifo_capacity=fifo_capacity,
        max_streams=max(1, max_workers - RESERVED_WORKERS),
        reply_budget=reply_budget,
        realtime_priority=realtime_priority,
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="stamp-agent"),
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ],
    )
    pb_grpc.add_StampAgentServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    try:
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, tls.credentials())
    except RuntimeError as exc:
        server.stop(None)
        raise OSError(f"grpc: cannot listen on {address}: {exc}") from exc
    server.start()
    return AgentServer(server, servicer, int(port))
