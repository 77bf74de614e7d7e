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
  Destination Option and gives back a wire packet; a raw ``IPPROTO_RAW`` socket (the
  header is ours, RFC 3542 §3) sends it. A peer without an ILCC entry is resolved by
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
  §6.3): neither direction touches it.
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
  when that interface goes down its locator is withdrawn (Locator Updates go out), and
  it comes back when the link does: multihoming failover. A netlink socket subscribed
  to link and IPv6 address changes wakes the loop the moment one happens (the message
  itself is not parsed: the links are read again); a slow poll covers missed events.

One thread, one ``selectors`` loop, time from ``time.monotonic`` passed in as ``now``.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import mmap
import os
import secrets
import selectors
import socket
import struct
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sixlab.ilnp._control import ControlClient, ControlServer, control_request
from sixlab.ilnp._errors import ConfigError
from sixlab.ilnp.fastpath import FastPath, peer_record, remove_leftovers
from sixlab.ilnp.host import Deliver, DropReason, HostConfig, IlnpHost
from sixlab.ilnp.ilcc import IlccEntry
from sixlab.ilnp.policy import AdmissionPolicy, create_policy
from sixlab.ilnp.resolve import ResolveError, Resolver, parse_locator_spec
from sixlab.ilnp.socktable import KernelSocketTable
from sixlab.linux.cbpf import (
    ACCEPT_SNAPLEN,
    BPF_ABS,
    BPF_JEQ,
    BPF_JMP,
    BPF_K,
    BPF_LD,
    BPF_RET,
    BPF_W,
    Assembler,
    BpfInstruction,
    attach_filter,
)
from sixlab.linux.errors import LinuxError
from sixlab.linux.nftdrop import KernelDrop
from sixlab.linux.signals import StopOnSignal
from sixlab.wire._errors import WireError
from sixlab.wire.ilnp import (
    DSTOPTS_NEXT_HEADER,
    ICMPV6_NEXT_HEADER,
    IDENTIFIER_PREFIX,
    ILV,
    IPV6_HEADER_SIZE,
    LocatorEntry,
    identifier_address,
)

__all__ = [
    "DEFAULT_CONTROL",
    "DaemonConfig",
    "IlnpDaemon",
    "PacketRing",
    "control_request",
    "format_locator",
    "kernel_drop",
    "parse_nid",
    "run_daemon",
]

#: Default control socket (tests and several daemons per machine pass their own).
DEFAULT_CONTROL = "/run/sixlab-ilnp.sock"

# <linux/if_tun.h>
_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000
# <linux/if_packet.h>
_SOL_PACKET = 263
_PACKET_RX_RING = 5
_PACKET_VERSION = 10
_PACKET_IGNORE_OUTGOING = 23
_PACKET_STATISTICS = 6
_TPACKET_STATS_V3 = struct.Struct("III")  # tp_packets, tp_drops, tp_freeze_q_cnt
_TPACKET_V3 = 2
_TP_STATUS_KERNEL = 0
_TP_STATUS_USER = 1
_ETH_P_IPV6 = 0x86DD
_TPACKET_REQ3 = struct.Struct("7I")
# struct tpacket_block_desc: version, offset_to_priv, then tpacket_hdr_v1:
# block_status, num_pkts, offset_to_first_pkt (the fields we need).
_BLOCK_DESC = struct.Struct("IIIII")
# struct tpacket3_hdr: tp_next_offset, tp_sec, tp_nsec, tp_snaplen, tp_len, tp_status,
# tp_mac, tp_net.
_TPACKET3_HDR = struct.Struct("IIIIIIHH")
#: Ring geometry: 256 blocks of 32 KiB (8 MiB) and a 1 ms block retire timeout: a block
#: is handed over when full or after 1 ms, which bounds the latency the ring adds. At
#: low rates every block retires nearly empty, so the block *count* is what buys time:
#: 256 blocks let the daemon stall for at least a quarter of a second without a drop.
_RING_BLOCK_SIZE = 1 << 15
_RING_BLOCKS = 256
_RING_FRAME_SIZE = 2048
_RING_RETIRE_MS = 1
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
# <linux/rtnetlink.h> multicast groups: link state, IPv6 addresses.
_RTMGRP_LINK = 0x1
_RTMGRP_IPV6_IFADDR = 0x100
_LATENCY_SAMPLES = 20000
#: Host timers are looked at no more often than this (see ``IlnpDaemon._run_timers``).
_TIMER_GRANULARITY = 0.01
_READ_BATCH = 64


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
    control: str = DEFAULT_CONTROL
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


