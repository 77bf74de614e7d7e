"""The agent refuses bad requests with the right gRPC status, names the field, changes nothing.

Each case runs against a real in-process agent (gRPC on [::1], ephemeral port, the
``socket`` data plane on ::1) and compares the agent's whole visible state (info and
counters) before and after the refused call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest

from sixlab.southbound import (
    AgentClient,
    AgentServer,
    ReflectorSession,
    SenderSession,
    SouthboundError,
    serve,
)
from sixlab.southbound._generated import stamp_pb2 as pb
from sixlab.southbound.agent import MAX_TLV_BYTES

Code = grpc.StatusCode
Call = Callable[[AgentClient], object]


def _agent(role: str) -> Iterator[tuple[AgentServer, AgentClient]]:
    server = serve("[::1]:0", role)
    client = AgentClient(f"[::1]:{server.port}", timeout=5)
    try:
        yield server, client
    finally:
        client.close()
        server.stop(None)


@pytest.fixture
def sender() -> Iterator[AgentClient]:
    for _, client in _agent("sender"):
        yield client


@pytest.fixture
def reflector() -> Iterator[AgentClient]:
    for _, client in _agent("reflector"):
        yield client


def _state(client: AgentClient) -> tuple[bytes, bytes]:
    return (
        client.info().SerializeToString(deterministic=True),
        client.counters().SerializeToString(deterministic=True),
    )


def _refused(client: AgentClient, call: Call, code: grpc.StatusCode, field: str) -> None:
    before = _state(client)
    with pytest.raises(SouthboundError) as info:
        call(client)
    assert info.value.code is code, info.value
    assert field in info.value.details
    assert _state(client) == before


def _sender_request(**fields: object) -> pb.CreateStampSessionRequest:
    base: dict[str, object] = {"ssid": 9, "reflector_address": "::1", "count": 1}
    base.update(fields)
    return pb.CreateStampSessionRequest(**base)  # type: ignore[arg-type]


# ------------------------------------------------------------------------ before Init


def test_create_before_init_is_failed_precondition(sender: AgentClient) -> None:
    _refused(
        sender,
        lambda c: c.create_sender_session(SenderSession(1, "::1")),
        Code.FAILED_PRECONDITION,
        "Init",
    )


def test_start_before_init_is_failed_precondition(sender: AgentClient) -> None:
    _refused(sender, lambda c: c.start_session(1), Code.FAILED_PRECONDITION, "Init")


def test_results_before_init_is_failed_precondition(sender: AgentClient) -> None:
    _refused(sender, lambda c: c.results(1), Code.FAILED_PRECONDITION, "Init")


def test_unknown_dataplane_is_invalid_argument(sender: AgentClient) -> None:
    _refused(
        sender,
        lambda c: c.init(port=0, dataplane="no-such-plane"),
        Code.INVALID_ARGUMENT,
        "dataplane",
    )
    assert not sender.info().initialized


def test_init_invalid_source_address(sender: AgentClient) -> None:
    _refused(
        sender,
        lambda c: c.init(port=0, source="::1::2"),
        Code.INVALID_ARGUMENT,
        "source_address",
    )


def test_init_port_out_of_range(sender: AgentClient) -> None:
    _refused(sender, lambda c: c.init(port=70000), Code.INVALID_ARGUMENT, "port")


def test_init_unknown_dataplane_option(sender: AgentClient) -> None:
    _refused(
        sender,
        lambda c: c.init(port=0, options={"colour": "blue"}),
        Code.INVALID_ARGUMENT,
        "dataplane_options",
    )


def test_init_bad_dataplane_option_value(sender: AgentClient) -> None:
    _refused(
        sender,
        lambda c: c.init(port=0, options={"peer_ports": "862,x"}),
        Code.INVALID_ARGUMENT,
        "peer_ports",
    )


# ------------------------------------------------------------------------- after Init


@pytest.fixture
def ready_sender(sender: AgentClient) -> AgentClient:
    sender.init(port=0, source="::1")
    sender.create_sender_session(SenderSession(1, "::1", count=1))
    return sender


@pytest.fixture
def ready_reflector(reflector: AgentClient) -> AgentClient:
    reflector.init(port=0, source="::1")
    reflector.create_reflector_session(ReflectorSession(1))
    return reflector


def test_init_twice_is_failed_precondition(ready_sender: AgentClient) -> None:
    _refused(ready_sender, lambda c: c.init(port=0), Code.FAILED_PRECONDITION, "Reset")


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda c: c.start_session(2), id="start"),
        pytest.param(lambda c: c.stop_session(2), id="stop"),
        pytest.param(lambda c: c.destroy_session(2), id="destroy"),
        pytest.param(lambda c: c.results(2), id="results"),
        pytest.param(lambda c: c.counters(2), id="counters"),
    ],
)
def test_unknown_ssid_is_not_found(ready_sender: AgentClient, call: Call) -> None:
    _refused(ready_sender, call, Code.NOT_FOUND, "ssid")


def test_unknown_ssid_on_reflector_is_not_found(ready_reflector: AgentClient) -> None:
    _refused(ready_reflector, lambda c: c.start_session(2), Code.NOT_FOUND, "ssid")


def test_duplicate_ssid_is_already_exists(ready_sender: AgentClient) -> None:
    _refused(
        ready_sender,
        lambda c: c.create_sender_session(SenderSession(1, "::2", count=5)),
        Code.ALREADY_EXISTS,
        "ssid",
    )


def test_duplicate_ssid_on_reflector_is_already_exists(ready_reflector: AgentClient) -> None:
    _refused(
        ready_reflector,
        lambda c: c.create_reflector_session(ReflectorSession(1, stateful=True)),
        Code.ALREADY_EXISTS,
        "ssid",
    )


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        pytest.param({"reflector_address": "not-an-address"}, "reflector_address", id="reflector"),
        pytest.param({"reflector_address": "192.0.2.1"}, "reflector_address", id="ipv4"),
        pytest.param({"reflector_address": ""}, "reflector_address", id="missing-reflector"),
        pytest.param({"sid_list": ["fc00::1", "fc00::zz"]}, "sid_list[1]", id="sid"),
        pytest.param({"reflector_address": "::"}, "reflector_address", id="unspecified"),
        pytest.param({"reflector_address": "ff02::1"}, "reflector_address", id="multicast"),
        pytest.param({"sid_list": ["fc00::1", "::"]}, "sid_list[1]", id="sid-unspecified"),
        pytest.param({"sid_list": ["ff0e::1"]}, "sid_list[0]", id="sid-multicast"),
        pytest.param({"source_address": "fe80::1%"}, "source_address", id="source"),
        pytest.param({"ssid": 70000}, "ssid", id="ssid-range"),
        pytest.param({"sid_list": ["fc00::1"] * 128}, "sid_list", id="too-many-sids"),
        pytest.param({"request_return_path": True}, "return_sid_list", id="empty-return-sids"),
        pytest.param({"return_sid_list": ["fc00::1"]}, "return_sid_list", id="return-no-request"),
        pytest.param({"auth_mode": pb.AUTH_MODE_AUTHENTICATED}, "key", id="key-missing"),
        pytest.param({"key": b"k"}, "key", id="key-unauthenticated"),
        pytest.param({"auth_mode": 7}, "auth_mode", id="auth-mode-unknown"),
        pytest.param({"timestamp_format": 9}, "timestamp_format", id="format-unknown"),
        pytest.param({"reflector_mode": 3}, "reflector_mode", id="mode-unknown"),
        pytest.param({"delay_mode": 3}, "delay_mode", id="delay-mode-unknown"),
        pytest.param({"interval_ns": 10}, "interval_ns", id="interval-too-short"),
        pytest.param({"reflector_udp_port": 65536}, "reflector_udp_port", id="port-range"),
        pytest.param({"sender_udp_port": 1}, "sender_udp_port", id="sender-port-mismatch"),
        pytest.param({"tlvs": bytes(MAX_TLV_BYTES + 1)}, "tlvs", id="tlvs-too-big"),
        pytest.param({"error_estimate": 0x1_0000}, "error_estimate", id="ee-range"),
        # Z bit set (PTP) on an NTP session: the core refuses it (ConfigError).
        pytest.param({"error_estimate": 0x4001}, "error_estimate", id="ee-format"),
        pytest.param({"tai_utc_offset_ns": -1}, "tai_utc_offset_ns", id="tai-negative"),
    ],
)
def test_bad_sender_session_is_invalid_argument(
    ready_sender: AgentClient, request_fields: dict[str, object], field: str
) -> None:
    request = _sender_request(**request_fields)
    _refused(ready_sender, lambda c: c.create_session(request), Code.INVALID_ARGUMENT, field)


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        pytest.param({"return_sid_list": ["fc00::1", "x"]}, "return_sid_list[1]", id="return"),
        pytest.param({"return_sid_list": ["ff02::2"]}, "return_sid_list[0]", id="return-mcast"),
        pytest.param({"auth_mode": pb.AUTH_MODE_AUTHENTICATED}, "key", id="key-missing"),
        pytest.param({"key": bytes(2000), "auth_mode": 1}, "key", id="key-too-long"),
        pytest.param({"reflector_udp_port": 9}, "reflector_udp_port", id="port-mismatch"),
        pytest.param({"source_address": "nope"}, "source_address", id="source"),
    ],
)
def test_bad_reflector_session_is_invalid_argument(
    ready_reflector: AgentClient, request_fields: dict[str, object], field: str
) -> None:
    request = pb.CreateStampSessionRequest(ssid=5, **request_fields)  # type: ignore[arg-type]
    _refused(ready_reflector, lambda c: c.create_session(request), Code.INVALID_ARGUMENT, field)


def test_results_on_reflector_is_failed_precondition(ready_reflector: AgentClient) -> None:
    _refused(ready_reflector, lambda c: c.results(1), Code.FAILED_PRECONDITION, "reflector")


def test_stream_on_reflector_is_failed_precondition(ready_reflector: AgentClient) -> None:
    _refused(
        ready_reflector,
        lambda c: list(c.stream_results(1)),
        Code.FAILED_PRECONDITION,
        "reflector",
    )


def test_stream_bad_batch_is_invalid_argument(ready_sender: AgentClient) -> None:
    _refused(
        ready_sender,
        lambda c: list(c.stream_results(1, max_batch=10**6)),
        Code.INVALID_ARGUMENT,
        "max_batch",
    )


def test_start_twice_is_failed_precondition(ready_sender: AgentClient) -> None:
    ready_sender.create_sender_session(SenderSession(3, "::1", interval_ns=10**9))
    ready_sender.start_session(3)
    # The session sends at most once a second: nothing in the state moves meanwhile.
    _refused(ready_sender, lambda c: c.start_session(3), Code.FAILED_PRECONDITION, "start")


def test_reflector_stop_when_not_running_is_failed_precondition(
    ready_reflector: AgentClient,
) -> None:
    _refused(ready_reflector, lambda c: c.stop_session(1), Code.FAILED_PRECONDITION, "running")


def test_request_over_size_limit_is_refused_by_grpc(ready_sender: AgentClient) -> None:
    before = _state(ready_sender)
    with pytest.raises(SouthboundError) as info:
        ready_sender.create_session(_sender_request(tlvs=bytes(2 << 20)))
    assert info.value.code is Code.RESOURCE_EXHAUSTED
    assert _state(ready_sender) == before
