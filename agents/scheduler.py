"""scheduler: durable timers for deferred intents (quiet hours, send_at) and
retried deliveries, and receipts waiting for their record.

Timers arrive on notify.timers (keyed by user_id) and are kept in the changelog-
backed ``timers`` table (those of high-priority deliveries and intents on
notify.timers.high, in ``timers_high``, fired by the role that runs the high
path: pipeline/topics.py ``timers_for``), so they survive restarts and move with
the partition.
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
* ``poll`` / ``receipt`` (a provider query, a record lookup; ``poll`` timers are
  those of workers from before the receipt polls swept the store, agents/polls.py): handed to
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
import time
from collections import deque
from typing import Optional

from faust.serializers import codecs as faust_codecs
from prometheus_client import Counter, Histogram

from typing import Any

from pipeline import clock, metrics
from pipeline.codecs import dumps
from pipeline.entries import contained
from pipeline.models import Delivery, Receipt, State, Timer
from pipeline.transport import ProducerFenced

__all__ = ["Scheduler", "register"]

log = logging.getLogger(__name__)

#: longest sleep between two passes when nothing is due sooner
IDLE_S = 0.05
#: tasks running the timers whose work is a lookup or a provider query (poll, receipt)
ASYNC_WORKERS = 16
#: a pass longer than this is logged
SLOW_PASS_S = 1.0

fired_total = Counter("notify_scheduler_fired_total", "Timers fired", ["kind"])
fire_delay = Histogram(
    "notify_scheduler_fire_delay_seconds", "From a timer's due time to its payload written (or its work done)",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


class Scheduler:
    """The timers of this worker's partitions: held in the ``timers`` table and a heap,
    fired by :meth:`run_scheduler` when due."""

    def __init__(self, app: Any, emit: Any, receipts: Any, topic: Any = None, table: Any = None) -> None:
        """The timers of ``topic`` held in ``table`` (default: notify.timers and the
        ``timers`` table; notify.timers.high has a scheduler and a table of its own)."""
        self.app = app
        self.emit = emit
        self.receipts = receipts
        self.timers = app.user_tables.timers if table is None else table
        #: the topic its agent reads
        self.source = app.declared.timers if topic is None else topic
        self.topic = self.source.get_topic_name()
        self.intents = {p: t.get_topic_name() for p, t in app.declared.intents.items()}
        self.lanes = {k: t.get_topic_name() for k, t in app.declared.lanes.items()}
        #: due timers fired in one pass at most; the loop goes on at once while more are due
        self.fire_batch = app.settings.env.scheduler_batch
        self._heap: list[tuple[float, str, str, int]] = []  # (due_at, timer_id, user_id, partition)
        self._rebuild = True
        self._waiting: deque = deque()  # (timer_id, partition) of due poll/receipt timers, for the workers
        self._busy: set[str] = set()  # timer ids queued for or run by the workers
        self._held_meanwhile: Optional[list] = None  # heap entries held while the heap is rebuilt
        self._workers: list[asyncio.Task] = []

    async def scheduler(self, stream):
        async for event in stream.events():
            async with contained(self.app.declared.dlq, event, "scheduler"):
                await self.on_timer(event.value, event.message.partition)

    async def on_timer(self, t: Timer, partition: Optional[int] = None) -> None:
        """A timer to hold, or the ``fire`` of one held (written by a worker of before)."""
        if t.kind == "fire":
            held = self.timers.pop(t.timer_id, None)
            if held is not None:
                await self._fire_now(held)
            return
        self.timers[t.timer_id] = t
        user = t.payload.get("user_id", "")
        if partition is None:
            partition = self._partition(user)
        entry = (t.due_at, t.timer_id, user, partition)
        heapq.heappush(self._heap, entry)
        if self._held_meanwhile is not None:
            self._held_meanwhile.append(entry)

    async def _fire_now(self, held: Timer) -> None:
        """A timer's work, done at once (the ``fire`` path of before)."""
        if held.kind in ("intent", "delivery"):
            topic, key, value = self._destination(held)
            await self.app.producer.send_record(topic, key, value)
        elif held.kind == "poll":
            await self.poll_receipt(held.payload)
        elif held.kind == "receipt":
            await self.receipts.match(Receipt(**held.payload["receipt"]), held.payload["tries"])

    def _destination(self, held: Timer) -> tuple[str, bytes, bytes]:
        """(topic, key, value) of a fired intent or delivery: its payload as it was held
        (parse_timer made it exactly the record's fields, so these are the bytes the
        record's ``dumps`` writes, without building it)."""
        p = held.payload
        if held.kind == "intent":
            topic = self.intents[p["priority"]]
        else:
            topic = self.lanes[(p["channel"], p["priority"])]
        return topic, p["user_id"].encode(), dumps(p)

    def _partition(self, user: str) -> int:
        return self.app.transport.partition_for(self.topic, user.encode())

    async def _on_rebalance(self, sender, **kwargs) -> None:
        self._rebuild = True

    async def _on_recover(self) -> None:
        # a partition's timers are all in the table only once its changelog is read
        self._rebuild = True

    async def _rebuild_heap(self) -> None:
        """The heap again from the table (after a rebalance or a recovery), giving the
        loop a turn every 10,000 timers."""
        self._rebuild = False
        heap: list = []
        self._held_meanwhile = []
        try:
            for n, (tid, t) in enumerate(list(self.timers.data.items())):
                if n % 10_000 == 9_999:
                    await asyncio.sleep(0)
                if tid in self._busy:
                    continue
                user = t.payload.get("user_id", "")
                heap.append((t.due_at, tid, user, self._partition(user)))
            heap += self._held_meanwhile  # held while this ran: not in the table's snapshot
        finally:
            self._held_meanwhile = None
        heapq.heapify(heap)
        self._heap = heap

    async def fire_due(self, now: Optional[float] = None, limit: Optional[int] = None) -> int:
        """One pass: fire up to ``limit`` due timers of the partitions this worker owns,
        earliest first. Returns how many were due (fired, or found gone)."""
        limit = self.fire_batch if limit is None else limit
        if self._rebuild and self.app.tables.recovery.completed.is_set() and not self.app.in_recovery:
            await self._rebuild_heap()
        metrics.scheduled.set(len(self._heap))
        now = clock.now() if now is None else now
        owns = self.app.consumer.owns
        send = self.app.producer.send
        data = self.timers.data
        sends: list = []  # (timer_id, partition, due_at, kind, write future)
        sending: set[str] = set()  # the timers of this pass (a timer may be on the heap twice)
        taken = 0
        t0 = time.monotonic()
        while self._heap and self._heap[0][0] <= now and taken < limit:
            due, tid, user, partition = heapq.heappop(self._heap)
            taken += 1
            if not owns(self.topic, partition):
                continue  # a standby copy, or a partition revoked: its owner fires it
            held = data.get(tid)
            if held is None or held.due_at > now or tid in self._busy or tid in sending:
                continue  # fired already, held again for later (its newer entry is on the heap), or running
            if held.kind in ("intent", "delivery"):
                sending.add(tid)
                topic, key, value = self._destination(held)
                sends.append((tid, partition, held.due_at, held.kind, await send(topic, key, value, None, None, None)))
            elif held.kind in ("poll", "receipt"):
                self._busy.add(tid)
                self._waiting.append((tid, partition))
                self._start_workers()
            else:  # not a kind a holder writes (parse_timer refuses it): nothing to do
                await self._remove([(partition, tid)])
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
                    self._rebuild = True
                    continue
                counts[kind] = counts.get(kind, 0) + 1
                fire_delay.observe(max(0.0, written - due))
                held = data.get(tid)
                if held is not None and held.due_at == due:
                    done.append((partition, tid))
            for kind, n in counts.items():
                fired_total.labels(kind).inc(n)
            await self._remove(done)
        took = time.monotonic() - t0
        if took > SLOW_PASS_S:
            log.warning("scheduler pass: %d fired in %.1f s", len(sends), took)
        return taken

    async def _remove(self, items: list[tuple[int, str]]) -> None:
        """Remove fired timers from the table, a tombstone each on its partition of the
        changelog (not awaited: a removal lost in a crash fires the timer again)."""
        if not items:
            return
        data = self.timers.data
        topic = self.timers.changelog_topic.get_topic_name()
        ser = self.timers.key_serializer
        send = self.app.producer.send
        futs = []
        for partition, tid in items:
            data.pop(tid, None)
            futs.append(await send(topic, faust_codecs.dumps(ser, tid), None, partition, None, None))
        asyncio.ensure_future(self._removed(futs))

    async def _removed(self, futs: list) -> None:
        for res in await asyncio.gather(*futs, return_exceptions=True):
            if isinstance(res, ProducerFenced):
                continue  # the partition moved: its new owner fires the timer again (at least once)
            if isinstance(res, BaseException):
                log.warning("scheduler: a fired timer's removal was not written: %r", res)

    def _start_workers(self) -> None:
        self._workers[:] = [w for w in self._workers if not w.done()]
        for _ in range(min(ASYNC_WORKERS - len(self._workers), len(self._waiting))):
            self._workers.append(asyncio.ensure_future(self._async_worker()))

    async def _async_worker(self) -> None:
        """Runs due poll / receipt timers, one at a time, until none is waiting."""
        data = self.timers.data
        while self._waiting:
            tid, partition = self._waiting.popleft()
            try:
                held = data.get(tid)
                if held is None or not self.app.consumer.owns(self.topic, partition):
                    continue
                try:
                    await self._fire_now(held)
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - one timer's failure must not stop the others
                    log.exception("scheduler: timer %s (%s) failed; it is dropped", tid, held.kind)
                fired_total.labels(held.kind).inc()
                fire_delay.observe(max(0.0, clock.now() - held.due_at))
                if data.get(tid) is held:
                    await self._remove([(partition, tid)])
            finally:
                self._busy.discard(tid)

    async def run_scheduler(self) -> None:
        """Fire due timers for as long as the worker runs: a full pass goes on at once,
        else the loop sleeps until the next due time (at most :data:`IDLE_S`)."""
        while True:
            try:
                n = await self.fire_due()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the loop must outlive a bad pass
                self._rebuild = True  # what the pass took off the heap is still in the table
                log.exception("scheduler pass failed; trying again")
                await asyncio.sleep(IDLE_S)
                continue
            if n >= self.fire_batch:
                await asyncio.sleep(0)  # the other agents get a turn between full passes
                continue
            wait = IDLE_S
            if self._heap:
                wait = min(IDLE_S, max(0.001, self._heap[0][0] - clock.now()))
            await asyncio.sleep(wait)

    async def poll_receipt(self, payload: dict) -> None:
        """A receipt that did not come: ask the provider (if its protocol can answer)."""
        from pipeline.rules.plan import outcome

        d = Delivery(**payload["delivery"])
        store = await self.app.resources.store()
        rows = await store.get(d.delivery_id)
        if rows and rows[0]["status"] in (State.DELIVERED, State.UNDELIVERED):
            return  # the receipt came meanwhile
        disp = await self.app.resources.dispatcher()
        provider = disp.providers.get(payload["provider"])
        if provider is None:
            return
        q = await provider.query(d.delivery_id, rows[0]["provider_msg_id"] if rows else None)
        if q.status in (State.DELIVERED, State.UNDELIVERED):
            await self.emit.outcomes([outcome(d, d.channel, q.status, time.time(), reason="polled", provider=provider.name,
                                         provider_msg_id=q.provider_msg_id)])


def register(app: Any, emit: Any, receipts: Any) -> Scheduler:
    """A scheduler agent and its firing loop for each timer topic the role reads:
    notify.timers (the main role's) and notify.timers.high (the high path's, so that
    an OTP's retry is fired by the process that sends it, never behind a campaign).
    Returns notify.timers's."""
    main = Scheduler(app, emit, receipts)
    high = Scheduler(app, emit, receipts, app.declared.timers_high, app.user_tables.timers_high)
    for sch, name in ((main, "scheduler"), (high, "scheduler.high")):
        if app.runs(sch.source):
            app.agent(sch.source, name=name)(sch.scheduler)
            app.on_rebalance_complete.connect(sch._on_rebalance)
            sch.timers.on_recover(sch._on_recover)
            app.task(sch.run_scheduler)
    return main
