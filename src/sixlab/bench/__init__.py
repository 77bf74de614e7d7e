"""RFC 2544 benchmarking of the STAMP reflectors: a frame generator and the PDR search.

- :mod:`sixlab.bench.generator`: trials on the two-node bench (a C generator pinned to
  one CPU, an nftables reply counter); :class:`StampTrialRunner`.
- :mod:`sixlab.bench.pdr`: the Partial Drop Rate search (MLRsearch or bisection) over
  any trial callable; :func:`search_pdr`.

``benchmarks/bench_pdr.py`` runs both for every data plane side by side.
"""

from sixlab.bench.generator import (
    GEN_PORT,
    GeneratorError,
    StampTrialRunner,
    TrialResult,
    build_generator,
    generator_ceiling,
    prepare_bench,
    stamp_frame,
)
from sixlab.bench.pdr import DEFAULT_LOSS_RATIO, PdrResult, Trial, search_pdr

__all__ = [
    "DEFAULT_LOSS_RATIO",
    "GEN_PORT",
    "GeneratorError",
    "PdrResult",
    "StampTrialRunner",
    "Trial",
    "TrialResult",
    "build_generator",
    "generator_ceiling",
    "prepare_bench",
    "search_pdr",
    "stamp_frame",
]
