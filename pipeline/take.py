"""Batches of what a stream has ready, without waiting for more.

Faust's ``Stream.take_events(max_, within)`` yields when ``max_`` events are
buffered or ``within`` seconds have passed since the last batch. So an OTP
arriving on an idle lane waits up to ``within`` for company that never comes,
and an idle lane wakes every ``within`` (each wake a ``wait_first``, a few
tasks made and cancelled) to find nothing. ``within=0`` is no way out: Faust
then waits for a full batch.

:func:`take_ready` yields as soon as one event is buffered, with every event
the stream has received by then (at most ``max_``): at idle a lane takes each
delivery the moment it arrives, under a backlog its batches are full, since the
stream's queue holds more than a batch (tests/transport/test_take.py). Events are acknowledged after the batch is
handled (the code after the ``yield`` has run), as with ``take_events``; events
buffered meanwhile wait for the next batch, in order.
"""

import asyncio
from typing import Any, AsyncIterator

__all__ = ["take_ready"]


async def take_ready(stream: Any, max_: int, ack: bool = True) -> AsyncIterator[list]:
    """Batches of the events ``stream`` has ready (at most ``max_``). With ``ack``
    False the caller acknowledges each event itself (``await stream.ack(event)``),
    whenever it is done with it: a lane whose calls finish out of order."""
    if max_ < 1:
        raise ValueError(f"batch size must be >= 1, got {max_}")
    buffered: list = []
    ready = asyncio.Event()  # something is buffered
    room = asyncio.Event()  # the buffer has room
    room.set()

    async def add(value: Any) -> Any:
        # a processor: runs in the stream's passive consumer for every value
        while len(buffered) >= max_:
            room.clear()
            await room.wait()
        event = stream.current_event
        if event is None:
            raise RuntimeError("take_ready: no current event")
        buffered.append(event)
        ready.set()
        return value

    stream.enable_acks = False  # acknowledged below, once handled
    stream.add_processor(add)
    stream._enable_passive(aiter(stream.channel))
    queue = stream.channel.queue  # what the stream received and has not passed on yet
    while not stream.should_stop:
        await ready.wait()
        # what the stream's queue holds is ready too: the passive consumer moves it
        # into the buffer one event per loop turn, so give it the turns (at most a
        # batch's worth) instead of taking the first few of a backlog
        for _ in range(max_):
            if len(buffered) >= max_ or not queue.qsize():
                break
            await asyncio.sleep(0)
        batch = buffered[:max_]
        del buffered[: len(batch)]
        if not buffered:
            ready.clear()
        room.set()
        if not ack:
            yield batch
            continue
        try:
            yield batch
        finally:
            for event in batch:
                await stream.ack(event)
