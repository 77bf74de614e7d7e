"""Prometheus metrics of the controller (prometheus-client, one registry per controller).

=============================================  ==========================================
metric                                         meaning
=============================================  ==========================================
``sixlab_stamp_delay_seconds``                 histogram of delays, by path and direction
                                               (``direct``, ``return``, ``rtt``), of the
                                               results stored since the controller started
``sixlab_stamp_jitter_seconds``                mean absolute IPDV (RFC 3393), by path and
                                               direction, over the last batch
``sixlab_stamp_packets_total``                 test packets by path and outcome: ``sent``,
                                               ``received``, ``lost`` (declared by the
                                               sender), ``unknown`` (agent outages)
``sixlab_stamp_lost_packets_total``            with a stateful reflector, lost packets by
                                               direction (``forward``, ``backward``)
``sixlab_stamp_loss_ratio``                    lost / (received + lost), by path
``sixlab_session_recreations_total``           epochs begun after the first, by path and
                                               reason: ``sender-lost`` (the sender agent
                                               restarted or lost it), ``reflector-lost``
                                               (a stateful reflector restarted),
                                               ``started-again``
``sixlab_collection_lag_seconds``              how long the oldest result of the path's
                                               last stored batch waited, T4 to stored
``sixlab_collection_stage_seconds``            histogram over every stored result of how
                                               long it took, by ``stage``: ``agent`` (T4
                                               to its message's (poll: reply's) arrival at
                                               the controller), ``queued`` (arrival to
                                               its transaction's start), ``transaction``
                                               (start to commit), ``total`` (T4 to
                                               commit: the collection lag)
``sixlab_collection_last_success_timestamp``   when the path's results were last read
``_seconds``                                   (Unix s), whether or not any came
``sixlab_sender_schedule_skipped_total``       send slots the sender's engine skipped (it
                                               sent less than asked), by path
``sixlab_sender_schedule_late_seconds``        mean lateness of the sent packets after
                                               their slots, by path
``sixlab_flow_delay_seconds``                  mean delay of the last batch per flow label
                                               (ECMP coverage), by path, ``flow_label``
                                               and direction (``direct``, ``rtt``)
``sixlab_data_packets_total``                  direct-mode loss (RFC 8972 §4.5): data
                                               packets by path, direction (``forward``,
                                               ``backward``) and outcome (``sent``,
                                               ``lost``), since the controller started
``sixlab_session_event_active``                1 while the path's threshold event of that
                                               ``kind`` (delay, jitter, loss) is raised
``sixlab_session_events_total``                threshold events by path, kind and state
                                               (``raised``, ``cleared``)
``sixlab_agent_up``                            1 while the node's agent answers, else 0
``sixlab_fenced_stores_total``                 result transactions of the node refused
                                               because this replica's lease of it had
                                               changed hands (``controller.replica``)
``sixlab_dropped_results_total``               results read from the node's agent and
                                               not stored: their session had left that
                                               epoch, been destroyed, or been pruned
``sixlab_refused_results_total``               results read from the node's agent and
                                               not stored: a field out of what a STAMP
                                               packet carries (docs/architecture.md)
``sixlab_agent_restarts_total``                new runs (epochs) of the node's agent seen
``sixlab_agent_start_time_seconds``            when the node's agent's run started (Unix s)
=============================================  ==========================================

Every metric is produced at scrape time by one collector (no ``_created`` series). The
packet, loss, re-creation, schedule, event and agent counters are the stored totals
(``bind``): those of the sessions' whole lives, across agent and controller restarts,
not counts since the controller started. The controller reads them from the store once,
keeps them in memory as it stores results, and reads them again only after another
change (``Controller._metric_totals``): a scrape costs no query per session. With
replicas, each exports the sessions whose sender node it holds; a replica that takes a
node over reads their totals then, so the counters go on from the same values. The delay histograms
and jitter come from the results as they are stored, so the histograms count from the
controller's start (Prometheus' ``rate`` and ``histogram_quantile`` handle the reset);
so do the flow-label delays and the data packets. A loopback path (docs/srpm.md) has
only ``rtt`` delays, and its jitter is the round trip's (direction ``rtt``). Events come
from the store.
A destroyed session's series go with it; a finished one keeps them.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from sixlab.controller.store import OUTAGES_IN_ONE_LINE
from sixlab.stamp import DataCounters, StampResult, data_loss
from sixlab.wire.timestamp import ErrorEstimate

__all__ = [
    "DELAY_BUCKETS_S",
    "LAG_BUCKETS_S",
    "ControllerMetrics",
    "NodeTotals",
    "PathTotals",
    "Totals",
]

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
#: Collection stages: 50 ms steps up to 1.5 s (the collection lag's goal is 1 s, issue
#: 15), coarser beyond.
LAG_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    *(round(0.05 * i, 2) for i in range(1, 31)),
    2.0,
    2.5,
    3.0,
    5.0,
    10.0,
    30.0,
    60.0,
)
#: The stages of ``sixlab_collection_stage_seconds`` (``ControllerMetrics.collection_stages``).
STAGES = ("agent", "queued", "transaction", "total")
_NS = 1e9
log = logging.getLogger(__name__)
log.addFilter(OUTAGES_IN_ONE_LINE)  # a database outage: a line a round


@dataclass(frozen=True, slots=True)
class PathTotals:
    """A live session's totals from the store, for the metrics."""

    path: str
    sent: int
    received: int
    lost: int
    unknown: int
    forward_lost: int | None
    #: Epochs begun after the first, by reason.
    recreations: dict[str, int] = field(default_factory=dict)
    skipped: int = 0
    late_ns_total: int = 0
    #: Threshold events: the kinds raised now, and the counts by (kind, state).
    events_raised: tuple[str, ...] = ()
    event_counts: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeTotals:
    node: str
    restarts: int
    started_ns: int | None


