"""RFC 2544 benchmarking of the STAMP planes and the ILNP host: generator, PDR, studies.

- :mod:`sixlab.bench.generator`: trials on the two-node bench (a C generator pinned to
  one CPU that can mix two kinds of frame, an nftables reply counter);
  :class:`FrameTrialRunner`, whose :class:`StampTrialRunner` offers STAMP to a reflector.
- :mod:`sixlab.bench.pdr`: the Partial Drop Rate search (MLRsearch or bisection) over
  any trial callable; :func:`search_pdr`.
- :mod:`sixlab.bench.stamp_paper`: the STAMP paper's evaluation (Figs 12–16): data
  forwarded with H.Encaps (:mod:`sixlab.bench.forward`) and STAMP reflected
  (:mod:`sixlab.bench.reflector`) or collected (:mod:`sixlab.bench.collector`) in the
  same trials, the baseline without STAMP and every plane (``scapy``, ``mmap``,
  ``socket``, ``xdp``, ``afxdp``) and any external implementation, the receive path
  on the SUT's CPU (threaded NAPI, :func:`sixlab.bench.forward.threaded_napi`);
  :mod:`sixlab.bench.stamp_report` writes its tables and draws its figures.
- :mod:`sixlab.bench.ilnp_echo`: UDP echo over ILNPv6 through the host daemon (a C
  echo server behind ``sixlab ilnp host``); :mod:`sixlab.bench.ilnp_study` the ILCC study.

``benchmarks/bench_stamp.py paper`` runs the STAMP paper's evaluation, the PDR of the
SUT in a STAMP role (``bench_pdr.py`` and ``bench_xdp_pdr.py pdr`` / ``forward`` are
that command with fixed roles and STAMP shares); ``bench_xdp_pdr.py
forward-cpu`` measures the CPU time per forwarded frame with the xdp plane attached
instead, which a PDR cannot resolve. ``benchmarks/bench_ilnp.py echo`` and ``study``
run the ILNP ones.

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
