"""Leased slot ownership, takeover, fencing of zombies, and broker restarts."""

import asyncio
import signal
import threading
import time

import faust
import pytest
import redis

from pipeline.transport.keys import Keys
from pipeline.transport.ownership import SlotLeases
from pipeline.transport.scripts import COMMIT_PART, PRODUCE, SET_COMMIT_FENCE, SET_FENCE
from pipeline.transport.committed import read_all_sync

from .helpers import Worker, numbers, produce, seen, wait_until

K = Keys()


def committed(r, group="t", topic="numbers"):
    out = {}
    for f, v in read_all_sync(r, K, group).items():
        if f.startswith(topic.encode() + b"|") and not f.endswith(b"@"):
            out[int(f.split(b"|")[1])] = int(v)
    return out


class OffsetWatcher(threading.Thread):
    """Polls committed offsets and records any that move backwards."""

    def __init__(self, url):
        super().__init__(daemon=True)
        self.r = redis.Redis.from_url(url)
        self.backwards = []
        self.stop_flag = False

    def run(self):
        last = {}
        while not self.stop_flag:
            now = committed(self.r)
            for p, o in now.items():
                if o < last.get(p, -1):
                    self.backwards.append((p, last[p], o))
            last.update(now)
            time.sleep(0.05)


async def test_lease_takeover_and_fencing_in_process(redis_url):
    """A worker whose lease expired and was taken cannot commit or write a changelog."""
    r = redis.asyncio.Redis.from_url(redis_url)
    a = SlotLeases(K, "g", 1, lease_s=0.3, worker_id="A")
    b = SlotLeases(K, "g", 1, lease_s=0.3, worker_id="B", takeover_grace_s=0)
    assert (await a.tick(r))[0] == {0}
    assert (await b.tick(r))[0] == set()  # held by A
    await asyncio.sleep(0.45)  # A is "paused" past its lease
    gained, _ = await b.tick(r)
    assert gained == {0} and b.owned[0].endswith(":2")
    # the new owner copies its token next to the commits before it reads them
    # (docs/adr/0004-group-state-by-partition.md); from then on the zombie's commit is refused
    commit, copy = r.register_script(COMMIT_PART), r.register_script(SET_COMMIT_FENCE)
    ck = [K.commits("g", 0), K.commit_fence("g", 0)]
    assert await copy(keys=[K.commit_fence("g", 0)], args=[0, b.owned[0], 2]) == 1
    assert await copy(keys=[K.commit_fence("g", 0)], args=[0, a.owned[0], 1]) == 0  # never backwards
    with pytest.raises(redis.exceptions.ResponseError, match="FENCED 0"):
        await commit(keys=ck, args=[1, "x|0", 10, 0, a.owned[0], 1])
    assert await commit(keys=ck, args=[1, "x|0", 10, 0, b.owned[0], 2]) == 1
    assert await r.hget(K.commits("g", 0), "x|0@") == b.owned[0].encode()
    # the new owner fences the changelog partition; the zombie's write is refused
    fence = r.register_script(SET_FENCE)
    assert await fence(keys=[K.fence("cl", 0)], args=[b.owned[0], 2]) == 1
    assert await fence(keys=[K.fence("cl", 0)], args=[a.owned[0], 1]) == 0  # never backwards
    produce_script = r.register_script(PRODUCE)
    skeys = [K.stream("cl", 0), K.counter("cl", 0), K.fence("cl", 0)]
    with pytest.raises(redis.exceptions.ResponseError, match="FENCED"):
        await produce_script(keys=skeys, args=[a.owned[0], 1, "1.0", 3, b"k", b"v", 0])
    assert await produce_script(keys=skeys, args=[b.owned[0], 1, "1.0", 3, b"k", b"v", 0]) == 0
    # A learns it lost the slot on its next heartbeat
    _, lost = await a.tick(r)
    assert lost == {0} and not a.owned
    # and a lease that expired with nobody taking it is simply re-taken by its owner
    c = SlotLeases(K, "h", 1, lease_s=0.2, worker_id="C")
    await c.tick(r)
    await asyncio.sleep(0.3)
    gained, lost = await c.tick(r)
    assert not lost and 0 in c.owned
    await r.aclose()


async def test_heartbeat_in_flight_at_shutdown_does_not_retake_the_lease(redis_url):
    """A tick racing release_all (the heartbeat wakes when the worker stops) must not
    renew: RENEW would re-create the released lease and the next worker waits it out."""
    r = redis.asyncio.Redis.from_url(redis_url)
    a = SlotLeases(K, "g", 2, lease_s=5, worker_id="A")
    await a.tick(r)
    assert set(a.owned) == {0, 1}
    await asyncio.gather(a.release_all(r), a.tick(r), a.tick(r))
    assert not a.owned and await a.tick(r) == (set(), set())
    assert not await r.exists(K.lease("g", 0), K.lease("g", 1))
    assert not await r.hexists(K.members("g"), "A")
    await r.aclose()


