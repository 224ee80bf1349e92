"""Changelog-backed tables recover after restarts and after compaction."""

import random

import orjson
import redis
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipeline.transport.compactor import Entry, compact_partition, plan_compaction
from pipeline.transport.groups import entry_changes
from pipeline.transport.keys import Keys
from pipeline.transport.committed import read_all_sync

from .helpers import Worker, produce, wait_until

K = Keys()
CHANGELOG = "t-kv-changelog"

entries_st = st.lists(
    st.tuples(st.sampled_from([b"a", b"b", b"c", b"d", None]), st.one_of(st.none(), st.integers(0, 9)), st.floats(0, 100)),
    max_size=60,
)


def replay(entries):
    state = {}
    for _id, key, value in entries:
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


@given(entries_st)
def test_plan_compaction_keeps_latest_per_key_and_the_tail(raw):
    entries = [Entry(f"{i}-1".encode(), k, ts, v is None) for i, (k, v, ts) in enumerate(raw)]
    values = {f"{i}-1".encode(): v for i, (_k, v, _ts) in enumerate(raw)}
    doomed = set(plan_compaction(entries).doomed)
    kept = [(e.id, e.key, values[e.id]) for e in entries if e.id not in doomed]
    assert replay(kept) == replay([(e.id, e.key, values[e.id]) for e in entries])
    if entries:
        assert entries[-1][0] not in doomed
    assert len({k for _e, k, _v in kept}) == len(kept)  # one per key


@given(entries_st, st.floats(0, 100), st.floats(0, 100))
def test_plan_compaction_drops_tombstones_past_their_grace(raw, grace, now):
    """Replaying what is kept gives the same state; a deleted key leaves nothing
    behind once its tombstone is older than the grace (except as the tail)."""
    entries = [Entry(f"{i}-1".encode(), k, ts, v is None) for i, (k, v, ts) in enumerate(raw)]
    values = {e.id: v for e, (_k, v, _ts) in zip(entries, raw)}
    plan = plan_compaction(entries, now=now, tombstone_grace_s=grace)
    doomed = set(plan.doomed)
    kept = [e for e in entries if e.id not in doomed]
    assert replay([(e.id, e.key, values[e.id]) for e in kept]) == replay([(e.id, e.key, values[e.id]) for e in entries])
    for e in kept[:-1] if kept and entries and kept[-1].id == entries[-1].id else kept:
        if e.tombstone:
            assert e.ts > now - grace
    if entries:
        assert entries[-1].id not in doomed
    young = [e.ts + grace for e in kept if e.tombstone and e.id != entries[-1].id]
    assert plan.tombstone_due == (min(young) if young else None)


change_st = st.tuples(st.sampled_from([b"a", b"b", b"c", b"d"]), st.one_of(st.none(), st.integers(0, 9)))
mixed_st = st.lists(
    st.tuples(st.one_of(change_st.map(lambda c: [c]), st.lists(change_st, max_size=4).map(lambda g: g + [None])),
              st.floats(0, 100)),
    max_size=40,
)


def _mixed(raw):
    """Entries of single changes and group entries (a list ending in None marks a group)."""
    entries, values = [], {}
    for i, (changes, ts) in enumerate(raw):
        eid = f"{i}-1".encode()
        if changes and changes[-1] is None:
            group = changes[:-1]
            entries.append(Entry(eid, b'["~g","x"]', ts, False, [(k, v is None) for k, v in group]))
            values[eid] = group
        else:
            (k, v), = changes
            entries.append(Entry(eid, k, ts, v is None))
            values[eid] = [(k, v)]
    return entries, values


def replay_changes(entries, values):
    state = {}
    for e in entries:
        for k, v in values[e.id]:
            if v is None:
                state.pop(k, None)
            else:
                state[k] = v
    return state


