"""Compile one C file shipped in the package with the system gcc, once per source version.

The packet generators of ``sixlab.bench`` (programs) and the socket plane's batched probe
path (a shared object loaded with ctypes) are small C files next to their Python modules.
The output is cached as ``<stem>-<first 16 hex digits of the source's SHA-256>[.so]`` in
``$XDG_CACHE_HOME/sixlab/<area>`` (``~/.cache`` when unset): an edited source is rebuilt,
an unchanged one never is. Each build is written to a temporary name in that directory
and renamed, so concurrent first uses see all or nothing.

A missing compiler, a cache that cannot be written or a failing compile raise
``BuildError`` with the reason; callers decide whether that is fatal (a generator) or a
fallback (the probe path keeps its pure-Python twin).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from sixlab.linux.bpfbuild import BuildError

__all__ = ["build_c", "cache_dir"]


def cache_dir(area: str) -> Path:
    """``$XDG_CACHE_HOME/sixlab/<area>``, or ``~/.cache/sixlab/<area>``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sixlab" / area


def build_c(source_path: Path, directory: Path, *, shared: bool = False) -> Path:
    """``gcc -O2 -Wall`` on ``source_path`` into ``directory`` (a program, or with
    ``shared`` a ``-shared -fPIC`` object), unless this source's build is there; its path."""
    source = source_path.read_bytes()
    suffix = ".so" if shared else ""
    target = directory / f"{source_path.stem}-{hashlib.sha256(source).hexdigest()[:16]}{suffix}"
    if target.exists():
        return target
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise BuildError(f"no C compiler to build {source_path.name} (apt-get install gcc)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{source_path.stem}-", suffix=suffix)
    except OSError as exc:
        raise BuildError(f"cannot write the build of {source_path.name}: {exc}") from exc
    os.close(fd)
    flags = ["-shared", "-fPIC"] if shared else []
    try:
        subprocess.run(  # a fixed compiler command on the package's own source
            [gcc, "-O2", "-Wall", *flags, "-o", tmp, str(source_path)],
            check=True,
            capture_output=True,
            text=True,
        )
        Path(tmp).replace(target)
    except subprocess.CalledProcessError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise BuildError(f"cannot compile {source_path.name}: {exc.stderr}") from exc
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise BuildError(f"cannot build {source_path.name}: {exc}") from exc
    return target
