"""pipeline/metrics.py ``Children``: a labelled metric's child looked up once, the
same child ``labels()`` gives, so what is counted through it is in the metric."""

from prometheus_client import CollectorRegistry, Counter

from pipeline.metrics import Children


def test_a_child_is_looked_up_once_and_counts_in_its_metric():
    registry = CollectorRegistry()
    c = Counter("t_outcomes_total", "test", ["state", "reason"], registry=registry)
    of = Children(c)
    assert of("ACCEPTED", "") is of("ACCEPTED", "") is c.labels("ACCEPTED", "")
    assert of("FILTERED", "opted_out") is not of("ACCEPTED", "")
    of("ACCEPTED", "").inc()
    of("ACCEPTED", "").inc(2)
    of("FILTERED", "opted_out").inc()
    assert registry.get_sample_value("t_outcomes_total", {"state": "ACCEPTED", "reason": ""}) == 3
    assert registry.get_sample_value("t_outcomes_total", {"state": "FILTERED", "reason": "opted_out"}) == 1
