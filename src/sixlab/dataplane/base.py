"""The interface every STAMP data plane implements, and the registry that picks one.

A data plane moves STAMP payloads and timestamps; it knows nothing of the protocol.
It receives UDP datagrams for one port (with the arrival time taken as close to the
wire as it can, the Hop Limit they arrived with, and their addresses), and sends
payloads to an address and port, optionally along an SRv6 SID list. The engines in
``sixlab.dataplane.engine`` join a data plane to the sans-I/O core.

Planes are entered by name in :data:`PLANES` (the one list of them; docs/architecture.md,
"Adapters and registries") and chosen by ``--dataplane NAME``::

    dp = create("socket", DataplaneConfig(port=862))

A plane that answers plain reflector packets itself, without the engine's per-packet
path, sets ``has_fast_path`` and implements :meth:`Dataplane.reflect_batch` (the
``mmap`` plane); the reflector engine calls it when the plane declares it.
"""

from __future__ import annotations

import abc
import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import TYPE_CHECKING, ClassVar, NamedTuple, Protocol

from sixlab.registry import Registry

if TYPE_CHECKING:
    from sixlab.stamp.reflector import ReflectorSessionConfig

__all__ = [
    "PLANES",
    "Dataplane",
    "DataplaneConfig",
    "DataplaneError",
    "FastBatch",
    "FastReply",
    "FastRoute",
    "IPAddress",
    "Received",
    "ReflectFn",
    "available",
    "create",
    "full_path",
    "require_ipv6",
]

IPv6Address = ipaddress.IPv6Address
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class DataplaneError(RuntimeError):
    """A data plane cannot be set up or used (the message says what to fix)."""


@dataclass(frozen=True, slots=True)
class DataplaneConfig:
    """Init parameters common to every data plane (the STAMP paper's Init RPC, docs/papers.md).

    ``port`` is the local STAMP UDP port (862 on a reflector, RFC 8762 §4.1);
    ``interface`` the one to capture on (needed by capture-based planes); ``source`` the
    address to send from and listen on (None: any). An IPv4 ``source`` (or IPv4 peers)
    only on a plane that does IPv4 (``socket``); the others refuse it.
    """

    port: int
    interface: str | None = None
    source: IPAddress | None = None
    #: Destination ports of sessions this plane must also capture (sender side).
    peer_ports: tuple[int, ...] = ()


@dataclass(slots=True, unsafe_hash=True)
class Received:
    """One datagram, as the core needs it. Addresses are packed: 16 bytes for IPv6, 4 for
    IPv4 (``ipaddress.ip_address`` reads either). ``hop_limit`` is the IPv6 Hop Limit or
    the IPv4 TTL; ``tclass`` the IPv6 Traffic Class or IPv4 TOS byte, None where the
    plane cannot read it. ``truncated``: the datagram was longer than the plane's
    receive buffer and ``payload`` is only its start (the kernel's ``MSG_TRUNC``): a
    malformed packet, which the engines count and hand to no session.

    A value: nothing changes one once made. It is not ``frozen`` because a frozen
    dataclass sets each field through ``object.__setattr__``, which made building one
    cost about four times as much, once per datagram (benchmarks/README.md, "One sender
    agent, socket plane"); it hashes by its fields as a frozen one would."""

    payload: bytes
    src: bytes
    dst: bytes
    src_port: int
    dst_port: int
    hop_limit: int
    rx_ns: int  # Unix-epoch UTC ns; a kernel timestamp where the plane has one
    tclass: int | None = None
    truncated: bool = False

    @property
    def flow(self) -> bytes:
        """The flow key of the datagram: source and destination address, then the ports
        (for IPv6 the bytes of the IPv6 header from offset 8 and the UDP ports)."""
        return self.src + self.dst + self.src_port.to_bytes(2) + self.dst_port.to_bytes(2)


class FastRoute(Protocol):
    """What a fast path reads of a reply's return path (``stamp.reflector.ReturnPath``)."""

    @property
    def segments(self) -> tuple[IPv6Address, ...] | None: ...

    @property
    def address(self) -> IPv4Address | IPv6Address | None: ...


class FastReply(Protocol):
    """What a fast path reads of a reply (``stamp.reflector.Reflection``)."""

    @property
    def payload(self) -> bytes: ...

    @property
    def return_path(self) -> FastRoute: ...


class ReflectFn(Protocol):
    """``Reflector.reflect`` as a fast path calls it: (payload, T2 ns, clock, hop limit)
    and the flow key (``Received.flow``'s bytes: addresses, then ports)."""

    def __call__(
        self, data: bytes, t2_ns: int, clock: Callable[[], int], hop_limit: int, /, *, flow: object
    ) -> FastReply | None: ...


class FastBatch(NamedTuple):
    """What one ``reflect_batch`` did: packets taken off the ring, packets handed to
    ``reflect``, replies that could not be sent, and packets left to the general path."""

    consumed: int
    handled: int
    send_failed: int
    slow: list[Received]


