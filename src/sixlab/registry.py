"""Named implementations: the one table each pluggable part's names come from.

sixlab picks several parts by name from configuration: the STAMP data plane
(``--dataplane``, :data:`sixlab.dataplane.base.PLANES`), the ILCC admission policy
(``--policy``, :data:`sixlab.ilnp.policy.POLICIES`) and the ILCC store (``--store``,
:data:`sixlab.ilnp.ilcc.STORES`). Each kind has one :class:`Registry`; the command
line offers its :meth:`~Registry.names` as choices and builds what :meth:`~Registry.get`
returns, so adding an implementation is adding one entry, and nothing else lists names.
The STAMP TLV codecs (:data:`sixlab.wire.stamp_tlv.TLV_CODECS`) are one too.

An entry is the implementation itself (:meth:`~Registry.add`), or the path
``"package.module:attribute"`` of one whose module is slow to import or needs optional
software (:meth:`~Registry.add_lazy`): its name is known at once, its module is
imported the first time :meth:`~Registry.get` asks for it. An implementation that
states its own ``name`` (a class attribute) must state the name of its entry.

This module is the bottom layer of the package: it imports nothing else from sixlab, so
every package may use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Implementations of one ``kind`` by name; an unknown name raises ``error(message)``.

    ``error`` is the owning package's exception class (or any callable taking the
    message), so a wrong name is that package's error, e.g. ``DataplaneError``.
    """

    def __init__(self, kind: str, error: Callable[[str], Exception] = LookupError) -> None:
        self.kind = kind
        self._error = error
        self._loaded: dict[str, T] = {}
        self._lazy: dict[str, str] = {}

    def add(self, name: str, value: T) -> T:
        """Enter ``value`` under ``name``; a name is entered once."""
        self._check_new(name)
        self._check_name(name, value)
        self._loaded[name] = value
        return value

    def add_lazy(self, name: str, path: str) -> None:
        """Enter the ``"module:attribute"`` at ``path`` under ``name``, imported on first use."""
        self._check_new(name)
        module, sep, attribute = path.partition(":")
        if not (module and sep and attribute):
            raise ValueError(f"{self.kind} {name!r}: {path!r} is not 'module:attribute'")
        self._lazy[name] = path

    def get(self, name: str) -> T:
        """The implementation entered under ``name`` (imported now if it was lazy)."""
        if name in self._loaded:
            return self._loaded[name]
        path = self._lazy.get(name)
        if path is None:
            raise self._error(
                f"unknown {self.kind} {name!r} (available: {', '.join(self.names())})"
            )
        module, _, attribute = path.partition(":")
        value: T = getattr(importlib.import_module(module), attribute)
        self._check_name(name, value)
        self._loaded[name] = value
        del self._lazy[name]
        return value

    def names(self) -> list[str]:
        """Every entered name, sorted (lazy ones without importing them)."""
        return sorted([*self._loaded, *self._lazy])

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._loaded) + len(self._lazy)

    def _check_new(self, name: str) -> None:
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is entered already")

    def _check_name(self, name: str, value: object) -> None:
        stated = getattr(value, "name", name)
        if isinstance(stated, str) and stated != name:
            raise ValueError(f"{self.kind} {name!r}: the implementation calls itself {stated!r}")
