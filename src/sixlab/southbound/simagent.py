"""A simulated STAMP agent: the real StampAgent gRPC API, synthetic results at a set rate.

To measure the controller alone (how many results per second it stores, how far its
collection lags, how much memory it needs per session), agents must produce results
faster and more cheaply than real probes on a two-core machine can. The simulated agent
serves the same API as ``sixlab stamp agent`` (``stamp.proto``: GetAgentInfo, Init,
sessions, GetStampSessionResults, StreamResults, acknowledgements, counters), so the
controller cannot tell it from a real one, but sends no packet: a sender session's
records are computed from its schedule when they are read.

Records. A started sender session "sends" Seq k at T1 = start + k × interval (wall
clock) and "receives" its reflection ``delay`` later, so at time ``now`` every Seq with
T1 + delay <= now has arrived, except the lost ones (Seq k with ``k % loss_every ==
loss_every - 1`` when ``loss_every`` > 0; declared lost one loss timeout after T1).
Records are numbered 1, 2, … in Seq order; T2 − T1 and T4 − T3 vary with Seq (a fixed
pattern, so a test can recompute any record). Records stay available until
acknowledged, up to ``fifo_capacity`` unacknowledged ones (beyond that the oldest are
counted as overflow, as a real agent's FIFO does). Nothing is kept per record: memory
is constant per session, whatever the rate.

Messages. A StreamResults message is cut by the real agent's rules (session order,
``max_batch``, counters when due, the byte budget of ``sixlab.southbound.budget``). While
every session of a stream runs open-ended (started; no stop, count or duration) and the
message is well within the budget (the steady state), it is encoded for all its sessions
at once with NumPy, straight to the protobuf wire format (varint fields in field-number
order, as upb serializes them), and sent as those bytes; otherwise (a session stopped,
finished or gone, a message near the budget) it is built from message objects, one
session after another. Both give the same bytes (``tests/unit/test_simagent_wire.py``).

A reflector simulated agent keeps its sessions (create, start, stop, destroy) and
answers nothing else of note. ``GetAgentInfo.epoch`` is random per run, as a real
agent's: a restarted simulated agent has lost its sessions, and the controller
restores them.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

from sixlab.southbound._generated import stamp_pb2 as pb
from sixlab.southbound._generated import stamp_pb2_grpc as pb_grpc
from sixlab.southbound.agent import (
    _ROLE_PB,
    DEFAULT_BATCH,
    DEFAULT_BATCH_WINDOW_NS,
    DEFAULT_COUNTERS_INTERVAL_NS,
    DEFAULT_RESULTS,
    MAX_BATCH,
    MAX_MESSAGE_BYTES,
    MAX_RESULTS,
    MIN_INTERVAL_NS,
    AgentError,
    AgentServer,
    Role,
    _status_of,
    batch_reply,
)
from sixlab.southbound.agentinfo import info_sessions
from sixlab.southbound.budget import REPLY_BUDGET_BYTES, Batches, asked_budget, fit
from sixlab.southbound.rpcserver import abort_for, each, unary
from sixlab.stamp.sender import DEFAULT_LOSS_TIMEOUT_NS

__all__ = ["SimulatedAgentServicer", "add_simulated_to_server", "serve_simulated"]

#: The largest uint64: a field counted at its largest encoding.
_U64_MAX = 2**64 - 1

Code = grpc.StatusCode
NS_PER_S = 1_000_000_000
#: Forward and return delays: a base and a pattern repeating every 97 Seqs (ns).
BASE_DELAY_NS = 1_000_000
#: Reflector residence time T3 − T2 (ns).
RESIDENCE_NS = 20_000
#: How often a stream looks for new records when none were due (s).
_STREAM_TICK_S = 0.05

_unary = unary(_status_of)


def record_times(t1_ns: int, seq: int) -> tuple[int, int, int, int]:
    """T1..T4 of the simulated record of ``seq`` sent at ``t1_ns``."""
    forward = BASE_DELAY_NS + (seq * 7919) % 97 * 1000
    back = BASE_DELAY_NS + (seq * 104729) % 89 * 1000
    t2 = t1_ns + forward
    t3 = t2 + RESIDENCE_NS
    return t1_ns, t2, t3, t3 + back


U8 = npt.NDArray[np.uint8]
I64 = npt.NDArray[np.int64]

#: A varint of v takes 1 + (how many of these are <= v) bytes.
_VARINT_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], np.uint64)
_GROUP_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)
_GROUPS = np.arange(10)
#: A column of ``_fields``: (a one-byte tag of a varint field, its values), or bytes
#: every row carries as they are.
_Column = tuple[int, "npt.ArrayLike"] | bytes

# Wire tags (field number << 3 | wire type; stamp.proto): varint 0, length-delimited 2.
_TAG_BATCHES = 0x0A  # ResultBatches.batches = 1
_TAG_RESULTS = 0x12  # ResultBatch.results = 2
_TAG_COUNTERS = 0x3A  # ResultBatch.counters = 7
#: A simulated record's fields 7..11: its error estimates (S bit set, Multiplier 1:
#: RFC 8762 §4.2.1) and their bounds in ns, and the Ses-Sender TTL, the same in each.
_RECORD_CONSTANTS = pb.StampResult(
    sender_error_estimate=0x8001, sender_error_ns=1,
    reflector_error_estimate=0x8001, reflector_error_ns=1, ses_sender_ttl=255,
).SerializeToString()  # fmt: skip


def _varint_lengths(values: npt.NDArray[np.uint64]) -> I64:
    return np.searchsorted(_VARINT_LIMITS, values, side="right").astype(np.int64) + 1


def _fields(
    columns: Sequence[_Column], rows: int, *, frame: int = 0, extra: I64 | None = None
) -> tuple[U8, I64]:
    """Rows of protobuf fields, encoded: per row, column after column, the tag and the
    varint of its value, a zero value left out (proto3 encodes no default), or a column's
    constant bytes; with ``frame`` (a length-delimited field's tag), each row as an
    embedded message of that field: the tag and the row's length, counting ``extra``
    bytes of the row that the caller puts after these. The rows' bytes one after the
    other, and each row's length (its framing included, ``extra`` not)."""
    plan: list[tuple[int, npt.NDArray[np.uint64], I64, npt.NDArray[np.bool_], int] | bytes] = []
    size = np.zeros(rows, np.int64) if extra is None else extra.astype(np.int64)
    for column in columns:
        if isinstance(column, bytes):
            plan.append(column)
            size = size + len(column)
            continue
        tag, given = column
        values = np.broadcast_to(np.asarray(given, np.uint64), (rows,))
        lengths = _varint_lengths(values)
        present = values != 0
        plan.append((tag, values, lengths, present, int(lengths.max(initial=1))))
        size = size + np.where(present, lengths + 1, 0)
    if frame:
        total = size.astype(np.uint64)
        lengths = _varint_lengths(total)
        plan.insert(
            0, (frame, total, lengths, np.ones(rows, np.bool_), int(lengths.max(initial=1)))
        )
    # Each varint column as wide as its longest value: its tag, then its 7-bit groups.
    width = sum(len(p) if isinstance(p, bytes) else 1 + p[4] for p in plan)
    out = np.empty((rows, width), np.uint8)
    keep = np.empty((rows, width), np.bool_)
    at = 0
    for p in plan:
        if isinstance(p, bytes):
            out[:, at : at + len(p)] = np.frombuffer(p, np.uint8)
            keep[:, at : at + len(p)] = True
            at += len(p)
            continue
        tag, values, lengths, present, widest = p
        out[:, at] = tag
        keep[:, at] = present
        groups = out[:, at + 1 : at + 1 + widest]
        np.bitwise_and(
            values[:, None] >> _GROUP_SHIFTS[:widest], 0x7F, out=groups, casting="unsafe"
        )
        # The continuation bit on every group but a varint's last (its length's).
        within = keep[:, at + 1 : at + 1 + widest]
        np.less(_GROUPS[:widest], lengths[:, None] - 1, out=within)
        groups |= within.view(np.uint8) << 7
        np.less(_GROUPS[:widest], lengths[:, None], out=within)
        within &= present[:, None]
        at += 1 + widest
    return out[keep], keep.sum(axis=1)


def _interleave(parts: Sequence[tuple[U8, I64]]) -> bytes:
    """Row 0 of each part in turn, then row 1 of each, ...: each part is its rows' bytes
    one after the other and each row's length (as ``_fields`` returns them)."""
    source = np.concatenate([data for data, _ in parts])
    lengths = np.stack([n for _, n in parts], axis=1)
    bases = np.cumsum([0] + [len(data) for data, _ in parts[:-1]])
    starts = np.stack(
        [base + np.cumsum(n) - n for base, (_, n) in zip(bases, parts, strict=True)], axis=1
    )
    flat = lengths.ravel()
    placed = np.cumsum(flat) - flat
    index = np.repeat(starts.ravel() - placed, flat) + np.arange(int(flat.sum()))
    return source[index].tobytes()


@dataclass
class _SimSession:
    ssid: int
    role: Role
    interval_ns: int = 0
    count: int = 0
    duration_ns: int = 0
    loss_timeout_ns: int = DEFAULT_LOSS_TIMEOUT_NS
    #: Wall-clock ns of Seq 0 (None: not started), and of the stop (None: not stopped).
    start_ns: int | None = None
    stop_ns: int | None = None
    acked: int = 0
    overflow: int = 0
    fetched: int = 0

    def _sent_by(self, t_ns: int) -> int:
        """Seqs whose T1 is at or before t (the schedule, its count and duration)."""
        if self.start_ns is None or t_ns < self.start_ns:
            return 0
        end = t_ns if self.stop_ns is None else min(t_ns, self.stop_ns)
        n = (end - self.start_ns) // self.interval_ns + 1
        if self.count:
            n = min(n, self.count)
        if self.duration_ns:
            n = min(n, -(-self.duration_ns // self.interval_ns))
        return max(n, 0)

    def _schedule_over(self, now: int) -> bool:
        if self.start_ns is None:
            return False
        if self.stop_ns is not None and now >= self.stop_ns:
            return True
        last_slot = self.start_ns + (self._sent_by(now) - 1) * self.interval_ns
        capped = (self.count and self._sent_by(now) >= self.count) or (
            self.duration_ns and now - self.start_ns >= self.duration_ns
        )
        return bool(capped) and now >= last_slot

    def state(self, now: int) -> pb.SessionState.ValueType:
        if self.role is Role.REFLECTOR:
            if self.start_ns is None:
                return pb.SESSION_STATE_IDLE
            return (
                pb.SESSION_STATE_FINISHED if self.stop_ns is not None else pb.SESSION_STATE_RUNNING
            )
        if self.start_ns is None:
            return pb.SESSION_STATE_IDLE
        if not self._schedule_over(now):
            return pb.SESSION_STATE_RUNNING
        sent = self._sent_by(now)
        last_t1 = self.start_ns + (sent - 1) * self.interval_ns if sent else self.start_ns
        if now < last_t1 + self.loss_timeout_ns:
            return pb.SESSION_STATE_DRAINING
        return pb.SESSION_STATE_FINISHED

    def lost_in(self, seqs: int, loss_every: int) -> int:
        """Lost Seqs among the first ``seqs``."""
        return seqs // loss_every if loss_every else 0

    def arrived(self, now: int, loss_every: int) -> int:
        """Records (reflections received) by ``now``: their count is the last record id."""
        seqs = self._sent_by(now - 2 * BASE_DELAY_NS - 200_000)
        return seqs - self.lost_in(seqs, loss_every)

    def seq_of(self, record_id: int, loss_every: int) -> int:
        i = record_id - 1
        return i + i // (loss_every - 1) if loss_every > 1 else i

    def result(self, record_id: int, loss_every: int) -> pb.StampResult:
        assert self.start_ns is not None
        seq = self.seq_of(record_id, loss_every)
        t1, t2, t3, t4 = record_times(self.start_ns + seq * self.interval_ns, seq)
        return pb.StampResult(
            ssid=self.ssid, seq=seq, t1_ns=t1, t2_ns=t2, t3_ns=t3, t4_ns=t4,
            sender_error_estimate=0x8001, sender_error_ns=1,
            reflector_error_estimate=0x8001, reflector_error_ns=1,
            ses_sender_ttl=255, reflector_seq=seq, record_id=record_id,
        )  # fmt: skip


@dataclass
class _Sub:
    """One session on a StreamResults: the session object it began with, its cursor,
    when its counters are due next (ns)."""

    session: _SimSession | None
    cursor: int
    due: int = 0


_ACKED = attrgetter("acked")
_OVERFLOW = attrgetter("overflow")
_FETCHED = attrgetter("fetched")


class _Plain:
    """A stream's sessions while every one runs open-ended (started; no stop, count or
    duration): in the stream's order, with their cursors and counters' due times, as
    arrays, so that a message is cut for all of them at once. While a stream has one,
    these arrays, not its ``_Sub`` objects, hold its order, cursors and due times
    (``flush`` puts them back)."""

    def __init__(self, generation: int, subs: dict[int, _Sub]) -> None:
        self.generation = generation
        self.subs = list(subs.values())
        self.sessions: list[_SimSession] = [sub.session for sub in self.subs]  # type: ignore[misc]
        self.ssid = np.fromiter(subs, np.int64, len(subs))
        self.start = np.array([s.start_ns for s in self.sessions], np.int64)
        self.interval = np.array([s.interval_ns for s in self.sessions], np.int64)
        self.loss_timeout = np.array([s.loss_timeout_ns for s in self.sessions], np.int64)
        self.cursor = np.array([sub.cursor for sub in self.subs], np.int64)
        self.due = np.array([sub.due for sub in self.subs], np.int64)
        #: Position in the stream's order -> index in ``subs`` and ``sessions``.
        self.order = np.arange(len(subs))

    @staticmethod
    def fits(sessions: dict[int, _SimSession], subs: dict[int, _Sub]) -> bool:
        """Whether every session of ``subs`` is still its SSID's and runs open-ended."""
        for ssid, sub in subs.items():
            s = sub.session
            if (
                s is None
                or sessions.get(ssid) is not s
                or s.start_ns is None
                or s.stop_ns is not None
                or s.count
                or s.duration_ns
            ):
                return False
        return True

    def sent_by(self, t_ns: int | I64, at: I64 | slice = slice(None)) -> I64:
        """``_SimSession._sent_by`` of the sessions ``at`` (positions in the stream's
        order; all by default)."""
        sent: I64 = np.maximum((t_ns - self.start[at]) // self.interval[at] + 1, 0)
        return sent

    def flush(self, subs: dict[int, _Sub]) -> None:
        """The order, cursors and due times back into ``subs``."""
        subs.clear()
        for ssid, i, cursor, due in zip(
            self.ssid.tolist(), self.order.tolist(), self.cursor.tolist(), self.due.tolist(),
            strict=True,
        ):  # fmt: skip
            sub = self.subs[i]
            sub.cursor, sub.due = cursor, due
            subs[ssid] = sub


class _StreamState:
    """One StreamResults call's sessions: ``subs`` in the order they are served, and
    their arrays while they all run open-ended (``_Plain``)."""

    def __init__(self, subs: dict[int, _Sub]) -> None:
        self.subs = subs
        self.plain: _Plain | None = None
        #: (generation, sessions) when the sessions were last found not all open-ended.
        self.mixed: tuple[int, int] | None = None

    def __bool__(self) -> bool:
        return bool(self.subs)


class SimulatedAgentServicer(pb_grpc.StampAgentServicer):
    """The StampAgent service with synthetic sender sessions (module docstring)."""

    def __init__(
        self,
        role: Role | str = Role.SENDER,
        *,
        loss_every: int = 0,
        fifo_capacity: int = 100_000,
        clock: Callable[[], int] = time.time_ns,
        reply_budget: int = REPLY_BUDGET_BYTES,
    ) -> None:
        if loss_every == 1 or loss_every < 0:
            raise ValueError("loss_every: 0 (no loss) or at least 2")
        #: The largest results message sent, serialized (``sixlab.southbound.budget``).
        self.reply_budget = reply_budget
        self.role = Role(role)
        self.loss_every = loss_every
        self.fifo_capacity = fifo_capacity
        self._clock = clock
        self.epoch = secrets.randbits(64) or 1
        self.started_ns = clock()
        self._lock = threading.RLock()
        self._initialized = False
        self._port = 0
        self._sessions: dict[int, _SimSession] = {}
        #: Counts the changes of sessions by a call (create, start, stop, destroy, reset).
        self._generation = 0
        #: StreamResults yields its messages serialized (``add_simulated_to_server``
        #: sends them as they are); False: as ``ResultBatches`` objects.
        self.sends_bytes = False
        #: False: every StreamResults message cut one session after another (the two
        #: ways give the same messages; tests compare them).
        self.cuts_at_once = True

    # -- helpers ----------------------------------------------------------------------

    def _session(self, ssid: int) -> _SimSession:
        s = self._sessions.get(ssid)
        if s is None:
            raise AgentError(Code.NOT_FOUND, f"ssid: no session {ssid}")
        return s

    def _sender(self, call: str) -> None:
        if self.role is not Role.SENDER:
            raise AgentError(Code.FAILED_PRECONDITION, f"{call}: this agent is a reflector")
        if not self._initialized:
            raise AgentError(Code.FAILED_PRECONDITION, f"{call}: agent not initialised")

    def _take(
        self, s: _SimSession, after: int, limit: int, last: int, *, size: int, budget: int
    ) -> tuple[list[pb.StampResult], int]:
        """Records after ``after`` (never below the acknowledged ones) up to ``last``
        (what ``_trim`` returned), at most ``limit`` and as many as a message of ``size``
        bytes takes within ``budget`` (the real agent's rule,
        ``sixlab.southbound.budget``); and the bytes they add to the message."""
        first = max(after, s.acked) + 1
        upto = min(last, first + limit - 1)
        out, grown = fit(
            (s.result(i, self.loss_every) for i in range(first, upto + 1)), size, budget
        )
        s.fetched += len(out)
        return out, grown - size

    def _trim(self, s: _SimSession, now: int) -> int:
        """Count the records beyond the FIFO's capacity as overflow; the last id."""
        last = s.arrived(now, self.loss_every)
        floor = last - self.fifo_capacity
        if floor > s.acked:
            s.overflow += floor - s.acked
            s.acked = floor
        return last

    def _counters(self, s: _SimSession, now: int) -> pb.SessionCounters:
        if s.role is Role.REFLECTOR:
            return pb.SessionCounters(ssid=s.ssid, state=s.state(now))
        sent = s._sent_by(now)
        timed_out = s._sent_by(now - s.loss_timeout_ns)
        last = s.arrived(now, self.loss_every)
        return pb.SessionCounters(
            ssid=s.ssid,
            state=s.state(now),
            sent=sent,
            received=last,
            lost=s.lost_in(timed_out, self.loss_every),
            queued=max(0, last - s.acked),
            overflow=s.overflow,
            fetched=s.fetched,
        )

    # -- agent ------------------------------------------------------------------------

    @_unary
    def GetAgentInfo(self, request: pb.GetAgentInfoRequest) -> pb.GetAgentInfoReply:  # noqa: N802
        reply = pb.GetAgentInfoReply(
            role=_ROLE_PB[self.role],
            default_dataplane="simulated",
            available_dataplanes=["simulated"],
            initialized=self._initialized,
            dataplane="simulated" if self._initialized else "",
            port=self._port,
            epoch=self.epoch,
            started_ns=self.started_ns,
        )
        return info_sessions(reply, request, sorted(self._sessions))

    @_unary
    def Init(self, request: pb.InitRequest) -> pb.InitReply:  # noqa: N802
        if self._initialized:
            raise AgentError(Code.FAILED_PRECONDITION, "Init: already initialised (Reset first)")
        if request.dataplane not in ("", "simulated"):
            raise AgentError(Code.INVALID_ARGUMENT, f"dataplane: {request.dataplane!r} unknown")
        self._initialized = True
        default = 862 if self.role is Role.REFLECTOR else 50_000
        self._port = request.port if request.HasField("port") and request.port else default
        return pb.InitReply(port=self._port, dataplane="simulated")

    @_unary
    def Reset(self, _request: pb.ResetRequest) -> pb.ResetReply:  # noqa: N802
        return pb.ResetReply(sessions_destroyed=self.reset())

    def reset(self) -> int:
        """Destroy every session and forget the Init; how many sessions there were."""
        with self._lock:
            n = len(self._sessions)
            self._sessions.clear()
            self._generation += 1
            self._initialized = False
            self._port = 0
        return n

    @_unary
    def CreateStampSession(  # noqa: N802
        self, request: pb.CreateStampSessionRequest
    ) -> pb.CreateStampSessionReply:
        self._create(request)
        return pb.CreateStampSessionReply()

    @_unary
    def CreateStampSessions(self, request: pb.CreateStampSessionsRequest) -> pb.BatchReply:  # noqa: N802
        return batch_reply(each(_status_of, request.sessions, self._create))

    def _create(self, request: pb.CreateStampSessionRequest) -> None:
        if not self._initialized:
            raise AgentError(Code.FAILED_PRECONDITION, "CreateStampSession: not initialised")
        if not 0 <= request.ssid <= 0xFFFF:
            raise AgentError(Code.INVALID_ARGUMENT, f"ssid: {request.ssid} is not 0..65535")
        if request.ssid in self._sessions:
            raise AgentError(Code.ALREADY_EXISTS, f"ssid: session {request.ssid} exists")
        s = _SimSession(request.ssid, self.role)
        if self.role is Role.SENDER:
            if request.interval_ns < MIN_INTERVAL_NS:
                raise AgentError(Code.INVALID_ARGUMENT, f"interval_ns: at least {MIN_INTERVAL_NS}")
            s.interval_ns = request.interval_ns
            s.count = request.count
            s.duration_ns = request.duration_ns
            if request.loss_timeout_ns:
                s.loss_timeout_ns = request.loss_timeout_ns
        self._sessions[request.ssid] = s
        self._generation += 1

    @_unary
    def StartStampSession(  # noqa: N802
        self, request: pb.StartStampSessionRequest
    ) -> pb.StartStampSessionReply:
        self._start(request)
        return pb.StartStampSessionReply()

    @_unary
    def StartStampSessions(self, request: pb.StartStampSessionsRequest) -> pb.BatchReply:  # noqa: N802
        return batch_reply(each(_status_of, request.sessions, self._start))

    def _start(self, request: pb.StartStampSessionRequest) -> None:
        s = self._session(request.ssid)
        if s.start_ns is not None:
            raise AgentError(Code.FAILED_PRECONDITION, f"ssid: session {s.ssid} was started")
        s.start_ns = self._clock()
        self._generation += 1

    @_unary
    def StopStampSession(  # noqa: N802
        self, request: pb.StopStampSessionRequest
    ) -> pb.StopStampSessionReply:
        s = self._session(request.ssid)
        if s.start_ns is None or s.stop_ns is not None:
            raise AgentError(Code.FAILED_PRECONDITION, f"ssid: session {s.ssid} is not running")
        s.stop_ns = self._clock()
        self._generation += 1
        return pb.StopStampSessionReply()

    @_unary
    def DestroyStampSession(  # noqa: N802
        self, request: pb.DestroyStampSessionRequest
    ) -> pb.DestroyStampSessionReply:
        self._session(request.ssid)
        del self._sessions[request.ssid]
        self._generation += 1
        return pb.DestroyStampSessionReply()

    # -- results ----------------------------------------------------------------------

    @_unary
    def GetStampSessionResults(  # noqa: N802
        self, request: pb.GetStampSessionResultsRequest
    ) -> pb.GetStampSessionResultsReply:
        self._sender("GetStampSessionResults")
        s = self._session(request.ssid)
        now = self._clock()
        after = request.after_id if request.HasField("after_id") else s.acked
        s.acked = max(s.acked, min(after, s.arrived(now, self.loss_every)))
        limit = request.max_results or DEFAULT_RESULTS
        if limit > MAX_RESULTS:
            raise AgentError(Code.INVALID_ARGUMENT, f"max_results: {limit}, at most {MAX_RESULTS}")
        last = self._trim(s, now)
        reply = pb.GetStampSessionResultsReply(
            overflow=s.overflow,
            state=pb.SESSION_STATE_DRAINING,  # the state and the remaining counted at
            remaining=_U64_MAX,  # their largest until known
            counters=self._counters(s, now),
        )
        # The counters' `fetched` grows with the records: room for it (a 9-byte varint
        # up to 2^63) and for their length prefix to grow.
        results, _ = self._take(
            s, after, limit, last, size=reply.ByteSize() + 11,
            budget=asked_budget(self.reply_budget, request.max_bytes),
        )  # fmt: skip
        remaining = last - (results[-1].record_id if results else max(after, s.acked))
        state = s.state(now)
        if state == pb.SESSION_STATE_FINISHED and remaining > 0:
            state = pb.SESSION_STATE_DRAINING
        reply.results.extend(results)
        reply.overflow = s.overflow
        reply.state = state
        reply.remaining = max(0, remaining)
        reply.counters.fetched = s.fetched
        return reply

    @_unary
    def AcknowledgeStampSessionResults(  # noqa: N802
        self, request: pb.AcknowledgeStampSessionResultsRequest
    ) -> pb.AcknowledgeStampSessionResultsReply:
        self._sender("AcknowledgeStampSessionResults")
        s = self._session(request.ssid)
        done = self._ack(s, request.through_id, self._clock())
        return pb.AcknowledgeStampSessionResultsReply(acknowledged=done)

    def _ack(self, s: _SimSession, through: int, now: int) -> int:
        top = min(through, s.arrived(now, self.loss_every))
        done = max(0, top - s.acked)
        s.acked += done
        return done

    @_unary
    def AcknowledgeResults(  # noqa: N802
        self, request: pb.AcknowledgeResultsRequest
    ) -> pb.AcknowledgeResultsReply:
        self._sender("AcknowledgeResults")
        now = self._clock()
        done = {
            ssid: self._ack(self._sessions[ssid], through, now)
            for ssid, through in request.through_ids.items()
            if ssid in self._sessions
        }
        return pb.AcknowledgeResultsReply(acknowledged={} if request.without_counts else done)

    def StreamResults(  # noqa: N802
        self, request: pb.StreamResultsRequest, context: Any
    ) -> Iterator[pb.ResultBatches | bytes]:
        try:
            for message in self._stream(request, context):
                yield message if self.sends_bytes else pb.ResultBatches.FromString(message)
        except Exception as exc:
            abort_for(exc, context, _status_of)
            raise

    def _stream(self, request: pb.StreamResultsRequest, context: Any) -> Iterator[bytes]:
        """The call's messages, serialized."""
        with self._lock:
            self._sender("StreamResults")
            subs = _StreamState(
                {ssid: _Sub(self._sessions.get(ssid), after)
                 for ssid, after in request.after_ids.items()}
            )  # fmt: skip
        max_batch = min(request.max_batch or DEFAULT_BATCH, MAX_BATCH)
        window_s = (request.batch_window_ns or DEFAULT_BATCH_WINDOW_NS) / NS_PER_S
        every_ns = request.counters_interval_ns or DEFAULT_COUNTERS_INTERVAL_NS
        ended = threading.Event()
        context.add_callback(ended.set)
        while subs and not ended.is_set():
            with self._lock:
                message, more = self._message(subs, max_batch, every_ns)
            if message:
                yield message
            if not more and ended.wait(max(window_s, _STREAM_TICK_S)):
                return

    def _message(self, stream: _StreamState, max_batch: int, every_ns: int) -> tuple[bytes, bool]:
        """One StreamResults message, serialized (b"": nothing to send), and whether
        records are still waiting (lock held): all sessions at once while they run
        open-ended and the message is well within the budget, else one by one."""
        key = (self._generation, len(stream.subs))
        if stream.plain is not None and stream.plain.generation != self._generation:
            stream.plain.flush(stream.subs)
            stream.plain = None
        if stream.plain is None and stream.mixed != key and self.cuts_at_once:
            if _Plain.fits(self._sessions, stream.subs):
                stream.plain = _Plain(self._generation, stream.subs)
            else:
                stream.mixed = key
        if stream.plain is not None:
            cut = self._cut_plain(stream.plain, max_batch, every_ns)
            if cut is not None:
                return cut
            stream.plain.flush(stream.subs)
            stream.plain = None  # tried again on the next message
        batches, more = self._cut(stream.subs, max_batch, every_ns)
        return (pb.ResultBatches(batches=batches).SerializeToString() if batches else b""), more

    def _cut_plain(self, p: _Plain, max_batch: int, every_ns: int) -> tuple[bytes, bool] | None:
        """``_cut`` for sessions that all run open-ended, all at once and serialized;
        None (and nothing changed) if the message would come near the byte budget,
        where ``_cut`` decides what goes in."""
        now = self._clock()
        n = len(p.subs)
        acked = np.fromiter(map(_ACKED, p.sessions), np.int64, n)[p.order]
        overflow = np.fromiter(map(_OVERFLOW, p.sessions), np.int64, n)[p.order]
        fetched = np.fromiter(map(_FETCHED, p.sessions), np.int64, n)[p.order]
        # _SimSession.arrived, then _trim.
        seqs = p.sent_by(now - 2 * BASE_DELAY_NS - 200_000)
        last = seqs - (seqs // self.loss_every if self.loss_every else 0)
        floor = last - self.fifo_capacity
        trimmed = floor > acked
        overflow = np.where(trimmed, overflow + floor - acked, overflow)
        acked = np.where(trimmed, floor, acked)
        due = now >= p.due
        served = (last > p.cursor) | due
        at = np.flatnonzero(served)
        first = np.maximum(p.cursor[at], acked[at]) + 1
        count = np.maximum(np.minimum(last[at], first + max_batch - 1) - first + 1, 0)
        records = int(count.sum())
        # A record takes at least 16 bytes: more could not fit, whatever their values.
        if records > self.reply_budget // 16:
            return None
        ssid = p.ssid[at]
        results, batch_results = self._records_at_once(p, at, first, count)
        fetched = fetched[at] + count
        # The counters of the sessions due (_counters; `fetched` with these records).
        with_counters = due[at]
        c = at[with_counters]
        timed_out = p.sent_by(now - p.loss_timeout[c], c)
        counters, counters_bytes = _fields(
            [(0x08, p.ssid[c]), (0x10, pb.SESSION_STATE_RUNNING), (0x18, p.sent_by(now, c)),
             (0x20, last[c]), (0x28, timed_out // self.loss_every if self.loss_every else 0),
             (0x58, np.maximum(last[c] - acked[c], 0)), (0x60, overflow[c]),
             (0x68, fetched[with_counters])],
            len(c), frame=_TAG_COUNTERS,
        )  # fmt: skip
        counters_of = np.zeros(len(at), np.int64)
        counters_of[with_counters] = counters_bytes
        tail, tail_bytes = _fields(
            [(0x20, overflow[at]), (0x28, pb.SESSION_STATE_RUNNING)], len(at)
        )
        head, head_bytes = _fields(
            [(0x08, ssid)], len(at), frame=_TAG_BATCHES,
            extra=batch_results + tail_bytes + counters_of,
        )  # fmt: skip
        size = int(head_bytes.sum() + batch_results.sum() + tail_bytes.sum() + counters_of.sum())
        # _cut counts a batch's head and its records with 11 bytes to spare (its
        # counters' `fetched` may grow), and each batch's framing may grow by a byte:
        # with these to spare, it would have cut nothing either.
        if size + 12 * len(at) > self.reply_budget:
            return None
        message = (
            _interleave(
                [(head, head_bytes), (results, batch_results), (tail, tail_bytes),
                 (counters, counters_of)]
            )
            if len(at) else b""
        )  # fmt: skip
        # Nothing changed until here: now the sessions, the cursors, the order.
        for k in np.flatnonzero(trimmed).tolist():
            s = p.sessions[p.order[k]]
            s.acked, s.overflow = int(acked[k]), int(overflow[k])
        for k, value in zip(at[count > 0].tolist(), fetched[count > 0].tolist(), strict=True):
            p.sessions[p.order[k]].fetched = value
        cursor = np.where(count > 0, first + count - 1, p.cursor[at])
        more = bool((last[at] > cursor).any())
        p.cursor[at] = cursor
        p.due[c] = now + every_ns
        if 0 < len(at) < n:  # Batches.to_back: the sessions served go to the back
            order = np.concatenate([np.flatnonzero(~served), at])
            for name in ("ssid", "start", "interval", "loss_timeout", "cursor", "due", "order"):
                setattr(p, name, getattr(p, name)[order])
        return message, more

    def _records_at_once(self, p: _Plain, at: I64, first: I64, count: I64) -> tuple[U8, I64]:
        """The records of the sessions ``at`` (``count`` of each from id ``first``),
        encoded as ResultBatch.results, session after session (``_SimSession.result``);
        and their bytes per session."""
        records = int(count.sum())
        batch_of = np.repeat(np.arange(len(at)), count)
        record_id = np.repeat(first - (np.cumsum(count) - count), count) + np.arange(records)
        i = record_id - 1
        seq = i + i // (self.loss_every - 1) if self.loss_every > 1 else i
        t1 = p.start[at][batch_of] + seq * p.interval[at][batch_of]
        t2 = t1 + BASE_DELAY_NS + (seq * 7919) % 97 * 1000  # record_times
        t3 = t2 + RESIDENCE_NS
        t4 = t3 + BASE_DELAY_NS + (seq * 104729) % 89 * 1000
        results, result_bytes = _fields(
            [(0x08, p.ssid[at][batch_of]), (0x10, seq), (0x18, t1), (0x20, t2), (0x28, t3),
             (0x30, t4), _RECORD_CONSTANTS, (0x60, seq), (0x70, record_id)],
            records, frame=_TAG_RESULTS,
        )  # fmt: skip
        upto = np.concatenate([[0], np.cumsum(result_bytes)])
        ends = np.cumsum(count)
        return results, upto[ends] - upto[ends - count]

    def _cut(
        self, subs: dict[int, _Sub], max_batch: int, every_ns: int
    ) -> tuple[list[pb.ResultBatch], bool]:
        """One StreamResults message within the byte budget, as the real agent cuts it
        (lock held); whether records are still waiting."""
        now = self._clock()
        out = Batches(self.reply_budget)
        more = False
        served: list[int] = []
        for ssid, sub in list(subs.items()):
            s = sub.session
            if s is None or self._sessions.get(ssid) is not s:
                if not out.add(pb.ResultBatch(ssid=ssid, gone=True)):
                    more = True
                    break
                del subs[ssid]
                continue
            last = self._trim(s, now)
            state = s.state(now)
            finished = state == pb.SESSION_STATE_FINISHED
            due = now >= sub.due
            if last <= sub.cursor and not due and not finished:
                continue
            # Counted at their largest until known: `final`, and the counters (they go
            # with a final batch).
            batch = pb.ResultBatch(ssid=ssid, overflow=s.overflow, state=state, final=finished)
            if due or finished:
                batch.counters.CopyFrom(self._counters(s, now))
            room = out.room()
            head = batch.ByteSize()
            if head > room:
                more = True
                break
            served.append(ssid)
            # Room for the counters' `fetched` to grow with the records (as in the unary).
            items, records = self._take(s, sub.cursor, max_batch, last, size=head + 11, budget=room)
            if items:
                sub.cursor = items[-1].record_id
            pending = last > sub.cursor
            more = more or pending
            batch.final = final = finished and not pending
            if due or final:
                sub.due = now + every_ns
                batch.counters.fetched = s.fetched
            else:
                batch.ClearField("counters")
            size = batch.ByteSize() + records  # before the records: not encoded twice
            batch.results.extend(items)
            out.add(batch, size)  # it fits: its records were cut to the room
            if final:
                del subs[ssid]
            if pending and len(items) < max_batch:  # the budget is spent
                break
        Batches.to_back(subs, served)
        return out.batches, more

    # -- counters ---------------------------------------------------------------------

    @_unary
    def GetCounters(self, request: pb.GetCountersRequest) -> pb.GetCountersReply:  # noqa: N802
        now = self._clock()
        chosen = (
            [self._session(request.ssid)]
            if request.HasField("ssid")
            else [self._sessions[k] for k in sorted(self._sessions)]
        )
        reply = pb.GetCountersReply(role=_ROLE_PB[self.role])
        for s in chosen:
            reply.sessions.append(self._counters(s, now))
        return reply


def _as_is(message: bytes) -> bytes:
    return message


class _SendingBytes:
    """A gRPC server as ``add_StampAgentServicer_to_server`` sees it: the StampAgent
    service's handlers with StreamResults sending its messages as the servicer
    serialized them."""

    def __init__(self, server: grpc.Server, servicer: SimulatedAgentServicer) -> None:
        self._server = server
        self._servicer = servicer

    def add_generic_rpc_handlers(self, _handlers: Any) -> None:
        """Replaced by ``add_registered_method_handlers``' (the same methods)."""

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        handlers = dict(handlers)
        handlers["StreamResults"] = grpc.unary_stream_rpc_method_handler(
            self._servicer.StreamResults,
            request_deserializer=pb.StreamResultsRequest.FromString,
            response_serializer=_as_is,
        )
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, handlers),)
        )
        self._server.add_registered_method_handlers(service, handlers)


def add_simulated_to_server(servicer: SimulatedAgentServicer, server: grpc.Server) -> None:
    """Serve ``servicer`` on ``server`` (the StampAgent service, as
    ``add_StampAgentServicer_to_server``), its StreamResults messages sent as it
    serialized them."""
    pb_grpc.add_StampAgentServicer_to_server(servicer, _SendingBytes(server, servicer))  # type: ignore[no-untyped-call]
    servicer.sends_bytes = True


def serve_simulated(
    address: str,
    role: Role | str = Role.SENDER,
    *,
    loss_every: int = 0,
    max_workers: int = 16,
    fifo_capacity: int = 100_000,
    reply_budget: int = REPLY_BUDGET_BYTES,
) -> AgentServer:
    """Start a simulated agent serving gRPC on ``address`` (port 0: any free port);
    ``reply_budget``: the largest results message it sends (``sixlab.southbound.budget``).

    The returned ``AgentServer`` is the real agent's handle (``stop``, ``port``).
    """
    servicer = SimulatedAgentServicer(
        role, loss_every=loss_every, fifo_capacity=fifo_capacity, reply_budget=reply_budget
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sim-agent"),
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ],
    )
    add_simulated_to_server(servicer, server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        server.stop(None)
        raise OSError(f"grpc: cannot listen on {address}: {exc}") from exc
    server.start()
    return AgentServer(server, servicer, int(port))  # type: ignore[arg-type]
