"""The ILNP kernel fast path: established ILCC entries mirrored into two tc programs.

Theory of operation
-------------------
The daemon's user-space path costs about 12 µs a packet in each direction (TUN or ring
read, :class:`~sixlab.ilnp.host.IlnpHost`, raw-socket or TUN write). For an entry that
is established, what the host does to each packet is a fixed rewrite, so the daemon
copies the entry into a BPF hash map and two programs of
``sixlab/linux/bpf/ilnp_fastpath.bpf.c`` do it in the kernel: ``ilnp_egress`` at
the TUN device's tc egress (identifier addresses to I-LVs, nonce option in, out of the
link holding the local locator) and ``ilnp_ingress`` at each link's tc ingress (nonce
and source locator checked, option out, identifier addresses, into the TUN device's
receive path). The C file's comment says exactly what each program accepts.

The host stays the authority. :func:`peer_record` is a pure function of an entry and
the host's configuration; it grants the kernel only what the host itself would do
with the entry's next packet:

* **egress** while the entry is ``ACTIVE`` or ``LU_PENDING`` and has a usable locator
  that the link holding the local locator has a route to (the record names the next
  hop on that link, :meth:`sixlab.ilnp.links.LinkWatcher.next_hop`),
  until the earliest deadline at which the host's choice of locator could change
  (then the packet goes to user space, whose ``send`` advances the entry, and the
  record is rewritten); the nonce goes in when the host would put it in;
* **ingress** once the peer's nonce is known and the host would no longer learn
  anything from the packet: while ``carry_nonce`` is set the host clears it on the
  first packet back, so that packet still goes through user space; locators are
  accepted until their lifetime plus the aged grace (what the host accepts);
* ``NON_ILNP`` and expired entries, and everything the programs do not recognise,
  stay in user space;
* a correspondent that spoke first gets its copy with its second packet, not its
  first: a crowd of one-packet senders (a flood of random NIDs) costs no map write each.
  One we started talking to (``initiated``) gets it at once.

The host reports which entries changed (``IlnpHost.take_touched``); the daemon turns
each into :meth:`FastPath.update`. In the other direction the programs push a peer's
NID into a ring buffer at most once a second per direction while its entry carries
traffic, and the daemon marks the entry used (LRU order, idle expiry) and, for packets
from the peer, heard (a restarted peer is told apart by that) — the host's notions of
"in use" and "heard" are one second coarse for fast-path entries.

Errors: a missing compiler, libbpf or kernel feature raises
:class:`~sixlab.linux.LinuxError` (from the build or load), which the
daemon reports and, unless told ``--fastpath on``, survives by staying in user space.
A full peer map is not an error: the entry stays in user space and is counted.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sixlab.ilnp.host import HostConfig
from sixlab.ilnp.ilcc import LOCATOR_AGED_GRACE, EntryState, IlccEntry, LocatorState
from sixlab.linux.bpfbuild import build_objects
from sixlab.linux.errors import LinuxError
from sixlab.linux.libbpf import (
    BpfMap,
    BpfObject,
    BpfProgram,
    LibbpfError,
    RingBuffer,
    tc_attach,
    tc_detach,
)

__all__ = [
    "COUNTER_NAMES",
    "F_CARRY_NONCE",
    "F_EGRESS",
    "F_INGRESS",
    "F_NONCE_OPTIONAL",
    "MAX_LOCATORS",
    "FastPath",
    "PeerRecord",
    "peer_record",
    "remove_leftovers",
]

#: Locators per side the programs look at (``MAX_LOCATORS`` in the C).
MAX_LOCATORS = 8
# struct ilnp_peer.flags
F_EGRESS = 0x1
F_INGRESS = 0x2
F_CARRY_NONCE = 0x4
F_NONCE_OPTIONAL = 0x8
#: ``enum fp_counter`` of the C, in order.
COUNTER_NAMES = (
    "rx_fast",
    "rx_no_peer",
    "rx_not_ready",
    "rx_nonce",
    "rx_locator",
    "rx_protocol",
    "rx_gso",
    "rx_error",
    "tx_fast",
    "tx_no_peer",
    "tx_not_ready",
    "tx_expired",
    "tx_protocol",
    "tx_gso",
    "tx_no_room",
    "tx_error",
    "rx_not_our_locator",
    "activity_lost",
    "rx_no_room",
    "rx_fast_tcp",
    "tx_fast_tcp",
    "rx_fast_gso",
)
#: A ``u64`` deadline that never comes.
_NEVER = (1 << 64) - 1
# struct ilnp_config: nid, prefix, locators[8], n_locators, tun_ifindex.
_CONFIG = struct.Struct(f"<QQ{MAX_LOCATORS}QII")
# struct ilnp_peer: local/peer locator, egress_until_ns, accept[8], accept_until_ns[8],
# last_report_ns, last_rx_report_ns, egress_ifindex, flags, nonce lengths, n_accept,
# pad, the two nonces, the egress next hop.
_PEER = struct.Struct(f"<QQQ{MAX_LOCATORS}Q{MAX_LOCATORS}QQQIIBBB5x12s12s16s")
_KEY = struct.Struct("<Q")
# struct activity: peer NID, heard (a packet from the peer, not to it).
_ACTIVITY = struct.Struct("<QQ")
_INDEX = struct.Struct("<I")
#: tc filter handle and priority of our programs (a crashed run's filter is replaced).
TC_HANDLE = 0x1F0
TC_PRIORITY = 0x1F0


def _ns(seconds: float) -> int:
    return min(max(int(seconds * 1e9), 0), _NEVER)


@dataclass(frozen=True, slots=True)
class PeerRecord:
    """What the kernel is told about one correspondent (``struct ilnp_peer``)."""

    flags: int
    local_locator: int
    peer_locator: int
    egress_until: float
    egress_ifindex: int
    #: (locator, accepted until) pairs, times on the daemon's monotonic clock.
    accept: tuple[tuple[int, float], ...]
    local_nonce: bytes
    peer_nonce: bytes
    #: Egress: the next hop on the egress link (128-bit; the peer itself when on-link).
    next_hop: int = 0

    def pack(self) -> bytes:
        accept = list(self.accept[:MAX_LOCATORS])
        locators = [a[0] for a in accept] + [0] * (MAX_LOCATORS - len(accept))
        until = [_ns(a[1]) for a in accept] + [0] * (MAX_LOCATORS - len(accept))
        return _PEER.pack(
            self.local_locator,
            self.peer_locator,
            _ns(self.egress_until),
            *locators,
            *until,
            0,
            0,
            self.egress_ifindex,
            self.flags,
            len(self.local_nonce),
            len(self.peer_nonce),
            len(accept),
            self.local_nonce,
            self.peer_nonce,
            self.next_hop.to_bytes(16, "big"),
        )


def peer_record(
    entry: IlccEntry,
    config: HostConfig,
    ifindex_of: Callable[[int], int | None],
    next_hop_of: Callable[[int, int], int | None] = lambda _loc, dst: dst,
) -> PeerRecord | None:
    """The kernel's copy of ``entry``, or None when the kernel should not know it.

    ``ifindex_of`` maps a local locator to the interface that holds it (None: unknown,
    so no egress); ``next_hop_of`` a local locator and a destination address to the
    next hop on that interface (None: it has no route there, so no egress). The rules
    are the module docstring's.
    """
    if entry.state not in (EntryState.ACTIVE, EntryState.LU_PENDING):
        return None
    if not entry.initiated and entry.heard < 2:
        return None  # a newcomer's first packet: only its second earns a kernel copy
    pending = entry.state is EntryState.LU_PENDING
    flags = 0
    best = entry.best_locator()
    deadlines = [t for p in entry.locators if (t := p.next_deadline()) is not None]
    ifindex = ifindex_of(entry.local_locator)
    hop = None
    if best is not None:
        hop = next_hop_of(entry.local_locator, (best.locator << 64) | entry.peer_nid)
    if hop is not None and deadlines and ifindex is not None:
        flags |= F_EGRESS
    if config.always_carry_nonce or entry.carry_nonce or pending:
        flags |= F_CARRY_NONCE
    if entry.peer_nonce is not None and (pending or not entry.carry_nonce):
        flags |= F_INGRESS
        if not config.require_nonce:
            flags |= F_NONCE_OPTIONAL
    if not flags & (F_EGRESS | F_INGRESS):
        return None
    accept = tuple(
        (p.locator, p.valid_until + LOCATOR_AGED_GRACE)
        for p in entry.locators
        if p.state is not LocatorState.EXPIRED
    )
    return PeerRecord(
        flags=flags,
        local_locator=entry.local_locator,
        peer_locator=best.locator if best is not None else 0,
        egress_until=min(deadlines, default=0.0),
        egress_ifindex=ifindex or 0,
        accept=accept,
        local_nonce=entry.local_nonce.value,
        peer_nonce=b"" if entry.peer_nonce is None else entry.peer_nonce.value,
        next_hop=hop or 0,
    )


def remove_leftovers(links: Iterable[str]) -> int:
    """Detach an ingress filter of ours left on ``links`` by a daemon that died.

    A crashed daemon's ingress program stays attached and keeps redirecting its peers'
    packets into a TUN device that is gone; :meth:`FastPath.open` replaces it, and a
    daemon started without the fast path calls this instead. How many were removed.
    """
    removed = 0
    for name in links:
        try:
            ifindex = socket.if_nametoindex(name)
            removed += tc_detach(ifindex, egress=False, handle=TC_HANDLE, priority=TC_PRIORITY)
        except (OSError, LinuxError):
            continue  # no such link, or no libbpf: nothing of ours can be attached
    return removed


def _one_segment_per_packet(ifindex: int) -> None:
    """Cap the TUN device's ``gso_max_segs`` at 1: TCP then hands it one segment per
    packet, which ``ilnp_egress`` can carry, instead of segmentation offload packets of
    up to 64 KiB, which it leaves to user space (the device has no TSO, so the kernel
    cuts those into segments anyway, on their way to the daemon). The device is the
    daemon's and goes with it: nothing to restore."""
    from pyroute2 import IPRoute  # noqa: PLC0415 - netlink only in the daemon

    with IPRoute() as ipr:
        ipr.link("set", index=ifindex, gso_max_segs=1)


