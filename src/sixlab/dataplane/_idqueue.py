"""A FIFO whose items keep the ids they were queued with (``IdQueue``).

A sender engine keeps two per session: the records and the loss reports
(``SenderEngine.fetch``/``peek``/``acknowledge`` and ``peek_lost``/``acknowledge_lost``).
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

__all__ = ["IdQueue"]

T = TypeVar("T")


class IdQueue(Generic[T]):
    """Items numbered from 1 in the order they are pushed; taking the oldest away keeps
    the ids of the rest. A reader that handled every item up to id N asks for those
    "after N" and never sees one twice, even across its own restarts. A gap in the ids
    it sees is items dropped for room (``push`` with a capacity)."""

    __slots__ = ("_first_id", "_items")

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        #: The id of ``_items[0]`` (of the next item pushed when empty).
        self._first_id = 1

    def __len__(self) -> int:
        return len(self._items)

    @property
    def last_id(self) -> int:
        """The id of the newest item pushed, queued or not; 0 before the first."""
        return self._first_id + len(self._items) - 1

    def push(self, item: T, capacity: int) -> bool:
        """Queue ``item``, first dropping the oldest when ``capacity`` items are queued:
        whether it did."""
        full = len(self._items) >= capacity
        if full:
            self._items.popleft()
            self._first_id += 1
        self._items.append(item)
        return full

    def pop(self, max_items: int | None = None) -> list[T]:
        """Take the oldest ``max_items`` items away (all of them if None), oldest first."""
        items = self._items
        n = len(items) if max_items is None else max(0, min(max_items, len(items)))
        self._first_id += n
        return [items.popleft() for _ in range(n)]

    def acknowledge(self, through: int) -> int:
        """Take the items with ids up to ``through`` away: how many went."""
        n = min(len(self._items), max(0, through + 1 - self._first_id))
        self.pop(n)
        return n

    def has_after(self, after: int) -> bool:
        """Whether an item with an id above ``after`` is queued."""
        return self.last_id > after and bool(self._items)

    def after(self, after: int, max_items: int | None = None) -> list[tuple[int, T]]:
        """Up to ``max_items`` (all if None) of the queued items with ids above
        ``after``, oldest first, with their ids; they stay queued."""
        items = self._items
        start = max(0, after + 1 - self._first_id)
        stop = len(items) if max_items is None else min(len(items), start + max_items)
        first = self._first_id
        return [(first + i, items[i]) for i in range(start, stop)]
