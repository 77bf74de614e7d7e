"""The controller's loops log a database outage in one line a round, anything else with
its traceback (``store.OUTAGES_IN_ONE_LINE``, docs/architecture.md, "The database out of
reach")."""

from __future__ import annotations

import logging

import pytest

from sixlab.controller import core, housekeeping, metrics, replica
from sixlab.controller.store import OUTAGES_IN_ONE_LINE, StoreUnavailableError


def _fail(exc: Exception) -> None:
    raise exc


def test_an_outage_is_one_warning_line_and_a_bug_keeps_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("sixlab.controller.test-outages")
    log.addFilter(OUTAGES_IN_ONE_LINE)
    try:
        with caplog.at_level(logging.INFO, log.name):
            for exc in (StoreUnavailableError("store: connection refused"), KeyError("bug")):
                try:
                    _fail(exc)
                except Exception:
                    log.exception("stream of %s: collection failed; retrying", "s1")
    finally:
        log.removeFilter(OUTAGES_IN_ONE_LINE)
    outage, bug = caplog.records
    assert outage.levelno == logging.WARNING
    assert outage.getMessage() == (
        "stream of s1: collection failed; retrying: the database is out of reach:"
        " store: connection refused"
    )
    assert outage.exc_info is None
    assert "Traceback" not in caplog.text.split("\n")[0]
    assert bug.levelno == logging.ERROR
    assert bug.exc_info is not None
    assert bug.getMessage() == "stream of s1: collection failed; retrying"
    assert "KeyError: 'bug'" in caplog.text


@pytest.mark.parametrize("module", [core, housekeeping, metrics, replica])
def test_every_module_with_such_loops_says_outages_in_one_line(module: object) -> None:
    assert OUTAGES_IN_ONE_LINE in module.log.filters  # type: ignore[attr-defined]
