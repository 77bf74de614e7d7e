"""The SR performance-measurement modes through the agent API (docs/srpm.md).

Agents run as their own processes in the testbed's namespaces (gRPC on unix sockets).
One testbed: links A (5 ms forward) and B (25 ms forward) as one ECMP route from R1,
and the agent-less far host. Over the API: a loopback session (only a sender agent takes
part; the far host runs nothing), a session over 16 flow labels that finds both links,
and a direct-measurement session whose nftables counters live exactly as long as the
session and count the data sent alongside.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv6Address
from pathlib import Path

import pytest

from sixlab.southbound import (
    AgentClient,
    ReflectorSession,
    SenderSession,
    SouthboundError,
    result_from_proto,
)
from sixlab.southbound._generated import stamp_pb2 as pb
from sixlab.stamp import data_loss_total, path_stats, per_flow_stats, spread_labels
from sixlab.testbed import SRv6TwoPaths, srv6_two_paths
from sixlab.testbed._netns import namespace_pids
from sixlab.wire.ipv6 import NextHeader
from sixlab.wire.srh import SegmentRoutingHeader
from tests.integration.conftest import TEST_PREFIX

pytestmark = pytest.mark.root

MS = 1_000_000
TOLERANCE_MS = 1.0
AGENT_START_S = 20.0


@dataclass
class Lab:
    tb: SRv6TwoPaths
    sender: AgentClient
    reflector: AgentClient
    sender_port: int


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with srv6_two_paths(
        path_a_ms=(5.0, 2.0),
        path_b_ms=(25.0, 2.0),
        far_ms=(1.0, 1.0),
        ecmp=True,
        prefix=TEST_PREFIX,
    ) as tb:
        clients = []
        for node, role in ((tb.sender, "sender"), (tb.reflector, "reflector")):
            path = tmp_path / f"{role}.sock"
            argv = [sys.executable, "-m", "sixlab", "stamp", "agent", "--role", role]
            tb.testbed.run_in(node, [*argv, "--grpc", f"unix:{path}"], stdout=subprocess.DEVNULL)
            client = AgentClient(f"unix:{path}")
            client.wait_ready(AGENT_START_S)
            clients.append(client)
        sender, reflector = clients
        try:
            port = sender.init(port=0, source=tb.sender_addr)
            reflector.init(port=862, source=tb.reflector_addr)
            yield Lab(tb, sender, reflector, port)
        finally:
            sender.close()
            reflector.close()


def _records(client: AgentClient, ssid: int) -> list[pb.StampResult]:
    return [r for batch in client.stream_results(ssid) for r in batch.results]


def test_loopback_over_the_agent_api(lab: Lab) -> None:
    tb = lab.tb
    assert tb.far is not None
    assert namespace_pids([tb.far.ns]) == []
    loop = tb.loopback_paths["F"]
    # The first resolves neighbours (the agent's default loss timeout: a probe lost to
    # Neighbour Discovery is not waited for long). Every probe of the second is to come
    # back: a loss timeout no loop the loaded machine holds reaches (the session ends
    # with its last reply, so it costs a passing run nothing).
    for ssid, count, loss_timeout_ns in ((1, 2, 0), (2, 20, 10_000 * MS)):
        lab.sender.create_sender_session(
            SenderSession(
                ssid,
                "",
                sid_list=loop.segments,
                loopback=True,
                count=count,
                interval_ns=20 * MS,
                loss_timeout_ns=loss_timeout_ns,
            )
        )
        lab.sender.start_session(ssid)
        records = _records(lab.sender, ssid)
    assert len(records) == 20
    assert all(r.loopback and r.t2_ns == 0 for r in records)
    st = path_stats([result_from_proto(r) for r in records])
    assert st.rtt is not None
    # Each emulated leg of the loop adds its own wake-up error, as on a one-way delay:
    # the one-way tolerance per leg (loop F has four).
    tolerance = TOLERANCE_MS * len(loop.leg_delays_ms)
    assert abs(st.rtt.p50_ns / MS - loop.round_trip_delay_ms) <= tolerance, st.rtt
    assert st.rtt.min_ns / MS >= loop.round_trip_delay_ms - 0.1  # no loop beats its links
    # What a loopback session cannot be, the agent refuses by field.
    for kwargs, field in (
        ({"sid_list": ()}, "sid_list"),
        ({"sid_list": loop.segments, "stateful_reflector": True}, "reflector_mode"),
        ({"sid_list": loop.segments, "reflector": tb.reflector_addr}, "reflector_address"),
    ):
        args = {"loopback": True, "reflector": "", **kwargs}
        with pytest.raises(SouthboundError, match=field):
            lab.sender.create_sender_session(SenderSession(9, **args))  # type: ignore[arg-type]
    with pytest.raises(SouthboundError, match="loopback"):
        lab.reflector.create_session(pb.CreateStampSessionRequest(ssid=9, loopback=True))


def test_flow_labels_over_the_agent_api(lab: Lab) -> None:
    labels = spread_labels(16)
    lab.reflector.create_reflector_session(ReflectorSession(3))
    lab.reflector.start_session(3)
    lab.sender.create_sender_session(
        SenderSession(3, lab.tb.reflector_addr, flow_labels=labels, count=64, interval_ns=10 * MS)
    )
    lab.sender.start_session(3)
    records = [result_from_proto(r) for r in _records(lab.sender, 3)]
    assert {r.flow_label for r in records} == set(labels)
    links = set()
    for label, st in per_flow_stats(records, labels).items():
        assert st.direct is not None, label
        low = st.direct.min_ns / MS
        assert min(abs(low - 5.0), abs(low - 25.0)) <= TOLERANCE_MS, (label, st.direct)
        links.add("A" if low < 15.0 else "B")
    assert links == {"A", "B"}
    with pytest.raises(SouthboundError, match="flow_labels"):
        lab.sender.create_sender_session(
            SenderSession(9, lab.tb.reflector_addr, flow_labels=[0x80000])
        )


def _tables(node: object) -> str:
    return node.exec(["nft", "list", "tables"]).stdout  # type: ignore[attr-defined, no-any-return]


def test_direct_measurement_over_the_agent_api(lab: Lab) -> None:
    tb = lab.tb
    path = tb.paths["A"]
    port = 9999
    dm_sender = pb.DirectMeasurement(
        sent=pb.DataFlowMatch(prefix=path.forward_segments[0], protocol="udp", port=port)
    )
    dm_reflector = pb.DirectMeasurement(
        received=pb.DataFlowMatch(prefix=tb.reflector_addr, protocol="udp", port=port)
    )
    lab.reflector.create_reflector_session(
        ReflectorSession(4, return_sid_list=path.return_segments, direct_measurement=dm_reflector)
    )
    lab.reflector.start_session(4)
    lab.sender.create_sender_session(SenderSession(
        4, tb.reflector_addr, sid_list=path.forward_segments, count=30, interval_ns=50 * MS,
        direct_measurement=dm_sender,
    ))  # fmt: skip
    assert "sixlab_dm_sender_4" in _tables(tb.sender)
    assert "sixlab_dm_reflector_4" in _tables(tb.reflector)
    source = tb.sender.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        srh = SegmentRoutingHeader.from_path(
            tuple(IPv6Address(a) for a in path.forward_segments), NextHeader.UDP
        ).encode()
        source.setsockopt(socket.IPPROTO_IPV6, 57, srh)  # IPV6_RTHDR
        lab.sender.start_session(4)
        records: list[pb.StampResult] = []
        stream = iter(lab.sender.stream_results(4))
        while len(records) < 3:  # probes before the data
            records += next(stream).results
        for _ in range(300):
            source.sendto(b"data", (tb.reflector_addr, port))
        for batch in stream:
            records += batch.results
    finally:
        source.close()
    results = [result_from_proto(r) for r in records]
    total = data_loss_total([(r.seq, r.t1_ns, r.data) for r in results if r.data is not None])
    assert total is not None
    assert (total.forward_sent, total.forward_lost) == (300, 0)  # no loss on the links
    lab.sender.destroy_session(4)
    lab.reflector.destroy_session(4)
    assert "sixlab_dm" not in _tables(tb.sender) + _tables(tb.reflector)
    with pytest.raises(SouthboundError, match="direct_measurement"):
        lab.sender.create_sender_session(
            SenderSession(9, tb.reflector_addr, direct_measurement=pb.DirectMeasurement())
        )
    bad = pb.DirectMeasurement(sent=pb.DataFlowMatch(prefix="fd00::/64", port=80))
    with pytest.raises(SouthboundError, match=r"direct_measurement\.sent\.port"):
        lab.sender.create_sender_session(
            SenderSession(9, tb.reflector_addr, direct_measurement=bad)
        )
