"""The SR performance-measurement fields of a session survive every conversion: the
northbound request, Export's TOML and back (docs/srpm.md)."""

from __future__ import annotations

import pytest

from sixlab.cli import _declarative as declarative
from sixlab.controller import ControllerError, SessionSpec
from sixlab.controller import northbound as nb
from sixlab.controller._generated import controller_pb2 as pb
from sixlab.controller.client import spec_to_proto

LOOP = SessionSpec(
    name="loop", sender="s", reflector="", reflector_address="", loopback=True,
    segments=("fc00:0:1::b", "fc00:0:13::e", "fc00:0:2::a", "fd00:0:1::1"),
    source_address="fd00:0:1::1", max_delay_ms=40.0, event_window_s=5.0,
)  # fmt: skip
ECMP = SessionSpec(
    name="ecmp", sender="s", reflector="r", reflector_address="fd00:0:2::2",
    flow_labels=(1, 2, 3), dm_sender_sent="fc00:0:1::a,udp,9999",
    dm_reflector_received="fd00:0:2::2/128,udp,9999", max_jitter_ms=2.5, max_loss_ratio=0.01,
)  # fmt: skip


@pytest.mark.parametrize("spec", [LOOP, ECMP])
def test_a_spec_survives_the_request_both_ways(spec: SessionSpec) -> None:
    spec.validate()
    assert nb._spec(nb.spec_to_request(spec)) == spec
    assert nb._spec(spec_to_proto(spec)) == spec


def test_a_spec_survives_export_and_apply_files() -> None:
    config = pb.ApplyRequest(
        sessions=[pb.SessionConfig(spec=nb.spec_to_request(s), running=True) for s in (LOOP, ECMP)]
    )
    text = declarative.dump(config)
    assert "loopback = true" in text
    assert "flow-labels = [1, 2, 3]" in text
    again = declarative.loads(text)
    assert [nb._spec(c.spec) for c in again.sessions] == [LOOP, ECMP]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"reflector": "r"}, "reflector"),
        ({"segments": ()}, "segments"),
        ({"stateful": True}, "stateful"),
        ({"dm_sender_sent": "fd00::/64"}, "dm_"),
        ({"reflector_address": "fd00:0:2::2"}, "reflector_address"),
    ],
)
def test_what_a_loopback_session_cannot_have_is_refused(
    changes: dict[str, object], field: str
) -> None:
    from dataclasses import replace  # noqa: PLC0415

    with pytest.raises(ControllerError, match=field):
        replace(LOOP, **changes).validate()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"flow_labels": (0,)}, "flow_labels"),
        ({"dm_reflector_sent": "nonsense"}, "dm_reflector_sent"),
        ({"dm_sender_received": "fd00::/64,sctp"}, "dm_sender_received"),
        ({"max_loss_ratio": 1.5}, "loss_ratio"),
        ({"max_delay_ms": -1.0}, "delay_ms"),
    ],
)
def test_bad_srpm_fields_are_refused_by_name(changes: dict[str, object], field: str) -> None:
    from dataclasses import replace  # noqa: PLC0415

    with pytest.raises(ControllerError, match=field):
        replace(ECMP, **changes).validate()  # type: ignore[arg-type]


def test_a_config_file_names_a_bad_srpm_key() -> None:
    head = '[sessions.p]\nsender = "s"\nreflector = "r"\nreflector-address = "fd00::2"\n'
    for line, key in (
        ('flow-labels = "4"', "flow-labels"),
        ("dm-sender-sent = 5", "dm-sender-sent"),
        ('max-loss = "x"', "max-loss"),
    ):
        with pytest.raises(ValueError, match=key):
            declarative.loads(head + line + "\n")
    loop = declarative.loads('[sessions.l]\nsender = "s"\nloopback = true\n')
    assert loop.sessions[0].spec.loopback
    assert loop.sessions[0].spec.reflector == ""
