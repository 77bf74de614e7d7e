"""A throwaway PostgreSQL server for the lab: ``initdb`` + ``pg_ctl`` in a temporary directory.

The controller's PostgreSQL store (``sixlab.controller.store``) is tested and measured
against a real server, Debian's ``postgresql`` package, never a mock. The server
refuses to run as root, so when the lab runs as root (it always does: namespaces) the
cluster belongs to an unprivileged system user (``postgres``, which the Debian package
creates) and every server command runs through ``runuser``. It listens on a Unix socket
in its own directory only (no TCP port to collide with anything), trusts local
connections (the directory is the lab's, mode 0700 apart from the socket's owner), and
is stopped (``pg_ctl stop -m immediate``) and deleted by :meth:`LabPostgres.close`, even
after a failure; :func:`sweep_postgres` stops what a killed run left behind.

::

    with LabPostgres() as pg:
        url = pg.create_database("t1")      # postgresql:///t1?host=/tmp/sixlab-pg-…&user=postgres
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from sixlab.testbed._closing import ClosingContext
from sixlab.testbed._topology import TestbedError

__all__ = ["DEFAULT_PG_USER", "PG_PREFIX", "LabPostgres", "find_pg_bin", "sweep_postgres"]

#: The system user that owns the cluster when the lab runs as root.
DEFAULT_PG_USER = "postgres"
#: Every lab cluster's directory starts with this (in the system temporary directory).
PG_PREFIX = "sixlab-pg-"
#: Settings for a throwaway server: no fsync (the data dies with the run) and a
#: connection limit large enough for several controllers and benchmark clients.
THROWAWAY_SETTINGS: Mapping[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
}


def find_pg_bin() -> Path:
    """The directory of ``initdb``, ``pg_ctl`` and ``psql``: Debian keeps it out of PATH."""
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if versions:
        return versions[-1].parent
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    raise TestbedError("postgres: no pg_ctl (install Debian's postgresql package; ./run does)")


class LabPostgres(ClosingContext):
    """A PostgreSQL cluster in a fresh temporary directory, started at construction."""

    def __init__(
        self,
        *,
        settings: Mapping[str, str] | None = None,
        user: str = DEFAULT_PG_USER,
        start_timeout_s: float = 60.0,
        netns: str | None = None,
    ) -> None:
        """``netns``: run the server in that network namespace (its TCP side, with
        ``settings={"listen_addresses": ...}``, is then reached from there only; its
        Unix socket from anywhere)."""
        self.bin = find_pg_bin()
        self.settings = dict(THROWAWAY_SETTINGS if settings is None else settings)
        self._in: list[str] = [] if netns is None else ["ip", "netns", "exec", netns]
        self._as: list[str] = []
        self._owner: tuple[int, int] | None = None
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam(user)
            except KeyError:
                raise TestbedError(
                    f"postgres: no system user {user!r} to run the server as (it refuses root)"
                ) from None
            self._as = ["runuser", "-u", user, "--"]
            self._owner = (pw.pw_uid, pw.pw_gid)
        self.dir = Path(tempfile.mkdtemp(prefix=PG_PREFIX))
        self.data = self.dir / "data"
        self.socket_dir = self.dir
        self.log = self.dir / "server.log"
        self._running = False
        self._closed = False
        try:
            if self._owner is not None:
                os.chown(self.dir, *self._owner)
            # The pid of the process that owns the cluster: sweep_postgres stops the
            # clusters of dead owners only.
            (self.dir / "owner.pid").write_text(f"{os.getpid()}\n")
            self._run(
                "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                "--encoding=UTF8", "--no-sync", "-N",
            )  # fmt: skip
            self.start(start_timeout_s)
        except BaseException:
            self.close()
            raise

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the server (again, after ``stop``), waiting until it accepts connections."""
        if self._closed:
            raise TestbedError("postgres: the cluster is closed")
        options = " ".join(
            [f"-k {self.socket_dir}", "-c listen_addresses=''"]
            + [f"-c {k}={v}" for k, v in self.settings.items()]
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options,
            "-w", "-t", str(int(timeout_s)), "start",
        )  # fmt: skip
        self._running = True

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server, keeping its data: a database outage, ended by ``start``.
        ``mode`` is pg_ctl's: ``immediate`` drops every connection at once (as a crash
        does; the next start recovers from the WAL), ``fast`` rolls them back first."""
        if mode not in ("immediate", "fast", "smart"):
            raise TestbedError(f"postgres: {mode!r} is not a pg_ctl stop mode")
        if self._running:
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")
            self._running = False

    def _run(self, tool: str, *args: str) -> None:
        argv = [*self._in, *self._as, str(self.bin / tool), *args]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = ""
            with contextlib.suppress(OSError):
                tail = self.log.read_text()[-2000:]
            raise TestbedError(
                f"postgres: {tool} failed ({done.returncode}): {done.stderr.strip()}\n{tail}"
            )

    def url(self, database: str = "postgres") -> str:
        """A libpq URL of a database on this server (over its Unix socket)."""
        return f"postgresql:///{database}?host={self.socket_dir}&user=postgres"

    def create_database(self, name: str) -> str:
        """Create an empty database and return its URL."""
        if not name.replace("_", "").isalnum():
            raise TestbedError(f"postgres: {name!r} is not a plain database name")
        self.psql(f"CREATE DATABASE {name}")
        return self.url(name)

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run one SQL command with ``psql`` (as the client, this process's user)."""
        done = subprocess.run(
            [str(self.bin / "psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1",
             "-d", self.url(database), "-c", sql],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise TestbedError(f"postgres: {sql!r} failed: {done.stderr.strip()}")
        return done.stdout

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._running:
            self._running = False
            with contextlib.suppress(TestbedError):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            _kill_postmaster(self.data)
        shutil.rmtree(self.dir, ignore_errors=True)


def _kill_postmaster(data: Path) -> None:
    """SIGKILL the cluster's postmaster if it is still there (pg_ctl failed or hung)."""
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def sweep_postgres() -> list[Path]:
    """Stop and delete lab clusters whose owning process is gone; return their dirs."""
    swept = []
    for d in Path(tempfile.gettempdir()).glob(PG_PREFIX + "*"):
        try:
            owner = int((d / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        else:
            continue
        _kill_postmaster(d / "data")
        shutil.rmtree(d, ignore_errors=True)
        swept.append(d)
    return swept
