"""Direct-mode loss: data-traffic loss from the Direct Measurement TLV's counters.

RFC 8972 §4.5 lets a test packet carry three 32-bit counters of a *data* flow the session
watches: S_TxC, the data packets the Session-Sender has sent (written at T1); R_RxC and
R_TxC, the data packets the Session-Reflector has received and sent (written when it
reflects). The Session-Sender adds its own fourth count when the reply arrives (T4):
S_RxC, the reverse flow's packets it has received; that one never goes on the wire.

Between two replies of one session the differences give the data loss of the interval,
per direction::

    forward_sent  = ΔS_TxC      forward_lost  = ΔS_TxC − ΔR_RxC
    backward_sent = ΔR_TxC      backward_lost = ΔR_TxC − ΔS_RxC

Counters are 32 bits on the wire, so every difference is taken modulo 2^32 (one wrap per
interval at most: fewer than 4.3 × 10^9 packets between two test packets). An interval's
loss may be negative by the data packets in flight at its edges (sent before the test
packet, received after it): the two ends read their counters one path delay apart. Over
consecutive intervals these cancel; they are reported as measured, never clamped.

What the counters count is the adapter's business (docs/srpm.md, "Direct-mode loss":
nftables counters the agent installs, ``sixlab.linux.nftcount``); this module only does
the arithmetic, on values handed in.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["COUNTER_MODULUS", "DataCounters", "DataLoss", "data_loss", "data_loss_total"]

#: The Direct Measurement TLV's counters are 32-bit (RFC 8972 §4.5).
COUNTER_MODULUS = 1 << 32


@dataclass(frozen=True, slots=True)
class DataCounters:
    """The data-flow counters known for one test packet and its reply."""

    s_txc: int  # data packets the Session-Sender had sent at T1 (on the wire)
    r_rxc: int  # data packets the Session-Reflector had received (on the wire)
    r_txc: int  # data packets the Session-Reflector had sent, reverse flow (on the wire)
    s_rxc: int | None = None  # reverse-flow packets the Session-Sender had received at T4


@dataclass(frozen=True, slots=True)
class DataLoss:
    """Data loss between two test packets (T1 of the first and of the second)."""

    start_ns: int
    end_ns: int
    forward_sent: int
    forward_lost: int
    backward_sent: int
    #: None when the Session-Sender counts no reverse flow (S_RxC unknown).
    backward_lost: int | None

    @property
    def forward_ratio(self) -> float | None:
        return self.forward_lost / self.forward_sent if self.forward_sent else None

    @property
    def backward_ratio(self) -> float | None:
        if self.backward_lost is None or not self.backward_sent:
            return None
        return self.backward_lost / self.backward_sent


def _delta(new: int, old: int) -> int:
    return (new - old) % COUNTER_MODULUS


def _signed(value: int) -> int:
    """A difference of two modular differences, read as the nearer signed value."""
    value %= COUNTER_MODULUS
    return value - COUNTER_MODULUS if value >= COUNTER_MODULUS // 2 else value


def _between(t0: int, a: DataCounters, t1: int, b: DataCounters) -> DataLoss:
    forward_sent = _delta(b.s_txc, a.s_txc)
    backward_sent = _delta(b.r_txc, a.r_txc)
    backward_lost = None
    if a.s_rxc is not None and b.s_rxc is not None:
        backward_lost = _signed(backward_sent - _delta(b.s_rxc, a.s_rxc))
    return DataLoss(
        start_ns=t0,
        end_ns=t1,
        forward_sent=forward_sent,
        forward_lost=_signed(forward_sent - _delta(b.r_rxc, a.r_rxc)),
        backward_sent=backward_sent,
        backward_lost=backward_lost,
    )


def data_loss(samples: Iterable[tuple[int, int, DataCounters]]) -> list[DataLoss]:
    """Loss per interval from ``(seq, t1_ns, counters)`` samples, one per reply.

    Samples are taken in Seq order; each interval joins two consecutive samples (a
    lost test packet makes the interval span two send intervals, it loses no data).
    """
    ordered = sorted(samples, key=lambda s: s[0])
    return [_between(t0, a, t1, b) for (_, t0, a), (_, t1, b) in itertools.pairwise(ordered)]


def data_loss_total(samples: Iterable[tuple[int, int, DataCounters]]) -> DataLoss | None:
    """Loss from the first sample to the last (None with fewer than two)."""
    intervals = data_loss(samples)
    if not intervals:
        return None
    backward = [i.backward_lost for i in intervals]
    return DataLoss(
        start_ns=intervals[0].start_ns,
        end_ns=intervals[-1].end_ns,
        forward_sent=sum(i.forward_sent for i in intervals),
        forward_lost=sum(i.forward_lost for i in intervals),
        backward_sent=sum(i.backward_sent for i in intervals),
        backward_lost=None if None in backward else sum(b or 0 for b in backward),
    )
