"""scheduler: durable timers for deferred intents (quiet hours, send_at) and
retried deliveries.

Timers arrive on notify.timers (keyed by user_id) and are kept in the changelog-
backed ``timers`` table, so they survive restarts and move with the partition.
A per-worker loop keeps a heap of due times (rebuilt from the table after each
rebalance) and, when one is due, sends a ``fire`` message through the same topic:
the agent then removes the timer and re-emits its payload, so every table change
happens inside the agent, in partition order.
"""

import heapq
import time

from pipeline import clock, metrics, roles
from pipeline.app import app, dlq_topic, intents_topics, timers_topic
from pipeline.entries import contained
from pipeline.models import Delivery, Intent, Receipt, State, Timer
from tables import timers

from . import emit

_heap: list[tuple[float, str, str]] = []  # (due_at, timer_id, user_id)
_fired: set[str] = set()
_rebuild = True


@app.agent(timers_topic, name="scheduler")
async def scheduler(stream):
    async for event in stream.events():
        async with contained(dlq_topic, event, "scheduler"):
            await on_timer(event.value)


async def on_timer(t: Timer) -> None:
    """A timer to hold, or the ``fire`` of one held: its payload goes out again."""
    if t.kind == "fire":
        _fired.discard(t.timer_id)
        held = timers.pop(t.timer_id, None)
        if held is None:
            return  # already fired (a second fire after a rebalance)
        if held.kind == "intent":
            intent = Intent(**held.payload)
            await intents_topics[intent.priority].send(key=intent.user_id, value=intent)
        elif held.kind == "delivery":
            await emit.deliver(Delivery(**held.payload))
        elif held.kind == "poll":
            await poll_receipt(held.payload)
        elif held.kind == "receipt":
            from .receipts import match

            await match(Receipt(**held.payload["receipt"]), held.payload["tries"])
    else:
        timers[t.timer_id] = t
        heapq.heappush(_heap, (t.due_at, t.timer_id, t.payload.get("user_id", "")))


@app.on_rebalance_complete.connect
async def _on_rebalance(sender, **kwargs) -> None:
    global _rebuild
    _rebuild = True


async def fire_due() -> None:
    global _rebuild, _heap
    if _rebuild and app.tables.recovery.completed.is_set():
        _rebuild = False
        _heap = [(t.due_at, tid, t.payload.get("user_id", "")) for tid, t in timers.items()]
        heapq.heapify(_heap)
        _fired.clear()
    metrics.scheduled.set(len(_heap))
    now = clock.now()
    while _heap and _heap[0][0] <= now:
        _due, tid, user = heapq.heappop(_heap)
        if tid in _fired:
            continue
        _fired.add(tid)
        await timers_topic.send(key=user, value=Timer(timer_id=tid, due_at=now, kind="fire", payload={}))


async def poll_receipt(payload: dict) -> None:
    """A receipt that did not come: ask the provider (if its protocol can answer)."""
    from pipeline import runtime
    from pipeline.rules.plan import outcome

    d = Delivery(**payload["delivery"])
    store = await runtime.store()
    rows = await store.get(d.delivery_id)
    if rows and rows[0]["status"] in (State.DELIVERED, State.UNDELIVERED):
        return  # the receipt came meanwhile
    disp = await runtime.dispatcher()
    provider = disp.providers.get(payload["provider"])
    if provider is None:
        return
    q = await provider.query(d.delivery_id, rows[0]["provider_msg_id"] if rows else None)
    if q.status in (State.DELIVERED, State.UNDELIVERED):
        await emit.outcomes([outcome(d, d.channel, q.status, time.time(), reason="polled", provider=provider.name,
                                     provider_msg_id=q.provider_msg_id)])


if roles.runs(timers_topic.get_topic_name()):  # where the timers agent runs (pipeline/roles.py)
    app.timer(0.1)(fire_due)
