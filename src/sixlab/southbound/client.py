"""A typed client for the STAMP agent's gRPC API (``stamp.proto``), for the controller.

Every method is one RPC with a deadline. A refused call raises ``SouthboundError``
carrying the gRPC status code and the agent's message (which names the field)::

    with AgentClient("[::1]:50051") as sender:
        port = sender.init(port=0)
        sender.create_sender_session(SenderSession(7, "2001:db8::2", sid_list=[...],
                                                   count=50, interval_ns=5_000_000))
        sender.start_session(7)
        for batch in sender.stream_results(7):
            for record in batch.results:
                print(result_from_proto(record).rtt_ns)

A session is described once, by ``SenderSession`` or ``ReflectorSession`` (the
controller builds its requests from the same classes). Addresses may be given as text or
``ipaddress.IPv6Address``; times are integer ns.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import grpc

from sixlab.southbound._generated import stamp_pb2 as pb
from sixlab.southbound._generated import stamp_pb2_grpc as pb_grpc
from sixlab.southbound.budget import RECEIVE_LIMIT_BYTES
from sixlab.southbound.rpcclient import GrpcClient, RpcError
from sixlab.stamp import DataCounters, StampResult
from sixlab.wire.timestamp import ErrorEstimate

__all__ = [
    "PIPELINE_WINDOW",
    "AgentClient",
    "ClientTls",
    "ReflectorSession",
    "ResultStream",
    "SenderSession",
    "SouthboundError",
    "result_from_proto",
]

Address = str | ipaddress.IPv6Address
#: Deadline of one unary call (s): an agent answers in milliseconds; a stuck one fails.
DEFAULT_TIMEOUT_S = 10.0
#: Calls in flight at once in ``AgentClient.call_many``.
PIPELINE_WINDOW = 256


class SouthboundError(RpcError):
    """An agent refused a call (or could not be reached); ``code`` is the gRPC status."""


@dataclass(frozen=True, slots=True)
class ClientTls:
    """PEM files: ``ca`` to verify the agent; ``cert`` and ``key`` for mTLS.

    ``server_name`` overrides the name checked against the agent's certificate (e.g. when
    dialling an IP address with a certificate issued to a name).
    """

    ca: Path
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None

    def credentials(self) -> Any:
        return grpc.ssl_channel_credentials(
            root_certificates=Path(self.ca).read_bytes(),
            private_key=Path(self.key).read_bytes() if self.key else None,
            certificate_chain=Path(self.cert).read_bytes() if self.cert else None,
        )


@functools.lru_cache(maxsize=1024)
def _error_estimate(value: int) -> ErrorEstimate:
    """Decoded Error Estimates, cached: a session's estimate rarely changes, and a
    controller decodes two per record at tens of thousands of records per second."""
    return ErrorEstimate.from_int(value)


def result_from_proto(record: pb.StampResult) -> StampResult:
    """An API record as the core's ``StampResult`` (with its delay properties)."""
    # Positional arguments, in StampResult's field order: a controller converts tens of
    # thousands of records a second.
    return StampResult(
        record.ssid,
        record.seq,
        record.t1_ns,
        record.t2_ns,
        record.t3_ns,
        record.t4_ns,
        _error_estimate(record.sender_error_estimate),
        _error_estimate(record.reflector_error_estimate),
        record.ses_sender_ttl,
        record.reflector_seq,
        record.tlvs,
        record.flow_label if record.HasField("flow_label") else None,
        record.loopback,
        DataCounters(
            record.data.s_txc,
            record.data.r_rxc,
            record.data.r_txc,
            record.data.s_rxc if record.data.HasField("s_rxc") else None,
        )
        if record.HasField("data")
        else None,
    )


_M = TypeVar("_M")


