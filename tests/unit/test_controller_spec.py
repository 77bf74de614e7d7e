"""The controller's session spec (address families, strict SSID matching) and its path
statistics (losses after the last reply are not backward losses; SSID-0 replies)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sixlab.controller._generated import controller_pb2 as pb
from sixlab.controller.core import Controller, ControllerError, SessionSpec
from sixlab.controller.northbound import ControllerServicer
from sixlab.controller.northbound import _spec as spec_from_proto
from sixlab.controller.store import Store


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
    store = Store(tmp_path / "c.sqlite")
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
