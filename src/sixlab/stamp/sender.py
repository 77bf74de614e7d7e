"""Sans-I/O STAMP Session-Sender (RFC 8762 §4.2, RFC 8972).

Theory of operation
-------------------
A ``SenderSession`` is driven by its adapter, which owns the socket and the clock::

    session.start(now)
    loop:
        for payload in session.datagrams_to_send(): send it (UDP to the reflector)
        wait until session.get_timer() or a datagram arrives
        on timer:    session.handle_timer(now)
        on datagram: session.receive(payload, now)      # now = T4, the receive time
        for event in iter(session.next_event, None): handle it

The session never reads a clock. ``now`` is the time its schedule and loss timeouts
run on, and ``wall`` (optional on every input) the Unix-epoch UTC time that goes on the
wire and into results: T1 of the packets a timer sends, T4 of a received reply. An
adapter gives a monotonic ``now`` (so that a step of the wall clock neither stalls nor
bursts the schedule, nor expires every packet in flight) and the wall clock as ``wall``;
without ``wall``, ``now`` serves both (UTC ns), as in the tests. Test packets carry Seq
from 0 (PTP sessions add the configured TAI−UTC offset on the wire and remove it from
what comes back).

Lifecycle, as a table (docs/architecture.md, "State machines")::

    IDLE ──start──▶ RUNNING ──stop / count reached / duration over──▶ DRAINING
    DRAINING ──last outstanding packet answered or timed out──▶ FINISHED

Matching and accounting. Every sent packet waits in ``_outstanding`` until a reflected
packet with its Seq and its T1 comes back (a result) or its loss timeout expires (lost;
RFC 8762 §4.2.1 leaves the timeout to configuration; the default of 2 s is RFC 5357's
TWAMP default). A reflected packet whose Seq was answered before is a duplicate; one
whose Seq is lower than the highest seen is reordered; one for a Seq already declared
lost is counted late and dropped. With a stateful reflector (RFC 8762 §4.3.1), whose
Seq counts what it received, ``sender_seq - reflector_seq`` at the highest answered Seq
is the forward loss among the packets sent before it, which splits the loss into
forward and backward. A packet lost after the highest answered one cannot be placed
until a later reply arrives: it is counted ``unclassified_lost`` meanwhile.

SSID. A reply must carry the session's SSID (RFC 8972 §3), with one exception: a
Session-Reflector that implements RFC 8762 but not RFC 8972 returns the field as zero
(to it the field is MBZ). By default such a reply is accepted when its Seq and T1 are
those of a packet this session sent (the adapter has already matched the addresses and
ports), and counted in ``ssid_zero`` so that the results can say the reflector is
RFC 8762-only; ``strict_ssid`` refuses it (counted ``ssid-zero``). Once a reply with the
session's own SSID was accepted, its reflector implements RFC 8972 and never answers
with 0: a later reply with SSID 0 is a stray (another's, or forged) and is refused
(counted ``ssid-zero-stray``), its packet still waiting for the real reply
(docs/stamp-interop.md, "Sessions and SSIDs").

Authenticated mode with TLVs (RFC 8972 §4.8). Every packet carries an HMAC TLV over its
Sequence Number and the TLVs before it, computed per packet, placed after every TLV but
trailing Extra Padding (not needed when all the TLVs are Extra Padding). A Direct
Measurement TLV gets its S_TxC filled in per packet first (RFC 8972 §4.5: packets sent
in the session, this one included, unless the adapter counts a data flow: see below). A
reply's HMAC TLV is verified the same way before anything else in its TLVs is used; a
failure drops the reply (``hmac-tlv-failed``); a reply whose TLVs carry the I flag (the
reflector could not verify ours) is counted in ``integrity_reported``.

SR performance measurement (docs/srpm.md). ``loopback``: the session's packets come
back to it without a Session-Reflector (draft-ietf-spring-stamp-srpm's loopback mode);
replies are the session's own Session-Sender packets, decoded by
``sixlab.stamp.loopback``, and records have ``loopback`` set and T2 = T3 = 0.
``flow_labels``: packet Seq n goes with label ``flow_labels[n mod N]`` (ECMP coverage,
``sixlab.stamp.flows``); the adapter reads a packet's label from its Seq, and every
record carries it. ``direct_measurement``: every packet carries a Direct Measurement
TLV (RFC 8972 §4.5), first in the TLV area, whose S_TxC is the data-flow count the
adapter last reported with ``set_data_counters`` (the session's packet count while it
reports none); records carry the reply's counters with the adapter's S_RxC
(``sixlab.stamp.direct``).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from enum import Enum, auto

from sixlab.stamp._events import (
    DropReason,
    DuplicateReceived,
    Event,
    PacketDropped,
    PacketLost,
    PacketSent,
    SessionConfigError,
    SessionFinished,
    SessionStateError,
    StampResult,
)
from sixlab.stamp.direct import DataCounters
from sixlab.stamp.flows import check_flow_labels, flow_label_for
from sixlab.stamp.loopback import decode_looped
from sixlab.wire import WireError, stamp_auth
from sixlab.wire import stamp as wire
from sixlab.wire import stamp_tlv as tlv
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat, decode_timestamp, encode_timestamp

__all__ = ["DEFAULT_TAI_UTC_OFFSET_NS", "SenderConfig", "SenderCounters", "SenderSession", "State"]

NS_PER_S = 1_000_000_000
#: TAI − UTC since 2017-01-01 (IERS Bulletin C): 37 s. Used to put PTP (TAI) timestamps
#: on the same timescale as NTP (UTC) ones; configurable per session for when it changes.
DEFAULT_TAI_UTC_OFFSET_NS = 37 * NS_PER_S
#: How long to wait for a reflected packet before declaring loss (RFC 5357 §4.2.1's
#: TWAMP-Test default timeout is 2 s; RFC 8762 leaves it to configuration).
DEFAULT_LOSS_TIMEOUT_NS = 2 * NS_PER_S
#: Duplicate detection covers the last this many Seqs sent: one bit each, answered or
#: not (8 KiB a session, whatever its length); a repeat of an older Seq counts as late.
DUPLICATE_WINDOW = 65536


class State(Enum):
    IDLE = auto()
    RUNNING = auto()
    DRAINING = auto()
    FINISHED = auto()


class _Input(Enum):
    START = auto()
    STOP = auto()
    DRAINED = auto()


_TRANSITIONS: dict[tuple[State, _Input], State] = {
    (State.IDLE, _Input.START): State.RUNNING,
    (State.IDLE, _Input.STOP): State.FINISHED,
    (State.RUNNING, _Input.STOP): State.DRAINING,
    (State.DRAINING, _Input.STOP): State.DRAINING,
    (State.DRAINING, _Input.DRAINED): State.FINISHED,
    (State.FINISHED, _Input.STOP): State.FINISHED,
}


@dataclass(frozen=True, slots=True)
class SenderConfig:
    """What a Session-Sender session is (the STAMP paper's session parameters, docs/papers.md).

    ``count`` and ``duration_ns`` both bound the session when given; with neither it runs
    until ``stop``. ``key`` set means authenticated mode (RFC 8762 §4.4). ``tlvs`` is the
    raw TLV area carried after the base packet (build it with ``sixlab.wire.stamp_tlv``).
    """

    ssid: int
    interval_ns: int = NS_PER_S
    count: int | None = None
    duration_ns: int | None = None
    fmt: TimestampFormat = TimestampFormat.NTP
    key: bytes | None = None
    tlvs: bytes = b""
    error_estimate: ErrorEstimate | None = None
    loss_timeout_ns: int = DEFAULT_LOSS_TIMEOUT_NS
    tai_utc_offset_ns: int = DEFAULT_TAI_UTC_OFFSET_NS
    reflector_stateful: bool = False
    #: Refuse replies whose SSID is 0 (an RFC 8762-only reflector); see the module doc.
    strict_ssid: bool = False
    #: Loopback measurement mode: no Session-Reflector (module docstring, docs/srpm.md).
    loopback: bool = False
    #: IPv6 Flow Labels the packets take in turn (ECMP coverage); empty: none set.
    flow_labels: tuple[int, ...] = ()
    #: Carry a Direct Measurement TLV (RFC 8972 §4.5) first in the TLV area.
    direct_measurement: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.ssid <= 0xFFFF:
            raise SessionConfigError(f"ssid {self.ssid} is not a 16-bit value")
        if self.interval_ns <= 0:
            raise SessionConfigError(f"interval_ns must be positive, got {self.interval_ns} ns")
        if self.count is not None and self.count < 0:
            raise SessionConfigError(f"count must not be negative, got {self.count}")
        if self.duration_ns is not None and self.duration_ns < 0:
            raise SessionConfigError(f"duration_ns must not be negative, got {self.duration_ns} ns")
        if self.loss_timeout_ns <= 0:
            raise SessionConfigError(
                f"loss_timeout_ns must be positive, got {self.loss_timeout_ns} ns"
            )
        if self.key is not None and not self.key:
            raise SessionConfigError("key: authenticated mode needs a non-empty key")
        if self.error_estimate is not None and self.error_estimate.fmt is not self.fmt:
            raise SessionConfigError("error_estimate: its Z bit must match the timestamp format")
        if self.error_estimate is not None and not self.error_estimate.is_valid:
            raise SessionConfigError("error_estimate: Multiplier must not be 0 (RFC 4656 §4.1.2)")
        if self.key is not None and self.tlvs:
            try:
                tlv.decode_tlvs(self.tlvs)
            except WireError as exc:
                raise SessionConfigError(
                    f"tlvs: authenticated mode needs well-formed TLVs: {exc}"
                ) from exc
        object.__setattr__(self, "flow_labels", check_flow_labels(self.flow_labels))
        if self.loopback and self.reflector_stateful:
            raise SessionConfigError("reflector_stateful: a loopback session has no reflector")
        if self.loopback and self.direct_measurement:
            raise SessionConfigError(
                "direct_measurement: needs a reflector's counters, a loopback session has none"
            )

    @property
    def authenticated(self) -> bool:
        return self.key is not None

    @property
    def effective_error_estimate(self) -> ErrorEstimate:
        """The configured estimate, or 1 µs unsynchronised in the session's format."""
        if self.error_estimate is not None:
            return self.error_estimate
        return ErrorEstimate.for_error_ns(1000, fmt=self.fmt)


@dataclass(slots=True)
class SenderCounters:
    sent: int = 0
    received: int = 0
    lost: int = 0
    duplicates: int = 0
    reordered: int = 0
    dropped: dict[DropReason, int] = field(default_factory=dict)
    #: Forward loss known from a stateful reflector's Seq (None: reflector stateless).
    forward_lost: int | None = None
    #: Losses after the highest answered Seq, not yet placed forward or backward
    #: (None: reflector stateless).
    unclassified_lost: int | None = None
    #: Replies accepted with SSID 0: the reflector implements RFC 8762 but not RFC 8972.
    ssid_zero: int = 0
    #: Replies whose TLVs carry the I flag: the reflector's check of our HMAC TLV failed.
    integrity_reported: int = 0

    @property
    def reflector_ssid_zero(self) -> bool:
        """The reflector returned SSID 0: it implements RFC 8762 only (RFC 8972 §3)."""
        return self.ssid_zero > 0

    @property
    def late(self) -> int:
        """Reflected packets that came back after their loss timeout (counted lost too)."""
        return self.dropped.get(DropReason.LATE, 0)

    @property
    def backward_lost(self) -> int | None:
        """Losses on the way back, where the forward/backward split is known."""
        if self.forward_lost is None:
            return None
        return max(0, self.lost - self.forward_lost - (self.unclassified_lost or 0))


class SenderSession:
    """One STAMP session on the Session-Sender side; see the module docstring."""

    def __init__(self, config: SenderConfig) -> None:
        self.config = config
        self.state = State.IDLE
        self.counters = SenderCounters()
        self._ee = config.effective_error_estimate
        self._ee_int = self._ee.to_int()
        self._next_seq = 0
        self._next_send_ns: int | None = None
        self._end_ns: int | None = None
        self._outstanding: dict[int, int] = {}  # seq -> T1 (UTC ns)
        self._deadlines: deque[tuple[int, int]] = deque()  # (deadline, seq), in send order
        #: Bit ``seq % DUPLICATE_WINDOW``: that Seq, one of the last DUPLICATE_WINDOW
        #: sent, was answered (cleared when the Seq is taken: ``_take_seq``).
        self._answered = bytearray(DUPLICATE_WINDOW // 8)
        self._highest_seq: int | None = None
        self._lost_above: deque[int] = deque()  # lost Seqs above the highest answered
        self._tx: list[bytes] = []
        self._events: deque[Event] = deque()
        # Direct measurement: a Direct Measurement TLV first in the area (its S_TxC is
        # filled per packet, ``_tlvs_for``), and the data-flow counts the adapter reported.
        split = config
        if config.direct_measurement:
            dm = tlv.DirectMeasurement().to_tlv().encode()
            split = dataclasses.replace(config, tlvs=dm + config.tlvs)
        self._covered, self._trailing, self._dm_at = _split_tlvs(split)
        if config.reflector_stateful:
            self.counters.unclassified_lost = 0
        self._data_tx: int | None = None
        self._data_rx: int | None = None

    # -- inputs -----------------------------------------------------------------------

    def start(self, now: int, wall: int | None = None) -> None:
        self._transition(_Input.START)
        self._next_send_ns = now
        if self.config.duration_ns is not None:
            self._end_ns = now + self.config.duration_ns
        self.handle_timer(now, wall)

    def stop(self) -> None:
        """Send no more; results still outstanding keep their loss timeouts."""
        if self.state is State.FINISHED:
            return
        was_idle = self.state is State.IDLE
        self._transition(_Input.STOP)
        self._next_send_ns = None
        if was_idle:
            self._events.append(SessionFinished(self.config.ssid))
        self._maybe_drained()

    def handle_timer(self, now: int, wall: int | None = None) -> None:
        """The timer fired: send what is due (T1 = ``wall``, else ``now``), expire."""
        if self.state is State.RUNNING:
            self._send_due(now, now if wall is None else wall)
        self._expire(now)
        self._maybe_drained()

    def set_data_counters(self, sent: int | None, received: int | None) -> None:
        """The data flow's packets sent and received so far, as the adapter counts them
        (direct measurement): ``sent`` goes into the next packets' S_TxC, ``received``
        into the next records' S_RxC. Call before ``handle_timer`` and ``receive``."""
        self._data_tx = sent
        self._data_rx = received

    def receive(self, data: bytes, now: int, wall: int | None = None) -> None:
        """A reflected packet arrived at ``now``; T4 is ``wall`` (UTC ns), else ``now``."""
        if self.state not in (State.RUNNING, State.DRAINING):
            self._drop(DropReason.NOT_RUNNING)
            return
        # Deadlines first: a reply past its loss timeout is late even when the adapter
        # hands it over before running the overdue timer.
        self._expire(now)
        t4 = now if wall is None else wall
        if self.config.loopback:
            self._match_looped(data, t4)
        else:
            self._match(data, t4)
        self._maybe_drained()

    def _match(self, data: bytes, now: int) -> None:
        cfg = self.config
        accepted = self._accept(data)
        if accepted is None:
            return
        pkt, ssid_zero = accepted
        seq = pkt.sender_seq
        t1 = self._outstanding.get(seq)
        if t1 is None:
            self._unmatched(seq)
            return
        times = self._reply_times(pkt, t1)
        if times is None or not self._tlvs_pass(data, pkt.tlvs):
            return
        t2, t3 = times
        in_order = self._count_received(seq)
        if ssid_zero:
            self.counters.ssid_zero += 1
        if in_order and cfg.reflector_stateful:
            self.counters.forward_lost = max(0, seq - pkt.seq)
            above = self._lost_above
            while above and above[0] <= seq:
                above.popleft()
            self.counters.unclassified_lost = len(above)
        self._events.append(
            StampResult(
                ssid=cfg.ssid,
                seq=seq,
                t1_ns=t1,
                t2_ns=t2,
                t3_ns=t3,
                t4_ns=now,
                sender_error=self._ee,
                reflector_error=pkt.error_estimate,
                ses_sender_ttl=pkt.ses_sender_ttl,
                reflector_seq=pkt.seq,
                tlvs=pkt.tlvs,
                flow_label=flow_label_for(cfg.flow_labels, seq),
                data=self._data_of(pkt.tlvs),
            )
        )

    def _accept(self, data: bytes) -> tuple[wire.ReflectorPacket, bool] | None:
        """The reply decoded, and whether it came with SSID 0 (RFC 8972 §3); None (the
        drop counted) when its HMAC, length, SSID or error estimate rule it out."""
        cfg = self.config
        if cfg.key is not None and not stamp_auth.verify(data, cfg.key):
            self._drop(DropReason.HMAC_FAILED)
            return None
        try:
            pkt = wire.decode_reflector(data, authenticated=cfg.authenticated)
        except WireError:
            self._drop(DropReason.TOO_SHORT)
            return None
        reason = None
        if pkt.ssid not in (cfg.ssid, 0):
            reason = DropReason.NO_SESSION
        elif pkt.ssid != cfg.ssid:
            reason = self.ssid_zero_refused()
        if reason is None and not pkt.error_estimate.is_valid:
            reason = DropReason.MULTIPLIER_ZERO
        if reason is not None:
            self._drop(reason)
            return None
        return pkt, pkt.ssid != cfg.ssid

    def _unmatched(self, seq: int) -> None:
        """A reply whose Seq has no packet waiting: a duplicate, late, or unknown."""
        if self._was_answered(seq):
            self.counters.duplicates += 1
            self._events.append(DuplicateReceived(self.config.ssid, seq))
        elif seq < self._next_seq:
            self._drop(DropReason.LATE)
        else:
            self._drop(DropReason.UNKNOWN_SEQ)

    def _reply_times(self, pkt: wire.ReflectorPacket, t1: int) -> tuple[int, int] | None:
        """(T2, T3) of a reply that echoes our T1 exactly; None (dropped) otherwise."""
        try:
            echoed_t1 = self._to_utc(pkt.sender_timestamp, pkt.sender_error_estimate.fmt)
            t2 = self._to_utc(pkt.receive_timestamp, pkt.error_estimate.fmt)
            t3 = self._to_utc(pkt.timestamp, pkt.error_estimate.fmt)
        except WireError:
            self._drop(DropReason.BAD_TIMESTAMP)
            return None
        if echoed_t1 != t1:  # exact: NTP rounds to nearest both ways (wire.timestamp)
            self._drop(DropReason.BAD_TIMESTAMP)
            return None
        return t2, t3

    def _tlvs_pass(self, data: bytes, tlvs: bytes) -> bool:
        """An authenticated session's TLVs: False (dropped) when the HMAC TLV fails
        (RFC 8972 §4.8) on anything but Extra Padding; counts reported integrity."""
        cfg = self.config
        if cfg.key is None or not tlvs:
            return True
        scan = tlv.scan_tlvs(tlvs)
        padding_only = scan.well_formed and all(
            x.type == tlv.TlvType.EXTRA_PADDING for x in scan.tlvs
        )
        if not padding_only and not tlv.verify_hmac_tlv(data[:4], tlvs, cfg.key):
            self._drop(DropReason.HMAC_TLV_FAILED)
            return False
        if any(x.flags & tlv.TlvFlag.I for x in scan.tlvs):
            self.counters.integrity_reported += 1
        return True

    def _count_received(self, seq: int) -> bool:
        """Seq is answered: counted and remembered; False if it came reordered (below
        the highest Seq answered so far), True if it is the new highest."""
        del self._outstanding[seq]
        self._remember_answered(seq)
        self.counters.received += 1
        if self._highest_seq is not None and seq < self._highest_seq:
            self.counters.reordered += 1
            return False
        self._highest_seq = seq
        return True

    def _match_looped(self, data: bytes, now: int) -> None:
        """A loopback session's own packet came back (``sixlab.stamp.loopback``)."""
        cfg = self.config
        pkt = decode_looped(data, ssid=cfg.ssid, key=cfg.key)
        if isinstance(pkt, DropReason):
            self._drop(pkt)
            return
        seq = pkt.seq
        t1 = self._outstanding.get(seq)
        if t1 is None:
            self._unmatched(seq)
            return
        try:
            echoed_t1 = self._to_utc(pkt.timestamp, pkt.error_estimate.fmt)
        except WireError:
            self._drop(DropReason.BAD_TIMESTAMP)
            return
        if echoed_t1 != t1:
            self._drop(DropReason.BAD_TIMESTAMP)
            return
        self._count_received(seq)
        self._events.append(
            StampResult(
                ssid=cfg.ssid,
                seq=seq,
                t1_ns=t1,
                t2_ns=0,
                t3_ns=0,
                t4_ns=now,
                sender_error=self._ee,
                reflector_error=pkt.error_estimate,
                ses_sender_ttl=0,  # no reflector read a Hop Limit
                reflector_seq=seq,
                tlvs=pkt.tlvs,
                flow_label=flow_label_for(cfg.flow_labels, seq),
                loopback=True,
            )
        )

    def _data_of(self, tlvs: bytes) -> DataCounters | None:
        """The reply's Direct Measurement counters with our S_RxC (direct measurement)."""
        if not self.config.direct_measurement or not tlvs:
            return None
        for item in tlv.scan_tlvs(tlvs).tlvs:
            if item.type == tlv.TlvType.DIRECT_MEASUREMENT:
                try:
                    dm = tlv.DirectMeasurement.from_tlv(item)
                except WireError:
                    return None
                return DataCounters(dm.s_txc, dm.r_rxc, dm.r_txc, self._data_rx)
        return None

    @property
    def echoed_ssid(self) -> bool:
        """Whether a reply with the session's own SSID was accepted: its reflector
        implements RFC 8972 (§3) and returns the SSID."""
        return self.counters.received > self.counters.ssid_zero

    def ssid_zero_refused(self) -> DropReason | None:
        """Why a reply with SSID 0 that answers a packet of this session is refused
        (module doc, "SSID"), None when it is accepted."""
        if self.config.strict_ssid:
            return DropReason.SSID_ZERO
        if self.echoed_ssid:
            return DropReason.SSID_ZERO_STRAY
        return None

    def claims(self, data: bytes) -> bool:
        """Whether reply ``data`` answers a packet of this session still waiting for its
        reply, by its Seq and T1 alone (for an adapter that must place a reply whose SSID
        is 0). A repeat of a reply already matched is not claimed: without the SSID and
        with T1 no longer kept, another session that sent the same Seq could own it."""
        try:
            pkt = wire.decode_reflector(data, authenticated=self.config.authenticated)
            t1 = self._outstanding.get(pkt.sender_seq)
            if t1 is None:
                return False
            echoed = self._to_utc(pkt.sender_timestamp, pkt.sender_error_estimate.fmt)
        except WireError:
            return False
        return echoed == t1

    # -- outputs ----------------------------------------------------------------------

    @property
    def has_output(self) -> bool:
        """Whether ``datagrams_to_send`` or ``next_event`` has anything (an adapter
        with thousands of sessions asks this before draining them)."""
        return bool(self._tx or self._events)

    def datagrams_to_send(self) -> list[bytes]:
        """STAMP payloads to send now (the adapter adds UDP, IPv6 and the SRH)."""
        out, self._tx = self._tx, []
        return out

    def get_timer(self) -> int | None:
        """When ``handle_timer`` must next be called (on ``now``'s clock), or None: the
        next send, or the loss deadline of the oldest packet still unanswered, if
        sooner (a packet answered has no deadline left: ``_remember_answered``)."""
        send = self._next_send_ns if self.state is State.RUNNING else None
        if not self._deadlines:
            return send
        deadline = self._deadlines[0][0]
        return deadline if send is None or deadline < send else send

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    # -- internals --------------------------------------------------------------------

    def _transition(self, event: _Input) -> None:
        try:
            self.state = _TRANSITIONS[(self.state, event)]
        except KeyError:
            raise SessionStateError(
                f"session {self.config.ssid}: "
                f"{event.name.lower()} is not valid in {self.state.name}"
            ) from None

    def _send_due(self, now: int, wall: int) -> None:
        cfg = self.config
        while self._next_send_ns is not None and self._next_send_ns <= now:
            if (cfg.count is not None and self._next_seq >= cfg.count) or (
                self._end_ns is not None and self._next_send_ns >= self._end_ns
            ):
                self._next_send_ns = None
                self._transition(_Input.STOP)
                return
            self._send_one(now, wall)
            # Keep the schedule (no drift) but never burst to catch up after a stall:
            # the slots missed are skipped, the next send is the grid's first after now.
            missed = (now - self._next_send_ns) // cfg.interval_ns
            self._next_send_ns += (missed + 1) * cfg.interval_ns

    def _send_one(self, now: int, wall: int) -> None:
        cfg = self.config
        seq = self._take_seq()
        wire_now = wall + cfg.tai_utc_offset_ns if cfg.fmt is TimestampFormat.PTP else wall
        pkt = wire.SenderPacket(
            seq, encode_timestamp(wire_now, cfg.fmt), self._ee, cfg.ssid, self._tlvs_for(seq)
        )
        data = wire.encode_sender(pkt, authenticated=cfg.authenticated)
        if cfg.key is not None:
            data = stamp_auth.sign(data, cfg.key)
        self._tx.append(data)
        self._outstanding[seq] = wall  # T1, to match the echo and go into the result
        self._deadlines.append((now + cfg.loss_timeout_ns, seq))
        self.counters.sent += 1
        self._events.append(PacketSent(cfg.ssid, seq, wall))

    def _tlvs_for(self, seq: int) -> bytes:
        """The TLV area of packet ``seq``: S_TxC filled in, HMAC TLV computed (module doc)."""
        cfg = self.config
        covered = self._covered
        if self._dm_at is not None:
            at = self._dm_at
            area = bytearray(covered)
            count = self._data_tx if self._data_tx is not None else self.counters.sent + 1
            area[at : at + 4] = (count & 0xFFFF_FFFF).to_bytes(4)
            covered = bytes(area)
        if cfg.key is None or not covered:
            return covered + self._trailing
        signed = tlv.append_hmac_tlv(seq.to_bytes(4), covered, cfg.key)
        return signed + self._trailing

    def _expire(self, now: int) -> None:
        deadlines = self._deadlines
        if not deadlines or deadlines[0][0] > now:
            return
        while deadlines and deadlines[0][0] <= now:
            _, seq = deadlines.popleft()
            t1 = self._outstanding.pop(seq, None)
            if t1 is not None:
                self.counters.lost += 1
                if self.config.reflector_stateful and (
                    self._highest_seq is None or seq > self._highest_seq
                ):
                    self._lost_above.append(seq)
                    self.counters.unclassified_lost = len(self._lost_above)
                self._events.append(PacketLost(self.config.ssid, seq, t1))
        self._drop_settled_deadlines()

    def _maybe_drained(self) -> None:
        if self.state is State.DRAINING and not self._outstanding:
            self._deadlines.clear()
            self._transition(_Input.DRAINED)
            self._events.append(SessionFinished(self.config.ssid))

    def _take_seq(self) -> int:
        """The Seq of the packet about to be sent (Seq wraps at 2**32, RFC 8762 §4.2.1);
        its answered bit, last used by the Seq one window before, is cleared."""
        seq = self._next_seq
        self._next_seq = (seq + 1) & 0xFFFF_FFFF
        bit = seq % DUPLICATE_WINDOW
        self._answered[bit >> 3] &= ~(1 << (bit & 7)) & 0xFF
        return seq

    def _was_answered(self, seq: int) -> bool:
        """Seq is one of the last DUPLICATE_WINDOW sent and was answered."""
        if (self._next_seq - 1 - seq) & 0xFFFF_FFFF >= DUPLICATE_WINDOW:
            return False  # older than the window, or never sent
        bit = seq % DUPLICATE_WINDOW
        return bool(self._answered[bit >> 3] >> (bit & 7) & 1)

    def _remember_answered(self, seq: int) -> None:
        """Seq is answered (and out of ``_outstanding``): kept for duplicate detection,
        and its loss deadline dropped if it was the oldest."""
        bit = seq % DUPLICATE_WINDOW
        self._answered[bit >> 3] |= 1 << (bit & 7)
        self._drop_settled_deadlines()

    def _drop_settled_deadlines(self) -> None:
        """Drop the loss deadlines at the front whose packets are no longer waiting
        (answered), so that ``get_timer`` names the oldest deadline that still guards a
        packet. Otherwise an answered packet's deadline, which falls near a later send
        slot whenever the loss timeout is a multiple of the interval, would call
        ``handle_timer`` once more for nothing."""
        deadlines, outstanding = self._deadlines, self._outstanding
        while deadlines and deadlines[0][1] not in outstanding:
            deadlines.popleft()

    def _to_utc(self, timestamp: int, fmt: TimestampFormat) -> int:
        ns = decode_timestamp(timestamp, fmt)
        return ns - self.config.tai_utc_offset_ns if fmt is TimestampFormat.PTP else ns

    def _drop(self, reason: DropReason) -> None:
        self.counters.dropped[reason] = self.counters.dropped.get(reason, 0) + 1
        self._events.append(PacketDropped(self.config.ssid, reason))


def _split_tlvs(config: SenderConfig) -> tuple[bytes, bytes, int | None]:
    """The configured TLV area split for per-packet work: (the TLVs an HMAC TLV covers,
    the trailing Extra Padding it may not cover, the offset of a Direct Measurement
    TLV's S_TxC in the first part or None).

    Unauthenticated, or TLVs that do not decode: all of it in the first part, as given.
    An HMAC TLV in the configuration is dropped: the session computes its own.
    """
    try:
        tlvs = list(tlv.decode_tlvs(config.tlvs))
    except WireError:
        return config.tlvs, b"", None
    if config.key is not None:
        tlvs = [x for x in tlvs if x.type != tlv.TlvType.HMAC]
        end = len(tlvs)
        while end and tlvs[end - 1].type == tlv.TlvType.EXTRA_PADDING:
            end -= 1
        covered, trailing = tlv.encode_tlvs(tlvs[:end]), tlv.encode_tlvs(tlvs[end:])
    else:
        covered, trailing = config.tlvs, b""
        end = len(tlvs)
    dm_at = None
    offset = 0
    for x in tlvs[:end]:
        if x.type == tlv.TlvType.DIRECT_MEASUREMENT and len(x.value) == 12:
            dm_at = offset + tlv.TLV_HEADER_SIZE
            break
        offset += x.size
    return covered, trailing, dm_at
