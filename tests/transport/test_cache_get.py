"""``CachedTable.get`` reads the store directly (pipeline/transport/cache.py) and
answers what Faust's ``Mapping.get`` answers, for every kind of table."""

from datetime import timedelta

import faust
import pytest

from pipeline.transport.cache import CachedTable


@pytest.fixture
def app():
    return faust.App("cache-get", broker="memory://", store="memory://", Table=CachedTable)


def _faust_get(table, key, *default):
    return faust.Table.get(table, key, *default)


def test_the_same_answers_as_faust_for_a_table_without_default(app):
    t = app.Table("plain", partitions=4)
    t.data["a"] = {"x": 1}
    t.data["n"] = None
    for key, default in [("a", None), ("a", 7), ("missing", None), ("missing", 7), ("n", 7), (("daily", "k"), 0)]:
        assert t.get(key, default) == _faust_get(t, key, default)
    assert t.get("missing") is None and t.get("a") is t.data["a"]
    assert not t._dirty  # a read changes nothing


def test_a_table_with_a_default_or_a_window_keeps_faust_s_get(app):
    d = app.Table("counts", default=int, partitions=4)
    assert d.get("missing") == _faust_get(d, "missing") == 0
    w = app.Table("windowed", partitions=4).tumbling(timedelta(seconds=10)).table
    assert w.window is not None
    w.data[("k", (0.0, 9.9))] = 3
    for key in ["k", ("k", (0.0, 9.9)), "missing"]:
        assert w.get(key) == _faust_get(w, key)
