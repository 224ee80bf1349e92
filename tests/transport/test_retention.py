"""Bounded streams: consumed topics trimmed below every reader's committed offset,
changelog partitions compacted again only when it is worth it."""

import time

from hypothesis import given
from hypothesis import strategies as st

from pipeline.transport.compactor import Plan, Schedule
from pipeline.transport.keys import Keys
from pipeline.transport.retention import Horizons, trim_horizon

from .helpers import Worker, numbers, produce, seen, wait_until

K = Keys()


@given(st.lists(st.one_of(st.none(), st.integers(0, 1000)), max_size=5), st.integers(0, 1000))
def test_trim_horizon_never_passes_a_reader_or_the_keep_window(committed, aged):
    h = trim_horizon(committed, aged)
    if not committed or None in committed:
        assert h == 0
    else:
        assert h == min(min(committed), aged)


def test_horizons_give_the_highwater_keep_seconds_ago():
    h = Horizons(keep_s=10)
    assert h.aged("tp", 0) == 0
    for t, hw in [(0, 5), (4, 50), (9, 90), (12, 120)]:
        h.observe("tp", t, hw)
    assert h.aged("tp", 12) == 5  # sampled at 0 (12 s ago); 4 was 8 s ago
    assert h.aged("tp", 14.5) == 50
    assert h.aged("tp", 100) == 120
    h.forget([])
    assert h.aged("tp", 100) == 0
    zero = Horizons(keep_s=0)
    zero.observe("tp", 3, 7)
    assert zero.aged("tp", 3) == 7


def test_schedule_compacts_when_doubled_or_a_tombstone_is_due():
    s = Schedule()
    assert not s.due("tp", 1, 0) and s.due("tp", 2, 0)  # first time: anything past the tail
    s.done("tp", Plan([], kept=100, tombstone_due=50.0))
    assert not s.due("tp", 150, 10) and s.due("tp", 200, 10)
    assert s.due("tp", 100, 50.0)
    s.done("tp", Plan([], kept=100))
    assert not s.due("tp", 100, 1e9)


def test_consumed_topics_are_trimmed_below_every_readers_commit(redis_url, redis_sync, tmp_path):
    produce(redis_url, "numbers", numbers(0, 2000))
    # an analysts' group reading the same topic, behind on partition 0
    redis_sync.zadd(K.readers("numbers"), {"analysts": int(time.time() * 1000)})
    redis_sync.hset(K.offsets("analysts"), mapping={"numbers|0": 100, "numbers|1": 10**9,
                                                    "numbers|2": 10**9, "numbers|3": 10**9})
    # a group retired long ago holds nothing
    redis_sync.zadd(K.readers("numbers"), {"retired": 1})
    hw = {p: int(redis_sync.get(K.counter("numbers", p))) for p in range(4)}
    w = Worker(redis_url + "?lease=3&compact=0.5&keep=0", tmp_path).start()
    try:
        wait_until(lambda: redis_sync.llen("seen") >= 2000, 60, what="2000 processed")

        def trimmed():
            lens = {p: redis_sync.xlen(K.stream("numbers", p)) for p in range(4)}
            return lens if lens == {0: hw[0] - 100, 1: 0, 2: 0, 3: 0} else None

        wait_until(trimmed, 30, what="numbers trimmed to the analysts' offset on partition 0, empty elsewhere")
        assert redis_sync.xrange(K.stream("numbers", 0), count=1)[0][0] == b"100-1"
        assert sum(redis_sync.xlen(K.stream("t-counts-changelog", p)) for p in range(4)) > 0  # not a topic to trim
    finally:
        assert w.stop() == 0, w.log()[-3000:]
    # consumption resumes after the commit on trimmed (empty) streams, nothing read twice
    produce(redis_url, "numbers", numbers(2000, 2100))
    w = Worker(redis_url + "?lease=3&compact=0.5&keep=0", tmp_path, "w2").start()
    try:
        wait_until(lambda: redis_sync.llen("seen") >= 2100, 60, what="100 more")
        time.sleep(1)
    finally:
        assert w.stop() == 0, w.log()[-3000:]
    values = sorted(v for _p, _o, v in seen(redis_sync))
    assert values == list(range(2100))


def test_a_topic_only_written_is_trimmed_by_age_and_no_further_than_its_readers(redis_url, redis_sync, tmp_path):
    """The outcome stream: no agent reads it (analysts do), so its partitions' owners
    trim it by age, as Kafka would, and never past a reader group's commit."""
    produce(redis_url, "written", numbers(0, 400))
    hw = {p: int(redis_sync.get(K.counter("written", p))) for p in range(4)}
    redis_sync.zadd(K.readers("written"), {"analysts": int(time.time() * 1000)})
    redis_sync.hset(K.offsets("analysts"), mapping={"written|0": 7})  # behind on 0, nothing committed elsewhere
    w = Worker(redis_url + "?lease=3&compact=0.5&keep=0", tmp_path, WRITTEN="written").start()
    try:
        wait_until(lambda: redis_sync.xlen(K.stream("written", 0)) == hw[0] - 7, 30, what="trimmed to the reader on 0")
        assert all(redis_sync.xlen(K.stream("written", p)) == hw[p] for p in (1, 2, 3))  # a reader without a commit
        redis_sync.delete(K.readers("written"))  # nobody reads it: by age alone (keep=0: everything)
        wait_until(lambda: all(redis_sync.xlen(K.stream("written", p)) == 0 for p in range(4)), 30,
                   what="all trimmed")
        assert redis_sync.zscore(K.readers("written"), "t") is None  # the writer is not a reader
    finally:
        assert w.stop() == 0, w.log()[-3000:]
