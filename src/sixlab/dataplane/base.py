"""The interface every STAMP data plane implements, and the registry that picks one.

A data plane moves STAMP payloads and timestamps; it knows nothing of the protocol.
It receives UDP datagrams for one port (with the arrival time taken as close to the
wire as it can, the Hop Limit they arrived with, and their addresses), and sends
payloads to an address and port, optionally along an SRv6 SID list. The engines in
``sixlab.dataplane.engine`` join a data plane to the sans-I/O core.

Backends register under a name (docs/architecture.md, "Adapters and registries") and
are chosen by ``--dataplane NAME``::

    @register("socket")
    class SocketDataplane(Dataplane): ...

    dp = create("socket", DataplaneConfig(port=862))
"""

from __future__ import annotations

import abc
import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeVar

if TYPE_CHECKING:
    from sixlab.stamp.reflector import ReflectorSessionConfig

__all__ = [
    "Dataplane",
    "DataplaneConfig",
    "DataplaneError",
    "Received",
    "available",
    "create",
    "full_path",
    "register",
]

IPv6Address = ipaddress.IPv6Address


class DataplaneError(RuntimeError):
    """A data plane cannot be set up or used (the message says what to fix)."""


@dataclass(frozen=True, slots=True)
class DataplaneConfig:
    """Init parameters common to every data plane (the STAMP paper's Init RPC, docs/papers.md).

    ``port`` is the local STAMP UDP port (862 on a reflector, RFC 8762 §4.1);
    ``interface`` the one to capture on (needed by capture-based planes); ``source`` the
    address to send from and listen on (None: any).
    """

    port: int
    interface: str | None = None
    source: IPv6Address | None = None
    #: Destination ports of sessions this plane must also capture (sender side).
    peer_ports: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Received:
    """One datagram, as the core needs it. Addresses are 16-byte packed IPv6."""

    payload: bytes
    src: bytes
    dst: bytes
    src_port: int
    dst_port: int
    hop_limit: int
    rx_ns: int  # Unix-epoch UTC ns; a kernel timestamp where the plane has one


class Dataplane(abc.ABC):
    """Moves STAMP payloads for one local UDP port."""

    name: ClassVar[str]

    def __init__(self, config: DataplaneConfig) -> None:
        self.config = config

    @abc.abstractmethod
    def open(self) -> None:
        """Acquire sockets, rings, filters. Idempotent cleanup of a crashed run first."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release everything ``open`` acquired; safe to call twice."""

    @abc.abstractmethod
    def fileno(self) -> int:
        """A descriptor that polls readable when ``receive`` may return datagrams."""

    @abc.abstractmethod
    def receive(self, max_batch: int = 64) -> list[Received]:
        """Datagrams waiting now (never blocks; may return an empty list)."""

    @abc.abstractmethod
    def send(
        self,
        payload: bytes,
        dst: IPv6Address,
        dst_port: int,
        *,
        segments: Sequence[IPv6Address] | None = None,
        src: IPv6Address | None = None,
    ) -> None:
        """Send ``payload`` from the local port; ``segments`` in travel order, last = dst."""

    def flush(self) -> None:  # noqa: B027 - optional hook, nothing to do by default
        """Push out sends a batching plane has queued."""

    def set_restamp(self, restamp: Callable[[bytes], bytes]) -> None:  # noqa: B027
        """A plane whose send path is slow calls ``restamp(payload)`` right before the
        packet leaves and sends what it returns: the reply with T3 read again (the
        reflector engine passes ``Reflector.restamp`` with a fresh clock reading)."""

    # -- session hooks: a plane that answers or collects packets itself (``xdp``) ------
    # The engines call these, and only they (``ReflectorEngine.add_session`` and the
    # like), after the core has the change, so the core and the plane never disagree
    # about which sessions exist. A plane that only moves bytes ignores them.

    def reflector_session_added(self, config: ReflectorSessionConfig) -> None:  # noqa: B027
        """A reflector session (``config.ssid is None``: the default one) now exists."""

    def reflector_session_removed(self, ssid: int | None) -> None:  # noqa: B027
        """Reflector session ``ssid`` (None: the default one) is gone."""

    def sender_session_added(self, ssid: int) -> None:  # noqa: B027
        """Sender session ``ssid`` now exists: its replies may be collected by the plane."""

    def sender_session_removed(self, ssid: int) -> None:  # noqa: B027
        """Sender session ``ssid`` is gone."""

    def counters(self) -> dict[str, int]:
        """The plane's own packet counters by name (e.g. ``reflected``, ``drop-*``) for
        packets it handled without the engine; empty for a plane that has none."""
        return {}

    def session_counters(self, ssid: int | None) -> dict[str, int]:
        """The plane's own counters of one session (None: the default session)."""
        del ssid
        return {}

    def __enter__(self) -> Dataplane:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def full_path(
    dst: IPv6Address, segments: Sequence[IPv6Address] | None
) -> tuple[IPv6Address, ...] | None:
    """The SID list a packet to ``dst`` travels, in travel order, ending at ``dst``.

    ``send`` takes ``segments`` with or without the final destination (the STAMP paper's
    SID lists end at the reflector; a Return Path TLV's may not): the destination closes the
    list when it is not already its last segment. None for a plain (no SRH) path.
    """
    if not segments:
        return None
    path = tuple(segments)
    return path if path[-1] == dst else (*path, dst)


_REGISTRY: dict[str, Callable[[DataplaneConfig], Dataplane]] = {}


_D = TypeVar("_D", bound=type[Dataplane])


def register(name: str) -> Callable[[_D], _D]:
    def deco(cls: _D) -> _D:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _load_builtin() -> None:
    # Import for the side effect of registration; planes whose system dependencies are
    # missing still register and fail in open() with a message naming the package.
    from sixlab.dataplane import udpsocket  # noqa: F401, PLC0415

    for optional in ("scapy_plane", "mmap_plane", "xdp_plane"):
        try:
            __import__(f"sixlab.dataplane.{optional}")
        except ModuleNotFoundError as exc:
            if exc.name != f"sixlab.dataplane.{optional}":
                raise


def available() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def create(name: str, config: DataplaneConfig) -> Dataplane:
    _load_builtin()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise DataplaneError(
            f"dataplane: unknown data plane {name!r} (available: {', '.join(available())})"
        ) from None
    return factory(config)
