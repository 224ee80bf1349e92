"""Producer/consumer behaviour on a real server."""

import asyncio
import collections
import signal
import time

import faust
import pytest
from aiokafka.partitioner import DefaultPartitioner

from pipeline.transport import BrokerUnavailable, BrokerURLError, TopicPartitionsMismatch, Transport
from pipeline.transport.client import connect
from pipeline.transport.keys import Keys
from pipeline.transport.committed import read_all_sync

from .helpers import Worker, numbers, produce, produce_async, seen, wait_until

K = Keys()


def test_entry_point_resolves():
    from faust.transport import by_url

    assert by_url("redis://127.0.0.1:6379/0") is Transport
    assert by_url("rediss://127.0.0.1:6379/0") is Transport


@pytest.mark.parametrize(
    "url, needle",
    [
        ("memcache://127.0.0.1:1/0", "memcache://"),
        ("redis:///0", "no host"),
        ("redis://127.0.0.1:6379/abc", "'abc'"),
        ("redis://127.0.0.1:6379/0?slots=zero", "slots='zero'"),
        ("redis://127.0.0.1:6379/0?slots=2&slot=5", "slot < slots"),
    ],
)
def test_bad_urls_give_clear_errors(url, needle):
    with pytest.raises(BrokerURLError) as err:
        Transport([url], faust.App("bad", broker="memory://"))
    assert needle in str(err.value)


async def test_unreachable_broker_names_url_and_retries():
    with pytest.raises(BrokerUnavailable) as err:
        await connect(["redis://127.0.0.1:1/0"], attempts=2, base_delay=0.01)
    assert "redis://127.0.0.1:1/0" in str(err.value) and "2 attempts" in str(err.value)


async def test_produce_dense_offsets_same_partitioning_and_headers(redis_url, redis_sync):
    items = [(f"user-{i % 101}".encode(), f"v{i}".encode()) for i in range(3000)]
    meta = await produce_async(redis_url, "dense", items, partitions=4, headers=[("trace", b"abc")])
    per_partition = collections.defaultdict(list)
    partitioner = DefaultPartitioner()
    for (key, _v), md in zip(items, meta):
        per_partition[md.partition].append(md.offset)
        # same key → same partition as Faust's Kafka default
        assert md.partition == partitioner(key, [0, 1, 2, 3], [0, 1, 2, 3])
    for p, offsets in per_partition.items():
        assert offsets == list(range(len(offsets)))  # dense, in send order
        ids = [eid for eid, _ in redis_sync.xrange(K.stream("dense", p))]
        assert ids == [f"{o}-1".encode() for o in offsets]
        assert int(redis_sync.get(K.counter("dense", p))) == len(offsets)
    _eid, fields = redis_sync.xrange(K.stream("dense", 0), count=1)[0]
    assert fields[b"h:trace"] == b"abc"


async def test_null_key_and_tombstone_roundtrip(redis_url, redis_sync):
    await produce_async(redis_url, "tomb", [(None, b"x"), (b"k", None)], partitions=1)
    entries = redis_sync.xrange(K.stream("tomb", 0))
    assert b"k" not in entries[0][1] and entries[0][1][b"v"] == b"x"
    assert entries[1][1][b"k"] == b"k" and b"v" not in entries[1][1]


