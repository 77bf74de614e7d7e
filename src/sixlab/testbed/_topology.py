"""Topologies as code: nodes (namespaces), veth links, addresses, routes, SRv6 routes.

A :class:`Testbed` owns everything it makes and is a context manager: leaving the
``with`` block (normally or through an exception) stops every process it started,
every link emulator, and deletes every namespace, so no veth or route outlives it.

Sysctls set on every node before its interfaces exist (new interfaces copy
``conf.default``):

- ``accept_dad=0``: addresses are usable at once, with no tentative period.
- ``seg6_enabled=1`` (``all`` and ``default``): the kernel processes SRHs addressed to
  the node; a host needs it too, or a datagram whose last segment is the host is
  dropped instead of delivered (``ipv6_srh_rcv`` checks min(all, interface)).
- ``forwarding=1`` on routers; ``accept_ra=0`` everywhere (nothing sends RAs here).

An emulated link puts a middle namespace with ``disable_ipv6=1`` between the ends and
runs :mod:`sixlab.testbed.linkemu` in it (see that module for the element's design).

Segment lists are given in *travel order* (first SID visited first), as iproute2 prints
them; pyroute2 wants SRH wire order (``segments[0]`` is the last segment), so the list is
reversed when the route is built.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from pyroute2 import IPRoute
from pyroute2 import netns as _pyr_netns

from sixlab.testbed import _netns
from sixlab.testbed._closing import ClosingContext
from sixlab.testbed._emulation import DirectionConfig

__all__ = [
    "SEG6LOCAL_ACTIONS",
    "EmulatedLink",
    "Link",
    "LinkEmulation",
    "Node",
    "Testbed",
    "TestbedError",
]

#: Neighbour state of an entry the kernel never expires (linux/neighbour.h).
_NUD_PERMANENT = 0x80

#: seg6local behaviours this kernel runs without VRF (End.DT4/End.DT46 need a VRF).
SEG6LOCAL_ACTIONS = ("End", "End.X", "End.T", "End.DX6", "End.DT6")
#: Table numbers of <linux/rtnetlink.h>: End.DT6 with RT_TABLE_LOCAL delivers to the
#: node's own addresses, RT_TABLE_MAIN forwards the decapsulated packet.
RT_TABLE_MAIN = 254
RT_TABLE_LOCAL = 255
#: How long a link emulator may take to bind its sockets (Python start-up included).
_EMU_READY_TIMEOUT_S = 10.0
_IFNAMSIZ = 15


class TestbedError(RuntimeError):
    """A testbed could not be built or torn down."""

    __test__ = False  # not a pytest test class, whatever its name says


@dataclass(frozen=True, slots=True)
class LinkEmulation:
    """Delay/jitter/loss of an emulated link, per direction (``ab``: from a to b)."""

    ab: DirectionConfig = field(default_factory=DirectionConfig)
    ba: DirectionConfig = field(default_factory=DirectionConfig)
    seed: int = 0
    reorder: bool = False

    @classmethod
    def symmetric(cls, delay_ms: float, jitter_ms: float = 0.0, loss: float = 0.0) -> Self:
        """The same behaviour both ways."""
        d = DirectionConfig(delay_ms, jitter_ms, loss)
        return cls(ab=d, ba=d)


class Node:
    """One namespace. Routers forward; every node accepts SRv6."""

    def __init__(self, testbed: Testbed, name: str, ns: str, *, router: bool) -> None:
        self.testbed = testbed
        self.name = name
        self.ns = ns
        self.router = router
        with _netns.entered(ns):
            self.ipr = IPRoute()

    def __repr__(self) -> str:
        return f"Node({self.name!r}, ns={self.ns!r})"

    # --- interfaces and addresses ---------------------------------------------------

    def ifindex(self, ifname: str) -> int:
        """Index of ``ifname`` in this namespace."""
        found = self.ipr.link_lookup(ifname=ifname)
        if not found:
            raise TestbedError(f"{self.name}: no interface {ifname!r}")
        return int(found[0])

    def link_up(self, ifname: str) -> None:
        """Set ``ifname`` administratively up."""
        self.ipr.link("set", index=self.ifindex(ifname), state="up")

    def add_address(self, ifname: str, address: str, prefixlen: int = 64) -> None:
        """Add an IPv6 address (usable at once: DAD is off)."""
        self.ipr.addr("add", index=self.ifindex(ifname), address=address, prefixlen=prefixlen)

    def mac(self, ifname: str) -> str:
        """The link-layer address of ``ifname``."""
        (link,) = self.ipr.get_links(self.ifindex(ifname))
        mac: str = link.get_attr("IFLA_ADDRESS")
        return mac

    def add_neighbour(self, ifname: str, address: str, lladdr: str) -> None:
        """A permanent neighbour entry: no Neighbour Discovery for ``address``."""
        self.ipr.neigh(
            "add", dst=address, lladdr=lladdr, ifindex=self.ifindex(ifname), state=_NUD_PERMANENT
        )

    def sysctl(self, values: dict[str, str | int]) -> None:
        """Write ``net.*`` sysctls in this namespace."""
        _netns.sysctl_set(self.ns, values)

    # --- routes ---------------------------------------------------------------------

    def add_route(
        self,
        dst: str,
        *,
        via: str | None = None,
        dev: str | None = None,
        table: int | None = None,
    ) -> None:
        """An IPv6 route; ``dst`` is a prefix (``"default"`` or ``"fd00::/64"``)."""
        spec: dict[str, Any] = {"dst": "::/0" if dst == "default" else dst, "family": 10}
        if via is not None:
            spec["gateway"] = via
        if dev is not None:
            spec["oif"] = self.ifindex(dev)
        if table is not None:
            spec["table"] = table
        self.ipr.route("add", **spec)

    def add_multipath_route(self, dst: str, nexthops: Sequence[tuple[str, str]]) -> None:
        """An equal-cost multipath route: ``nexthops`` are (gateway, interface) pairs.

        Which next hop a packet takes is the kernel's flow hash, chosen per namespace by
        ``net.ipv6.fib_multipath_hash_policy`` (0: source, destination and flow label;
        1: the 5-tuple; see docs/srpm.md).
        """
        if len(nexthops) < 2:
            raise TestbedError(f"multipath route to {dst}: needs at least two next hops")
        hops = [{"gateway": gw, "oif": self.ifindex(dev)} for gw, dev in nexthops]
        self.ipr.route("add", dst="::/0" if dst == "default" else dst, family=10, multipath=hops)

    def add_seg6local(
        self,
        sid: str,
        action: str,
        *,
        dev: str,
        nh6: str | None = None,
        table: int | None = None,
    ) -> None:
        """A seg6local route: ``End``, ``End.X`` (``nh6``), ``End.T``/``End.DT6`` (``table``).

        ``dev`` is the interface the SID route is attached to (the kernel wants one; for
        End.X it is also where ``nh6`` lives). End.DT6 with ``table=255`` (local)
        delivers the inner packet to the node itself, with 254 (main) it forwards it.
        """
        if action not in SEG6LOCAL_ACTIONS:
            raise TestbedError(f"seg6local action {action!r} not usable here ({SEG6LOCAL_ACTIONS})")
        encap: dict[str, Any] = {"type": "seg6local", "action": action}
        if action in ("End.X", "End.DX6"):
            if nh6 is None:
                raise TestbedError(f"{action} needs nh6")
            encap["nh6"] = nh6
        if action in ("End.T", "End.DT6"):
            encap["table"] = RT_TABLE_MAIN if table is None else table
        dst = sid if "/" in sid else f"{sid}/128"
        self.ipr.route("add", dst=dst, family=10, oif=self.ifindex(dev), encap=encap)

    def add_seg6_encap(
        self,
        dst: str,
        segments: Sequence[str],
        *,
        dev: str,
        mode: str = "encap",
    ) -> None:
        """Steer ``dst`` into an SR policy; ``segments`` in travel order (first visited first).

        ``mode="encap"`` adds an outer IPv6 header and SRH (H.Encaps), ``"inline"``
        inserts an SRH into the packet itself (H.Insert).
        """
        if mode not in ("encap", "inline"):
            raise TestbedError(f"seg6 mode {mode!r}")
        encap = {"type": "seg6", "mode": mode, "segs": list(reversed(segments))}
        self.ipr.route("add", dst=dst, family=10, oif=self.ifindex(dev), encap=encap)

    # --- processes and sockets --------------------------------------------------------

    def socket(self, family: int, type_: int, proto: int = 0) -> socket.socket:
        """A socket created inside this namespace."""
        return _netns.netns_socket(self.ns, family, type_, proto)

    def run(self, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
        """Start a tracked process in this namespace (stopped when the testbed closes)."""
        return self.testbed.run_in(self, argv, **popen_kwargs)

    def exec(
        self, argv: Sequence[str], *, check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` here to completion."""
        return _netns.exec_in(self.ns, argv, check=check, timeout=timeout)

    def close(self) -> None:
        """Close the netlink socket."""
        self.ipr.close()


