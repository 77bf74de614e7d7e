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
  can churn but never exceed.

Policies register by name (docs/architecture.md, "Adapters and registries"):
:func:`register_policy`, :func:`create_policy`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sixlab.ilnp._errors import UnknownBackendError
from sixlab.ilnp.ilcc import IlccStore

__all__ = [
    "Admission",
    "AdmissionPolicy",
    "AdmissionRequest",
    "BoundedPolicy",
    "NonePolicy",
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


class NonePolicy:
    """Adopt on every nonce packet from an unknown NID; never expire (St Andrews)."""

    name = "none"

    def admit(self, request: AdmissionRequest, ilcc: IlccStore, now: float) -> Admission:  # noqa: ARG002 (AdmissionPolicy signature)
        return Admission(True, "always")

    def expired(self, ilcc: IlccStore, now: float) -> list[int]:  # noqa: ARG002 (AdmissionPolicy signature)
        return []

    def next_deadline(self, ilcc: IlccStore) -> float | None:  # noqa: ARG002 (AdmissionPolicy signature)
        return None


class SocketPolicy:
    """Adopt only when a connected socket on this host is part of the flow (ILNP paper)."""

    name = "socket"

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


class BoundedPolicy:
    """Adopt up to ``capacity`` entries, evicting the least recently used; expire the idle."""

    name = "bounded"

    def __init__(self, capacity: int = 1024, idle_timeout: float = 60.0) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.idle_timeout = idle_timeout

    def admit(self, request: AdmissionRequest, ilcc: IlccStore, now: float) -> Admission:  # noqa: ARG002 (AdmissionPolicy signature)
        oldest = ilcc.oldest()
        if len(ilcc) >= self.capacity and oldest is not None:
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


_POLICIES: dict[str, Callable[..., AdmissionPolicy]] = {}


def register_policy(name: str, factory: Callable[..., AdmissionPolicy]) -> None:
    """Make a policy available to :func:`create_policy` under ``name``."""
    _POLICIES[name] = factory


def create_policy(name: str, **options: Any) -> AdmissionPolicy:
    """Build the policy registered as ``name`` with its keyword ``options``."""
    try:
        factory = _POLICIES[name]
    except KeyError:
        raise UnknownBackendError(
            f"unknown admission policy {name!r}; have {policy_names()}"
        ) from None
    return factory(**options)


def policy_names() -> list[str]:
    return sorted(_POLICIES)


register_policy("none", NonePolicy)
register_policy("socket", SocketPolicy)
register_policy("bounded", BoundedPolicy)
