"""The ``xdp`` data plane on the SRv6 two-path testbed, as a user runs it.

The same sessions as ``test_stamp_srv6`` (both SRv6 paths, emulated delays A 5/12 ms and
B 20/3 ms, stateless and stateful), first with the ``socket`` reflector and then with
``sixlab stamp reflector --dataplane xdp --interface eth0``: each must measure the
configured delays within ±1 ms, and the two must agree within ±1 ms. The reflector's
exit summary proves the kernel program answered (``reflected=N`` among the xdp plane's
counters), not the user-space path it keeps for what XDP passes on; the Return Path TLV
and authenticated sessions take that path, and are measured too.

Then the same through the gRPC agents (``sixlab stamp agent --dataplane xdp``), with the
kernel collector on the sender as well, and the plane's counters read with GetCounters.

Testbed preparation (see ``sixlab.testbed._srv6``): the reflector's ``eth0`` is a veth
whose peer is R2's ``to_rfl``. Frames sent with XDP_TX on a veth are lost unless the
peer runs an XDP program, so R2's end gets the plain XDP_PASS program. Transmit checksum
offload goes off on the veths between the hosts and the routers, so that every frame an
XDP program reads carries a complete checksum (the emulated links pass offload state
through, ``sixlab.testbed.linkemu``).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from statistics import median
from typing import Any

import pytest

from sixlab.controller.core import Controller, SessionSpec
from sixlab.controller.store import SqliteStore
from sixlab.dataplane.xdp_plane import attach_xdp_pass
from sixlab.southbound.client import AgentClient, ReflectorSession, SenderSession, result_from_proto
from sixlab.stamp._events import StampResult
from sixlab.testbed import SRv6Path, SRv6TwoPaths
from sixlab.testbed._netns import entered
from tests.integration._stamp_helpers import SIXLAB, Measured, measure_path

pytestmark = pytest.mark.root

TOLERANCE_MS = 1.0
#: ``SHARE`` of the records within this of the emulated delay (medians within TOLERANCE_MS).
#: A program's T2/T4 is read in the veth's NAPI poll, which a loaded kernel defers to
#: ksoftirqd: a second mode about 1 ms above the first in a few records (as in
#: test_fastpath_srv6), which failed the nine-in-ten rule at 1 ms with old and new code
#: alike at load average 5-6.
SPREAD_MS = 2.0
#: Three in four: test_fastpath_srv6 saw four records of thirty late by 2-13 ms, twice in
#: a row, at load average 8; wrong time stamps show as records faster than the link.
SHARE = 0.75
MS = 1_000_000
COUNT = 20


@pytest.fixture
def xdp_testbed(srv6_testbed: SRv6TwoPaths) -> SRv6TwoPaths:
    tb = srv6_testbed
    for node, ifname in (
        (tb.sender, "eth0"),
        (tb.r1, "to_snd"),
        (tb.r2, "to_rfl"),
        (tb.reflector, "eth0"),
    ):
        node.exec(["ethtool", "-K", ifname, "tx", "off"])
    with entered(tb.r2.ns):
        attach_xdp_pass("to_rfl")
    return tb


# ------------------------------------------------------------------ standalone tools


@contextmanager
def _reflector(tb: SRv6TwoPaths, plane: str, *args: str) -> Iterator[list[str]]:
    """``sixlab stamp reflector`` in the reflector's namespace; yields, then holds, the
    lines of its exit summary (filled when the block ends)."""
    extra = ["--interface", "eth0"] if plane == "xdp" else []
    proc = tb.testbed.run_in(
        tb.reflector,
        [*SIXLAB, "reflector", "--dataplane", plane, *extra, *args],
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline().decode()
    assert "reflecting on" in line, line + proc.stderr.read().decode()
    summary: list[str] = []
    try:
        yield summary
    finally:
        proc.terminate()
        rest = proc.stderr.read().decode()
        assert proc.wait(10) == 0, rest
        proc.stderr.close()
        summary.extend(rest.splitlines())


def _measured(tb: SRv6TwoPaths, path: SRv6Path, *args: str, count: int = COUNT) -> Measured:
    """One session over ``path`` (after a 2-probe warm-up), its delays checked against the
    path's (medians within ±``TOLERANCE_MS``, ``SHARE`` of the records within
    ±``SPREAD_MS``; measured again if the records were only late, see ``measure_delays``)."""
    return measure_path(
        tb, path, *args, count=count, tolerance_ms=TOLERANCE_MS, spread_ms=SPREAD_MS, share=SHARE
    )


def _kernel_counters(summary: list[str]) -> dict[str, int]:
    """The ``xdp data plane: reflected=N, ...`` line of the reflector's exit summary."""
    for line in summary:
        if line.startswith("xdp data plane:"):
            pairs = re.findall(r"([a-z-]+)=(\d+)", line)
            return {k: int(v) for k, v in pairs}
    return {}


