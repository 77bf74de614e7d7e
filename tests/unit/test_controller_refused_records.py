"""One bad record of a sender agent must not stall collection (a poison message): a
record with a field no STAMP packet carries, or an id past the signed 64-bit cursor,
is refused, counted and acknowledged; every other record of the agent's message is
stored, on SQLite and on PostgreSQL (docs/architecture.md, "Records out of range")."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from sixlab.controller import Controller, core
from sixlab.controller.pgstore import PostgresStore
from sixlab.controller.store import SessionRow, SqliteStore, Store, open_store
from sixlab.southbound import AgentClient
from sixlab.southbound import stamp_pb2 as pb
from tests.unit.test_controller_stream_cost import _Agent, _Stream

T = 1_800_000_000_000_000_000
U64 = 2**64 - 1


def _record(ssid: int, rid: int) -> pb.StampResult:
    t1 = T + rid * 1_000_000_000 + ssid
    return pb.StampResult(
        ssid=ssid, seq=rid - 1, t1_ns=t1, t2_ns=t1 + 1_000_000, t3_ns=t1 + 1_010_000,
        t4_ns=t1 + 2_010_000, sender_error_estimate=0x8001,
        reflector_error_estimate=0x8001, ses_sender_ttl=64, reflector_seq=rid - 1,
        record_id=rid,
    )  # fmt: skip


def _ee(r: pb.StampResult) -> None:
    r.reflector_error_estimate = 0x1_8001


def _ttl(r: pb.StampResult) -> None:
    r.ses_sender_ttl = 40_000  # past 255, and past PostgreSQL's SMALLINT


def _label(r: pb.StampResult) -> None:
    r.flow_label = 2**32 - 1  # past 20 bits, and past PostgreSQL's INTEGER


#: Each way a record can be out of range.
SPOIL: dict[str, Callable[[pb.StampResult], None]] = {
    "error_estimate": _ee,
    "ttl": _ttl,
    "flow_label": _label,
}


@pytest.fixture(params=["sqlite", "postgresql"])
def setup(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Store, Controller, list[SessionRow], _Agent]]:
    if request.param == "sqlite":
        store: Store = open_store(tmp_path / "c.sqlite")
        assert isinstance(store, SqliteStore)
    else:
        store = open_store(request.getfixturevalue("pg_url"))
        assert isinstance(store, PostgresStore)
    store.add_node("s0", "127.0.0.1:1", "sender")
    store.add_node("r0", "127.0.0.1:2", "reflector")
    params = {"reflector_address": "2001:db8::2", "interval_ns": 1_000_000_000}
    names = ["p0", "p1", "p2"]
    store.add_sessions([(n, i + 1, "s0", "r0", params) for i, n in enumerate(names)], now_ns=1)
    store.set_states(names, "running")
    store.begin_epochs([(n, None) for n in names], T)
    agent = _Agent()
    ctl = Controller(
        store, supervise_interval_s=None, client_factory=lambda _a: cast(AgentClient, agent)
    )
    yield store, ctl, store.sessions_named(names), agent
    ctl.close()
    store.close()


def _message(batches: dict[int, list[pb.StampResult]]) -> pb.ResultBatches:
    msg = pb.ResultBatches()
    for ssid, records in batches.items():
        msg.batches.add(ssid=ssid, state=pb.SESSION_STATE_RUNNING).results.extend(records)
    return msg


def _refused(ctl: Controller) -> int:
    return ctl.metrics._refused.get("s0", 0)


@pytest.mark.parametrize("field", sorted(SPOIL))
def test_a_record_out_of_range_is_refused_and_the_rest_of_the_message_is_stored(
    setup: tuple[Store, Controller, list[SessionRow], _Agent], field: str
) -> None:
    """A message of three sessions: p1's second record (of three) and p2's last carry a
    field out of range. Both are refused and counted; every other record is stored;
    the cursors move past them (p2's although it was its batch's last: the agent is
    not asked for it again) and they are acknowledged; the next message is stored."""
    store, ctl, (p0, p1, p2), agent = setup
    st = cast(Any, _Stream("s0"))
    subs = {r.ssid: r for r in (p0, p1, p2)}
    batches = {r.ssid: [_record(r.ssid, i) for i in (1, 2, 3)] for r in (p0, p1, p2)}
    SPOIL[field](batches[p1.ssid][1])
    SPOIL[field](batches[p2.ssid][2])
    ctl._store_messages(st, subs, queue.Queue(), [(T, _message(batches))])
    assert [store.count_results(r.id) for r in (p0, p1, p2)] == [3, 2, 2]
    assert sorted(r.seq for r in store.results(p1.id)) == [0, 2]
    assert [store.session(n).cursor for n in ("p0", "p1", "p2")] == [3, 3, 3]
    assert agent.acks == [{p0.ssid: 3, p1.ssid: 3, p2.ssid: 3}]
    assert _refused(ctl) == 2
    later = {r.ssid: [_record(r.ssid, 4)] for r in (p0, p1, p2)}
    ctl._store_messages(st, subs, queue.Queue(), [(T, _message(later))])
    assert [store.count_results(r.id) for r in (p0, p1, p2)] == [4, 3, 3]
    assert [store.session(n).cursor for n in ("p0", "p1", "p2")] == [4, 4, 4]
    assert _refused(ctl) == 2
    # Received counts what was stored, not what was refused.
    assert [store.epochs(r.id)[-1].received for r in (p0, p1, p2)] == [4, 3, 3]


def test_a_record_id_past_the_cursor_column_is_refused_and_acknowledged(
    setup: tuple[Store, Controller, list[SessionRow], _Agent],
) -> None:
    """A record id past 2^63 - 1 cannot be a cursor: the record is refused and counted,
    the cursor stays at the last id that fits, and the agent is told to free it (the
    acknowledgement is a uint64); the other sessions' records are stored."""
    store, ctl, (p0, p1, p2), agent = setup
    st = cast(Any, _Stream("s0"))
    subs = {r.ssid: r for r in (p0, p1, p2)}
    batches = {r.ssid: [_record(r.ssid, 1), _record(r.ssid, 2)] for r in (p0, p1, p2)}
    huge = _record(p1.ssid, 3)
    huge.record_id = U64
    batches[p1.ssid].append(huge)
    ctl._store_messages(st, subs, queue.Queue(), [(T, _message(batches))])
    assert [store.count_results(r.id) for r in (p0, p1, p2)] == [2, 2, 2]
    assert [store.session(n).cursor for n in ("p0", "p1", "p2")] == [2, 2, 2]
    assert agent.acks == [{p0.ssid: 2, p1.ssid: U64, p2.ssid: 2}]
    assert _refused(ctl) == 1
    ctl._store_messages(st, subs, queue.Queue(), [(T, _message({p0.ssid: [_record(p0.ssid, 3)]}))])
    assert store.count_results(p0.id) == 3


