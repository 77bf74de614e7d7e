"""Fixtures shared by every test directory: the lab's PostgreSQL server.

One real server per test run (Debian's ``postgresql``; ``initdb`` + ``pg_ctl`` in a
temporary directory as the unprivileged ``postgres`` user, since the server refuses
root), started on first use and always stopped and deleted at the end; every test gets
a database of its own. No mock: the store's PostgreSQL code runs against PostgreSQL.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from sixlab.testbed import LabPostgres, sweep_postgres

_databases = itertools.count(1)


@pytest.fixture(scope="session")
def lab_postgres() -> Iterator[LabPostgres]:
    """The run's PostgreSQL server (clusters of killed earlier runs are swept first)."""
    sweep_postgres()
    with LabPostgres() as pg:
        yield pg


@pytest.fixture
def pg_url(lab_postgres: LabPostgres) -> str:
    """The URL of an empty database on the run's server, this test's alone."""
    return lab_postgres.create_database(f"t{next(_databases)}")
