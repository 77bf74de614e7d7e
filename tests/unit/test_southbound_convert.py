"""Conversions of the southbound API: records both ways, data plane options, CLI flags."""

from __future__ import annotations

import argparse
from ipaddress import IPv4Address
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.cli import agent as _cli
from sixlab.southbound import AgentError, result_from_proto
from sixlab.southbound._generated import stamp_pb2 as pb
from sixlab.southbound.agent import _dataplane_options, _sender_spec, result_to_proto
from sixlab.stamp._events import StampResult
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat

u64 = st.integers(0, 2**64 - 1)
estimates = st.builds(
    ErrorEstimate,
    synchronized=st.booleans(),
    fmt=st.sampled_from(TimestampFormat),
    scale=st.integers(0, 63),
    multiplier=st.integers(0, 255),
)
results = st.builds(
    StampResult,
    ssid=st.integers(0, 0xFFFF),
    seq=st.integers(0, 2**32 - 1),
    t1_ns=u64,
    t2_ns=u64,
    t3_ns=u64,
    t4_ns=u64,
    sender_error=estimates,
    reflector_error=estimates,
    ses_sender_ttl=st.integers(0, 255),
    reflector_seq=st.integers(0, 2**32 - 1),
    tlvs=st.binary(max_size=64),
)


@settings(max_examples=200, deadline=None)
@given(results)
def test_result_round_trip(result: StampResult) -> None:
    record = result_to_proto(result)
    wire = pb.StampResult.FromString(record.SerializeToString())
    assert result_from_proto(wire) == result
    assert wire.sender_error_ns == min(result.sender_error.error_ns, 2**64 - 1)
    assert wire.reflector_error_estimate == result.reflector_error.to_int()


def test_dataplane_options_typed_by_config_defaults() -> None:
    assert _dataplane_options({"peer_ports": "862, 863"}) == {"peer_ports": (862, 863)}
    assert _dataplane_options({}) == {}


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"port": "1"}, "unknown option 'port'"),  # Init's own field, not an option
        ({"nope": "1"}, "unknown option 'nope'"),
        ({"peer_ports": "a"}, "peer_ports"),
        ({"peer_ports": "70000"}, "peer_ports"),
    ],
)
def test_dataplane_options_refused(options: dict[str, str], field: str) -> None:
    with pytest.raises(AgentError, match=field):
        _dataplane_options(options)


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _cli.add_parsers(parser.add_subparsers())
    return parser.parse_args(["agent", *argv])


def test_cli_defaults() -> None:
    args = _parse("--role", "sender")
    assert args.handler is _cli.run_agent
    assert (args.grpc, args.dataplane) == (_cli.DEFAULT_GRPC, "socket")
    assert _cli._tls(args) is None


def test_cli_tls_flags() -> None:
    args = _parse("--role", "reflector", "--tls-cert", "c", "--tls-key", "k", "--tls-ca", "a")
    tls = _cli._tls(args)
    assert tls is not None
    assert (tls.cert, tls.key, tls.ca) == (Path("c"), Path("k"), Path("a"))
    with pytest.raises(ValueError, match="go together"):
        _cli._tls(_parse("--role", "sender", "--tls-cert", "c"))
    with pytest.raises(ValueError, match="--tls-ca needs"):
        _cli._tls(_parse("--role", "sender", "--tls-ca", "a"))


def test_cli_refuses_bad_role() -> None:
    with pytest.raises(SystemExit):
        _parse("--role", "observer")


def test_cli_unknown_dataplane_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.run_agent(_parse("--role", "sender", "--dataplane", "nope")) == 2
    assert "unknown data plane 'nope'" in capsys.readouterr().err


def test_sender_spec_strict_ssid_and_address_families() -> None:
    spec, _ = _sender_spec(
        pb.CreateStampSessionRequest(ssid=1, reflector_address="192.0.2.7", strict_ssid=True),
        0,
        None,
    )
    assert spec.config.strict_ssid
    assert spec.reflector == IPv4Address("192.0.2.7")
    spec, _ = _sender_spec(
        pb.CreateStampSessionRequest(ssid=1, reflector_address="fd00::7"), 0, None
    )
    assert not spec.config.strict_ssid  # SSID-0 replies accepted by default


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"reflector_address": "192.0.2.7", "sid_list": ["fc00::1"]}, "sid_list"),
        ({"reflector_address": "fd00::7", "sid_list": ["192.0.2.1"]}, "sid_list"),
        ({"reflector_address": "fd00::7", "source_address": "192.0.2.1"}, "source_address"),
        ({"reflector_address": "fd00::7", "return_sid_list": ["10.0.0.1"]}, "return_sid_list"),
    ],
)
def test_sender_spec_refuses_ipv4_where_srv6_or_the_family_forbids(
    fields: dict[str, object], field: str
) -> None:
    with pytest.raises(AgentError, match=field):
        _sender_spec(pb.CreateStampSessionRequest(ssid=1, **fields), 0, None)  # type: ignore[arg-type]
