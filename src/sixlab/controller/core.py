"""The SDN controller: nodes, sessions on sender/reflector pairs, result collection.

Theory of operation
-------------------
Nodes are agents (``sixlab stamp agent``) registered by name, gRPC address and role.
A session is one SRv6 path under measurement: a sender node, a reflector node, the
forward SID list and the return SID list (configured on the reflector, as "High
Performance Delay Monitoring for SRv6 Based SD-WANs" does, docs/papers.md, or requested
per packet with the RFC 9503 Return Path TLV). The controller picks an SSID free on both
nodes, creates the session on the reflector, then on the sender (undoing the first if
the second fails), and starts them.

Collection. Each running session has a collector thread that reads the sender's
results in cursor mode (records stay on the agent until acknowledged) either by polling
(``GetStampSessionResults``, the paper's way) or by a server stream (push). Every batch
is stored with the new cursor in one transaction (``Store.store_results``), then
acknowledged; so a result is stored exactly once, even if the controller is killed at
any point and restarted (``resume`` restarts the collectors from the stored cursors).

Health. A failing call marks the node unhealthy (store and the ``sixlab_agent_up``
metric) and the collector retries with back-off. When the agent answers again, the
collector checks that it still has the session: an agent that restarted has lost it,
so the controller replays the node's Init, creates the session again (new epoch, see
``Store.new_epoch``) and starts it; measurement resumes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc

from sixlab.controller.metrics import ControllerMetrics
from sixlab.controller.store import NotFoundError, SessionRow, Store
from sixlab.southbound._generated import stamp_pb2 as pb
from sixlab.southbound.client import AgentClient, SouthboundError, result_from_proto
from sixlab.stamp.stats import PathStats, path_stats

__all__ = [
    "CollectMode",
    "Controller",
    "ControllerError",
    "NoFreeSsidError",
    "SessionExistsError",
    "SessionSpec",
    "WrongStateError",
]

log = logging.getLogger(__name__)

#: Records per poll or stream batch: large enough to keep up with 10 kpps at 2 polls/s.
BATCH = 5000
#: Back-off between retries to a node that does not answer (doubling, capped).
RETRY_MIN_S = 0.2
RETRY_MAX_S = 5.0


class ControllerError(ValueError):
    """A request the controller refuses; the message names the field."""


class SessionExistsError(ControllerError):
    """A session of that name exists already."""


class WrongStateError(ControllerError):
    """The session's state forbids the request (start a running one, stop a stopped one)."""


class NoFreeSsidError(ControllerError):
    """Every SSID is taken on the sender or the reflector."""


class CollectMode:
    POLL = "poll"
    STREAM = "stream"
    ALL = (POLL, STREAM)


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """What a user asks to measure. Addresses are text; SID lists in travel order."""

    name: str
    sender: str
    reflector: str
    reflector_address: str
    segments: tuple[str, ...] = ()
    return_segments: tuple[str, ...] = ()
    #: Ask for the return path with the RFC 9503 Return Path TLV instead of configuring
    #: it on the reflector.
    return_path_tlv: bool = False
    reflector_port: int = 862
    source_address: str = ""
    interval_ns: int = 100_000_000
    count: int = 0
    duration_ns: int = 0
    ptp: bool = False
    key_hex: str = ""
    stateful: bool = False
    loss_timeout_ns: int = 2_000_000_000
    collect: str = CollectMode.POLL

    def validate(self) -> None:
        if not self.name:
            raise ControllerError("name: a session needs a name")
        _v6("reflector_address", self.reflector_address)
        if self.source_address:
            _v6("source_address", self.source_address)
        for sid in self.segments:
            _v6("segments", sid)
        for sid in self.return_segments:
            _v6("return_segments", sid)
        if self.return_path_tlv and not self.return_segments:
            raise ControllerError("return_segments: the Return Path TLV needs a SID list")
        if self.interval_ns <= 0:
            raise ControllerError("interval_ns: must be positive")
        if self.count < 0 or self.duration_ns < 0:
            raise ControllerError("count/duration_ns: must not be negative")
        if not 0 < self.reflector_port <= 0xFFFF:
            raise ControllerError(f"reflector_port: {self.reflector_port} is not a port")
        if self.collect not in CollectMode.ALL:
            raise ControllerError(f"collect: {self.collect!r} is neither poll nor stream")
        try:
            bytes.fromhex(self.key_hex)
        except ValueError:
            raise ControllerError("key_hex: not hexadecimal") from None


