"""``IdQueue``: the id-numbered FIFO behind a sender engine's records and loss reports."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sixlab.dataplane._idqueue import IdQueue


def _queue(*items: str, capacity: int = 100) -> IdQueue[str]:
    q: IdQueue[str] = IdQueue()
    for item in items:
        q.push(item, capacity)
    return q


def test_items_are_numbered_from_one_and_keep_their_ids() -> None:
    q = _queue()
    assert (len(q), q.last_id) == (0, 0)
    assert q.after(0) == []
    assert not q.has_after(0)
    q = _queue("a", "b", "c")
    assert (len(q), q.last_id) == (3, 3)
    assert q.after(0) == [(1, "a"), (2, "b"), (3, "c")]
    assert q.pop(1) == ["a"]
    assert q.after(0) == [(2, "b"), (3, "c")]  # the others keep their ids
    assert q.after(2) == [(3, "c")]
    assert q.after(3) == []
    assert q.has_after(2)
    assert not q.has_after(3)
    assert q.last_id == 3


def test_after_returns_at_most_max_items_and_leaves_them_queued() -> None:
    q = _queue("a", "b", "c", "d")
    assert q.after(1, 2) == [(2, "b"), (3, "c")]
    assert q.after(1, 0) == []
    assert q.after(-5, 1) == [(1, "a")]
    assert len(q) == 4


def test_acknowledge_removes_through_an_id_and_says_how_many() -> None:
    q = _queue("a", "b", "c")
    assert q.acknowledge(0) == 0
    assert q.acknowledge(2) == 2
    assert q.acknowledge(2) == 0  # again: nothing more
    assert q.after(0) == [(3, "c")]
    assert q.acknowledge(99) == 1
    assert (len(q), q.last_id) == (0, 3)
    q.push("d", 10)
    assert q.after(0) == [(4, "d")]  # ids go on after a queue ran empty


def test_pop_takes_the_oldest() -> None:
    q = _queue("a", "b", "c")
    assert q.pop(0) == []
    assert q.pop(-1) == []
    assert q.pop(2) == ["a", "b"]
    assert q.pop() == ["c"]
    assert q.pop() == []
    assert q.last_id == 3


def test_push_past_capacity_drops_the_oldest_and_says_so() -> None:
    q: IdQueue[str] = IdQueue()
    assert [q.push(x, 2) for x in "abc"] == [False, False, True]
    assert q.after(0) == [(2, "b"), (3, "c")]  # id 1 dropped: a gap a reader can see
    assert q.last_id == 3


@given(
    st.lists(
        st.tuples(st.sampled_from(["push", "pop", "ack"]), st.integers(min_value=-2, max_value=8))
    )
)
def test_it_behaves_as_a_list_of_id_item_pairs(ops: list[tuple[str, int]]) -> None:
    """Against a model: a list of (id, item), ids counting from 1 in push order."""
    q: IdQueue[int] = IdQueue()
    model: list[tuple[int, int]] = []
    pushed = 0
    for op, n in ops:
        if op == "push":
            pushed += 1
            dropped = q.push(pushed, 4)
            assert dropped == (len(model) >= 4)
            model = model[1:] if dropped else model
            model.append((pushed, pushed))
        elif op == "pop":
            assert q.pop(n) == [item for _, item in model[: max(0, n)]]
            model = model[max(0, n) :]
        else:
            gone = [x for x in model if x[0] <= n]
            assert q.acknowledge(n) == len(gone)
            model = model[len(gone) :]
        assert q.last_id == pushed
        assert len(q) == len(model)
        for after in range(-1, pushed + 1):
            assert q.after(after) == [x for x in model if x[0] > after]
            assert q.has_after(after) == any(x[0] > after for x in model)
