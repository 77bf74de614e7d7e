"""Compile the BPF programs of ``sixlab/linux/bpf/`` on first use, and cache them.

The XDP plane's programs and the ILNP host's tc fast path (``ilnp_fastpath``) are built
together, with one cache key.

Theory of operation
-------------------
The BPF C sources ship inside the package; the objects do not, because CO-RE needs a
``vmlinux.h`` that describes the running kernel's types, and that file is generated,
never committed: ``bpftool btf dump file /sys/kernel/btf/vmlinux format c``. At first
use ``build_objects`` writes it into a cache directory and runs
``clang -target bpf -O2 -g`` on each ``*.bpf.c`` (``-g`` keeps the BTF that libbpf's CO-RE
relocations and map definitions need).

The cache key is a SHA-256 over the sources (every file of ``bpf/``, names and bytes),
the kernel's BTF blob and the clang version: a new kernel, a changed source or another
compiler gives another directory, so a stale object is never loaded. The directory is
``$SIXLAB_BPF_CACHE`` if set, else ``$XDG_CACHE_HOME/sixlab/bpf`` or
``~/.cache/sixlab/bpf``, then ``<key>/``. Concurrent first uses (two agents, parallel
tests) serialise on an ``flock`` of the directory; each output is written to a
temporary name and renamed, so a reader never sees half an object.

A missing compiler or bpftool raises ``BuildError`` naming the Debian package.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from sixlab.linux.errors import LinuxError

__all__ = [
    "KERNEL_BTF",
    "PROGRAMS",
    "BuildError",
    "build_objects",
    "cache_key",
    "cache_root",
    "find_tool",
    "source_dir",
]

#: The running kernel's BTF: what vmlinux.h is generated from and CO-RE relocates to.
KERNEL_BTF = Path("/sys/kernel/btf/vmlinux")
#: Object name -> its C source in ``bpf/``.
PROGRAMS = {
    "stamp_reflector": "stamp_reflector.bpf.c",
    "stamp_collector": "stamp_collector.bpf.c",
    "xdp_pass": "xdp_pass.bpf.c",
    "stamp_xsk": "stamp_xsk.bpf.c",
    "ilnp_fastpath": "ilnp_fastpath.bpf.c",
}
#: Debian package that provides each tool.
_PACKAGES = {"clang": "clang", "bpftool": "bpftool"}
#: Where Debian installs bpftool: /usr/sbin is not on every user's PATH.
_EXTRA_PATH = ("/usr/sbin", "/sbin", "/usr/local/sbin")
#: A compile of the two programs takes about a second; ten minutes means something hangs.
_TOOL_TIMEOUT_S = 600


class BuildError(LinuxError):
    """BPF objects (or, from ``ccbuild``, a C helper) cannot be built; the message says
    which tool or step failed."""


def source_dir() -> Path:
    return Path(__file__).with_name("bpf")


def find_tool(name: str) -> str:
    """Path of ``clang`` or ``bpftool``; BuildError naming the package if absent."""
    candidates = [name]
    if name == "clang":
        candidates += [f"clang-{v}" for v in range(20, 12, -1)]
    search = os.pathsep.join([os.environ.get("PATH", ""), *_EXTRA_PATH])
    for candidate in candidates:
        found = shutil.which(candidate, path=search)
        if found:
            return found
    raise BuildError(
        f"xdp: {name} not found; install it with `apt-get install {_PACKAGES[name]}`"
        + (" libbpf-dev" if name == "clang" else "")
    )


def cache_root() -> Path:
    env = os.environ.get("SIXLAB_BPF_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "sixlab" / "bpf"


def _run(argv: list[str], what: str) -> bytes:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=_TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"xdp: {what} failed to run: {exc}") from exc
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace")[-4000:]
        raise BuildError(f"xdp: {what} failed (exit {done.returncode}):\n{err}")
    return done.stdout


def cache_key(clang: str, btf: Path = KERNEL_BTF) -> str:
    """SHA-256 over the sources, the kernel BTF and the compiler's version."""
    h = hashlib.sha256()
    for path in sorted(source_dir().iterdir()):
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    try:
        h.update(btf.read_bytes())
    except OSError as exc:
        raise BuildError(
            f"xdp: cannot read the kernel BTF {btf} ({exc.strerror}); "
            "the kernel must be built with CONFIG_DEBUG_INFO_BTF"
        ) from exc
    h.update(_run([clang, "--version"], "clang --version"))
    return h.hexdigest()[:32]


def _write_atomic(target: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        Path(tmp).replace(target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build_objects(root: Path | None = None, *, btf: Path = KERNEL_BTF) -> dict[str, Path]:
    """Object file of every program, compiling what the cache lacks. Name -> path."""
    clang = find_tool("clang")
    key = cache_key(clang, btf)
    out_dir = (root or cache_root()) / key
    wanted = {name: out_dir / f"{name}.bpf.o" for name in PROGRAMS}
    if all(p.exists() for p in wanted.values()):
        return wanted
    bpftool = find_tool("bpftool")
    out_dir.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(out_dir, os.O_RDONLY)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        vmlinux = out_dir / "vmlinux.h"
        if not vmlinux.exists():
            header = _run(
                [bpftool, "btf", "dump", "file", str(btf), "format", "c"], "bpftool btf dump"
            )
            _write_atomic(vmlinux, header)
        for name, obj in wanted.items():
            if obj.exists():
                continue
            tmp = out_dir / f".{name}.{os.getpid()}.o"
            _run(
                [
                    clang,
                    "-target",
                    "bpf",
                    "-O2",
                    "-g",
                    # v3: 32-bit jumps and atomic fetch-add (the stateful counter).
                    "-mcpu=v3",
                    "-Wall",
                    "-I",
                    str(out_dir),
                    "-I",
                    str(source_dir()),
                    "-c",
                    str(source_dir() / PROGRAMS[name]),
                    "-o",
                    str(tmp),
                ],
                f"clang ({PROGRAMS[name]})",
            )
            tmp.replace(obj)
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)
    return wanted
