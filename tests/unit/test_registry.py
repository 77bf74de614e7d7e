"""The registries of named parts (planes, ILCC policies and stores) and what uses them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from ipaddress import IPv6Address
from pathlib import Path

import pytest

from sixlab.cli import build_parser
from sixlab.dataplane import PLANES, DataplaneConfig, DataplaneError, MemoryNetwork, available
from sixlab.dataplane.base import FastBatch, ReflectFn
from sixlab.dataplane.engine import ReflectorEngine, SenderEngine, SenderSessionSpec
from sixlab.dataplane.memory import MemoryDataplane
from sixlab.ilnp import POLICIES, STORES, UnknownBackendError
from sixlab.ilnp.daemon import DaemonConfig, IlnpDaemon
from sixlab.ilnp.policy import BoundedPolicy, SocketPolicy
from sixlab.registry import Registry
from sixlab.stamp import Reflector, ReflectorSessionConfig, SenderConfig
from sixlab.wire.ilnp import LocatorEntry

MS = 1_000_000


# ------------------------------------------------------------------------ the registry


class _Named:
    name = "alpha"


def test_entries_by_name_and_unknown_names_raise_the_owners_error() -> None:
    reg: Registry[type[_Named]] = Registry("widget", UnknownBackendError)
    reg.add("alpha", _Named)
    assert reg.get("alpha") is _Named
    assert "alpha" in reg
    assert reg.names() == ["alpha"] == list(reg)
    with pytest.raises(UnknownBackendError, match=r"unknown widget 'beta' \(available: alpha\)"):
        reg.get("beta")


def test_a_name_is_entered_once_and_must_be_the_one_the_implementation_states() -> None:
    reg: Registry[type[_Named]] = Registry("widget")
    reg.add("alpha", _Named)
    with pytest.raises(ValueError, match="entered already"):
        reg.add("alpha", _Named)
    with pytest.raises(ValueError, match="entered already"):
        reg.add_lazy("alpha", "json:JSONDecoder")
    with pytest.raises(ValueError, match="calls itself 'alpha'"):
        reg.add("gamma", _Named)
    with pytest.raises(ValueError, match="not 'module:attribute'"):
        reg.add_lazy("delta", "json.JSONDecoder")


def test_a_lazy_entry_is_imported_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sixlab_lazy_widget.py").write_text(
        textwrap.dedent(
            """
            class Widget:
                name = "lazy"
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sixlab_lazy_widget", raising=False)
    reg: Registry[type] = Registry("widget")
    reg.add_lazy("lazy", "sixlab_lazy_widget:Widget")
    assert reg.names() == ["lazy"]
    assert "sixlab_lazy_widget" not in sys.modules
    widget = reg.get("lazy")
    assert widget.__name__ == "Widget"
    assert reg.get("lazy") is widget
    monkeypatch.delitem(sys.modules, "sixlab_lazy_widget")


# ------------------------------------------------------------------------ the three tables


@pytest.mark.parametrize(
    ("registry", "names"),
    [
        (PLANES, ["mmap", "scapy", "socket", "xdp"]),
        (POLICIES, ["bounded", "none", "socket"]),
        (STORES, ["hash", "linear"]),
    ],
)
def test_every_entry_loads_under_the_name_it_states(
    registry: Registry[object], names: list[str]
) -> None:
    assert registry.names() == names
    for name in names:
        assert getattr(registry.get(name), "name", None) == name


