"""Committed offsets ahead of their stream (issue 29, item 5): a partition's
stream and counter roll back (AOF everysec, a failover to a replica that missed
the last writes) while the group's committed offset does not. The consumer's
seek finds it, reports it and reads the partition again instead of skipping
every entry appended at the reused offsets (pipeline/transport/integrity.py)."""

import os
import re
import subprocess
import sys

import pytest

from pipeline.transport.integrity import REWRITE_COMMITTED, Verdict, check, rewrite_committed, stream_end
from pipeline.transport.keys import Keys
from pipeline.transport import committed

from .helpers import ROOT, Worker, numbers, produce, seen, wait_until

K = Keys()
P = 4


# -- the decision, pure --------------------------------------------------------


@pytest.mark.parametrize(
    "counter, last, end",
    [
        (None, None, 0),  # never written
        (10, 9, 10),  # the usual: the counter is one past the last entry
        (10, None, 10),  # every entry trimmed
        (None, 6, 7),  # the counter key lost, the stream kept
        (4, 9, 10),  # a counter behind its stream: the stream's end counts
    ],
)
def test_stream_end_is_the_next_offset_assigned(counter, last, end):
    assert stream_end(counter, last) == end


@pytest.mark.parametrize(
    "committed, end, first, start, rolled_back",
    [
        (None, 0, None, None, False),  # a partition never written, never committed
        (None, 50, 0, None, False),  # never committed: auto_offset_reset decides
        (50, 50, 0, 50, False),  # caught up
        (30, 50, 10, 30, False),  # lagging: the harmless case, untouched
        (0, 0, None, 0, False),
        (100, 40, 0, 0, True),  # rolled back: read again from the first entry held
        (100, 40, 25, 25, True),  # ... which may be past 0 (trimmed)
        (100, 40, None, 40, True),  # ... or the end when the stream holds nothing
        (100, 0, None, 0, True),  # the partition lost entirely (stream and counter)
        (41, 40, 39, 39, True),  # one past the end is already a rollback
    ],
)
def test_check_keeps_what_is_within_the_stream_and_rewinds_what_is_past_it(committed, end, first, start,
                                                                          rolled_back):
    v = check(committed, end, first)
    assert v == Verdict(committed, end, start)
    assert v.rolled_back is rolled_back


# -- the rewrite: compare-and-set, fenced as commits are ----------------------


async def _rewrite(client, verdict, token="w:1", field="numbers|0"):
    script = client.register_script(REWRITE_COMMITTED)
    return await rewrite_committed(script, K.offsets("g"), K.group_fence("g"), field, verdict, ("0", token))


async def test_rewrite_sets_the_start_when_the_offset_is_still_the_one_checked(redis_url):
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(redis_url)
    await r.hset(K.group_fence("g"), "0", "w:1")
    await r.hset(K.offsets("g"), "numbers|0", 100)
    assert await _rewrite(r, check(100, 40, 10)) == 10
    assert await r.hget(K.offsets("g"), "numbers|0") == b"10"
    assert await r.hget(K.offsets("g"), "numbers|0@") == b"w:1"
    await r.aclose()


async def test_rewrite_never_overwrites_a_commit_it_did_not_see(redis_url):
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(redis_url)
    await r.hset(K.group_fence("g"), "0", "w:1")
    # committed moved (by the owner) to 30 after the check read 100: within the
    # stream, so that commit stands and the group reads from there
    await r.hset(K.offsets("g"), "numbers|0", 30)
    assert await _rewrite(r, check(100, 40, 10)) == 30
    assert await r.hget(K.offsets("g"), "numbers|0") == b"30"
    # moved to another offset still past the end: compared and set again
    await r.hset(K.offsets("g"), "numbers|0", 120)
    assert await _rewrite(r, check(100, 40, 10)) == 10
    assert await r.hget(K.offsets("g"), "numbers|0") == b"10"
    await r.aclose()


async def test_rewrite_is_fenced_by_the_owners_token(redis_url):
    import redis.asyncio as aioredis
    from redis.exceptions import ResponseError

    r = aioredis.Redis.from_url(redis_url)
    await r.hset(K.group_fence("g"), "0", "other:2")  # the slot changed hands
    await r.hset(K.offsets("g"), "numbers|0", 100)
    with pytest.raises(ResponseError, match="FENCED 0"):
        await _rewrite(r, check(100, 40, 10), token="w:1")
    assert await r.hget(K.offsets("g"), "numbers|0") == b"100"
    await r.aclose()