def test_produce_script_writes_every_entry_shape_with_the_same_fields(redis_sync):
    """PRODUCE writes the common entry (key and value, no headers) without a field
    table: its fields, in order, are those of the general path, fenced or not."""
    from pipeline.transport.scripts import PRODUCE

    produce = redis_sync.register_script(PRODUCE)
    skeys = [K.stream("shape", 0), K.counter("shape", 0), K.fence("shape", 0)]
    redis_sync.set(K.fence("shape", 0), "tok")
    entries = [  # ts, flags, key, value, headers
        ("1.5", 3, b"k", b"v", []), ("2.5", 3, b"k", b"v", [("trace", b"abc")]),
        ("3.5", 2, b"", b"v", []), ("4.5", 1, b"k", b"", []),
    ]
    for token in ("", "tok"):
        args: list = [token, len(entries)]
        for ts, flags, key, value, headers in entries:
            args += [ts, flags, key, value, len(headers)]
            for name, hv in headers:
                args += [name, hv]
        produce(keys=skeys, args=args)
    got = [list(fields.items()) for _id, fields in redis_sync.xrange(skeys[0])]
    o = [(b"o", b"tok")]
    expected = [
        [(b"t", b"1.5"), (b"k", b"k"), (b"v", b"v")],
        [(b"t", b"2.5"), (b"k", b"k"), (b"v", b"v"), (b"h:trace", b"abc")],
        [(b"t", b"3.5"), (b"v", b"v")],
        [(b"t", b"4.5"), (b"k", b"k")],
    ]
    assert got == expected + [[e[0]] + o + e[1:] for e in expected]
    assert [eid for eid, _ in redis_sync.xrange(skeys[0])] == [b"%d-1" % i for i in range(8)]
    with pytest.raises(Exception, match="FENCED"):
        produce(keys=skeys, args=["other", 1, "5.5", 3, b"k", b"v", 0])


async def test_declare_is_idempotent_and_mismatch_is_clear(redis_url):
    app = faust.App("decl", broker=redis_url, web_enabled=False)
    t = app.transport
    assert await t.declare("orders", 4) == 4
    assert await t.declare("orders", 4) == 4
    with pytest.raises(TopicPartitionsMismatch, match="'orders' exists with 4 partitions, declared with 8"):
        await t.declare("orders", 8)
    await t.close()


def _each_partition_once_in_order(redis_sync, n):
    """The worker handled ``n`` entries, each partition's from its first, in order, once."""
    by_partition = collections.defaultdict(list)
    for p, off, _v in seen(redis_sync):
        by_partition[p].append(off)
    assert sum(len(v) for v in by_partition.values()) == n
    for offs in by_partition.values():
        assert offs == list(range(len(offs)))


def test_worker_consumes_every_partition_in_order(redis_url, redis_sync, tmp_path):
    produce(redis_url, "numbers", numbers(0, 2000))
    w = Worker(redis_url + "?lease=3&compact=0", tmp_path).start()
    try:
        wait_until(lambda: redis_sync.llen("seen") >= 2000, 60, what="2000 processed")
    finally:
        assert w.stop() == 0, w.log()[-3000:]
    _each_partition_once_in_order(redis_sync, 2000)


def test_commit_stop_restart_resumes_after_last_commit(redis_url, redis_sync, tmp_path):
    produce(redis_url, "numbers", numbers(0, 1000))
    url = redis_url + "?lease=3&compact=0"
    w = Worker(url, tmp_path, "first").start()
    wait_until(lambda: redis_sync.llen("seen") >= 1000, 60, what="first 1000")
    assert w.stop() == 0
    committed = {
        int(f.decode().split("|")[1]): int(v)
        for f, v in read_all_sync(redis_sync, K, "t").items()
        if f.startswith(b"numbers|") and not f.endswith(b"@")
    }
    first_run = collections.Counter(p for p, _o, _v in seen(redis_sync))
    assert committed == dict(first_run)  # graceful stop commits everything processed
    redis_sync.delete("seen")
    produce(redis_url, "numbers", numbers(1000, 1500))
    w2 = Worker(url, tmp_path, "second").start()
    try:
        wait_until(lambda: redis_sync.llen("seen") >= 500, 60, what="500 more")
    finally:
        w2.stop()
    second = seen(redis_sync)
    assert len(second) == 500
    firsts = {}
    for p, off, _v in second:
        firsts.setdefault(p, off)
    assert firsts == {p: committed[p] for p in firsts}


def test_partition_memo_matches_the_partitioner_and_stays_bounded(monkeypatch):
    import pipeline.transport as transport_mod

    monkeypatch.setattr(transport_mod, "PARTITION_MEMO", 50)
    t = Transport(["redis://127.0.0.1:6379/0"], faust.App("memo", broker="memory://", topic_partitions=8))
    parts = list(range(8))
    for i in range(500):
        key = f"u{i % 120}".encode()
        assert t.partition_for("any", key) == DefaultPartitioner()(key, parts, parts)
    assert len(t._by_key[8]) <= 50
    assert t.partition_for("any", None) in parts  # no key: a pick, never remembered
    assert None not in t._by_key[8]

    picks = iter(range(10**6))
    custom = Transport(["redis://127.0.0.1:6379/0"], faust.App(
        "memo2", broker="memory://", topic_partitions=8,
        producer_partitioner=lambda key, all_, avail: next(picks) % len(all_)))
    assert [custom.partition_for("any", b"same") for _ in range(3)] == [0, 1, 2]  # asked every time



