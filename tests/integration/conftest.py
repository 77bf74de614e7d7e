"""Fixtures for the namespace integration tests: testbeds with unique names, always removed.

Integration tests carry the ``root`` marker. They need root (namespaces, veth, raw
sockets); CI runs as root, so a run without it fails loudly here instead of skipping
and reporting green.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sixlab.testbed import BenchTestbed, SRv6TwoPaths, srv6_two_paths, sweep, two_node_bench

if TYPE_CHECKING:
    from tests.integration._ilnp import IlnpNet

#: Every namespace made by the test suite starts with this, so a crashed run can be
#: found and swept (``sixlab.testbed.sweep("sixlab-t-")``) without touching a demo.
TEST_PREFIX = "sixlab-t-"


@pytest.fixture(scope="session", autouse=True)
def _sweep_leftovers() -> None:
    """Remove namespaces that a crashed earlier test run left behind (dead owners only).

    A session fixture, not ``pytest_sessionstart``: that hook only runs for conftests
    loaded at start-up, and this one is found later, during collection.
    """
    if os.geteuid() == 0:
        sweep(TEST_PREFIX)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail (not skip) root-marked tests when not root."""
    if item.get_closest_marker("root") is not None and os.geteuid() != 0:
        pytest.fail(
            "this test needs root (network namespaces, veth, raw sockets): run the suite as "
            "root, as CI does (`sudo ./run test`)",
            pytrace=False,
        )


@pytest.fixture
def srv6_testbed() -> Iterator[SRv6TwoPaths]:
    """The two-path SRv6 testbed with its default delays (A 5/12 ms, B 20/3 ms)."""
    with srv6_two_paths(prefix=TEST_PREFIX) as tb:
        yield tb


@pytest.fixture
def bench_testbed(request: pytest.FixtureRequest) -> Iterator[BenchTestbed]:
    """Generator and SUT; ``forward=True`` via indirect parametrization adds a sink."""
    forward = bool(getattr(request, "param", False))
    with two_node_bench(forward=forward, prefix=TEST_PREFIX) as tb:
        yield tb


@pytest.fixture
def net(tmp_path: Path) -> Iterator[IlnpNet]:
    """The ILNP test network of the test_ilnp_* files (tests/integration/_ilnp.py)."""
    from tests.integration._ilnp import ilnp_net  # noqa: PLC0415 - it imports TEST_PREFIX

    with ilnp_net(tmp_path) as network:
        yield network
