"""The controller's session spec: address families and strict SSID matching."""

from __future__ import annotations

import pytest

from sixlab.controller._generated import controller_pb2 as pb
from sixlab.controller.core import ControllerError, SessionSpec
from sixlab.controller.northbound import _spec as spec_from_proto


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
