"""sixlab.ilnp: an ILNPv6 host with a pluggable ILCC admission policy, and its daemon.

Sans-I/O host logic (exported here):

* :mod:`sixlab.ilnp.ilcc` — ILCC entries, their state tables, ``hash``/``linear`` stores;
* :mod:`sixlab.ilnp.policy` — admission policies ``none``, ``socket``, ``bounded``;
* :mod:`sixlab.ilnp.host` — :class:`IlnpHost`: receive/send paths, Locator Updates;
* :mod:`sixlab.ilnp.resolve` — names and NIDs to locators (hosts file, DNS).

The daemon on Linux (``sixlab ilnp host``), built on :mod:`sixlab.linux`:
:mod:`sixlab.ilnp.daemon` (TUN device, capture rings, control socket),
:mod:`sixlab.ilnp.links` (which links are usable and hold which locators),
:mod:`sixlab.ilnp.egress` (sending out of the locator's link, packets for unresolved
neighbours held in the daemon), :mod:`sixlab.ilnp.fastpath` (the tc/eBPF fast path),
:mod:`sixlab.ilnp.socktable` (the kernel's sockets for the ``socket`` policy).

Wire formats live in :mod:`sixlab.wire.ilnp`.

Errors
------
::

    IlnpError                  never a bad packet (those are counted drops)
     ├── InvalidTransitionError    a (state, event) pair missing from a state table
     ├── UnknownBackendError   no store or admission policy of that name (LookupError)
     ├── ConfigError           a setting that cannot work (ValueError)
     ├── ResolveError          a name no source resolves, a bad hosts file (LookupError)
     ├── ControlError          a control socket reply that is missing or not JSON
     └── DaemonError           the system refused the daemon something (root, TUN, nft)
"""

from sixlab.ilnp._errors import (
    ConfigError,
    ControlError,
    DaemonError,
    IlnpError,
    InvalidTransitionError,
    ResolveError,
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
    STORES,
    EntryState,
    IlccEntry,
    IlccStore,
    LocatorState,
    create_store,
    register_store,
    store_names,
)
from sixlab.ilnp.policy import (
    POLICIES,
    Admission,
    AdmissionPolicy,
    AdmissionRequest,
    SocketTable,
    create_policy,
    policy_names,
    register_policy,
)

__all__ = [
    "POLICIES",
    "STORES",
    "Admission",
    "AdmissionPolicy",
    "AdmissionRequest",
    "Adopted",
    "ConfigError",
    "ControlError",
    "DaemonError",
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
    "ResolveError",
    "SocketTable",
    "UnknownBackendError",
    "create_policy",
    "create_store",
    "policy_names",
    "register_policy",
    "register_store",
    "store_names",
]
