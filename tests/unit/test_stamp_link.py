"""A Session-Sender and a Session-Reflector joined in memory through a seeded fake link.

The link is told, packet by packet, what to do: drop, duplicate, delay (which reorders).
Under a fake clock the records and the loss / duplicate / reorder counts must come out
exactly as the link was told to behave.
"""

from __future__ import annotations

import functools
import heapq
import random
from dataclasses import dataclass, field

import pytest

from sixlab.stamp import _events as ev
from sixlab.stamp.reflector import Reflector, ReflectorMode, ReflectorSessionConfig
from sixlab.stamp.sender import SenderConfig, SenderSession, State
from sixlab.wire.timestamp import TimestampFormat

MS = 1_000_000
START = 1_800_000_000 * 1_000_000_000  # 2027-01-15, Unix ns


@dataclass
class Plan:
    """What the link does to the forward packet ``seq`` and its replies."""

    fwd_copies: int  # 0 = dropped, 2 = duplicated
    bwd_drop: bool
    fwd_delay: int
    bwd_delay: int
    residence: int  # T3 - T2 at the reflector


@dataclass
class FakeLink:
    plans: dict[int, Plan]
    heap: list[tuple[int, int, str, bytes]] = field(default_factory=list)
    order: int = 0

    def put(self, at: int, direction: str, data: bytes) -> None:
        self.order += 1
        heapq.heappush(self.heap, (at, self.order, direction, data))


def make_plans(rng: random.Random, n: int) -> dict[int, Plan]:
    plans = {}
    for seq in range(n):
        roll = rng.random()
        copies = 0 if roll < 0.1 else 2 if roll < 0.2 else 1
        plans[seq] = Plan(
            fwd_copies=copies,
            bwd_drop=rng.random() < 0.1,
            fwd_delay=rng.randrange(1 * MS, 40 * MS),  # interval 10 ms: reorders
            bwd_delay=rng.randrange(1 * MS, 40 * MS),
            residence=rng.randrange(0, 50_000),
        )
    return plans


def run(
    sender: SenderSession, reflector: Reflector, link: FakeLink
) -> tuple[list[ev.Event], list[tuple[int, int]]]:
    """Drive both ends until the session finishes; return events and (seq, arrival)."""
    now = START
    events: list[ev.Event] = []
    arrivals: list[tuple[int, int]] = []
    sender.start(now)
    for _ in range(100_000):
        for payload in sender.datagrams_to_send():
            seq = int.from_bytes(payload[:4])
            plan = link.plans[seq]
            for _copy in range(plan.fwd_copies):
                link.put(now + plan.fwd_delay, "fwd", payload)
        while (event := sender.next_event()) is not None:
            events.append(event)
        if sender.state is State.FINISHED:
            return events, arrivals
        timer = sender.get_timer()
        nxt = link.heap[0][0] if link.heap else None
        candidates = [t for t in (timer, nxt) if t is not None]
        assert candidates, "nothing left to happen but the session is not finished"
        now = min(candidates)
        if nxt is not None and nxt == now:
            _, _, direction, data = heapq.heappop(link.heap)
            if direction == "fwd":
                seq = int.from_bytes(data[:4])
                plan = link.plans[seq]
                out = reflector.reflect(data, now, functools.partial(int, now + plan.residence), 61)
                assert out is not None
                if not plan.bwd_drop:
                    link.put(now + plan.residence + plan.bwd_delay, "bwd", out.payload)
            else:
                arrivals.append((int.from_bytes(data[24:28]), now))
                sender.receive(data, now)
        else:
            sender.handle_timer(now)
    raise AssertionError("session did not finish")


