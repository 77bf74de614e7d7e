"""ILCC admission policies: which unknown correspondents get an ILCC entry.

Theory of operation
-------------------
When a nonce-carrying packet arrives from a NID the ILCC does not know, the host asks
the configured policy. Whatever the answer, the packet is delivered; a refused
correspondent is answered through the host's small, bounded reply table instead of an
ILCC entry, so a non-connected server still answers its clients.

* ``none`` — adopt every one: the St Andrews Linux prototype. Under a flood of random
  source NIDs the ILCC grows without bound (about 15k entries in "Performance Analysis
  of Identifier Locator Communication Cache Effects on ILNPv6 Stack", docs/papers.md).
* ``socket`` — that paper's rule: adopt only where a *connected* UDP socket on this
  host is involved in the flow. The policy asks an injected :class:`SocketTable`; the
  real one (:mod:`sixlab.ilnp.socktable`) reads the kernel's socket table through
  sock_diag, tests use a fake.
  The paper's table also wants an entry for a connected client talking to a
  non-connected server; the server cannot see the client's socket, so
  ``adopt_for_listeners=True`` opts into adopting whenever something listens.
* ``bounded`` — adopt, but keep at most ``capacity`` entries (evicting the least
  recently used) and drop those idle for ``idle_timeout`` seconds: a cap an attacker
  can churn but never exceed. Eviction never takes an entry used within
  ``active_window`` seconds: the kernel fast path reports an entry's traffic only once
  a second, so between two reports a flood of newcomers would otherwise push an active
  correspondent to the LRU head and out. When the cap is reached and even the least
  recently used entry is that fresh, the newcomer is not adopted (``all_active``) and is
  answered through the reply table.

Policies are entered by name in :data:`POLICIES`, the one list of them (``--policy``
offers its names; docs/architecture.md, "Adapters and registries"); :func:`create_policy`
builds one. A policy class states in ``host_options`` the keyword options a host fills
in from its own resources and settings when it builds the policy by name (the daemon
gives ``socket`` the kernel's socket table as ``sockets``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from sixlab.ilnp._errors import UnknownBackendError
from sixlab.ilnp.ilcc import IlccStore
from sixlab.registry import Registry

__all__ = [
    "POLICIES",
    "Admission",
    "AdmissionPolicy",
    "AdmissionRequest",
    "BoundedPolicy",
    "NonePolicy",
    "PolicyClass",
    "SocketPolicy",
    "SocketTable",
    "create_policy",
    "policy_names",
    "register_policy",
]


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """What the host knows about the first packet from an unknown correspondent.

    Ports are None for protocols without them (or a payload too short to hold them).
    """

    peer_nid: int
    peer_locator: int
    protocol: int
    local_port: int | None
    remote_port: int | None


@dataclass(frozen=True, slots=True)
class Admission:
    """A policy's answer: adopt or not, why, and entries to remove to make room."""

    admit: bool
    reason: str
    evict: tuple[int, ...] = ()


class SocketTable(Protocol):
    """The host's view of its own sockets (sock_diag in production, a fake in tests)."""

    def has_connected(
        self, protocol: int, local_port: int, remote_nid: int, remote_port: int
    ) -> bool:
        """Is there a socket connected to (remote NID, remote port) on ``local_port``?"""
        ...

    def is_listening(self, protocol: int, local_port: int) -> bool:
        """Is anything bound to ``local_port`` without being connected?"""
        ...


class AdmissionPolicy(Protocol):
    name: str

    def admit(self, request: AdmissionRequest, ilcc: IlccStore, now: float) -> Admission: ...

    def expired(self, ilcc: IlccStore, now: float) -> list[int]:
        """NIDs whose entries the policy wants gone at ``now``."""
        ...

    def next_deadline(self, ilcc: IlccStore) -> float | None: ...


class PolicyClass(Protocol):
    """A policy as :data:`POLICIES` holds it: a class built with keyword options."""

    @property
    def host_options(self) -> frozenset[str]:
        """The keyword options a host supplies when it builds the policy by name."""
        ...

    def __call__(self, *args: Any, **kwargs: Any) -> AdmissionPolicy: ...