# -- the consumer's seek, with the offsets of peer groups ----------------------


def _consumer(reports: list, peers=("peer",)):
    """A Consumer with just what its seek's check needs (no worker, no Faust app)."""
    from types import SimpleNamespace

    from pipeline.transport.consumer import Consumer
    from pipeline.transport.hooks import TransportHooks

    c = Consumer.__new__(Consumer)
    c.transport = SimpleNamespace(keys=K)
    c.app = SimpleNamespace(conf=SimpleNamespace(id="g"), transport_hooks=TransportHooks(
        offset_peers={"numbers": peers}, on_offset_rollback=lambda *a: reports.append(a)))
    c._hw = {}
    c._rewrite_script = None
    c._commit_fence = lambda tp: ("0", "w:1")
    return c


@pytest.mark.parametrize(
    "own, peer, expected, reported, own_after",
    [
        (None, None, None, False, None),  # never committed by anyone: the reset policy decides
        (None, 8, 8, False, None),  # a role switch goes on where the other group stopped
        (5, 8, 8, False, 5),
        (9, 8, 9, False, 9),
        (5, 30, 5, False, 5),  # a peer past the end is not followed (that group repairs its own)
        (None, 30, 2, False, None),  # ... nor skipped to: read from the first entry held
        (30, 8, 2, True, 2),  # ours past the end: reported, read again from the first entry, rewritten
        (30, None, 2, True, 2),
    ],
)
async def test_the_seek_check_with_peer_groups(redis_url, own, peer, expected, reported, own_after):
    import redis.asyncio as aioredis
    from faust.types import TP

    r = aioredis.Redis.from_url(redis_url)
    tp, field = TP("numbers", 0), K.tp_field("numbers", 0)
    for off in range(2, 10):  # entries 2..9 (0 and 1 trimmed), the counter at 10
        await r.xadd(K.stream("numbers", 0), {"v": b"x"}, id=f"{off}-1")
    await r.set(K.counter("numbers", 0), 10)
    await r.hset(K.group_fence("g"), "0", "w:1")
    await r.hset(K.commit_fence("g", 0), "0", "w:1")  # as the owner's _fence_commits does before it seeks
    if own is not None:
        await r.hset(K.offsets("g"), field, own)
    if peer is not None:
        await r.hset(K.offsets("peer"), field, peer)
    reports: list = []
    c = _consumer(reports)
    theirs = await c._peer_offsets(r, [tp], [field])
    assert await c._handed_over(r, [tp], [field], [own], theirs) == [expected]
    assert reports == ([("numbers", 0, own, 10)] if reported else [])
    got = (await committed.read(r, K, "g", [("numbers", 0)]))[0]  # both layouts (the old one's field removed)
    assert got == own_after
    assert await r.hget(K.offsets("peer"), field) == (None if peer is None else str(peer).encode())
    await r.aclose()


# -- a real worker, a real rollback -------------------------------------------

#: tests/transport/worker_app.py with the rollback hook recording into Redis
HOOKED_APP = '''
import os

import redis

from tests.transport.worker_app import app, hooks  # noqa: F401 (faust -A finds ``app`` here)

_r = redis.Redis.from_url(os.environ["BROKER"].split("?")[0])


def _report(topic, partition, committed, end):
    _r.rpush("rollbacks", f"{topic}|{partition}|{committed}|{end}")


hooks.on_offset_rollback = _report
'''


class HookedWorker(Worker):
    """The test worker app, with ``on_offset_rollback`` set."""

    def start(self) -> "HookedWorker":
        mod_dir = self.log_path.parent / "hooked"
        mod_dir.mkdir(exist_ok=True)
        (mod_dir / "rollback_app.py").write_text(HOOKED_APP)
        env = dict(os.environ, BROKER=self.broker, PYTHONPATH=f"{ROOT}{os.pathsep}{mod_dir}", **self.env)
        env.setdefault("DATADIR", str(self.log_path.parent / f"data-{self.name}"))
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "faust", "-A", "rollback_app", "worker", "-l", "info", "--without-web"],
            cwd=str(ROOT), env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )
        return self


def _committed(r) -> dict:
    got = committed.read_sync(r, K, "t", [("numbers", p) for p in range(P)])
    return {p: v for p, v in enumerate(got) if v is not None}


def _counters(r) -> dict:
    return {p: int(r.get(K.counter("numbers", p)) or 0) for p in range(P)}


