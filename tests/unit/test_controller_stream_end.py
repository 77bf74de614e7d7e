"""A sender's stream that ends while its messages are being stored: the storer learns
how it ended and lets go of it, whatever failed meanwhile. A stream thread that waited
instead for an end already taken off the inbox never stopped: a replica leaving (or a
controller closing) waited for it 10 s per sender, and that sender's collection was not
reopened (found at 10,000 sessions, the sender agents stopped before the replicas)."""

from __future__ import annotations

import threading
from typing import Any, cast

import grpc
import pytest

from sixlab.controller import core
from sixlab.southbound import AgentClient, SouthboundError
from sixlab.southbound import stamp_pb2 as pb
from tests.unit.test_controller_stream_cost import _message, _setup, _Stream

#: How long the storer may take to give the stream up in these tests (s): generous, it
#: is at once (a hang waits forever).
ENDED_S = 10.0


class _DeadAgent:
    """The sender agent's client once its agent is gone: acknowledging fails."""

    def acknowledge_many(self, *args: Any, **kwargs: Any) -> None:
        raise SouthboundError(grpc.StatusCode.UNAVAILABLE, "connection refused")

    def close(self) -> None:
        pass


class _EndingStream:
    """A results stream that gives one message, then fails (the agent died) once
    ``fail`` is set; ``cancel`` as a gRPC call's."""

    def __init__(self, message: pb.ResultBatches) -> None:
        self.message = message
        self.fail = threading.Event()
        self.cancelled = threading.Event()

    def __iter__(self) -> Any:
        yield self.message
        self.fail.wait(ENDED_S)
        raise SouthboundError(grpc.StatusCode.UNAVAILABLE, "stream: agent gone")

    def cancel(self) -> None:
        self.cancelled.set()


class _SlotAfterTheEnd:
    """The commit slot, taken only once the stream has ended and its reader put the end
    in the inbox: the storer's look for more messages, inside the slot, then takes the
    end off the inbox before the transaction (the race, made certain)."""

    def __init__(self, slot: Any, stream: _EndingStream, reader_done: threading.Event) -> None:
        self.slot = slot
        self.stream = stream
        self.reader_done = reader_done

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self.stream.fail.set()
        assert self.reader_done.wait(ENDED_S)
        return bool(self.slot.acquire(blocking, timeout))

    def release(self) -> None:
        self.slot.release()


@pytest.mark.timeout(60)
def test_a_stream_that_ends_while_its_acknowledgement_fails_is_let_go(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, ctl, rows, _ = _setup(tmp_path)
    dead = _DeadAgent()
    ctl._clients["s0"] = cast(AgentClient, dead)
    stream = _EndingStream(_message(rows, 1))
    reader_done = threading.Event()
    read_stream = core._read_stream

    def reading(*args: Any) -> None:
        try:
            read_stream(*args)
        finally:
            reader_done.set()

    monkeypatch.setattr(core, "_read_stream", reading)
    ctl._commit_slot = cast(Any, _SlotAfterTheEnd(ctl._commit_slot, stream, reader_done))
    raised: list[BaseException] = []

    def collect() -> None:
        try:
            ctl._collect_stream(
                cast(Any, _Stream("s0")), cast(Any, stream), {r.ssid: r for r in rows}
            )
        except BaseException as exc:  # noqa: BLE001 - what the stream loop would see
            raised.append(exc)

    storer = threading.Thread(target=collect, daemon=True)
    try:
        storer.start()
        storer.join(ENDED_S)
        assert not storer.is_alive(), "the storer waits for an end it already took"
        # The records were stored before the acknowledgement failed; the failure is the
        # stream loop's to see (it backs off and reopens the stream).
        assert [type(e) for e in raised] == [SouthboundError]
        assert stream.cancelled.is_set()
        assert [store.count_results(r.id) for r in rows[:3]] == [1, 1, 1]
    finally:
        stream.fail.set()
        ctl.close()
        store.close()
