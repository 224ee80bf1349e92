"""Priority topics (pipeline/transport/priority.py): a deep, slow stream does not
hold up a priority topic's messages, which the worker reads and delivers apart.

The backlog agent takes 20 ms a message behind a 4-message buffer, so the
worker's fetch loop is blocked delivering into that full buffer almost all the
time. The urgent messages are written after the backlog. They must all be
handled while most of the backlog still waits: with one fetch loop for both
topics they are not (the control run, PRIORITY=0, checks that the scenario does
block)."""

import pytest

from .helpers import Worker, produce, wait_until

BACKLOG = 400
URGENT = 20


def run(redis_url, redis_sync, tmp_path, priority: bool) -> list[int]:
    produce(redis_url, "backlog", [(f"k{i}".encode(), f"b{i}".encode()) for i in range(BACKLOG)])
    produce(redis_url, "urgent", [])  # declared before the worker starts: it is assigned at once
    w = Worker(redis_url + "?lease=3&compact=0", tmp_path, name=f"p{int(priority)}",
               PRIORITY=int(priority), BUFFER=4, SLOW_BACKLOG=0.02).start()
    try:
        wait_until(lambda: redis_sync.llen("backlog") >= 10, 60, what="the backlog under way")
        produce(redis_url, "urgent", [(f"u{i}".encode(), f"u{i}".encode()) for i in range(URGENT)])
        wait_until(lambda: redis_sync.llen("urgent") >= URGENT, 60, what="the urgent messages handled")
    finally:
        assert w.stop() == 0, w.log()[-3000:]
    return [int(x.split(b":")[1]) for x in redis_sync.lrange("urgent", 0, -1)]


def test_priority_topic_is_not_held_up_by_a_full_backlog_buffer(redis_url, redis_sync, tmp_path):
    done_before = run(redis_url, redis_sync, tmp_path, priority=True)
    # every urgent message was handled while at least half the backlog still waited
    assert max(done_before) < BACKLOG // 2, done_before


@pytest.mark.parametrize("priority", [False])
def test_control_one_fetch_loop_holds_urgent_behind_the_backlog(redis_url, redis_sync, tmp_path, priority):
    done_before = run(redis_url, redis_sync, tmp_path, priority=priority)
    assert max(done_before) >= BACKLOG // 2, done_before