# --------------------------------------------------------------------- kernel drop


def kernel_drop(nid: int, interfaces: tuple[str, ...]) -> KernelDrop:
    """The nftables table that stops the kernel from handling our ILNP packets.

    The input hook runs after AF_PACKET taps, so the ring still sees what is dropped
    here. Matching the destination's NID (not its locator) keeps the rule valid across
    moves; Neighbour Discovery is let through so the link keeps resolving our address.
    The table is named after the NID: a dead run's leftover is replaced, a live
    daemon's with the same NID refused (see :mod:`sixlab.linux.nftdrop`).
    """
    ifaces = ", ".join(f'"{i}"' for i in interfaces)
    match = (
        f"iifname {{ {ifaces} }} ip6 daddr & ::ffff:ffff:ffff:ffff == {ipaddress.IPv6Address(nid)}"
    )
    nd = "nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert"
    return KernelDrop(
        f"sixlab_ilnp_{nid:016x}",
        [f"{match} icmpv6 type {{ {nd}, nd-redirect }} accept", f"{match} counter drop"],
        priority="-300",
        purpose=f"another ILNP daemon with NID {nid:016x} runs in this namespace",
    )


# --------------------------------------------------------------------- ring


def ring_filter(nid: int, prefix: int = IDENTIFIER_PREFIX) -> tuple[BpfInstruction, ...]:
    """Classic BPF for the ring: Ethernet frames whose IPv6 destination ends in our NID
    and does not start with the identifier prefix (:meth:`IlnpDaemon._is_ours` in the
    kernel, bar Neighbour Discovery). The rest of the link's traffic never reaches user
    space; a fast-path packet never reaches the ring at all (redirected at tc ingress,
    before the ring's tap)."""
    dst = 14 + 24  # Ethernet header + offset of the IPv6 Destination Address
    asm = Assembler()
    for offset, word in ((dst + 8, nid >> 32), (dst + 12, nid & 0xFFFFFFFF)):
        asm.emit(BPF_LD | BPF_W | BPF_ABS, offset)
        asm.emit(BPF_JMP | BPF_JEQ | BPF_K, word, jt=0, jf="drop")
    asm.emit(BPF_LD | BPF_W | BPF_ABS, dst)
    asm.emit(BPF_JMP | BPF_JEQ | BPF_K, prefix >> 32, jt=0, jf="accept")
    asm.emit(BPF_LD | BPF_W | BPF_ABS, dst + 4)
    asm.emit(BPF_JMP | BPF_JEQ | BPF_K, prefix & 0xFFFFFFFF, jt="drop", jf="accept")
    asm.label("drop")
    asm.emit(BPF_RET | BPF_K, 0)
    asm.label("accept")
    asm.emit(BPF_RET | BPF_K, ACCEPT_SNAPLEN)
    return asm.finish()


