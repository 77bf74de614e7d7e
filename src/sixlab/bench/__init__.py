"""RFC 2544 benchmarking of the STAMP reflectors and the ILNP host: generator and PDR search.

- :mod:`sixlab.bench.generator`: trials on the two-node bench (a C generator pinned to
  one CPU, an nftables reply counter); :class:`FrameTrialRunner`, whose
  :class:`StampTrialRunner` offers STAMP to a reflector.
- :mod:`sixlab.bench.ilnp_echo`: UDP echo over ILNPv6 through the host daemon (a C
  echo server behind ``sixlab ilnp host``); :class:`~sixlab.bench.ilnp_echo.IlnpEchoTrialRunner`.
- :mod:`sixlab.bench.pdr`: the Partial Drop Rate search (MLRsearch or bisection) over
  any trial callable; :func:`search_pdr`.

``benchmarks/bench_pdr.py`` runs both for every data plane side by side;
``benchmarks/bench_ilnp.py echo`` for the ILNP daemon.

Errors
------
::

    GeneratorError (RuntimeError)   a generator, a system under test or a trial that
                                    could not be built or run
"""

from sixlab.bench.generator import (
    GEN_PORT,
    FrameTrialRunner,
    GeneratorError,
    StampTrialRunner,
    TrialResult,
    build_generator,
    build_program,
    generator_ceiling,
    prepare_bench,
    stamp_frame,
)
from sixlab.bench.pdr import DEFAULT_LOSS_RATIO, PdrResult, Trial, search_pdr

__all__ = [
    "DEFAULT_LOSS_RATIO",
    "GEN_PORT",
    "FrameTrialRunner",
    "GeneratorError",
    "PdrResult",
    "StampTrialRunner",
    "Trial",
    "TrialResult",
    "build_generator",
    "build_program",
    "generator_ceiling",
    "prepare_bench",
    "search_pdr",
    "stamp_frame",
]
