"""A lane's in-memory intake: deliveries planned on this worker for a lane that runs
here, handed to it without a round trip through the lane's topic
(docs/adr/0002-cost-of-one-notification.md, "Hand-off to a local lane"; on by
default, ``NOTIFY_HANDOFF=0`` turns it off).

What the topic's entry gave, and what stands for it here:

* **Durability before the call**: the event being handled when the delivery was
  planned (expand's or the guard's, the *source*) is held (pipeline/transport/
  holds.py): no commit passes it until the delivery is done. A crash replays the
  source; it is planned again (its dedup entry's replay token) and the lane's
  inflight marks reconcile or skip, as for a topic entry read again.
* **Never waiting in memory**: ``Lanes.offer`` (agents/lanes.py) hands a delivery
  over only while the lane has a free slot for it (of its window, none taken by
  a call or by a delivery waiting for one); otherwise, and for a copy of a
  delivery the lane has already, the delivery goes through the topic as before.
  So a handed delivery starts at once and its source is held for the call's
  time only: queued behind a busy lane (a provider's rate limit, a backlog), it
  held its event, and every later event of that partition, uncommitted for as
  long, and the backpressure read that as a backlog 60 s old and deferred the
  campaign (bench/real.py: half the throughput). A marketing backlog never holds
  the loop that plans transactional or OTP events.
* **The partition moving**: a handed delivery whose "calling" mark is refused
  (this worker lost the lane's partition) is written to the lane's topic for its
  new owner; a lane that stops writes what it had queued to the topic too.

Pure bookkeeping: the lane (agents/lanes.py) takes from it and starts the calls.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Callable, Optional

__all__ = ["Handed", "Handoff"]


class Handed:
    """Where a delivery came from: the source event's partition and offset (held
    from the hand-off until the delivery is done) and the delivery's partition of
    the lane's topic (where its marks go). ``event``: the lane topic's entry, for a
    delivery read from the topic (None: handed in memory)."""

    __slots__ = ("tp", "offset", "partition", "event", "held")

    def __init__(self, tp: Any, offset: int, partition: int, event: Any = None, held: bool = False) -> None:
        self.tp, self.offset, self.partition, self.event, self.held = tp, offset, partition, event, held


class Handoff:
    """The queue of one lane: at most as many deliveries as the lane has free slots
    (``free()``: its window less the calls running and the deliveries waiting for a
    slot)."""

    def __init__(self, topic: str, free: Callable[[], int], busy: Any) -> None:
        self.topic = topic
        self.free = free
        #: delivery ids the lane has in flight or started (a copy goes through the topic)
        self.busy = busy
        self.queue: deque = deque()
        self.ready = asyncio.Event()
        self.open = True

    def has_room(self, delivery_id: str) -> bool:
        return self.open and len(self.queue) < self.free() and delivery_id not in self.busy

    def put(self, d: Any, src: Handed) -> None:
        self.queue.append((src, d))
        self.ready.set()

    async def take(self, most: int) -> list:
        """What is queued (at most ``most``), waiting until something is."""
        while not self.queue:
            self.ready.clear()
            await self.ready.wait()
        n = min(most, len(self.queue))
        return [self.queue.popleft() for _ in range(n)]

    def close(self) -> list:
        """Stop taking; what was queued and not taken (for the topic)."""
        self.open = False
        left = list(self.queue)
        self.queue.clear()
        return left


def source_of(event: Optional[Any]) -> Optional[tuple[Any, int]]:
    """The (partition, offset) to hold for a delivery planned while handling ``event``."""
    if event is None:
        return None
    msg = getattr(event, "message", None)
    tp, offset = getattr(msg, "tp", None), getattr(msg, "offset", None)
    return None if tp is None or offset is None else (tp, offset)