@dataclass(slots=True)
class Link:
    """A veth link between two nodes (possibly through an emulator)."""

    a: Node
    b: Node
    if_a: str
    if_b: str
    addr_a: str | None
    addr_b: str | None
    emulator: EmulatedLink | None = None


class EmulatedLink:
    """The link emulator between two ends: its namespace, process and counters."""

    def __init__(self, ns: str, proc: subprocess.Popen[bytes], stats_path: Path) -> None:
        self.ns = ns
        self.proc = proc
        self.stats_path = stats_path
        self.final: dict[str, Any] | None = None

    def stats(self, timeout: float = 2.0) -> dict[str, Any]:
        """Current counters ``{"ab": {...}, "ba": {...}}`` (asks the element for a dump)."""
        if self.final is not None:
            return self.final
        before = self._read()["generation"]
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while (now := self._read())["generation"] == before:
            if time.monotonic() > deadline:
                raise TestbedError(f"link emulator in {self.ns} did not answer SIGUSR1")
            time.sleep(0.002)
        return now

    def _read(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.stats_path.read_text())
        return result

    def stop(self) -> dict[str, Any] | None:
        """Stop the element; keep and return its final counters."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        lines = out.decode(errors="replace").strip().splitlines()
        if lines:
            with contextlib.suppress(ValueError):
                self.final = json.loads(lines[-1])
        return self.final


class Testbed(ClosingContext):
    """A set of namespaces built as code; close() (or ``with``) removes all of it."""

    __test__ = False  # not a pytest test class, whatever its name says

    def __init__(self, prefix: str = _netns.DEFAULT_PREFIX) -> None:
        self.prefix = prefix
        self.token = _netns.make_token()
        self.nodes: dict[str, Node] = {}
        self.links: list[Link] = []
        self.namespaces: list[str] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self.emulators: list[EmulatedLink] = []
        self._tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}{self.token}-"))
        self._closed = False

    def ns_name(self, name: str) -> str:
        """The namespace name for node ``name`` in this testbed."""
        return f"{self.prefix}{self.token}-{name}"

    def _new_namespace(self, name: str, sysctls: dict[str, str | int]) -> str:
        ns = self.ns_name(name)
        if ns in self.namespaces:
            raise TestbedError(f"node {name!r} exists")
        _pyr_netns.create(ns)
        self.namespaces.append(ns)
        _netns.sysctl_set(ns, sysctls)
        return ns

    def add_node(self, name: str, *, router: bool = False) -> Node:
        """A namespace with loopback up, DAD off, SRv6 on, and forwarding if a router."""
        fwd = 1 if router else 0
        ns = self._new_namespace(
            name,
            {
                "net.ipv6.conf.all.accept_dad": 0,
                "net.ipv6.conf.default.accept_dad": 0,
                "net.ipv6.conf.default.accept_ra": 0,
                "net.ipv6.conf.all.seg6_enabled": 1,
                "net.ipv6.conf.default.seg6_enabled": 1,
                "net.ipv6.conf.all.forwarding": fwd,
                "net.ipv6.conf.default.forwarding": fwd,
            },
        )
        node = Node(self, name, ns, router=router)
        self.nodes[name] = node
        node.link_up("lo")
        return node

    def _veth(self, a: Node | str, if_a: str, b: Node | str, if_b: str) -> None:
        """A veth pair, ``if_a`` in ``a`` and ``if_b`` in ``b``, both up."""
        for ifname in (if_a, if_b):
            if len(ifname) > _IFNAMSIZ:
                raise TestbedError(f"interface name {ifname!r} longer than {_IFNAMSIZ}")
        ns_a = a.ns if isinstance(a, Node) else a
        ns_b = b.ns if isinstance(b, Node) else b
        peer_fd = os.open(_netns.NETNS_DIR / ns_b, os.O_RDONLY)
        try:
            with _netns.entered(ns_a), IPRoute() as ipr:
                ipr.link(
                    "add", ifname=if_a, kind="veth", peer={"ifname": if_b, "net_ns_fd": peer_fd}
                )
                ipr.link("set", index=ipr.link_lookup(ifname=if_a)[0], state="up")
            with _netns.entered(ns_b), IPRoute() as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname=if_b)[0], state="up")
        finally:
            os.close(peer_fd)

    def add_link(
        self,
        a: Node,
        b: Node,
        *,
        if_a: str,
        if_b: str,
        addr_a: str | None = None,
        addr_b: str | None = None,
        prefixlen: int = 64,
        emulation: LinkEmulation | None = None,
    ) -> Link:
        """Join ``a`` and ``b``; with ``emulation`` the link runs through a link emulator."""
        emulator = None
        if emulation is None:
            self._veth(a, if_a, b, if_b)
        else:
            mid = self._new_namespace(
                f"{a.name}-{b.name}-{len(self.links)}",
                {"net.ipv6.conf.all.disable_ipv6": 1, "net.ipv6.conf.default.disable_ipv6": 1},
            )
            self._veth(a, if_a, mid, "mid_a")
            self._veth(mid, "mid_b", b, if_b)
            emulator = self._start_emulator(mid, emulation)
        for node, ifname, addr in ((a, if_a, addr_a), (b, if_b, addr_b)):
            if addr is not None:
                node.add_address(ifname, addr, prefixlen)
        if addr_a is not None and addr_b is not None:
            # Static neighbours: the first packet over a cold, delayed link would otherwise
            # wait a Neighbour Discovery round trip across it, which is no path delay.
            a.add_neighbour(if_a, addr_b, b.mac(if_b))
            b.add_neighbour(if_b, addr_a, a.mac(if_a))
        link = Link(a, b, if_a, if_b, addr_a, addr_b, emulator)
        self.links.append(link)
        return link

    def _start_emulator(self, mid: str, emu: LinkEmulation) -> EmulatedLink:
        stats = self._tmp / f"{mid}.json"
        argv = [sys.executable, "-m", "sixlab.testbed.linkemu", "mid_a", "mid_b"]
        for name, d in (("ab", emu.ab), ("ba", emu.ba)):
            argv += [f"--{name}-delay", str(d.delay_ms), f"--{name}-jitter", str(d.jitter_ms)]
            argv += [f"--{name}-loss", str(d.loss)]
        argv += ["--seed", str(emu.seed), "--stats", str(stats)]
        if emu.reorder:
            argv.append("--reorder")
        proc = self.run_in(mid, argv, stdout=subprocess.PIPE)
        el = EmulatedLink(mid, proc, stats)
        self.emulators.append(el)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], _EMU_READY_TIMEOUT_S)
        line = proc.stdout.readline() if ready else b""
        if b"ready" not in line:
            raise TestbedError(f"link emulator in {mid} did not start (exit {proc.poll()})")
        return el

    # --- processes --------------------------------------------------------------------

    def run_in(
        self, node: Node | str, argv: Sequence[str], **popen_kwargs: Any
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in a node's namespace; stopped by close()."""
        ns = node.ns if isinstance(node, Node) else node
        proc = _netns.run_in(ns, argv, **popen_kwargs)
        self.processes.append(proc)
        return proc

    def exec_in(
        self, node: Node | str, argv: Sequence[str], *, check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in a node's namespace to completion."""
        ns = node.ns if isinstance(node, Node) else node
        return _netns.exec_in(ns, argv, check=check, timeout=timeout)

    # --- teardown ---------------------------------------------------------------------

    def close(self) -> None:
        """Stop processes and emulators, close sockets, delete every namespace. Idempotent."""
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        for el in self.emulators:
            try:
                el.stop()
            except Exception as exc:  # noqa: BLE001 - teardown goes on, errors reported below
                errors.append(exc)
        for proc in self.processes:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.processes:
            try:
                proc.communicate(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
        for node in self.nodes.values():
            node.close()
        # Anything else still inside (a child of a child): kill it, or the namespace lives on.
        _netns.kill_all(self.namespaces)
        for ns in self.namespaces:
            try:
                _netns.remove_namespace(ns)
            except OSError as exc:
                errors.append(exc)
        shutil.rmtree(self._tmp, ignore_errors=True)
        if errors:
            raise TestbedError(f"teardown incomplete: {errors!r}")
