"""Controller replicas: several ``sixlab controller serve`` sharing one PostgreSQL database,
or one SQLite file on one host (docs/architecture.md: failover there, before throughput).

Theory of operation
-------------------
Each replica has an id (``serve --replica NAME``). Work is divided by node: the replica
that holds a node's lease supervises that node's agent (health, repairs after a
restart) and, for a sender node, collects the results of every session it sends. The
leases are rows of the database (``Store.lease_tick``), renewed by a heartbeat every
``tick_s`` and valid for ``ttl_s`` on the database's clock; each replica takes a fair
share of each group of leases (sender nodes, reflector nodes, the housekeeping lease),
ceil(leases / live replicas), and lets go of what it holds beyond it (stops collecting,
then releases), so a replica that joins gets work and a replica that dies leaves it.

Failover. A replica killed with SIGKILL stops renewing; ``ttl_s`` later its leases are
expired and the other replicas claim them at their next heartbeat, open the nodes'
result streams from the stored cursors and go on: takeover within ``ttl_s + tick_s``
plus a stream's opening. Nothing is lost (records stay on the agents until a replica
acknowledges what it stored) and nothing is stored twice (results and cursor commit
together; the keys (session, epoch, record id) and (session, epoch, Seq) refuse a
repeat, so even two replicas collecting one node for a moment, one of which has not yet
noticed that its lease expired, store each record once).

Any replica answers the northbound API: reads come from the shared database; a request
that creates, starts or stops a session is carried out by the replica that received it
(it calls the agents itself), and the owner of the session's sender node starts or stops
collecting it at its next heartbeat. A destroy is recorded (``destroying``) and carried
out by the owner of the sender node; a start-again runs in the ``starting`` state. The
owner's repairs leave alone a session another replica is creating, starting or
destroying meanwhile (``Controller.reconcile_node``; docs/architecture.md, "Session
lifecycle across replicas").
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

from sixlab.controller.core import Controller
from sixlab.controller.housekeeping import HOUSEKEEPING
from sixlab.controller.store import OUTAGES_IN_ONE_LINE, Fence, Store

__all__ = [
    "DEFAULT_LEASE_TTL_S",
    "DEFAULT_TICK_S",
    "ReplicaManager",
    "default_replica_id",
]

log = logging.getLogger(__name__)
log.addFilter(OUTAGES_IN_ONE_LINE)  # a database outage: a line a round

#: A lease lasts this long without renewal (s): the takeover delay after a crash.
DEFAULT_LEASE_TTL_S = 5.0
#: Heartbeat period (s).
DEFAULT_TICK_S = 1.0


def default_replica_id() -> str:
    """host:pid, unique among the replicas of one database."""
    return f"{socket.gethostname()}:{os.getpid()}"


class ReplicaManager:
    """Holds this replica's leases and tells the controller what it owns."""

    def __init__(
        self,
        controller: Controller,
        replica_id: str,
        *,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        tick_s: float = DEFAULT_TICK_S,
        address: str = "",
    ) -> None:
        if not replica_id:
            raise ValueError("replica: a replica needs an id")
        if tick_s <= 0 or ttl_s <= 2 * tick_s:
            raise ValueError("lease ttl: must exceed two heartbeats")
        self.controller = controller
        self.store: Store = controller.store
        self.id = replica_id
        self.ttl_s = ttl_s
        self.tick_s = tick_s
        self.address = address
        self._owned: frozenset[str] = frozenset()
        #: The generation of each lease held: the fencing token of its node's results.
        self._generations: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Called with the lease names gained and lost at each heartbeat (tests, logs).
        self.on_change: Callable[[frozenset[str], frozenset[str]], None] | None = None
        controller.set_ownership(self.owns, self.fence, replica_id)

    @property
    def owned(self) -> frozenset[str]:
        return self._owned

    def owns(self, name: str) -> bool:
        return name in self._owned

    def fence(self, name: str) -> Fence:
        """The fencing token for storing the node's results: the lease's generation as
        this replica last saw it held (-1, never valid, for a lease it does not hold)."""
        with self._lock:
            generation = self._generations.get(name, -1) if name in self._owned else -1
        return Fence(name, self.id, generation)

    def start(self) -> None:
        """Take a first share now, then keep heartbeating in a thread."""
        self.tick()
        self._thread = threading.Thread(target=self._run, name="replica-leases", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop heartbeating and free the leases at once (a clean shutdown)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.ttl_s + 5)
        with self._lock:
            lost, self._owned = self._owned, frozenset()
        for name in lost:
            self.controller.drop_node(name)
        try:
            self.store.leave(self.id)
        except Exception:  # the database may be gone; the leases then expire
            log.warning("replica %s: could not release its leases", self.id, exc_info=True)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except Exception:
                # A database that does not answer: the leases will expire and the other
                # replicas take over; stop acting on them before that.
                log.exception("replica %s: heartbeat failed", self.id)
                self._expire_local()

    def _expire_local(self) -> None:
        with self._lock:
            lost, self._owned = self._owned, frozenset()
        for name in lost:
            self.controller.drop_node(name)

    def tick(self) -> None:
        """One heartbeat: renew, claim a fair share, let go of the surplus, act on it."""
        nodes = self.store.nodes()
        groups = {
            "sender": [n.name for n in nodes if n.role == "sender"],
            "reflector": [n.name for n in nodes if n.role == "reflector"],
            HOUSEKEEPING: [HOUSEKEEPING],
        }
        state = self.store.lease_tick(self.id, groups, int(self.ttl_s * 1e9), address=self.address)
        with self._lock:
            before = self._owned
            self._owned = state.owned - state.surplus
            self._generations = dict(state.generations)
            now = self._owned
        lost = before - now
        gained = now - before
        for name in lost | (state.surplus & before):
            if name != HOUSEKEEPING:
                self.controller.drop_node(name)
        if state.surplus:
            self.store.release(self.id, state.surplus)
        if gained or lost:
            log.info(
                "replica %s: holds %s (gained %s, lost %s; %d replicas)",
                self.id, sorted(now), sorted(gained), sorted(lost), state.live,
            )  # fmt: skip
        # Sessions started through another replica on nodes held here are picked up.
        for name in now - {HOUSEKEEPING}:
            self.controller.adopt_node(name, check=name in gained)
        if self.on_change is not None and (gained or lost):
            self.on_change(frozenset(gained), frozenset(lost))
