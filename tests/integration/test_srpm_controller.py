"""The controller drives the SR performance-measurement modes (docs/srpm.md).

Agents run as processes in the testbed's namespaces; the controller runs here, with its
northbound API on a unix socket that the client and the CLI use. One testbed (links A
and B as one ECMP route, the agent-less far host) carries:

- a loopback session with only a sender node, over link B, far and link A back;
- a two-way session over 8 flow labels with a delay threshold below both links' round
  trips: per-label stats find both links, and the threshold raises a delay event that
  is stored, exported as a metric and listed by ``sixlab controller events``;
- a direct-measurement session counting data sent alongside its probes.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from ipaddress import IPv6Address
from pathlib import Path

import pytest

from sixlab.cli import controller as cli
from sixlab.controller import Controller, ControllerClient, SessionSpec, SqliteStore
from sixlab.controller.northbound import ControllerServer, serve_controller
from sixlab.southbound import AgentClient
from sixlab.testbed import SRv6TwoPaths, srv6_two_paths
from sixlab.testbed._netns import namespace_pids
from sixlab.wire.ipv6 import NextHeader
from sixlab.wire.srh import SegmentRoutingHeader
from tests.integration.conftest import TEST_PREFIX

pytestmark = pytest.mark.root

MS = 1_000_000
TOLERANCE_MS = 1.0


@dataclass
class Lab:
    tb: SRv6TwoPaths
    controller: Controller
    server: ControllerServer
    address: str
    client: ControllerClient


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with srv6_two_paths(far_ms=(2.0, 4.0), ecmp=True, prefix=TEST_PREFIX) as tb:
        addresses = {}
        for node, role in ((tb.sender, "sender"), (tb.reflector, "reflector")):
            path = tmp_path / f"{role}.sock"
            argv = [sys.executable, "-m", "sixlab", "stamp", "agent", "--role", role]
            tb.testbed.run_in(node, [*argv, "--grpc", f"unix:{path}"], stdout=subprocess.DEVNULL)
            with AgentClient(f"unix:{path}") as agent:
                agent.wait_ready(20)
            addresses[role] = f"unix:{path}"
        controller = Controller(SqliteStore(tmp_path / "c.sqlite"), poll_interval_s=0.1)
        address = f"unix:{tmp_path}/controller.sock"
        server = serve_controller(address, controller)
        client = ControllerClient(address)
        try:
            client.register_node("s", addresses["sender"], "sender")
            client.register_node("r", addresses["reflector"], "reflector")
            client.init_node("s", source=tb.sender_addr, port=0)
            client.init_node("r", source=tb.reflector_addr, port=862)
            yield Lab(tb, controller, server, address, client)
        finally:
            client.close()
            server.stop(0)
            controller.close()
            controller.store.close()


def _run(lab: Lab, spec: SessionSpec, timeout: float = 60) -> None:
    lab.client.create_session(spec)
    lab.client.start_session(spec.name)
    lab.client.wait_state(spec.name, ("finished",), timeout)


def test_a_loopback_session_has_only_a_sender(lab: Lab) -> None:
    tb = lab.tb
    assert tb.far is not None
    loop = tb.loopback_paths["F"]
    base = SessionSpec(
        name="warm", sender="s", reflector="", reflector_address="", loopback=True,
        segments=loop.segments, interval_ns=20 * MS, count=2,
    )  # fmt: skip
    _run(lab, base)  # resolves neighbours along the loop
    _run(lab, replace(base, name="loop", count=20))
    info = lab.client.session("loop")
    assert (info.reflector, info.state) == ("", "finished")
    stats = lab.client.stats("loop")
    assert stats.rtt is not None
    assert stats.direct is None  # a loopback session measures no one-way delay
    # Each emulated leg of the loop adds its own wake-up error, as on a one-way delay:
    # the one-way tolerance per leg (loop F has four).
    tolerance = TOLERANCE_MS * len(loop.leg_delays_ms)
    assert abs(stats.rtt.p50_ns / MS - loop.round_trip_delay_ms) <= tolerance, stats.rtt
    assert stats.rtt.min_ns / MS >= loop.round_trip_delay_ms - 0.1  # no loop beats its links
    records = lab.client.results("loop").records
    assert records
    assert all(r.loopback for r in records)
    assert namespace_pids([tb.far.ns]) == []  # nothing ran on the far host
    assert lab.controller.client("r").info().ssids == []  # the reflector never heard of it
    lab.client.destroy_session("loop")


def test_flow_labels_and_a_delay_event(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    spec = SessionSpec(
        name="ecmp", sender="s", reflector="r", reflector_address=lab.tb.reflector_addr,
        interval_ns=10 * MS, count=80, flow_labels=tuple(range(1, 9)), max_delay_ms=10.0,
        event_window_s=5.0,
    )  # fmt: skip
    _run(lab, replace(spec, name="warm", count=8, max_delay_ms=None))
    _run(lab, spec)
    stats = lab.client.stats("ecmp")
    assert [f.flow_label for f in stats.flows] == list(range(1, 9))
    links = set()
    for flow in stats.flows:
        assert flow.direct is not None
        low = flow.direct.min_ns / MS  # link A 5 ms, link B 20 ms forward
        assert min(abs(low - 5.0), abs(low - 20.0)) <= TOLERANCE_MS, flow
        links.add("A" if low < 12.5 else "B")
    assert links == {"A", "B"}
    # Round trips are 17 or 32 ms: above the 10 ms threshold, so a delay event rose.
    events = lab.client.events("ecmp")
    assert [(e.kind, e.state) for e in events] == [("delay", "raised")]
    assert events[0].value > 10.0
    assert lab.controller.store.raised(lab.controller.store.session("ecmp").id) == ["delay"]
    metric = lab.controller.metrics.registry.get_sample_value(
        "sixlab_session_event_active", {"path": "ecmp", "kind": "delay"}
    )
    assert metric == 1.0
    assert cli.main(["controller", "events", "ecmp", "--controller", lab.address, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(e["session"], e["kind"], e["state"]) for e in doc] == [("ecmp", "delay", "raised")]
    assert cli.main(["controller", "stats", "ecmp", "--controller", lab.address, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["flows"]) == 8


def test_direct_measurement_from_the_controller(lab: Lab) -> None:
    tb = lab.tb
    path = tb.paths["A"]
    port = 9999
    spec = SessionSpec(
        name="data", sender="s", reflector="r", reflector_address=tb.reflector_addr,
        segments=path.forward_segments, return_segments=path.return_segments,
        interval_ns=50 * MS, count=40,
        dm_sender_sent=f"{path.forward_segments[0]},udp,{port}",
        dm_reflector_received=f"{tb.reflector_addr},udp,{port}",
    )  # fmt: skip
    lab.client.create_session(spec)
    lab.client.start_session("data")
    source = tb.sender.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        srh = SegmentRoutingHeader.from_path(
            tuple(IPv6Address(a) for a in path.forward_segments), NextHeader.UDP
        ).encode()
        source.setsockopt(socket.IPPROTO_IPV6, 57, srh)  # IPV6_RTHDR
        time.sleep(0.5)  # probes before the data
        for _ in range(200):
            source.sendto(b"data", (tb.reflector_addr, port))
    finally:
        source.close()
    lab.client.wait_state("data", ("finished",), 60)
    loss = lab.client.stats("data").data_loss
    assert loss is not None
    assert (loss.forward_sent, loss.forward_lost) == (200, 0)
    assert loss.intervals
    lab.client.destroy_session("data")
    assert "sixlab_dm" not in tb.sender.exec(["nft", "list", "tables"]).stdout