def _v6(label: str, text: str) -> None:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        raise ControllerError(f"{label}: {text!r} is not an IPv6 address") from None


@dataclass
class _Collector:
    name: str
    thread: threading.Thread = field(init=False)
    stop: threading.Event = field(default_factory=threading.Event)
    #: The result stream being read (stream mode), cancelled to stop at once.
    stream: Any = None


ClientFactory = Callable[[str], AgentClient]


class Controller:
    def __init__(
        self,
        store: Store,
        metrics: ControllerMetrics | None = None,
        *,
        client_factory: ClientFactory = AgentClient,
        clock: Callable[[], int] = time.time_ns,
        poll_interval_s: float = 0.5,
    ) -> None:
        self.store = store
        self.metrics = metrics or ControllerMetrics()
        self.clock = clock
        self.poll_interval_s = poll_interval_s
        self._client_factory = client_factory
        self._clients: dict[str, AgentClient] = {}
        self._collectors: dict[str, _Collector] = {}
        self._lock = threading.RLock()
        self._closed = False

    # -- nodes --------------------------------------------------------------------------

    def client(self, node: str) -> AgentClient:
        with self._lock:
            client = self._clients.get(node)
            if client is None:
                client = self._client_factory(self.store.node(node).address)
                self._clients[node] = client
            return client

    def register_node(self, name: str, address: str, role: str) -> None:
        self.store.add_node(name, address, role)
        self.check_node(name)

    def init_node(
        self,
        name: str,
        *,
        dataplane: str = "",
        port: int | None = None,
        interface: str = "",
        source: str = "",
    ) -> int:
        """Init the node's agent (and remember the parameters to replay after a restart)."""
        init = {"dataplane": dataplane, "port": port, "interface": interface, "source": source}
        bound = self._init(name, init)
        self.store.set_init(name, init)
        return bound

    def _init(self, name: str, init: dict[str, Any]) -> int:
        port = self._call(
            name,
            lambda c: c.init(
                port=init["port"],
                interface=init["interface"],
                source=init["source"] or None,
                dataplane=init["dataplane"],
            ),
        )
        assert isinstance(port, int)
        return port

    def check_node(self, name: str) -> bool:
        """Ask the node's agent how it is; record and return its health."""
        try:
            self._call(name, lambda c: c.info())
        except SouthboundError:
            return False
        return True

    def _call(self, node: str, fn: Callable[[AgentClient], Any]) -> Any:
        """One call to a node's agent; its health follows the outcome."""
        try:
            out = fn(self.client(node))
        except SouthboundError as exc:
            if exc.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self._health(node, healthy=False, error=exc.details)
            raise
        self._health(node, healthy=True)
        return out

    def _health(self, node: str, *, healthy: bool, error: str | None = None) -> None:
        self.store.set_health(node, healthy, self.clock(), error)
        self.metrics.set_agent_up(node, healthy)

    # -- sessions -----------------------------------------------------------------------

    def create_session(self, spec: SessionSpec) -> SessionRow:
        spec.validate()
        sender, reflector = self.store.node(spec.sender), self.store.node(spec.reflector)
        if sender.role != "sender":
            raise ControllerError(f"sender: node {spec.sender!r} is a {sender.role}")
        if reflector.role != "reflector":
            raise ControllerError(f"reflector: node {spec.reflector!r} is a {reflector.role}")
        with self._lock:
            try:
                self.store.session(spec.name)
            except NotFoundError:
                pass
            else:
                raise SessionExistsError(f"name: session {spec.name!r} already exists")
            used = self.store.used_ssids(spec.sender) | self.store.used_ssids(spec.reflector)
            ssid = next((i for i in range(1, 0x10000) if i not in used), None)
            if ssid is None:
                raise NoFreeSsidError("ssid: no free SSID left on these nodes")
            self._create_on_agents(spec, ssid)
            params = asdict(spec)
            return self.store.add_session(
                spec.name,
                ssid,
                sender=spec.sender,
                reflector=spec.reflector,
                params=params,
                now_ns=self.clock(),
            )

    def _create_on_agents(self, spec: SessionSpec, ssid: int) -> None:
        key = bytes.fromhex(spec.key_hex) or None
        self._call(
            spec.reflector,
            lambda c: c.create_reflector_session(
                ssid,
                stateful=spec.stateful,
                key=key,
                ptp=spec.ptp,
                return_sid_list=() if spec.return_path_tlv else spec.return_segments,
            ),
        )
        try:
            self._call(
                spec.sender,
                lambda c: c.create_sender_session(
                    ssid,
                    spec.reflector_address,
                    sid_list=spec.segments,
                    interval_ns=spec.interval_ns,
                    count=spec.count,
                    duration_ns=spec.duration_ns,
                    source=spec.source_address or None,
                    reflector_port=spec.reflector_port,
                    key=key,
                    ptp=spec.ptp,
                    stateful_reflector=spec.stateful,
                    return_sid_list=spec.return_segments if spec.return_path_tlv else (),
                    loss_timeout_ns=spec.loss_timeout_ns,
                ),
            )
        except SouthboundError:
            with contextlib.suppress(SouthboundError):
                self._call(spec.reflector, lambda c: c.destroy_session(ssid))
            raise

    def _spec(self, row: SessionRow) -> SessionSpec:
        params = dict(row.params)
        for key in ("segments", "return_segments"):
            params[key] = tuple(params[key])
        return SessionSpec(**params)

    def start_session(self, name: str) -> None:
        row = self.store.session(name)
        if row.state not in ("created", "stopped"):
            raise WrongStateError(f"name: session {name!r} is {row.state}, not startable")
        self._call(row.reflector, lambda c: c.start_session(row.ssid))
        self._call(row.sender, lambda c: c.start_session(row.ssid))
        self.store.set_state(name, "running")
        self._start_collector(name)

    def stop_session(self, name: str) -> None:
        """Stop sending; the collector keeps reading until the session has drained."""
        row = self.store.session(name)
        if row.state != "running":
            raise WrongStateError(f"name: session {name!r} is {row.state}, not running")
        self._call(row.sender, lambda c: c.stop_session(row.ssid))
        self.store.set_state(name, "stopping")

    def destroy_session(self, name: str) -> None:
        row = self.store.session(name)
        if row.state == "destroyed":
            raise WrongStateError(f"name: session {name!r} is already destroyed")
        self._stop_collector(name)
        for node in (row.sender, row.reflector):
            with contextlib.suppress(SouthboundError):
                self._call(node, lambda c: c.destroy_session(row.ssid))
        self.store.set_state(name, "destroyed")

    def wait_finished(self, name: str, timeout: float) -> bool:
        """Wait until the session's collector has read everything and ended."""
        with self._lock:
            col = self._collectors.get(name)
        if col is not None:
            col.thread.join(timeout)
            return not col.thread.is_alive()
        return self.store.session(name).state in ("finished", "destroyed")

    def resume(self) -> list[str]:
        """After a restart: collect again for every session that was being collected."""
        names = [r.name for r in self.store.sessions() if r.state in ("running", "stopping")]
        for name in names:
            self._start_collector(name)
        return names

    def stats(self, name: str, since_ns: int | None = None) -> PathStats:
        row = self.store.session(name)
        records = self.store.results(row.id, since_ns=since_ns)
        return path_stats(records, lost=row.lost if since_ns is None else 0)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            names = list(self._collectors)
        for name in names:
            self._stop_collector(name)
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()

    # -- collection ---------------------------------------------------------------------

    def _start_collector(self, name: str) -> None:
        with self._lock:
            if self._closed or name in self._collectors:
                return
            col = _Collector(name)
            col.thread = threading.Thread(
                target=self._collect, args=(col,), name=f"collect-{name}", daemon=True
            )
            self._collectors[name] = col
            col.thread.start()

    def _stop_collector(self, name: str) -> None:
        with self._lock:
            col = self._collectors.pop(name, None)
        if col is not None:
            col.stop.set()
            if col.stream is not None:
                col.stream.cancel()
            if col.thread is not threading.current_thread():
                col.thread.join(10)

    def _collect(self, col: _Collector) -> None:
        delay = RETRY_MIN_S
        while not col.stop.is_set():
            row = self.store.session(col.name)
            try:
                row = self._ensure_on_agent(row)
                done = (
                    self._stream_once(row, col)
                    if row.params["collect"] == CollectMode.STREAM
                    else self._poll_once(row)
                )
            except SouthboundError as exc:
                log.info("session %s: %s; retrying in %.1f s", col.name, exc.details, delay)
                col.stop.wait(delay + random.uniform(0, delay / 4))  # noqa: S311 - jitter
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            except Exception:
                # A bug or a store error must not end collection for good: nothing was
                # acknowledged, so retrying later loses nothing.
                log.exception("session %s: collection failed; retrying", col.name)
                col.stop.wait(RETRY_MAX_S)
                continue
            delay = RETRY_MIN_S
            if done:
                self.store.set_state(col.name, "finished")
                with self._lock:
                    self._collectors.pop(col.name, None)
                return
            if row.params["collect"] == CollectMode.POLL:
                col.stop.wait(self.poll_interval_s)

    def _ensure_on_agent(self, row: SessionRow) -> SessionRow:
        """Make sure the sender still has the session; recreate it after an agent restart.

        Returns the session's row as it is now (a new epoch if it was recreated).
        """
        info = self._call(row.sender, lambda c: c.info())
        if info.initialized and row.ssid in info.ssids:
            return row
        log.warning(
            "session %s: sender %s lost it (restart?); creating it again", row.name, row.sender
        )
        for node in (row.sender, row.reflector):
            node_row = self.store.node(node)
            ninfo = self._call(node, lambda c: c.info())
            if not ninfo.initialized:
                if node_row.init is None:
                    raise SouthboundError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"node {node} is not initialised and was never initialised by us",
                    )
                self._init(node, node_row.init)
        rinfo = self._call(row.reflector, lambda c: c.info())
        if row.ssid in rinfo.ssids:
            with contextlib.suppress(SouthboundError):
                self._call(row.reflector, lambda c: c.destroy_session(row.ssid))
        self._create_on_agents(self._spec(row), row.ssid)
        self.store.new_epoch(row.name)
        self._call(row.reflector, lambda c: c.start_session(row.ssid))
        self._call(row.sender, lambda c: c.start_session(row.ssid))
        return self.store.session(row.name)

    def _store(self, row: SessionRow, results: Iterable[pb.StampResult]) -> int:
        records = [(r.record_id, result_from_proto(r)) for r in results]
        counters = self._call(row.sender, lambda c: c.counters(row.ssid)).sessions[0]
        snapshot = (
            counters.sent,
            counters.lost,
            counters.forward_lost if counters.HasField("forward_lost") else None,
            counters.overflow,
        )
        self.store.store_results(row.id, records, snapshot, epoch=row.epoch)
        self.metrics.observe(row.name, [r for _, r in records])
        self.metrics.set_lost(row.name, self.store.session(row.name).lost)
        return records[-1][0] if records else row.cursor

    def _ack(self, row: SessionRow, through: int) -> None:
        """Free what is stored on the agent (safe to lose: the next read acknowledges too)."""
        self._call(row.sender, lambda c: c.acknowledge(row.ssid, through))

    def _poll_once(self, row: SessionRow) -> bool:
        """One poll: store what came, acknowledge it. True when the session is over."""
        reply = self._call(row.sender, lambda c: c.results(row.ssid, BATCH, after_id=row.cursor))
        cursor = self._store(row, reply.results)
        if reply.results:
            self._ack(row, cursor)
        return reply.state == pb.SESSION_STATE_FINISHED and not reply.results

    def _stream_once(self, row: SessionRow, col: _Collector) -> bool:
        stream = self._call(
            row.sender, lambda c: c.stream_results(row.ssid, max_batch=BATCH, after_id=row.cursor)
        )
        col.stream = stream
        if col.stop.is_set():  # stopped while the stream was being opened
            stream.cancel()
            return False
        try:
            for batch in stream:
                if col.stop.is_set():
                    return False
                cursor = self._store(row, batch.results)
                if batch.results:
                    self._ack(row, cursor)
                if batch.final:
                    return True
        except grpc.RpcError as exc:
            if col.stop.is_set():  # our own cancel
                return False
            raise SouthboundError.from_rpc(exc) from None
        finally:
            col.stream = None
            stream.cancel()
        return False
