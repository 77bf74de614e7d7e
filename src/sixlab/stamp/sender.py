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

``now`` is always Unix-epoch UTC nanoseconds; the session never reads a clock. Test
packets carry Seq from 0 and T1 = ``now`` of the timer that sent them (PTP sessions add
the configured TAI−UTC offset on the wire and remove it from what comes back).

Lifecycle, as a table (docs/architecture.md, "State machines")::

    IDLE ──start──▶ RUNNING ──stop / count reached / duration over──▶ DRAINING
    DRAINING ──last outstanding packet answered or timed out──▶ FINISHED

Matching and accounting. Every sent packet waits in ``_outstanding`` until a reflected
packet with its Seq and its T1 comes back (a result) or its loss timeout expires (lost;
RFC 8762 §4.2.1 leaves the timeout to configuration; the default of 2 s is RFC 5357's
TWAMP default). A reflected packet whose Seq was answered before is a duplicate; one
whose Seq is lower than the highest seen is reordered; one for a Seq already declared
lost is counted late and dropped. With a stateful reflector (RFC 8762 §4.3.1), whose
Seq counts what it received, ``sender_seq - reflector_seq`` is the forward loss so far,
which splits the total loss into forward and backward.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum, auto

from sixlab.stamp._events import (
    ConfigError,
    DropReason,
    DuplicateReceived,
    Event,
    PacketDropped,
    PacketLost,
    PacketSent,
    SessionFinished,
    SessionStateError,
    StampResult,
)
from sixlab.wire import stamp as wire
from sixlab.wire import stamp_auth
from sixlab.wire._errors import WireError
from sixlab.wire.timestamp import ErrorEstimate, TimestampFormat, decode_timestamp, encode_timestamp

__all__ = ["DEFAULT_TAI_UTC_OFFSET_NS", "SenderConfig", "SenderCounters", "SenderSession", "State"]