def test_a_batch_of_only_refused_records_moves_the_cursor_and_keeps_the_counters(
    setup: tuple[Store, Controller, list[SessionRow], _Agent],
) -> None:
    """A batch whose every record is refused: none stored, the cursor past them, the
    sender's counters that came with it stored."""
    store, ctl, (p0, _, _), agent = setup
    st = cast(Any, _Stream("s0"))
    records = [_record(p0.ssid, 1), _record(p0.ssid, 2)]
    for r in records:
        _ttl(r)
    msg = _message({p0.ssid: records})
    msg.batches[0].counters.CopyFrom(pb.SessionCounters(ssid=p0.ssid, sent=5, received=2))
    ctl._store_messages(st, {p0.ssid: p0}, queue.Queue(), [(T, msg)])
    assert store.count_results(p0.id) == 0
    assert store.session("p0").cursor == 2
    assert store.epochs(p0.id)[-1].sent == 5
    assert agent.acks == [{p0.ssid: 2}]
    assert _refused(ctl) == 2


def test_a_polled_batch_refuses_the_same_records(
    setup: tuple[Store, Controller, list[SessionRow], _Agent],
) -> None:
    """The poll path's batch (``core._batch``): the same rows refused, its cursor past
    them, stored in one transaction with another session's good records."""
    store, _, (p0, p1, _), _ = setup
    records = [_record(p0.ssid, i) for i in (1, 2, 3)]
    _label(records[2])
    batch, bad = core._batch(p0, records, None)
    assert [r.record_id for r in bad] == [3]
    other, none = core._batch(p1, [_record(p1.ssid, 1)], None)
    assert none == []
    assert store.store_many([batch, other], now_ns=2) == [2, 1]
    assert (store.session("p0").cursor, store.session("p1").cursor) == (3, 1)
