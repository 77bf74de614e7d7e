"""Helpers shared by the STAMP-over-SRv6 integration tests (test_stamp_srv6, test_xdp_srv6)."""

from __future__ import annotations

import json
import sys
from typing import Any

from sixlab.testbed import SRv6Path, SRv6TwoPaths

#: The STAMP command line, run with this interpreter.
SIXLAB = [sys.executable, "-m", "sixlab", "stamp"]


def run_sender(tb: SRv6TwoPaths, path: SRv6Path, *args: str, count: int) -> dict[str, Any]:
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
            "1",
            "--segments",
            ",".join(path.forward_segments),
            *args,
        ],
        timeout=60,
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc
