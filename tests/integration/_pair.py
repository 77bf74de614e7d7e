"""Two nodes on one veth, for the tests that drive a data plane with frames from a peer
(test_xdp_differential, test_afxdp_queues, test_mmap_plane)::

    G (generator) if_g ──────── if_r R (the plane under test)

Both ends know each other's MAC from the start (permanent neighbours: no Neighbour
Discovery, so a plane's first reply can take its fast path), and both have tx checksum
offload off: complete UDP checksums in every frame an XDP program or a capture reads
(the ``xdp`` plane's docstring explains why).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from sixlab.testbed import Node, Testbed
from tests.integration.conftest import TEST_PREFIX


@dataclass
class Pair:
    tb: Testbed
    g: Node
    r: Node


@contextlib.contextmanager
def veth_pair(
    g_addr: str,
    r_addr: str,
    *,
    if_g: str = "g0",
    if_r: str = "r0",
    queues: int | None = None,
) -> Iterator[Pair]:
    """G and R in fresh namespaces, removed when the body ends. ``queues``: the veth's
    ends get that many TX and RX queues each (a veth delivers a frame on the receive
    queue whose index is the sender's transmit queue)."""
    with Testbed(prefix=TEST_PREFIX) as tb:
        g = tb.add_node("g")
        r = tb.add_node("r")
        if queues is None:
            tb.add_link(g, r, if_a=if_g, if_b=if_r, addr_a=g_addr, addr_b=r_addr)
        else:
            q = str(queues)
            g.exec(["ip", "link", "add", if_g, "numtxqueues", q, "numrxqueues", q, "type",
                    "veth", "peer", "name", if_r, "numtxqueues", q, "numrxqueues", q])  # fmt: skip
            g.exec(["ip", "link", "set", if_r, "netns", r.ns])
            for node, ifname, addr in ((g, if_g, g_addr), (r, if_r, r_addr)):
                node.exec(["ip", "link", "set", ifname, "up"])
                node.exec(["ip", "-6", "addr", "add", f"{addr}/64", "dev", ifname, "nodad"])
            g.add_neighbour(if_g, r_addr, r.mac(if_r))
            r.add_neighbour(if_r, g_addr, g.mac(if_g))
        for node, ifname in ((g, if_g), (r, if_r)):
            node.exec(["ethtool", "-K", ifname, "tx", "off"])
        yield Pair(tb, g, r)
