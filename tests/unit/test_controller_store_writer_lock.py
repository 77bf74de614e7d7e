"""The SQLite file's writer lock (``SqliteStore``): replicas of one host queue their
write transactions on a ``flock`` of the file beside the database. A replica stopped
while it holds it (SIGSTOP, a debugger) must not stop every other one's writes for
good: a write waits ``writer_wait_s``, then fails with ``StoreUnavailableError``, and
writes go through again once the holder lets go."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sixlab.controller.store import SqliteStore, StoreUnavailableError
from tests.integration._simagents import wait_for

#: Longer than any write here takes once it has the lock (s): a write still running
#: after it is hung.
HUNG_S = 20.0

#: A process that takes the writer lock and stops itself while holding it.
_STOPPED_HOLDER = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def _state(pid: int) -> str:
    # /proc/PID/stat: "pid (comm) state ..."; the command has no ")" here.
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]


@contextlib.contextmanager
def _stopped_holder(lock_path: str) -> Iterator[subprocess.Popen[str]]:
    with subprocess.Popen(
        [sys.executable, "-c", _STOPPED_HOLDER, lock_path], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "held"
            wait_for("the holder stopped", lambda: _state(proc.pid) == "T", HUNG_S)
            yield proc
        finally:
            proc.kill()


def _in_thread(call: Callable[[], object]) -> list[object]:
    """Run ``call`` in a thread; [result] or [exception], or fail if it hangs."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:  # noqa: BLE001 - the test looks at what it raised
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(HUNG_S)
    assert not t.is_alive(), f"the write still waits after {HUNG_S} s: hung on the lock"
    return out


def _lock_is_free(lock_path: str) -> bool:
    fd = os.open(lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing lets go of it
    return True


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "c.sqlite")
    s.writer_wait_s = 0.3
    try:
        yield s
    finally:
        s.close()


def _add_session(store: SqliteStore, name: str, ssid: int) -> None:
    store.add_sessions([(name, ssid, "s1", "r1", {})], now_ns=1)


def test_a_stopped_holder_fails_writes_in_time_then_they_go_through(
    store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.add_node("s1", "[::1]:1", "sender")
    store.add_node("r1", "[::1]:2", "reflector")
    lock_path = store.path + "-writer"
    with _stopped_holder(lock_path) as holder:
        # A transaction fails in time, and stores nothing.
        (out,) = _in_thread(lambda: _add_session(store, "p1", 1))
        assert isinstance(out, StoreUnavailableError)
        assert lock_path in str(out)
        assert "0.3 s" in str(out)
        assert store.sessions() == []
        # A second waits again, in time, though the first one's wait is still blocked
        # in the kernel.
        (out,) = _in_thread(lambda: _add_session(store, "p1", 1))
        assert isinstance(out, StoreUnavailableError)
        # A write outside a transaction is stored; its notice to the other replicas,
        # a transaction of its own, is not, and says so (they see it at their next
        # poll).
        (out,) = _in_thread(lambda: store.add_node("s2", "[::1]:3", "sender"))
        assert out is None
        assert "s2" in [n.name for n in store.nodes()]
        assert any("not written for the other replicas" in r.getMessage() for r in caplog.records)
        holder.send_signal(signal.SIGCONT)  # it exits, and lets go with it
        holder.wait(HUNG_S)
    _add_session(store, "p1", 1)
    assert [s.name for s in store.sessions()] == ["p1"]
    # The waits that gave up took the lock when it came free, and let go of it.
    wait_for("the writer lock free", lambda: _lock_is_free(lock_path), HUNG_S)


def test_a_write_that_waits_gets_the_lock_when_the_holder_lets_go(store: SqliteStore) -> None:
    store.add_node("s1", "[::1]:1", "sender")
    store.add_node("r1", "[::1]:2", "reflector")
    lock_path = store.path + "-writer"
    other = os.open(lock_path, os.O_RDWR)  # another process's, as flock sees it
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        (out,) = _in_thread(lambda: _add_session(store, "p1", 1))
        assert isinstance(out, StoreUnavailableError)  # the abandoned wait stays queued
        store.writer_wait_s = HUNG_S
        done = threading.Event()

        def add() -> None:
            _add_session(store, "p2", 2)
            done.set()

        threading.Thread(target=add, daemon=True).start()
        assert not done.wait(0.3)  # it waits its turn
        fcntl.flock(other, fcntl.LOCK_UN)
        assert done.wait(HUNG_S)
        assert [s.name for s in store.sessions()] == ["p2"]
        # Once the store let go, the other writer takes the lock without waiting.
        wait_for("the writer lock free", lambda: _lock_is_free(lock_path), HUNG_S)
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(other, fcntl.LOCK_UN)
    finally:
        os.close(other)


def test_writes_of_two_stores_on_one_file_take_turns(tmp_path: Path) -> None:
    """Two stores on the file (two replicas' connections), each writing from threads of
    its own at once: every write lands, none fails on the lock."""
    a, b = SqliteStore(tmp_path / "c.sqlite"), SqliteStore(tmp_path / "c.sqlite")
    try:
        errors: list[BaseException] = []

        def write(s: SqliteStore, prefix: str) -> None:
            try:
                for i in range(40):
                    s.add_node(f"{prefix}{i}", f"[::1]:{i + 1}", "sender")  # and a notice
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(s, p)) for s, p in
                   ((a, "a"), (b, "b"), (a, "c"), (b, "d"))]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(HUNG_S * 3)
        assert not errors
        assert len(a.nodes()) == 160
        assert _lock_is_free(a.path + "-writer")
    finally:
        b.close()
        a.close()
