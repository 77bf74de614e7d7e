"""The SDN controller: nodes, sessions on sender/reflector pairs, delays, metrics.

- :mod:`sixlab.controller.core`: :class:`Controller`, which creates sessions on agents
  (``sixlab.southbound``) and collects their results.
- :mod:`sixlab.controller.store`: :class:`Store`, nodes, sessions and results in SQLite.
- :mod:`sixlab.controller.metrics`: the Prometheus metrics.
- :mod:`sixlab.controller.northbound`: the controller's gRPC API (``controller.proto``,
  stubs in ``sixlab.controller._generated``); :mod:`sixlab.controller.client` its
  typed client.
"""

from sixlab.controller.client import ControllerClient, NorthboundError
from sixlab.controller.core import (
    CollectMode,
    Controller,
    ControllerError,
    NoFreeSsidError,
    SessionExistsError,
    SessionSpec,
    WrongStateError,
)
from sixlab.controller.metrics import ControllerMetrics
from sixlab.controller.northbound import ControllerServer, RequestRefusedError, serve_controller
from sixlab.controller.store import (
    AlreadyExistsError,
    InUseError,
    NotFoundError,
    Store,
    StoreError,
)

__all__ = [
    "AlreadyExistsError",
    "CollectMode",
    "Controller",
    "ControllerClient",
    "ControllerError",
    "ControllerMetrics",
    "ControllerServer",
    "InUseError",
    "NoFreeSsidError",
    "NorthboundError",
    "NotFoundError",
    "RequestRefusedError",
    "SessionExistsError",
    "SessionSpec",
    "Store",
    "StoreError",
    "WrongStateError",
    "serve_controller",
]
