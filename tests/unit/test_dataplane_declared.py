"""What a data plane offers beyond moving packets is declared on ``Dataplane``, with a
default, so callers use it directly instead of probing with ``getattr``."""

from __future__ import annotations

from ipaddress import IPv6Address

from sixlab.dataplane import PLANES, DataplaneConfig, MemoryNetwork
from sixlab.dataplane.base import Dataplane


def test_local_port_defaults_to_the_configured_port() -> None:
    plane = PLANES.get("scapy")(DataplaneConfig(port=9000))  # not opened: no socket
    assert type(plane).local_port is Dataplane.local_port
    assert plane.local_port == 9000


def test_a_plane_that_binds_reports_its_own_port() -> None:
    network = MemoryNetwork()
    plane = network.plane(DataplaneConfig(port=862, source=IPv6Address("fd00::2")))
    with plane:
        assert plane.local_port == 862


def test_kernel_stats_is_none_on_a_plane_without_a_ring() -> None:
    plane = MemoryNetwork().plane(DataplaneConfig(port=0))
    assert plane.kernel_stats() is None
    assert PLANES.get("scapy")(DataplaneConfig(port=9000)).kernel_stats() is None
    assert PLANES.get("mmap").kernel_stats is not Dataplane.kernel_stats  # it has a ring