class Dataplane(abc.ABC):
    """Moves STAMP payloads for one local UDP port."""

    #: The plane's name in :data:`PLANES` (``--dataplane NAME``).
    name: ClassVar[str]
    #: True for a plane that implements :meth:`reflect_batch`.
    has_fast_path: ClassVar[bool] = False
    #: ``send`` applies its ``tclass`` (Traffic Class / TOS byte) to the packet.
    sets_tclass: ClassVar[bool] = False
    #: True for a plane that implements :meth:`send_labelled` (ECMP coverage).
    sets_flow_label: ClassVar[bool] = False
    #: True for a plane that collects a sender session's replies itself and hands them
    #: over rebuilt as reflector packets (``xdp``): it must never hear of a loopback
    #: session, whose replies are its own Session-Sender packets (docs/srpm.md).
    rebuilds_replies: ClassVar[bool] = False

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
        dst: IPAddress,
        dst_port: int,
        *,
        segments: Sequence[IPv6Address] | None = None,
        src: IPAddress | None = None,
        tclass: int | None = None,
    ) -> None:
        """Send ``payload`` from the local port; ``segments`` in travel order, last = dst.

        ``tclass``: the Traffic Class / TOS byte, where the plane ``sets_tclass`` (the
        others ignore it). An IPv4 ``dst`` on a plane without IPv4 raises DataplaneError.
        """

    def sender(
        self,
        dst: IPAddress,
        dst_port: int,
        *,
        segments: Sequence[IPv6Address] | None = None,
        src: IPAddress | None = None,
    ) -> Callable[[bytes], None]:
        """``send`` to one destination, as a function of the payload alone: a plane may
        work out once what every packet to it shares (the socket plane: the address)."""

        def send(payload: bytes) -> None:
            self.send(payload, dst, dst_port, segments=segments, src=src)

        return send

    def send_labelled(
        self,
        payload: bytes,
        dst: IPv6Address,
        dst_port: int,
        flow_label: int,
        *,
        segments: Sequence[IPv6Address] | None = None,
        src: IPv6Address | None = None,
    ) -> None:
        """``send`` with the IPv6 Flow Label ``flow_label`` (1..0x7FFFF, docs/srpm.md), on a
        plane that ``sets_flow_label``; the others refuse."""
        del payload, dst, dst_port, flow_label, segments, src
        raise DataplaneError(f"{self.name}: this data plane cannot set the IPv6 flow label")

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

    def reflect_batch(
        self, reflect: ReflectFn, clock: Callable[[], int], max_batch: int = 64
    ) -> FastBatch:
        """The reflector fast path of a plane with ``has_fast_path``: answer up to
        ``max_batch`` waiting packets with ``reflect`` itself, and return the ones it
        cannot answer in ``FastBatch.slow`` for the engine's general path."""
        raise NotImplementedError(f"{type(self).__name__} has no reflector fast path")

    @property
    def local_port(self) -> int:
        """The local UDP port: the configured one, or the one the kernel chose for a plane
        that binds a socket to port 0."""
        return self.config.port

    def kernel_stats(self) -> tuple[int, int] | None:
        """(packets, drops) the kernel counted for the plane's receive ring since the last
        call; None for a plane without one."""
        return None

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


def require_ipv6(plane: str, address: IPAddress | None) -> IPv6Address | None:
    """``address`` on a plane that only does IPv6: an IPv4 one is a clear error."""
    if address is None or isinstance(address, IPv6Address):
        return address
    raise DataplaneError(
        f"{plane}: this data plane is IPv6 only ({address}); use the socket data plane for IPv4"
    )


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


def _unknown_plane(message: str) -> DataplaneError:
    return DataplaneError(f"dataplane: {message}")


#: Every data plane, by name: the one place a plane is added. A plane's module is
#: imported when the plane is first asked for, so listing the names loads none; a plane
#: whose system support is missing still loads, and fails in ``open`` with a message
#: naming what to install.
PLANES: Registry[type[Dataplane]] = Registry("data plane", _unknown_plane)
PLANES.add_lazy("socket", "sixlab.dataplane.udpsocket:SocketDataplane")
PLANES.add_lazy("scapy", "sixlab.dataplane.scapy_plane:ScapyDataplane")
PLANES.add_lazy("mmap", "sixlab.dataplane.mmap_plane:MmapDataplane")
PLANES.add_lazy("xdp", "sixlab.dataplane.xdp_plane:XdpDataplane")
PLANES.add_lazy("afxdp", "sixlab.dataplane.afxdp_plane:AfXdpDataplane")


def available() -> list[str]:
    """The names ``create`` accepts."""
    return PLANES.names()


def create(name: str, config: DataplaneConfig) -> Dataplane:
    """A new (not yet open) data plane ``name``; ``DataplaneError`` for an unknown one."""
    return PLANES.get(name)(config)
