"""The lane's in-memory intake (agents/handoff.py): a delivery is handed over only
while the lane has a free slot for it, so it starts at once and its source event
is held for the call's time only (queued behind a busy lane it held its event,
and every later one of its partition, uncommitted: bench/real.py ran at half the
throughput, the backpressure taking that for a backlog)."""

import asyncio

from agents.handoff import Handed, Handoff


def test_only_with_a_free_slot():
    busy: dict = {}
    free = [2]
    h = Handoff("notify.send.sms.normal", lambda: free[0], busy)
    assert h.has_room("d1")
    h.put("d1", Handed(None, 1, 0))
    assert h.has_room("d2")  # one free slot left for it
    h.put("d2", Handed(None, 2, 0))
    assert not h.has_room("d3")  # both free slots spoken for by what is queued
    free[0] = 0  # the lane's calls and the deliveries waiting for a slot fill its window
    assert asyncio.run(h.take(10)) and not h.has_room("d3")
    free[0] = 1
    assert h.has_room("d3")
    busy["d3"] = []  # a copy of a delivery the lane has: through the topic
    assert not h.has_room("d3")
    assert h.close() == [] and not h.has_room("d4")