@pytest.mark.parametrize("mode", [[], ["--stateful"]], ids=["stateless", "stateful"])
def test_xdp_reflector_measures_what_user_space_measures(
    xdp_testbed: SRv6TwoPaths, mode: list[str]
) -> None:
    tb = xdp_testbed
    for ssid, name in ((1, "A"), (2, "B")):
        path = tb.paths[name]
        args = ["--ssid", str(ssid), "--return-segments", ",".join(path.return_segments)]
        measured: dict[str, tuple[float, float]] = {}
        docs: dict[str, dict[str, Any]] = {}
        for plane in ("socket", "xdp"):
            with _reflector(tb, plane, *args, *mode) as summary:
                m = _measured(tb, path, "--ssid", str(ssid))
            docs[plane], measured[plane] = m.doc, (m.direct_ms, m.return_ms)
        # The kernel answered every packet (2 warm-up + COUNT a run), user space none.
        assert _kernel_counters(summary) == {"reflected": m.runs * (COUNT + 2)}, summary
        assert "received 0, reflected 0" in "\n".join(summary), summary
        (sd, sr), (xd, xr) = measured["socket"], measured["xdp"]
        assert abs(sd - xd) <= TOLERANCE_MS, (name, measured)
        assert abs(sr - xr) <= TOLERANCE_MS, (name, measured)
        for plane, doc in docs.items():
            ttls = {r["ttl"] for r in doc["records"]}
            assert ttls == {62}, (plane, ttls)  # 64 less R1 and R2 on the way out
            rseq = [r["reflector_seq"] for r in doc["records"]]
            if mode:
                # Stateful: the reflector's own count from 0. The 2 warm-up packets came
                # from another sender process (another source port): another session
                # (RFC 8972 §3), with a count of its own.
                assert rseq == list(range(COUNT)), (plane, rseq)
            else:
                assert rseq == [r["seq"] for r in doc["records"]], (plane, rseq)


def test_xdp_reflector_leaves_tlvs_and_auth_to_its_user_space_path(
    xdp_testbed: SRv6TwoPaths,
) -> None:
    """A default session in the kernel; the Return Path TLV (RFC 9503) and HMAC are
    answered by the core behind the same plane, with the same delays."""
    tb = xdp_testbed
    runs = 0
    with _reflector(tb, "xdp") as summary:
        for name in ("A", "B"):
            path = tb.paths[name]
            runs += _measured(tb, path, "--return-segments", ",".join(path.return_segments)).runs
    n = runs * (COUNT + 2)
    assert _kernel_counters(summary) == {"pass-tlv": n}, summary
    assert f"received {n}, reflected {n}" in summary[0], summary

    b = tb.paths["B"]
    key = "5ec7e75ec7e7"
    with _reflector(tb, "xdp", "--auth-key", key, "--return-segments", ",".join(b.return_segments)):
        _measured(tb, b, "--auth-key", key, count=10)


def test_xdp_sender_collects_in_the_kernel(xdp_testbed: SRv6TwoPaths) -> None:
    """``sixlab stamp sender --dataplane xdp``: the collector program takes T4 and hands
    the replies to the session; same delays as with the socket sender."""
    tb = xdp_testbed
    a = tb.paths["A"]
    plane = ["--dataplane", "xdp", "--interface", "eth0", "--ssid", "3"]
    with _reflector(tb, "xdp", "--ssid", "3", "--return-segments", ",".join(a.return_segments)):
        via_socket = _measured(tb, a, "--ssid", "3")
        via_xdp = _measured(tb, a, *plane)
    assert via_xdp.doc["dataplane"] == {"collected": COUNT}
    assert abs(via_socket.direct_ms - via_xdp.direct_ms) <= TOLERANCE_MS
    assert abs(via_socket.return_ms - via_xdp.return_ms) <= TOLERANCE_MS
    assert {r["ttl"] for r in via_xdp.doc["records"]} == {62}


# -------------------------------------------------------------------------- agents


