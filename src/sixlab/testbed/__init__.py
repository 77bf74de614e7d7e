"""Network-namespace testbeds as code: nodes, veth links, SRv6 routes, emulated links.

Everything needs root. A :class:`Testbed` (or the handle of a predefined topology) is
a context manager that removes every namespace and process it made, even when the body
raises; :func:`sweep` removes what a crashed run left behind.

Predefined topologies:

- :func:`srv6_two_paths`: sender — R1 ═(links A, B)═ R2 — reflector, with End/End.X
  SIDs pinning each path to one link in both directions and per-direction delays;
  optionally an agent-less host *far* behind R2 (loopback measurement) and links A and
  B as one ECMP route (per-flow-label measurement).
- :func:`two_node_bench`: generator — SUT (— sink), plain veths, for throughput runs.

Link emulation (delay, jitter, loss per direction) is :mod:`sixlab.testbed.linkemu`, a
user-space element in a middle namespace: this kernel has no netem.

:mod:`sixlab.testbed.postgres`: :class:`LabPostgres`, a throwaway PostgreSQL server
(``initdb`` + ``pg_ctl`` in a temporary directory, as an unprivileged user) for the
controller's PostgreSQL store.

Errors
------
::

    TestbedError (RuntimeError)   a topology that cannot be built or torn down

(``DirectionConfig`` refuses impossible link parameters with a ``ValueError``.)
"""

from sixlab.testbed._bench import BenchTestbed, two_node_bench
from sixlab.testbed._closing import ClosingContext
from sixlab.testbed._emulation import DirectionConfig
from sixlab.testbed._netns import DEFAULT_PREFIX, entered, exec_in, run_in, sweep
from sixlab.testbed._srv6 import LoopbackPath, SRv6Path, SRv6TwoPaths, srv6_two_paths
from sixlab.testbed._tools import PingResult, pin_cpu, ping6
from sixlab.testbed._topology import (
    EmulatedLink,
    Link,
    LinkEmulation,
    Node,
    Testbed,
    TestbedError,
)
from sixlab.testbed.postgres import LabPostgres, sweep_postgres

__all__ = [
    "DEFAULT_PREFIX",
    "BenchTestbed",
    "ClosingContext",
    "DirectionConfig",
    "EmulatedLink",
    "LabPostgres",
    "Link",
    "LinkEmulation",
    "LoopbackPath",
    "Node",
    "PingResult",
    "SRv6Path",
    "SRv6TwoPaths",
    "Testbed",
    "TestbedError",
    "entered",
    "exec_in",
    "pin_cpu",
    "ping6",
    "run_in",
    "srv6_two_paths",
    "sweep",
    "sweep_postgres",
    "two_node_bench",
]
