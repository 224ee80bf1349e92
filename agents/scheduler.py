"""scheduler: durable timers for deferred intents (quiet hours, send_at) and
retried deliveries, receipt polls and receipts waiting for their record.

Timers arrive on notify.timers (keyed by user_id) and are kept in the changelog-
backed ``timers`` table, so they survive restarts and move with the partition.
The agent only holds them: it writes the table and pushes ``(due, timer id, user,
partition)`` on this worker's heap.

Firing (:func:`fire_due`, run by :func:`run_scheduler` in a loop of its own) takes
at most :data:`FIRE_BATCH` due timers a pass, earliest first, of the partitions
this worker owns (a standby copy of another worker's partition is left to its
owner), and for each:

* ``intent`` / ``delivery``: its payload goes back into its stream
  (``notify.intents.<priority>`` / ``notify.send.<channel>.<priority>``). The pass
  waits once for the writes of all its payloads, then removes the timers (a
  tombstone each on the table's changelog): a removal is never durable before
  the payload it stands for. A crash in between fires the timer again after
  the restart, which the guard (dedup) and the lanes (inflight marks) absorb;
* ``poll`` / ``receipt`` (a provider query, a record lookup): handed to
  :data:`ASYNC_WORKERS` tasks, so a slow provider never holds the pass nor the
  agent; each timer is removed once its work is done.

Then the loop sleeps until the next due time (at most :data:`IDLE_S`), or goes
on at once when the pass was full: no pass waits for a whole backlog, and what
comes due meanwhile is taken in due order. The firing delay of every timer
(due → payload written) is exported as ``notify_scheduler_fire_delay_seconds``;
a pass over 1 s is logged. bench/scheduler.py measures it under 100,000 timers.

Before issue 24 (item 10), every due timer made a round trip through
notify.timers (a ``fire`` message read back by the agent, which removed the
timer and sent the payload) and one pass sent every due timer's ``fire``: a
pass of the demo took 16.7 s, and 100,000 timers due over 60 s fired at p99
5.0 s. A ``fire`` message written by such a worker is still understood.
"""

import asyncio
import heapq
import logging
import os
import time
from collections import deque
from typing import Optional

from faust.serializers import codecs as faust_codecs
from prometheus_client import Counter, Histogram

from pipeline import clock, metrics, roles
from pipeline.app import app, dlq_topic, intents_topics, lane_topics, timers_topic
from pipeline.codecs import dumps
from pipeline.entries import contained
from pipeline.models import Delivery, Receipt, State, Timer
from pipeline.transport import ProducerFenced
from tables import timers

from . import emit

log = logging.getLogger(__name__)

#: due timers fired in one pass at most; the loop goes on at once while more are due
FIRE_BATCH = int(os.environ.get("NOTIFY_SCHEDULER_BATCH", "1000"))
#: longest sleep between two passes when nothing is due sooner
IDLE_S = 0.05
#: tasks running the timers whose work is a lookup or a provider query (poll, receipt)
ASYNC_WORKERS = 16
#: a pass longer than this is logged
SLOW_PASS_S = 1.0

_TOPIC = timers_topic.get_topic_name()
_heap: list[tuple[float, str, str, int]] = []  # (due_at, timer_id, user_id, partition)
_rebuild = True
_waiting: deque = deque()  # (timer_id, partition) of due poll/receipt timers, for the workers
_busy: set[str] = set()  # timer ids queued for or run by the workers
_held_meanwhile: Optional[list] = None  # heap entries held while the heap is rebuilt

