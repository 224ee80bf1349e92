"""Consumer lag read from Redis at scrape time, and the API's own counters.

For every declared pipeline topic (``<ns>:topics``) and partition: highwater,
committed, lag and the age of the oldest unprocessed message, as pipeline/lag.py
reads them (written once there: ``notify status`` reads the same).

``notify.dlq`` has no consumer, so its highwater is the dead-letter depth.
The consume rate (and so the drain time shown on the status page) is the
change of the committed offsets between snapshots, over the last
``rate_window`` seconds.

Prometheus collectors are synchronous and the API is one event loop, so the
``/metrics`` handler first takes a fresh snapshot with the async client (two
pipeline round trips) and then renders; :class:`LagCollector` only turns the
latest snapshot into metric families. Every scrape therefore shows values
read during that scrape.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from pipeline import topics as T
from pipeline.lag import GROUP, TopicLag, agent_of, declared_partitions, read_positions, topic_lags
from pipeline.rules.scaling import GOALS, PriorityLoad, priority_of, signal
from pipeline.supervise import read_states
from pipeline.transport.keys import Keys

__all__ = [
    "LagSampler",
    "LagCollector",
    "Snapshot",
    "TopicLag",
    "agent_of",
    "receipts_rejected",
    "receipts_received",
    "api_requests",
    "api_latency",
    "events_accepted",
    "events_duplicate",
]

# -- the API's own metrics (process-wide, in prometheus_client's default registry)

receipts_rejected = Counter(
    "notify_receipts_rejected_total", "Receipt callbacks refused", ["provider", "reason"]
)
receipts_received = Counter(
    "notify_receipts_received_total", "Receipts written to notify.receipts", ["provider", "status"]
)
api_requests = Counter("notify_api_requests_total", "HTTP requests answered", ["method", "route", "status"])
api_latency = Histogram(
    "notify_api_request_seconds", "HTTP request handling time", ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
events_accepted = Counter("notify_api_events_accepted_total", "Events written to notify.events by the API")
events_duplicate = Counter(
    "notify_api_events_duplicate_total", "Repeated POST /v1/events answered from the idempotency record"
)


@dataclass
class Snapshot:
    at: float
    ok: bool
    topics: dict[str, TopicLag] = field(default_factory=dict)
    error: Optional[str] = None
    #: what `notify run` supervises: "<host>/<process>" → state (pipeline/supervise.py)
    processes: dict[str, dict] = field(default_factory=dict)

    @property
    def dlq_depth(self) -> int:
        t = self.topics.get(T.DLQ)
        return sum(t.highwater) if t else 0


def _int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


class LagSampler:
    """Takes lag snapshots from Redis and keeps a short history for rates."""

    def __init__(self, client: Any, keys: Keys, partitions: int, group: str = GROUP,
                 rate_window: float = 30.0, min_interval: float = 0.25) -> None:
        self.client = client
        self.keys = keys
        self.partitions = partitions
        self.group = group
        self.rate_window = rate_window
        self.min_interval = min_interval
        self._history: deque[tuple[float, dict[str, int]]] = deque()
        self.last: Optional[Snapshot] = None
        self.errors = 0

    async def snapshot(self, force: bool = False) -> Snapshot:
        """A fresh snapshot (reused if the last one is younger than ``min_interval``)."""
        now = time.time()
        if not force and self.last is not None and self.last.ok and now - self.last.at < self.min_interval:
            return self.last
        try:
            snap = await self._take(now)
        except Exception as exc:  # noqa: BLE001 - report on the page/metrics, never fail a scrape
            self.errors += 1
            snap = Snapshot(at=now, ok=False, error=f"{type(exc).__name__}: {exc}")
        self.last = snap
        return snap

    async def _take(self, now: float) -> Snapshot:
        """Two pipeline round trips (pipeline/lag.py): the partitions declared, then
        every position and the supervisor's states; a third for the oldest entry of
        the partitions that lag."""
        counts = await declared_partitions(self.client, self.keys, self.partitions)
        positions, (states,) = await read_positions(self.client, self.keys, counts, self.group,
                                                    also=[("hgetall", (self.keys.supervisor,))])
        snap = Snapshot(at=now, ok=True, processes=read_states(states))
        snap.topics = await topic_lags(self.client, self.keys, positions, now)
        self._rates(now, {topic: sum(tl.committed) for topic, tl in snap.topics.items()}, snap)
        return snap

    def _rates(self, now: float, totals: dict[str, int], snap: Snapshot) -> None:
        hist = self._history
        hist.append((now, totals))
        while len(hist) > 2 and now - hist[1][0] >= self.rate_window:
            hist.popleft()
        if len(hist) < 2:
            return
        t0, old = hist[0]
        dt = now - t0
        if dt <= 0:
            return
        for topic, tl in snap.topics.items():
            if topic in old:
                tl.rate = max(0, totals[topic] - old[topic]) / dt


class LagCollector:
    """Metric families from the sampler's latest snapshot (see the module doc)."""

    def __init__(self, sampler: LagSampler, scheduled: Any = None) -> None:
        self.sampler = sampler
        #: callable → Optional[int]: SCHEDULED records (see app.py), or None
        self.scheduled = scheduled

    def describe(self):
        return []

    def collect(self):
        snap = self.sampler.last
        up = GaugeMetricFamily("notify_lag_up", "1 if the last lag snapshot could read Redis")
        up.add_metric([], 1.0 if snap is not None and snap.ok else 0.0)
        yield up
        errors = CounterMetricFamily("notify_lag_snapshot_errors", "Lag snapshots that failed")
        errors.add_metric([], float(self.sampler.errors))
        yield errors
        if snap is None or not snap.ok:
            return
        labels = ["group", "agent", "topic", "partition"]
        lag = GaugeMetricFamily("notify_consumer_lag", "Messages not yet processed (highwater - committed)", labels=labels)
        age = GaugeMetricFamily(
            "notify_consumer_lag_seconds", "Age of the oldest unprocessed message (0 when none)", labels=labels
        )
        hw = GaugeMetricFamily("notify_topic_highwater", "Next offset to assign", labels=["topic", "partition"])
        cm = GaugeMetricFamily("notify_consumer_committed", "Committed offset (next to read)", labels=labels)
        rate = GaugeMetricFamily(
            "notify_consumer_rate", "Messages/s committed over the rate window", labels=["group", "agent", "topic"]
        )
        group = self.sampler.group
        for topic, tl in snap.topics.items():
            for p, (h, c, a) in enumerate(zip(tl.highwater, tl.committed, tl.oldest_age)):
                hw.add_metric([topic, str(p)], h)
                if topic in T.UNREAD:
                    continue  # no agent consumes it: only its depth (the DLQ's is below)
                lv = [group, tl.agent, topic, str(p)]
                lag.add_metric(lv, max(0, h - c))
                age.add_metric(lv, a)
                cm.add_metric(lv, c)
            if topic not in T.UNREAD and tl.rate is not None:
                rate.add_metric([group, tl.agent, topic], tl.rate)
        yield lag
        yield age
        yield hw
        yield cm
        yield rate
        restarts = GaugeMetricFamily("notify_process_restarts",
                                     "Times `notify run` restarted the process after it exited", labels=["process"])
        looping = GaugeMetricFamily("notify_process_crash_looping",
                                    "1 if the process exited 5 times within 5 minutes", labels=["process"])
        up = GaugeMetricFamily("notify_process_up", "1 if the supervised process is running", labels=["process"])
        for name, st in snap.processes.items():
            restarts.add_metric([name], _int(st.get("restarts")))
            looping.add_metric([name], 1.0 if st.get("crash_loop") else 0.0)
            up.add_metric([name], 1.0 if st.get("up") else 0.0)
        yield restarts
        yield looping
        yield up
        needed = GaugeMetricFamily("notify_workers_needed", "Workers the drain rate says the backlog needs to "
                                   "meet the priority's latency goal (pipeline/rules/scaling.py)", labels=["priority"])
        drain = GaugeMetricFamily("notify_priority_drain_seconds", "Backlog / drain rate of a priority's topics "
                                  "(absent while not draining)", labels=["priority"])
        oldest = GaugeMetricFamily("notify_priority_oldest_seconds", "Age of the oldest unprocessed entry of a "
                                   "priority's topics", labels=["priority"])
        for load in scaling(snap):
            needed.add_metric([load.priority], load.needed)
            oldest.add_metric([load.priority], load.oldest_age_s)
            if load.time_to_drain_s is not None:
                drain.add_metric([load.priority], load.time_to_drain_s)
        yield needed
        yield drain
        yield oldest
        dlq = GaugeMetricFamily("notify_dead_letter_depth", "Messages in notify.dlq (all partitions)")
        dlq.add_metric([], snap.dlq_depth)
        yield dlq
        backlog = GaugeMetricFamily(
            "notify_scheduled_backlog_messages", "Unprocessed messages on notify.timers and notify.timers.high "
            "(scheduler lag)"
        )
        backlog.add_metric([], sum(t.lag for t in (snap.topics.get(T.TIMERS), snap.topics.get(T.TIMERS_HIGH)) if t))
        yield backlog
        if self.scheduled is not None:
            n = self.scheduled()
            if n is not None:
                sched = GaugeMetricFamily(
                    "notify_records_scheduled", "Deliveries waiting in state SCHEDULED (record store)"
                )
                sched.add_metric([], n)
                yield sched


def workers_by_role(processes: dict[str, dict]) -> dict[str, int]:
    """Running workers per kind from the supervisor's states: ``priority`` (the
    OTP path's own process) and ``main`` (``main-i`` / ``worker-i``)."""
    out = {"priority": 0, "main": 0}
    for name, st in processes.items():
        if not st.get("up"):
            continue
        if name == "priority":
            out["priority"] += 1
        elif name.startswith(("main-", "worker-")):
            out["main"] += 1
    return out


def scaling(snap: "Snapshot") -> list[PriorityLoad]:
    """The scaling signal per priority (pipeline/rules/scaling.py) from a snapshot.
    Without the supervisor's states (workers started elsewhere), one worker is assumed."""
    lags: dict[str, list] = {p: [] for p in GOALS}
    for topic, tl in snap.topics.items():
        p = priority_of(topic)
        if p is not None:
            lags[p].append((tl.lag, max(tl.oldest_age, default=0.0), tl.rate))
    running = workers_by_role(snap.processes)
    out = []
    for p, items in lags.items():
        n = running["priority"] if p == "high" and running["priority"] else running["main"]
        out.append(signal(p, n or 1, items))
    return out


def new_registry(collector: LagCollector) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return reg