def test_naming_the_planes_imports_none_of_them() -> None:
    code = (
        "import sys; from sixlab.dataplane import available; "
        "print(available(), sorted(m for m in sys.modules if m.startswith('sixlab.dataplane.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("['mmap', 'scapy', 'socket', 'xdp']")
    assert "udpsocket" not in out
    assert "_plane" not in out
    assert available() == PLANES.names()


def test_an_unknown_plane_is_a_dataplane_error() -> None:
    with pytest.raises(DataplaneError, match=r"dataplane: unknown data plane 'nope' \(available"):
        PLANES.get("nope")


def _choices(argv: list[str], dest: str) -> list[str]:
    parser = build_parser()
    sub = parser
    for word in argv:
        action = next(a for a in sub._actions if a.choices and word in a.choices)
        sub = action.choices[word]  # type: ignore[index]
    return list(next(a for a in sub._actions if a.dest == dest).choices)  # type: ignore[arg-type]


def test_the_command_line_offers_what_the_registries_hold() -> None:
    assert _choices(["ilnp", "host"], "policy") == POLICIES.names()
    assert _choices(["ilnp", "host"], "store") == STORES.names()
    assert _choices(["stamp", "reflector"], "dataplane") == PLANES.names()
    assert _choices(["demo"], "dataplane") == PLANES.names()


# ------------------------------------------------------------------------ policies


def _daemon(policy: str, **changes: object) -> IlnpDaemon:
    config = DaemonConfig(
        nid=0xA,
        locators=(LocatorEntry(0x2001_0DB8_000A_0000, 10),),
        interfaces=("lo",),
        policy=policy,
        control="/nonexistent/never-opened.sock",
        **changes,  # type: ignore[arg-type]
    )
    return IlnpDaemon(config)


def test_the_daemon_gives_each_policy_the_options_it_declares() -> None:
    bounded = _daemon("bounded", bounded_capacity=7, bounded_idle=3.0)
    assert isinstance(bounded.host.policy, BoundedPolicy)
    assert (bounded.host.policy.capacity, bounded.host.policy.idle_timeout) == (7, 3.0)
    assert bounded.socket_table is None
    socket = _daemon("socket")
    assert isinstance(socket.host.policy, SocketPolicy)
    assert socket.host.policy.sockets is socket.socket_table is not None
    assert _daemon("none").socket_table is None


class _CapacityOnly:
    """A policy added in one place (its registry entry) that takes the daemon's cap."""

    name = "capped"
    host_options = frozenset({"capacity"})

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity


def test_a_new_policy_needs_only_its_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    # POLICIES.add("capped", _CapacityOnly), undone when the test ends.
    monkeypatch.setitem(POLICIES._loaded, "capped", _CapacityOnly)
    daemon = _daemon("capped", bounded_capacity=9)
    assert isinstance(daemon.host.policy, _CapacityOnly)
    assert daemon.host.policy.capacity == 9
    assert "capped" in _choices(["ilnp", "host"], "policy")


# ------------------------------------------------------------------------ the fast path


class _FastPlane(MemoryDataplane):
    """A memory plane that declares a fast path; it hands every packet back as slow."""

    has_fast_path = True

    def __init__(self, config: DataplaneConfig, network: MemoryNetwork) -> None:
        super().__init__(config, network)
        self.batches = 0

    def reflect_batch(
        self, reflect: ReflectFn, clock: Callable[[], int], max_batch: int = 64
    ) -> FastBatch:
        del reflect, clock
        self.batches += 1
        slow = self.receive(max_batch)
        return FastBatch(len(slow), 0, 0, slow)


@pytest.mark.parametrize("fast_path", [True, False])
def test_the_engine_calls_the_fast_path_a_plane_declares(fast_path: bool) -> None:
    network = MemoryNetwork()
    r_addr, s_addr = IPv6Address("fd00::2"), IPv6Address("fd00::1")
    rplane = _FastPlane(DataplaneConfig(port=862, source=r_addr), network)
    splane = network.plane(DataplaneConfig(port=0, source=s_addr))
    rplane.open()
    splane.open()
    reflector = Reflector()
    reflector.set_default(ReflectorSessionConfig(ssid=None))
    rengine = ReflectorEngine(rplane, reflector, fast_path=fast_path)
    sengine = SenderEngine(splane)
    rengine.start()
    sengine.start()
    try:
        config = SenderConfig(ssid=3, interval_ns=MS, count=5, loss_timeout_ns=500 * MS)
        sengine.add_session(SenderSessionSpec(config, r_addr, 862))
        sengine.start_session(3)
        assert sengine.wait_finished(3, 10)
        assert len(sengine.results(3)) == 5
    finally:
        sengine.shutdown()
        rengine.shutdown()
        rplane.close()
        splane.close()
    assert (rplane.batches > 0) is fast_path


def test_a_plane_without_a_fast_path_says_so() -> None:
    plane = MemoryNetwork().plane(DataplaneConfig(port=0))
    assert plane.has_fast_path is False
    with pytest.raises(NotImplementedError, match="no reflector fast path"):
        plane.reflect_batch(lambda *_, **__: None, lambda: 0)
