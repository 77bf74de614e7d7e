"""What storing a sender's stream messages costs the controller besides the SQL, counted
(issue 15: 10,000 sessions on a controller, a batch of one record per session per
message): the locks taken per transaction, and the messages left as they came."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any, cast

import pytest

from sixlab.controller import Controller, core
from sixlab.controller.store import SessionRow, SqliteStore
from sixlab.southbound import AgentClient
from sixlab.southbound import stamp_pb2 as pb

T = 1_800_000_000_000_000_000
SESSIONS = 200


class _Agent:
    """The sender agent's client as the storer calls it: acknowledgements recorded."""

    def __init__(self) -> None:
        self.acks: list[dict[int, int]] = []
        self.counts: list[bool] = []

    def acknowledge_many(
        self,
        acks: dict[int, int],
        through_loss_ids: dict[int, int] | None = None,
        *,
        counts: bool = True,
    ) -> None:
        self.acks.append(dict(acks))
        self.counts.append(counts)

    def close(self) -> None:
        pass


class _Counted:
    """A lock that counts how often it is taken."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.taken = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self.taken += 1
        return bool(self.lock.acquire(blocking, timeout))

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Stream:
    def __init__(self, node: str) -> None:
        self.node = node
        self.names: set[str] = set()
        self.changed = threading.Event()


def _record(ssid: int, rid: int) -> pb.StampResult:
    t1 = T + rid * 1_000_000_000 + ssid
    return pb.StampResult(
        ssid=ssid, seq=rid - 1, t1_ns=t1, t2_ns=t1 + 1_000_000, t3_ns=t1 + 1_010_000,
        t4_ns=t1 + 2_010_000, sender_error_estimate=0x8001,
        reflector_error_estimate=0x8001, ses_sender_ttl=255, reflector_seq=rid - 1,
        record_id=rid,
    )  # fmt: skip


def _message(rows: list[SessionRow], rid: int, counters: bool = False) -> pb.ResultBatches:
    msg = pb.ResultBatches()
    for row in rows:
        b = msg.batches.add(ssid=row.ssid, state=pb.SESSION_STATE_RUNNING)
        b.results.append(_record(row.ssid, rid))
        if counters:
            b.counters.CopyFrom(pb.SessionCounters(ssid=row.ssid, sent=rid, received=rid))
    return msg


def _setup(tmp_path: Path) -> tuple[SqliteStore, Controller, list[SessionRow], _Agent]:
    store = SqliteStore(tmp_path / "c.db")
    store.add_node("s0", "127.0.0.1:1", "sender")
    store.add_node("r0", "127.0.0.1:2", "reflector")
    params = {"reflector_address": "2001:db8::2", "interval_ns": 1_000_000_000}
    names = [f"p{i}" for i in range(SESSIONS)]
    store.add_sessions([(n, i + 1, "s0", "r0", params) for i, n in enumerate(names)], now_ns=1)
    store.set_states(names, "running")
    store.begin_epochs([(n, None) for n in names], T)
    agent = _Agent()
    ctl = Controller(
        store, supervise_interval_s=None, client_factory=lambda _a: cast(AgentClient, agent)
    )
    return store, ctl, store.sessions_named(names), agent


def test_a_transaction_takes_each_lock_once_not_once_per_session(tmp_path: Path) -> None:
    """A message of 200 sessions' batches (with counters, as every few messages bring):
    the controller's lock, the metrics' and the counts' are each taken a few times for
    the transaction, not once per session (each was once or twice per session)."""
    store, ctl, rows, agent = _setup(tmp_path)
    try:
        st = cast(Any, _Stream("s0"))
        subs = {r.ssid: r for r in rows}
        ctl._store_messages(st, subs, queue.Queue(), [(T, _message(rows, 1, True))])
        ctl._lock = cast(Any, _Counted(ctl._lock))
        ctl._counts_lock = cast(Any, _Counted(ctl._counts_lock))
        ctl.metrics._lock = cast(Any, _Counted(ctl.metrics._lock))
        ctl._store_messages(st, subs, queue.Queue(), [(T, _message(rows, 2, True))])
        taken = {
            "controller": cast(_Counted, ctl._lock).taken,
            "counts": cast(_Counted, ctl._counts_lock).taken,
            "metrics": cast(_Counted, ctl.metrics._lock).taken,
        }
        assert all(n <= 4 for n in taken.values()), taken
        assert [store.session(r.name).cursor for r in rows[:: SESSIONS // 4]] == [2] * 4
        assert agent.acks[-1] == {r.ssid: 2 for r in rows}
    finally:
        ctl.close()
        store.close()


def test_the_messages_of_a_transaction_are_left_as_they_came(tmp_path: Path) -> None:
    """Two messages with a batch of each session go in one transaction: every record is
    stored once, and the messages are not changed to join them (joining a session's
    batches by appending the second's records to the first copied each record)."""
    store, ctl, rows, agent = _setup(tmp_path)
    try:
        st = cast(Any, _Stream("s0"))
        subs = {r.ssid: r for r in rows}
        first, second = _message(rows, 1), _message(rows, 2, True)
        before = (first.SerializeToString(), second.SerializeToString())
        ctl._store_messages(st, subs, queue.Queue(), [(T, first), (T + 1, second)])
        assert (first.SerializeToString(), second.SerializeToString()) == before
        assert [store.count_results(r.id) for r in rows[:: SESSIONS // 4]] == [2] * 4
        assert agent.acks == [{r.ssid: 2 for r in rows}]
        # The reply's count per session (a map as large as the request) is not asked.
        assert agent.counts == [False]
        epoch = store.epochs(rows[0].id)[-1]
        assert (epoch.received, epoch.sent) == (2, 2)
    finally:
        ctl.close()
        store.close()


@pytest.mark.parametrize(("slots", "together"), [(2, True), (1, False)])
def test_commit_slots_let_that_many_senders_transactions_run_at_once(
    tmp_path: Path, slots: int, together: bool
) -> None:
    """With ``commit_slots`` 2, two senders' transactions are in the store together
    (PostgreSQL gives each a connection); with 1, the second waits for the first."""
    store = SqliteStore(tmp_path / "c.db")
    store.add_node("r0", "127.0.0.1:2", "reflector")
    params = {"reflector_address": "2001:db8::2", "interval_ns": 1_000_000_000}
    for k in (0, 1):
        store.add_node(f"s{k}", f"127.0.0.1:{10 + k}", "sender")
        store.add_sessions([(f"p{k}", 1, f"s{k}", "r0", params)], now_ns=1)
    store.set_states(["p0", "p1"], "running")
    store.begin_epochs([("p0", None), ("p1", None)], T)
    inside = threading.Barrier(2, timeout=1.0)
    met: list[bool] = []
    store_many = store.store_many

    def meeting(*args: Any, **kwargs: Any) -> list[int | None]:
        try:
            inside.wait()
            met.append(True)
        except threading.BrokenBarrierError:
            met.append(False)
        return store_many(*args, **kwargs)

    store.store_many = meeting  # type: ignore[method-assign]
    agent = _Agent()
    ctl = Controller(
        store,
        supervise_interval_s=None,
        client_factory=lambda _a: cast(AgentClient, agent),
        commit_slots=slots,
    )
    try:
        threads = []
        for k in (0, 1):
            (row,) = store.sessions_named([f"p{k}"])
            st = cast(Any, _Stream(f"s{k}"))
            args: tuple[Any, ...] = (st, {row.ssid: row}, queue.Queue(), [(T, _message([row], 1))])
            threads.append(threading.Thread(target=ctl._store_messages, args=args))
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert met == [together, together]
        assert [store.count_results(r.id) for r in store.sessions()] == [1, 1]
    finally:
        ctl.close()
        store.close()


def test_the_rows_of_messages_already_there_are_built_before_the_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The records of the messages a sender has when it starts waiting for the commit
    slot become rows before it takes the slot (which every other sender waits for); only
    a message that came meanwhile is built while holding it."""
    store, ctl, rows, _ = _setup(tmp_path)
    built: list[tuple[int, bool]] = []
    rows_of = core._rows

    def counting(
        sid: int, epoch: int, results: Any
    ) -> tuple[list[tuple[Any, ...]], list[pb.StampResult]]:
        slot = ctl._commit_slot
        free = slot.acquire(blocking=False)  # not if this thread (the only one) holds it
        if free:
            slot.release()
        built.append((len(results), not free))
        return rows_of(sid, epoch, results)

    monkeypatch.setattr(core, "_rows", counting)
    try:
        st = cast(Any, _Stream("s0"))
        subs = {r.ssid: r for r in rows}
        inbox: queue.Queue[Any] = queue.Queue()
        inbox.put((T + 1, _message(rows[:10], 2)))  # there once the slot is taken
        ctl._store_messages(st, subs, inbox, [(T, _message(rows, 1))])
        held = [n for n, in_slot in built if in_slot]
        assert len(built) == SESSIONS + 10
        assert held == [1] * 10  # the late message's batches only
        assert [store.count_results(r.id) for r in rows[:12]] == [2] * 10 + [1] * 2
    finally:
        ctl.close()
        store.close()