@given(mixed_st, st.one_of(st.none(), st.floats(0, 100)), st.floats(0, 100))
# a group kept for b still holds a's older value: a's tombstone must stay
@example([([(b"a", 0), (b"b", 0), None], 0.0), ([(b"a", None)], 0.0), ([None], 0.0)], 0.0, 0.0)
def test_plan_compaction_of_group_entries_keeps_the_state(raw, grace, now):
    """A group entry (pipeline/transport/groups.py) stays while it is the latest of
    one of its keys; replaying what is kept gives the same state; a group is dropped
    once every key in it has a later entry (or its deletions passed the grace)."""
    entries, values = _mixed(raw)
    plan = plan_compaction(entries, now=now, tombstone_grace_s=grace)
    doomed = set(plan.doomed)
    kept = [e for e in entries if e.id not in doomed]
    assert replay_changes(kept, values) == replay_changes(entries, values)
    if entries:
        assert entries[-1].id not in doomed
    later: dict = {}
    for e in reversed(entries):  # for each entry, the keys some later entry changes
        keys = {k for k, _v in values[e.id]}
        if e.group is not None and e.id != entries[-1].id and keys and keys <= set(later):
            assert e.id in doomed, "a group whose every key was changed again is dropped"
        for k in keys:
            later[k] = True


@given(entries_st, st.floats(1, 50))
def test_plan_compaction_retention_drops_old_but_never_the_tail(raw, retention):
    entries = [Entry(f"{i}-1".encode(), k, ts) for i, (k, _v, ts) in enumerate(raw)]
    doomed = set(plan_compaction(entries, retention_s=retention, now=100.0).doomed)
    for e in entries[:-1]:
        if e.ts < 100.0 - retention:
            assert e.id in doomed
    if entries:
        assert entries[-1][0] not in doomed


def _ops_for(rng, n):
    ops = []
    for _ in range(n):
        k = f"k{rng.randrange(25)}"
        if rng.random() < 0.25:
            ops.append((k, {"op": "del"}))
        else:
            ops.append((k, {"op": "set", "v": rng.randrange(1000)}))
    return ops


def _dump(r, url, round_no):
    """Each partition dumps its own keys after everything before the marker."""
    for p in range(4):
        produce(url, "ops", [(b"x", orjson.dumps({"op": "dump", "round": round_no}))], partition=p)
    want = {f"{round_no}:{p}".encode() for p in range(4)}
    wait_until(lambda: want <= set(r.lrange("dumped", 0, -1)), 60, what=f"dump {round_no}")
    state = {}
    for p in range(4):
        state.update({k.decode(): int(v) for k, v in r.hgetall(f"dump:{p}").items()})
    return state


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_table_recovered_after_restarts_and_compaction_equals_model(seed, redis_server, tmp_path_factory):
    r = redis.Redis.from_url(redis_server.url)
    r.flushall()
    url = redis_server.url
    tmp = tmp_path_factory.mktemp("tables")
    rng = random.Random(seed)
    model: dict[str, int] = {}
    worker = Worker(url + "?lease=1.5&compact=0", tmp, "w").start()
    try:
        for round_no in range(3):
            ops = _ops_for(rng, rng.randrange(20, 200))
            produce(url, "ops", [(k.encode(), orjson.dumps(op)) for k, op in ops])
            for k, op in ops:
                if op["op"] == "set":
                    model[k] = op["v"]
                else:
                    model.pop(k, None)
            assert _dump(r, url, round_no * 10) == model
            action = rng.choice(["kill", "stop", "compact+kill", "compact+stop"])
            if action.startswith("compact"):
                import asyncio

                async def compact_all():
                    ar = redis.asyncio.Redis.from_url(url)
                    # tombstones dropped at once (no grace): recovery must not miss them
                    plans = [await compact_partition(ar, K, CHANGELOG, p, tombstone_grace_s=0) for p in range(4)]
                    n = sum(len(p.doomed) for p in plans)
                    await ar.aclose()
                    return n

                asyncio.run(compact_all())
            if action.endswith("kill"):
                worker.kill()
            else:
                assert worker.stop() == 0
            worker = Worker(url + "?lease=1.5&compact=0", tmp, f"w{round_no}").start()
            assert _dump(r, url, round_no * 10 + 1) == model, action
    finally:
        worker.kill()
        r.close()


def test_ordered_store_applies_a_batch_in_changelog_order():
    """Faust's memory store loses a key deleted then set to a falsy value in one batch."""
    from types import SimpleNamespace

    from tables.store import Store

    def ev(key, value):
        return SimpleNamespace(key=key, value=value, message=SimpleNamespace(value=None if value is None else b"x",
                                                                             partition=0))

    store = Store.__new__(Store)
    store.__post_init__()
    store.apply_changelog_batch([ev("a", 1), ev("a", None), ev("a", 0), ev("b", 2), ev("b", None)],
                                to_key=lambda k: k, to_value=lambda v: v)
    assert store.data == {"a": 0}


