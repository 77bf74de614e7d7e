"""sixlab.ilnp: a sans-I/O ILNPv6 host with a pluggable ILCC admission policy.

* :mod:`sixlab.ilnp.ilcc` — ILCC entries, their state tables, ``hash``/``linear`` stores;
* :mod:`sixlab.ilnp.policy` — admission policies ``none``, ``socket``, ``bounded``;
* :mod:`sixlab.ilnp.host` — :class:`IlnpHost`: receive/send paths, Locator Updates.

Wire formats live in :mod:`sixlab.wire.ilnp`.
"""

from sixlab.ilnp._errors import (
    ConfigError,
    ControlError,
    IlnpError,
    InvalidTransitionError,
    UnknownBackendError,
)
from sixlab.ilnp.host import (
    Adopted,
    Deliver,
    Dropped,
    DropReason,
    Event,
    HostConfig,
    IlnpHost,
    LocatorUpdateAcked,
    LocatorUpdateFailed,
    PeerLocatorsChanged,
    PeerNotIlnp,
    Removed,
)
from sixlab.ilnp.ilcc import (
    EntryState,
    IlccEntry,
    IlccStore,
    LocatorState,
    create_store,
    register_store,
    store_names,
)
from sixlab.ilnp.policy import (
    Admission,
    AdmissionPolicy,
    AdmissionRequest,
    SocketTable,
    create_policy,
    policy_names,
    register_policy,
)

__all__ = [
    "Admission",
    "AdmissionPolicy",
    "AdmissionRequest",
    "Adopted",
    "ConfigError",
    "ControlError",
    "Deliver",
    "DropReason",
    "Dropped",
    "EntryState",
    "Event",
    "HostConfig",
    "IlccEntry",
    "IlccStore",
    "IlnpError",
    "IlnpHost",
    "InvalidTransitionError",
    "LocatorState",
    "LocatorUpdateAcked",
    "LocatorUpdateFailed",
    "PeerLocatorsChanged",
    "PeerNotIlnp",
    "Removed",
    "SocketTable",
    "UnknownBackendError",
    "create_policy",
    "create_store",
    "policy_names",
    "register_policy",
    "register_store",
    "store_names",
]
