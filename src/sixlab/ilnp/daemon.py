"""The ILNPv6 host daemon: the I/O adapter around :class:`sixlab.ilnp.IlnpHost`.

Theory of operation
-------------------
Applications keep using ordinary sockets. They bind to and connect to *identifier
addresses* (``fd00:2ff::/64`` + NID, :func:`sixlab.wire.ilnp.identifier_address`),
which live on a TUN device this daemon owns::

    app ─ TCP/UDP ─ kernel ─▶ TUN ─▶ daemon: IlnpHost.send ─▶ raw socket ─▶ wire
    app ◀ TCP/UDP ◀ kernel ◀─ TUN ◀─ daemon: IlnpHost.receive ◀─ TPACKET_V3 ring ◀─ wire

* **Egress.** The kernel routes packets for the identifier prefix into the TUN device.
  The daemon hands each to the host, which picks locators from the ILCC, adds the nonce
  Destination Option and gives back a wire packet; an ``IPPROTO_RAW`` socket (the
  header is ours, RFC 3542 §3) bound to the link that holds the packet's source
  locator sends it (:mod:`sixlab.ilnp.egress`). A peer without an ILCC entry is resolved by
  NID in the I-LV hosts file (:mod:`sixlab.ilnp.resolve`) and added as a correspondent.
* **Ingress.** A ``TPACKET_V3`` ring on each interface sees every IPv6 frame; those for
  our NID (the low 64 bits of the destination, whatever the locator: a locator change
  must not need a filter change) other than Neighbour Discovery go to the host. An
  nftables table drops the same packets at the kernel's input hook, after the packet
  taps have copied them, so the kernel neither answers the unknown option 0x8B with a
  Parameter Problem nor resets TCP segments for a socket it does not have. The host
  validates nonce and locator, asks the admission policy, and gives back a packet on
  identifier addresses, which the daemon writes to the TUN device.
* **Checksums.** The identifier prefix's words add up to 0xFFFF, so the checksum the
  kernel computes over identifier addresses *is* the NID-only ILNP checksum (RFC 6740
  §6.3): neither direction touches it. A frame the ring flags
  ``TP_STATUS_CSUMNOTREADY`` (a sender's TCP, left for a device to finish, came over
  a veth that finishes nothing) has its checksum finished here first
  (:func:`sixlab.wire.ilnp.finish_partial_checksum`).
* **Aggregates.** A link with GRO on (or a veth passing a TSO packet on) hands the
  ring TCP aggregates of up to 64 KiB; the ring's blocks hold them whole and its
  virtio header (``PACKET_VNET_HDR``) says which frames they are. A TCP one is
  delivered as one segment, its checksum finished NID-only when it carries a nonce
  (GRO summed the pseudo-header over the locators); a UDP one, whose datagram
  boundaries are gone, is a counted drop, as is a frame the ring kept only part of
  (docs/ilnp-field.md, "Segments coalesced by the link").
* **Kernel fast path.** Once an ILCC entry is established, a copy of it goes into a BPF
  map, and two tc programs (:mod:`sixlab.ilnp.fastpath`) carry its TCP and UDP packets
  in both directions without this process: the TUN device's egress rewrites to I-LVs
  and adds the nonce, each link's ingress checks nonce and locator, strips the option
  and redirects into the TUN device. Everything else — admission, Locator Updates,
  ICMPv6, unknown peers, bad nonces, every drop reason — still comes here, and the host
  stays the authority: it reports changed entries (``take_touched``) and the daemon
  rewrites their copies once per loop turn. ``--fastpath auto`` (the default) falls
  back to this process alone, with the reason in ``status``, when the programs cannot
  be built or loaded; ``on`` makes that an error; ``off`` never loads them.
* **Control.** A Unix stream socket speaks JSON lines: ``status``, ``cache``,
  ``set-locators`` (a move: the host sends Locator Updates), ``add-peer``. It is
  bounded (:mod:`sixlab.ilnp._control`): a client that sends too much, never reads or
  stalls is cut off, never the loop; a malformed request gets ``{"ok": false,
  "error": ...}`` and changes nothing.
* **Links.** Each locator is tied to the interface that holds an address under it;
  when that interface goes down or loses its carrier its locator is withdrawn
  (Locator Updates go out, from another locator and out of its link), and it comes
  back when the link does: multihoming failover. A netlink socket subscribed to link
  and IPv6 address changes wakes the loop the moment one happens; a slow poll covers
  missed events (:mod:`sixlab.ilnp.links`). A link deleted and made again (a new
  interface index) gets a new ring and the fast path's ingress program again.
* **Zero configuration.** A locator given that no link holds gets its locator|NID
  address on its link (:mod:`sixlab.ilnp.addresses`), again whenever the link comes
  back from an administrative down, which flushed it; without ``--locator`` the
  locators, and DNS servers, come from Router Advertisements
  (:mod:`sixlab.ilnp.autoconf`); names resolved go to the names file
  (:mod:`sixlab.ilnp.names`).

One thread, one ``selectors`` loop, time from ``time.monotonic`` passed in as ``now``.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import secrets
import selectors
import socket
import struct
import subprocess
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sixlab.ilnp._control import ControlClient, ControlServer, control_request, default_control
from sixlab.ilnp._errors import ConfigError, DaemonError
from sixlab.ilnp.addresses import add_addresses, claim_addresses, release_addresses
from sixlab.ilnp.autoconf import RouterAdvertisements
from sixlab.ilnp.config import LinkStates, check_held
from sixlab.ilnp.config import parse_nid as config_parse_nid
from sixlab.ilnp.egress import Egress, flush_unresolved
from sixlab.ilnp.fastpath import (
    TC_HANDLE,
    TC_PRIORITY,
    FastPath,
    peer_record,
    remove_leftovers,
)
from sixlab.ilnp.host import Deliver, DropReason, HostConfig, IlnpHost, check_locator_set
from sixlab.ilnp.ilcc import IlccEntry
from sixlab.ilnp.leftovers import Leftovers, netns_cookie, process_start, state_path
from sixlab.ilnp.leftovers import save as save_leftovers
from sixlab.ilnp.leftovers import undo as undo_leftovers
from sixlab.ilnp.links import LinkWatcher, clsact_filters, device_drops, link_states
from sixlab.ilnp.names import render_names, write_names
from sixlab.ilnp.policy import POLICIES, AdmissionPolicy, create_policy
from sixlab.ilnp.resolve import Resolution, ResolveError, Resolver, parse_locator_spec
from sixlab.ilnp.socktable import KernelSocketTable
from sixlab.linux.cbpf import (
    BPF_ABS,
    BPF_B,
    BPF_H,
    BPF_JEQ,
    BPF_JMP,
    BPF_K,
    BPF_LD,
    BPF_W,
    Assembler,
    BpfInstruction,
)
from sixlab.linux.errors import LinuxError
from sixlab.linux.libbpf import tc_hook_destroy
from sixlab.linux.nftdrop import KernelDrop
from sixlab.linux.packetring import (
    ETH_P_IPV6,
    TP_STATUS_CSUMNOTREADY,
    VIRTIO_NET_HDR_GSO_ECN,
    VIRTIO_NET_HDR_GSO_TCPV6,
    PacketRing,
    RingGeometry,
)
from sixlab.linux.signals import StopOnSignal
from sixlab.wire import WireError
from sixlab.wire.ilnp import (
    DSTOPTS_NEXT_HEADER,
    ICMPV6_NEXT_HEADER,
    IDENTIFIER_PREFIX,
    IPV6_HEADER_SIZE,
    LocatorEntry,
    finish_partial_checksum,
    identifier_address,
)

_NID_MASK = (1 << 64) - 1

log = logging.getLogger(__name__)

__all__ = [
    "DaemonConfig",
    "IlnpDaemon",
    "control_request",
    "default_control",
    "format_locator",
    "kernel_drop",
    "parse_nid",
    "run_daemon",
]

# <linux/if_tun.h>
_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000
#: Ring geometry: 256 blocks of 128 KiB (32 MiB) and a 1 ms block retire timeout: a block
#: is handed over when full or after 1 ms, which bounds the latency the ring adds; the
#: 256 blocks let the daemon stall for at least a quarter of a second without a drop.
#: A block holds a whole GRO aggregate (up to 64 KiB of IPv6 packet, with the virtio
#: and ring headers in front): docs/ilnp-field.md, "Segments coalesced by the link".
_RING_GEOMETRY = RingGeometry(block_size=1 << 17, block_count=256, frame_size=2048, retire_ms=1)
#: ICMPv6 Neighbour Discovery types (RFC 4861 §4): the kernel must keep answering these.
_ND_TYPES = frozenset(range(133, 138))
#: Identifier MTU: the links' 1500 bytes less the 16-byte nonce header (96-bit nonce)
#: and some room; IPv6 needs at least 1280 (RFC 8200 §5).
_TUN_MTU = 1400
_IFA_F_NODAD = 0x02
#: Next hop of the identifier route on the TUN device; a TUN has no link layer, so it
#: is never resolved, only keyed on (see :func:`_configure_tun`).
_TUN_GATEWAY = "fe80::1"
_U64 = (1 << 64) - 1
#: How often the daemon checks the links its locators sit on even without a netlink
#: event (an overrun of the event socket loses events; this bounds the damage).
_LINK_POLL_S = 1.0
_LATENCY_SAMPLES = 20000
#: Host timers are looked at no more often than this (see ``IlnpDaemon._run_timers``).
_TIMER_GRANULARITY = 0.01
_READ_BATCH = 64
_UDP = 17


def format_locator(locator: int) -> str:
    """A 64-bit locator as four hex groups, the notation of the hosts file and CLI."""
    return ":".join(f"{(locator >> s) & 0xFFFF:x}" for s in (48, 32, 16, 0))


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    """What ``sixlab ilnp host`` was given."""

    nid: int
    locators: tuple[LocatorEntry, ...]
    interfaces: tuple[str, ...]
    policy: str = "socket"
    store: str = "hash"
    #: Control socket path; the default is per network namespace (:mod:`._control`).
    control: str = field(default_factory=default_control)
    hosts: str | None = None
    tun_name: str = "ilnp0"
    #: Carry the nonce in every packet and require it back (RFC 6744 §2 allows always);
    #: False follows the minimum: first packets, after a locator change, and in LUs.
    always_nonce: bool = True
    #: Kernel fast path: "auto" (use it when it loads), "on" (required), "off".
    fastpath: str = "auto"
    bounded_capacity: int = 1024
    bounded_idle: float = 60.0
    #: Correspondents answered without an ILCC entry (non-adopted). Larger than the
    #: host's default: under a flood of unknown NIDs a legitimate client's slot must
    #: outlive the time its answer takes through the application (a ring batch).
    reply_capacity: int = 8192
    policy_options: dict[str, Any] = field(default_factory=dict)
    #: Where to write identifier addresses of known names (sixlab.ilnp.names); None: not.
    names: str | None = None
    #: Without ``locators``: how long to wait at start for a Router Advertisement's
    #: prefix (:mod:`sixlab.ilnp.autoconf`).
    ra_wait: float = 10.0
    #: Locators given with the link their address goes on (``L64@IF``), as
    #: (locator, interface): :func:`sixlab.ilnp.addresses.place_locators`.
    locator_links: tuple[tuple[int, str], ...] = ()
    #: Names resolved at start (hosts file, then DNS NID/L64 records, RFC 6742): in the
    #: names file, and reachable at their identifier addresses (``--name``).
    resolve_names: tuple[str, ...] = ()


# --------------------------------------------------------------------- kernel drop


def kernel_drop(nid: int, interfaces: tuple[str, ...], dns_port: int = 0) -> KernelDrop:
    """The nftables table that stops the kernel from handling our ILNP packets.

    The input hook runs after AF_PACKET taps, so the ring still sees what is dropped
    here. Matching the destination's NID (not its locator) keeps the rule valid across
    moves; Neighbour Discovery is let through so the link keeps resolving our address.
    The table is named after the NID: a dead run's leftover is replaced, a live
    daemon's with the same NID refused (see :mod:`sixlab.linux.nftdrop`). Answers to
    the daemon's own DNS queries (UDP to ``dns_port``, not 0) go to the kernel: they are
    plain IPv6 to a locator|NID address (docs/ilnp-field.md, "Zero configuration").
    """
    ifaces = ", ".join(f'"{i}"' for i in interfaces)
    match = (
        f"iifname {{ {ifaces} }} ip6 daddr & ::ffff:ffff:ffff:ffff == {ipaddress.IPv6Address(nid)}"
    )
    nd = "nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert"
    rules = [f"{match} icmpv6 type {{ {nd}, nd-redirect }} accept"]
    if dns_port:
        rules.append(f"{match} udp dport {dns_port} accept")
    return KernelDrop(
        f"sixlab_ilnp_{nid:016x}",
        [*rules, f"{match} counter drop"],
        priority="-300",
        purpose=f"another ILNP daemon with NID {nid:016x} runs in this namespace",
    )


# --------------------------------------------------------------------- ring


def ring_filter(
    nid: int, prefix: int = IDENTIFIER_PREFIX, dns_port: int = 0
) -> tuple[BpfInstruction, ...]:
    """Classic BPF for the ring: Ethernet frames whose IPv6 destination ends in our NID
    and does not start with the identifier prefix (:meth:`IlnpDaemon._is_ours` in the
    kernel, bar Neighbour Discovery), and that are not UDP to ``dns_port`` (answers to
    the daemon's DNS queries, which the kernel delivers: :func:`kernel_drop`). The rest
    of the link's traffic never reaches user space; a fast-path packet never reaches
    the ring at all (redirected at tc ingress, before the ring's tap)."""
    dst = 14 + 24  # Ethernet header + offset of the IPv6 Destination Address
    asm = Assembler()
    for offset, word in ((dst + 8, nid >> 32), (dst + 12, nid & 0xFFFFFFFF)):
        asm.emit(BPF_LD | BPF_W | BPF_ABS, offset)
        asm.emit(BPF_JMP | BPF_JEQ | BPF_K, word, jt=0, jf="drop")
    if dns_port:
        asm.emit(BPF_LD | BPF_B | BPF_ABS, 14 + 6)  # Next Header
        asm.emit(BPF_JMP | BPF_JEQ | BPF_K, _UDP, jt=0, jf="prefix")
        asm.emit(BPF_LD | BPF_H | BPF_ABS, 14 + IPV6_HEADER_SIZE + 2)  # UDP destination port
        asm.emit(BPF_JMP | BPF_JEQ | BPF_K, dns_port, jt="drop", jf="prefix")
        asm.label("prefix")
    asm.emit(BPF_LD | BPF_W | BPF_ABS, dst)
    asm.emit(BPF_JMP | BPF_JEQ | BPF_K, prefix >> 32, jt=0, jf="accept")
    asm.emit(BPF_LD | BPF_W | BPF_ABS, dst + 4)
    asm.emit(BPF_JMP | BPF_JEQ | BPF_K, prefix & 0xFFFFFFFF, jt="drop", jf="accept")
    asm.verdicts()
    return asm.finish()


# --------------------------------------------------------------------- TUN and links


def _open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _free_udp_port() -> int:
    """A UDP port free now, for the daemon's DNS queries (dnspython binds it per query)."""
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
        probe.bind(("::", 0))
        port: int = probe.getsockname()[1]
    return port


def _configure_tun(name: str, address: ipaddress.IPv6Address) -> None:
    from pyroute2 import IPRoute  # noqa: PLC0415 - netlink only in the daemon

    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=name)[0]
        ipr.link("set", index=index, mtu=_TUN_MTU, state="up")
        ipr.addr("add", index=index, address=str(address), prefixlen=128, flags=_IFA_F_NODAD)
        # The identifier /64 goes through one (fictitious) gateway instead of being
        # on-link: an on-link route makes the kernel create a neighbour entry per
        # correspondent, even on a TUN device, and past gc_thresh3 (1024) sendto()
        # fails with EINVAL; via a gateway there is one entry whatever the load.
        ipr.route(
            "add",
            dst=str(ipaddress.IPv6Address(int(address) >> 64 << 64)),
            dst_len=64,
            gateway=_TUN_GATEWAY,
            oif=index,
            family=socket.AF_INET6,
        )


# --------------------------------------------------------------------- the daemon


class IlnpDaemon:
    """TUN + ring + raw socket + control socket around one :class:`IlnpHost`."""

    def __init__(
        self,
        config: DaemonConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        policy: AdmissionPolicy | None = None,
        autoconf: RouterAdvertisements | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        #: Locators (and DNS servers) learned from Router Advertisements (None: given
        #: by ``--locator``).
        self.autoconf = autoconf
        self.socket_table: KernelSocketTable | None = None
        if policy is None:
            policy = self._make_policy(config)
        self.host = IlnpHost(
            HostConfig(
                nid=config.nid,
                locators=config.locators,
                always_carry_nonce=config.always_nonce,
                require_nonce=config.always_nonce,
                nonce_key=secrets.token_bytes(32),
                reply_capacity=config.reply_capacity,
            ),
            policy=policy,
            store=config.store,
        )
        self.resolver = Resolver.from_file(config.hosts)
        self.resolver.source_port = _free_udp_port()  # its answers pass (kernel_drop)
        if autoconf is not None:
            self.resolver.learned_servers = autoconf.dns_servers
        self.identifier = identifier_address(config.nid)
        self.events: Counter[str] = Counter()
        self.latency_ns: deque[int] = deque(maxlen=_LATENCY_SAMPLES)
        self.wire: Counter[str] = Counter()
        self.drop = kernel_drop(config.nid, config.interfaces, self.resolver.source_port)
        self._configured = config.locators
        self._withdrawn: set[int] = set()
        self.links = LinkWatcher(config.interfaces)
        self.egress = Egress(config.interfaces)
        #: Per peer NID, the neighbour (ifindex, address) its kernel record's next hop is.
        self._hop_of: dict[int, tuple[int, bytes]] = {}
        #: The links' state (sixlab.ilnp.config.LinkStates) for the locator checks and
        #: zero configuration; tests give their own.
        self.read_links: Callable[[], LinkStates] = lambda: link_states(config.interfaces)
        self._claimed: list[tuple[str, str]] = []
        #: Links back up whose claimed addresses are not added again yet (_reclaim).
        self._reclaim_on: set[str] = set()
        #: Names resolved through ``--name`` and ``add-peer``, and why others were not.
        self._named: dict[str, Resolution] = {}
        self._name_errors: dict[str, str] = {}
        self._dns_asked: list[str] = []  # the DNS servers of the last _resolve_names
        self._nid_bytes = config.nid.to_bytes(8, "big")
        self._prefix_bytes = IDENTIFIER_PREFIX.to_bytes(8, "big")
        self._selector = selectors.DefaultSelector()
        self._rings: list[PacketRing] = []
        self._tun_fd = -1
        self.control = ControlServer(config.control, self.handle_request, self._selector)
        #: Control commands: each takes the request object and returns the reply.
        self._commands: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "status": lambda _request: self.status(),
            "cache": self._cmd_cache,
            "set-locators": self._cmd_set_locators,
            "add-peer": self._cmd_add_peer,
        }
        self._stop = False
        self.fastpath: FastPath | None = None
        self.fastpath_error: str | None = None
        self._next_link_poll = 0.0
        #: Links whose clsact qdisc the daemon made (or inherited from a dead daemon).
        self._own_clsact: set[str] = set()
        #: Where the daemon writes down what it changed (sixlab.ilnp.leftovers).
        self._state = state_path(config.tun_name)
        self._state_saved = False
        self._timer_check = 0.0

    def _make_policy(self, config: DaemonConfig) -> AdmissionPolicy:
        # What the daemon can give a policy built by name; the policy class says which
        # of these it takes (``host_options``), ``policy_options`` may override them.
        offers: dict[str, Callable[[], Any]] = {
            "sockets": self._kernel_socket_table,
            "capacity": lambda: config.bounded_capacity,
            "idle_timeout": lambda: config.bounded_idle,
        }
        options = dict(config.policy_options)
        for option in POLICIES.get(config.policy).host_options - options.keys():
            if option not in offers:
                raise ConfigError(f"policy {config.policy}: the daemon has no {option!r}")
            options[option] = offers[option]()
        return create_policy(config.policy, **options)

    def _kernel_socket_table(self) -> KernelSocketTable:
        self.socket_table = KernelSocketTable()
        return self.socket_table

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Create TUN, rings, raw socket, kernel drop and control socket."""
        _check_interfaces(self.config.interfaces)  # before anything is made: nothing to undo
        try:
            # First what a killed daemon left here goes (a live one's file is refused),
            # then a live daemon on the same control path refuses us.
            self._undo_leftovers()
            self.control.open()
            self._claimed = claim_addresses(  # zero configuration: locator|NID on its link
                self.config.nid,
                self._configured,
                self.config.interfaces,
                self.read_links(),
                named=dict(self.config.locator_links),
            )
            self._save_state()
            self._resolve_names()
            self._write_names()
            self._tun_fd = _open_tun(self.config.tun_name)
            _configure_tun(self.config.tun_name, self.identifier)
            self._selector.register(self._tun_fd, selectors.EVENT_READ, "tun")
            for ifname in self.config.interfaces:
                ring = PacketRing(
                    ifname,
                    protocol=ETH_P_IPV6,
                    program=ring_filter(self.config.nid, dns_port=self.resolver.source_port),
                    geometry=_RING_GEOMETRY,
                    vnet_hdr=True,
                )
                self._rings.append(ring)
                self._selector.register(ring.fileno(), selectors.EVENT_READ, ring)
            self.egress.open()
            self.links.open()
            self._save_state()
            self._selector.register(self.links.fileno(), selectors.EVENT_READ, "links")
            self.links.refresh()
            self.egress.set_links(self.links.states)
            self._selector.register(self.egress.fileno(), selectors.EVENT_READ, "neighbours")
            self.drop.install()
            self._open_fastpath()
            self._save_state()
        except BaseException:
            self.close()
            raise

    # What the daemon changed in the namespace, on disk (sixlab.ilnp.leftovers).

    def _undo_leftovers(self) -> None:
        for line in undo_leftovers(self._state):
            self.events["leftovers_undone"] += 1
            log.info("leftover of a killed daemon: %s", line)

    def _save_state(self) -> None:
        files = [self.config.control, *([self.config.names] if self.config.names else [])]
        leftovers = Leftovers(
            pid=os.getpid(),
            started=process_start(os.getpid()) or 0,
            netns=netns_cookie(),
            sysctls=self.links.changed_settings(),
            clsact=sorted(self._own_clsact),
            addresses=list(self._claimed),
            filters=list(self.config.interfaces),
            nft_table=self.drop.table if self.drop.installed else None,
            files=files,
        )
        save_leftovers(self._state, leftovers)
        self._state_saved = True

    def _open_fastpath(self) -> None:
        if self.config.fastpath not in ("auto", "on", "off"):
            raise ValueError(f"fastpath must be auto, on or off, not {self.config.fastpath!r}")
        self._note_clsact()
        if self.config.fastpath == "off":
            self._remove_fastpath_leftovers()
            return
        fastpath = FastPath(
            nid=self.config.nid,
            prefix=self.host.config.identifier_prefix,
            tun=self.config.tun_name,
            links=self.config.interfaces,
            on_active=self._on_active,
        )
        try:
            fastpath.open(self._usable_locators())
        except (LinuxError, OSError) as exc:
            if self.config.fastpath == "on":
                raise
            self.fastpath_error = str(exc).splitlines()[0]
            self.events["fastpath_unavailable"] += 1
            self._remove_fastpath_leftovers()
            return
        self.fastpath = fastpath
        self._selector.register(fastpath.fileno(), selectors.EVENT_READ, "fastpath")

    def _on_link_events(self) -> None:
        """Drain the notifications, then read the links again (what changed is moot)."""
        self.links.drain()
        now = self.clock()
        self._next_link_poll = now + _LINK_POLL_S
        self._poll_links(now)
        self._flush_dead_links()

    def _note_clsact(self) -> None:
        """Remember the links whose ``clsact`` qdisc is ours to remove at exit: those
        without one now, or whose only filter is a dead daemon's fast path (an empty
        one is someone else's, and stays)."""
        ours = {(TC_PRIORITY, TC_HANDLE)}
        for name in self.config.interfaces:
            try:
                filters = clsact_filters(name)
            except OSError:
                continue
            if filters is None or (filters and filters <= ours):
                self._own_clsact.add(name)

    def _remove_clsact(self) -> None:
        """Remove the ``clsact`` qdiscs noted at start that hold no filter now."""
        for name in sorted(self._own_clsact):
            try:
                if clsact_filters(name) == set():
                    tc_hook_destroy(socket.if_nametoindex(name))
            except (OSError, LinuxError):  # the link is gone, or no libbpf: nothing to do
                continue
        self._own_clsact.clear()

    def _remove_fastpath_leftovers(self) -> None:
        if removed := remove_leftovers(self.config.interfaces):
            self.events["fastpath_leftovers_removed"] += removed

    def close(self) -> None:
        """Undo everything :meth:`open` did; safe to call twice or after a failed open."""
        self.control.close()
        if self.fastpath is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self.fastpath.fileno())
            self.fastpath.close()
            self.fastpath = None
        self._remove_clsact()
        self.drop.remove()
        if self._claimed:
            release_addresses(self._claimed)
            self._claimed = []
        if self.config.names is not None:
            with contextlib.suppress(OSError):
                Path(self.config.names).unlink()
        for ring in self._rings:
            ring.close()
        self._rings.clear()
        if self.egress.opened:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self.egress.fileno())
        self.egress.close()
        if self.links.opened:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self.links.fileno())
        self.links.close()
        if self.autoconf is not None:
            self.autoconf.close()
        if self._tun_fd >= 0:
            os.close(self._tun_fd)  # the TUN device goes with its last descriptor
            self._tun_fd = -1
        self._selector.close()
        if self._state_saved:  # everything it names is undone
            Path(self._state).unlink(missing_ok=True)
            self._state_saved = False

    def stop(self, *_args: object) -> None:
        self._stop = True

    def run(self, ready: Callable[[], None] | None = None) -> None:
        """Serve until :meth:`stop` (SIGTERM/SIGINT in :func:`run_daemon`)."""
        if ready is not None:
            ready()
        while not self._stop:
            self.step()

    def step(self, max_wait: float = 0.2) -> None:
        now = self.clock()
        wait = min(max_wait, max(0.0, self._timer_check - now))
        wait = min(wait, max(0.0, self._next_link_poll - now))
        for key, mask in self._selector.select(wait):
            data = key.data
            if isinstance(data, PacketRing):
                self._on_ring(data)
            elif data == "tun":
                self._on_tun()
            elif data is self.control or isinstance(data, ControlClient):
                self.control.on_event(data, mask, self.clock())
            elif data == "fastpath":
                assert self.fastpath is not None
                self.fastpath.drain()
            elif data == "links":
                self._on_link_events()
            elif data == "neighbours":
                self.egress.on_events(self.clock())
        now = self.clock()
        self.control.expire(now)
        self.egress.expire(now)
        if now >= self._timer_check:
            self._run_timers(now)
        if now >= self._next_link_poll:
            self._next_link_poll = now + _LINK_POLL_S
            self._poll_links(now)
            self._flush_dead_links()
        self._sync_fastpath()

    # ------------------------------------------------------------------ fast path

    def _sync_fastpath(self, everything: bool = False) -> None:
        """Rewrite the kernel's copy of every entry the host changed (or of all)."""
        fastpath = self.fastpath
        if fastpath is None:
            return
        touched = self.host.take_touched()
        if everything:
            touched |= {entry.peer_nid for entry in self.host.ilcc} | fastpath.installed
        if self.egress.opened:
            changed = self.egress.take_changed()
            touched |= {nid for nid, hop in self._hop_of.items() if hop in changed}
        for nid in touched:
            entry = self.host.ilcc.get(nid)
            self._hop_of.pop(nid, None)
            record = (
                None
                if entry is None
                else peer_record(entry, self.host.config, self._ifindex_of, self._next_hop)
            )
            fastpath.update(nid, record)

    def _next_hop(self, locator: int, dst: int) -> int | None:
        """The next hop a kernel record may name for ``dst`` (whose low 64 bits are the
        peer's NID) from ``locator``: the link's, once its neighbour is usable. Until
        then None (no egress: the daemon's path sends, the kernel resolves); the record
        is rewritten when the neighbour changes (:mod:`sixlab.ilnp.egress`)."""
        hop = self.links.next_hop(locator, dst)
        ifindex = self.links.ifindex_for(locator)
        if hop is None or not ifindex or not self.egress.opened:
            return hop
        key = (ifindex, hop.to_bytes(16, "big"))
        self._hop_of[dst & _NID_MASK] = key
        return hop if self.egress.neighbour_usable(*key) else None

    def _ifindex_of(self, locator: int) -> int | None:
        """The interface a local locator lives on (its usable home first)."""
        return self.links.ifindex_for(locator)

    def _on_active(self, nid: int, heard: bool = False) -> None:
        self.host.mark_used(nid, self.clock(), heard=heard)

    def _usable_locators(self) -> list[int]:
        return [e.locator for e in self._configured if e.locator not in self._withdrawn]

    def _locators_changed(self) -> None:
        if self.fastpath is not None:
            self.fastpath.set_locators(self._usable_locators())

    def _run_timers(self, now: float) -> None:
        """Fire due host timers, then schedule the next look.

        ``IlnpHost.get_timer`` and ``handle_timer`` are cheap (a deadline heap: O(1) and
        O(k log n) for k due), yet run at most every
        :data:`_TIMER_GRANULARITY` seconds, not once per packet batch: the timers they
        serve (LU retransmission every second, lifetimes in seconds) need no more.
        """
        deadline = self.host.get_timer()
        if deadline is not None and deadline <= now:
            self.host.handle_timer(now)
            self._flush()
            deadline = self.host.get_timer()
        step = _TIMER_GRANULARITY if deadline is None else max(deadline - now, 0.0)
        self._timer_check = now + min(max(step, _TIMER_GRANULARITY), 0.2)

    # ------------------------------------------------------------------ data path

    def _is_ours(self, packet: bytes) -> bool:
        """IPv6 for our NID on some locator, not Neighbour Discovery."""
        if len(packet) < IPV6_HEADER_SIZE or packet[0] >> 4 != 6:
            return False
        if packet[32:40] != self._nid_bytes or packet[24:32] == self._prefix_bytes:
            return False
        if packet[6] == ICMPV6_NEXT_HEADER and len(packet) > IPV6_HEADER_SIZE:
            return packet[IPV6_HEADER_SIZE] not in _ND_TYPES
        return True

    def _on_ring(self, ring: PacketRing) -> None:
        perf = time.perf_counter_ns
        for frame in ring.frames(_READ_BATCH):
            start = perf()
            packet = frame.data
            if not self._is_ours(packet):
                continue
            self.wire["rx"] += 1
            if frame.snaplen < frame.length:  # not whole: nothing to deliver
                self.wire["rx_truncated"] += 1
                continue
            aggregate = frame.gso_type & ~VIRTIO_NET_HDR_GSO_ECN
            if aggregate:  # several segments the link's GRO (or LRO) coalesced
                if aggregate != VIRTIO_NET_HDR_GSO_TCPV6:
                    self.wire["rx_aggregate_not_tcp"] += 1  # UDP: datagrams run together
                    continue
                self.wire["rx_aggregate"] += 1
            if frame.status & TP_STATUS_CSUMNOTREADY:  # a sender's veth left it unfinished
                # GRO seeded an aggregate's sum over the wire's addresses: an ILNP
                # sender's (a nonce) is NID-only, a plain node's stays as it is.
                nid_only = bool(aggregate) and packet[6] == DSTOPTS_NEXT_HEADER
                packet = finish_partial_checksum(packet, nid_only=nid_only) or packet
                self.wire["rx_checksum_finished"] += 1
            if packet[6] == DSTOPTS_NEXT_HEADER:
                self.wire["rx_nonce"] += 1
            self.host.receive(packet, self.clock())
            self._flush()
            self.latency_ns.append(perf() - start)

    def _on_tun(self) -> None:
        for _ in range(_READ_BATCH):
            try:
                packet = os.read(self._tun_fd, 65535)
            except BlockingIOError:
                return
            except OSError:  # the packet is lost; the device is still there
                self.wire["tun_read_error"] += 1
                return
            if len(packet) < IPV6_HEADER_SIZE or packet[24] == 0xFF:
                continue  # multicast (MLD and the like): nothing ILNP can carry
            now = self.clock()
            nid = int.from_bytes(packet[32:40], "big")
            if packet[24:32] == self._prefix_bytes and not self.host.can_reach(nid, now):
                found = self.resolver.by_nid(nid) or self._named_nid(nid)
                if found is not None:
                    self.host.add_correspondent(nid, found.locators, now)
                    self.events["resolved"] += 1
            self.host.send(packet, now)
            self._flush()

    def _flush(self) -> None:
        """Transmit what the host produced and act on its events."""
        # The kernel's copies first, at once: before anything the host produced can
        # make a peer or an application react (the next packet must meet the new
        # state), and without waiting for ``step``, which a flood may keep away.
        self._sync_fastpath()
        egress, link_for, now = self.egress, self.links.link_for, self.clock()
        for datagram in self.host.datagrams_to_send():
            # out of the link that holds the source locator (:mod:`sixlab.ilnp.egress`)
            if egress.send(datagram, link_for(int.from_bytes(datagram[8:16], "big")), now):
                self.wire["tx"] += 1
            else:
                self.wire["tx_error"] += 1
        while (event := self.host.next_event()) is not None:
            self.events[type(event).__name__] += 1
            if isinstance(event, Deliver):
                try:
                    os.write(self._tun_fd, event.packet)
                except OSError:
                    self.wire["tun_error"] += 1

    # ------------------------------------------------------------------ locators

    def set_locators(self, locators: tuple[LocatorEntry, ...]) -> None:
        """A move or a new uplink: configured set replaced, Locator Updates sent."""
        if self.autoconf is not None:
            raise ConfigError("locators: learned from Router Advertisements, not set by hand")
        check_held(check_locator_set(locators), self.read_links())  # L64s links hold
        self.host.set_local_locators(locators, self.clock())  # checks them first
        self._configured = locators
        self._withdrawn.clear()
        self._locators_changed()
        self._flush()

    def _poll_links(self, now: float) -> None:
        """Withdraw locators whose links are unusable; restore them when one is back.

        :mod:`sixlab.ilnp.links` says which locator lives where and which links are
        up with carrier. A link made again gets new capture sockets. Locators learned
        from Router Advertisements are read first (:mod:`sixlab.ilnp.autoconf`).
        """
        learned = None if self.autoconf is None else self.autoconf.poll(now)
        if learned is not None:
            self._configured = learned
            self.events["locators_learned"] += 1
        servers = [] if self.autoconf is None else self.autoconf.dns_servers()
        if self._name_errors and servers and servers != self._dns_asked:
            self._resolve_names()  # new DNS servers (a later RA): ask them once
            self._write_names()
        hops = {name: state.hops for name, state in self.links.states.items()}
        new_home = self.links.refresh()
        if self._reclaim():
            new_home |= self.links.refresh()
        new_home |= hops != {name: state.hops for name, state in self.links.states.items()}
        self.egress.set_links(self.links.states)
        for ring in self._rings:
            now_index = self.links.states[str(ring.ifname)].ifindex
            if now_index and now_index != ring.ifindex:  # the interface was made again
                self._reopen_ring(ring)
        if self._reattach_fastpath() or new_home:
            self._sync_fastpath(everything=True)  # egress interfaces or next hops changed
        down = self.links.down(e.locator for e in self._configured)
        if down == self._withdrawn and learned is None:
            return
        usable = tuple(e for e in self._configured if e.locator not in down)
        if not usable:
            return  # nothing left to advertise: keep the old set, the peer keeps trying
        self._withdrawn = down
        self.events["links_changed"] += 1
        self.host.set_local_locators(usable, now)
        self._locators_changed()
        self._flush()

    def _reclaim(self) -> bool:
        """Add again the claimed addresses of links back up from an administrative
        down, which flushed them (:mod:`sixlab.ilnp.links`); whether any was. A link
        is retried at the next poll when adding fails."""
        from pyroute2.netlink.exceptions import NetlinkError  # noqa: PLC0415

        states = self.links.states
        # One down again meanwhile comes back through take_returned when it is up.
        self._reclaim_on = {n for n in self._reclaim_on if states[n].admin_up}
        self._reclaim_on |= self.links.take_returned()
        if not self._reclaim_on:
            return False
        lost = [
            (name, address)
            for name, address in self._claimed
            if name in self._reclaim_on
            and int(ipaddress.IPv6Address(address)) >> 64 not in states[name].prefixes
        ]
        try:
            add_addresses(lost)
        except (OSError, IndexError, NetlinkError):  # gone again, or raced: next poll
            self.events["address_reclaim_errors"] += 1
            return False
        self._reclaim_on.clear()
        self.events["addresses_reclaimed"] += len(lost)
        return bool(lost)

    def _flush_dead_links(self) -> None:
        """Free what the fast path sent into links that are not usable (egress module
        doc): once the records say where to send, nothing new goes there."""
        if self.fastpath is None:
            return
        self._sync_fastpath()
        for state in self.links.states.values():
            if state.ifindex and not state.usable:
                try:
                    self.events["neighbours_flushed"] += flush_unresolved(state.ifindex)
                except OSError:
                    self.events["neighbour_flush_errors"] += 1

    def _reattach_fastpath(self) -> bool:
        """Put the ingress program on each link made again since it was attached (a
        new interface index); whether any was. Its clsact qdisc is then ours."""
        from pyroute2.netlink.exceptions import NetlinkError  # noqa: PLC0415

        if self.fastpath is None:
            return False
        done = False
        for name, state in self.links.states.items():
            if not state.ifindex or self.fastpath.attached_to(name) == state.ifindex:
                continue
            try:
                fresh = clsact_filters(name) is None
                self.fastpath.attach_link(name, state.ifindex)
            except (LinuxError, OSError, NetlinkError):  # gone again: the next refresh retries
                self.events["fastpath_reattach_errors"] += 1
                continue
            self.events["fastpath_reattached"] += 1
            if fresh:
                self._own_clsact.add(name)
                self._save_state()
            done = True
        return done

    def _reopen_ring(self, ring: PacketRing) -> None:
        self._selector.unregister(ring.fileno())
        try:
            ring.reopen()
        except OSError:  # gone again: the old socket stays, the next refresh retries
            self.events["ring_reopen_errors"] += 1
        else:
            self.events["rings_reopened"] += 1
        self._selector.register(ring.fileno(), selectors.EVENT_READ, ring)

    # ------------------------------------------------------------------ control

    def handle_request(self, line: bytes) -> dict[str, Any]:
        """One JSON request to its JSON reply (never raises).

        A request that is not a JSON object with a known ``cmd`` and well-typed fields
        gets ``{"ok": false, "error": ...}`` naming what is wrong, and changes nothing.
        """
        try:
            request = json.loads(line)
        except (ValueError, RecursionError) as exc:  # RecursionError: [[[[... nesting
            return _error(f"not JSON: {exc}")
        if not isinstance(request, dict):
            return _error('a request is a JSON object: {"cmd": ...}')
        command = request.get("cmd")
        handler = self._commands.get(command) if isinstance(command, str) else None
        if handler is None:
            known = ", ".join(self._commands)
            return _error(f"unknown command {command!r} (known: {known})")
        try:
            return handler(request)
        except (ConfigError, ResolveError, WireError) as exc:
            return _error(str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug in one command must not stop the daemon
            return _error(f"internal error: {type(exc).__name__}: {exc}")

    def _cmd_cache(self, _request: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "entries": [_entry_json(e) for e in self.host.ilcc]}

    def _cmd_set_locators(self, request: dict[str, Any]) -> dict[str, Any]:
        specs = request.get("locators")
        if not isinstance(specs, list) or not all(isinstance(s, str) for s in specs):
            raise ConfigError('locators: want a list of "L64[,PREF[,LIFETIME]]" strings')
        self.set_locators(tuple(parse_locator_spec(s) for s in specs))
        return self.status()

    def _cmd_add_peer(self, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError("name: want a host name (a non-empty string)")
        found = self.resolver.by_name(name)
        self.host.add_correspondent(found.nid, found.locators, self.clock())
        self._named[found.name] = found
        self._name_errors.pop(name, None)
        self._write_names()
        return {"ok": True, "nid": format_locator(found.nid)}

    def _resolve_names(self) -> None:
        """Resolve ``--name`` names (blocking, before the loop runs); a name that does
        not resolve is reported in ``status``, not fatal (the DNS may come later:
        ``add-peer`` asks again)."""
        self._dns_asked = self.resolver.learned_servers()
        for name in self.config.resolve_names:
            if name in self._named:
                continue
            try:
                found = self.resolver.by_name(name)
            except ResolveError as exc:
                self._name_errors[name] = str(exc)
                continue
            self._named[found.name] = found
            self._name_errors.pop(name, None)

    def _named_nid(self, nid: int) -> Resolution | None:
        """A name resolved through DNS (``--name``, ``add-peer``) with this NID."""
        return next((r for r in self._named.values() if r.nid == nid), None)

    def _write_names(self) -> None:
        if self.config.names is not None:
            entries = [*self.resolver.hosts.entries(), *self._named.values()]
            write_names(self.config.names, render_names(entries))

    def status(self) -> dict[str, Any]:
        counters = self.host.counters
        reasons = {r.value for r in DropReason}
        samples = sorted(self.latency_ns)

        def pct(q: float) -> float | None:
            if not samples:
                return None
            return samples[min(len(samples) - 1, int(q * len(samples)))] / 1000.0

        return {
            "ok": True,
            "nid": format_locator(self.config.nid),
            "identifier_address": str(self.identifier),
            "locators": [
                {
                    "locator": format_locator(e.locator),
                    "preference": e.preference,
                    "lifetime": e.lifetime,
                    "in_use": e.locator == self.host.local_locator,
                }
                for e in self._configured
                if e.locator not in self._withdrawn
            ],
            "withdrawn": [format_locator(x) for x in sorted(self._withdrawn)],
            "router_advertisements": None if self.autoconf is None else self.autoconf.json(),
            "names": {"resolved": sorted(self._named), "errors": dict(self._name_errors)},
            "interfaces": list(self.config.interfaces),
            "links": self.links.json(),
            "egress": self.egress.json(),
            "policy": self.host.policy.name,
            "store": self.host.ilcc.name,
            "ilcc_size": len(self.host.ilcc),
            "reply_table_size": self.host.reply_table_size,
            "counters": {k: v for k, v in counters.items() if k not in reasons},
            "drops": {k: v for k, v in counters.items() if k in reasons} | self._io_drops(),
            "events": dict(self.events + self.links.counters),
            "wire": dict(self.wire),
            "rings": {str(r.ifname): _ring_json(r) for r in self._rings},
            "socket_table": None
            if self.socket_table is None
            else {"source": self.socket_table.source, "dumps": self.socket_table.dumps},
            "latency_us": {"p50": pct(0.5), "p99": pct(0.99), "samples": len(samples)},
            "control": dict(self.control.counters),
            "fastpath": self._fastpath_status(),
        }

    def _io_drops(self) -> dict[str, int]:
        """Every packet the daemon's I/O lost, by cause (zeros left out).

        ``ring_overflow``: the receive rings were full (the kernel's count);
        ``tun_queue_overflow``: applications' packets the TUN device dropped because
        its queue was full (not read in time); ``tun_rx_dropped``: packets written to
        the TUN device that the kernel dropped; ``tun_read_error``/``tun_write_error``;
        ``ring_truncated``: frames the ring kept only part of; ``ring_aggregate_not_tcp``:
        UDP (or IPv4) aggregates the link's GRO made, which the daemon cannot take
        apart again;
        ``tx_error_<errno>``: sends that failed (:mod:`sixlab.ilnp.egress`);
        ``fastpath_rx_error``/``fastpath_tx_error``: packets the kernel programs
        dropped half-way through a rewrite.
        """
        drops = {"ring_overflow": sum(r.statistics()[1] for r in self._rings)}
        device = device_drops(self.config.tun_name)
        drops["tun_queue_overflow"] = device.get("tx_dropped", 0)
        drops["tun_rx_dropped"] = device.get("rx_dropped", 0)
        drops["tun_read_error"] = self.wire["tun_read_error"]
        drops["tun_write_error"] = self.wire["tun_error"]
        drops["ring_truncated"] = self.wire["rx_truncated"]
        drops["ring_aggregate_not_tcp"] = self.wire["rx_aggregate_not_tcp"]
        drops |= self.egress.drops()
        if self.fastpath is not None:
            fast = self.fastpath.counters()
            drops["fastpath_rx_error"] = fast.get("rx_error", 0)
            drops["fastpath_tx_error"] = fast.get("tx_error", 0)
        return {k: v for k, v in drops.items() if v}

    def _fastpath_status(self) -> dict[str, Any]:
        fastpath = self.fastpath
        return {
            "mode": self.config.fastpath,
            "enabled": fastpath is not None,
            "error": self.fastpath_error,
            "entries": 0 if fastpath is None else len(fastpath.installed),
            "counters": {} if fastpath is None else fastpath.counters(),
            "sync": {} if fastpath is None else dict(fastpath.stats),
            "programs": {} if fastpath is None else fastpath.program_stats(),
        }


def _error(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message}


def _ring_json(ring: PacketRing) -> dict[str, Any]:
    packets, drops = ring.statistics()
    return {
        "packets": packets,
        "drops": drops,
        "errors": dict(ring.errors),
        "reopened": ring.reopened,
    }


def _entry_json(entry: IlccEntry) -> dict[str, Any]:
    return {
        "peer_nid": format_locator(entry.peer_nid),
        "state": entry.state.value,
        "local_locator": format_locator(entry.local_locator),
        "local_nonce": entry.local_nonce.value.hex(),
        "peer_nonce": None if entry.peer_nonce is None else entry.peer_nonce.value.hex(),
        "locators": [
            {
                "locator": format_locator(p.locator),
                "preference": p.preference,
                "lifetime": p.lifetime,
                "state": p.state.value,
            }
            for p in entry.locators
        ],
        "created": entry.created,
        "last_used": entry.last_used,
    }


# --------------------------------------------------------------------- entry points


def run_daemon(config: DaemonConfig, *, announce: Callable[[str], None] = print) -> int:
    """Run until SIGTERM or SIGINT, cleaning up TUN, nft table and control socket.

    Every failure is an :class:`~sixlab.ilnp.IlnpError`: what the system refuses (root
    for the TUN device, nftables, a socket...) comes as :class:`DaemonError` with the
    original error as its cause.
    """
    try:
        return _run_daemon(config, announce)
    except (LinuxError, OSError, subprocess.SubprocessError) as exc:
        raise DaemonError(str(exc)) from exc


def _check_interfaces(names: tuple[str, ...]) -> None:
    """:class:`ConfigError` naming the first of ``names`` that is no interface."""
    for name in names:
        try:
            socket.if_nametoindex(name)
        except (OSError, ValueError):  # ValueError: a NUL in the name
            raise ConfigError(f"interface {name!r}: no such interface") from None


def _run_daemon(config: DaemonConfig, announce: Callable[[str], None]) -> int:
    autoconf = None
    if not config.locators:  # learned from Router Advertisements (sixlab.ilnp.autoconf)
        _check_interfaces(config.interfaces)
        autoconf = RouterAdvertisements(config.nid, config.interfaces)
        autoconf.open()
        try:
            autoconf.wait(config.ra_wait)
        except BaseException:
            autoconf.close()
            raise
        config = replace(config, locators=autoconf.take(time.monotonic()))
    try:
        daemon = IlnpDaemon(config, autoconf=autoconf)
    except BaseException:
        if autoconf is not None:
            autoconf.close()
        raise
    with StopOnSignal(daemon.stop):  # the daemon's loop ends on its own flag
        try:
            daemon.open()
            daemon.run(
                lambda: announce(
                    f"ready nid={format_locator(config.nid)} address={daemon.identifier} "
                    f"control={config.control}"
                )
            )
        finally:
            daemon.close()
    return 0


def parse_nid(text: str) -> int:
    """A NID as ``::a``, four hex groups (``0:0:0:a``) or one integer (``0xa``, ``10``)."""
    try:
        return config_parse_nid(text)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
