"""Two STAMP agents over IPv4 in namespaces, driven through the southbound API.

sender ══(emulated link: 4 ms there, 9 ms back)══ router ── reflector, all IPv4
(10.77.1.0/24, 10.77.2.0/24). Each agent is a ``sixlab stamp agent`` process in its
node's namespace on the ``socket`` plane, served on a unix socket the test reaches
through the file system. What IPv4 changes in STAMP is checked on the packets that
crossed the router: the reflector's receive TTL in Ses-Sender TTL (RFC 8762 §4.3, the
TTL field for IPv4), the one-way delays in each direction, and every packet answered.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sixlab.southbound import AgentClient, ReflectorSession, SenderSession, result_from_proto
from sixlab.testbed import DirectionConfig, LinkEmulation, Node, Testbed
from tests.integration.conftest import TEST_PREFIX

pytestmark = pytest.mark.root

MS = 1_000_000
SENDER, SENDER_GW = "10.77.1.1", "10.77.1.254"
REFLECTOR, REFLECTOR_GW = "10.77.2.1", "10.77.2.254"
THERE_MS, BACK_MS = 4.0, 9.0
#: How far a median one-way delay may be from the link's (ms), as the demo allows.
TOLERANCE_MS = 1.0
COUNT = 50


@dataclass
class Lab:
    tb: Testbed
    sender: Node
    sockets: dict[str, Path]


def _agent(tb: Testbed, node: Node, role: str, path: Path) -> None:
    argv = [sys.executable, "-m", "sixlab", "stamp", "agent", "--role", role]
    proc = tb.run_in(node, [*argv, "--grpc", f"unix:{path}"], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(b"stamp agent:"), line


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with Testbed(prefix=TEST_PREFIX) as tb:
        snd = tb.add_node("snd")
        rtr = tb.add_node("rtr", router=True)
        rfl = tb.add_node("rfl")
        rtr.sysctl({"net.ipv4.ip_forward": 1})
        emulation = LinkEmulation(ab=DirectionConfig(THERE_MS), ba=DirectionConfig(BACK_MS))
        tb.add_link(snd, rtr, if_a="to_rtr", if_b="to_snd", addr_a=SENDER, addr_b=SENDER_GW,
                    prefixlen=24, emulation=emulation)  # fmt: skip
        tb.add_link(rtr, rfl, if_a="to_rfl", if_b="to_rtr", addr_a=REFLECTOR_GW, addr_b=REFLECTOR,
                    prefixlen=24)  # fmt: skip
        snd.ipr.route("add", dst="10.77.2.0/24", gateway=SENDER_GW)
        rfl.ipr.route("add", dst="10.77.1.0/24", gateway=REFLECTOR_GW)
        sockets = {role: tmp_path / f"{role}.sock" for role in ("sender", "reflector")}
        _agent(tb, snd, "sender", sockets["sender"])
        _agent(tb, rfl, "reflector", sockets["reflector"])
        yield Lab(tb, snd, sockets)


def test_a_session_over_ipv4_measured_end_to_end(lab: Lab) -> None:
    with (
        AgentClient(f"unix:{lab.sockets['sender']}") as sender,
        AgentClient(f"unix:{lab.sockets['reflector']}") as reflector,
    ):
        rport = reflector.init(port=0, source=REFLECTOR)
        sender.init(port=0, source=SENDER)
        reflector.create_reflector_session(ReflectorSession(7))
        reflector.start_session(7)
        # Every probe is to be answered: a loss timeout no reply the loaded machine holds
        # reaches (the session ends with the last reply, so it costs a passing run nothing).
        sender.create_sender_session(SenderSession(
            7, REFLECTOR, reflector_port=rport, count=COUNT, interval_ns=20 * MS,
            loss_timeout_ns=10_000 * MS,
        ))  # fmt: skip
        sender.start_session(7)
        records = [result_from_proto(r) for b in sender.stream_results(7) for r in b.results]
        counters = sender.counters(7).sessions[0]
        reflected = reflector.counters(7).sessions[0].reflected

    assert [r.seq for r in records] == list(range(COUNT))
    assert (counters.sent, counters.lost) == (COUNT, 0)
    assert reflected == COUNT
    # Ses-Sender TTL: what the reflector received, one router after the sender's TTL.
    sent_ttl = int(lab.tb.exec_in(lab.sender, ["sysctl", "-n", "net.ipv4.ip_default_ttl"]).stdout)
    assert {r.ses_sender_ttl for r in records} == {sent_ttl - 1}
    # Both ends on this machine's clock: each direction's own delay shows.
    there = statistics.median(r.direct_ns for r in records) / MS
    back = statistics.median(r.return_ns for r in records) / MS
    assert abs(there - THERE_MS) <= TOLERANCE_MS, there
    assert abs(back - BACK_MS) <= TOLERANCE_MS, back
