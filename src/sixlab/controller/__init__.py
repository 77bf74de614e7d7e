"""The SDN controller: nodes, sessions on sender/reflector pairs, delays, metrics.

- :mod:`sixlab.controller.core`: :class:`Controller`, which creates sessions on agents
  (``sixlab.southbound``) and collects their results.
- :mod:`sixlab.controller.store`: :class:`Store`, nodes, sessions, results and rollups;
  :class:`SqliteStore` (the embedded default) and ``pgstore.PostgresStore`` (a database
  replicas share), chosen by :func:`open_store` from ``--db``.
- :mod:`sixlab.controller.rollup`: per-minute rollups; :mod:`sixlab.controller.housekeeping`:
  :class:`Housekeeper`, which rolls results up and applies the :class:`Retention`.
- :mod:`sixlab.controller.replica`: :class:`ReplicaManager`, replicas sharing the nodes
  by lease.
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
     ├── DestroyPendingError        a destroy is recorded, not yet carried out by the
     │                              replica that owns the session's sender
     ├── StoreError                 the store refuses a node or session
     │    ├── NotFoundError         no node or session of that name
     │    ├── AlreadyExistsError    a node or session of that name exists already
     │    ├── InUseError            the node still carries a live session
     │    ├── DestroyingError       the session is being destroyed (no epoch begins)
     │    ├── StaleEpochError       results of an epoch the session has left
     │    ├── ConcurrentPassError   another replica's roll-up pass came first
     │    ├── FencedError           this replica's lease of the node changed hands
     │    └── StoreUnavailableError the database could not be reached
     ├── RequestRefusedError        the northbound server refuses a request (with a code)
     └── NorthboundError            a controller refused our call, or could not be
                                    reached (client side; also a southbound ``RpcError``)
"""

from sixlab.controller.client import ControllerClient, NorthboundError
from sixlab.controller.core import (
    CollectMode,
    Controller,
    DestroyPendingError,
    NoFreeSsidError,
    SessionExistsError,
    SessionSpec,
    WrongStateError,
)
from sixlab.controller.errors import ControllerError
from sixlab.controller.housekeeping import Housekeeper, Retention
from sixlab.controller.metrics import ControllerMetrics
from sixlab.controller.northbound import ControllerServer, RequestRefusedError, serve_controller
from sixlab.controller.replica import ReplicaManager
from sixlab.controller.store import (
    AlreadyExistsError,
    ConcurrentPassError,
    DestroyingError,
    FencedError,
    InUseError,
    NotFoundError,
    SqliteStore,
    StaleEpochError,
    Store,
    StoreError,
    StoreUnavailableError,
    open_store,
)

__all__ = [
    "AlreadyExistsError",
    "CollectMode",
    "ConcurrentPassError",
    "Controller",
    "ControllerClient",
    "ControllerError",
    "ControllerMetrics",
    "ControllerServer",
    "DestroyPendingError",
    "DestroyingError",
    "FencedError",
    "Housekeeper",
    "InUseError",
    "NoFreeSsidError",
    "NorthboundError",
    "NotFoundError",
    "ReplicaManager",
    "RequestRefusedError",
    "Retention",
    "SessionExistsError",
    "SessionSpec",
    "SqliteStore",
    "StaleEpochError",
    "Store",
    "StoreError",
    "StoreUnavailableError",
    "WrongStateError",
    "open_store",
    "serve_controller",
]
