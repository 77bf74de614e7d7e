"""The STAMP data planes behind one interface, and the engines that join them to the core.

- :mod:`sixlab.dataplane.base`: the :class:`Dataplane` interface and :data:`PLANES`,
  the registry that picks a plane by name (``--dataplane NAME``): :func:`create`,
  :func:`available`.
- The planes: ``socket`` (:mod:`~sixlab.dataplane.udpsocket`, a kernel UDP socket),
  ``scapy`` (:mod:`~sixlab.dataplane.scapy_plane`), ``mmap``
  (:mod:`~sixlab.dataplane.mmap_plane`, TPACKET_V3 rings), ``xdp``
  (:mod:`~sixlab.dataplane.xdp_plane`, answers in the kernel); and ``memory``
  (:mod:`~sixlab.dataplane.memory`), planes joined in one process for tests.
- :mod:`sixlab.dataplane.engine`: :class:`SenderEngine` and :class:`ReflectorEngine`,
  one thread each, feeding a plane's datagrams to the sans-I/O core.
- :mod:`sixlab.dataplane.probeio`: the ``socket`` plane's batched probe path for the
  sender engine (``sendmmsg``/``recvmmsg`` in C, built with gcc at first use).

Errors
------
::

    DataplaneError (RuntimeError)   a plane cannot be set up or used; the message says
                                    what to fix (and names the plane)
"""

from sixlab.dataplane.base import (
    PLANES,
    Dataplane,
    DataplaneConfig,
    DataplaneError,
    Received,
    available,
    create,
    full_path,
)
from sixlab.dataplane.engine import (
    DEFAULT_FIFO_CAPACITY,
    EngineCounters,
    ReflectorEngine,
    SenderEngine,
    SenderSessionSpec,
    SessionSnapshot,
)
from sixlab.dataplane.memory import MemoryDataplane, MemoryNetwork

__all__ = [
    "DEFAULT_FIFO_CAPACITY",
    "PLANES",
    "Dataplane",
    "DataplaneConfig",
    "DataplaneError",
    "EngineCounters",
    "MemoryDataplane",
    "MemoryNetwork",
    "Received",
    "ReflectorEngine",
    "SenderEngine",
    "SenderSessionSpec",
    "SessionSnapshot",
    "available",
    "create",
    "full_path",
]