def test_table_writes_coalesce_per_key_until_the_commit(redis_url, redis_sync, tmp_path):
    """pipeline/transport/cache.py: 2,000 increments of 37 keys leave far fewer
    changelog entries than writes, and the last entry of each key is its count."""
    from .helpers import numbers

    produce(redis_url, "numbers", numbers(0, 2000))
    w = Worker(redis_url + "?lease=3&compact=0", tmp_path).start()
    try:
        wait_until(lambda: redis_sync.llen("seen") >= 2000, 60, what="2000 processed")
        hw = {p: int(redis_sync.get(K.counter("numbers", p))) for p in range(4)}
        wait_until(lambda: all(int(read_all_sync(redis_sync, K, "t").get(f"numbers|{p}".encode()) or 0) == hw[p] for p in range(4)),
                   30, what="committed")
    finally:
        assert w.stop() == 0, w.log()[-3000:]
    latest, entries = {}, 0
    for p in range(4):
        for _id, f in redis_sync.xrange(K.stream("t-counts-changelog", p)):
            entries += 1
            for k, v in entry_changes(f):  # a commit's changes of a partition: one group entry
                latest[k] = int(v)
    expected = {}
    for k, _v in numbers(0, 2000):
        expected[k.decode()] = expected.get(k.decode(), 0) + 1
    assert latest == expected
    assert entries < 1000, f"{entries} changelog entries for 2,000 writes"


def test_a_key_written_for_a_users_partition_goes_with_that_partition():
    """tables.put / put_many / remember write a user's key while the current event
    is of another partition (expand planning an intent) or while there is none (a
    lane's take): the key is the user's partition's, kept while that partition is
    held and dropped when it is given up, whatever the event's partition does.
    Attributed to the event's partition, a dedup entry was dropped with the events'
    partition while its user's daily counter stayed: the intent, read again, was
    counted twice (the cluster failover drill's 'FILTERED over_limit')."""
    import asyncio
    import weakref
    from types import SimpleNamespace

    from faust.streams import _current_event
    from faust.types import TP

    import tables
    from tables.store import Store

    store = Store.__new__(Store)
    store.__post_init__()
    table = SimpleNamespace(data=store, caching=lambda: False, send_changelog=lambda *a, **kw: None,
                            send_group=lambda *a, **kw: None)
    class Event:  # expand's event: partition 3
        message = SimpleNamespace(partition=3)

    event = Event()
    token = _current_event.set(weakref.ref(event))
    try:
        tables.remember(table, 1, "u|biz|*", [1.0, "t"])  # the user's partition: 1
        tables.put(table, 1, ("daily", "freq:u:marketing:d"), 2)
    finally:
        _current_event.reset(token)
    tables.put_many(table, 1, {("window", "u|marketing"): [1.0]})  # no current event
    topic = "t-dedup-changelog"
    asyncio.run(store.on_recovery_completed({TP(topic, 1)}, set()))  # partition 3 given up, 1 kept
    assert set(store.data) == {"u|biz|*", ("daily", "freq:u:marketing:d"), ("window", "u|marketing")}
    asyncio.run(store.on_recovery_completed({TP(topic, 3)}, set()))  # partition 1 given up
    assert dict(store.data) == {}


def test_the_ordered_store_s_get_answers_as_mapping_get():
    """tables/store.py ``Store.get`` reads the dict directly: what ``Mapping.get``
    (``__getitem__``, ``KeyError`` for a missing key) answers, falsy values kept."""
    from collections.abc import Mapping

    from tables.store import Store

    store = Store.__new__(Store)
    store.__post_init__()
    for k, v in {"a": 1, "zero": 0, "none": None, ("daily", "u|otp"): 3, "empty": []}.items():
        store[k] = v
    for key in ("a", "zero", "none", ("daily", "u|otp"), "empty", "missing", ("window", "x")):
        for default in ((), (None,), (7,)):
            assert store.get(key, *default) == Mapping.get(store, key, *default), (key, default)