class ResultStream(Generic[_M]):
    """The messages of a results stream; iterate, or ``cancel`` to end early."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def __iter__(self) -> Iterator[_M]:
        try:
            yield from self._call
        except grpc.RpcError as exc:
            if exc.code() is grpc.StatusCode.CANCELLED:
                return
            raise SouthboundError.from_rpc(exc) from None

    def cancel(self) -> None:
        self._call.cancel()


def _texts(addresses: Iterable[Address]) -> list[str]:
    return [str(a) for a in addresses]


@dataclass(frozen=True, slots=True)
class SenderSession:
    """A Session-Sender session, as CreateStampSession carries it (``request``).

    ``key`` set: authenticated mode. ``return_sid_list`` non-empty asks the reflector for
    that return path with an RFC 9503 Return Path TLV. ``loopback``, ``flow_labels`` and
    ``direct_measurement``: the SR performance-measurement modes (docs/srpm.md); a
    loopback session's ``reflector`` may be ``""`` (the agent's own address).
    """

    ssid: int
    reflector: Address
    _: KW_ONLY
    sid_list: Iterable[Address] = ()
    interval_ns: int = 1_000_000_000
    count: int = 0
    duration_ns: int = 0
    source: Address | None = None
    reflector_port: int = 0
    sender_port: int = 0
    key: bytes | None = None
    ptp: bool = False
    one_way: bool = False
    stateful_reflector: bool = False
    tlvs: bytes = b""
    return_sid_list: Iterable[Address] = ()
    loss_timeout_ns: int = 0
    error_estimate: int = 0
    tai_utc_offset_ns: int | None = None
    strict_ssid: bool = False
    loopback: bool = False
    flow_labels: Iterable[int] = ()
    direct_measurement: pb.DirectMeasurement | None = None

    def request(self) -> pb.CreateStampSessionRequest:
        """The CreateStampSession request of this session."""
        returns = _texts(self.return_sid_list)
        request = pb.CreateStampSessionRequest(
            ssid=self.ssid,
            reflector_address=str(self.reflector),
            sid_list=_texts(self.sid_list),
            interval_ns=self.interval_ns,
            count=self.count,
            duration_ns=self.duration_ns,
            source_address="" if self.source is None else str(self.source),
            reflector_udp_port=self.reflector_port,
            sender_udp_port=self.sender_port,
            auth_mode=_auth_mode(self.key),
            key=self.key or b"",
            timestamp_format=_timestamp_format(self.ptp),
            delay_mode=pb.DELAY_MODE_ONE_WAY if self.one_way else pb.DELAY_MODE_TWO_WAY,
            reflector_mode=_reflector_mode(self.stateful_reflector),
            tlvs=self.tlvs,
            return_sid_list=returns,
            request_return_path=bool(returns),
            loss_timeout_ns=self.loss_timeout_ns,
            error_estimate=self.error_estimate,
            strict_ssid=self.strict_ssid,
            loopback=self.loopback,
            flow_labels=list(self.flow_labels),
        )
        return _finish(request, self.direct_measurement, self.tai_utc_offset_ns)


@dataclass(frozen=True, slots=True)
class ReflectorSession:
    """A Session-Reflector session, as CreateStampSession carries it (``request``);
    ``return_sid_list`` is its return path."""

    ssid: int
    _: KW_ONLY
    stateful: bool = False
    key: bytes | None = None
    ptp: bool = False
    return_sid_list: Iterable[Address] = ()
    error_estimate: int = 0
    tai_utc_offset_ns: int | None = None
    direct_measurement: pb.DirectMeasurement | None = None

    def request(self) -> pb.CreateStampSessionRequest:
        """The CreateStampSession request of this session."""
        request = pb.CreateStampSessionRequest(
            ssid=self.ssid,
            reflector_mode=_reflector_mode(self.stateful),
            auth_mode=_auth_mode(self.key),
            key=self.key or b"",
            timestamp_format=_timestamp_format(self.ptp),
            return_sid_list=_texts(self.return_sid_list),
            error_estimate=self.error_estimate,
        )
        return _finish(request, self.direct_measurement, self.tai_utc_offset_ns)


def _auth_mode(key: bytes | None) -> pb.AuthMode.ValueType:
    return pb.AUTH_MODE_AUTHENTICATED if key is not None else pb.AUTH_MODE_UNAUTHENTICATED


def _timestamp_format(ptp: bool) -> pb.TimestampFormat.ValueType:
    return pb.TIMESTAMP_FORMAT_PTP if ptp else pb.TIMESTAMP_FORMAT_NTP


def _reflector_mode(stateful: bool) -> pb.ReflectorMode.ValueType:
    return pb.REFLECTOR_MODE_STATEFUL if stateful else pb.REFLECTOR_MODE_STATELESS


def _finish(
    request: pb.CreateStampSessionRequest,
    direct_measurement: pb.DirectMeasurement | None,
    tai_utc_offset_ns: int | None,
) -> pb.CreateStampSessionRequest:
    """``request`` with the two fields a constructor cannot set (a message, an
    ``optional``) when they are given."""
    if direct_measurement is not None:
        request.direct_measurement.CopyFrom(direct_measurement)
    if tai_utc_offset_ns is not None:
        request.tai_utc_offset_ns = tai_utc_offset_ns
    return request


class AgentClient(GrpcClient):
    """One agent, over one gRPC channel (plain, TLS, or mTLS)."""

    error = SouthboundError
    peer = "agent"

    def __init__(
        self,
        target: str,
        *,
        tls: ClientTls | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        # The agent's results messages stay within its byte budget, below this limit
        # (sixlab.southbound.budget); stated rather than left to gRPC's default.
        options: list[tuple[str, Any]] = [("grpc.max_receive_message_length", RECEIVE_LIMIT_BYTES)]
        if tls is None:
            channel = grpc.insecure_channel(target, options=options)
        else:
            if tls.server_name:
                options.append(("grpc.ssl_target_name_override", tls.server_name))
            channel = grpc.secure_channel(target, tls.credentials(), options=options)
        super().__init__(target, channel, timeout)
        self._stub = pb_grpc.StampAgentStub(self._channel)  # type: ignore[no-untyped-call]

    # -- agent ------------------------------------------------------------------------

    def info(self, timeout: float | None = None) -> pb.GetAgentInfoReply:
        """Role, state and run (``epoch``) of the agent; ``timeout`` overrides the deadline."""
        try:
            reply: pb.GetAgentInfoReply = self._stub.GetAgentInfo(
                pb.GetAgentInfoRequest(), timeout=self.timeout if timeout is None else timeout
            )
        except grpc.RpcError as exc:
            raise SouthboundError.from_rpc(exc) from None
        return reply

    def init(
        self,
        *,
        port: int | None = None,
        interface: str = "",
        source: Address | None = None,
        dataplane: str = "",
        options: Mapping[str, str] | None = None,
    ) -> int:
        """Init the agent; returns the UDP port its data plane bound."""
        request = pb.InitRequest(
            interface=interface,
            source_address="" if source is None else str(source),
            dataplane=dataplane,
            dataplane_options=dict(options or {}),
        )
        if port is not None:
            request.port = port
        reply: pb.InitReply = self._call("Init", request)
        return reply.port

    def reset(self) -> int:
        """Reset the agent; returns how many sessions it destroyed."""
        reply: pb.ResetReply = self._call("Reset", pb.ResetRequest())
        return reply.sessions_destroyed

    # -- sessions ---------------------------------------------------------------------

    def create_session(self, request: pb.CreateStampSessionRequest) -> None:
        """CreateStampSession with a request built by the caller (any role)."""
        self._call("CreateStampSession", request)

    def create_sender_session(self, session: SenderSession) -> None:
        """Create a Session-Sender session."""
        self.create_session(session.request())

    def create_reflector_session(self, session: ReflectorSession) -> None:
        """Create a Session-Reflector session."""
        self.create_session(session.request())

    def call_many(self, method: str, requests: Sequence[Any]) -> list[Any]:
        """One unary method for many requests, ``window`` of them in flight at a time on
        the channel: one round trip's wait per window instead of one per request.
        Per request, in order: its reply, or the ``SouthboundError`` it failed with."""
        call = getattr(self._stub, method)
        out: list[Any] = []
        for i in range(0, len(requests), PIPELINE_WINDOW):
            futures = [
                call.future(r, timeout=self.timeout) for r in requests[i : i + PIPELINE_WINDOW]
            ]
            for f in futures:
                try:
                    out.append(f.result())
                except grpc.RpcError as exc:
                    out.append(SouthboundError.from_rpc(exc))
        return out

    def start_session(self, ssid: int) -> None:
        self._call("StartStampSession", pb.StartStampSessionRequest(ssid=ssid))

    def stop_session(self, ssid: int) -> None:
        self._call("StopStampSession", pb.StopStampSessionRequest(ssid=ssid))

    def destroy_session(self, ssid: int) -> None:
        self._call("DestroyStampSession", pb.DestroyStampSessionRequest(ssid=ssid))

    # -- results and counters ---------------------------------------------------------

    def results(
        self,
        ssid: int,
        max_results: int = 0,
        *,
        after_id: int | None = None,
        after_loss_id: int | None = None,
    ) -> pb.GetStampSessionResultsReply:
        """A sender session's queued records (polling mode).

        Without ``after_id`` the records are drained. With it (cursor mode), records up
        to ``after_id`` are acknowledged and the next ones come with their ``record_id``
        and stay queued until acknowledged: what a caller that stores them needs.
        ``after_loss_id`` does the same for the loss reports (``loss_id``); without it
        the loss reports returned are removed.
        """
        request = pb.GetStampSessionResultsRequest(ssid=ssid, max_results=max_results)
        if after_id is not None:
            request.after_id = after_id
        if after_loss_id is not None:
            request.after_loss_id = after_loss_id
        reply: pb.GetStampSessionResultsReply = self._call("GetStampSessionResults", request)
        return reply

    def acknowledge(self, ssid: int, through_id: int, *, through_loss_id: int = 0) -> int:
        """Remove a sender session's records up to ``through_id`` (cursor mode), and its
        loss reports up to ``through_loss_id``; returns how many records went."""
        request = pb.AcknowledgeStampSessionResultsRequest(
            ssid=ssid, through_id=through_id, through_loss_id=through_loss_id
        )
        reply: pb.AcknowledgeStampSessionResultsReply = self._call(
            "AcknowledgeStampSessionResults", request
        )
        return reply.acknowledged

    def stream_results(
        self,
        ssid: int,
        *,
        max_batch: int = 0,
        batch_window_ns: int = 0,
        after_id: int | None = None,
        after_loss_id: int | None = None,
    ) -> ResultStream[pb.ResultBatch]:
        """Batches of a sender session's records as they come (push mode), no deadline.

        With ``after_id`` the stream starts after that record and removes nothing: the
        caller acknowledges what it stored with ``acknowledge``. ``after_loss_id`` does
        the same for the loss reports (``acknowledge``'s ``through_loss_id``); without it
        the stream removes those it sends.
        """
        request = pb.StreamStampSessionResultsRequest(
            ssid=ssid, max_batch=max_batch, batch_window_ns=batch_window_ns
        )
        if after_id is not None:
            request.after_id = after_id
        if after_loss_id is not None:
            request.after_loss_id = after_loss_id
        return ResultStream(self._stub.StreamStampSessionResults(request))

    def stream_many(
        self,
        after_ids: Mapping[int, int],
        *,
        max_batch: int = 0,
        batch_window_ns: int = 0,
        counters_interval_ns: int = 0,
        after_loss_ids: Mapping[int, int] | None = None,
    ) -> ResultStream[pb.ResultBatches]:
        """StreamResults: the records (and counters) of many sessions on one stream, no
        deadline; ``after_ids`` maps each SSID to the last record id the caller holds.
        Records stay queued until ``acknowledge_many``. ``after_loss_ids``: the sessions
        whose loss reports to send too, each with the last ``loss_id`` the caller holds
        (also left queued until acknowledged)."""
        request = pb.StreamResultsRequest(
            after_ids=dict(after_ids),
            max_batch=max_batch,
            batch_window_ns=batch_window_ns,
            counters_interval_ns=counters_interval_ns,
            after_loss_ids=dict(after_loss_ids or {}),
        )
        return ResultStream(self._stub.StreamResults(request))

    def acknowledge_many(
        self, through_ids: Mapping[int, int], through_loss_ids: Mapping[int, int] | None = None
    ) -> dict[int, int]:
        """Remove records of many sessions (each up to its id), and loss reports (each up
        to its ``loss_id``); how many records went, per session that exists."""
        request = pb.AcknowledgeResultsRequest(
            through_ids=dict(through_ids), through_loss_ids=dict(through_loss_ids or {})
        )
        reply: pb.AcknowledgeResultsReply = self._call("AcknowledgeResults", request)
        return dict(reply.acknowledged)

    def counters(self, ssid: int | None = None) -> pb.GetCountersReply:
        request = pb.GetCountersRequest()
        if ssid is not None:
            request.ssid = ssid
        reply: pb.GetCountersReply = self._call("GetCounters", request)
        return reply
