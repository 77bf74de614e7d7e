"""The controller's session spec (address families, strict SSID matching) and its path
statistics (losses after the last reply are not backward losses; SSID-0 replies)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from sixlab.controller._generated import controller_pb2 as pb
from sixlab.controller.core import Controller, ControllerError, SessionSpec
from sixlab.controller.metrics import ControllerMetrics
from sixlab.controller.northbound import ControllerServicer
from sixlab.controller.northbound import _spec as spec_from_proto
from sixlab.controller.store import ResultBatch, SqliteStore
from sixlab.stamp import StampResult
from sixlab.wire.timestamp import ErrorEstimate


def spec(**kw: object) -> SessionSpec:
    fields: dict[str, object] = {
        "name": "p",
        "sender": "s",
        "reflector": "r",
        "reflector_address": "fd00::2",
    }
    fields.update(kw)
    return SessionSpec(**fields)  # type: ignore[arg-type]


def test_ipv4_sessions_are_accepted_without_segments() -> None:
    spec(reflector_address="192.0.2.2", source_address="192.0.2.1").validate()


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"reflector_address": "192.0.2.2", "segments": ("fc00::1",)}, "segments"),
        ({"reflector_address": "192.0.2.2", "source_address": "fd00::1"}, "source_address"),
        ({"reflector_address": "fd00::2", "source_address": "192.0.2.1"}, "source_address"),
        ({"reflector_address": "fd00::2", "segments": ("192.0.2.9",)}, "segments"),
        ({"reflector_address": "not-an-address"}, "reflector_address"),
    ],
)
def test_address_families_are_checked(kw: dict[str, object], field: str) -> None:
    with pytest.raises(ControllerError, match=field):
        spec(**kw).validate()


def test_strict_ssid_comes_from_the_request() -> None:
    request = pb.CreateSessionRequest(
        name="p", sender="s", reflector="r", reflector_address="fd00::2", strict_ssid=True
    )
    assert spec_from_proto(request).strict_ssid
    assert not spec().strict_ssid


def test_path_stats_do_not_count_unclassified_loss_as_backward(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "c.sqlite")
    store.add_node("s", "127.0.0.1:1", "sender")
    store.add_node("r", "127.0.0.1:2", "reflector")
    row = store.add_session("p", 1, sender="s", reflector="r", params={}, now_ns=1)
    # 10 sent, 4 lost: 1 forward, 2 after the last reply (not placed), so 1 backward.
    store.store_results(row.id, [], (10, 4, 1, 0), unclassified_lost=2, ssid_zero=6)
    controller = Controller(store)
    try:
        reply = ControllerServicer(controller).GetPathStats(
            pb.GetPathStatsRequest(name="p"),
            None,  # the context is used only to abort on an error
        )
    finally:
        controller.close()
    assert (reply.lost, reply.forward_lost, reply.backward_lost) == (4, 1, 1)
    assert (reply.unclassified_lost, reply.ssid_zero) == (2, 6)


def test_stats_and_metrics_read_an_error_bound_and_counters_past_int64(tmp_path: Path) -> None:
    """Records whose Error Estimates (Scale 57, Multiplier 255 each, RFC 4656 §4.1.2)
    bound the error beyond 2^63 ns, counters saturated at 2^63 − 1 in two epochs: the
    northbound's path statistics answer from the raw results (the exact bound, below
    2^64 here) and from the rollups (stored as 2^63 − 1: "at least"), and the
    Prometheus metrics of those records render."""
    i64_max = 2**63 - 1
    huge = ErrorEstimate(scale=57, multiplier=255)
    t0 = 1_700_000_000 * 10**9
    recs = [(k + 1, StampResult(0, k, t0 + k * 10**9, t0 + k * 10**9 + 100,
                                t0 + k * 10**9 + 150, t0 + k * 10**9 + 300, huge, huge, 64, k))
            for k in range(3)]  # fmt: skip
    store = SqliteStore(tmp_path / "c.sqlite")
    store.add_node("s", "127.0.0.1:1", "sender")
    store.add_node("r", "127.0.0.1:2", "reflector")
    row = store.add_session("p", 1, sender="s", reflector="r", params={}, now_ns=t0)
    store.store_results(row.id, recs, (i64_max, i64_max, None, 0))
    store.begin_epoch("p", t0 + 10**9)
    store.store_results(row.id, [], (i64_max, 3, None, 0), epoch=1)
    controller = Controller(store, clock=lambda: t0 + 10 * 10**9)
    servicer = ControllerServicer(controller)
    try:
        raw = servicer.GetPathStats(pb.GetPathStatsRequest(name="p"), None)
        assert raw.max_error_bound_ns == recs[0][1].error_bound_ns > i64_max
        assert store.roll_up() == 3
        controller.raw_stats_ns = 0  # every range is "long": the rollups answer
        rolled = servicer.GetPathStats(pb.GetPathStatsRequest(name="p"), None)
        assert rolled.max_error_bound_ns == i64_max
        for reply in (raw, rolled):
            assert (reply.received, reply.sent, reply.lost) == (3, i64_max, i64_max)
            assert reply.round_trip_delay.max_ns == 250
        metrics = ControllerMetrics()
        metrics.observe_rows("p", ResultBatch(row.id, 0, recs).result_rows(), t0)
        assert b"sixlab" in generate_latest(metrics.registry)
    finally:
        controller.close()
