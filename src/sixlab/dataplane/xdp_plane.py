"""The ``xdp`` data plane: the STAMP reflector and collector in the kernel's XDP fast path.

Theory of operation
-------------------
Two BPF programs (C in ``sixlab/linux/bpf/``, compiled at first use by
``sixlab.linux.bpfbuild``, loaded with the ctypes layer ``sixlab.linux.libbpf``)
and one user-space path share the plane's UDP port:

* **Reflector** (``stamp_reflector``, attached by the first ``set_reflector_session``):
  answers unauthenticated Session-Sender packets of the sessions written into its
  session map (return SID list, stateless/stateful, NTP/PTP, Error Estimate) with
  XDP_TX, T2 and T3 read with ``bpf_ktime_get_tai_ns()``. Its replies are byte for byte
  what the Python core (``sixlab.stamp.reflector``) sends through the ``socket`` plane,
  timestamps aside (tests/integration/test_xdp.py proves it).
* **Collector** (``stamp_collector``, attached by the first ``add_sender_session``):
  takes T4 on arrival of a reflected packet of an active sender session, pushes the raw
  fields into a ring buffer and consumes the packet. ``receive`` turns each record back
  into a ``Received`` whose payload is the reflector packet re-encoded and whose
  ``rx_ns`` is T4 in UTC, so ``SenderEngine`` and the sender core handle it unchanged.
* **User-space path**: a ``socket`` plane bound to the same port. Everything the kernel
  programs leave to the kernel (XDP_PASS) arrives there and reaches the engine through
  ``receive``, and every ``send`` goes out through it. In particular **authenticated
  sessions are answered in user space**: HMAC-SHA-256 does not belong in XDP, so the
  reflector program passes them on and the ``ReflectorEngine``'s core verifies and
  answers them. So do packets with TLVs other than Extra Padding, packets shorter than
  the base packet (RFC 8762 §4.6) and packets of no configured session.

Both programs believe a packet only once its UDP checksum verifies (RFC 8200 §8.1):
one that does not (``pass-bad-checksum``) is passed to the kernel, whose UDP layer drops
it if it is damaged (``Udp6InCsumErrors``). It may instead be unfinished: a frame sent
by a local socket through a veth with tx checksum offload on (the default) carries only
the pseudo-header sum (``CHECKSUM_PARTIAL``) when XDP sees it, even after a router hop
between namespaces; the kernel delivers those, and the user-space path answers them —
correct, but at its speed. On a NIC frames arrive with their checksums complete; on a
veth testbed, turn tx checksum offload off on the interfaces whose frames reach the
programs (``ethtool -K IF tx off``, as the xdp tests and benchmarks do).

One interface carries one XDP program, so a plane is a reflector or a collector, chosen
by the first session call. Sessions reach the plane through the data-plane hooks
(``reflector_session_added`` and the like, ``sixlab.dataplane.base``) that the engines
call whenever they change their core (``ReflectorEngine.add_session``,
``SenderEngine.add_session``...): the core serves the user-space path, the plane the
kernel's, and both always hold the same sessions.

Clocks: ``bpf_ktime_get_tai_ns()`` reads CLOCK_TAI, whose offset from CLOCK_REALTIME is
whatever the kernel was told (0 on a machine no NTP/PTP daemon set it on). ``open``
measures that offset with ``clock_gettime`` and stores it in the programs' config map,
so that kernel NTP timestamps are UTC exactly as user space reads it; PTP timestamps
add the session's TAI−UTC offset (37 s by default) to UTC, as the Python core does.

Lifetime: ``close`` (and an ``atexit`` hook) detaches the program and frees the objects;
nothing is pinned. A process killed with the program attached leaves it on the
interface: the next ``open`` on that interface detaches any XDP program there whose name
is one of ours. The plane remembers the network namespace it was opened in and
re-enters it (for the calling thread) to attach and detach.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import enum
import errno
import functools
import os
import select
import socket
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from ipaddress import IPv6Address
from pathlib import Path
from typing import ParamSpec, TypeVar

from sixlab.dataplane.base import (
    Dataplane,
    DataplaneConfig,
    DataplaneError,
    IPAddress,
    Received,
    require_ipv6,
)
from sixlab.dataplane.udpsocket import SocketDataplane
from sixlab.linux import libbpf
from sixlab.linux.bpfbuild import build_objects
from sixlab.linux.errors import LinuxError
from sixlab.stamp.reflector import ReflectorMode, ReflectorSessionConfig
from sixlab.wire import stamp as wire
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat

__all__ = [
    "MAX_RETURN_SEGMENTS",
    "PROGRAM_NAMES",
    "Reason",
    "XdpDataplane",
    "attach_xdp_pass",
    "measure_tai_offset_ns",
    "pack_config",
    "pack_session",
    "record_to_received",
    "session_key",
]

#: Return SIDs the kernel program writes (STAMP_MAX_SEGS in stamp_common.h); a longer
#: list is left to the user-space path.
MAX_RETURN_SEGMENTS = 8
#: Names of our XDP programs as the kernel reports them (BPF_OBJ_NAME_LEN - 1 = 15 chars).
PROGRAM_NAMES = frozenset({"stamp_reflector", "stamp_collector"})
#: Hop Limit of the kernel's replies: Linux's default for unicast (net.ipv6.conf.*.hop_limit).
DEFAULT_HOP_LIMIT = 64
#: Session-map key of the default (SSID-agnostic) session (STAMP_DEFAULT_SSID).
_DEFAULT_KEY = 0x10000
#: Counter key of packets without a session (STAMP_NO_SSID).
_NO_SSID = 0xFFFFFFFF
_CONFIG = struct.Struct("<HBBIq")  # struct stamp_config
_SESSION = struct.Struct("<BBBBHHIIq128s")  # struct stamp_session
_U32 = struct.Struct("<I")
_COUNTER_KEY = struct.Struct("<II")
_U64 = struct.Struct("<Q")
_RECORD = struct.Struct("<QQQQIIHHHBBHHI16s16s")  # struct stamp_record
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


class Reason(enum.IntEnum):
    """enum stamp_reason of stamp_common.h; ``label`` is the counter's name."""

    REFLECTED = 0
    COLLECTED = 1
    PASS_AUTH = 2
    PASS_NO_SESSION = 3
    PASS_TLV = 4
    PASS_SHORT = 5
    PASS_BIG = 6
    DROP_TOO_SHORT = 7
    DROP_MULTIPLIER_ZERO = 8
    DROP_MALFORMED = 9
    DROP_ADJUST = 10
    PASS_RINGBUF_FULL = 11
    PASS_CHECKSUM_ZERO = 12
    PASS_BAD_CHECKSUM = 13
    PASS_FLOW_TABLE = 14

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _plane_errors(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Report the kernel layer's failures (build, libbpf) as this plane's DataplaneError."""

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return func(*args, **kwargs)
        except LinuxError as exc:
            raise DataplaneError(str(exc)) from exc

    return wrapper


def measure_tai_offset_ns(samples: int = 5) -> int:
    """CLOCK_TAI − CLOCK_REALTIME as this kernel keeps it (whole seconds: it is kept so).

    The best of a few realtime/TAI/realtime sandwiches is rounded to the second; an
    unsynchronised machine gives 0, one whose NTP daemon set the offset gives 37 s.
    """
    best: tuple[int, int] | None = None
    for _ in range(samples):
        r1 = time.clock_gettime_ns(time.CLOCK_REALTIME)
        t = time.clock_gettime_ns(time.CLOCK_TAI)
        r2 = time.clock_gettime_ns(time.CLOCK_REALTIME)
        if best is None or r2 - r1 < best[0]:
            best = (r2 - r1, t - (r1 + r2) // 2)
    assert best is not None
    return round(best[1] / 1e9) * 1_000_000_000


def record_to_received(record: bytes, tai_offset_ns: int) -> Received:
    """A collector ring-buffer record as the ``Received`` the socket plane would give.

    The payload is the reflector packet re-encoded (the layout of
    ``sixlab.wire.stamp.encode_reflector``), ``rx_ns`` is T4 in UTC.
    """
    (t4, t1, t2, t3, seq, rseq, ssid, see, ree, ttl, hop, sport, dport, _pad, src, dst) = (
        _RECORD.unpack_from(record)
    )
    payload = wire.REFLECTOR_UNAUTH.pack(rseq, t3, ree, ssid, t2, seq, t1, see, ttl)
    return Received(payload, src, dst, sport, dport, hop, t4 - tai_offset_ns)


def pack_config(
    port: int, hop_limit: int, tai_offset_ns: int, *, default_only: bool = False
) -> bytes:
    """``struct stamp_config``: the port, the replies' Hop Limit, CLOCK_TAI − UTC.

    ``default_only`` promises the reflector that its session map holds no session but
    the default one, so that it skips the SSID lookups (each a hash-map miss); False
    is always correct, only slower.
    """
    return _CONFIG.pack(port, hop_limit, int(default_only), 0, tai_offset_ns)


def session_key(ssid: int | None) -> bytes:
    """The session-map key of ``ssid`` (None: the default session)."""
    return _U32.pack(_DEFAULT_KEY if ssid is None else ssid)


def pack_session(config: ReflectorSessionConfig, generation: int = 0) -> bytes:
    """``struct stamp_session`` for a reflector session, as the Python core would run it.

    The Error Estimate defaults like the core's (1 µs, unsynchronised, in the session's
    format). An authenticated session, or one whose return SID list is longer than
    ``MAX_RETURN_SEGMENTS``, is marked for the user-space path. ``generation`` keys the
    session's per-flow stateful counters: a new one starts them from 0.
    """
    segs = config.return_segments or ()
    user = config.authenticated or len(segs) > MAX_RETURN_SEGMENTS
    ee = config.error_estimate or ErrorEstimate.for_error_ns(1000, fmt=config.fmt)
    wire_order = b"" if user else b"".join(s.packed for s in reversed(segs))
    return _SESSION.pack(
        int(config.mode is ReflectorMode.STATEFUL),
        int(config.fmt is TimestampFormat.PTP),
        int(user),
        0 if user else len(segs),
        ee.to_int(),
        0,
        0,
        generation & 0xFFFF_FFFF,
        config.tai_utc_offset_ns,
        wire_order,
    )


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise DataplaneError(f"xdp: setns: {os.strerror(err)}")


@contextlib.contextmanager
def _in_netns(target: int | None) -> Iterator[None]:
    """The calling thread in the namespace ``target`` (an fd) for the body."""
    if target is None:
        yield
        return
    here = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if os.fstat(here).st_ino == os.fstat(target).st_ino:
            yield
            return
        _setns(target)
        try:
            yield
        finally:
            _setns(here)
    finally:
        os.close(here)


@_plane_errors
def attach_xdp_pass(ifname: str, *, cache_dir: Path | None = None) -> int:
    """Attach a plain XDP_PASS program to ``ifname`` (in the calling thread's namespace).

    For the veth peer of an interface that runs the reflector: frames sent with XDP_TX
    on a veth are lost unless its peer runs an XDP program too. The attachment keeps
    the program alive after its object is closed; it goes with the interface. Returns
    the program's id.
    """
    try:
        ifindex = socket.if_nametoindex(ifname)
    except OSError as exc:
        raise DataplaneError(f"xdp: no interface {ifname!r} in this namespace") from exc
    obj = libbpf.BpfObject(build_objects(cache_dir)["xdp_pass"])
    try:
        obj.load()
        prog = obj.program("sixlab_xdp_pass")
        libbpf.xdp_attach(ifindex, prog.fd)
        return prog.info().id
    finally:
        obj.close()


def _detach_ours(ifindex: int) -> list[int]:
    """Detach XDP programs of ours left on ``ifindex`` (a crashed run); their ids."""
    gone = []
    for mode in (libbpf.XDP_FLAGS_DRV_MODE, libbpf.XDP_FLAGS_SKB_MODE):
        prog_id = libbpf.xdp_query_id(ifindex, mode)
        if not prog_id:
            continue
        info = libbpf.prog_info_by_id(prog_id)
        if info is not None and info.name in PROGRAM_NAMES:
            libbpf.xdp_detach(ifindex, mode)
            gone.append(prog_id)
    return gone


class XdpDataplane(Dataplane):
    """STAMP in XDP on ``config.interface``, with a socket plane for everything else."""

    name = "xdp"
    #: Replies of the user-space path leave by the socket plane, which sets it.
    sets_tclass = True
    #: ``stamp_collector`` hands replies over as ring records, rebuilt in user space.
    rebuilds_replies = True

    def __init__(
        self,
        config: DataplaneConfig,
        *,
        hop_limit: int = DEFAULT_HOP_LIMIT,
        xdp_flags: int = 0,
        cache_dir: Path | None = None,
    ) -> None:
        super().__init__(config)
        if not 1 <= hop_limit <= 255:
            raise DataplaneError(f"xdp: hop_limit {hop_limit} is not in 1..255")
        self.hop_limit = hop_limit
        self.xdp_flags = xdp_flags
        self.cache_dir = cache_dir
        self.tai_offset_ns = 0
        self.ifindex = 0
        self.role: str | None = None  # "reflector" | "collector" once attached
        self._socket: SocketDataplane | None = None
        self._objects: dict[str, libbpf.BpfObject] = {}
        self._ring: libbpf.RingBuffer | None = None
        self._epoll: select.epoll | None = None
        self._netns: int | None = None
        self._pending: list[Received] = []
        self._senders: set[int] = set()
        self._reflector_keys: set[int] = set()
        self._generation = 0
        #: SSIDs of the reflector sessions in the kernel other than the default one.
        self._ssid_sessions: set[int] = set()

    # -- lifecycle --------------------------------------------------------------------

    @_plane_errors
    def open(self) -> None:
        if self._socket is not None:
            return
        ifname = self.config.interface
        if not ifname:
            raise DataplaneError("xdp: the xdp data plane needs an interface (--interface)")
        require_ipv6("xdp", self.config.source)
        try:
            self.ifindex = socket.if_nametoindex(ifname)
        except OSError as exc:
            raise DataplaneError(f"xdp: no interface {ifname!r} in this namespace") from exc
        paths = build_objects(self.cache_dir)
        try:
            self._netns = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            _detach_ours(self.ifindex)
            self.tai_offset_ns = measure_tai_offset_ns()
            sock = SocketDataplane(self.config)
            sock.open()
            self._socket = sock
            # The port the socket got: a sender's ``port=0`` is an ephemeral one, and the
            # collector must match the replies that come back to it.
            for name in ("stamp_reflector", "stamp_collector"):
                obj = libbpf.BpfObject(paths[name])
                self._objects[name] = obj
                obj.load()
                self._write_config(name)
            self._ring = libbpf.RingBuffer(
                self._objects["stamp_collector"].map("stamp_records"), self._on_record
            )
            self._epoll = select.epoll()
            self._epoll.register(sock.fileno(), select.EPOLLIN)
            self._epoll.register(self._ring.epoll_fd(), select.EPOLLIN)
        except BaseException:
            self.close()
            raise
        atexit.register(self.close)

    def _write_config(self, name: str) -> None:
        """Write ``stamp_cfg`` of program ``name``; default_only while no SSID session."""
        config = pack_config(
            self.local_port,
            self.hop_limit,
            self.tai_offset_ns,
            default_only=not self._ssid_sessions,
        )
        self._object(name).map("stamp_cfg").update(_U32.pack(0), config)

    def close(self) -> None:
        atexit.unregister(self.close)
        if self.role is not None and self.ifindex:
            with contextlib.suppress(DataplaneError, LinuxError), _in_netns(self._netns):
                libbpf.xdp_detach(self.ifindex, self._mode_flags())
            self.role = None
        if self._ring is not None:
            self._ring.free()
            self._ring = None
        for obj in self._objects.values():
            obj.close()
        self._objects = {}
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self._netns is not None:
            os.close(self._netns)
            self._netns = None
        self._senders.clear()
        self._reflector_keys.clear()
        self._ssid_sessions.clear()
        self._pending = []

    def _mode_flags(self) -> int:
        return self.xdp_flags & (libbpf.XDP_FLAGS_SKB_MODE | libbpf.XDP_FLAGS_DRV_MODE)

    def _object(self, name: str) -> libbpf.BpfObject:
        obj = self._objects.get(name)
        if obj is None:
            raise DataplaneError("xdp: data plane is not open (Init first)")
        return obj

    @_plane_errors
    def _attach(self, role: str) -> None:
        if self.role == role:
            return
        if self.role is not None:
            raise DataplaneError(
                f"xdp: {self.config.interface} already runs the {self.role}; one plane is "
                "a reflector or a sender, not both"
            )
        prog = self._object(f"stamp_{role}").program(f"stamp_{role}")
        flags = self.xdp_flags | libbpf.XDP_FLAGS_UPDATE_IF_NOEXIST
        with _in_netns(self._netns):
            try:
                libbpf.xdp_attach(self.ifindex, prog.fd, flags)
            except libbpf.LibbpfError as exc:
                if exc.errno == errno.EBUSY:  # someone else's XDP program is there
                    raise DataplaneError(
                        f"xdp: {self.config.interface} already has an XDP program that is "
                        "not sixlab's; detach it first (`ip link set dev IF xdp off`)"
                    ) from exc
                raise
        self.role = role

    # -- sessions ---------------------------------------------------------------------

    @_plane_errors
    def set_reflector_session(self, config: ReflectorSessionConfig) -> None:
        """Write a reflector session (``ssid=None``: the default one) into the kernel.

        Attaches the reflector program on first use. An authenticated session, or one
        whose return SID list is longer than ``MAX_RETURN_SEGMENTS``, is marked for the
        user-space path: the kernel passes its packets on to the socket.
        """
        sessions = self._object("stamp_reflector").map("stamp_sessions")
        self._generation += 1  # a session written again counts its flows from 0
        value = pack_session(config, self._generation)
        self._attach("reflector")
        key = session_key(config.ssid)
        index = _U32.unpack(key)[0]
        if index not in self._reflector_keys:  # a new session counts from 0
            self._object("stamp_reflector").map("stamp_reflected").update(key, _U64.pack(0))
            self._reflector_keys.add(index)
        if config.ssid is not None and config.ssid not in self._ssid_sessions:
            # The kernel must look SSIDs up again before the session exists.
            self._ssid_sessions.add(config.ssid)
            self._write_config("stamp_reflector")
        sessions.update(key, value)

    @_plane_errors
    def remove_reflector_session(self, ssid: int | None) -> bool:
        """Forget a reflector session; False if the kernel did not have it."""
        sessions = self._object("stamp_reflector").map("stamp_sessions")
        found = sessions.delete(session_key(ssid))
        if ssid is not None and ssid in self._ssid_sessions:
            # Once the last SSID session is gone, every SSID lookup would miss.
            self._ssid_sessions.discard(ssid)
            if not self._ssid_sessions:
                self._write_config("stamp_reflector")
        return found

    @_plane_errors
    def add_sender_session(self, ssid: int) -> None:
        """Collect the replies of sender session ``ssid`` in XDP (unauthenticated ones)."""
        if not 0 <= ssid <= 0xFFFF:
            raise DataplaneError(f"xdp: ssid {ssid} is not a 16-bit value")
        senders = self._object("stamp_collector").map("stamp_senders")
        self._attach("collector")
        senders.update(_U32.pack(ssid), _U32.pack(1))
        self._senders.add(ssid)

    @_plane_errors
    def remove_sender_session(self, ssid: int) -> bool:
        self._senders.discard(ssid)
        return self._object("stamp_collector").map("stamp_senders").delete(_U32.pack(ssid))

    # -- the engines' session hooks (sixlab.dataplane.base) ----------------------------

    def reflector_session_added(self, config: ReflectorSessionConfig) -> None:
        self.set_reflector_session(config)

    def reflector_session_removed(self, ssid: int | None) -> None:
        if self._objects:
            self.remove_reflector_session(ssid)

    def sender_session_added(self, ssid: int) -> None:
        self.add_sender_session(ssid)

    def sender_session_removed(self, ssid: int) -> None:
        if self._objects:
            self.remove_sender_session(ssid)

    @property
    def local_port(self) -> int:
        """The UDP port of the user-space path (the kernel programs' port too)."""
        return self._sock().local_port

    # -- counters ---------------------------------------------------------------------

    @_plane_errors
    def counters_by_session(self) -> dict[int | None, dict[str, int]]:
        """Kernel counters: session (SSID; None = no session; -1 = default) -> reason -> n."""
        out: dict[int | None, dict[str, int]] = {}
        for name in ("stamp_reflector", "stamp_collector"):
            counters = self._object(name).map("stamp_counters")
            for key in counters.iter_keys():
                slots = counters.lookup_percpu(key)
                if slots is None:
                    continue
                ssid, reason = _COUNTER_KEY.unpack(key)
                total = sum(_U64.unpack(s)[0] for s in slots)
                sid: int | None = None if ssid == _NO_SSID else -1 if ssid == _DEFAULT_KEY else ssid
                label = Reason(reason).label if reason in Reason._value2member_map_ else str(reason)
                per = out.setdefault(sid, {})
                per[label] = per.get(label, 0) + total
        # Replies sent are counted in an array (the hot path), read for known sessions.
        reflected = self._object("stamp_reflector").map("stamp_reflected")
        for index in sorted(self._reflector_keys):
            slots = reflected.lookup_percpu(_U32.pack(index)) or []
            total = sum(_U64.unpack(s)[0] for s in slots)
            if total:
                sid = -1 if index == _DEFAULT_KEY else index
                out.setdefault(sid, {})[Reason.REFLECTED.label] = total
        return out

    def counters(self) -> dict[str, int]:
        """Kernel counters summed over sessions, by reason (``reflected``, ``drop-*``...)."""
        totals: dict[str, int] = {}
        for per in self.counters_by_session().values():
            for label, n in per.items():
                totals[label] = totals.get(label, 0) + n
        return totals

    def session_counters(self, ssid: int | None) -> dict[str, int]:
        """Kernel counters of one session (None: the default session), by reason."""
        return self.counters_by_session().get(-1 if ssid is None else ssid, {})

    @_plane_errors
    def program_stats(self) -> libbpf.ProgInfo:
        """The attached program's kernel info (run_time_ns/run_cnt need bpf_stats_enabled)."""
        name = f"stamp_{self.role or 'reflector'}"
        return self._object(name).program(name).info()

    # -- the Dataplane interface ------------------------------------------------------

    def _sock(self) -> SocketDataplane:
        if self._socket is None:
            raise DataplaneError("xdp: data plane is not open (Init first)")
        return self._socket

    def fileno(self) -> int:
        """An epoll descriptor: readable when the socket or the ring buffer has data."""
        if self._epoll is None:
            raise DataplaneError("xdp: data plane is not open (Init first)")
        return self._epoll.fileno()

    def _on_record(self, data: bytes) -> None:
        self._pending.append(record_to_received(data, self.tai_offset_ns))

    @_plane_errors
    def receive(self, max_batch: int = 64) -> list[Received]:
        if len(self._pending) < max_batch and self._ring is not None:
            self._ring.consume()
        out = self._pending[:max_batch]
        del self._pending[:max_batch]
        if len(out) < max_batch:
            out += self._sock().receive(max_batch - len(out))
        return out

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
        self._sock().send(payload, dst, dst_port, segments=segments, src=src, tclass=tclass)