def _roll_back(r, partition: int, keep: int) -> None:
    """What a lost write window leaves: the stream as it was with ``keep`` entries
    (rebuilt: XDEL would keep the stream's last id, and the next XADD at a reused
    id would be refused) and its counter at ``keep`` (gone with the stream if 0)."""
    stream, counter = K.stream("numbers", partition), K.counter("numbers", partition)
    entries = r.xrange(stream, count=keep) if keep else []
    pipe = r.pipeline()
    pipe.delete(stream)
    for eid, fields in entries:
        pipe.xadd(stream, fields, id=eid)
    if keep:
        pipe.set(counter, keep)
    else:
        pipe.delete(counter)
    pipe.execute()


def test_a_rolled_back_partition_is_read_again_and_its_offset_repaired(redis_url, redis_sync, tmp_path):
    url = redis_url + "?lease=3&compact=0"
    n, m = 100, 20  # entries per partition, before and after the rollback
    for p in range(P):
        produce(redis_url, "numbers", numbers(p * n, (p + 1) * n), partition=p)
    w = Worker(url, tmp_path, "first").start()
    try:
        wait_until(lambda: redis_sync.llen("seen") >= P * n, 60, what=f"{P * n} processed")
    finally:
        assert w.stop() == 0, w.log()[-3000:]
    before = _counters(redis_sync)
    assert before == {p: n for p in range(P)}
    assert _committed(redis_sync) == before  # a graceful stop commits everything

    # partition 0 keeps a quarter, 1 loses everything (stream and counter), 2 keeps
    # half; 3 is untouched (its offset stays within the stream: nothing happens)
    kept = {0: before[0] // 4, 1: 0, 2: before[2] // 2}
    for p, keep in kept.items():
        _roll_back(redis_sync, p, keep)
    redis_sync.delete("seen")
    fresh = range(1000, 1000 + P * m)  # values of the entries appended after the rollback
    for p in range(P):
        produce(redis_url, "numbers", numbers(fresh[p * m], fresh[(p + 1) * m - 1] + 1), partition=p)
    ends = {p: kept.get(p, before[p]) + m for p in range(P)}
    assert _counters(redis_sync) == ends
    for p in kept:  # still past the end when the worker seeks: what the check can see
        assert before[p] > ends[p], (p, before, ends)

    w2 = HookedWorker(url, tmp_path, "second").start()
    try:
        wait_until(lambda: {v for _p, _o, v in seen(redis_sync)} >= set(fresh), 60,
                   what="the entries appended after the rollback")
        wait_until(lambda: _committed(redis_sync) == ends, 30, what="commits up to the new ends")
    finally:
        assert w2.stop() == 0, w2.log()[-3000:]

    got = seen(redis_sync)
    # every entry appended after the rollback was handled: none skipped
    assert sorted(v for _p, _o, v in got if v >= 1000) == list(fresh)
    by_p: dict = {}
    for p, off, _v in got:
        by_p.setdefault(p, []).append(off)
    for p in kept:  # read again from the first entry the stream holds, up to its end
        assert by_p[p] == list(range(0, ends[p])), p
    assert by_p[3] == list(range(before[3], ends[3]))  # the untouched one resumed where it was

    # reported once per rolled-back partition (the hook, and an ERROR in the log)
    reports = sorted(x.decode() for x in redis_sync.lrange("rollbacks", 0, -1))
    assert reports == sorted(f"numbers|{p}|{before[p]}|{ends[p]}" for p in kept)
    log = w2.log()
    for p in range(P):
        errors = re.findall(rf"ERROR.*numbers\[{p}\]: committed offset \d+ is past the stream's end", log)
        assert len(errors) == (1 if p in kept else 0), (p, log[-3000:])
    # the committed offsets in Redis follow the stream again
    assert _committed(redis_sync) == _counters(redis_sync) == ends


def test_a_partition_never_written_nor_committed_stays_untouched(redis_url, redis_sync, tmp_path):
    url = redis_url + "?lease=3&compact=0"
    w = HookedWorker(url, tmp_path, "idle").start()
    try:
        wait_until(lambda: "generation" in w.log(), 60, what="partitions assigned")
        produce(redis_url, "numbers", numbers(0, 20))
        wait_until(lambda: redis_sync.llen("seen") >= 20, 60, what="20 processed")
    finally:
        assert w.stop() == 0, w.log()[-3000:]
    assert redis_sync.llen("rollbacks") == 0
    assert "past the stream's end" not in w.log()
    assert _committed(redis_sync) == _counters(redis_sync)