class FastPath:
    """The loaded programs and their maps for one daemon (one network namespace).

    ``links`` are the ILNP interfaces (ingress program), ``tun`` the identifier-address
    device (egress program). ``on_active`` gets a peer NID, and whether a packet came
    from that peer (True) or went to it, whenever the kernel reports traffic for it.
    Use :meth:`open`, then :meth:`close` (also on every error path).
    """

    def __init__(
        self,
        *,
        nid: int,
        prefix: int,
        tun: str,
        links: Iterable[str],
        on_active: Callable[[int, bool], None],
    ) -> None:
        self.nid = nid
        self.prefix = prefix
        self.tun = tun
        self.links = tuple(links)
        self.on_active = on_active
        self.stats: Counter[str] = Counter()
        self.installed: set[int] = set()
        self.tun_ifindex = 0
        self._attached: list[tuple[int, bool]] = []
        #: The interface index each link's ingress program is attached to.
        self._ingress: dict[str, int] = {}
        self._obj: BpfObject | None = None
        self._ring: RingBuffer | None = None
        self._cfg_map: BpfMap | None = None
        self._peers: BpfMap | None = None
        self._counters: BpfMap | None = None

    def open(self, locators: Iterable[int]) -> None:
        """Load the programs, fill the config and attach them to the TUN and the links."""
        try:
            self.load(socket.if_nametoindex(self.tun))
            self.set_locators(locators)
            self.attach()
        except BaseException:
            self.close()
            raise

    def load(self, tun_ifindex: int) -> None:
        """Build (or take from the cache) and load the object; nothing attached yet."""
        self.tun_ifindex = tun_ifindex
        obj = BpfObject(build_objects()["ilnp_fastpath"])
        self._obj = obj
        obj.load()
        self._cfg_map = obj.map("ilnp_cfg")
        self._peers = obj.map("ilnp_peers")
        self._counters = obj.map("ilnp_counters")
        self._ring = RingBuffer(obj.map("ilnp_activity"), self._on_sample)

    def program(self, name: str) -> BpfProgram:
        """``ilnp_ingress`` or ``ilnp_egress`` of the loaded object (tests run them)."""
        assert self._obj is not None, "load() first"
        return self._obj.program(name)

    def attach(self) -> None:
        """The ingress program on every link, the egress one on the TUN device."""
        for name in self.links:
            self.attach_link(name, socket.if_nametoindex(name))
        egress = self.program("ilnp_egress").fd
        tc_attach(self.tun_ifindex, egress, egress=True, handle=TC_HANDLE, priority=TC_PRIORITY)
        self._attached.append((self.tun_ifindex, True))
        _one_segment_per_packet(self.tun_ifindex)

    def attached_to(self, name: str) -> int | None:
        """The interface index link ``name``'s ingress program is attached to."""
        return self._ingress.get(name)

    def attach_link(self, name: str, ifindex: int) -> bool:
        """Attach the ingress program to link ``name``, now interface ``ifindex``, unless
        it is there already; whether it was attached now. A link deleted and made again
        has a new index and none of our filters (they went with the old interface)."""
        if self._ingress.get(name) == ifindex:
            return False
        old = self._ingress.pop(name, None)
        if old is not None:
            self._attached.remove((old, False))
        program = self.program("ilnp_ingress").fd
        tc_attach(ifindex, program, egress=False, handle=TC_HANDLE, priority=TC_PRIORITY)
        self._attached.append((ifindex, False))
        self._ingress[name] = ifindex
        return True

    def set_locators(self, locators: Iterable[int]) -> None:
        """Our locators: the ingress program takes packets addressed to these only."""
        mine = list(locators)[:MAX_LOCATORS]
        padded = mine + [0] * (MAX_LOCATORS - len(mine))
        value = _CONFIG.pack(self.nid, self.prefix, *padded, len(mine), self.tun_ifindex)
        assert self._cfg_map is not None, "open() first"
        self._cfg_map.update(_INDEX.pack(0), value)

    def update(self, nid: int, record: PeerRecord | None) -> None:
        """Install, replace or remove the kernel's copy of ``nid``'s entry.

        Never raises for a refused write: the entry then stays in user space (counted,
        ``map_full`` or ``update_errors``), and an older copy is taken out of the kernel
        so that it cannot act on stale state.
        """
        assert self._peers is not None, "open() first"
        key = _KEY.pack(nid)
        if record is None:
            if nid in self.installed:
                self._forget(key, nid)
                self.stats["removed"] += 1
            return
        try:
            self._peers.update(key, record.pack())
        except LibbpfError as exc:
            self.stats["map_full" if exc.errno == errno.E2BIG else "update_errors"] += 1
            if nid in self.installed:
                self._forget(key, nid)
            return
        self.installed.add(nid)
        self.stats["installed"] += 1

    def _forget(self, key: bytes, nid: int) -> None:
        assert self._peers is not None
        self.installed.discard(nid)
        try:
            self._peers.delete(key)
        except LibbpfError:
            self.stats["delete_errors"] += 1

    def counters(self) -> dict[str, int]:
        """The programs' per-CPU counters, summed, by name (zeros left out)."""
        out: dict[str, int] = {}
        if self._counters is None:
            return out
        for index, name in enumerate(COUNTER_NAMES):
            per_cpu = self._counters.lookup_percpu(_INDEX.pack(index)) or []
            total = sum(int.from_bytes(v[:8], "little") for v in per_cpu)
            if total:
                out[name] = total
        return out

    def program_stats(self) -> dict[str, dict[str, float]]:
        """Runs and mean ns per run of each program, from the kernel's BPF statistics.

        The kernel counts only while ``kernel.bpf_stats_enabled`` is 1 (it costs two
        clock reads a run); otherwise the figures stay 0.
        """
        if self._obj is None:
            return {}
        out: dict[str, dict[str, float]] = {}
        for name in ("ilnp_ingress", "ilnp_egress"):
            info = self._obj.program(name).info()
            mean = info.run_time_ns / info.run_cnt if info.run_cnt else 0.0
            out[name] = {"runs": info.run_cnt, "ns_per_run": round(mean, 1)}
        return out

    def fileno(self) -> int:
        """The ring buffer's epoll descriptor: readable when activity reports wait."""
        assert self._ring is not None, "open() first"
        return self._ring.epoll_fd()

    def drain(self) -> int:
        """Hand every waiting activity report to ``on_active``; how many there were."""
        if self._ring is None:
            return 0
        return self._ring.consume()

    def _on_sample(self, data: bytes) -> None:
        self.stats["activity"] += 1
        nid, heard = _ACTIVITY.unpack_from(data)
        self.on_active(nid, bool(heard))

    def close(self) -> None:
        """Detach the filters and free the object; safe to call twice."""
        for ifindex, egress in self._attached:
            try:
                tc_detach(ifindex, egress=egress, handle=TC_HANDLE, priority=TC_PRIORITY)
            except LibbpfError:
                self.stats["detach_errors"] += 1
        self._attached.clear()
        self._ingress.clear()
        if self._ring is not None:
            self._ring.free()
            self._ring = None
        if self._obj is not None:
            self._obj.close()
            self._obj = None
        self.installed.clear()
        self._cfg_map = self._peers = self._counters = None