@dataclass(frozen=True, slots=True)
class Totals:
    paths: Sequence[PathTotals] = ()
    nodes: Sequence[NodeTotals] = ()


@dataclass(slots=True)
class _Histogram:
    bounds: tuple[float, ...] = DELAY_BUCKETS_S
    buckets: list[int] = field(init=False, default_factory=list)
    sum: float = 0.0

    def __post_init__(self) -> None:
        self.buckets = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, n: int = 1) -> None:
        """``n`` observations of ``value``."""
        self.buckets[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n

    def observe_ns(self, values_ns: Iterable[int]) -> None:
        """``observe`` of each value, given in ns."""
        bounds, buckets, find, total = self.bounds, self.buckets, bisect.bisect_left, 0.0
        for ns in values_ns:
            value = ns / _NS
            buckets[find(bounds, value)] += 1
            total += value
        self.sum += total

    def cumulative(self) -> list[tuple[str, float]]:
        out, total = [], 0
        for bound, n in zip((*map(str, self.bounds), "+Inf"), self.buckets, strict=True):
            total += n
            out.append((bound, float(total)))
        return out


def _ipdv(items: list[tuple[int, int, int]]) -> tuple[list[int], list[int]]:
    """RFC 3393 IPDV of each consecutive-sequence pair (``sixlab.stamp.stats.ipdv``) of
    (Seq, delay, delay) tuples: of the first delays, and of the second."""
    if len(items) < 2:
        return [], []
    pairs = list(itertools.pairwise(items))
    if any(b[0] < a[0] for a, b in pairs):  # records mostly come in Seq order already
        pairs = list(itertools.pairwise(sorted(items, key=lambda p: p[0])))
    pairs = [(a, b) for a, b in pairs if b[0] == a[0] + 1]
    return [b[1] - a[1] for a, b in pairs], [b[2] - a[2] for a, b in pairs]


def _row_result(row: Sequence[Any]) -> StampResult:
    """A stored result row as the ``StampResult`` the flow and data metrics read."""
    data = None if row[14] is None else DataCounters(row[14], row[15], row[16], row[17])
    return StampResult(
        0, row[3], row[4], row[5], row[6], row[7], ErrorEstimate.from_int(row[8]),
        ErrorEstimate.from_int(row[9]), row[10], row[11], b"", row[12], bool(row[13]), data,
    )  # fmt: skip


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._lock = threading.Lock()
        self._delay: dict[tuple[str, str], _Histogram] = {}
        self._jitter: dict[tuple[str, str], float] = {}
        self._lag: dict[str, float] = {}
        self._stages = {stage: _Histogram(LAG_BUCKETS_S) for stage in STAGES}
        #: Collection transactions, and the seconds they took together (begin to commit).
        self._transactions = 0
        self._transaction_s = 0.0
        self._last_read: dict[str, float] = {}
        self._up: dict[str, bool] = {}
        self._fenced: dict[str, int] = {}
        self._dropped: dict[str, int] = {}
        self._refused: dict[str, int] = {}
        self._flow_delay: dict[tuple[str, int, str], float] = {}
        #: Direct-mode loss: (path, direction, outcome) -> packets, and each path's last
        #: sample (Seq, T1, counters) to join the next batch's first to.
        self._data: dict[tuple[str, str, str], int] = {}
        self._last_data: dict[str, tuple[int, int, DataCounters]] = {}
        self._totals: Callable[[], Totals] = Totals
        self.registry.register(_Exporter(self))
        self.registry.register(_StageExporter(self))

    def bind(self, totals: Callable[[], Totals]) -> None:
        """Where the stored totals come from (the controller), read at each scrape."""
        self._totals = totals

    def observe(self, path: str, records: Sequence[StampResult]) -> None:
        """Results just stored for ``path``: delay histograms, jitter, flow-label delays,
        data packets."""
        rows = [
            (0, 0, 0, r.seq, r.t1_ns, r.t2_ns, r.t3_ns, r.t4_ns, 0, 0, 0, 0, r.flow_label,
             r.loopback, r.data)
            for r in records
        ]  # fmt: skip
        with self._lock:
            self._observe(path, rows, records)

    def observe_rows(self, path: str, rows: Sequence[Sequence[Any]], now_ns: int) -> None:
        """``observe`` and ``collected`` of result rows as stored (the store's
        ``RESULT_COLUMNS``: Seq at 3, T1–T4 at 4–7, flow label 12, loopback 13, data
        counters 14–17), read at ``now_ns``: what a collector calls for each session's
        batch, without a ``StampResult`` per record."""
        with self._lock:
            self._observe(path, rows, None)
            self._last_read[path] = now_ns / _NS
            if rows:
                self._lag[path] = max(0, now_ns - min(row[7] for row in rows)) / _NS

    def observe_many(
        self, batches: Sequence[tuple[str, Sequence[Sequence[Any]]]], now_ns: int
    ) -> None:
        """``observe_rows`` of each (path, rows) of one transaction, under one lock: a
        collector stores a batch per session, thousands a second, mostly of one record."""
        now_s = now_ns / _NS
        last_read, lag = self._last_read, self._lag
        with self._lock:
            for path, rows in batches:
                if len(rows) == 1 and rows[0][12] is None and rows[0][14] is None:
                    self._observe_one(path, rows[0])
                else:
                    self._observe(path, rows, None)
                last_read[path] = now_s
                if rows:
                    lag[path] = max(0, now_ns - min(row[7] for row in rows)) / _NS

    def _observe_one(self, path: str, row: Sequence[Any]) -> None:
        """``_observe`` of one row without a flow label or data counters (lock held):
        its delays, and no IPDV (that needs two records)."""
        t1, t2, t3, t4 = row[4:8]
        rt = (t4 - t1) - (t3 - t2)
        delay = self._delay
        if row[13]:
            values: tuple[tuple[str, int], ...] = (("rtt", rt),)
        else:
            values = (("direct", t2 - t1), ("return", t4 - t3), ("rtt", rt))
        for direction, ns in values:
            hist = delay.get((path, direction))
            if hist is None:
                hist = delay[(path, direction)] = _Histogram()
            value = ns / _NS
            hist.buckets[bisect.bisect_left(hist.bounds, value)] += 1
            hist.sum += value

    def _observe(
        self, path: str, rows: Sequence[Sequence[Any]], records: Sequence[StampResult] | None
    ) -> None:
        """``observe`` of rows (Seq, T1–T4, flow label, loopback and data at their
        ``RESULT_COLUMNS`` places), and of ``records`` if given (lock held)."""
        # One pass over the records (this runs for every stored batch): each delay once.
        direct: list[int] = []
        back: list[int] = []
        rtt: list[int] = []
        two_way: list[tuple[int, int, int]] = []
        looped: list[tuple[int, int, int]] = []
        extra = False
        for row in rows:
            seq, t1, t2, t3, t4 = row[3:8]
            rt = (t4 - t1) - (t3 - t2)
            rtt.append(rt)
            if row[13]:
                looped.append((seq, rt, 0))
            else:
                d, b = t2 - t1, t4 - t3
                direct.append(d)
                back.append(b)
                two_way.append((seq, d, b))
            if row[12] is not None or row[14] is not None:
                extra = True
        for direction, values in (("direct", direct), ("return", back), ("rtt", rtt)):
            if values:
                hist = self._delay.get((path, direction))
                if hist is None:
                    hist = self._delay[(path, direction)] = _Histogram()
                hist.observe_ns(values)
        if len(rows) > 1:  # IPDV needs two records (a batch of one leaves jitter as it was)
            direct_ipdv, return_ipdv = _ipdv(two_way)
            for direction, values in (
                ("direct", direct_ipdv), ("return", return_ipdv), ("rtt", _ipdv(looped)[0]),
            ):  # fmt: skip
                if values:
                    self._jitter[(path, direction)] = sum(map(abs, values)) / len(values) / _NS
        if extra:
            if records is None:
                records = [_row_result(row) for row in rows]
            self._observe_flows(path, records)
            self._observe_data(path, records)

    def _observe_flows(self, path: str, records: Sequence[StampResult]) -> None:
        by_label: dict[int, list[StampResult]] = {}
        for r in records:
            if r.flow_label is not None:
                by_label.setdefault(r.flow_label, []).append(r)
        for label, recs in by_label.items():
            self._flow_delay[(path, label, "rtt")] = sum(r.rtt_ns for r in recs) / len(recs) / _NS
            two_way = [r for r in recs if not r.loopback]
            if two_way:
                mean = sum(r.direct_ns for r in two_way) / len(two_way) / _NS
                self._flow_delay[(path, label, "direct")] = mean

    def _observe_data(self, path: str, records: Sequence[StampResult]) -> None:
        samples = sorted(
            ((r.seq, r.t1_ns, r.data) for r in records if r.data is not None),
            key=lambda s: s[0],
        )
        if not samples:
            return
        last = self._last_data.get(path)
        if last is not None and last[0] < samples[0][0]:  # a lower Seq: a new epoch
            samples.insert(0, last)
        self._last_data[path] = samples[-1]
        for interval in data_loss(samples):
            for key, n in (
                (("forward", "sent"), interval.forward_sent),
                (("forward", "lost"), max(0, interval.forward_lost)),
                (("backward", "sent"), interval.backward_sent),
                (("backward", "lost"), max(0, interval.backward_lost or 0)),
            ):
                self._data[(path, *key)] = self._data.get((path, *key), 0) + n

    def collected(self, path: str, now_ns: int, records: Sequence[StampResult]) -> None:
        """The path's results were read at ``now_ns`` (Unix ns); ``records`` were stored."""
        with self._lock:
            self._last_read[path] = now_ns / _NS
            if records:
                self._lag[path] = max(0, now_ns - min(r.t4_ns for r in records)) / _NS

    def collection_stages(
        self, arrivals: Sequence[tuple[int, Sequence[int]]], begun_ns: int, committed_ns: int
    ) -> None:
        """One transaction of collected results: ``arrivals`` are its messages (or
        replies), each as when it reached the controller and the T4 of its records (Unix
        ns); the transaction began and committed at ``begun_ns`` and ``committed_ns``.
        T4 is the agent's clock: the ``agent`` and ``total`` stages include its offset
        from the controller's."""
        agent = self._stages["agent"]
        with self._lock:
            self._transactions += 1
            self._transaction_s += (committed_ns - begun_ns) / _NS
            for at, t4s in arrivals:
                if not t4s:
                    continue
                agent.observe_ns([at - t4 for t4 in t4s])
                self._stages["queued"].observe(max(0, begun_ns - at) / _NS, len(t4s))
                self._stages["transaction"].observe((committed_ns - begun_ns) / _NS, len(t4s))
                self._stages["total"].observe_ns([committed_ns - t4 for t4 in t4s])

    def fenced(self, node: str) -> None:
        """A transaction of the node's results was refused: its lease changed hands."""
        with self._lock:
            self._fenced[node] = self._fenced.get(node, 0) + 1

    def dropped(self, node: str, results: int) -> None:
        """Results read from the node's agent were not stored: their session had left
        that epoch, been destroyed, or its row was deleted (``apply --prune``)."""
        if results:
            with self._lock:
                self._dropped[node] = self._dropped.get(node, 0) + results

    def refused(self, node: str, results: int) -> None:
        """Results read from the node's agent were not stored: a field out of range
        (``Controller._refused``)."""
        if results:
            with self._lock:
                self._refused[node] = self._refused.get(node, 0) + results

    def set_agent_up(self, node: str, up: bool) -> None:
        with self._lock:
            self._up[node] = up

    def remove_path(self, path: str) -> None:
        """The session is destroyed: its series go (a new session may take its name)."""
        with self._lock:
            tables: tuple[dict[Any, Any], ...] = (
                self._delay, self._jitter, self._flow_delay, self._data
            )  # fmt: skip
            for table in tables:
                for key in [k for k in table if k[0] == path]:
                    del table[key]
            self._last_data.pop(path, None)
            self._lag.pop(path, None)
            self._last_read.pop(path, None)

    def remove_node(self, node: str) -> None:
        with self._lock:
            self._up.pop(node, None)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Expose /metrics over HTTP (a daemon thread of prometheus-client)."""
        start_http_server(port, addr=addr, registry=self.registry)


class _StageExporter(Collector):
    """``sixlab_collection_stage_seconds``, on its own: cheap to scrape by name."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self.m = metrics

    def describe(self) -> Iterator[HistogramMetricFamily | CounterMetricFamily]:
        return self.collect()

    def collect(self) -> Iterator[HistogramMetricFamily | CounterMetricFamily]:
        with self.m._lock:
            stages = {k: (h.cumulative(), h.sum) for k, h in self.m._stages.items()}
            transactions, transaction_s = self.m._transactions, self.m._transaction_s
        # Their rate is how busy the commit slot is: one slot, at most a second a second.
        yield CounterMetricFamily(
            "sixlab_collection_transactions",
            "Transactions of collected results committed",
            value=transactions,
        )
        yield CounterMetricFamily(
            "sixlab_collection_transaction_seconds",
            "Seconds the transactions of collected results took together, begin to commit",
            value=transaction_s,
        )
        family = HistogramMetricFamily(
            "sixlab_collection_stage_seconds",
            "How long stored results took, by stage (agent, queued, transaction; total: T4"
            " to committed)",
            labels=["stage"],
        )
        for stage, (buckets, total) in stages.items():
            family.add_metric([stage], buckets, total)
        yield family


class _Exporter(Collector):
    """Every metric of a ControllerMetrics, built at scrape time."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self.m = metrics

    def describe(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """The families without reading the store: a scrape restricted to other names
        (``/metrics?name[]=...``) then leaves this collector, and the store, alone."""
        return self._families(Totals())

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        try:
            totals = self.m._totals()
        except Exception:
            # A scrape must not fail: the store-based metrics are left out of this one.
            log.exception("metrics: cannot read the stored totals")
            totals = Totals()
        return self._families(totals)

    def _families(self, totals: Totals) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        m = self.m
        with m._lock:
            delay = {k: (h.cumulative(), h.sum) for k, h in m._delay.items()}
            jitter = dict(m._jitter)
            lag, last_read, up = dict(m._lag), dict(m._last_read), dict(m._up)
            fenced = dict(m._fenced)
            dropped = dict(m._dropped)
            refused_results = dict(m._refused)
            flow_delay, data = dict(m._flow_delay), dict(m._data)
        live = {p.path for p in totals.paths}

        hist = HistogramMetricFamily(
            "sixlab_stamp_delay_seconds", "STAMP-measured delay", labels=["path", "direction"]
        )
        for (path, direction), (buckets, total) in sorted(delay.items()):
            if path in live:
                hist.add_metric([path, direction], buckets, total)
        yield hist  # type: ignore[misc]
        gauge = GaugeMetricFamily(
            "sixlab_stamp_jitter_seconds",
            "Mean absolute IPDV (RFC 3393) of the last batch",
            labels=["path", "direction"],
        )
        for (path, direction), value in sorted(jitter.items()):
            if path in live:
                gauge.add_metric([path, direction], value)
        yield gauge

        packets = CounterMetricFamily(
            "sixlab_stamp_packets", "STAMP test packets by outcome", labels=["path", "outcome"]
        )
        by_direction = CounterMetricFamily(
            "sixlab_stamp_lost_packets",
            "Lost test packets by direction (stateful reflector, RFC 8762 §4.3)",
            labels=["path", "direction"],
        )
        ratio = GaugeMetricFamily(
            "sixlab_stamp_loss_ratio", "Lost over received and lost", labels=["path"]
        )
        recreations = CounterMetricFamily(
            "sixlab_session_recreations",
            "Epochs begun after the first (the session created afresh on its sender)",
            labels=["path", "reason"],
        )
        skipped = CounterMetricFamily(
            "sixlab_sender_schedule_skipped",
            "Send slots the sender's engine came too late for and skipped",
            labels=["path"],
        )
        late = GaugeMetricFamily(
            "sixlab_sender_schedule_late_seconds",
            "Mean lateness of the sent packets after their slots",
            labels=["path"],
        )
        for p in totals.paths:
            for outcome, n in (
                ("sent", p.sent),
                ("received", p.received),
                ("lost", p.lost),
                ("unknown", p.unknown),
            ):
                packets.add_metric([p.path, outcome], n)
            if p.forward_lost is not None:
                by_direction.add_metric([p.path, "forward"], p.forward_lost)
                by_direction.add_metric([p.path, "backward"], max(0, p.lost - p.forward_lost))
            known = p.received + p.lost
            ratio.add_metric([p.path], p.lost / known if known else 0.0)
            for reason in ("sender-lost", "reflector-lost", "started-again"):
                recreations.add_metric([p.path, reason], p.recreations.get(reason, 0))
            skipped.add_metric([p.path], p.skipped)
            late.add_metric([p.path], p.late_ns_total / p.sent / _NS if p.sent else 0.0)
        yield from (packets, by_direction, ratio, recreations, skipped, late)

        lag_gauge = GaugeMetricFamily(
            "sixlab_collection_lag_seconds",
            "How long the oldest result of the last stored batch waited (T4 to stored)",
            labels=["path"],
        )
        read_gauge = GaugeMetricFamily(
            "sixlab_collection_last_success_timestamp_seconds",
            "When the path's results were last read from its sender",
            labels=["path"],
        )
        for path in sorted(live):
            if path in lag:
                lag_gauge.add_metric([path], lag[path])
            if path in last_read:
                read_gauge.add_metric([path], last_read[path])
        yield from (lag_gauge, read_gauge)

        yield from _srpm_families(totals, live, flow_delay, data)

        up_gauge = GaugeMetricFamily(
            "sixlab_agent_up", "1 while the node's agent answers", labels=["node"]
        )
        for node, is_up in sorted(up.items()):
            up_gauge.add_metric([node], 1.0 if is_up else 0.0)
        restarts = CounterMetricFamily(
            "sixlab_agent_restarts", "New runs (epochs) of the node's agent seen", labels=["node"]
        )
        started = GaugeMetricFamily(
            "sixlab_agent_start_time_seconds",
            "When the node's agent's current run started",
            labels=["node"],
        )
        for agent in totals.nodes:
            restarts.add_metric([agent.node], agent.restarts)
            if agent.started_ns is not None:
                started.add_metric([agent.node], agent.started_ns / _NS)
        refused = CounterMetricFamily(
            "sixlab_fenced_stores",
            "Result transactions refused: this replica's lease of the node changed hands",
            labels=["node"],
        )
        for node, n in sorted(fenced.items()):
            refused.add_metric([node], n)
        gone = CounterMetricFamily(
            "sixlab_dropped_results",
            "Results read from the node's agent and not stored: their session had left"
            " that epoch, been destroyed, or been pruned",
            labels=["node"],
        )
        for node, n in sorted(dropped.items()):
            gone.add_metric([node], n)
        bad = CounterMetricFamily(
            "sixlab_refused_results",
            "Results read from the node's agent and not stored: a field out of what a STAMP"
            " packet carries",
            labels=["node"],
        )
        for node, n in sorted(refused_results.items()):
            bad.add_metric([node], n)
        yield from (up_gauge, restarts, started, refused, gone, bad)


def _srpm_families(
    totals: Totals,
    live: set[str],
    flow_delay: dict[tuple[str, int, str], float],
    data: dict[tuple[str, str, str], int],
) -> list[CounterMetricFamily | GaugeMetricFamily]:
    """The families of docs/srpm.md: flow-label delays, data packets, threshold events."""
    flows = GaugeMetricFamily(
        "sixlab_flow_delay_seconds",
        "Mean delay of the last batch per IPv6 flow label (ECMP coverage)",
        labels=["path", "flow_label", "direction"],
    )
    for (path, label, direction), value in sorted(flow_delay.items()):
        if path in live:
            flows.add_metric([path, str(label), direction], value)
    data_packets = CounterMetricFamily(
        "sixlab_data_packets",
        "Data packets of the measured flow (direct-mode loss, RFC 8972 §4.5)",
        labels=["path", "direction", "outcome"],
    )
    for (path, direction, outcome), n in sorted(data.items()):
        if path in live:
            data_packets.add_metric([path, direction, outcome], n)
    active = GaugeMetricFamily(
        "sixlab_session_event_active",
        "1 while the path's threshold event of that kind is raised",
        labels=["path", "kind"],
    )
    events = CounterMetricFamily(
        "sixlab_session_events", "Threshold events by kind and state",
        labels=["path", "kind", "state"],
    )  # fmt: skip
    for p in totals.paths:
        for kind in ("delay", "jitter", "loss"):
            active.add_metric([p.path, kind], 1.0 if kind in p.events_raised else 0.0)
            for state in ("raised", "cleared"):
                events.add_metric([p.path, kind, state], p.event_counts.get((kind, state), 0))
    return [flows, data_packets, active, events]