NS_PER_S = 1_000_000_000
#: TAI − UTC since 2017-01-01 (IERS Bulletin C): 37 s. Used to put PTP (TAI) timestamps
#: on the same timescale as NTP (UTC) ones; configurable per session for when it changes.
DEFAULT_TAI_UTC_OFFSET_NS = 37 * NS_PER_S
#: How long to wait for a reflected packet before declaring loss (RFC 5357 §4.2.1's
#: TWAMP-Test default timeout is 2 s; RFC 8762 leaves it to configuration).
DEFAULT_LOSS_TIMEOUT_NS = 2 * NS_PER_S
#: Received Seqs remembered for duplicate detection, beyond which a repeat of an old
#: Seq counts as late rather than duplicate (bounds memory on long sessions).
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

    def __post_init__(self) -> None:
        if not 0 <= self.ssid <= 0xFFFF:
            raise ConfigError(f"ssid {self.ssid} is not a 16-bit value")
        if self.interval_ns <= 0:
            raise ConfigError(f"interval_ns must be positive, got {self.interval_ns} ns")
        if self.count is not None and self.count < 0:
            raise ConfigError(f"count must not be negative, got {self.count}")
        if self.duration_ns is not None and self.duration_ns < 0:
            raise ConfigError(f"duration_ns must not be negative, got {self.duration_ns} ns")
        if self.loss_timeout_ns <= 0:
            raise ConfigError(f"loss_timeout_ns must be positive, got {self.loss_timeout_ns} ns")
        if self.key is not None and not self.key:
            raise ConfigError("key: authenticated mode needs a non-empty key")
        if self.error_estimate is not None and self.error_estimate.fmt is not self.fmt:
            raise ConfigError("error_estimate: its Z bit must match the timestamp format")
        if self.error_estimate is not None and not self.error_estimate.is_valid:
            raise ConfigError("error_estimate: Multiplier must not be 0 (RFC 4656 §4.1.2)")

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

    @property
    def late(self) -> int:
        """Reflected packets that came back after their loss timeout (counted lost too)."""
        return self.dropped.get(DropReason.LATE, 0)

    @property
    def backward_lost(self) -> int | None:
        """Losses on the way back, where the forward/backward split is known."""
        if self.forward_lost is None:
            return None
        return max(0, self.lost - self.forward_lost)


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
        self._answered: set[int] = set()
        self._answered_order: deque[int] = deque()
        self._highest_seq: int | None = None
        self._tx: list[bytes] = []
        self._events: deque[Event] = deque()

    # -- inputs -----------------------------------------------------------------------

    def start(self, now: int) -> None:
        self._transition(_Input.START)
        self._next_send_ns = now
        if self.config.duration_ns is not None:
            self._end_ns = now + self.config.duration_ns
        self.handle_timer(now)

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

    def handle_timer(self, now: int) -> None:
        if self.state is State.RUNNING:
            self._send_due(now)
        self._expire(now)
        self._maybe_drained()

    def receive(self, data: bytes, now: int) -> None:
        """A reflected packet arrived at ``now`` (T4, UTC ns)."""
        if self.state not in (State.RUNNING, State.DRAINING):
            self._drop(DropReason.NOT_RUNNING)
            return
        # Deadlines first: a reply past its loss timeout is late even when the adapter
        # hands it over before running the overdue timer.
        self._expire(now)
        self._match(data, now)
        self._maybe_drained()

    def _match(self, data: bytes, now: int) -> None:
        cfg = self.config
        if cfg.key is not None and not stamp_auth.verify(data, cfg.key):
            self._drop(DropReason.HMAC_FAILED)
            return
        try:
            pkt = wire.decode_reflector(data, authenticated=cfg.authenticated)
        except WireError:
            self._drop(DropReason.TOO_SHORT)
            return
        if pkt.ssid != cfg.ssid:
            self._drop(DropReason.NO_SESSION)
            return
        if not pkt.error_estimate.is_valid:
            self._drop(DropReason.MULTIPLIER_ZERO)
            return
        seq = pkt.sender_seq
        t1 = self._outstanding.get(seq)
        if t1 is None:
            if seq in self._answered:
                self.counters.duplicates += 1
                self._events.append(DuplicateReceived(cfg.ssid, seq))
            elif seq < self._next_seq:
                self._drop(DropReason.LATE)
            else:
                self._drop(DropReason.UNKNOWN_SEQ)
            return
        try:
            echoed_t1 = self._to_utc(pkt.sender_timestamp, pkt.sender_error_estimate.fmt)
            t2 = self._to_utc(pkt.receive_timestamp, pkt.error_estimate.fmt)
            t3 = self._to_utc(pkt.timestamp, pkt.error_estimate.fmt)
        except WireError:
            self._drop(DropReason.BAD_TIMESTAMP)
            return
        if echoed_t1 != t1:  # exact: NTP rounds to nearest both ways (wire.timestamp)
            self._drop(DropReason.BAD_TIMESTAMP)
            return
        del self._outstanding[seq]
        self._remember_answered(seq)
        self.counters.received += 1
        if self._highest_seq is not None and seq < self._highest_seq:
            self.counters.reordered += 1
        else:
            self._highest_seq = seq
            if cfg.reflector_stateful:
                self.counters.forward_lost = max(0, seq - pkt.seq)
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
            )
        )

    # -- outputs ----------------------------------------------------------------------

    def datagrams_to_send(self) -> list[bytes]:
        """STAMP payloads to send now (the adapter adds UDP, IPv6 and the SRH)."""
        out, self._tx = self._tx, []
        return out

    def get_timer(self) -> int | None:
        """When ``handle_timer`` must next be called (UTC ns), or None."""
        candidates = []
        if self.state is State.RUNNING and self._next_send_ns is not None:
            candidates.append(self._next_send_ns)
        if self._deadlines:
            candidates.append(self._deadlines[0][0])
        return min(candidates) if candidates else None

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

    def _send_due(self, now: int) -> None:
        cfg = self.config
        while self._next_send_ns is not None and self._next_send_ns <= now:
            if (cfg.count is not None and self._next_seq >= cfg.count) or (
                self._end_ns is not None and self._next_send_ns >= self._end_ns
            ):
                self._next_send_ns = None
                self._transition(_Input.STOP)
                return
            self._send_one(now)
            # Keep the schedule (no drift) but never burst to catch up after a stall:
            # the slots missed are skipped, the next send is the grid's first after now.
            missed = (now - self._next_send_ns) // cfg.interval_ns
            self._next_send_ns += (missed + 1) * cfg.interval_ns

    def _send_one(self, now: int) -> None:
        cfg = self.config
        seq = self._next_seq
        self._next_seq = (seq + 1) & 0xFFFF_FFFF
        wire_now = now + cfg.tai_utc_offset_ns if cfg.fmt is TimestampFormat.PTP else now
        pkt = wire.SenderPacket(
            seq, encode_timestamp(wire_now, cfg.fmt), self._ee, cfg.ssid, cfg.tlvs
        )
        data = wire.encode_sender(pkt, authenticated=cfg.authenticated)
        if cfg.key is not None:
            data = stamp_auth.sign(data, cfg.key)
        self._tx.append(data)
        self._outstanding[seq] = now
        self._deadlines.append((now + cfg.loss_timeout_ns, seq))
        self.counters.sent += 1
        self._events.append(PacketSent(cfg.ssid, seq, now))

    def _expire(self, now: int) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, seq = self._deadlines.popleft()
            t1 = self._outstanding.pop(seq, None)
            if t1 is not None:
                self.counters.lost += 1
                self._events.append(PacketLost(self.config.ssid, seq, t1))

    def _maybe_drained(self) -> None:
        if self.state is State.DRAINING and not self._outstanding:
            self._deadlines.clear()
            self._transition(_Input.DRAINED)
            self._events.append(SessionFinished(self.config.ssid))

    def _remember_answered(self, seq: int) -> None:
        self._answered.add(seq)
        self._answered_order.append(seq)
        if len(self._answered_order) > DUPLICATE_WINDOW:
            self._answered.discard(self._answered_order.popleft())

    def _to_utc(self, timestamp: int, fmt: TimestampFormat) -> int:
        ns = decode_timestamp(timestamp, fmt)
        return ns - self.config.tai_utc_offset_ns if fmt is TimestampFormat.PTP else ns

    def _drop(self, reason: DropReason) -> None:
        self.counters.dropped[reason] = self.counters.dropped.get(reason, 0) + 1
        self._events.append(PacketDropped(self.config.ssid, reason))
