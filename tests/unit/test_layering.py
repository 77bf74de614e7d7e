"""The import layers of ``src/sixlab``: a package imports only packages below it.

::

    cli                              the ``sixlab`` command
    bench                            generators, PDR search, studies
    testbed                          namespaces, links, link emulation
    controller                       the SDN controller
    southbound                       the agents' gRPC API
    dataplane                        STAMP planes and engines
    stamp | ilnp                     sans-I/O STAMP; the ILNP host and its daemon
    wire | linux                     codecs; kernel plumbing
    registry                         the name registry (any package may use it)

Packages side by side on one layer do not import each other (STAMP and ILNP are two
systems; codecs and kernel plumbing know nothing of each other). ``sixlab`` itself and
``sixlab.__main__`` may import ``cli``. Every import counts, lazy ones inside functions
and ``TYPE_CHECKING`` ones included.
"""

from __future__ import annotations

import pytest

from tests.unit._imports import PACKAGE_DIR, Import, imports_of, package_of, source_files

LAYERS: list[set[str]] = [
    {"registry"},
    {"wire", "linux"},
    {"stamp", "ilnp"},
    {"dataplane"},
    {"southbound"},
    {"controller"},
    {"testbed"},
    {"bench"},
    {"cli"},
]
LAYER = {package: rank for rank, layer in enumerate(LAYERS) for package in layer}
#: The top level (``sixlab/__init__.py``, ``sixlab/__main__.py``) starts the command.
TOP_LEVEL_MAY_IMPORT = {"cli"}


def allowed(importer: str | None) -> set[str]:
    """The packages a module of package ``importer`` (None: the top level) may import."""
    if importer is None:
        return set(TOP_LEVEL_MAY_IMPORT)
    return {importer} | {p for p, rank in LAYER.items() if rank < LAYER[importer]}


def violation(imp: Import) -> str | None:
    """What is wrong with ``imp``, naming the module, the import and the rule; or None."""
    target = package_of(imp.target)
    if target is None:  # not sixlab, or the top level (``sixlab.__version__``)
        return None
    importer = package_of(imp.importer)
    if target in allowed(importer):
        return None
    if importer is None:
        rule = f"the top level may import only {sorted(TOP_LEVEL_MAY_IMPORT)}"
    else:
        below = sorted(allowed(importer) - {importer}, key=lambda p: (LAYER[p], p))
        what = f"only {below}" if below else "nothing else from sixlab"
        rule = f"{importer} (layer {LAYER[importer]}) may import {what}"
        if LAYER.get(target) == LAYER[importer]:
            rule += f"; {target} is beside it, on the same layer"
    return f"{imp}: {rule}"


def test_every_package_has_a_layer() -> None:
    found = {p.name for p in PACKAGE_DIR.iterdir() if (p / "__init__.py").exists()}
    found |= {p.stem for p in PACKAGE_DIR.glob("*.py") if not p.stem.startswith("__")}
    assert found == set(LAYER), "place new packages in LAYERS (and the module docstring)"


def test_no_module_imports_a_package_above_or_beside_it() -> None:
    problems = [
        problem
        for path in source_files(benchmarks=False)
        for imp in imports_of(path)
        if (problem := violation(imp)) is not None
    ]
    assert not problems, "layering:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("importer", "target", "wrong"),
    [
        ("sixlab.controller.core", "sixlab.testbed.Testbed", True),  # above
        ("sixlab.testbed._topology", "sixlab.bench.generator", True),  # above
        ("sixlab.stamp.sender", "sixlab.ilnp.host", True),  # beside
        ("sixlab.wire.ipv6", "sixlab.linux.cbpf.Assembler", True),  # beside
        ("sixlab.registry", "sixlab.wire.WireError", True),  # beside
        ("sixlab.linux.libbpf", "sixlab.dataplane", True),  # above
        ("sixlab.__main__", "sixlab.controller.core", True),  # top level: cli only
        ("sixlab.cli", "sixlab.wire.stamp", False),
        ("sixlab.dataplane.engine", "sixlab.stamp", False),
        ("sixlab.dataplane.base", "sixlab.registry.Registry", False),
        ("sixlab.ilnp.daemon", "sixlab.linux.nftdrop", False),
        ("sixlab.cli", "sixlab.__version__", False),
        ("sixlab.__main__", "sixlab.cli.main", False),
        ("sixlab.wire.ipv6", "sixlab.wire._errors", False),
    ],
)
def test_the_rule_itself(importer: str, target: str, wrong: bool) -> None:
    """The check above could find something: each kind of wrong import is named."""
    path = next(iter(source_files(benchmarks=False)))
    problem = violation(Import(importer, path, 1, target))
    assert (problem is not None) is wrong
    if problem is not None:
        assert importer in problem
        assert target in problem
        assert "may import" in problem


def test_lazy_and_type_checking_imports_are_seen() -> None:
    base = {imp.target for imp in imports_of(PACKAGE_DIR / "dataplane" / "base.py")}
    # ``if TYPE_CHECKING: from sixlab.stamp.reflector import ReflectorSessionConfig``
    assert "sixlab.stamp.reflector.ReflectorSessionConfig" in base
    cli = {imp.target for imp in imports_of(PACKAGE_DIR / "cli" / "__init__.py")}
    # build_parser imports the command groups inside the function.
    assert "sixlab.cli.demo" in cli
