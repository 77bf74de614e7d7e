"""How many records a results message of the agent carries: a byte budget.

A results message (a GetStampSessionResults reply, a StreamStampSessionResults batch, a
StreamResults message) must fit the receiving channel's message limit, or gRPC fails the
whole call (RESOURCE_EXHAUSTED) and the client, asking again from the same cursor, gets
the same oversized message forever. A record is under 100 bytes without TLVs but up to
about 9 KB with them (``MAX_TLV_BYTES``), so no record count is safe; the agent counts
bytes instead (docs/architecture.md, "Results messages: the byte budget"):

- a message's serialized size never exceeds ``REPLY_BUDGET_BYTES``;
- records go in in id order, each only if the message with it (its tag and length
  prefix included) stays within the budget; the first one that does not fit, and every
  one after it, waits for the next message: the cursor stops at the last record sent;
- loss reports go in first, counted at their largest encoding, in at most half the
  budget, so the records always have the other half (and a record always fits).

Sizes are the protobuf encoding's (a length-delimited field: tag, varint length,
payload), computed from ``ByteSize()`` of the parts, so the rule is exact rather than an
estimate: a message at the budget is sent, one byte more is cut.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping, Sequence
from typing import TypeVar

from google.protobuf.message import Message

from sixlab.southbound._generated import stamp_pb2 as pb

__all__ = [
    "LOST_MAX_BYTES",
    "MIN_REPLY_BUDGET_BYTES",
    "RECEIVE_LIMIT_BYTES",
    "REPLY_BUDGET_BYTES",
    "Batches",
    "asked_budget",
    "fit",
    "framed",
    "inner_budget",
    "lost_fitting",
]

#: gRPC's default receive limit, which the agent's clients keep (``AgentClient``).
RECEIVE_LIMIT_BYTES = 4 << 20
#: Largest results message the agent sends (serialized bytes): a quarter below gRPC's
#: default receive limit, so that a client of any gRPC implementation on its defaults
#: reads every message.
REPLY_BUDGET_BYTES = 3 << 20
#: The smallest byte budget of a results message: a batch's head (state, counters) and
#: the largest record (a full TLV area) fit in it many times over. An agent's budget is
#: at least this, and so is a reply's a request asks for (``asked_budget``).
MIN_REPLY_BUDGET_BYTES = 64 << 10
#: One LostPacket at its largest in a reply: tag and length (2), seq (tag and a 5-byte
#: varint), t1_ns and loss_id (tag and a 10-byte varint each).
LOST_MAX_BYTES = 2 + 6 + 11 + 11

M = TypeVar("M", bound=Message)
V = TypeVar("V")


def asked_budget(budget: int, max_bytes: int) -> int:
    """The byte budget of a GetStampSessionResults reply: the agent's ``budget``, or
    the request's ``max_bytes`` when smaller (0: not asked), never below
    ``MIN_REPLY_BUDGET_BYTES``."""
    if max_bytes <= 0:
        return budget
    return min(budget, max(max_bytes, MIN_REPLY_BUDGET_BYTES))


def _varint_len(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def framed(size: int) -> int:
    """Bytes an embedded message of ``size`` bytes takes in its parent (a field number
    below 16: one tag byte, then the varint length)."""
    return 1 + _varint_len(size) + size


def inner_budget(room: int) -> int:
    """The largest embedded message that fits, framed, into ``room`` bytes (0 if none)."""
    if room < 2:
        return 0
    size = room - 1 - _varint_len(room)
    while framed(size + 1) <= room:
        size += 1
    return max(0, size)


def fit(messages: Iterable[M], size: int, budget: int) -> tuple[list[M], int]:
    """The leading ``messages`` (successive elements of a repeated message field) that a
    message of ``size`` bytes takes, in order, staying within ``budget`` bytes; and its
    size with them. The first one that does not fit ends the list (and is the only one
    past the last taken that ``messages`` is asked for: it may be a lazy generator)."""
    taken: list[M] = []
    for message in messages:
        grown = size + framed(message.ByteSize())
        if grown > budget:
            break
        size = grown
        taken.append(message)
    return taken, size


def lost_fitting(size: int, budget: int) -> int:
    """How many loss reports a message of ``size`` bytes takes, counted at their
    largest, in at most half of ``budget``."""
    return max(0, min(budget // 2, budget - size)) // LOST_MAX_BYTES


class Batches:
    """The session batches of one StreamResults message, within ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.batches: list[pb.ResultBatch] = []
        #: The message's size so far.
        self.size = 0

    def room(self) -> int:
        """The largest batch that still fits."""
        return inner_budget(self.budget - self.size)

    def add(self, batch: pb.ResultBatch, size: int | None = None) -> bool:
        """Add ``batch`` if it fits; whether it did. ``size``: its serialized size when
        the caller knows it (the batch without its records, plus what ``fit`` counted
        for them: a message's encoding is its fields' one after the other), so that its
        records are not encoded once more only to be counted."""
        grown = self.size + framed(batch.ByteSize() if size is None else size)
        if grown > self.budget:
            return False
        self.size = grown
        self.batches.append(batch)
        return True

    @staticmethod
    def to_back(subs: MutableMapping[int, V], served: Sequence[int]) -> None:
        """Move the sessions ``served`` to the back of ``subs`` (in order), so that a
        message cut by the budget is followed by one that begins with those it left
        out."""
        for ssid in served:
            if ssid in subs:
                subs[ssid] = subs.pop(ssid)
