"""``sixlab controller``: argument errors, error lines, conversions and default addresses.

The CLI runs in this process through ``sixlab.cli.controller.main``; nothing here needs
a controller or an agent (the end-to-end runs are in tests/integration/test_northbound.py).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sixlab.cli.controller import (
    main,
    parse_metrics_address,
    record_json,
    session_json,
    stats_json,
)
from sixlab.controller._generated import controller_pb2 as pb
from sixlab.controller.client import (
    ControllerClient,
    NorthboundError,
    SessionStats,
    default_address,
    default_socket,
    record_from_proto,
    session_from_proto,
    spec_to_proto,
    stats_from_proto,
)
from sixlab.controller.core import (
    SWITCH_INTERVAL_S,
    ControllerError,
    NoFreeSsidError,
    SessionExistsError,
    SessionSpec,
    WrongStateError,
)
from sixlab.controller.northbound import (
    _status_of,
    record_to_proto,
    session_to_proto,
    summary_to_proto,
)
from sixlab.controller.store import (
    AlreadyExistsError,
    InUseError,
    NotFoundError,
    SessionRow,
    StoreError,
    StoreUnavailableError,
)
from sixlab.southbound.client import SouthboundError
from sixlab.stamp._events import StampResult
from sixlab.stamp.stats import DelaySummary
from sixlab.wire.timestamp import ErrorEstimate

Code = grpc.StatusCode
CREATE = ["controller", "session", "create", "p", "--sender", "s", "--reflector", "r"]
CREATE_OK = [*CREATE, "--reflector-address", "::1"]


def _usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["controller"], "required"),
        (["controller", "node", "add", "s", "[::1]:1"], "--role"),
        (["controller", "node", "add", "s", "[::1]:1", "--role", "router"], "invalid choice"),
        (["controller", "node", "add", "s"], "address"),
        (["controller", "node", "init", "s", "--port", "70000"], "70000 is not in 0..65535"),
        (["controller", "node", "init", "s", "--port", "x"], "not a port number"),
        (["controller", "node", "init", "s", "--source", "10.0.0.300"], "not an IPv4 or IPv6"),
        (["controller", "node", "list", "--bogus"], "unrecognized arguments"),
        (CREATE, "--reflector-address"),
        ([*CREATE, "--reflector-address", "10.0.0.300"], "not an IPv4 or IPv6 address"),
        ([*CREATE_OK, "--segments", "fc00::1,nope"], "not an IPv6 address: 'nope'"),
        ([*CREATE_OK, "--segments", ","], "the SID list is empty"),
        ([*CREATE_OK, "--return-segments", "x"], "not an IPv6 address"),
        ([*CREATE_OK, "--interval", "0"], "must be a positive number"),
        ([*CREATE_OK, "--interval", "nan"], "must be a positive number"),
        ([*CREATE_OK, "--interval", "fast"], "not a number of seconds"),
        ([*CREATE_OK, "--duration", "-1"], "must be a positive number"),
        ([*CREATE_OK, "--count", "-1"], "is not in 0.."),
        ([*CREATE_OK, "--port", "65536"], "65536 is not in 0..65535"),
        ([*CREATE_OK, "--auth-key", "zz"], "hexadecimal"),
        ([*CREATE_OK, "--auth-key", ""], "the key is empty"),
        ([*CREATE_OK, "--collect", "push"], "invalid choice"),
        ([*CREATE_OK, "--source", "fc00::1::1"], "not an IPv4 or IPv6 address"),
        (["controller", "session", "start"], "name"),
        (["controller", "session", "wait", "p", "--timeout", "0"], "must be a positive number"),
        (["controller", "session", "pause", "p"], "invalid choice"),
        (["controller", "results", "p", "--limit", "-1"], "is not in 0.."),
        (["controller", "results", "p", "--since-ns", "yesterday"], "not an integer"),
        (["controller", "stats"], "name"),
        (["controller", "serve"], "--db"),
        (["controller", "serve", "--db", "x", "--poll-interval", "0"], "must be a positive number"),
        (["controller", "serve", "--db", "x", "--metrics", "localhost:9464"], "IP address"),
        (["controller", "serve", "--db", "x", "--metrics", "[::1]:0"], "must not be 0"),
        (["controller", "serve", "--db", "x", "--switch-interval", "0"], "positive number"),
        (["controller", "serve", "--db", "x", "--switch-interval", "2"], "at most 1 s"),
        (["controller", "serve", "--db", "x", "--switch-interval", "fast"], "not a number"),
    ],
)
def test_argument_errors_exit_2_with_one_clear_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert message in _usage_error(capsys, argv)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[::1]:9464", ("::1", 9464)),
        ("127.0.0.1:9100", ("127.0.0.1", 9100)),
        (":9100", ("127.0.0.1", 9100)),
        ("9100", ("127.0.0.1", 9100)),
        ("[fc00::1]:80", ("fc00::1", 80)),
    ],
)
def test_metrics_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_metrics_address(text) == expected


@pytest.mark.parametrize("text", ["", "host:1", "[::1]", "1.2.3.4:", "[::1]:70000", "::1:9x"])
def test_metrics_address_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_metrics_address(text)


def test_unreachable_controller_is_one_line_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["controller", "node", "list", "--controller", f"unix:{tmp_path}/none.sock"])
    assert rc == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith("sixlab controller: UNAVAILABLE: ")
    assert len(out.err.splitlines()) == 1


def test_serve_with_unopenable_store_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "missing" / "dir" / "c.db"
    rc = main(["controller", "serve", "--db", str(db), "--grpc", f"unix:{tmp_path}/s.sock"])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sixlab controller: cannot open the store {db}: ")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "expected"), [([], SWITCH_INTERVAL_S), (["--switch-interval", "0.01"], 0.01)]
)
def test_serve_sets_the_processes_switch_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], expected: float
) -> None:
    """``serve`` sets how long a thread holds the GIL while others wait (20 ms by
    default, not CPython's 5: benchmarks/README.md, "The SQLite store at 10,000
    sessions"), before it opens anything (here the store, which fails), and sets the
    caller's back when it returns."""
    before = sys.getswitchinterval()
    seen: list[float] = []
    monkeypatch.setattr(sys, "setswitchinterval", seen.append)
    db = tmp_path / "missing" / "c.db"
    assert main(["controller", "serve", "--db", str(db), *argv]) == 2
    assert seen == [expected, before]


def test_serve_with_unusable_socket_directory_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").touch()
    argv = ["controller", "serve", "--db", str(tmp_path / "c.db")]
    assert main([*argv, "--grpc", f"unix:{tmp_path}/file/s.sock"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sixlab controller: cannot create {tmp_path}/file: ")
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "c.db").exists()  # refused before the store was created


def test_serve_with_busy_ports_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = ["controller", "serve", "--db", str(tmp_path / "c.db")]
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as busy:
        busy.bind(("::1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # Metrics: the northbound server already listens when this fails; it is stopped.
        argv = [*db, "--grpc", f"unix:{tmp_path}/s.sock", "--metrics", f"[::1]:{port}"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("sixlab controller: ")
        assert len(err.splitlines()) == 1
        assert main([*db, "--grpc", f"[::1]:{port}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"sixlab controller: grpc: cannot listen on [::1]:{port}")
        assert len(err.splitlines()) == 1
    assert not (tmp_path / "s.sock").exists()


def test_client_refuses_bad_values_before_any_call(tmp_path: Path) -> None:
    with ControllerClient(f"unix:{tmp_path}/none.sock") as c:
        with pytest.raises(NorthboundError, match="role: 'router'") as err:
            c.register_node("x", "[::1]:1", "router")
        assert err.value.code is Code.INVALID_ARGUMENT
        with pytest.raises(NorthboundError, match="key_hex"):
            c.create_session(SessionSpec("p", "s", "r", "::1", key_hex="zz"))
        with pytest.raises(NorthboundError, match="collect"):
            c.create_session(SessionSpec("p", "s", "r", "::1", collect="push"))


def test_default_address(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SIXLAB_CONTROLLER", "[::1]:50050")
    assert default_address() == "[::1]:50050"
    monkeypatch.delenv("SIXLAB_CONTROLLER")
    run = tmp_path / "run" / "sixlab" / "controller.sock"
    monkeypatch.setattr("sixlab.controller.client.RUN_SOCKET", run)
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    fallback = tmp_path / "tmp" / f"sixlab-{os.getuid()}" / "controller.sock"
    # /run/sixlab missing and /run not writable (as for a user): the private fallback.
    monkeypatch.setattr(os, "access", lambda _p, _m: False)
    assert default_socket(server=True) == fallback
    assert default_address(server=True) == f"unix:{fallback}"
    # Where /run is writable the server takes it; a client takes the socket that exists.
    monkeypatch.setattr(os, "access", lambda _p, _m: True)
    assert default_socket(server=True) == run
    fallback.parent.mkdir(parents=True)
    fallback.touch()
    assert default_socket() == fallback
    run.parent.mkdir(parents=True)
    run.touch()
    assert default_socket() == run


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (SessionExistsError("name: session 'p' already exists"), Code.ALREADY_EXISTS),
        (AlreadyExistsError("name: node 'n' already exists"), Code.ALREADY_EXISTS),
        (NotFoundError("session: no session named 'x'"), Code.NOT_FOUND),
        (NotFoundError("node: no node named 'x'"), Code.NOT_FOUND),
        (NotFoundError("sender/reflector: unknown node"), Code.NOT_FOUND),
        (WrongStateError("name: session 'p' is running, not startable"), Code.FAILED_PRECONDITION),
        (WrongStateError("name: session 'p' is created, not running"), Code.FAILED_PRECONDITION),
        (WrongStateError("name: session 'p' is already destroyed"), Code.FAILED_PRECONDITION),
        (InUseError("node: 'n' still carries session 'p'"), Code.FAILED_PRECONDITION),
        (NoFreeSsidError("ssid: no free SSID left on these nodes"), Code.RESOURCE_EXHAUSTED),
        (ControllerError("interval_ns: must be positive"), Code.INVALID_ARGUMENT),
        (StoreError("address: 'x' is not host:port"), Code.INVALID_ARGUMENT),
        # The database down (or its writer lock held too long) is the service's fault:
        # the caller may try again, never a bad field.
        (StoreUnavailableError("store: the database is unreachable"), Code.UNAVAILABLE),
        # The exception's type decides, never its message: a plain refusal that reads
        # like one of the typed ones is still a bad field.
        (ControllerError("name: session 'p' already exists"), Code.INVALID_ARGUMENT),
        (SouthboundError(Code.UNAVAILABLE, "down"), Code.UNAVAILABLE),
        (SouthboundError(Code.DEADLINE_EXCEEDED, "slow"), Code.UNAVAILABLE),
        (SouthboundError(Code.INVALID_ARGUMENT, "dataplane: unknown"), Code.INVALID_ARGUMENT),
        (SouthboundError(Code.ALREADY_EXISTS, "ssid: 1"), Code.FAILED_PRECONDITION),
        (SouthboundError(Code.FAILED_PRECONDITION, "Init first"), Code.FAILED_PRECONDITION),
    ],
)
def test_error_mapping(exc: Exception, code: grpc.StatusCode) -> None:
    status = _status_of(exc)
    assert status is not None
    assert status[0] is code
    details = exc.details if isinstance(exc, SouthboundError) else str(exc)
    assert details in status[1]


def test_unexpected_errors_are_not_mapped() -> None:
    assert _status_of(RuntimeError("bug")) is None


# ------------------------------------------------------------------------ conversions

U64 = st.integers(0, 2**64 - 1)
#: Unix ns up to 2^62 (year 2116): every delay of such timestamps fits in sint64.
TIME = st.integers(0, 2**62)


def _result(t: tuple[int, int, int, int], seq: int, ee: tuple[int, int], ttl: int) -> StampResult:
    return StampResult(
        ssid=0,
        seq=seq,
        t1_ns=t[0],
        t2_ns=t[1],
        t3_ns=t[2],
        t4_ns=t[3],
        sender_error=ErrorEstimate.from_int(ee[0]),
        reflector_error=ErrorEstimate.from_int(ee[1]),
        ses_sender_ttl=ttl,
        reflector_seq=seq,
    )


@settings(max_examples=200, deadline=None)
@given(
    st.tuples(TIME, TIME, TIME, TIME),
    st.integers(0, 2**32 - 1),
    st.tuples(st.integers(0, 0xFFFF), st.integers(0, 0xFFFF)),
    st.integers(0, 255),
)
def test_record_round_trip(
    t: tuple[int, int, int, int], seq: int, ee: tuple[int, int], ttl: int
) -> None:
    r = _result(t, seq, ee, ttl)
    proto = pb.Record.FromString(record_to_proto(r).SerializeToString())
    assert record_from_proto(proto) == r
    assert (proto.direct_ns, proto.return_ns, proto.rtt_ns) == (r.direct_ns, r.return_ns, r.rtt_ns)
    assert proto.error_bound_ns == min(r.error_bound_ns, 2**64 - 1)
    assert record_json(r)["rtt_ns"] == r.rtt_ns


def test_a_record_the_controller_should_not_send_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An Error Estimate wider than the packet's 16 bits (the API's field has 32), as a
    controller of another make or version might send: NorthboundError, which the CLI
    prints as one line, not a decoding error's traceback."""
    good = record_to_proto(_result((1, 2, 3, 4), 7, (0x8001, 0x8001), 255))
    bad = pb.Record()
    bad.CopyFrom(good)
    bad.seq, bad.sender_error_estimate = 8, 0x1FFFF
    reply = pb.GetResultsReply(records=[good, bad])
    with ControllerClient(f"unix:{tmp_path}/none.sock") as c:
        monkeypatch.setattr(c, "_call", lambda method, request: reply)
        with pytest.raises(NorthboundError, match=r"record seq 8: .*131071") as err:
            c.results("p")
        assert err.value.code is Code.INTERNAL
        reply.records.pop()
        assert [r.seq for r in c.results("p").records] == [7]


@settings(max_examples=200, deadline=None)
@given(st.tuples(U64, U64, U64, U64))
def test_record_of_absurd_timestamps_saturates_instead_of_failing(
    t: tuple[int, int, int, int],
) -> None:
    proto = record_to_proto(_result(t, 0, (0xFFFF, 0xFFFF), 0))
    assert -(2**63) <= proto.rtt_ns < 2**63
    assert proto.error_bound_ns == 2**64 - 1  # 2 × 255 × 2^31 s does not fit


def _row(**kw: object) -> SessionRow:
    spec = SessionSpec(
        "p", "s", "r", "fc00::1", segments=("fc00::a", "fc00::1"), key_hex="00", stateful=True
    )
    from dataclasses import asdict  # noqa: PLC0415

    params = asdict(spec) | {"segments": list(spec.segments), "return_segments": []}
    base: dict[str, object] = {
        "id": 1,
        "name": "p",
        "ssid": 3,
        "sender": "s",
        "reflector": "r",
        "params": params,
        "state": "running",
        "epoch": 1,
        "cursor": 9,
        "sent": 10,
        "lost": 1,
        "forward_lost": None,
        "overflow": 0,
        "created_ns": 123,
    }
    return SessionRow(**(base | kw))  # type: ignore[arg-type]


def test_session_conversion_and_json() -> None:
    info = session_from_proto(session_to_proto(_row(), stored=9))
    assert (info.name, info.ssid, info.state, info.epoch, info.stored) == ("p", 3, "running", 1, 9)
    assert info.segments == ("fc00::a", "fc00::1")
    assert info.authenticated  # the key itself is not sent
    assert info.forward_lost is None
    assert session_from_proto(session_to_proto(_row(forward_lost=0), 0)).forward_lost == 0
    assert session_from_proto(session_to_proto(_row(state="weird"), 0)).state == "unspecified"
    doc = json.loads(json.dumps(session_json(info)))
    assert doc["segments"] == ["fc00::a", "fc00::1"]
    assert doc["collect"] == "poll"


def test_spec_to_proto_keeps_every_field() -> None:
    spec = SessionSpec(
        "p",
        "s",
        "r",
        "fc00::1",
        segments=("fc00::a",),
        return_segments=("fc00::b",),
        return_path_tlv=True,
        reflector_port=8620,
        source_address="fc00::9",
        interval_ns=7,
        count=5,
        duration_ns=11,
        ptp=True,
        key_hex="0a0b",
        stateful=True,
        loss_timeout_ns=13,
        collect="stream",
    )
    proto = spec_to_proto(spec)
    assert proto.key == b"\x0a\x0b"
    assert proto.collect == pb.COLLECT_MODE_STREAM
    assert (proto.reflector_port, proto.interval_ns, proto.loss_timeout_ns) == (8620, 7, 13)
    assert (list(proto.segments), list(proto.return_segments)) == (["fc00::a"], ["fc00::b"])
    assert proto.return_path_tlv
    assert proto.ptp
    assert proto.stateful
    assert (proto.count, proto.duration_ns, proto.source_address) == (5, 11, "fc00::9")


def test_stats_conversion_and_json() -> None:
    d = DelaySummary(3, -5, 1, 2, 3, 4, 9)
    reply = pb.GetPathStatsReply(received=3, lost=1, loss_ratio=0.25, sent=4, forward_lost=1)
    reply.backward_lost = 0
    reply.round_trip_delay.CopyFrom(summary_to_proto(d))
    s = stats_from_proto(reply)
    assert s == SessionStats(
        direct=None,
        backward=None,
        rtt=d,
        direct_jitter_ns=None,
        return_jitter_ns=None,
        received=3,
        lost=1,
        loss_ratio=0.25,
        forward_lost=1,
        backward_lost=0,
        max_error_bound_ns=None,
        sent=4,
    )
    doc = json.loads(json.dumps(stats_json("p", s)))
    assert doc["rtt"] == {
        "count": 3,
        "min_ns": -5,
        "mean_ns": 1,
        "p50_ns": 2,
        "p90_ns": 3,
        "p99_ns": 4,
        "max_ns": 9,
    }
    assert doc["direct"] is None
    assert (doc["forward_lost"], doc["backward_lost"], doc["loss_ratio"]) == (1, 0, 0.25)
