"""Helpers shared by the STAMP-over-SRv6 integration tests (test_stamp_srv6, test_xdp_srv6)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from statistics import median
from typing import Any, NamedTuple

from sixlab.testbed import SRv6Path, SRv6TwoPaths

#: The STAMP command line, run with this interpreter.
SIXLAB = [sys.executable, "-m", "sixlab", "stamp"]
#: The senders' loss timeout (s) where every probe is to be answered (``check_delays``):
#: a session ends when its last reply comes, so a long one costs a passing run nothing;
#: a short one would count a reply lost that the loaded machine's link emulators and
#: processes held past it.
TIMEOUT_S = "10"
#: A warm-up session's (its records are not checked; a probe lost to Neighbour
#: Discovery is not waited for long).
WARMUP_TIMEOUT_S = "1"


def run_sender(
    tb: SRv6TwoPaths, path: SRv6Path, *args: str, count: int, timeout: str = TIMEOUT_S
) -> dict[str, Any]:
    """Run ``sixlab stamp sender`` in the sender namespace over ``path``; its JSON summary."""
    out = tb.testbed.exec_in(
        tb.sender,
        [
            *SIXLAB,
            "sender",
            tb.reflector_addr,
            "--json",
            "--count",
            str(count),
            "--interval",
            "0.02",
            "--timeout",
            timeout,
            "--segments",
            ",".join(path.forward_segments),
            *args,
        ],
        timeout=60,
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


class LateRecordsError(AssertionError):
    """Records later than the emulated delay allows (the median, or too many records).

    The testbed's links hold packets in user space on a shared machine: a busy CPU adds
    delay to a record, it never removes any. A timestamp in the wrong place is wrong in
    every run; a host that held packets for milliseconds rarely is twice in a row.
    """


def check_delays(
    doc: dict[str, Any],
    path: SRv6Path,
    *,
    count: int,
    tolerance_ms: float = 1.0,
    spread_ms: float = 1.0,
    share: float = 0.75,
) -> tuple[float, float]:
    """The session of ``count`` probes met ``path``'s emulated one-way delays; its median
    (direct, return) in ms.

    Every probe answered (within ``TIMEOUT_S``), and no record faster than the link by
    more than ``spread_ms`` (load cannot cause either: plain ``AssertionError``); each
    direction's median within ±``tolerance_ms`` and ``share`` of the records within
    ±``spread_ms`` (else :class:`LateRecordsError`).
    """
    assert (doc["sent"], doc["received"], doc["lost"]) == (count, count, 0), doc["summary"]
    medians = []
    for key, want in (("direct_ns", path.forward_delay_ms), ("return_ns", path.return_delay_ms)):
        values = [r[key] / 1e6 for r in doc["records"]]
        early = [v for v in values if v < want - spread_ms]
        assert not early, (key, want, values)
        mid = median(values)
        close = sum(abs(v - want) <= spread_ms for v in values)
        if abs(mid - want) > tolerance_ms or close < share * len(values):
            raise LateRecordsError(key, want, mid, values)
        medians.append(mid)
    return medians[0], medians[1]


class Measured(NamedTuple):
    doc: dict[str, Any]
    #: Medians, ms.
    direct_ms: float
    return_ms: float
    #: Sessions measured (2 when the first one's records were late).
    runs: int


def measure_delays(
    measure: Callable[[], dict[str, Any]], path: SRv6Path, *, count: int, **limits: float
) -> Measured:
    """Run ``measure`` and :func:`check_delays` its session; once more if the records were
    only late (:class:`LateRecordsError`), never when they were wrong."""
    doc = measure()
    try:
        return Measured(doc, *check_delays(doc, path, count=count, **limits), runs=1)
    except LateRecordsError as first:
        print(f"late records, measured again: {first}")
    doc = measure()
    return Measured(doc, *check_delays(doc, path, count=count, **limits), runs=2)


def measure_path(
    tb: SRv6TwoPaths, path: SRv6Path, *args: str, count: int, **limits: float
) -> Measured:
    """A session of ``count`` probes over ``path`` (``sixlab stamp sender`` ``args``),
    checked by :func:`measure_delays`. Each run begins with a 2-probe session: the first
    packet over a cold path waits for Neighbour Discovery across the delayed links, which
    is real but not the delay under test."""

    def once() -> dict[str, Any]:
        run_sender(tb, path, *args, count=2, timeout=WARMUP_TIMEOUT_S)
        return run_sender(tb, path, *args, count=count)

    return measure_delays(once, path, count=count, **limits)
