"""The record sink (agents/sink.py): outcomes written by the worker that made them,
in batches, with commits waiting for them; and the table cache's flush, which sends
a change that says work is done only after that work's records
(pipeline/transport/cache.py). Real SQLite files; the store's failures are
injected (the disk itself failing is the fault suite's sink_disk scenario)."""

import asyncio

import faust
import pytest

from agents import sink
from config.settings import load_settings
from pipeline.ids import delivery_id
from pipeline.models import Outcome
from pipeline.rules.plan import DUPLICATE
from pipeline.store import RecordStore, StoreUnavailable
from pipeline.transport import cache
from pipeline.runtime import Resources
from pipeline.transport.cache import CachedTable
from pipeline.transport.hooks import TransportHooks


def _outcome(i: int, state: str = "ACCEPTED", reason=None) -> Outcome:
    biz, user = f"b{i}", f"u{i}"
    return Outcome(delivery_id=delivery_id(biz, user, "sms"), notification_id=f"n{i}", biz_key=biz, user_id=user,
                   channel="sms", category="otp", template="otp", priority="high", state=state, at=1000.0 + i,
                   reason=reason)


@pytest.fixture
async def store(tmp_path):
    s = RecordStore(str(tmp_path / "records.db"))
    await s.open()
    yield s
    await s.close()


@pytest.fixture
def with_store(store, tmp_path):
    """The sink's writer, on the store above (a worker's Resources.with_store)."""
    res = Resources(load_settings(env={"NOTIFY_DB": str(tmp_path / "records.db")}))
    res._store = store
    return res.with_store


async def test_outcomes_are_written_in_batches_and_flush_waits_for_them(store, with_store):
    records = sink.Records(with_store, within_s=0.01, max_batch=3)
    await records.add([_outcome(i) for i in range(7)] + [_outcome(1, "FILTERED", DUPLICATE)])
    await records.flush()
    assert records.written == records.queued == 7  # the duplicate is only on the stream
    rows = {i: await store.get(delivery_id(f"b{i}", f"u{i}", "sms")) for i in range(7)}
    assert all(r and r[0]["status"] == "ACCEPTED" for r in rows.values())
    await records.add([_outcome(0, "DELIVERED")])
    await records.flush()
    assert (await store.get(delivery_id("b0", "u0", "sms")))[0]["status"] == "DELIVERED"


async def test_an_unavailable_store_holds_flushes_then_the_emitters_and_loses_nothing(store, with_store, monkeypatch):
    real = store.apply_outcomes
    down = asyncio.Event()
    down.set()

    async def apply(rows):
        if down.is_set():
            raise StoreUnavailable("disk I/O error")
        return await real(rows)

    monkeypatch.setattr(store, "apply_outcomes", apply)
    records = sink.Records(with_store, within_s=0, max_batch=2, max_unwritten=4)
    await records.add([_outcome(i) for i in range(3)])
    flushed = asyncio.ensure_future(records.flush())
    adding = asyncio.ensure_future(records.add([_outcome(i) for i in range(3, 6)]))  # 6 unwritten > 4: waits
    await asyncio.sleep(0.3)
    assert not flushed.done() and not adding.done()
    down.clear()
    await asyncio.wait_for(asyncio.gather(flushed, adding), 10)
    await records.flush()
    assert records.written == 6
    for i in range(6):
        assert (await store.get(delivery_id(f"b{i}", f"u{i}", "sms")))[0]["status"] == "ACCEPTED"


async def test_outcomes_the_store_refuses_are_dead_lettered_and_the_rest_written(store, with_store):
    dead = []

    async def dead_letter(source, reason, payload, **kw):
        dead.append((source, reason, kw["key"]))

    from agents.emit import Emit

    emit = Emit.__new__(Emit)  # its refused_record, sending through dead_letter below
    emit.dead_letter = dead_letter
    bad = _outcome(1, state="NO_SUCH_STATE")
    records = sink.Records(with_store, within_s=0)
    records.on_refused = emit.refused_record
    await records.add([_outcome(0), bad, _outcome(2)])
    await records.flush()
    assert dead == [("records", "invalid_outcome", bad.delivery_id)]
    assert (await store.get(delivery_id("b2", "u2", "sms")))[0]["status"] == "ACCEPTED"


# -- the table cache's flush order ------------------------------------------


@pytest.fixture
def table(monkeypatch):
    app = faust.App("sink-order", broker="memory://", store="memory://", Table=CachedTable)
    t = app.Table("marks", default=None, partitions=4)
    sent = []
    # every changelog write of a CachedTable goes through its _send (Faust's or our producer's path)
    monkeypatch.setattr(CachedTable, "_send",
                        lambda self, partition, key, value, *a, **k: sent.append((partition, key, value)))
    monkeypatch.setattr(CachedTable, "caching", lambda self: True)
    app.transport_hooks = TransportHooks()
    return app, t, sent


class Gate:
    """A sink whose flush returns once ``release`` is set."""

    def __init__(self, flush):
        self.flush = flush


def mark(t, key, value, partition=0):
    """``tables.remember``: set, cached for the next flush."""
    t.data[key] = value
    t.remember(partition, key, value)


async def test_a_done_mark_goes_out_only_after_the_records_and_only_if_still_the_latest(table):
    app, t, sent = table
    gate = asyncio.Event()
    app.transport_hooks.sinks.append(Gate(gate.wait))  # the records of what was done so far
    mark(t, "a", {"s": "ACCEPTED"})
    mark(t, "b", {"s": "ACCEPTED"})
    flushing = asyncio.ensure_future(t.flush_durably())
    await asyncio.sleep(0.05)
    assert sent == []  # not before the records are written
    mark(t, "c", {"s": "ACCEPTED"})  # done meanwhile: its records are not waited for here
    newer = {"s": "calling", "a": 2}
    t.data["b"] = newer  # a newer write of b, sent directly (a lane's next "calling" mark)
    t.send_changelog(0, "b", newer)
    gate.set()
    await flushing
    keys = [k for _p, k, _v in sent]
    assert keys == ["b", "a"]  # the direct write, then a; b's older mark is not sent after it
    assert "c" not in keys and t.take_cache() is not None  # c waits for the next flush


async def test_the_producer_flush_takes_the_caches_before_it_waits(table, monkeypatch):
    app, t, sent = table
    order = []

    async def records_flush():
        order.append(("records", len(sent)))
        mark(t, "later", 1)  # changed while the records are written

    app.transport_hooks.sinks.append(Gate(records_flush))
    mark(t, "x", 1)
    await cache.flush_tables(app, cache.cached_tables(app))  # what Producer.flush does
    assert order == [("records", 0)] and [k for _p, k, _v in sent] == ["x"]
