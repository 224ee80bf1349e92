"""The transport on a Redis Cluster of three masters on 127.0.0.1.

The cluster (tests/transport/cluster.py) is built without redis-cli.  The
worker's own test data ("seen", dumps) goes to the plain session server
(``DATA_URL``), the broker is the cluster.
"""

import collections
import time

import faust
import orjson
import pytest
from faust.types import TP
from redis.cluster import RedisCluster

from pipeline.transport.committed import read_all_sync
from pipeline.transport.groups import entry_changes
from pipeline.transport.keys import Keys

from .cluster import Cluster
from .helpers import Worker, numbers, produce, produce_async, seen, wait_until

pytestmark = pytest.mark.cluster

K = Keys()
P = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture
def cluster_url(cluster):
    cluster.flush()
    return cluster.url


@pytest.fixture
def rc(cluster_url):
    c = RedisCluster.from_url(cluster_url)
    yield c
    c.close()


async def test_produce_dense_offsets_across_nodes(cluster_url, rc):
    items = numbers(0, 3000)
    meta = await produce_async(cluster_url, "numbers", items, partitions=P, headers=[("trace", b"abc")])
    per_partition = collections.defaultdict(list)
    for md in meta:
        per_partition[md.partition].append(md.offset)
    assert sorted(per_partition) == list(range(P))
    for p, offsets in per_partition.items():
        assert offsets == list(range(len(offsets)))  # dense, in send order
        ids = [eid for eid, _ in rc.xrange(K.stream("numbers", p))]
        assert ids == [f"{o}-1".encode() for o in offsets]
        assert int(rc.get(K.counter("numbers", p))) == len(offsets)
    nodes = {rc.get_node_from_key(K.stream("numbers", p)).port for p in range(P)}
    assert len(nodes) == 3, nodes  # the partitions really live on every node

    # the consumer's offset queries work across slots too
    app = faust.App("cl-offsets", broker=cluster_url, topic_partitions=P, web_enabled=False)
    try:
        tps = [TP("numbers", p) for p in range(P)]
        consumer = app.consumer
        assert await consumer.highwaters(*tps) == {tp: len(per_partition[tp.partition]) for tp in tps}
        assert await consumer.earliest_offsets(*tps) == {tp: 0 for tp in tps}
        rc.xdel(K.stream("numbers", 2), b"0-1", b"1-1")
        assert (await consumer.earliest_offsets(TP("numbers", 2)))[TP("numbers", 2)] == 2
    finally:
        await app.transport.close()


def test_worker_consumes_every_partition_in_order(cluster_url, rc, redis_url, redis_sync, tmp_path):
    produce(cluster_url, "numbers", numbers(0, 2000), partitions=P)
    w = Worker(cluster_url + "?lease=3&compact=0", tmp_path, PARTITIONS=P, DATA_URL=redis_url).start()
    try:
        wait_until(lambda: redis_sync.llen("seen") >= 2000, 40, what="2000 processed")
        # idle worker, then one message at a time on each partition (so on every
        # node): each wakes the consumer at once, not at the next poll
        late = []
        for p in range(P):
            time.sleep(0.15)
            n = redis_sync.llen("seen") + 1
            produce(cluster_url, "numbers", [(b"late", str(p).encode())], partitions=P, partition=p)
            t0 = time.monotonic()
            wait_until(lambda: redis_sync.llen("seen") >= n, 10, 0.001, what=f"late message on {p}")
            late.append(time.monotonic() - t0)
    finally:
        assert w.stop() == 0, w.log()[-3000:]
    assert "read failed" not in w.log() and "Traceback" not in w.log(), w.log()[-3000:]
    by_partition = collections.defaultdict(list)
    for p, off, _v in seen(redis_sync):
        by_partition[p].append(off)
    assert sorted(by_partition) == list(range(P))
    assert sum(len(v) for v in by_partition.values()) == 2000 + P
    for offs in by_partition.values():
        assert offs == list(range(len(offs)))
    committed = {
        int(f.decode().split("|")[1]): int(v)
        for f, v in read_all_sync(rc, K, "t").items()
        if f.startswith(b"numbers|") and not f.endswith(b"@")
    }
    assert committed == {p: len(offs) for p, offs in by_partition.items()}  # graceful stop commits all
    # the commits are spread over the masters by partition index, not all on the group's
    # (docs/adr/0004-group-state-by-partition.md), and the one-hash layout is not written
    assert all(rc.exists(K.commits("t", p)) for p in range(P)) and not rc.exists(K.offsets("t"))
    assert len({rc.get_node_from_key(K.commits("t", p)).port for p in range(P)}) == 3
    assert sorted(late)[P // 2] < 0.05, late  # polling would add ~100 ms (BLOCK resolution)


def _dump(data, url, round_no):
    """Each partition dumps its own keys after everything before the marker."""
    for p in range(P):
        produce(url, "ops", [(b"x", orjson.dumps({"op": "dump", "round": round_no}))], partitions=P, partition=p)
    want = {f"{round_no}:{p}".encode() for p in range(P)}
    wait_until(lambda: want <= set(data.lrange("dumped", 0, -1)), 40, what=f"dump {round_no}")
    state = {}
    for p in range(P):
        state.update({k.decode(): int(v) for k, v in data.hgetall(f"dump:{p}").items()})
    return state


def test_table_recovered_after_restart_on_cluster(cluster_url, rc, redis_url, redis_sync, tmp_path):
    url = cluster_url + "?lease=2&compact=0"
    model: dict[str, int] = {}

    def apply(start, stop):
        ops = []
        for i in range(start, stop):
            k = f"k{i % 23}"
            if i % 7 == 3:
                ops.append((k, {"op": "del"}))
                model.pop(k, None)
            else:
                ops.append((k, {"op": "set", "v": i}))
                model[k] = i
        produce(cluster_url, "ops", [(k.encode(), orjson.dumps(op)) for k, op in ops], partitions=P)

    apply(0, 300)
    w = Worker(url, tmp_path, "w1", PARTITIONS=P, DATA_URL=redis_url).start()
    try:
        assert _dump(redis_sync, cluster_url, 0) == model
    finally:
        assert w.stop() == 0, w.log()[-3000:]
    # changes per partition (a commit's changes of a partition are one group entry)
    changelog = [sum(len(entry_changes(f)) for _i, f in rc.xrange(K.stream("t-kv-changelog", p))) for p in range(P)]
    assert sum(changelog) >= len(model) and sum(1 for n in changelog if n) >= 3
    # restart: a fresh worker (memory store) rebuilds the table from the changelogs
    w = Worker(url, tmp_path, "w2", PARTITIONS=P, DATA_URL=redis_url).start()
    try:
        assert _dump(redis_sync, cluster_url, 1) == model
        apply(300, 450)
        assert _dump(redis_sync, cluster_url, 2) == model
    finally:
        w.kill()
    # after a kill -9 the next worker waits for the lease, takes the slot with a
    # new generation (fencing the changelogs on every node) and recovers again
    w = Worker(url, tmp_path, "w3", PARTITIONS=P, DATA_URL=redis_url).start()
    try:
        assert _dump(redis_sync, cluster_url, 3) == model
    finally:
        assert w.stop() == 0, w.log()[-3000:]
    assert {rc.get(K.fence("t-kv-changelog", p)) for p in range(P)} == {rc.hget(K.group_fence("t"), "0")}
