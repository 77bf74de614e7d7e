"""The lab's PostgreSQL server: a real server, one database per test, gone after close."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from sixlab.testbed import LabPostgres, TestbedError, sweep_postgres


def test_databases_are_separate_and_usable(lab_postgres: LabPostgres, pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("CREATE TABLE t (x bigint)")
        db.execute("INSERT INTO t VALUES (1), (2)")
        row = db.execute("SELECT sum(x), current_database(), current_user FROM t").fetchone()
    assert row is not None
    assert (int(row[0]), row[2]) == (3, "postgres")
    other = lab_postgres.create_database("other_db")
    with psycopg.connect(other) as db, pytest.raises(psycopg.errors.UndefinedTable):
        db.execute("SELECT * FROM t")


def test_server_runs_unprivileged_on_its_socket_only(lab_postgres: LabPostgres) -> None:
    pid = int((lab_postgres.data / "postmaster.pid").read_text().split()[0])
    uid = Path(f"/proc/{pid}").stat().st_uid
    assert uid != 0
    assert lab_postgres.psql("SHOW listen_addresses").strip() == ""
    assert (lab_postgres.socket_dir / ".s.PGSQL.5432").is_socket()


def test_close_stops_the_server_and_deletes_its_directory() -> None:
    pg = LabPostgres()
    pid = int((pg.data / "postmaster.pid").read_text().split()[0])
    directory = pg.dir
    pg.close()
    pg.close()  # idempotent
    assert not directory.exists()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()


def test_a_cluster_whose_owner_died_is_swept() -> None:
    pg = LabPostgres()
    pid = int((pg.data / "postmaster.pid").read_text().split()[0])
    # Pretend the owner is a process that exited (pid 2**22 + 1 is above pid_max's default
    # range; a real dead pid would do as well).
    (pg.dir / "owner.pid").write_text(f"{2**22 + 1}\n")
    try:
        assert pg.dir in sweep_postgres()
        assert not pg.dir.exists()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{pid}").exists()
    finally:
        pg.close()


def test_bad_database_names_are_refused(lab_postgres: LabPostgres) -> None:
    with pytest.raises(TestbedError, match="plain database name"):
        lab_postgres.create_database("x; DROP DATABASE postgres")
