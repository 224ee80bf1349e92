"""Counters and histograms of the hot path: plain numbers on the event loop's
thread, exposed to Prometheus by a collector.

prometheus_client's ``Counter.inc`` checks that the metric is observable and takes
a lock around the add; ``Histogram.observe`` does the same for its sum and walks
its buckets in Python. A notification makes about five such updates (an outcome's
count, a provider call's count and latency, the time to a terminal state): ~40
Python calls of ~930 on the fake path (``bench/e2e.py --calls``). Here an update is
an attribute add (``inc``), or a bisection of the bounds and two adds
(``observe``), on a child looked up once.

Exposed through the registry's public collector interface (``collect()``
returning ``Metric`` families), with the samples prometheus_client's own metric
of the same name, help, labels and buckets would expose: ``_total`` (and
``_created``) for a counter; cumulative ``_bucket`` by ``le``, ``_count``, ``_sum``
(and ``_created``) for a histogram. tests/pipeline/test_tally.py holds them to it.

Updates are not locked: every metric here is updated from the thread running the
event loop (agents and their lanes). A scrape from the exporter's thread reads
numbers that are each whole; a series added during a scrape may be missed by it.
"""

from __future__ import annotations

import bisect
import math
import os
import time
from typing import Any, Iterable, Optional, Sequence

from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

__all__ = ["Tally", "TallyHistogram", "DEFAULT_BUCKETS"]

#: prometheus_client's default buckets (``Histogram.DEFAULT_BUCKETS``)
DEFAULT_BUCKETS = (.005, .01, .025, .05, .075, .1, .25, .5, .75, 1.0, 2.5, 5.0, 7.5, 10.0, math.inf)

#: as prometheus_client: PROMETHEUS_DISABLE_CREATED_SERIES=true leaves out the ``_created`` samples
_CREATED = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in ("true", "1", "t")


class _Count:
    __slots__ = ("value", "created")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class _Buckets:
    __slots__ = ("counts", "sum", "created", "_bounds")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        self.sum += amount
        if amount == amount:  # NaN falls in no bucket, as prometheus_client's
            # the first bound >= amount: the last is +Inf, so every number has one
            self.counts[bisect.bisect_left(self._bounds, amount)] += 1


class _Family(Collector):
    """A metric's children by label values, and its collector."""

    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: Optional[CollectorRegistry]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        #: label values as given → child (the hot path's lookup)
        self._children: dict[tuple, Any] = {}
        #: label values as text → child, in the order they came (the exposition's)
        self._series: dict[tuple[str, ...], Any] = {}
        if not self.labelnames:
            self._series[()] = self._children[()] = self._new()
        if registry is not None:
            registry.register(self)

    def _new(self) -> Any:
        raise NotImplementedError

    def labels(self, *values: Any) -> Any:
        """The child of ``values`` (one per label name, in order), made at first use."""
        child = self._children.get(values)
        if child is None:
            if not self.labelnames:
                raise ValueError("No label names were set when constructing %s" % self.name)
            if len(values) != len(self.labelnames):
                raise ValueError("Incorrect label count")
            key = tuple(str(v) for v in values)
            child = self._series.get(key)
            if child is None:
                child = self._series[key] = self._new()
            self._children[values] = child
        return child

    def _only(self) -> Any:
        if self.labelnames:
            raise ValueError("%s has labels: call labels() first" % self.name)
        return self._children[()]

    def _samples(self, metric: Metric, labels: dict, child: Any) -> None:
        raise NotImplementedError

    def describe(self) -> Iterable[Metric]:
        """The family without samples: the registry finds its names (a name taken is refused)."""
        return [Metric(self.name, self.documentation, self.kind)]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        for key, child in list(self._series.items()):
            self._samples(metric, dict(zip(self.labelnames, key)), child)
        return [metric]


class Tally(_Family):
    """A counter (``name`` ends with ``_total``, as prometheus_client's ``Counter``
    takes it). ``labels(...).inc(n)``, or ``inc(n)`` without labels."""

    kind = "counter"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 registry: Optional[CollectorRegistry] = REGISTRY) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames, registry)
        if not self.labelnames:
            self.inc = self._children[()].inc  # one call an update

    def _new(self) -> _Count:
        return _Count()

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)

    def _samples(self, metric: Metric, labels: dict, child: _Count) -> None:
        metric.add_sample(self.name + "_total", labels, child.value)
        if _CREATED:
            metric.add_sample(self.name + "_created", labels, child.created)


class TallyHistogram(_Family):
    """A histogram with the upper bounds ``buckets`` (+Inf added when missing).
    ``labels(...).observe(x)``, or ``observe(x)`` without labels."""

    kind = "histogram"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 registry: Optional[CollectorRegistry] = REGISTRY,
                 buckets: Sequence[float] = DEFAULT_BUCKETS) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("Buckets not in sorted order")
        if bounds and bounds[-1] != math.inf:
            bounds.append(math.inf)
        if len(bounds) < 2:
            raise ValueError("Must have at least two buckets")
        if "le" in labelnames:
            raise ValueError("Invalid label name: le")
        self.bounds = tuple(bounds)
        super().__init__(name, documentation, labelnames, registry)
        if not self.labelnames:
            self.observe = self._children[()].observe

    def _new(self) -> _Buckets:
        return _Buckets(self.bounds)

    def observe(self, amount: float) -> None:
        self._only().observe(amount)

    def _samples(self, metric: Metric, labels: dict, child: _Buckets) -> None:
        acc = 0.0
        for bound, n in zip(self.bounds, list(child.counts)):
            acc += n
            metric.add_sample(self.name + "_bucket", {**labels, "le": floatToGoString(bound)}, acc)
        metric.add_sample(self.name + "_count", labels, acc)
        if self.bounds[0] >= 0:  # as prometheus_client: no sum when a bound is negative
            metric.add_sample(self.name + "_sum", labels, child.sum)
        if _CREATED:
            metric.add_sample(self.name + "_created", labels, child.created)