@pytest.mark.parametrize("seed", [1, 2, 3, 8762])
@pytest.mark.parametrize("mode", list(ReflectorMode))
@pytest.mark.parametrize("fmt", list(TimestampFormat))
def test_link_behaviour_is_measured_exactly(
    seed: int, mode: ReflectorMode, fmt: TimestampFormat
) -> None:
    n = 300
    rng = random.Random(seed)
    plans = make_plans(rng, n)
    sender = SenderSession(
        SenderConfig(
            ssid=7,
            interval_ns=10 * MS,
            count=n,
            fmt=fmt,
            loss_timeout_ns=500 * MS,
            reflector_stateful=mode is ReflectorMode.STATEFUL,
        )
    )
    reflector = Reflector()
    reflector.add_session(ReflectorSessionConfig(ssid=7, mode=mode, fmt=fmt))
    events, arrivals = run(sender, reflector, FakeLink(plans))

    results = [e for e in events if isinstance(e, ev.StampResult)]
    lost = sorted(e.seq for e in events if isinstance(e, ev.PacketLost))
    dups = [e.seq for e in events if isinstance(e, ev.DuplicateReceived)]

    arriving = {s: (0 if p.bwd_drop else p.fwd_copies) for s, p in plans.items()}
    assert sorted(r.seq for r in results) == sorted(s for s, k in arriving.items() if k)
    assert lost == sorted(s for s, k in arriving.items() if not k)
    assert sorted(dups) == sorted(s for s, k in arriving.items() if k == 2)

    # Every record carries exactly the delays the link applied.
    for r in results:
        p = plans[r.seq]
        assert r.t1_ns == START + r.seq * 10 * MS
        assert r.direct_ns == p.fwd_delay
        assert r.return_ns == p.bwd_delay
        assert r.t3_ns - r.t2_ns == p.residence
        assert r.rtt_ns == p.fwd_delay + p.bwd_delay
        assert r.ses_sender_ttl == 61
        assert r.ssid == 7

    # Reordering: a first arrival below the highest Seq already seen.
    highest, reordered, seen = -1, 0, set()
    for seq, _ in arrivals:
        if seq in seen:
            continue
        seen.add(seq)
        if seq < highest:
            reordered += 1
        highest = max(highest, seq)
    c = sender.counters
    assert (c.sent, c.received, c.lost, c.duplicates, c.reordered) == (
        n,
        len(results),
        len(lost),
        len(dups),
        reordered,
    )
    assert reordered > 0  # the plan's delays spread wider than the interval
    assert events[-1] == ev.SessionFinished(7)

    if mode is ReflectorMode.STATELESS:
        assert c.forward_lost is None


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_stateful_reflector_splits_forward_and_backward_loss(seed: int) -> None:
    """Drops only, constant delays (no reordering, no duplicates): the split is exact."""
    n = 400
    rng = random.Random(seed)
    plans = {
        s: Plan(
            fwd_copies=0 if rng.random() < 0.15 else 1,
            bwd_drop=rng.random() < 0.1,
            fwd_delay=3 * MS,
            bwd_delay=4 * MS,
            residence=1000,
        )
        for s in range(n)
    }
    plans[n - 1] = Plan(1, False, 3 * MS, 4 * MS, 1000)  # the last one comes back
    sender = SenderSession(
        SenderConfig(
            ssid=9, interval_ns=MS, count=n, loss_timeout_ns=100 * MS, reflector_stateful=True
        )
    )
    reflector = Reflector()
    reflector.add_session(ReflectorSessionConfig(ssid=9, mode=ReflectorMode.STATEFUL))
    events, _ = run(sender, reflector, FakeLink(plans))
    fwd = sum(1 for p in plans.values() if p.fwd_copies == 0)
    bwd = sum(1 for p in plans.values() if p.fwd_copies and p.bwd_drop)
    c = sender.counters
    assert (c.lost, c.forward_lost, c.backward_lost) == (fwd + bwd, fwd, bwd)
    # The reflector's own Seq counts its replies from 0 (RFC 8762 §4.3.1).
    results = [e for e in events if isinstance(e, ev.StampResult)]
    assert results[-1].reflector_seq == n - fwd - 1