class PacketRing:
    """A TPACKET_V3 receive ring on one interface, IPv6 frames only, ours excluded."""

    def __init__(self, ifname: str, nid: int) -> None:
        self.ifname = ifname
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_IPV6))
        try:
            attach_filter(self.sock, ring_filter(nid))
            self.sock.setsockopt(_SOL_PACKET, _PACKET_VERSION, _TPACKET_V3)
            with contextlib.suppress(OSError):  # Linux >= 4.20; else outgoing are skipped by dst
                self.sock.setsockopt(_SOL_PACKET, _PACKET_IGNORE_OUTGOING, 1)
            req = _TPACKET_REQ3.pack(
                _RING_BLOCK_SIZE,
                _RING_BLOCKS,
                _RING_FRAME_SIZE,
                _RING_BLOCK_SIZE * _RING_BLOCKS // _RING_FRAME_SIZE,
                _RING_RETIRE_MS,
                0,
                0,
            )
            self.sock.setsockopt(_SOL_PACKET, _PACKET_RX_RING, req)
            self.map = mmap.mmap(
                self.sock.fileno(),
                _RING_BLOCK_SIZE * _RING_BLOCKS,
                mmap.MAP_SHARED,
                mmap.PROT_READ | mmap.PROT_WRITE,
            )
            self.sock.bind((ifname, _ETH_P_IPV6))
        except BaseException:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self._block = 0
        self.seen = 0
        self.drops = 0

    def statistics(self) -> tuple[int, int]:
        """Packets the kernel offered to the ring and dropped (ring full), cumulated."""
        raw = self.sock.getsockopt(_SOL_PACKET, _PACKET_STATISTICS, _TPACKET_STATS_V3.size)
        packets, drops, _freezes = _TPACKET_STATS_V3.unpack(raw)  # reading resets them
        self.seen += packets
        self.drops += drops
        return self.seen, self.drops

    def fileno(self) -> int:
        return self.sock.fileno()

    def packets(self, limit: int = _READ_BATCH) -> Iterator[bytes]:
        """The IPv6 packets of every block the kernel has handed over (up to ``limit``)."""
        view = self.map
        count = 0
        while count < limit:
            base = self._block * _RING_BLOCK_SIZE
            _ver, _priv, status, num, first = _BLOCK_DESC.unpack_from(view, base)
            if not status & _TP_STATUS_USER:
                return
            offset = base + first
            for _ in range(num):
                nxt, _s, _ns, snaplen, _len, _st, mac, net = _TPACKET3_HDR.unpack_from(view, offset)
                yield view[offset + net : offset + mac + snaplen]
                count += 1
                offset += nxt
            struct.pack_into("I", view, base + 8, _TP_STATUS_KERNEL)
            self._block = (self._block + 1) % _RING_BLOCKS

    def close(self) -> None:
        with contextlib.suppress(BufferError):
            self.map.close()
        self.sock.close()


# --------------------------------------------------------------------- TUN and links


def _open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    except BaseException:
        os.close(fd)
        raise
    return fd


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


def _link_states(names: tuple[str, ...]) -> dict[str, tuple[bool, set[int]]]:
    """For each interface: is it up (carrier included), and the /64 prefixes on it."""
    from pyroute2 import IPRoute  # noqa: PLC0415 - netlink only in the daemon

    out: dict[str, tuple[bool, set[int]]] = {}
    with IPRoute() as ipr:
        for name in names:
            found = ipr.link_lookup(ifname=name)
            if not found:
                out[name] = (False, set())
                continue
            link = ipr.get_links(found[0])[0]
            up = link.get("operstate") in ("UP", "UNKNOWN") and bool(link.get("carrier", 1))
            prefixes = {
                int(ipaddress.IPv6Address(a.get("IFA_ADDRESS"))) >> 64
                for a in ipr.get_addr(family=socket.AF_INET6, index=found[0])
            }
            out[name] = (up, prefixes)
    return out


# --------------------------------------------------------------------- the daemon


