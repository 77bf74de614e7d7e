"""The benchmark testbed: a traffic generator and a system under test, no emulation.

Reflect mode (``forward=False``)::

    gen eth0 fd00:0:10::1/64 ──veth── sut eth0 fd00:0:10::2/64

Forward mode (``forward=True``): packets cross the SUT from the generator to a sink, a
separate namespace so the generator's kernel never short-cuts them locally; a
generator process can still own sockets in both (``Node.socket``)::

    gen eth0 fd00:0:10::1 ── in0 fd00:0:10::2  SUT  out0 fd00:0:20::2 ── sink eth0 fd00:0:20::1

The RFC 2544 method (docs/design-notes.md) pins the generator to CPU 0 and the SUT to CPU 1:
``run_pinned`` starts a process already pinned (``taskset`` execs the program in place,
so the pid is the program's and it never runs on another CPU).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any

from sixlab.testbed import _netns
from sixlab.testbed._closing import ClosingContext
from sixlab.testbed._topology import Node, Testbed

__all__ = ["BenchTestbed", "two_node_bench"]


class BenchTestbed(ClosingContext):
    """Handle of :func:`two_node_bench`."""

    def __init__(self, testbed: Testbed, *, forward: bool) -> None:
        self.testbed = testbed
        self.forward = forward
        self.gen: Node = testbed.add_node("gen")
        self.sut: Node = testbed.add_node("sut", router=forward)
        self.sink: Node | None = None
        self.gen_addr = "fd00:0:10::1"
        self.gen_if = "eth0"
        self.sink_addr: str | None = None
        if not forward:
            self.sut_addr = "fd00:0:10::2"
            self.sut_if = "eth0"
            self.sut_out_if: str | None = None
            testbed.add_link(self.gen, self.sut, if_a="eth0", if_b="eth0",
                             addr_a=self.gen_addr, addr_b=self.sut_addr)  # fmt: skip
            return
        self.sink = testbed.add_node("sink")
        self.sut_addr = "fd00:0:10::2"
        self.sut_if = "in0"
        self.sut_out_if = "out0"
        self.sink_addr = "fd00:0:20::1"
        testbed.add_link(self.gen, self.sut, if_a="eth0", if_b="in0",
                         addr_a=self.gen_addr, addr_b=self.sut_addr)  # fmt: skip
        testbed.add_link(self.sut, self.sink, if_a="out0", if_b="eth0",
                         addr_a="fd00:0:20::2", addr_b=self.sink_addr)  # fmt: skip
        self.gen.add_route("default", via=self.sut_addr)
        self.sink.add_route("default", via="fd00:0:20::2")

    def run_pinned(
        self, node: Node, argv: Sequence[str], cpu: int, **popen_kwargs: Any
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in ``node`` pinned to ``cpu`` (tracked for cleanup)."""
        return self.testbed.run_in(node, ["taskset", "-c", str(cpu), *argv], **popen_kwargs)

    def close(self) -> None:
        """Tear the testbed down."""
        self.testbed.close()


def two_node_bench(*, forward: bool = False, prefix: str = _netns.DEFAULT_PREFIX) -> BenchTestbed:
    """Build the generator/SUT testbed (plus a sink with ``forward``); a context manager."""
    testbed = Testbed(prefix)
    try:
        return BenchTestbed(testbed, forward=forward)
    except BaseException:
        testbed.close()
        raise
