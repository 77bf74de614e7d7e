"""Values the sans-I/O STAMP core gives out: result records, events, drop reasons.

::

    StampError                 misuse of the core by its caller (not bad packets)
     ├── SessionStateError     an input the session's state table does not accept
     └── SessionConfigError    a session configuration that cannot work (ValueError)

Bad *packets* never raise out of the core: they become a ``PacketDropped`` event and a
count under a ``DropReason`` (docs/architecture.md, "Errors and drops").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sixlab.stamp.direct import DataCounters
from sixlab.wire.timestamp import ErrorEstimate

__all__ = [
    "DropReason",
    "DuplicateReceived",
    "Event",
    "PacketDropped",
    "PacketLost",
    "PacketSent",
    "SessionConfigError",
    "SessionFinished",
    "SessionStateError",
    "StampError",
    "StampResult",
]


class StampError(Exception):
    """The caller used the STAMP core wrongly."""


class SessionStateError(StampError):
    """An input that the session's state table does not accept in its current state."""


class SessionConfigError(StampError, ValueError):
    """A session configuration that cannot work; the message names the field."""


class DropReason(StrEnum):
    """Why a received packet was dropped; the value is the counter's name."""

    TOO_SHORT = "too-short"  # cannot hold Seq, Timestamp and Error Estimate (RFC 8762 §4.6)
    MULTIPLIER_ZERO = "multiplier-zero"  # invalid Error Estimate (RFC 4656 §4.1.2)
    HMAC_FAILED = "hmac-failed"  # RFC 8762 §4.4
    #: A reply whose HMAC TLV is missing, misplaced or wrong (RFC 8972 §4.8).
    HMAC_TLV_FAILED = "hmac-tlv-failed"
    NO_SESSION = "no-session"  # SSID of no session and no default session
    #: A reply with SSID 0 (an RFC 8762-only reflector) refused by strict SSID matching.
    SSID_ZERO = "ssid-zero"
    #: A reply with SSID 0 to a session whose reflector returned its SSID before (an
    #: RFC 8972 reflector: RFC 8972 §3), its packet still waiting for the real reply.
    SSID_ZERO_STRAY = "ssid-zero-stray"
    #: An unauthenticated packet whose SSID names an authenticated session.
    AUTH_REQUIRED = "auth-required"
    BAD_TIMESTAMP = "bad-timestamp"  # PTP nanoseconds >= 10^9, or a T1 we never sent
    UNKNOWN_SEQ = "unknown-seq"  # a reflected Seq the sender never sent
    LATE = "late"  # arrived after its loss timeout had declared it lost
    NOT_RUNNING = "not-running"  # session not started, or already finished
    #: Not an error: the Return Path TLV's Control Code asked for no reply (RFC 9503 §4.1).
    NO_REPLY_REQUESTED = "no-reply-requested"


# Records and per-packet events are values that nothing changes once made, but they are
# not ``frozen``: a frozen dataclass sets each field through ``object.__setattr__``, and
# building a StampResult that way cost 11.0 µs against 3.1 µs (timeit, min of 7, load
# average 10), once per probe. ``unsafe_hash`` hashes them by their fields as ``frozen``
# did.


@dataclass(slots=True, unsafe_hash=True)
class StampResult:
    """One measurement: the four timestamps as Unix-epoch UTC nanoseconds, and context.

    T1 and T4 come from the Session-Sender's clock, T2 and T3 from the Reflector's; PTP
    timestamps (TAI) are converted to UTC with the session's TAI−UTC offset, so records of
    both formats compare directly.
    """

    ssid: int
    seq: int
    t1_ns: int
    t2_ns: int
    t3_ns: int
    t4_ns: int
    sender_error: ErrorEstimate
    reflector_error: ErrorEstimate
    ses_sender_ttl: int
    reflector_seq: int
    tlvs: bytes = b""
    #: The IPv6 Flow Label the test packet was sent with (ECMP coverage, docs/srpm.md);
    #: None when the session sets none.
    flow_label: int | None = None
    #: Loopback mode (draft-ietf-spring-stamp-srpm, docs/srpm.md): the packet came back
    #: to the Session-Sender without a Session-Reflector. T2 and T3 are then 0 (never
    #: taken), and so is ``ses_sender_ttl``: only the round trip T4 − T1 is a measurement.
    loopback: bool = False
    #: The data-flow counters of direct-mode loss (RFC 8972 §4.5), when the session
    #: carries a Direct Measurement TLV and counts its data traffic.
    data: DataCounters | None = None

    @property
    def direct_ns(self) -> int:
        """Forward one-way delay T2 − T1 (as good as the clocks' synchronisation).

        Meaningless for a loopback record (T2 is 0): check ``loopback`` first."""
        return self.t2_ns - self.t1_ns

    @property
    def return_ns(self) -> int:
        """Backward one-way delay T4 − T3 (meaningless for a loopback record)."""
        return self.t4_ns - self.t3_ns

    @property
    def rtt_ns(self) -> int:
        """Round trip without the reflector's residence time: (T4 − T1) − (T3 − T2)."""
        return (self.t4_ns - self.t1_ns) - (self.t3_ns - self.t2_ns)

    def as_json(self) -> dict[str, int | None]:
        """The record as the tools print it in JSON (every time in Unix-epoch ns).

        A loopback record has no one-way delays (None); flow label and data counters
        appear when the record has them."""
        out = self._json()
        if self.loopback:
            out.update(t2_ns=None, t3_ns=None, direct_ns=None, return_ns=None, loopback=1)
        if self.flow_label is not None:
            out["flow_label"] = self.flow_label
        if self.data is not None:
            out.update(
                s_txc=self.data.s_txc,
                r_rxc=self.data.r_rxc,
                r_txc=self.data.r_txc,
                s_rxc=self.data.s_rxc,
            )
        return out

    def _json(self) -> dict[str, int | None]:
        return {
            "seq": self.seq,
            "t1_ns": self.t1_ns,
            "t2_ns": self.t2_ns,
            "t3_ns": self.t3_ns,
            "t4_ns": self.t4_ns,
            "direct_ns": self.direct_ns,
            "return_ns": self.return_ns,
            "rtt_ns": self.rtt_ns,
            "ttl": self.ses_sender_ttl,
            "reflector_seq": self.reflector_seq,
            "sender_error_ns": self.sender_error.error_ns,
            "reflector_error_ns": self.reflector_error.error_ns,
            "error_bound_ns": self.error_bound_ns,
        }

    @property
    def error_bound_ns(self) -> int:
        """Bound on the error of any of the three delays: the two estimates added.

        Each delay is a difference of one reading of each clock (one-way) or of two
        differences each within one clock (round trip); either way the errors of the
        Sender's and the Reflector's timestamps add (RFC 4656 §4.1.2 semantics).
        """
        return self.sender_error.error_ns + self.reflector_error.error_ns


@dataclass(slots=True, unsafe_hash=True)  # a value, not frozen: see StampResult
class PacketSent:
    ssid: int
    seq: int
    t1_ns: int


@dataclass(frozen=True, slots=True)
class PacketLost:
    """No reflected packet for ``seq`` within the session's loss timeout."""

    ssid: int
    seq: int
    t1_ns: int


@dataclass(frozen=True, slots=True)
class DuplicateReceived:
    ssid: int
    seq: int


@dataclass(frozen=True, slots=True)
class PacketDropped:
    ssid: int | None
    reason: DropReason


@dataclass(frozen=True, slots=True)
class SessionFinished:
    ssid: int


Event = StampResult | PacketSent | PacketLost | DuplicateReceived | PacketDropped | SessionFinished
