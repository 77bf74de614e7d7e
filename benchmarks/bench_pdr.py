"""RFC 2544 PDR at 0.5 % loss of each STAMP reflector data plane alone: ``bench_stamp.py``.

    sudo .venv/bin/python benchmarks/bench_pdr.py [bench_stamp.py paper options]

There is one way to measure a PDR: ``benchmarks/bench_stamp.py paper``
(``sixlab.bench.stamp_paper``). This is that command for the figure this script used
to give, each plane reflecting with nothing but STAMP to handle: the Session-Reflector
at 100 % STAMP (the paper's Fig 14b), every plane by default (``--planes`` to choose),
next to the baseline's forwarding and the generator's ceiling. Other options
(``--repeat``, ``--out``, ``--quick``, ...) go to ``bench_stamp.py paper``.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path


def main() -> None:
    script = Path(__file__).with_name("bench_stamp.py")
    argv = [sys.executable, str(script), "paper", "--roles", "reflector", "--fractions", "100",
            *sys.argv[1:]]  # fmt: skip
    print("=", shlex.join(argv), flush=True)
    os.execv(sys.executable, argv)


if __name__ == "__main__":
    main()
