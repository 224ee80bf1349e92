"""Fair turns on the event loop for agents that work through deep queues.

A Faust agent whose stream has thousands of buffered events never suspends
between them: ``await`` on a ready queue, a send and a table update all return
without giving the loop a turn. A guard working through a marketing backlog
then holds the loop for as long as its buffer lasts, and every other task (an
OTP's fetch, its guard, its lane, the producer's next write) waits.

An agent calls ``await turn()`` once per event; it gives the loop a turn
(``asyncio.sleep(0)``) when it has held it for :data:`SLICE_S` since its last
turn. The cost at idle is a clock read per event. Agents of priority topics
(pipeline/topics.py PRIORITY) never give up their turn: they are the ones the
others make room for, and a turn given after a long idle wait would only delay
an OTP by one pass of the loop.
"""

import asyncio
from time import perf_counter
from typing import Awaitable, Callable

from .topics import PRIORITY
from .transport.priority import priority_task

__all__ = ["SLICE_S", "turns", "turns_for"]

#: most time an agent holds the event loop before it gives others a turn (the
#: default of ``NOTIFY_SLICE_MS``)
SLICE_S = 0.002


def turns(slice_s: float = SLICE_S) -> Callable[[], Awaitable[None]]:
    """A per-agent ``turn()``: awaiting it yields once ``slice_s`` has passed."""
    last = perf_counter()
    sleep = asyncio.sleep

    async def turn() -> None:
        nonlocal last
        now = perf_counter()
        if now - last >= slice_s:
            await sleep(0)
            last = perf_counter()

    return turn


async def _keep() -> None:
    return None


def turns_for(stream) -> Callable[[], Awaitable[None]]:
    """``turns()`` for an agent's stream. For a priority topic's agent: a no-op, and
    the agent's task is marked as priority work, so what it sends directly goes
    through the producer's priority queue (pipeline/transport/priority.py)."""
    if stream.channel.get_topic_name() in PRIORITY:
        priority_task()
        return _keep
    settings = getattr(stream.app, "settings", None)  # NOTIFY_SLICE_MS (settings.env)
    return turns(settings.env.slice_ms / 1000 if settings is not None else SLICE_S)