def test_kill_9_partitions_taken_over(redis_url, redis_sync, tmp_path):
    url = redis_url + "?slots=2&lease=2&compact=0&grace=1"
    produce(redis_url, "numbers", numbers(0, 3000))
    watcher = OffsetWatcher(redis_url)
    watcher.start()
    a = Worker(url + "&slot=0", tmp_path, "a", SLOW=0.002).start()
    b = Worker(url + "&slot=1", tmp_path, "b", SLOW=0.002).start()
    try:
        wait_until(lambda: redis_sync.llen("seen") >= 600, 60, what="both working")
        owners = {p: redis_sync.get(K.lease("t", p)) for p in (0, 1)}
        assert owners[0] and owners[1] and owners[0] != owners[1]
        a.kill()
        killed_at = time.monotonic()
        produce(redis_url, "numbers", numbers(3000, 4000))
        # b takes slot 0 within the lease time plus a few seconds
        wait_until(lambda: (redis_sync.get(K.lease("t", 0)) or b"").split(b":")[0] == owners[1].split(b":")[0],
                   2 + 5, what="takeover of slot 0")
        takeover = time.monotonic() - killed_at
        wait_until(lambda: len({v for _p, _o, v in seen(redis_sync)}) >= 4000, 90, what="all 4000 processed")
    finally:
        a.kill()
        b.stop()
        watcher.stop_flag = True
        watcher.join()
    values = {v for _p, _o, v in seen(redis_sync)}
    assert values == set(range(4000))  # every produced event processed at least once
    assert not watcher.backwards, watcher.backwards
    assert takeover < 7


def test_sigstop_zombie_cannot_commit_or_write_changelog(redis_url, redis_sync, tmp_path):
    url = redis_url + "?slots=2&lease=1.5&compact=0&grace=1"
    produce(redis_url, "numbers", numbers(0, 400))
    a = Worker(url + "&slot=0", tmp_path, "a", SLOW=0.01).start()
    b = Worker(url + "&slot=1", tmp_path, "b").start()
    try:
        wait_until(lambda: redis_sync.get(K.lease("t", 0)) and redis_sync.get(K.lease("t", 1)), 30, what="leases")
        wait_until(lambda: redis_sync.llen("seen") >= 100, 60, what="progress")
        token_a = redis_sync.get(K.lease("t", 0)).decode()
        a.signal(signal.SIGSTOP)
        wait_until(lambda: (redis_sync.get(K.lease("t", 0)) or b"").decode() not in ("", token_a), 15,
                   what="b takes slot 0")
        token_b = redis_sync.get(K.lease("t", 0)).decode()
        produce(redis_url, "numbers", numbers(400, 800))
        a.signal(signal.SIGCONT)
        wait_until(lambda: len({v for _p, _o, v in seen(redis_sync)}) >= 800, 60, what="all processed")
        time.sleep(2.0)  # give the zombie time to try its commits
        # every changelog write and commit on slot-0 partitions after the takeover is b's
        for p in (0, 2):
            entries = redis_sync.xrange(K.stream("t-counts-changelog", p))
            owners = [f.get(b"o", b"").decode() for _id, f in entries]
            if token_b in owners:
                after = owners[owners.index(token_b):]
                assert set(after) == {token_b}, after
            by = read_all_sync(redis_sync, K, "t").get(f"numbers|{p}@".encode())
            assert by is None or by.decode() != token_a or True  # a may have committed before the pause
        assert redis_sync.hget(K.group_fence("t"), "0").decode() == token_b
        log = a.log()
        assert "fenced" in log or "lost the lease" in log, log[-3000:]
    finally:
        a.signal(signal.SIGCONT)
        a.kill()
        b.stop()
    # the zombie wrote nothing after b's token appeared: check audit of commits
    for p in (0, 2):
        by = read_all_sync(redis_sync, K, "t").get(f"numbers|{p}@".encode())
        assert by is not None and by.decode() == token_b


def test_broker_restart_mid_run_loses_nothing(fresh_server, tmp_path):
    r = redis.Redis.from_url(fresh_server.url)
    produce(fresh_server.url, "numbers", numbers(0, 1000))
    w = Worker(fresh_server.url + "?lease=5&compact=0", tmp_path, "w").start()
    try:
        wait_until(lambda: r.llen("seen") >= 1000, 60, what="first 1000")
        fresh_server.stop()  # SIGTERM: AOF is flushed
        time.sleep(1.0)
        fresh_server.start()
        r = redis.Redis.from_url(fresh_server.url)
        assert r.llen("seen") >= 1000  # AOF kept the data
        produce(fresh_server.url, "numbers", numbers(1000, 2000))
        wait_until(lambda: len({int(x.split(b":")[2]) for x in r.lrange("seen", 0, -1)}) >= 2000, 60,
                   what="all 2000 after restart")
    finally:
        code = w.stop()
    assert {int(x.split(b":")[2]) for x in r.lrange("seen", 0, -1)} == set(range(2000))
    assert code == 0, w.log()[-3000:]
