"""One exception tree per package, drawn in the package's docstring.

Every exception class a package defines (its private helpers aside) derives from the
package's one root, which the package exports; the docstring of the package names
every class of the tree. The ILNP CLI relies on it: it catches ``IlnpError`` alone.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

from sixlab.bench import GeneratorError
from sixlab.cli.ilnp import main as ilnp_main
from sixlab.controller import ControllerError
from sixlab.dataplane import DataplaneError
from sixlab.ilnp import DaemonError, IlnpError, ResolveError, UnknownBackendError
from sixlab.ilnp.daemon import DaemonConfig, run_daemon
from sixlab.ilnp.resolve import Resolver
from sixlab.linux import LinuxError
from sixlab.southbound import RpcError
from sixlab.stamp import StampError
from sixlab.testbed import TestbedError
from sixlab.wire import WireError
from sixlab.wire.ilnp import LocatorEntry

ROOTS: dict[str, type[Exception]] = {
    "wire": WireError,
    "linux": LinuxError,
    "stamp": StampError,
    "ilnp": IlnpError,
    "dataplane": DataplaneError,
    "southbound": RpcError,
    "controller": ControllerError,
    "testbed": TestbedError,
    "bench": GeneratorError,
}


def _exception_classes(package: str) -> list[type[BaseException]]:
    """The public exception classes defined in the modules of ``sixlab.<package>``."""
    top = importlib.import_module(f"sixlab.{package}")
    names = [top.__name__] + [
        info.name
        for info in pkgutil.walk_packages(top.__path__, f"{top.__name__}.")
        if "_generated" not in info.name
    ]
    found = []
    for name in names:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == name
                and not attr.startswith("_")
            ):
                found.append(value)
    return found


@pytest.mark.parametrize("package", sorted(ROOTS))
def test_every_error_of_a_package_derives_from_its_one_root(package: str) -> None:
    root = ROOTS[package]
    module = importlib.import_module(f"sixlab.{package}")
    assert getattr(module, root.__name__) is root, f"sixlab.{package} does not export its root"
    classes = _exception_classes(package)
    assert root in classes
    strays = [c.__qualname__ for c in classes if not issubclass(c, root)]
    assert not strays, f"sixlab.{package}: errors outside {root.__name__}: {strays}"
    undrawn = [c.__name__ for c in classes if c.__name__ not in (module.__doc__ or "")]
    assert not undrawn, f"sixlab.{package}'s docstring does not draw {undrawn}"


def test_the_cli_defines_no_public_errors() -> None:
    assert _exception_classes("cli") == []


def test_ilnp_errors_keep_their_builtin_bases() -> None:
    assert issubclass(ResolveError, LookupError)
    assert issubclass(UnknownBackendError, LookupError)
    with pytest.raises(ResolveError, match="hosts file"):
        Resolver.from_file("/nonexistent/sixlab-hosts")


def _config(tmp_path: Path, **changes: object) -> DaemonConfig:
    fields: dict[str, object] = {
        "nid": 0xA,
        "locators": (LocatorEntry(0x2001_0DB8_000A_0000, 10),),
        "interfaces": ("lo",),
        "control": str(tmp_path / "control.sock"),
        # "/" is not allowed in an interface name: the kernel refuses the TUN device
        # (EINVAL) before the daemon has changed anything.
        "tun_name": "bad/tun",
        **changes,
    }
    return DaemonConfig(**fields)  # type: ignore[arg-type]


def test_what_the_system_refuses_the_daemon_is_an_ilnp_error(tmp_path: Path) -> None:
    with pytest.raises(DaemonError, match="Invalid argument") as info:
        run_daemon(_config(tmp_path), announce=lambda _line: None)
    assert isinstance(info.value.__cause__, OSError)
    assert not (tmp_path / "control.sock").exists()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--tun", "bad/tun"], "Invalid argument"),  # DaemonError
        (["--tun", "bad/tun", "--hosts", "/nonexistent/hosts"], "hosts file"),  # ResolveError
        (["--tun", "bad/tun", "--interface", "sixlab-none0"], "no such interface"),  # Config
    ],
)
def test_the_ilnp_cli_turns_any_ilnp_error_into_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], error: str
) -> None:
    argv = ["host", "--nid", "0:0:0:a", "--locator", "2001:db8:a:0", "--interface", "lo"]
    argv += ["--control", str(tmp_path / "control.sock"), "--policy", "none", *args]
    assert ilnp_main(argv) == 1
    err = capsys.readouterr().err
    assert error in err
    assert err.count("\n") == 1