fired_total = Counter("notify_scheduler_fired_total", "Timers fired", ["kind"])
fire_delay = Histogram(
    "notify_scheduler_fire_delay_seconds", "From a timer's due time to its payload written (or its work done)",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


@app.agent(timers_topic, name="scheduler")
async def scheduler(stream):
    async for event in stream.events():
        async with contained(dlq_topic, event, "scheduler"):
            await on_timer(event.value, event.message.partition)


async def on_timer(t: Timer, partition: Optional[int] = None) -> None:
    """A timer to hold, or the ``fire`` of one held (written by a worker of before)."""
    if t.kind == "fire":
        held = timers.pop(t.timer_id, None)
        if held is not None:
            await _fire_now(held)
        return
    timers[t.timer_id] = t
    user = t.payload.get("user_id", "")
    if partition is None:
        partition = _partition(user)
    entry = (t.due_at, t.timer_id, user, partition)
    heapq.heappush(_heap, entry)
    if _held_meanwhile is not None:
        _held_meanwhile.append(entry)


async def _fire_now(held: Timer) -> None:
    """A timer's work, done at once (the ``fire`` path of before)."""
    if held.kind in ("intent", "delivery"):
        topic, key, value = _destination(held)
        await app.producer.send_record(topic, key, value)
    elif held.kind == "poll":
        await poll_receipt(held.payload)
    elif held.kind == "receipt":
        from .receipts import match

        await match(Receipt(**held.payload["receipt"]), held.payload["tries"])


_INTENTS = {p: t.get_topic_name() for p, t in intents_topics.items()}
_LANES = {k: t.get_topic_name() for k, t in lane_topics.items()}


def _destination(held: Timer) -> tuple[str, bytes, bytes]:
    """(topic, key, value) of a fired intent or delivery: its payload as it was held
    (parse_timer made it exactly the record's fields, so these are the bytes the
    record's ``dumps`` writes, without building it)."""
    p = held.payload
    if held.kind == "intent":
        topic = _INTENTS[p["priority"]]
    else:
        topic = _LANES[(p["channel"], p["priority"])]
    return topic, p["user_id"].encode(), dumps(p)


def _partition(user: str) -> int:
    return app.transport.partition_for(_TOPIC, user.encode())


@app.on_rebalance_complete.connect
async def _on_rebalance(sender, **kwargs) -> None:
    global _rebuild
    _rebuild = True


@timers.on_recover
async def _on_recover() -> None:
    # a partition's timers are all in the table only once its changelog is read
    global _rebuild
    _rebuild = True


async def _rebuild_heap() -> None:
    """The heap again from the table (after a rebalance or a recovery), giving the
    loop a turn every 10,000 timers."""
    global _rebuild, _heap, _held_meanwhile
    _rebuild = False
    heap: list = []
    _held_meanwhile = []
    try:
        for n, (tid, t) in enumerate(list(timers.data.items())):
            if n % 10_000 == 9_999:
                await asyncio.sleep(0)
            if tid in _busy:
                continue
            user = t.payload.get("user_id", "")
            heap.append((t.due_at, tid, user, _partition(user)))
        heap += _held_meanwhile  # held while this ran: not in the table's snapshot
    finally:
        _held_meanwhile = None
    heapq.heapify(heap)
    _heap = heap


async def fire_due(now: Optional[float] = None, limit: int = FIRE_BATCH) -> int:
    """One pass: fire up to ``limit`` due timers of the partitions this worker owns,
    earliest first. Returns how many were due (fired, or found gone)."""
    global _rebuild
    if _rebuild and app.tables.recovery.completed.is_set() and not app.in_recovery:
        await _rebuild_heap()
    metrics.scheduled.set(len(_heap))
    now = clock.now() if now is None else now
    owns = app.consumer.owns
    send = app.producer.send
    data = timers.data
    sends: list = []  # (timer_id, partition, due_at, kind, write future)
    sending: set[str] = set()  # the timers of this pass (a timer may be on the heap twice)
    taken = 0
    t0 = time.monotonic()
    while _heap and _heap[0][0] <= now and taken < limit:
        due, tid, user, partition = heapq.heappop(_heap)
        taken += 1
        if not owns(_TOPIC, partition):
            continue  # a standby copy, or a partition revoked: its owner fires it
        held = data.get(tid)
        if held is None or held.due_at > now or tid in _busy or tid in sending:
            continue  # fired already, held again for later (its newer entry is on the heap), or running
        if held.kind in ("intent", "delivery"):
            sending.add(tid)
            topic, key, value = _destination(held)
            sends.append((tid, partition, held.due_at, held.kind, await send(topic, key, value, None, None, None)))
        elif held.kind in ("poll", "receipt"):
            _busy.add(tid)
            _waiting.append((tid, partition))
            _start_workers()
        else:  # not a kind a holder writes (parse_timer refuses it): nothing to do
            await _remove([(partition, tid)])
    if sends:
        # the payloads written, then their timers removed: never the other way round
        results = await asyncio.gather(*(s[4] for s in sends), return_exceptions=True)
        written = clock.now()
        done = []
        counts: dict[str, int] = {}
        for (tid, partition, due, kind, _f), res in zip(sends, results):
            if isinstance(res, BaseException):
                # not written (the broker refused for good): left in the table, fired
                # again after the next rebuild rather than lost
                log.warning("scheduler: timer %s not fired: %r", tid, res)
                _rebuild = True
                continue
            counts[kind] = counts.get(kind, 0) + 1
            fire_delay.observe(max(0.0, written - due))
            held = data.get(tid)
            if held is not None and held.due_at == due:
                done.append((partition, tid))
        for kind, n in counts.items():
            fired_total.labels(kind).inc(n)
        await _remove(done)
    took = time.monotonic() - t0
    if took > SLOW_PASS_S:
        log.warning("scheduler pass: %d fired in %.1f s", len(sends), took)
    return taken


async def _remove(items: list[tuple[int, str]]) -> None:
    """Remove fired timers from the table, a tombstone each on its partition of the
    changelog (not awaited: a removal lost in a crash fires the timer again)."""
    if not items:
        return
    data = timers.data
    topic = timers.changelog_topic.get_topic_name()
    ser = timers.key_serializer
    send = app.producer.send
    futs = []
    for partition, tid in items:
        data.pop(tid, None)
        futs.append(await send(topic, faust_codecs.dumps(ser, tid), None, partition, None, None))
    asyncio.ensure_future(_removed(futs))


async def _removed(futs: list) -> None:
    for res in await asyncio.gather(*futs, return_exceptions=True):
        if isinstance(res, ProducerFenced):
            continue  # the partition moved: its new owner fires the timer again (at least once)
        if isinstance(res, BaseException):
            log.warning("scheduler: a fired timer's removal was not written: %r", res)


_workers: list[asyncio.Task] = []


def _start_workers() -> None:
    _workers[:] = [w for w in _workers if not w.done()]
    for _ in range(min(ASYNC_WORKERS - len(_workers), len(_waiting))):
        _workers.append(asyncio.ensure_future(_async_worker()))


async def _async_worker() -> None:
    """Runs due poll / receipt timers, one at a time, until none is waiting."""
    data = timers.data
    while _waiting:
        tid, partition = _waiting.popleft()
        try:
            held = data.get(tid)
            if held is None or not app.consumer.owns(_TOPIC, partition):
                continue
            try:
                await _fire_now(held)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one timer's failure must not stop the others
                log.exception("scheduler: timer %s (%s) failed; it is dropped", tid, held.kind)
            fired_total.labels(held.kind).inc()
            fire_delay.observe(max(0.0, clock.now() - held.due_at))
            if data.get(tid) is held:
                await _remove([(partition, tid)])
        finally:
            _busy.discard(tid)


async def run_scheduler() -> None:
    """Fire due timers for as long as the worker runs: a full pass goes on at once,
    else the loop sleeps until the next due time (at most :data:`IDLE_S`)."""
    global _rebuild
    while True:
        try:
            n = await fire_due()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the loop must outlive a bad pass
            _rebuild = True  # what the pass took off the heap is still in the table
            log.exception("scheduler pass failed; trying again")
            await asyncio.sleep(IDLE_S)
            continue
        if n >= FIRE_BATCH:
            await asyncio.sleep(0)  # the other agents get a turn between full passes
            continue
        wait = IDLE_S
        if _heap:
            wait = min(IDLE_S, max(0.001, _heap[0][0] - clock.now()))
        await asyncio.sleep(wait)


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


if roles.runs(_TOPIC):  # where the timers agent runs (pipeline/roles.py)
    app.task(run_scheduler)
