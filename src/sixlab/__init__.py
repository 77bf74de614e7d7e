"""sixlab: STAMP delay monitoring for SRv6, ILNPv6 hosts, and the lab that measures them.

Layers (each imports only the ones above it):

- ``sixlab.wire``: pure codecs (IPv6, SRH, UDP, STAMP, ILNP); bytes in, values out.
- ``sixlab.stamp`` / ``sixlab.ilnp``: sans-I/O protocol logic; time is a parameter.
- ``sixlab.dataplane``: I/O backends that move bytes and timestamps to and from the core.
- ``sixlab.southbound`` / ``sixlab.controller``: gRPC agents and the SDN controller.
- ``sixlab.testbed`` / ``sixlab.bench``: namespace topologies, generators, experiments.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
