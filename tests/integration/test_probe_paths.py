"""The socket plane's batched probe path (``sixlab.dataplane.probeio``) on the wire, in
namespaces: what leaves the sender's link, read by a packet tap and decoded by scapy.

The socket holds one sticky ``IPV6_RTHDR`` (the kernel refuses the per-message form for
type 4, ``sixlab.dataplane.udpsocket``): sessions with different SRv6 paths, or with
and without one, share it, so each batch must go out with its own routing header set
on the socket, whichever path (C or Python) sent last.
"""

from __future__ import annotations

import time
from ipaddress import IPv6Address

import pytest
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
from scapy.layers.l2 import Ether

from sixlab.dataplane.base import DataplaneConfig, create
from sixlab.dataplane.engine import SenderEngine, SenderSessionSpec
from sixlab.stamp.sender import SenderConfig
from sixlab.testbed._netns import entered
from tests.integration._pair import veth_pair
from tests.integration._tap import Tap

pytestmark = pytest.mark.root

G_ADDR, R_ADDR = "fd00:70::1", "fd00:70::2"
#: Segments of the SRv6 sessions (never reached: the test reads what leaves G).
SEG_1, SEG_2 = IPv6Address("fd00:70::51"), IPv6Address("fd00:70::52")
PORT = 862


def _sent(tap: Tap) -> dict[int, list[tuple[str, ...]]]:
    """SSID -> for each probe G sent, the segment list its SRH carried (empty: no SRH)."""
    out: dict[int, list[tuple[str, ...]]] = {}
    for frame in tap.frames():
        if not frame.outgoing:
            continue
        pkt = Ether(frame.data)
        if IPv6 not in pkt or UDP not in pkt or pkt[UDP].dport != PORT:
            continue
        payload = bytes(pkt[UDP].payload)
        ssid = int.from_bytes(payload[14:16])
        srh = pkt.getlayer(IPv6ExtHdrSegmentRouting)
        path = tuple(str(a) for a in srh.addresses) if srh is not None else ()
        out.setdefault(ssid, []).append(path)
    return out


@pytest.mark.parametrize("compiled", [True, False], ids=["c-path", "python-path"])
def test_sessions_with_and_without_srv6_paths_keep_their_own_routing_headers(
    compiled: bool,
) -> None:
    """Three sessions on one socket: SSID 1 along SEG_1, SSID 2 along SEG_2, SSID 3
    straight to R. Every probe leaves G with its own session's routing header (RFC 8754
    §2: Segment List[0] is the final destination, the last entry the first segment) and
    SSID 3's with none."""
    with veth_pair(G_ADDR, R_ADDR) as p, Tap(p.g, "g0") as tap:
        for segment in (SEG_1, SEG_2):  # the first segments, "on-link": frames leave for R
            p.g.add_neighbour("g0", str(segment), p.r.mac("r0"))
        with entered(p.g.ns):
            plane = create("socket", DataplaneConfig(port=0))
            plane.open()
        engine = SenderEngine(plane, compiled=compiled)
        try:
            paths = {1: (SEG_1,), 2: (SEG_2,), 3: None}
            for ssid, segments in paths.items():
                cfg = SenderConfig(ssid, interval_ns=10 * 10**6, count=20, loss_timeout_ns=10**8)
                spec = SenderSessionSpec(cfg, IPv6Address(R_ADDR), PORT, segments=segments)
                engine.add_session(spec)
            engine.start()
            assert (engine.probe_io is not None) == compiled
            for ssid in paths:
                engine.start_session(ssid)
            for ssid in paths:
                assert engine.wait_finished(ssid, 10.0)
            time.sleep(0.1)
            sent = _sent(tap)
        finally:
            engine.shutdown()
            plane.close()
    assert sorted(sent) == [1, 2, 3]
    for ssid in paths:
        assert len(sent[ssid]) == 20, ssid
    assert set(sent[1]) == {(R_ADDR, str(SEG_1))}
    assert set(sent[2]) == {(R_ADDR, str(SEG_2))}
    assert set(sent[3]) == {()}
