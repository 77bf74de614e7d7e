"""Sans-I/O STAMP Session-Reflector (RFC 8762 §4.3, RFC 8972 §4, RFC 9503).

Theory of operation
-------------------
The adapter hands every received UDP payload to ``Reflector.reflect`` with the arrival
time (T2, UTC ns, as close to the wire as the adapter can take it: a kernel RX
timestamp), the IPv6 Hop Limit it arrived with, and a clock to read T3 from.
``reflect`` returns the reply to send (and the return path to send it on), or None; a
packet it will not answer is counted under a ``DropReason`` and never raises.

Sessions. A reflector holds sessions by SSID (RFC 8972 §3) and, optionally, a default
session that answers every SSID (an RFC 8762 reflector that knows nothing of SSIDs).
A session is stateless (reply Seq = sender Seq) or stateful (reply Seq = its own count
of replies from 0, RFC 8762 §4.3.1, which lets the Sender tell forward from backward
loss), unauthenticated or authenticated (a per-session key).

A STAMP session is the SSID *together with* the addresses and ports of the packets
(RFC 8972 §3): two senders that use the same SSID are two sessions. The adapter names
the flow of every packet with a hashable ``flow`` key (its addresses and ports); each
configured session keeps, per SSID and flow (the default session answers many SSIDs),
the state RFC 8762 and RFC 8972 ask for: the
stateful Seq counter, the Direct Measurement counters (RFC 8972 §4.5) and the transmit
time of the last reply (Follow-Up Telemetry, §4.7). At most ``MAX_FLOWS`` flows are kept
per session; past that the oldest flow is forgotten (its counters start again from 0).

Order of checks for one packet:

1. Authenticated? If the packet is long enough and bytes 26:28 name an authenticated
   session (or the default session is authenticated and no unauthenticated session
   claims bytes 14:16), its HMAC is verified first, in constant time (RFC 8762 §4.4).
   An unauthenticated packet whose SSID names an authenticated session is dropped
   (``AUTH_REQUIRED``): the unauthenticated default session never stands in for it.
2. Long enough to hold Seq, Timestamp and Error Estimate (14 bytes); a shorter-than-base
   packet from a TWAMP-Light sender is answered with a full base packet (§4.6).
3. Error Estimate Multiplier not 0 (RFC 4656 §4.1.2: such a packet is corrupt).
4. TLVs (RFC 8972 §4): copied back (symmetric size); U cleared on the ones acted on;
   a TLV whose length runs past the end is returned with M set; a Return Path TLV
   (RFC 9503) chooses the return path. In an authenticated session the HMAC TLV is
   verified before any other TLV is looked at (RFC 8972 §4.8): if it is missing,
   misplaced or wrong, every TLV comes back untouched with I set, and the reply takes
   the session's configured path (``sixlab.stamp._tlvs``).
5. T2 and T3 are two clock readings: T2 given, T3 read just before the reply is packed.
   Ses-Sender TTL is the received Hop Limit.

The unauthenticated path without TLVs is the hot path of the user-space data planes:
one ``unpack_from`` and one ``pack`` on precompiled structs, no per-packet objects but
the reply bytes and one small tuple (benchmarks/bench_reflector.py measures it).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from sixlab.stamp import _tlvs
from sixlab.stamp._events import DropReason, SessionConfigError
from sixlab.stamp.sender import DEFAULT_TAI_UTC_OFFSET_NS
from sixlab.wire import stamp as wire
from sixlab.wire import stamp_auth
from sixlab.wire.stamp_tlv import SyncSource, TimestampMethod
from sixlab.wire.timestamp import NTP_UNIX_OFFSET_S, ErrorEstimate, TimestampFormat, ptp_from_ns

__all__ = [
    "MAX_FLOWS",
    "FlowState",
    "PacketContext",
    "Reflection",
    "Reflector",
    "ReflectorCounters",
    "ReflectorMode",
    "ReflectorSessionConfig",
    "ReturnPath",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_SENDER_UNAUTH = wire.SENDER_UNAUTH
_SENDER_AUTH = wire.SENDER_AUTH
_SENDER_SHORT = wire.SENDER_SHORT
_REFLECTOR_UNAUTH = wire.REFLECTOR_UNAUTH
_REFLECTOR_AUTH = wire.REFLECTOR_AUTH
_UNAUTH = wire.UNAUTH_PACKET_SIZE
_AUTH = wire.AUTH_PACKET_SIZE
_MIN = wire.MIN_SENDER_SIZE


#: Reads a session's data flow: (packets sent, packets received), or None (failed).
DataSource = Callable[[], tuple[int, int] | None]


class ReflectorMode(StrEnum):
    STATELESS = "stateless"
    STATEFUL = "stateful"


@dataclass(frozen=True, slots=True)
class ReturnPath:
    """Where a reply goes: a return SRv6 SID list (travel order) and/or another address.

    Both None means "back to the packet's source, by plain routing".
    """

    segments: tuple[ipaddress.IPv6Address, ...] | None = None
    address: IPAddress | None = None


_PLAIN_RETURN = ReturnPath()


@dataclass(frozen=True, slots=True)
class ReflectorSessionConfig:
    """One reflector session. ``ssid=None`` makes it the SSID-agnostic default."""

    ssid: int | None
    mode: ReflectorMode = ReflectorMode.STATELESS
    key: bytes | None = None
    fmt: TimestampFormat = TimestampFormat.NTP
    error_estimate: ErrorEstimate | None = None
    return_segments: tuple[ipaddress.IPv6Address, ...] | None = None
    tai_utc_offset_ns: int = DEFAULT_TAI_UTC_OFFSET_NS
    #: Clock source and timestamping method reported in the Timestamp Information TLV
    #: (RFC 8972 §4.3, IANA registries): the host clock, read in software.
    sync_source: int = SyncSource.NTP
    timestamp_method: int = TimestampMethod.SW_LOCAL

    def __post_init__(self) -> None:
        if self.ssid is not None and not 0 <= self.ssid <= 0xFFFF:
            raise SessionConfigError(f"ssid {self.ssid} is not a 16-bit value")
        if self.key is not None and not self.key:
            raise SessionConfigError("key: authenticated mode needs a non-empty key")
        if self.key is not None and self.ssid == 0:
            # An unauthenticated packet with TLVs is as long as an authenticated one and
            # has zeros (MBZ) where the authenticated SSID sits: SSID 0 would claim it.
            raise SessionConfigError("ssid: an authenticated session needs a non-zero SSID")
        if self.return_segments is not None and not self.return_segments:
            raise SessionConfigError("return_segments: an SRv6 SID list cannot be empty")
        if self.error_estimate is not None and self.error_estimate.fmt is not self.fmt:
            raise SessionConfigError("error_estimate: its Z bit must match the timestamp format")
        if self.error_estimate is not None and not self.error_estimate.is_valid:
            raise SessionConfigError("error_estimate: Multiplier must not be 0 (RFC 4656 §4.1.2)")
        # One byte each in the Timestamp Information TLV (RFC 8972 §4.3).
        if not 0 <= self.sync_source <= 0xFF:
            raise SessionConfigError(f"sync_source {self.sync_source} is not an 8-bit value")
        if not 0 <= self.timestamp_method <= 0xFF:
            raise SessionConfigError(
                f"timestamp_method {self.timestamp_method} is not an 8-bit value"
            )

    @property
    def authenticated(self) -> bool:
        return self.key is not None


#: Flows remembered per session (RFC 8972 §3: a session is SSID + addresses + ports).
MAX_FLOWS = 16384


@dataclass(slots=True)
class FlowState:
    """What a session keeps per flow: the stateful Seq counter (RFC 8762 §4.3.1), the
    Direct Measurement counters (RFC 8972 §4.5) and the last reply's actual transmit
    time, for Follow-Up Telemetry (RFC 8972 §4.7)."""

    next_seq: int = 0
    received: int = 0
    transmitted: int = 0
    #: (reply Seq, transmit time UTC ns, RFC 8972 timestamping method) of the last reply
    #: whose transmit time the adapter reported (``Reflector.transmitted``).
    last_tx: tuple[int, int, int] | None = None


@dataclass(slots=True)
class _Session:
    config: ReflectorSessionConfig
    ee: ErrorEstimate
    ee_int: int
    ptp: bool
    return_path: ReturnPath
    stateless: bool = True
    reflected: int = 0
    dropped: dict[DropReason, int] = field(default_factory=dict)
    integrity_failed: int = 0
    flows: dict[object, FlowState] = field(default_factory=dict)
    #: Data-flow counts for the Direct Measurement TLV (RFC 8972 §4.5), when the adapter
    #: counts the session's data traffic (``Reflector.set_data_counters``).
    data_rx: int | None = None
    data_tx: int | None = None
    #: Or a reading of them, taken when a TLV packet of the session is answered.
    data_source: DataSource | None = None

    @classmethod
    def from_config(cls, config: ReflectorSessionConfig) -> _Session:
        ee = config.error_estimate or ErrorEstimate.for_error_ns(1000, fmt=config.fmt)
        segs = config.return_segments
        return cls(
            config=config,
            ee=ee,
            ee_int=ee.to_int(),
            ptp=config.fmt is TimestampFormat.PTP,
            return_path=ReturnPath(segments=segs) if segs else _PLAIN_RETURN,
            stateless=config.mode is ReflectorMode.STATELESS,
        )

    def flow(self, key: object) -> FlowState:
        """The state of flow ``key``, made on first use (the oldest goes past MAX_FLOWS)."""
        flows = self.flows
        state = flows.get(key)
        if state is None:
            if len(flows) >= MAX_FLOWS:
                del flows[next(iter(flows))]
            state = flows[key] = FlowState()
        return state

    def timestamp(self, utc_ns: int) -> int:
        """``utc_ns`` in the session's wire format (the per-reply hot path).

        Same arithmetic as ``ntp_from_ns`` without its range check: a clock reading is
        always inside NTP's 1968–2104 window, and the modulo is the RFC 4330 era wrap.
        """
        if self.ptp:
            return ptp_from_ns(utc_ns + self.config.tai_utc_offset_ns)
        sec, nsec = divmod(utc_ns, 1_000_000_000)
        return (((sec + NTP_UNIX_OFFSET_S) & 0xFFFF_FFFF) << 32) | (
            ((nsec << 32) + 500_000_000) // 1_000_000_000
        )

    def take_seq(self, sender_seq: int, flow: FlowState) -> int:
        if self.stateless:
            return sender_seq
        seq = flow.next_seq
        flow.next_seq = (seq + 1) & 0xFFFF_FFFF
        return seq


class Reflection(NamedTuple):
    """A reply. ``tclass``: the Traffic Class / TOS byte the reply must carry (Class of
    Service TLV), None for the data plane's default. ``flow``: the flow state the reply
    belongs to, for ``Reflector.transmitted``."""

    payload: bytes
    ssid: int
    return_path: ReturnPath
    tclass: int | None = None
    flow: FlowState | None = None


@dataclass(frozen=True, slots=True)
class PacketContext:
    """What the adapter knows of a received packet beyond its payload, for the TLVs.

    Addresses and ports (Location, RFC 8972 §4.2; Destination Node Address, RFC 9503).
    ``tclass``: the received IPv6 Traffic Class / IPv4 TOS byte (DSCP << 2 | ECN), None
    when the data plane cannot read it. ``set_tclass``: the data plane applies
    ``Reflection.tclass`` to the reply. Both for Class of Service (RFC 8972 §4.4).
    """

    src: IPAddress
    dst: IPAddress
    src_port: int
    dst_port: int
    tclass: int | None = None
    set_tclass: bool = False

    @property
    def flow(self) -> tuple[IPAddress, int, IPAddress, int]:
        """The flow key of the packet when the adapter gives none of its own."""
        return (self.src, self.src_port, self.dst, self.dst_port)


@dataclass(slots=True)
class ReflectorCounters:
    received: int = 0
    reflected: int = 0
    dropped: dict[DropReason, int] = field(default_factory=dict)
    #: Answered packets of authenticated sessions whose HMAC TLV did not verify
    #: (RFC 8972 §4.8): their TLVs came back with I set and were not acted on.
    integrity_failed: int = 0


class Reflector:
    """A Session-Reflector: its sessions, its default session, its counters."""

    def __init__(self, default: ReflectorSessionConfig | None = None) -> None:
        self.counters = ReflectorCounters()
        self._unauth: dict[int, _Session] = {}
        self._auth: dict[int, _Session] = {}
        self._default: _Session | None = None
        if default is not None:
            self.set_default(default)

    # -- configuration ----------------------------------------------------------------

    def add_session(self, config: ReflectorSessionConfig) -> None:
        if config.ssid is None:
            raise SessionConfigError("ssid: use set_default for the SSID-agnostic session")
        if config.ssid in self._unauth or config.ssid in self._auth:
            raise SessionConfigError(f"ssid: session {config.ssid} already exists")
        table = self._auth if config.authenticated else self._unauth
        table[config.ssid] = _Session.from_config(config)

    def remove_session(self, ssid: int) -> None:
        if self._unauth.pop(ssid, None) is None and self._auth.pop(ssid, None) is None:
            raise SessionConfigError(f"ssid: no session {ssid}")

    def set_default(self, config: ReflectorSessionConfig | None) -> None:
        if config is not None and config.ssid is not None:
            raise SessionConfigError("ssid: the default session has no SSID (None)")
        self._default = None if config is None else _Session.from_config(config)

    def set_data_source(self, ssid: int | None, source: DataSource | None) -> None:
        """Read session ``ssid``'s data-flow counts with ``source`` (``(sent, received)``,
        or None when the reading failed: the last counts stay) each time one of its TLV
        packets is answered, every path of this reflector alike. Like the clock that
        ``reflect`` reads T3 from, the adapter supplies the reading; None: stop."""
        self._session(ssid).data_source = source

    def set_data_counters(self, ssid: int | None, received: int, sent: int) -> None:
        """The data flow of session ``ssid`` (None: the default one), as the adapter
        counts it: packets received and sent so far. From now on a Direct Measurement
        TLV gets these as R_RxC and R_TxC instead of the session's test packet counts
        (docs/srpm.md, "Direct-mode loss"). Call before ``reflect``."""
        sess = self._session(ssid)
        sess.data_rx = received
        sess.data_tx = sent

    def session_counters(self, ssid: int | None) -> tuple[int, dict[DropReason, int]]:
        """(replies sent, drops by reason) of one session; None names the default."""
        sess = self._session(ssid)
        return sess.reflected, dict(sess.dropped)

    def session_integrity_failed(self, ssid: int | None) -> int:
        """Answered packets of one session whose HMAC TLV failed (RFC 8972 §4.8)."""
        return self._session(ssid).integrity_failed

    def _session(self, ssid: int | None) -> _Session:
        sess = self._default if ssid is None else self._unauth.get(ssid) or self._auth.get(ssid)
        if sess is None:
            raise SessionConfigError(f"ssid: no session {ssid}")
        return sess

    @property
    def ssids(self) -> list[int]:
        return sorted([*self._unauth, *self._auth])

    # -- the packet path --------------------------------------------------------------

    def reflect(
        self,
        data: bytes,
        t2_ns: int,
        clock: Callable[[], int],
        hop_limit: int,
        context: PacketContext | None = None,
        *,
        flow: object = None,
    ) -> Reflection | None:
        """The reply to a Session-Sender packet, or None (the drop is counted).

        ``flow`` names the packet's addresses and ports (any hashable value, the same for
        every packet of a flow); without it, ``context.flow``, and without a context every
        packet of a session is one flow.
        """
        self.counters.received += 1
        if flow is None and context is not None:
            flow = context.flow
        size = len(data)
        if size >= _AUTH and (self._auth or (self._default and self._default.config.key)):
            sess = self._auth_session(data)
            if sess is not None:
                return self._reflect_auth(
                    sess, data, t2_ns, clock, hop_limit, context=context, flow=flow
                )
        if size < _MIN:
            self._drop(None, DropReason.TOO_SHORT)
            return None
        if size >= _UNAUTH:
            seq, ts, ee, ssid = _SENDER_UNAUTH.unpack_from(data)
        else:
            seq, ts, ee = _SENDER_SHORT.unpack_from(data)
            ssid = int.from_bytes(data[14:16]) if size >= 16 else 0
        sess = self._unauth.get(ssid) or self._fallback_session(ssid)
        if sess is None:
            return None
        state = sess.flow((ssid, flow))
        state.received += 1
        if not ee & 0xFF:
            self._drop(sess, DropReason.MULTIPLIER_ZERO)
            return None
        route = sess.return_path
        tlvs = b""
        tclass = None
        if size > _UNAUTH:
            out = self._tlvs(sess, state, data, data[_UNAUTH:], context)
            if out is None:
                self._drop(sess, DropReason.NO_REPLY_REQUESTED)
                return None
            tlvs, route, tclass = out
        rseq = seq if sess.stateless else sess.take_seq(seq, state)
        if sess.ptp:
            t2 = sess.timestamp(t2_ns)
            t3 = sess.timestamp(clock())
        else:
            # _Session.timestamp for NTP, inlined: this is the per-reply hot path of the
            # user-space planes, and two calls cost a tenth of it.
            sec, nsec = divmod(t2_ns, 1_000_000_000)
            t2 = (((sec + NTP_UNIX_OFFSET_S) & 0xFFFF_FFFF) << 32) | (
                ((nsec << 32) + 500_000_000) // 1_000_000_000
            )
            sec, nsec = divmod(clock(), 1_000_000_000)
            t3 = (((sec + NTP_UNIX_OFFSET_S) & 0xFFFF_FFFF) << 32) | (
                ((nsec << 32) + 500_000_000) // 1_000_000_000
            )
        payload = _REFLECTOR_UNAUTH.pack(rseq, t3, sess.ee_int, ssid, t2, seq, ts, ee, hop_limit)
        sess.reflected += 1
        state.transmitted += 1
        self.counters.reflected += 1
        return Reflection(payload + tlvs if tlvs else payload, ssid, route, tclass, state)

    def transmitted(self, reply: Reflection, tx_ns: int, method: int) -> None:
        """The adapter saw ``reply`` leave at ``tx_ns`` (UTC ns), timestamped with
        ``method`` (RFC 8972 §4.3 registry): the next reply of its flow reports it in a
        Follow-Up Telemetry TLV (RFC 8972 §4.7)."""
        if reply.flow is not None and len(reply.payload) >= 4:
            reply.flow.last_tx = (int.from_bytes(reply.payload[:4]), tx_ns, method)

    def restamp(self, payload: bytes, t3_ns: int) -> bytes:
        """A reply this reflector built, with T3 read again at ``t3_ns``.

        For data planes whose send path is slow (``scapy`` builds the packet with its
        layers after ``reflect`` returned): they call this right before the packet
        leaves, so T3 stays "as late as possible" (RFC 8762 §4.3). Authenticated replies
        are signed again (the HMAC covers T3; an HMAC TLV does not). A reply whose
        session is gone comes back unchanged.
        """
        if len(payload) >= _AUTH:
            sess = self._auth_session(payload)
            if sess is not None and sess.config.key is not None:
                t3 = sess.timestamp(t3_ns).to_bytes(8)
                return stamp_auth.sign(payload[:16] + t3 + payload[24:], sess.config.key)
        if len(payload) < _UNAUTH:
            return payload
        sess = self._unauth.get(int.from_bytes(payload[14:16])) or self._default
        if sess is None or sess.config.key is not None:
            return payload
        return payload[:4] + sess.timestamp(t3_ns).to_bytes(8) + payload[12:]

    def _fallback_session(self, ssid: int) -> _Session | None:
        """The session of an unauthenticated packet whose SSID names none: the default
        one if it is unauthenticated; else None, and the drop is counted."""
        if ssid in self._auth:
            self._drop(self._auth[ssid], DropReason.AUTH_REQUIRED)
            return None
        sess = self._default
        if sess is None or sess.config.key is not None:
            self._drop(None, DropReason.NO_SESSION)
            return None
        return sess

    def _auth_session(self, data: bytes) -> _Session | None:
        """The authenticated session of a packet of at least ``_AUTH`` bytes, or None.

        The SSID at bytes 26:28 (authenticated layout) names one; failing that, an
        authenticated default session takes the packet unless an unauthenticated session
        claims the SSID at bytes 14:16 (module doc, "Order of checks", step 1).
        """
        sess = self._auth.get(int.from_bytes(data[26:28]))
        default = self._default
        if sess is None and default is not None and default.config.key is not None:
            sess = None if int.from_bytes(data[14:16]) in self._unauth else default
        return sess

    def _reflect_auth(
        self,
        sess: _Session,
        data: bytes,
        t2_ns: int,
        clock: Callable[[], int],
        hop_limit: int,
        *,
        context: PacketContext | None,
        flow: object,
    ) -> Reflection | None:
        key = sess.config.key
        assert key is not None  # only authenticated sessions come here
        if not stamp_auth.verify(data, key):
            self._drop(sess, DropReason.HMAC_FAILED)
            return None
        seq, ts, ee, ssid = _SENDER_AUTH.unpack_from(data)
        state = sess.flow((ssid, flow))
        state.received += 1
        if not ee & 0xFF:
            self._drop(sess, DropReason.MULTIPLIER_ZERO)
            return None
        route = sess.return_path
        tlvs = b""
        tclass = None
        if len(data) > _AUTH:
            out = self._tlvs(sess, state, data, data[_AUTH:], context)
            if out is None:
                self._drop(sess, DropReason.NO_REPLY_REQUESTED)
                return None
            tlvs, route, tclass = out
        rseq = sess.take_seq(seq, state)
        t2 = sess.timestamp(t2_ns)
        t3 = sess.timestamp(clock())
        body = _REFLECTOR_AUTH.pack(rseq, t3, sess.ee_int, ssid, t2, seq, ts, ee, hop_limit)
        if tlvs:
            tlvs = _tlvs.resign_hmac_tlv(body[:4], tlvs, key)
        sess.reflected += 1
        state.transmitted += 1
        self.counters.reflected += 1
        return Reflection(stamp_auth.sign(body + tlvs, key), ssid, route, tclass, state)

    def _tlvs(
        self,
        sess: _Session,
        state: FlowState,
        data: bytes,
        area: bytes,
        context: PacketContext | None,
    ) -> tuple[bytes, ReturnPath, int | None] | None:
        """The reflected TLV area, return path and reply Traffic Class; None if the
        sender asked for no reply."""
        cfg = sess.config
        if sess.data_source is not None:
            reading = sess.data_source()
            if reading is not None:
                sess.data_tx, sess.data_rx = reading
        follow_up = None
        if state.last_tx is not None:
            last_seq, tx_ns, method = state.last_tx
            follow_up = (last_seq, sess.timestamp(tx_ns), method)
        out = _tlvs.reflect_tlvs(
            area,
            _tlvs.TlvContext(
                src=context.src if context else None,
                dst=context.dst if context else None,
                src_port=context.src_port if context else 0,
                dst_port=context.dst_port if context else 0,
                sync_source=cfg.sync_source,
                timestamp_method=cfg.timestamp_method,
                key=cfg.key,
                seq_field=data[:4],
                received=state.received if sess.data_rx is None else sess.data_rx,
                transmitted=state.transmitted + 1 if sess.data_tx is None else sess.data_tx,
                tclass=context.tclass if context else None,
                set_tclass=context.set_tclass if context else False,
                follow_up=follow_up,
            ),
        )
        route = sess.return_path
        if out.integrity_failed:
            sess.integrity_failed += 1
            self.counters.integrity_failed += 1
            return out.area, route, None
        if not out.reply_requested:
            return None
        if out.return_segments is not None or out.return_address is not None:
            route = ReturnPath(
                segments=out.return_segments or route.segments,
                address=out.return_address,
            )
        return out.area, route, out.tclass

    def _drop(self, sess: _Session | None, reason: DropReason) -> None:
        """Count a packet not answered, globally and in its session if it has one."""
        self.counters.dropped[reason] = self.counters.dropped.get(reason, 0) + 1
        if sess is not None:
            sess.dropped[reason] = sess.dropped.get(reason, 0) + 1