class NonePolicy:
    """Adopt on every nonce packet from an unknown NID; never expire (St Andrews)."""

    name = "none"
    host_options: ClassVar[frozenset[str]] = frozenset()

    def admit(self, request: AdmissionRequest, ilcc: IlccStore, now: float) -> Admission:  # noqa: ARG002 (AdmissionPolicy signature)
        return Admission(True, "always")

    def expired(self, ilcc: IlccStore, now: float) -> list[int]:  # noqa: ARG002 (AdmissionPolicy signature)
        return []

    def next_deadline(self, ilcc: IlccStore) -> float | None:  # noqa: ARG002 (AdmissionPolicy signature)
        return None


class SocketPolicy:
    """Adopt only when a connected socket on this host is part of the flow (ILNP paper)."""

    name = "socket"
    #: ``sockets``: the host's :class:`SocketTable`.
    host_options: ClassVar[frozenset[str]] = frozenset({"sockets"})

    def __init__(self, sockets: SocketTable, *, adopt_for_listeners: bool = False) -> None:
        self.sockets = sockets
        self.adopt_for_listeners = adopt_for_listeners

    def admit(self, request: AdmissionRequest, ilcc: IlccStore, now: float) -> Admission:  # noqa: ARG002 (AdmissionPolicy signature)
        if request.local_port is None or request.remote_port is None:
            return Admission(False, "no_ports")
        if self.sockets.has_connected(
            request.protocol, request.local_port, request.peer_nid, request.remote_port
        ):
            return Admission(True, "connected_socket")
        if self.sockets.is_listening(request.protocol, request.local_port):
            if self.adopt_for_listeners:
                return Admission(True, "listening_socket")
            return Admission(False, "unconnected_socket")
        return Admission(False, "no_socket")

    def expired(self, ilcc: IlccStore, now: float) -> list[int]:  # noqa: ARG002 (AdmissionPolicy signature)
        return []

    def next_deadline(self, ilcc: IlccStore) -> float | None:  # noqa: ARG002 (AdmissionPolicy signature)
        return None


#: Two of the kernel fast path's activity report periods (one second,
#: ``ilnp_fastpath.bpf.c``): an entry the kernel carries is marked used at least this
#: often, with a period's slack for the report's way to the host.
ACTIVE_WINDOW = 2.0


class BoundedPolicy:
    """Adopt up to ``capacity`` entries, evicting the least recently used; expire the idle.

    An entry used within ``active_window`` seconds is never evicted (module docstring).
    """

    name = "bounded"
    host_options: ClassVar[frozenset[str]] = frozenset({"capacity", "idle_timeout"})

    def __init__(
        self, capacity: int = 1024, idle_timeout: float = 60.0, active_window: float = ACTIVE_WINDOW
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if active_window < 0:
            raise ValueError("active_window must not be negative")
        self.capacity = capacity
        self.idle_timeout = idle_timeout
        self.active_window = active_window

    def admit(self, request: AdmissionRequest, ilcc: IlccStore, now: float) -> Admission:  # noqa: ARG002 (AdmissionPolicy signature)
        oldest = ilcc.oldest()
        if len(ilcc) >= self.capacity and oldest is not None:
            # LRU order is last-use order: if the oldest is active, every entry is.
            if oldest.last_used + self.active_window > now:
                return Admission(False, "all_active")
            return Admission(True, "evicted_lru", (oldest.peer_nid,))
        return Admission(True, "below_cap")

    def expired(self, ilcc: IlccStore, now: float) -> list[int]:
        gone = []
        # LRU order: stop at the first one still in use. The store's iterator is a live
        # view (no copy of the ILCC), which is why the host removes after, not during.
        for entry in ilcc:
            if entry.last_used + self.idle_timeout > now:
                break
            gone.append(entry.peer_nid)
        return gone

    def next_deadline(self, ilcc: IlccStore) -> float | None:
        oldest = ilcc.oldest()
        return None if oldest is None else oldest.last_used + self.idle_timeout


#: Every admission policy by name (``--policy``): the one place a policy is added.
POLICIES: Registry[PolicyClass] = Registry("admission policy", UnknownBackendError)
POLICIES.add("none", NonePolicy)
POLICIES.add("socket", SocketPolicy)
POLICIES.add("bounded", BoundedPolicy)


def register_policy(name: str, factory: PolicyClass) -> None:
    """Make a policy available to :func:`create_policy` under ``name``."""
    POLICIES.add(name, factory)


def create_policy(name: str, **options: Any) -> AdmissionPolicy:
    """Build the policy registered as ``name`` with its keyword ``options``."""
    return POLICIES.get(name)(**options)


def policy_names() -> list[str]:
    return POLICIES.names()
