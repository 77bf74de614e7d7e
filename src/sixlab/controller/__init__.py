"""The SDN controller: nodes, sessions on sender/reflector pairs, delays, metrics.

- :mod:`sixlab.controller.core`: :class:`Controller`, which creates sessions on agents
  (``sixlab.southbound``) and collects their results.
- :mod:`sixlab.controller.store`: :class:`Store`, nodes, sessions and results in SQLite.
- :mod:`sixlab.controller.metrics`: the Prometheus metrics.
- :mod:`sixlab.controller.northbound`: the controller's gRPC API (``controller.proto``,
  stubs in ``sixlab.controller._generated``); :mod:`sixlab.controller.client` its
  typed client.

Errors
------
::

    ControllerError (ValueError)    a request the controller refuses; the message names
     │                              the field
     ├── SessionExistsError         a session of that name exists already
     ├── WrongStateError            the session's state forbids the request
     ├── NoFreeSsidError            every SSID is taken on the sender or the reflector
     ├── StoreError                 the store refuses a node or session
     │    ├── NotFoundError         no node or session of that name
     │    ├── AlreadyExistsError    a node or session of that name exists already
     │    ├── InUseError            the node still carries a live session
     │    └── StaleEpochError       results of an epoch the session has left
     ├── RequestRefusedError        the northbound server refuses a request (with a code)
     └── NorthboundError            a controller refused our call, or could not be
                                    reached (client side; also a southbound ``RpcError``)
"""

from sixlab.controller.client import ControllerClient, NorthboundError
from sixlab.controller.core import (
    CollectMode,
    Controller,
    NoFreeSsidError,
    SessionExistsError,
    SessionSpec,
    WrongStateError,
)
from sixlab.controller.errors import ControllerError
from sixlab.controller.metrics import ControllerMetrics
from sixlab.controller.northbound import ControllerServer, RequestRefusedError, serve_controller
from sixlab.controller.store import (
    AlreadyExistsError,
    InUseError,
    NotFoundError,
    StaleEpochError,
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
    "StaleEpochError",
    "Store",
    "StoreError",
    "WrongStateError",
    "serve_controller",
]
