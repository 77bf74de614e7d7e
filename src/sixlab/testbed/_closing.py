"""A context manager that closes what it holds when the ``with`` block ends.

``with Testbed() as tb:`` and ``tb = Testbed(); ...; tb.close()`` are the same: a
subclass writes :meth:`ClosingContext.close` (idempotent, never raising for what is
already gone) and gets ``__enter__`` (returns the object itself) and ``__exit__``
(calls ``close``, whether the block ended normally or by an exception, which then
propagates: ``__exit__`` returns None).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

__all__ = ["ClosingContext"]


class ClosingContext(ABC):
    """``__enter__`` returns ``self``; ``__exit__`` calls :meth:`close`."""

    @abstractmethod
    def close(self) -> None:
        """Release everything the object holds."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