def test_what_a_running_worker_reads_while_its_recovery_ends_is_handled(redis_url, redis_sync, tmp_path):
    # b takes a's slot over after a kill -9, with a's partitions behind. At the end
    # of b's recovery Faust resumes the partitions, then seeks to the committed
    # offsets (slow here, as on a loaded broker), then resumes the flow again. The
    # fetcher runs meanwhile and fills a small stream buffer (the agent is slow).
    # That last resume cleared the stream buffers, and a delivery blocked on the
    # full buffer across the seek then set the read offset past what the clear had
    # dropped: the re-read skipped those entries as delivered, never handled nor
    # acked (the kill -9 drill lost OTPs so after a takeover).
    url = redis_url + "?slots=2&lease=1.5&compact=0&grace=1"
    produce(redis_url, "numbers", numbers(0, 2000))
    a = Worker(url + "&slot=0", tmp_path, "a", SLOW=0.02, PRIORITY="numbers").start()
    b = Worker(url + "&slot=1", tmp_path, "b", SLOW=0.004, BUFFER=4, SLOW_SEEK=0.3, PRIORITY="numbers").start()
    try:
        wait_until(lambda: redis_sync.get(K.lease("t", 0)) and redis_sync.get(K.lease("t", 1)), 30, what="leases")
        wait_until(lambda: redis_sync.llen("seen") >= 200, 60, what="progress")
        a.kill()
        wait_until(lambda: len({v for _p, _o, v in seen(redis_sync)}) >= 2000, 60, what="all 2000 handled")
    finally:
        a.kill()
        assert b.stop() == 0, b.log()[-3000:]


def test_an_entry_dropped_on_its_way_to_the_stream_is_read_again(redis_url, redis_sync, tmp_path):
    # whatever dropped it: the partition's commit would wait for it for good (and
    # a crash then replayed everything after it); after REREAD_S the consumer reads
    # the partitions again from their committed offsets and the entry is handled
    produce(redis_url, "numbers", numbers(0, 200), partition=0)
    w = Worker(redis_url + "?lease=3&compact=0", tmp_path, DROP="numbers:0:5", REREAD_S=1).start()
    try:
        wait_until(lambda: len({v for _p, _o, v in seen(redis_sync)}) >= 200, 30, what="all 200 handled")
        wait_until(lambda: int(read_all_sync(redis_sync, K, "t").get(b"numbers|0", 0)) == 200, 30,
                   what="the partition committed to its end")
    finally:
        assert w.stop() == 0, w.log()[-3000:]
    assert "never handled" in w.log()
    assert 5 in {v for _p, _o, v in seen(redis_sync)}


def test_reads_whose_connections_are_killed_go_on_from_where_they_were(redis_url, redis_sync, tmp_path):
    """A blocked read whose connection the server closes is read again, from the same
    position, on a new one; nothing is skipped or handled twice."""
    produce(redis_url, "numbers", numbers(0, 500))
    w = Worker(redis_url + "?lease=3&compact=0", tmp_path).start()
    try:
        wait_until(lambda: redis_sync.llen("seen") >= 500, 60, what="first 500")
        for start in (500, 700):
            wait_until(lambda: b"cmd=xread" in redis_sync.execute_command("CLIENT", "LIST", "TYPE", "normal"), 30,
                       what="a read blocked")
            redis_sync.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            produce(redis_url, "numbers", numbers(start, start + 200))
        wait_until(lambda: redis_sync.llen("seen") >= 900, 60, what="all 900")
        time.sleep(0.5)
    finally:
        assert w.stop() == 0, w.log()[-3000:]
    _each_partition_once_in_order(redis_sync, 900)
