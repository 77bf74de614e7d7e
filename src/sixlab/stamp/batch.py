"""A batch entry point to the Session-Reflector: N probes in, N replies out, with NumPy.

Theory of operation
-------------------
``Reflector.reflect`` is the readable reference: one packet, one reply. A user-space
data plane that reads many probes per wake-up (an AF_XDP or TPACKET ring) spends most
of its Python time on the per-packet overhead of that call, not on STAMP. The work of
an unauthenticated reply is all fixed-offset fields (RFC 8762 §4.2.1 and §4.3.1), so it
vectorises: ``BatchReflector.reflect`` takes the UDP payloads of a batch as the rows of
an ``(n, L)`` ``uint8`` array (all of one size ``L``) and does, once per batch,

1. the session lookup: the SSIDs (bytes 14:16, RFC 8972 §3) of the batch, the distinct
   ones looked up in the reflector's tables exactly as ``reflect`` does (an
   unauthenticated session of that SSID, else the default session);
2. the drops ``reflect`` makes, counted under the same ``DropReason`` in the same
   counters: no session, Error Estimate Multiplier 0 (RFC 4656 §4.1.2);
3. the reply fields as NumPy columns of a structured array in the reflector layout:
   Seq (the sender's, or the session's own count in arrival order when stateful, RFC
   8762 §4.3.1), Error Estimate, SSID, T2 (converted to NTP or PTP per session), the
   sender's Seq, Timestamp and Error Estimate, Ses-Sender TTL (the Hop Limit);
4. a TLV area made only of Extra Padding TLVs (RFC 8972 §4.1) copied back with U
   cleared, as ``reflect`` does; the TLV layout is read from the first row and every
   row with the same layout takes it.

T3 is left out: the caller reads the clock once, as late as the batch allows (after
the frames are built, right before they are handed to the kernel), and writes it with
``BatchReflection.set_t3`` (RFC 8762 §4.3: T3 as close to transmission as possible).
Every reply of the batch then carries the same T3; the error this adds to a reply's
T3 is at most the time from that clock reading to the moment the reply is on the wire,
which under load is the kernel's transmit of the batch (docs/design-notes.md and
benchmarks/README.md give the measured figure).

Rows the batch does not answer itself go to the reference, in arrival order, through
the ``fallback(i)`` callable (which calls ``Reflector.reflect`` with the packet's
context): payloads shorter than the base packet (RFC 8762 §4.6), possibly
authenticated ones (the reflector has an authenticated session and the payload is long
enough to be one), and TLV areas that are not the first row's Extra Padding layout.
Rows are taken in runs between the fallback rows, so a stateful session counts its
replies in arrival order exactly as the reference does.

The result: the same replies, byte for byte, as calling ``Reflector.reflect`` on every
row with a clock that returns the T3 given to ``set_t3``, and the same counters
(tests/unit/test_stamp_batch.py checks both).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from sixlab.stamp._events import DropReason, DuplicateReceived, PacketLost, StampResult
from sixlab.stamp.reflector import Reflection, Reflector, ReturnPath, _Session
from sixlab.stamp.sender import SenderConfig, SenderSession, State, _Input
from sixlab.wire import WireError
from sixlab.wire import stamp as wire
from sixlab.wire.stamp_tlv import TlvFlag, TlvType
from sixlab.wire.timestamp import (
    NTP_MAX_NS,
    NTP_UNIX_OFFSET_S,
    ErrorEstimate,
    TimestampFormat,
    encode_timestamp,
)

__all__ = [
    "REFLECTOR_DTYPE",
    "SENDER_DTYPE",
    "BatchReflection",
    "BatchReflector",
    "due_seq",
    "loop_state",
    "receive_batch",
    "receive_one",
    "receive_record",
    "send_due",
    "send_template",
    "sent_at",
]

U8 = npt.NDArray[np.uint8]
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

_UNAUTH = wire.UNAUTH_PACKET_SIZE
_AUTH = wire.AUTH_PACKET_SIZE
_NS = 1_000_000_000
_TLV_HEADER = 4

#: RFC 8762 §4.2.1 Session-Sender packet, unauthenticated (with the SSID of RFC 8972 §3).
SENDER_DTYPE = np.dtype(
    {
        "names": ["seq", "ts", "ee", "ssid"],
        "formats": [">u4", ">u8", ">u2", ">u2"],
        "offsets": [0, 4, 12, 14],
        "itemsize": _UNAUTH,
    }
)
#: RFC 8762 §4.3.1 Session-Reflector packet, unauthenticated (``wire.REFLECTOR_UNAUTH``).
REFLECTOR_DTYPE = np.dtype(
    {
        "names": ["seq", "t3", "ee", "ssid", "t2", "sseq", "sts", "see", "ttl"],
        "formats": [">u4", ">u8", ">u2", ">u2", ">u8", ">u4", ">u8", ">u2", "u1"],
        "offsets": [0, 4, 12, 14, 16, 24, 28, 36, 40],
        "itemsize": _UNAUTH,
    }
)

_EXTRA_PADDING = int(TlvType.EXTRA_PADDING)
_Z_BIT = 0x4000  # Error Estimate: the timestamp is PTP (RFC 8762 §4.2.1)
_ERA_S = 1 << 32
_HALF_ERA_S = 1 << 31
_U = int(TlvFlag.U)


def _ntp(utc_ns: I64) -> U64:
    """``_Session.timestamp`` for NTP, on an array (the same arithmetic, RFC 5905 §6).

    ``np.divmod``, not ``//``: NumPy's integer floor division by a scalar costs some
    12 µs per call here whatever the size (measured), divmod about 1 µs.
    """
    sec, nsec = np.divmod(utc_ns.astype(np.uint64), np.uint64(_NS))
    frac, _ = np.divmod((nsec << np.uint64(32)) + np.uint64(_NS // 2), np.uint64(_NS))
    era = (sec + np.uint64(NTP_UNIX_OFFSET_S)) & np.uint64(0xFFFF_FFFF)
    out: U64 = (era << np.uint64(32)) | frac
    return out


def _ptp(tai_ns: I64) -> U64:
    """``ptp_from_ns`` on an array (IEEE 1588 truncated: seconds, nanoseconds)."""
    sec, nsec = np.divmod(tai_ns.astype(np.uint64), np.uint64(_NS))
    out: U64 = (sec << np.uint64(32)) | nsec
    return out


def _timestamps(sess: _Session, utc_ns: I64) -> U64:
    if sess.ptp:
        return _ptp(utc_ns + np.int64(sess.config.tai_utc_offset_ns))
    return _ntp(utc_ns)


@dataclass(slots=True)
class BatchReflection:
    """The replies of one batch.

    ``replies``: ``(n, L)`` ``uint8``, row ``i`` the reply to probe ``i`` when
    ``answered[i]`` (its T3 zero until ``set_t3``), else meaningless. ``fallback``:
    ``Reflection`` (or None: dropped) of the rows the reference answered, by row.
    ``route_of[i]``: index into ``routes`` of the return path of an answered row.
    """

    replies: U8
    answered: npt.NDArray[np.bool_]
    route_of: npt.NDArray[np.intp]
    routes: list[ReturnPath]
    fallback: dict[int, Reflection | None] = field(default_factory=dict)
    _sessions: list[_Session] = field(default_factory=list)
    _sess_of: npt.NDArray[np.intp] = field(default_factory=lambda: np.empty(0, np.intp))

    def set_t3(self, t3_ns: int) -> None:
        """Write T3 (Unix-epoch UTC ns, one clock reading) into every batch reply."""
        if not self._sessions:
            return
        values = np.array([s.timestamp(t3_ns) for s in self._sessions], ">u8")
        mask = self.answered
        if mask.all():
            self.replies[:, 4:12] = values[self._sess_of].view(np.uint8).reshape(-1, 8)
        else:
            wire_t3 = values[self._sess_of[mask]].view(np.uint8).reshape(-1, 8)
            self.replies[mask, 4:12] = wire_t3


class BatchReflector:
    """``Reflector.reflect`` over a batch (module doc); same sessions, same counters."""

    def __init__(self, reflector: Reflector) -> None:
        self.reflector = reflector

    def reflect(
        self,
        payloads: U8,
        t2_ns: I64,
        hop_limits: U8,
        fallback: Callable[[int], Reflection | None],
        flows: U8 | None = None,
    ) -> BatchReflection:
        """Answer the rows of ``payloads`` (``(n, L)`` uint8, one UDP payload each).

        ``t2_ns``: arrival times (UTC ns), ``hop_limits``: the Hop Limits they arrived
        with, ``flows``: each packet's flow key as a row of bytes (``Received.flow``'s
        layout: addresses, then ports; None: every packet without a flow key). Row
        ``i``'s key is ``bytes(flows[i])``, the ``flow=`` that ``Reflector.reflect`` would
        be given, so the two paths keep the same per-flow state (RFC 8972 §3: a session
        is the SSID with the addresses and ports). ``fallback(i)`` must answer row ``i``
        with ``Reflector.reflect`` (the packet's context, ``flow=bytes(flows[i])``); it
        is called in arrival order for the rows this batch does not take (module doc).
        """
        n, size = payloads.shape
        replies = np.zeros((n, size), np.uint8)
        answered = np.zeros(n, np.bool_)
        route_of = np.full(n, -1, np.intp)
        out = BatchReflection(replies, answered, route_of, [])
        if n == 0:
            return out
        refl = self.reflector
        default = refl._default
        auth_possible = bool(refl._auth) or (default is not None and default.config.key is not None)
        if size < _UNAUTH or (size >= _AUTH and auth_possible):
            for i in range(n):
                out.fallback[i] = fallback(i)
            return out
        rows = np.ones(n, np.bool_)
        pads: list[int] = []
        if size > _UNAUTH:
            pads = _padding_layout(payloads[0, _UNAUTH:])
            if not pads:
                rows[:] = False
            else:
                same = np.ones(n, np.bool_)
                for pos in pads:  # Type and Length equal to the first row's
                    head = payloads[:, _UNAUTH + pos + 1 : _UNAUTH + pos + _TLV_HEADER]
                    same &= (head == payloads[0, _UNAUTH + pos + 1 : _UNAUTH + pos + 4]).all(1)
                rows = same
        state = _RunState(out)
        if rows.all():
            self._run(payloads, t2_ns, hop_limits, 0, n, pads=pads, state=state, flows=flows)
        else:
            start = 0
            for i in np.flatnonzero(~rows).tolist():
                if start < i:
                    self._run(
                        payloads, t2_ns, hop_limits, start, i, pads=pads, state=state, flows=flows
                    )
                out.fallback[i] = fallback(i)
                start = i + 1
            if start < n:
                self._run(
                    payloads, t2_ns, hop_limits, start, n, pads=pads, state=state, flows=flows
                )
        out._sessions = state.sessions
        out._sess_of = state.sess_of
        return out

    def _run(
        self,
        payloads: U8,
        t2_ns: I64,
        hop_limits: U8,
        lo: int,
        hi: int,
        *,
        pads: list[int],
        state: _RunState,
        flows: U8 | None,
    ) -> None:
        """Answer rows ``lo:hi`` of the batch, all of them batch rows (module doc):
        column-wise steps, each over the whole run."""
        refl = self.reflector
        count = hi - lo
        refl.counters.received += count
        probes = np.ascontiguousarray(payloads[lo:hi, :_UNAUTH]).view(SENDER_DTYPE)[:, 0]
        ssids = probes["ssid"]
        sess_idx, present = _run_sessions(refl, state, ssids)
        found = sess_idx >= 0
        zero_mult = found & ((probes["ee"] & 0xFF) == 0)
        if zero_mult.any():
            for j in present:
                n_zero = int((zero_mult & (sess_idx == j)).sum())
                if n_zero:
                    _count_drop(refl, state.sessions[j], DropReason.MULTIPLIER_ZERO, n_zero)
        ok = found & ~zero_mult
        seq = _run_flows(state, probes, sess_idx, ok, None if flows is None else flows[lo:hi])
        if not ok.any():
            state.extend(lo, sess_idx)
            return
        reply = np.zeros(count, REFLECTOR_DTYPE)
        reply["ssid"] = ssids
        reply["sseq"] = probes["seq"]
        reply["sts"] = probes["ts"]
        reply["see"] = probes["ee"]
        reply["ttl"] = hop_limits[lo:hi]
        reply["seq"] = seq
        _run_sender_fields(state, reply, t2_ns[lo:hi], sess_idx, ok, present=present, lo=lo)
        refl.counters.reflected += int(ok.sum())
        state.out.answered[lo:hi] = ok
        out = state.out.replies
        out[lo:hi, :_UNAUTH] = reply.view(np.uint8).reshape(count, _UNAUTH)
        if pads:
            out[lo:hi, _UNAUTH:] = payloads[lo:hi, _UNAUTH:]
            for pos in pads:
                out[lo:hi, _UNAUTH + pos] &= 0xFF ^ _U
        if not ok.all():
            out[lo:hi][~ok] = 0
            state.out.route_of[lo:hi][~ok] = -1
        state.extend(lo, sess_idx)


def _run_sessions(
    refl: Reflector, state: _RunState, ssids: npt.NDArray[Any]
) -> tuple[npt.NDArray[np.intp], list[int]]:
    """Each row's session index in ``state`` (-1: dropped, counted), and the indices
    present in first-seen order."""
    count = len(ssids)
    first = int(ssids[0])
    if (ssids == first).all():
        distinct = [first]
        inverse = np.zeros(count, np.intp)
    else:
        uniq, inverse = np.unique(ssids, return_inverse=True)
        distinct = uniq.tolist()
    default = refl._default
    if default is not None and default.config.key is not None:
        default = None
    sess_idx = np.full(count, -1, np.intp)
    present: list[int] = []  # session indices of this run, first-seen order
    for k, ssid in enumerate(distinct):
        sess = refl._unauth.get(ssid)
        mask = inverse == k
        if sess is None:
            auth = refl._auth.get(ssid)
            if auth is not None:  # an unauthenticated packet of an authenticated SSID
                _count_drop(refl, auth, DropReason.AUTH_REQUIRED, int(mask.sum()))
                continue
            sess = default
        if sess is None:
            _count_drop(refl, None, DropReason.NO_SESSION, int(mask.sum()))
            continue
        j = state.index(sess)
        sess_idx[mask] = j
        if j not in present:
            present.append(j)
    return sess_idx, present


def _run_flows(
    state: _RunState,
    probes: npt.NDArray[Any],
    sess_idx: npt.NDArray[np.intp],
    ok: npt.NDArray[np.bool_],
    flows: U8 | None,
) -> npt.NDArray[np.uint32]:
    """Per flow (SSID + addresses + ports): packets received, the stateful Seq,
    replies sent — Reflector.reflect's FlowState, in arrival order. The rows' reply
    Seq (the probe's own where the session is stateless)."""
    ssids = probes["ssid"]
    count = len(ssids)
    found = sess_idx >= 0
    seq = probes["seq"].astype(np.uint32)
    keys = ssids.astype(">u2").view(np.uint8).reshape(count, 2)
    if flows is not None:
        keys = np.concatenate([keys, flows], axis=1)
    if found.all() and (keys == keys[0]).all():
        groups: list[npt.NDArray[np.intp]] = [np.arange(count)]
    else:
        rows_found = np.flatnonzero(found)
        if len(rows_found):
            _, firsts, inv = np.unique(
                keys[rows_found], axis=0, return_index=True, return_inverse=True
            )
            inv = inv.ravel()
            groups = [rows_found[inv == g] for g in np.argsort(firsts).tolist()]
        else:
            groups = []
    for rows in groups:
        head = int(rows[0])
        sess = state.sessions[int(sess_idx[head])]
        flow_key = None if flows is None else keys[head][2:].tobytes()
        flow = sess.flow((int(ssids[head]), flow_key))
        flow.received += len(rows)
        good = rows[ok[rows]]
        k = len(good)
        if not sess.stateless and k:
            seq[good] = (flow.next_seq + np.arange(k, dtype=np.uint64)) & 0xFFFF_FFFF
            flow.next_seq = (flow.next_seq + k) & 0xFFFF_FFFF
        flow.transmitted += k
    return seq


def _run_sender_fields(
    state: _RunState,
    reply: npt.NDArray[Any],
    t2_ns: I64,
    sess_idx: npt.NDArray[np.intp],
    ok: npt.NDArray[np.bool_],
    *,
    present: list[int],
    lo: int,
) -> None:
    """T2, the error estimate and the return route of the answered rows, from their
    sessions; counts each session's reflections."""
    route_of = state.out.route_of
    hi = lo + len(reply)
    if len(present) == 1:  # one session (the common case): whole columns
        sess = state.sessions[present[0]]
        reply["t2"] = _timestamps(sess, t2_ns)
        reply["ee"] = sess.ee_int
        sess.reflected += int(ok.sum())
        route_of[lo:hi] = state.route_index(sess.return_path)
        return
    t2 = np.zeros(len(reply), np.uint64)
    ee = np.zeros(len(reply), np.uint16)
    for j in present:
        sess = state.sessions[j]
        mask = ok & (sess_idx == j)
        t2[mask] = _timestamps(sess, t2_ns[mask])
        ee[mask] = sess.ee_int
        sess.reflected += int(mask.sum())
        route_of[lo:hi][mask] = state.route_index(sess.return_path)
    reply["t2"] = t2
    reply["ee"] = ee


class _RunState:
    """What the runs of one batch share: its sessions and routes, in first-seen order."""

    def __init__(self, out: BatchReflection) -> None:
        self.out = out
        self.sessions: list[_Session] = []
        self._ids: dict[int, int] = {}
        self._routes: dict[int, int] = {}
        self._parts: list[tuple[int, npt.NDArray[np.intp]]] = []

    def index(self, sess: _Session) -> int:
        key = id(sess)
        j = self._ids.get(key)
        if j is None:
            j = self._ids[key] = len(self.sessions)
            self.sessions.append(sess)
        return j

    def route_index(self, route: ReturnPath) -> int:
        key = id(route)
        j = self._routes.get(key)
        if j is None:
            j = self._routes[key] = len(self.out.routes)
            self.out.routes.append(route)
        return j

    def extend(self, lo: int, sess_idx: npt.NDArray[np.intp]) -> None:
        """Rows ``lo:lo + len(sess_idx)`` are done, with these session indices."""
        self._parts.append((lo, sess_idx))

    @property
    def sess_of(self) -> npt.NDArray[np.intp]:
        """The session index of every row (-1: fallback or dropped)."""
        if len(self._parts) == 1 and len(self._parts[0][1]) == len(self.out.answered):
            return self._parts[0][1]
        full = np.full(len(self.out.answered), -1, np.intp)
        for lo, part in self._parts:
            full[lo : lo + len(part)] = part
        return full


def _padding_layout(area: Any) -> list[int]:
    """Offsets of the TLV headers of ``area`` if it is Extra Padding TLVs only, tiled
    exactly (RFC 8972 §4.1); an empty list otherwise."""
    data = bytes(area)
    end = len(data)
    pos = 0
    out: list[int] = []
    while pos < end:
        if pos + _TLV_HEADER > end or data[pos + 1] != _EXTRA_PADDING:
            return []
        out.append(pos)
        pos += _TLV_HEADER + int.from_bytes(data[pos + 2 : pos + 4], "big")
    return out if pos == end else []


def _count_drop(refl: Reflector, sess: _Session | None, reason: DropReason, k: int) -> None:
    """``Reflector._drop`` for ``k`` packets at once."""
    drops = refl.counters.dropped
    drops[reason] = drops.get(reason, 0) + k
    if sess is not None:
        sess.dropped[reason] = sess.dropped.get(reason, 0) + k


# ------------------------------------------------------------------------ the sender


def _ns_from_ntp(ts: U64) -> I64:
    """``ns_from_ntp`` on an array: the RFC 4330 §3 era pivot, rounding, the clamp."""
    seconds = (ts >> np.uint64(32)).astype(np.int64)
    fraction = ts & np.uint64(0xFFFF_FFFF)
    seconds = np.where(seconds & _HALF_ERA_S, seconds, seconds + _ERA_S)
    sub = ((fraction * np.uint64(_NS) + np.uint64(1 << 31)) >> np.uint64(32)).astype(np.int64)
    ns = (seconds - NTP_UNIX_OFFSET_S) * _NS + sub
    out: I64 = np.minimum(ns, NTP_MAX_NS - 1)
    return out


def _ns_from_ptp(ts: U64) -> tuple[I64, npt.NDArray[np.bool_]]:
    """``ns_from_ptp`` on an array, and which rows it would refuse (nanoseconds >= 10^9)."""
    seconds = (ts >> np.uint64(32)).astype(np.int64)
    nanos = (ts & np.uint64(0xFFFF_FFFF)).astype(np.int64)
    return seconds * _NS + nanos, nanos >= _NS


def _to_utc(ts: U64, ptp: npt.NDArray[np.bool_], tai_utc_ns: int) -> tuple[I64, Any]:
    """``SenderSession._to_utc`` per row (PTP rows where ``ptp``); rows it would refuse."""
    ntp = _ns_from_ntp(ts)
    if not ptp.any():
        return ntp, np.zeros(len(ts), np.bool_)
    tai, bad = _ns_from_ptp(ts)
    out: I64 = np.where(ptp, tai - tai_utc_ns, ntp)
    return out, ptp & bad


def receive_batch(
    session: SenderSession, payloads: U8, t4_ns: I64, now_ns: I64 | None = None
) -> None:
    """``session.receive(payloads[i], now_ns[i], t4_ns[i])`` for every row in order, with
    the fixed fields decoded as arrays (RFC 8762 §4.3.1 layout): the same events, the same
    counters. ``now_ns``: the rows' arrival on the session's timer clock (None: T4).

    An authenticated session, or payloads shorter than the base packet, take the
    reference per row (the HMAC is per packet anyway).
    """
    n, size = payloads.shape
    cfg = session.config
    nows = (t4_ns if now_ns is None else now_ns).tolist()
    if cfg.authenticated or size < _UNAUTH:
        for i in range(n):
            session.receive(payloads[i].tobytes(), nows[i], int(t4_ns[i]))
        return
    fields = np.ascontiguousarray(payloads[:, :_UNAUTH]).view(REFLECTOR_DTYPE)[:, 0]
    ree = fields["ee"].astype(np.int64)
    see = fields["see"].astype(np.int64)
    offset = cfg.tai_utc_offset_ns
    t1, bad1 = _to_utc(fields["sts"].astype(np.uint64), (see & _Z_BIT) != 0, offset)
    t2, bad2 = _to_utc(fields["t2"].astype(np.uint64), (ree & _Z_BIT) != 0, offset)
    t3, bad3 = _to_utc(fields["t3"].astype(np.uint64), (ree & _Z_BIT) != 0, offset)
    bad = bad1 | bad2 | bad3
    rows = zip(
        t4_ns.tolist(), fields["ssid"].tolist(), ree.tolist(), see.tolist(),
        fields["sseq"].tolist(), fields["seq"].tolist(), fields["ttl"].tolist(),
        t1.tolist(), t2.tolist(), t3.tolist(), bad.tolist(),
        strict=True,
    )  # fmt: skip
    estimates: dict[int, ErrorEstimate] = {}
    tlv_area = size > _UNAUTH
    for i, (now, ssid, r_ee, _s_ee, seq, rseq, ttl, t1_ns, t2_ns, t3_ns, bad_ts) in enumerate(rows):
        # SenderSession.receive and _match, with the decoding done above.
        if session.state not in (State.RUNNING, State.DRAINING):
            session._drop(DropReason.NOT_RUNNING)
            continue
        session._expire(nows[i])
        ssid_zero = False
        if ssid != cfg.ssid:
            refused = DropReason.NO_SESSION if ssid != 0 else session.ssid_zero_refused()
            if refused is not None:
                session._drop(refused)
                session._maybe_drained()
                continue
            ssid_zero = True  # an RFC 8762-only reflector (RFC 8972 §3)
        if not r_ee & 0xFF:
            session._drop(DropReason.MULTIPLIER_ZERO)
        else:
            tlvs = payloads[i, _UNAUTH:].tobytes() if tlv_area else b""
            row = (now, seq, rseq, ttl, r_ee, t1_ns, t2_ns, t3_ns, bad_ts)
            _match_fields(session, row, tlvs=tlvs, estimates=estimates, ssid_zero=ssid_zero)
        session._maybe_drained()


def _match_fields(
    session: SenderSession,
    row: tuple[int, int, int, int, int, int, int, int, bool],
    *,
    tlvs: bytes,
    estimates: dict[int, ErrorEstimate],
    ssid_zero: bool,
) -> None:
    """The rest of ``SenderSession._match`` for one decoded reflected packet."""
    now, seq, rseq, ttl, r_ee, echoed_t1, t2, t3, bad_ts = row
    cfg = session.config
    t1 = session._outstanding.get(seq)
    if t1 is None:
        session._unmatched(seq)
        return
    if bad_ts or echoed_t1 != t1:
        session._drop(DropReason.BAD_TIMESTAMP)
        return
    del session._outstanding[seq]
    session._remember_answered(seq)
    counters = session.counters
    counters.received += 1
    if ssid_zero:
        counters.ssid_zero += 1
    if session._highest_seq is not None and seq < session._highest_seq:
        counters.reordered += 1
    else:
        session._highest_seq = seq
        if cfg.reflector_stateful:
            counters.forward_lost = max(0, seq - rseq)
            above = session._lost_above
            while above and above[0] <= seq:
                above.popleft()
            counters.unclassified_lost = len(above)
    estimate = estimates.get(r_ee)
    if estimate is None:
        estimate = estimates[r_ee] = ErrorEstimate.from_int(r_ee)
    # Positional: a keyword call of the 14-field dataclass took three times as long
    # (0.82 against 0.28 µs, timeit; benchmarks/README.md, "One sender agent").
    session._events.append(
        # ssid, seq, T1, T2, T3, T4, sender and reflector error, TTL, reflector Seq, TLVs
        StampResult(cfg.ssid, seq, t1, t2, t3, now, session._ee, estimate, ttl, rseq, tlvs)
    )


# ------------------------------------------------------- the sender, packet by packet
#
# An engine with thousands of sessions serves a handful of them per wake-up, one packet
# each: too few rows for arrays (a NumPy call costs about a microsecond whatever its
# size). What it can save is the per-packet objects of the reference, the
# ``SenderPacket`` and ``ReflectorPacket`` dataclasses with their field checks, the
# ``ErrorEstimate`` of every reply and the ``PacketSent`` event: ``send_due`` writes Seq
# and T1 into the session's fixed packet (RFC 8762 §4.2.1: nothing else of an
# unauthenticated packet without a Direct Measurement TLV changes between packets),
# ``receive_one`` reads a reply with one ``struct`` call. Both keep the session's state,
# counters, events and records exactly as ``handle_timer`` and ``receive`` do
# (tests/unit/test_stamp_batch.py checks it), but for the ``PacketSent`` events, which
# the adapter reports itself.

_HEAD = struct.Struct("!IQ")  # Seq, Timestamp: what send_due writes
_HALF = 1 << 31  # half an NTP fraction unit's 2^32: rounds to nearest
#: ErrorEstimate by wire value: frozen, shared by every record that carries it.
_ESTIMATES: dict[int, ErrorEstimate] = {}


def send_template(config: SenderConfig) -> bytes | None:
    """The fixed part of the session's packets after Seq and Timestamp (Error Estimate,
    SSID, MBZ, TLVs), or None when its packets differ otherwise or its replies need the
    reference: authenticated (HMAC per packet), loopback, flow labels (records carry the
    label), a Direct Measurement TLV (S_TxC per packet, counters in the records)."""
    if config.authenticated or config.loopback or config.flow_labels:
        return None
    if config.direct_measurement:
        return None
    head = wire.SENDER_UNAUTH.pack(0, 0, config.effective_error_estimate.to_int(), config.ssid)
    return head[_HEAD.size :] + config.tlvs


def send_due(session: SenderSession, template: bytes, now: int, wall: int) -> bytes | None:
    """``session.handle_timer(now, wall)`` with ``template`` (``send_template``): the
    same state, counters and events but ``PacketSent``; the packet it sent (at most one:
    the core never bursts) is returned instead of queued for ``datagrams_to_send``."""
    seq = due_seq(session, now, wall)
    if seq is None:
        return None
    cfg = session.config
    ptp = cfg.fmt is TimestampFormat.PTP
    stamp = encode_timestamp(wall + cfg.tai_utc_offset_ns if ptp else wall, cfg.fmt)
    return _HEAD.pack(seq, stamp) + template


def due_seq(session: SenderSession, now: int, wall: int) -> int | None:
    """``send_due`` without the packet: the Seq of the packet the timer sends (None:
    none), recorded as sent at ``wall``. A caller that writes T1 into the packet itself
    later (a batched send, one clock reading right before it) reports that T1 with
    ``sent_at`` before any reply can come."""
    out = None
    cfg = session.config
    due = session._next_send_ns
    if session.state is State.RUNNING and due is not None and due <= now:
        if (cfg.count is not None and session._next_seq >= cfg.count) or (
            session._end_ns is not None and due >= session._end_ns
        ):
            session._next_send_ns = None
            session._transition(_Input.STOP)
        else:
            out = seq = session._take_seq()
            session._outstanding[seq] = wall
            session._deadlines.append((now + cfg.loss_timeout_ns, seq))
            session.counters.sent += 1
            session._next_send_ns = due + ((now - due) // cfg.interval_ns + 1) * cfg.interval_ns
    session._expire(now)
    session._maybe_drained()
    return out


def sent_at(session: SenderSession, seq: int, t1: int) -> None:
    """The packet ``due_seq`` gave Seq ``seq`` left with T1 ``t1`` (Unix-epoch UTC ns,
    before the TAI offset of a PTP session): the T1 its reply must echo and its record
    carries."""
    if seq in session._outstanding:
        session._outstanding[seq] = t1


# ------------------------------------------------- the sender, in a compiled run loop
#
# A compiled run loop (``sixlab.dataplane.probeio.SendLoop``) may take over a running
# session's packets and replies: the schedule, the Seq counter, the packets outstanding
# (Seq -> T1, loss deadline) and the highest Seq answered live there, the answered
# bitmap stays the core's (written in place), and every outcome comes back as a record
# that ``loop_record`` files exactly as ``due_seq``, ``receive_record`` and ``_expire``
# would. ``loop_handback`` returns the state when the session leaves the loop; from
# then on the core answers as before (tests/unit/test_send_loop.py checks both).

#: Record kinds of the run loop (``SL_*`` in sixlab/dataplane/probeio.c).
LOOP_SENT, LOOP_RESULT, LOOP_LOST, LOOP_DUP, LOOP_DROP, LOOP_EVICT = range(1, 7)
#: Its drop reasons (``SL_LATE`` ... in probeio.c), by code.
LOOP_DROPS = {
    1: DropReason.LATE,
    2: DropReason.UNKNOWN_SEQ,
    3: DropReason.BAD_TIMESTAMP,
    4: DropReason.MULTIPLIER_ZERO,
    5: DropReason.SSID_ZERO_STRAY,
}
#: The most packets a session in the loop may have outstanding (its window).
LOOP_WINDOW_MAX = 4096


@dataclass(frozen=True, slots=True)
class LoopState:
    """What a run loop takes over from a session (``loop_state``)."""

    next_send: int
    next_seq: int
    #: The packets outstanding, (Seq, T1, loss deadline), in the order they were sent.
    outstanding: list[tuple[int, int, int]]
    #: The highest Seq answered, -1 for none.
    highest: int
    #: Packets the window must hold: a power of two above loss timeout / interval + 2.
    window: int
    #: The core's answered bitmap (``DUPLICATE_WINDOW`` bits), for the loop to keep.
    answered: bytearray
    #: Whether a reply with the session's own SSID was answered (``echoed_ssid``).
    echoed: bool


def loop_state(session: SenderSession) -> LoopState | None:
    """The state a compiled run loop takes over, for a session it can run: running,
    a send scheduled, no count or duration (ends ``due_seq`` handles), no TLV (its
    replies are the 44-byte base packet, RFC 8762 §4.3.1), a stateless reflector (no
    loss classification, whose list of lost Seqs grows without bound), a loss timeout
    within ``LOOP_WINDOW_MAX`` intervals; None otherwise."""
    cfg = session.config
    due = session._next_send_ns
    if session.state is not State.RUNNING or due is None:
        return None
    if cfg.count is not None or cfg.duration_ns is not None or cfg.reflector_stateful:
        return None
    if cfg.tlvs or send_template(cfg) is None:
        return None
    need = cfg.loss_timeout_ns // cfg.interval_ns + 3
    window = 1 << (need - 1).bit_length()
    if window > LOOP_WINDOW_MAX:
        return None
    outstanding = session._outstanding
    out = [(seq, outstanding[seq], at) for at, seq in session._deadlines if seq in outstanding]
    highest = -1 if session._highest_seq is None else session._highest_seq
    return LoopState(
        due, session._next_seq, out, highest, window, session._answered, session.echoed_ssid
    )


def loop_hold(session: SenderSession) -> None:
    """The run loop took the session (``loop_state``): its packets outstanding are the
    loop's now, not the core's."""
    session._outstanding = {}
    session._deadlines.clear()


def loop_handback(
    session: SenderSession,
    next_send: int,
    next_seq: int,
    outstanding: list[tuple[int, int, int]],
    highest: int,
) -> None:
    """The session leaves the run loop: its next slot and Seq, the packets still
    outstanding (Seq, T1, loss deadline; in send order) and the highest Seq answered
    (-1: none) back to the core."""
    session._next_send_ns = next_send
    session._next_seq = next_seq & 0xFFFF_FFFF
    session._outstanding = {seq: t1 for seq, t1, _ in outstanding}
    session._deadlines.clear()
    session._deadlines.extend((at, seq) for seq, _, at in outstanding)
    session._highest_seq = None if highest < 0 else highest


def loop_record(session: SenderSession, record: tuple[int, ...]) -> None:
    """One record of the run loop for the session, as its fields come (``LOOP_OUT`` in
    sixlab.dataplane.probeio): T1, three times (a result's T2, T3, T4), the session's
    index, Seq, the reflector's Seq (a drop: its reason's code), its Error Estimate,
    the kind, Ses-Sender TTL. A packet sent (``LOOP_SENT``), a result (``LOOP_RESULT``,
    bit 7 set when it came reordered), a loss, a duplicate or a drop: the counters and
    events ``due_seq``, ``_expire`` and ``_match_fields`` make of it."""
    t1, t2, t3, t4, _, seq, rseq, r_ee, kind, ttl = record
    counters = session.counters
    base = kind & 0x7F
    if base == LOOP_SENT:
        counters.sent += 1
    elif base == LOOP_RESULT:
        counters.received += 1
        if kind & 0x80:
            counters.reordered += 1
        estimate = _ESTIMATES.get(r_ee)
        if estimate is None:
            estimate = _ESTIMATES[r_ee] = ErrorEstimate.from_int(r_ee)
        ssid = session.config.ssid
        session._events.append(
            StampResult(ssid, seq, t1, t2, t3, t4, session._ee, estimate, ttl, rseq, b"")
        )
    elif base == LOOP_LOST:
        counters.lost += 1
        session._events.append(PacketLost(session.config.ssid, seq, t1))
    elif base == LOOP_DUP:
        counters.duplicates += 1
        session._events.append(DuplicateReceived(session.config.ssid, seq))
    elif base == LOOP_DROP:
        session._drop(LOOP_DROPS[rseq])


def _utc(session: SenderSession, timestamp: int, ee: int) -> tuple[int, bool]:
    """``SenderSession._to_utc`` of a timestamp in the format of Error Estimate ``ee``,
    and whether the reference would refuse it. NTP, the common case, inline: the
    arithmetic of ``ns_from_ntp`` (RFC 4330 §3 era pivot) without its range check, which
    a 64-bit field always passes."""
    if ee & _Z_BIT:
        try:
            return session._to_utc(timestamp, TimestampFormat.PTP), False
        except WireError:
            return 0, True
    seconds = timestamp >> 32
    if not seconds & _HALF_ERA_S:
        seconds += _ERA_S
    ns = (seconds - NTP_UNIX_OFFSET_S) * _NS + (((timestamp & 0xFFFF_FFFF) * _NS + _HALF) >> 32)
    return min(ns, NTP_MAX_NS - 1), False


def receive_one(session: SenderSession, data: bytes, now: int, t4: int) -> None:
    """``session.receive(data, now, t4)`` for a session with a ``send_template``."""
    if session.state not in (State.RUNNING, State.DRAINING):
        session._drop(DropReason.NOT_RUNNING)
        return
    session._expire(now)
    if len(data) < _UNAUTH:
        session._drop(DropReason.TOO_SHORT)
        session._maybe_drained()
        return
    rseq, t3w, r_ee, ssid, t2w, seq, t1w, s_ee, ttl = wire.REFLECTOR_UNAUTH.unpack_from(data)
    t1, bad1 = _utc(session, t1w, s_ee)
    t2, bad2 = _utc(session, t2w, r_ee)
    t3, bad3 = _utc(session, t3w, r_ee)
    row = (t4, seq, rseq, ttl, r_ee, t1, t2, t3, bad1 or bad2 or bad3)
    _receive_row(session, ssid, row, data[_UNAUTH:])


def receive_record(
    session: SenderSession,
    now: int,
    t4: int,
    fields: tuple[int, int, int, int, int, int, int, int, int],
    tlvs: bytes,
) -> None:
    """``receive_one`` for a reply decoded elsewhere (the socket plane's batched path,
    ``sixlab.dataplane.probeio``) from at least the base packet's 44 bytes: ``fields``
    are the RFC 8762 §4.3.1 Seq, Error Estimate, SSID, the sender's Seq and Error
    Estimate, Ses-Sender TTL, then T1, T2, T3, each in Unix-epoch ns when its Error
    Estimate says NTP and the raw wire value when it says PTP (converted here, with the
    session's TAI offset, as ``receive_one`` converts it). ``tlvs``: the bytes after
    the base packet."""
    if session.state not in (State.RUNNING, State.DRAINING):
        session._drop(DropReason.NOT_RUNNING)
        return
    session._expire(now)
    rseq, r_ee, ssid, seq, s_ee, ttl, t1, t2, t3 = fields
    bad = False
    if s_ee & _Z_BIT:
        t1, bad = _utc(session, t1, s_ee)
    if r_ee & _Z_BIT:
        t2, bad2 = _utc(session, t2, r_ee)
        t3, bad3 = _utc(session, t3, r_ee)
        bad = bad or bad2 or bad3
    _receive_row(session, ssid, (t4, seq, rseq, ttl, r_ee, t1, t2, t3, bad), tlvs)


def _receive_row(
    session: SenderSession,
    ssid: int,
    row: tuple[int, int, int, int, int, int, int, int, bool],
    tlvs: bytes,
) -> None:
    """The rest of ``receive_one`` once the reply's fields are decoded (state checked,
    deadlines expired)."""
    cfg = session.config
    ssid_zero = False
    if ssid != cfg.ssid:
        refused = DropReason.NO_SESSION if ssid != 0 else session.ssid_zero_refused()
        if refused is not None:
            session._drop(refused)
            session._maybe_drained()
            return
        ssid_zero = True  # an RFC 8762-only reflector (RFC 8972 §3)
    if not row[4] & 0xFF:
        session._drop(DropReason.MULTIPLIER_ZERO)
    else:
        _match_fields(session, row, tlvs=tlvs, estimates=_ESTIMATES, ssid_zero=ssid_zero)
    session._maybe_drained()
