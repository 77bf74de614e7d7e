"""The daemon's state file (sixlab.ilnp.leftovers): whose it is, and when it is trusted.

What undoing does to a namespace is tested for real in
``tests/integration/test_ilnp_io.py::test_a_killed_daemons_leavings_are_undone``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sixlab.ilnp import DaemonError
from sixlab.ilnp.leftovers import (
    Leftovers,
    netns_cookie,
    process_start,
    save,
    state_path,
    undo,
)


def _dead_pid() -> tuple[int, int]:
    """The pid and start time of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    started = process_start(proc.pid)
    assert started is not None
    proc.kill()
    proc.wait()
    return proc.pid, started


def _dead_daemons_file(tmp_path: Path, netns: int) -> tuple[str, Path, Path]:
    """A dead daemon's state file naming a sysctl it set (found 0, now 1) and a file
    it made; (state file, sysctl, file)."""
    sysctl = tmp_path / "sysctl"
    sysctl.write_text("1\n")
    names = tmp_path / "names"
    names.write_text("fd00:2ff::b bob\n")
    pid, started = _dead_pid()
    path = str(tmp_path / "state")
    leftovers = Leftovers(pid=pid, started=started, netns=netns, files=[str(names)])
    leftovers.sysctls[str(sysctl)] = "0"
    save(path, leftovers)
    return path, sysctl, names


def test_a_dead_daemons_file_is_undone_and_removed(tmp_path: Path) -> None:
    path, sysctl, names = _dead_daemons_file(tmp_path, netns_cookie())
    done = undo(path)
    assert done == [f"{sysctl} back to 0", f"removed {names}"]
    assert sysctl.read_text() == "0\n"
    assert not names.exists()
    assert not Path(path).exists()
    assert undo(path) == []  # nothing twice


def test_a_live_daemons_file_is_refused_and_kept(tmp_path: Path) -> None:
    path = str(tmp_path / "state")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = process_start(proc.pid)
        assert started is not None
        save(path, Leftovers(pid=proc.pid, started=started, netns=netns_cookie()))
        with pytest.raises(DaemonError, match=f"pid {proc.pid}"):
            undo(path)
        assert Path(path).exists()
    finally:
        proc.kill()
        proc.wait()


def test_a_reused_pid_is_not_the_daemon(tmp_path: Path) -> None:
    """A live process (our parent) started at another time than the file says: the
    file's daemon is dead, its pid reused."""
    path = str(tmp_path / "state")
    started = process_start(os.getppid())
    assert started is not None
    save(path, Leftovers(pid=os.getppid(), started=started + 1, netns=netns_cookie()))
    assert undo(path) == []
    assert not Path(path).exists()


def test_another_namespaces_file_is_discarded_unread(tmp_path: Path) -> None:
    path, sysctl, names = _dead_daemons_file(tmp_path, netns_cookie() + 1)
    assert undo(path) == []
    assert sysctl.read_text() == "1\n"  # not ours to touch
    assert names.exists()
    assert not Path(path).exists()


@pytest.mark.parametrize("content", ["", "{", "[]", json.dumps({"pid": 1}), "\xff"])
def test_an_unreadable_file_is_an_error_and_removed(tmp_path: Path, content: str) -> None:
    path = tmp_path / "state"
    path.write_text(content)
    with pytest.raises(DaemonError, match="unreadable"):
        undo(str(path))
    assert not path.exists()


def test_the_path_is_per_namespace_and_tun_and_never_a_directory() -> None:
    inode = Path("/proc/thread-self/ns/net").stat().st_ino
    assert state_path("ilnp0") == f"/run/sixlab-ilnp-{inode}-ilnp0.state"
    assert "/" not in state_path("bad/../tun").removeprefix("/run/")
    assert netns_cookie() > 0
