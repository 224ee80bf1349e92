"""Where a group's committed offsets live (pipeline/transport/committed.py,
docs/adr/0004-group-state-by-partition.md): one hash per partition index, the
layout before it still read (the larger wins), so a deployment upgrades in place."""

import collections

import redis

from pipeline.transport import committed
from pipeline.transport.keys import Keys

from .helpers import Worker, numbers, produce, seen, wait_until

K = Keys()


def test_combine_takes_the_larger_and_keeps_what_is_not_a_number():
    assert committed.combine(None, None) is None
    assert committed.combine(b"5", None) == b"5" and committed.combine(None, b"7") == b"7"
    assert committed.combine(b"5", b"7") == b"7" and committed.combine(b"9", b"7") == b"9"
    assert committed.combine(b"x", b"7") == b"x"  # reported as not a number, never hidden


def test_reads_both_layouts(redis_sync):
    tps = [("a", 0), ("a", 1), ("b", 1), ("b", 2)]
    redis_sync.hset(K.offsets("g"), mapping={"a|0": 10, "b|1": 30})  # the one-hash layout
    redis_sync.hset(K.commits("g", 0), "a|0", 4)  # lower: the old one wins
    redis_sync.hset(K.commits("g", 1), mapping={"a|1": 20, "b|1": 31})  # higher: the new one wins
    assert committed.read_sync(redis_sync, K, "g", tps) == [10, 20, 31, None]
    every = committed.read_all_sync(redis_sync, K, "g", partitions=3)
    assert {k: int(v) for k, v in every.items()} == {b"a|0": 10, b"a|1": 20, b"b|1": 31}


def test_a_worker_upgraded_in_place_goes_on_from_the_old_commits(redis_url, redis_sync, tmp_path):
    """Offsets committed in the one-hash layout (before ADR 0004) are where an upgraded
    worker starts; its own commits then go to the hashes per partition index."""
    produce(redis_url, "numbers", numbers(0, 800))
    r = redis.Redis.from_url(redis_url)
    highwater = {p: int(r.get(K.counter("numbers", p))) for p in range(4)}
    old = {p: highwater[p] // 2 for p in range(4)}
    r.hset(K.offsets("t"), mapping={K.tp_field("numbers", p): o for p, o in old.items()})
    w = Worker(redis_url + "?lease=3&compact=0", tmp_path).start()
    try:
        want = sum(highwater[p] - old[p] for p in range(4))
        wait_until(lambda: redis_sync.llen("seen") >= want, 60, what=f"{want} processed")
    finally:
        assert w.stop() == 0, w.log()[-3000:]
    by_partition = collections.defaultdict(list)
    for p, off, _v in seen(redis_sync):
        by_partition[p].append(off)
    for p in range(4):  # nothing below the old commits handled again, nothing skipped
        assert by_partition[p] == list(range(old[p], highwater[p])), p
    for p in range(4):
        assert int(r.hget(K.commits("t", p), K.tp_field("numbers", p))) == highwater[p]
        assert r.hget(K.commits("t", p), K.tp_field("numbers", p) + "@") is not None
    r.close()
