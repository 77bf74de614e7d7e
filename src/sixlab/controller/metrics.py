"""Prometheus metrics of the controller (prometheus-client, one registry per controller).

=========================================  =============================================
metric                                     meaning
=========================================  =============================================
``sixlab_stamp_delay_seconds``             histogram of delays, by path and direction
                                           (``direct``, ``return``, ``rtt``)
``sixlab_stamp_packets_total``             packets by path and outcome (``received``,
                                           ``lost``)
``sixlab_stamp_loss_ratio``                lost / (received + lost), by path
``sixlab_stamp_jitter_seconds``            mean absolute IPDV (RFC 3393), by path and
                                           direction, over the last batch
``sixlab_agent_up``                        1 while the node's agent answers, else 0
=========================================  =============================================
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from sixlab.stamp import StampResult
from sixlab.stamp.stats import ipdv

__all__ = ["DELAY_BUCKETS_S", "ControllerMetrics"]

#: From 50 µs (a LAN hop) to 2.5 s (a satellite path under load), roughly ×2 steps.
DELAY_BUCKETS_S = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.delay = Histogram(
            "sixlab_stamp_delay_seconds",
            "STAMP-measured delay",
            ["path", "direction"],
            buckets=DELAY_BUCKETS_S,
            registry=self.registry,
        )
        self.packets = Counter(
            "sixlab_stamp_packets",
            "STAMP test packets",
            ["path", "outcome"],
            registry=self.registry,
        )
        self.loss = Gauge(
            "sixlab_stamp_loss_ratio", "Lost over sent", ["path"], registry=self.registry
        )
        self.jitter = Gauge(
            "sixlab_stamp_jitter_seconds",
            "Mean absolute IPDV (RFC 3393) of the last batch",
            ["path", "direction"],
            registry=self.registry,
        )
        self.agent_up = Gauge(
            "sixlab_agent_up", "1 while the node's agent answers", ["node"], registry=self.registry
        )
        self._received: dict[str, int] = {}
        self._lost: dict[str, int] = {}

    def observe(self, path: str, records: Sequence[StampResult]) -> None:
        for r in records:
            self.delay.labels(path, "direct").observe(r.direct_ns / 1e9)
            self.delay.labels(path, "return").observe(r.return_ns / 1e9)
            self.delay.labels(path, "rtt").observe(r.rtt_ns / 1e9)
        if records:
            self.packets.labels(path, "received").inc(len(records))
            self._received[path] = self._received.get(path, 0) + len(records)
        for direction, values in (
            ("direct", ipdv(records)),
            ("return", ipdv(records, lambda r: r.return_ns)),
        ):
            if values:
                self.jitter.labels(path, direction).set(sum(map(abs, values)) / len(values) / 1e9)
        self._update_loss(path)

    def set_lost(self, path: str, lost_total: int) -> None:
        """The agent's cumulative loss count for the path (counted once per increase)."""
        new = lost_total - self._lost.get(path, 0)
        if new > 0:
            self.packets.labels(path, "lost").inc(new)
            self._lost[path] = lost_total
        self._update_loss(path)

    def set_agent_up(self, node: str, up: bool) -> None:
        self.agent_up.labels(node).set(1 if up else 0)

    def _update_loss(self, path: str) -> None:
        received = self._received.get(path, 0)
        lost = self._lost.get(path, 0)
        if received + lost:
            self.loss.labels(path).set(lost / (received + lost))

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Expose /metrics over HTTP (a daemon thread of prometheus-client)."""
        start_http_server(port, addr=addr, registry=self.registry)
