"""Lock-free building blocks for metrics updated on the hot path of an asyncio process.

prometheus_client's own Counter and Histogram take a threading lock on every update and a Histogram
scans its buckets linearly. Every update here happens on the one event-loop thread, and scraping
(`http.py`) runs on that same thread, so plain ints are safe and cost a fraction of that; the
library still does the exposition (its *MetricFamily classes) and the HTTP format.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

OTHER = "_other"  # the label value that every series beyond a cardinality guard's limit shares

# Seconds, from 1 ms to 5 min: start lag and lease renewals on a healthy cluster sit in the low buckets,
# an outage or a backlog in the high ones.
SECONDS_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                                      60.0, 300.0)
MS_BUCKETS: tuple[float, ...] = (1, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000,
                                 300_000, 1_800_000)


class LoopHistogram:
    """Bucket counts, sum and count of observations; `le` buckets as Prometheus defines them."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs, ending with +Inf."""
        out, total = [], 0
        for bound, n in zip((*(repr(float(b)) for b in self.bounds), "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, float(total)))
        return out


class GuardedHistograms:
    """One histogram per label value for the first `limit` values seen by this process; every later value
    shares the `_other` series. Bounds the series a process exports whatever its users create: a value
    keeps its series once admitted (for the process's lifetime), so series never flap between names."""

    def __init__(self, limit: int, bounds: Sequence[float]) -> None:
        self.limit = limit
        self.bounds = tuple(bounds)
        self.by_value: dict[str, LoopHistogram] = {}
        self.other = LoopHistogram(bounds)

    def child(self, value: str) -> LoopHistogram:
        h = self.by_value.get(value)
        if h is None:
            if len(self.by_value) >= self.limit:
                return self.other
            h = self.by_value[value] = LoopHistogram(self.bounds)
        return h

    def observe(self, value: str, amount: float) -> None:
        self.child(value).observe(amount)

    def family(self, name: str, doc: str, label: str) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(name, doc, labels=[label])
        for value, h in (*self.by_value.items(), (OTHER, self.other)):
            if h.count or value != OTHER:
                fam.add_metric([value], h.buckets(), h.sum)
        return fam


class GuardedCounter:
    """Counts per label value for at most `limit` values; later ones count under `_other`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.counts: dict[str, int] = {}

    def inc(self, value: str, n: int = 1) -> None:
        if value not in self.counts and len(self.counts) >= self.limit:
            value = OTHER
        self.counts[value] = self.counts.get(value, 0) + n

    def family(self, name: str, doc: str, label: str) -> CounterMetricFamily:
        fam = CounterMetricFamily(name, doc, labels=[label])
        for value, n in self.counts.items():
            fam.add_metric([value], n)
        return fam


def histogram_family(name: str, doc: str, h: LoopHistogram) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc)
    fam.add_metric([], h.buckets(), h.sum)
    return fam


def counter_family(name: str, doc: str, label: str, counts: dict[str, int]) -> CounterMetricFamily:
    fam = CounterMetricFamily(name, doc, labels=[label])
    for value, n in counts.items():
        fam.add_metric([value], n)
    return fam


def gauge_family(name: str, doc: str, label: str, values: dict[str, int]) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(name, doc, labels=[label])
    for value, n in sorted(values.items()):
        fam.add_metric([value], n)
    return fam


class CallbackCollector(Collector):
    """A collector whose metrics come from a function called at scrape time."""

    def __init__(self, fn: Callable[[], Iterable[Metric]]) -> None:
        self._fn = fn

    def collect(self) -> Iterable[Metric]:
        return list(self._fn())
