"""Every import statement of the source tree, read with ``ast`` (for the architecture tests).

An import is counted wherever it stands: at module level, under ``if TYPE_CHECKING:``,
or inside a function (a lazy import is a dependency all the same).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE_DIR = SRC / "sixlab"
BENCHMARKS = ROOT / "benchmarks"


@dataclass(frozen=True, slots=True)
class Import:
    """One imported dotted name, as written (``from a.b import c`` gives ``a.b.c``)."""

    importer: str  # ``sixlab.stamp.sender``, or a path for a file outside the package
    path: Path
    line: int
    target: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.importer} imports {self.target}"


def module_name(path: Path) -> str:
    """``src/sixlab/stamp/sender.py`` → ``sixlab.stamp.sender`` (``__init__`` dropped)."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(*, benchmarks: bool = True) -> list[Path]:
    """The package's modules (generated stubs left out), and the benchmark scripts."""
    files = [p for p in PACKAGE_DIR.rglob("*.py") if "_generated" not in p.parts]
    if benchmarks:
        files += BENCHMARKS.rglob("*.py")
    return sorted(files)


def imports_of(path: Path) -> Iterator[Import]:
    """Each name ``path`` imports, relative imports resolved to absolute ones."""
    in_package = path.is_relative_to(PACKAGE_DIR)
    importer = module_name(path) if in_package else str(path.relative_to(ROOT))
    # The package a relative import starts from: the module's own for an ``__init__``.
    here = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(importer, path, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                yield Import(importer, path, node.lineno, f"{base}.{alias.name}")


def package_of(module: str) -> str | None:
    """``sixlab.stamp.sender`` → ``stamp``; None for non-sixlab names and for the top
    level (``sixlab``, ``sixlab.__version__``, ``sixlab.__main__``)."""
    parts = module.split(".")
    if parts[0] != "sixlab" or len(parts) < 2 or parts[1].startswith("__"):
        return None
    return parts[1]