@contextmanager
def _agent(tb: SRv6TwoPaths, role: str, sock: Path, plane: str) -> Iterator[AgentClient]:
    node = tb.sender if role == "sender" else tb.reflector
    proc = tb.testbed.run_in(
        node,
        [*SIXLAB, "agent", "--role", role, "--grpc", f"unix:{sock}", "--dataplane", plane],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert line.startswith("stamp agent:"), line
    try:
        with AgentClient(f"unix:{sock}") as client:
            client.wait_ready()
            yield client
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
        proc.stdout.close()


def _records(sender: AgentClient, ssid: int) -> list[StampResult]:
    return [result_from_proto(r) for b in sender.stream_results(ssid) for r in b.results]


def _near(values: list[int], want_ms: float) -> bool:
    close = [abs(v / 1e6 - want_ms) <= SPREAD_MS for v in values]
    return abs(median(values) / 1e6 - want_ms) <= TOLERANCE_MS and sum(close) >= SHARE * len(close)


def test_xdp_agents_measure_both_paths(xdp_testbed: SRv6TwoPaths, tmp_path: Path) -> None:
    """Reflector and sender agents both on the xdp plane (the reflector and the
    collector programs), one session per path, stateful; GetCounters shows the kernel's
    work per session."""
    tb = xdp_testbed
    with (
        _agent(tb, "reflector", tmp_path / "r.sock", "xdp") as reflector,
        _agent(tb, "sender", tmp_path / "s.sock", "xdp") as sender,
    ):
        assert reflector.init(port=862, interface="eth0") == 862
        sport = sender.init(port=0, interface="eth0")
        assert sport != 0  # the bound ephemeral port, where the collector listens
        for warm in (False, True):
            for ssid, name in ((1, "A"), (2, "B")):
                path = tb.paths[name]
                sid = ssid + (10 if warm else 0)
                reflector.create_reflector_session(
                    ReflectorSession(sid, stateful=True, return_sid_list=path.return_segments)
                )
                reflector.start_session(sid)
                sender.create_sender_session(
                    SenderSession(
                        sid,
                        tb.reflector_addr,
                        sid_list=path.forward_segments,
                        reflector_port=862,
                        count=COUNT if warm else 2,
                        interval_ns=20 * MS,
                        stateful_reflector=True,
                        loss_timeout_ns=1000 * MS,
                    )
                )
            for ssid in (1, 2):
                sender.start_session(ssid + (10 if warm else 0))
            for ssid, name in ((1, "A"), (2, "B")):
                sid = ssid + (10 if warm else 0)
                records = _records(sender, sid)
                if not warm:
                    continue  # the warm-up crossed the cold path
                path = tb.paths[name]
                assert [r.seq for r in records] == list(range(COUNT))
                assert [r.reflector_seq for r in records] == list(range(COUNT))
                assert _near([r.direct_ns for r in records], path.forward_delay_ms), name
                assert _near([r.return_ns for r in records], path.return_delay_ms), name
                assert {r.ses_sender_ttl for r in records} == {62}
                (sc,) = sender.counters(sid).sessions
                assert dict(sc.dataplane) == {"collected": COUNT}
                assert sc.received == COUNT
                (rc,) = reflector.counters(sid).sessions
                assert dict(rc.dataplane) == {"reflected": COUNT}
                assert rc.reflected == 0  # the core answered none of them
        totals = reflector.counters()
        assert dict(totals.dataplane) == {"reflected": 2 * (COUNT + 2)}
        assert totals.reflector.received == 0
        # Stop takes the session out of the kernel too: its packets now go to the core,
        # which has no such session either and drops them, so nothing comes back.
        reflector.stop_session(11)
        sender.destroy_session(11)
        sender.create_sender_session(
            SenderSession(
                11,
                tb.reflector_addr,
                sid_list=tb.paths["A"].forward_segments,
                reflector_port=862,
                count=3,
                interval_ns=20 * MS,
                loss_timeout_ns=300 * MS,
            )
        )
        sender.start_session(11)
        assert _records(sender, 11) == []
        after = reflector.counters()
        assert after.dataplane["pass-no-session"] == 3
        assert after.reflector.dropped == {"no-session": 3}
        assert reflector.reset() == 4


def test_controller_drives_xdp_agents(xdp_testbed: SRv6TwoPaths, tmp_path: Path) -> None:
    """The controller, unchanged, over agents whose Init asks for the xdp plane: both
    paths measured with the configured delays."""
    tb = xdp_testbed
    with (
        _agent(tb, "reflector", tmp_path / "r.sock", "socket") as _r,
        _agent(tb, "sender", tmp_path / "s.sock", "socket") as _s,
    ):
        c = Controller(SqliteStore(tmp_path / "c.db"), poll_interval_s=0.05)
        try:
            c.register_node("s", f"unix:{tmp_path / 's.sock'}", "sender")
            c.register_node("r", f"unix:{tmp_path / 'r.sock'}", "reflector")
            c.init_node("s", dataplane="xdp", interface="eth0", port=0)
            c.init_node("r", dataplane="xdp", interface="eth0", port=862)
            for name in ("A", "B"):
                path = tb.paths[name]
                c.create_session(
                    SessionSpec(
                        name=name,
                        sender="s",
                        reflector="r",
                        reflector_address=tb.reflector_addr,
                        segments=path.forward_segments,
                        return_segments=path.return_segments,
                        interval_ns=20 * MS,
                        count=30,
                        stateful=True,
                        loss_timeout_ns=1000 * MS,
                    )
                )
                c.start_session(name)
            for name in ("A", "B"):
                path = tb.paths[name]
                assert c.wait_finished(name, 30)
                stats = c.stats(name)
                assert (stats.received, stats.lost) == (30, 0)
                assert stats.direct is not None
                assert stats.backward is not None
                assert abs(stats.direct.p50_ns / 1e6 - path.forward_delay_ms) <= TOLERANCE_MS
                assert abs(stats.backward.p50_ns / 1e6 - path.return_delay_ms) <= TOLERANCE_MS
            kernel = c.client("r").counters()
            assert kernel.dataplane["reflected"] == 60  # all in XDP
            assert c.client("s").counters().dataplane["collected"] == 60
        finally:
            c.close()
