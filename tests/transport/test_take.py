"""pipeline/take.py ``take_ready``: batches of what a stream has ready, at most the
batch size, in order, every event acknowledged once its batch is handled."""

import collections

from pipeline.transport.committed import read_sync
from pipeline.transport.keys import Keys

from .helpers import Worker, produce, wait_until

N = 203  # a backlog of several full batches and a partial one per partition


def test_take_ready_batches_a_backlog_fully_and_a_lone_event_alone(redis_url, redis_sync, tmp_path):
    produce(redis_url, "batched", [(f"k{i % 7}".encode(), f"{i}".encode()) for i in range(N)], partitions=1)
    w = Worker(redis_url + "?lease=3&compact=0", tmp_path, PARTITIONS=1, TAKE_MAX=5).start()
    try:
        wait_until(lambda: sum(len(b.split(b",")) for b in redis_sync.lrange("batches", 0, -1)) >= N, 60,
                   what="the backlog handled")
        backlog = [b.split(b",") for b in redis_sync.lrange("batches", 0, -1)]
        # then one event on an idle stream: it is handed over alone, not held for company
        produce(redis_url, "batched", [(b"k", b"lone")], partitions=1)
        wait_until(lambda: redis_sync.llen("batches") > len(backlog), 30, what="the lone event handled")
        lone = redis_sync.lrange("batches", len(backlog), -1)
        # every event acknowledged: the committed offset reaches the end of the stream
        wait_until(lambda: (read_sync(redis_sync, Keys(), "t", [("batched", 0)])[0] or 0) == N + 1, 30,
                   what="every event committed")
    finally:
        assert w.stop() == 0, w.log()[-3000:]
    values = [int(v) for b in backlog for v in b]
    assert values == list(range(N))  # each once, in order
    sizes = collections.Counter(len(b) for b in backlog)
    assert max(sizes) == 5  # never more than the batch size
    # the backlog was ready: batches are full but for the odd partial one where a
    # fetch ends (a lingering take would be full too; one batch per event would not)
    assert sizes[5] >= 0.8 * (N // 5), sizes
    assert lone == [b"lone"]