class IlnpDaemon:
    """TUN + ring + raw socket + control socket around one :class:`IlnpHost`."""

    def __init__(
        self,
        config: DaemonConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        policy: AdmissionPolicy | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
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
        self.identifier = identifier_address(config.nid)
        self.events: Counter[str] = Counter()
        self.latency_ns: deque[int] = deque(maxlen=_LATENCY_SAMPLES)
        self.wire: Counter[str] = Counter()
        self.drop = kernel_drop(config.nid, config.interfaces)
        self._configured = config.locators
        self._withdrawn: set[int] = set()
        self._homes: dict[int, set[str]] = {}
        self._nid_bytes = config.nid.to_bytes(8, "big")
        self._prefix_bytes = IDENTIFIER_PREFIX.to_bytes(8, "big")
        self._selector = selectors.DefaultSelector()
        self._rings: list[PacketRing] = []
        self._tun_fd = -1
        self._raw: socket.socket | None = None
        self.control = ControlServer(config.control, self.handle_request, self._selector)
        #: Control commands: each takes the request object and returns the reply.
        self._commands: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "status": lambda _request: self.status(),
            "cache": self._cmd_cache,
            "set-locators": self._cmd_set_locators,
            "add-peer": self._cmd_add_peer,
        }
        self._link_events: socket.socket | None = None
        self._stop = False
        self.fastpath: FastPath | None = None
        self.fastpath_error: str | None = None
        self._ifindex: dict[str, int] = {}
        self._next_link_poll = 0.0
        self._timer_check = 0.0

    def _make_policy(self, config: DaemonConfig) -> AdmissionPolicy:
        options = dict(config.policy_options)
        if config.policy == "socket":
            self.socket_table = KernelSocketTable()
            options.setdefault("sockets", self.socket_table)
        elif config.policy == "bounded":
            options.setdefault("capacity", config.bounded_capacity)
            options.setdefault("idle_timeout", config.bounded_idle)
        return create_policy(config.policy, **options)

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Create TUN, rings, raw socket, kernel drop and control socket."""
        for name in self.config.interfaces:  # before anything is made: nothing to undo
            try:
                socket.if_nametoindex(name)
            except (OSError, ValueError):  # ValueError: a NUL in the name
                raise ConfigError(f"interface {name!r}: no such interface") from None
        try:
            self._tun_fd = _open_tun(self.config.tun_name)
            _configure_tun(self.config.tun_name, self.identifier)
            self._selector.register(self._tun_fd, selectors.EVENT_READ, "tun")
            for ifname in self.config.interfaces:
                ring = PacketRing(ifname, self.config.nid)
                self._rings.append(ring)
                self._selector.register(ring.fileno(), selectors.EVENT_READ, ring)
            self._raw = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
            self._raw.setblocking(False)
            self._open_link_events()
            self.drop.install()
            self._open_fastpath()
            self.control.open()
        except BaseException:
            self.close()
            raise

    def _open_fastpath(self) -> None:
        if self.config.fastpath not in ("auto", "on", "off"):
            raise ValueError(f"fastpath must be auto, on or off, not {self.config.fastpath!r}")
        if self.config.fastpath == "off":
            self._remove_fastpath_leftovers()
            return
        self._ifindex = {name: socket.if_nametoindex(name) for name in self.config.interfaces}
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

    def _open_link_events(self) -> None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        sock.bind((0, _RTMGRP_LINK | _RTMGRP_IPV6_IFADDR))
        sock.setblocking(False)
        self._link_events = sock
        self._selector.register(sock, selectors.EVENT_READ, "links")

    def _on_link_events(self) -> None:
        """Drain the notifications, then read the links again (what changed is moot)."""
        assert self._link_events is not None
        while True:
            try:
                if not self._link_events.recv(65536):
                    break
                self.events["link_events"] += 1
            except BlockingIOError:
                break
            except OSError:  # ENOBUFS: events were lost; the re-read below covers them
                self.events["link_events_lost"] += 1
        now = self.clock()
        self._next_link_poll = now + _LINK_POLL_S
        self._poll_links(now)

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
        self.drop.remove()
        for ring in self._rings:
            ring.close()
        self._rings.clear()
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        if self._link_events is not None:
            self._link_events.close()
            self._link_events = None
        if self._tun_fd >= 0:
            os.close(self._tun_fd)  # the TUN device goes with its last descriptor
            self._tun_fd = -1
        self._selector.close()

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
        now = self.clock()
        self.control.expire(now)
        if now >= self._timer_check:
            self._run_timers(now)
        if now >= self._next_link_poll:
            self._next_link_poll = now + _LINK_POLL_S
            self._poll_links(now)
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
        for nid in touched:
            entry = self.host.ilcc.get(nid)
            record = (
                None if entry is None else peer_record(entry, self.host.config, self._ifindex_of)
            )
            fastpath.update(nid, record)

    def _ifindex_of(self, locator: int) -> int | None:
        """The interface a local locator lives on (first by name), as far as seen."""
        for name in sorted(self._homes.get(locator, ())):
            if name in self._ifindex:
                return self._ifindex[name]
        return None

    def _on_active(self, nid: int) -> None:
        self.host.mark_used(nid, self.clock())

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
        for packet in ring.packets():
            start = perf()
            if not self._is_ours(packet):
                continue
            self.wire["rx"] += 1
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
            if len(packet) < IPV6_HEADER_SIZE or packet[24] == 0xFF:
                continue  # multicast (MLD and the like): nothing ILNP can carry
            now = self.clock()
            nid = int.from_bytes(packet[32:40], "big")
            if packet[24:32] == self._prefix_bytes and not self.host.can_reach(nid, now):
                found = self.resolver.by_nid(nid)
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
        raw = self._raw
        for datagram in self.host.datagrams_to_send():
            dst = str(ipaddress.IPv6Address(datagram[24:40]))
            if raw is not None:
                try:
                    raw.sendto(datagram, (dst, 0))
                    self.wire["tx"] += 1
                except OSError:
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
        self.host.set_local_locators(locators, self.clock())  # checks them first
        self._configured = locators
        self._withdrawn.clear()
        self._locators_changed()
        self._flush()

    def _poll_links(self, now: float) -> None:
        """Withdraw locators whose interface went down; restore them when it is back.

        A locator's home is every interface it was ever seen on: IPv6 drops a link's
        addresses when it goes down (``keep_addr_on_down=0``), so the home is
        remembered, and a locator is down when none of its homes is up and holds it.
        """
        try:
            states = _link_states(self.config.interfaces)
        except OSError:
            return
        known = sum(len(h) for h in self._homes.values())
        for name, (_up, prefixes) in states.items():
            for prefix in prefixes:
                self._homes.setdefault(prefix, set()).add(name)
        if sum(len(h) for h in self._homes.values()) != known:
            self._sync_fastpath(everything=True)  # egress interfaces may be known now
        down: set[int] = set()
        for entry in self._configured:
            homes = self._homes.get(entry.locator)
            if homes and not any(
                states[h][0] and entry.locator in states[h][1] for h in homes if h in states
            ):
                down.add(entry.locator)
        if down == self._withdrawn:
            return
        usable = tuple(e for e in self._configured if e.locator not in down)
        if not usable:
            return  # nothing left to advertise: keep the old set, the peer keeps trying
        self._withdrawn = down
        self.events["links_changed"] += 1
        self.host.set_local_locators(usable, now)
        self._locators_changed()
        self._flush()

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
        return {"ok": True, "nid": format_locator(found.nid)}

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
            "interfaces": list(self.config.interfaces),
            "policy": self.host.policy.name,
            "store": self.host.ilcc.name,
            "ilcc_size": len(self.host.ilcc),
            "reply_table_size": self.host.reply_table_size,
            "counters": {k: v for k, v in counters.items() if k not in reasons},
            "drops": {k: v for k, v in counters.items() if k in reasons},
            "events": dict(self.events),
            "wire": dict(self.wire),
            "rings": {
                r.ifname: dict(zip(("packets", "drops"), r.statistics(), strict=True))
                for r in self._rings
            },
            "socket_table": None
            if self.socket_table is None
            else {"source": self.socket_table.source, "dumps": self.socket_table.dumps},
            "latency_us": {"p50": pct(0.5), "p99": pct(0.99), "samples": len(samples)},
            "control": dict(self.control.counters),
            "fastpath": self._fastpath_status(),
        }

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
    """Run until SIGTERM or SIGINT, cleaning up TUN, nft table and control socket."""
    daemon = IlnpDaemon(config)
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
    """A NID as four hex groups (``0:0:0:a``) or one integer (``0xa``, ``10``)."""
    if ":" in text:
        return ILV.parse(f"0:0:0:0/{text}").nid
    value = int(text, 0)
    if not 0 <= value <= _U64:
        raise ValueError(f"NID {text} does not fit in 64 bits")
    return value
