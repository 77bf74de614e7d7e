"""sixlab: STAMP delay monitoring for SRv6, ILNPv6 hosts, and the lab that measures them.

Layers, bottom first; a package imports only packages on layers below its own
(``tests/unit/test_layering.py`` holds the rule):

- ``sixlab.registry``: named implementations (every package may use it).
- ``sixlab.wire`` (pure codecs) and ``sixlab.linux`` (kernel plumbing: BPF, capture
  sockets, nftables).
- ``sixlab.stamp`` / ``sixlab.ilnp``: sans-I/O STAMP; the ILNP host logic and its daemon.
- ``sixlab.dataplane``: the STAMP data planes and the engines that join them to the core.
- ``sixlab.southbound``, then ``sixlab.controller``: gRPC agents, the SDN controller.
- ``sixlab.testbed``, then ``sixlab.bench``: namespace topologies; generators, studies.
- ``sixlab.cli``: the ``sixlab`` command.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
