"""The public surface of every package (in the manner of trio's ``test_exports``).

Each package says what it offers in its ``__init__``'s ``__all__``; its ``_private``
modules are its own business. Other packages, and the benchmark scripts, import only
public names: a package's ``__all__`` or a public module of it. Tests may import
anything.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

import sixlab
from tests.unit._imports import Import, imports_of, package_of, source_files

PACKAGES = [
    "wire",
    "linux",
    "stamp",
    "ilnp",
    "dataplane",
    "southbound",
    "controller",
    "testbed",
    "bench",
    "cli",
]


def _public_modules() -> list[str]:
    return sorted(
        info.name
        for info in pkgutil.walk_packages(sixlab.__path__, "sixlab.")
        if not any(part.startswith("_") for part in info.name.split(".")[1:])
    )


def _all_of(module: ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    assert isinstance(names, list), f"{module.__name__} has no __all__ list"
    return names


def test_every_package_is_listed() -> None:
    found = {info.name for info in pkgutil.iter_modules(sixlab.__path__) if info.ispkg}
    assert found == set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_package_exports_exist(package: str) -> None:
    module = importlib.import_module(f"sixlab.{package}")
    names = _all_of(module)
    assert names, f"sixlab.{package} exports nothing"
    assert len(names) == len(set(names)), f"sixlab.{package}.__all__ repeats a name"
    missing = [name for name in names if not hasattr(module, name)]
    assert not missing, f"sixlab.{package}.__all__ names what it does not have: {missing}"
    private = [name for name in names if name.startswith("_")]
    assert not private, f"sixlab.{package}.__all__ exports private names: {private}"


@pytest.mark.parametrize("name", _public_modules())
def test_public_module_exports_exist(name: str) -> None:
    module = importlib.import_module(name)
    names = _all_of(module)
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not have: {missing}"


def _reaches_into(imp: Import) -> bool:
    """Does ``imp`` name a ``_private`` module or name of a package not the importer's?"""
    target = package_of(imp.target)
    if target is None or target == package_of(imp.importer):
        return False
    return any(part.startswith("_") for part in imp.target.split(".")[1:])


def test_no_package_imports_another_packages_private_modules() -> None:
    bad = [str(imp) for path in source_files() for imp in imports_of(path) if _reaches_into(imp)]
    assert not bad, "private modules and names are their package's own:\n" + "\n".join(bad)


def test_the_private_import_check_sees_every_form() -> None:
    """The check above catches each way of writing the import (a check that finds
    nothing proves something only if it could have found something)."""
    here = next(p for p in source_files() if p.name == "engine.py")
    cases = {
        "sixlab.stamp._events": True,  # import sixlab.stamp._events
        "sixlab.stamp._events.StampResult": True,  # from sixlab.stamp._events import X
        "sixlab.wire.packet._HEADER": True,  # a private name of a public module
        "sixlab.dataplane._filters.stamp_drop": False,  # its own package
        "sixlab.stamp.StampResult": False,
        "sixlab.__version__": False,
    }
    for target, expected in cases.items():
        assert _reaches_into(Import("sixlab.dataplane.engine", here, 1, target)) is expected, target
