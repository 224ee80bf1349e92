"""pipeline/tally.py against prometheus_client's own Counter and Histogram: the same
updates give the same exposition (text format, parsed back by prometheus_client's
parser), every sample but the ``_created`` timestamps' values."""

import math

import pytest
from hypothesis import given, settings as hsettings, strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pipeline import metrics
from pipeline.tally import Tally, TallyHistogram

BUCKETS = (0.001, 0.01, 0.1, 1, 10)
LABELS = st.sampled_from(["a", "b", "", "x y", 'q"uote', "ü"])
AMOUNTS = st.one_of(st.floats(min_value=0, max_value=1e6, allow_nan=False), st.integers(0, 100))
OBSERVED = st.one_of(st.floats(allow_nan=False, min_value=-10, max_value=100),
                     st.sampled_from([0.0, *BUCKETS, math.inf]))


def _samples(registry: CollectorRegistry) -> list:
    text = generate_latest(registry).decode()
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            created = s.name.endswith("_created")
            out.append((fam.name, fam.type, fam.documentation, s.name, sorted(s.labels.items()),
                        None if created else s.value))
    return out


def _pair(cls, theirs, name, labels, **kw):
    a, b = CollectorRegistry(), CollectorRegistry()
    return cls(name, "help text", labels, registry=a, **kw), theirs(name, "help text", labels, registry=b, **kw), a, b


@hsettings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(LABELS, LABELS, AMOUNTS), max_size=30))
def test_a_counter_exposes_what_prometheus_clients_does(updates):
    ours, theirs, a, b = _pair(Tally, Counter, "t_outcomes_total", ["state", "reason"])
    for x, y, n in updates:
        ours.labels(x, y).inc(n)
        theirs.labels(x, y).inc(n)
    assert _samples(a) == _samples(b)


@hsettings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(LABELS, OBSERVED), max_size=40))
def test_a_histogram_exposes_what_prometheus_clients_does(updates):
    ours, theirs, a, b = _pair(TallyHistogram, Histogram, "t_latency_seconds", ["priority"], buckets=BUCKETS)
    for x, v in updates:
        ours.labels(x).observe(v)
        theirs.labels(x).observe(v)
    assert _samples(a) == _samples(b)


def test_unlabelled_metrics_and_label_values_that_are_not_text():
    ours, theirs, a, b = _pair(Tally, Counter, "t_events_total", [])
    ours.inc()
    ours.inc(2.5)
    theirs.inc()
    theirs.inc(2.5)
    hours, htheirs, ha, hb = _pair(TallyHistogram, Histogram, "t_wait_seconds", [])
    for v in (0.3, 7, float("nan"), 1e9):
        hours.observe(v)
        htheirs.observe(v)
    assert _samples(a) == _samples(b)
    # nan: prometheus_client adds it to the sum and to no bucket; the parser reads nan != nan
    assert [s for s in _samples(ha) if s[3] != "t_wait_seconds_sum"] == \
           [s for s in _samples(hb) if s[3] != "t_wait_seconds_sum"]
    c, t, ca, cb = _pair(Tally, Counter, "t_calls_total", ["code"])
    c.labels(200).inc()
    c.labels("200").inc()  # the same series as 200
    t.labels(200).inc()
    t.labels("200").inc()
    assert _samples(ca) == _samples(cb)


def test_wrong_use_is_refused_as_prometheus_client_refuses_it():
    c = Tally("t_refuse_total", "h", ["a"], registry=None)
    with pytest.raises(ValueError):
        c.labels("x", "y")
    with pytest.raises(ValueError):
        c.inc()
    with pytest.raises(ValueError):
        c.labels("x").inc(-1)
    with pytest.raises(ValueError):
        Tally("t_plain_total", "h", registry=None).labels("x")
    with pytest.raises(ValueError):
        TallyHistogram("t_h", "h", registry=None, buckets=(2, 1))
    with pytest.raises(ValueError):
        TallyHistogram("t_h", "h", ["le"], registry=None)
    registry = CollectorRegistry()
    Tally("t_dup_total", "h", registry=registry)
    with pytest.raises(ValueError):  # a name taken: the registry's own check
        Counter("t_dup_total", "h", registry=registry)


def test_the_workers_hot_metrics_are_in_the_default_registry():
    from prometheus_client import REGISTRY

    before = REGISTRY.get_sample_value("notify_outcomes_total", {"state": "FILTERED", "reason": "t_tally"}) or 0
    metrics.outcomes_of("FILTERED", "t_tally").inc()
    metrics.to_terminal_of("high").observe(0.2)
    assert REGISTRY.get_sample_value("notify_outcomes_total", {"state": "FILTERED", "reason": "t_tally"}) == before + 1
    assert REGISTRY.get_sample_value("notify_acceptance_to_terminal_seconds_bucket",
                                     {"priority": "high", "le": "0.25"}) >= 1
    text = generate_latest(REGISTRY).decode()
    assert "# TYPE notify_send_latency_seconds histogram" in text
    assert "# TYPE notify_events_in_total counter" in text
