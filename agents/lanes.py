"""One sender agent per channel × priority lane (notify.send.<channel>.<priority>).

Lanes are separate topics consumed independently, so a marketing backlog on a
low lane never waits in front of an OTP on a high one (the high topics are also
fetched and written apart: pipeline/transport/priority.py). Each agent takes what
its stream has ready (pipeline/take.py) while it has room in its window of calls
in flight, marks every delivery "calling" in the inflight table (durably, before
any provider call; the marks of one take's deliveries of a partition are one
changelog entry, tables.put_many; the inbox's lane, whose call is an idempotent
insert of our own, keeps no marks: :func:`marks_calls`), starts its call, and
turns each result, whenever it comes, into outcomes, retries (on the timer topic)
and dead letters via pipeline/rules/attempts. A hanging call holds one slot, never
the lane (docs/adr/0001-lanes-as-continuous-pipelines.md).

A push to a user's devices arrives as one delivery per device (pipeline/rules/
plan.py ``per_device``), each with its own ``delivery_id``: everything here keys
on it (the inflight marks, the calls in flight, the retry timers, the dead
letter, the provider's idempotency key), so each device's delivery is handled,
and made exactly once, on its own, and a bad token removes that device only.
"""

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from faust import current_event

from pipeline import clock, metrics
from pipeline.models import Attempt, Delivery, DeviceUpdate, State
from pipeline.rules.attempts import after_query, after_send, superseded
from pipeline.rules.channels import is_unsubscribed
from pipeline.rules.plan import outcome
from pipeline.store import InboxItem
from pipeline.entries import PASS_THROUGH
from pipeline.fair import turns_for
from pipeline.take import take_ready
from pipeline.transport import ProducerFenced
from tables import put_many, remember

from .handoff import Handed, Handoff, source_of

__all__ = ["InboxWriter", "Lanes", "Step", "register"]

log = logging.getLogger(__name__)

#: longest a delivery waits in its slot for a provider's rate (token bucket) or a
#: breaker's next probe before it is scheduled on the timer topic instead
IN_SLOT_WAIT_S = 2.0


def marks_calls(channel: str) -> bool:
    """Whether the lane of ``channel`` keeps inflight marks ("calling" before the call,
    its result after). Every provider's lane does: a call whose fate a crash made
    unknown is asked about, never blindly made again. The inbox's does not: its
    "call" is our own insert of the row, keyed by the delivery id (a replay adds no
    second row), so handling a delivery again is harmless and needs no ledger; it
    saves the inbox deliveries (half of them in the demo's mix) three changelog
    entries each (the two marks and the purge's tombstone) and the wait for the
    "calling" write before the row. What a replay repeats: the DELIVERED outcome (the
    same change again, which the records and the callbacks' ids absorb)."""
    return channel != "inbox"


@dataclass
class Step:
    outcomes: list = field(default_factory=list)
    retry: Optional[Delivery] = None
    dead_letter: Optional[str] = None
    remove_token: Optional[str] = None
    remove_at: Optional[float] = None  # when the provider learnt the token was dead (APNs 410); None: now
    inbox: Optional[InboxItem] = None
    state: str = State.PENDING
    attempts_made: int = 0


def _inbox_item(d: Delivery, now: float) -> InboxItem:
    """The inbox row an accepted inbox delivery becomes (written by this lane)."""
    return InboxItem(d.user_id, d.delivery_id, d.content.get("title", ""), d.content.get("body", ""), now)


class InboxWriter:
    """Inbox rows of the deliveries that finish, written together: whatever arrives
    while one write runs goes in the next (a group commit), so a lane whose calls
    finish one by one still writes SQLite in batches, and no row waits for more."""

    def __init__(self, with_store: Any) -> None:
        self.with_store = with_store
        self._pending: list[tuple[InboxItem, asyncio.Future]] = []
        self._writer: Optional[asyncio.Future] = None

    async def add(self, item: InboxItem) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write())
        await fut

    async def _write(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    # an unavailable store is retried, as the record sink does
                    rows = [item for item, _f in batch]
                    await self.with_store(lambda store: store.add_inbox(rows), "inbox")
                except Exception as exc:  # noqa: BLE001 - each waiter gets it
                    for _item, f in batch:
                        f.done() or f.set_exception(exc)
                else:
                    for _item, f in batch:
                        f.done() or f.set_result(None)
        finally:
            self._writer = None


class Lanes:
    """The lane agents of one app, and what a delivery's step does."""

    def __init__(self, app: Any, emit: Any) -> None:
        self.app = app
        self.emit = emit
        #: (channel, priority) → the in-memory intake of that lane, while it runs here
        self.handoffs: dict[tuple[str, str], Handoff] = {}

    async def step(self, d: Delivery, disp, fate_unknown: bool) -> Step:
        now = clock.now()
        out = Step(attempts_made=d.attempt)
        if is_unsubscribed(self.app.user_tables.preferences.get(d.user_id), d.category, d.channel):
            out.state = State.FILTERED
            out.outcomes.append(outcome(d, d.channel, State.FILTERED, now, reason="unsubscribed"))
            return out
        reconciled = False
        if d.unknown_provider or fate_unknown:
            q = await disp.query(d)
            nxt = after_query(d, q.status, q.supported, now, provider_msg_id=q.provider_msg_id)
            if not nxt.resend_now:
                out.state, out.retry = nxt.state, nxt.retry
                out.outcomes.append(outcome(d, d.channel, nxt.state, now, reason=nxt.reason,
                                            provider=q.provider or d.unknown_provider,
                                            provider_msg_id=nxt.provider_msg_id, retry_count=d.attempt))
                if nxt.state == State.ACCEPTED and d.channel == "inbox":
                    out.inbox = _inbox_item(d, now)
                return out
            reconciled = bool(d.unknown_provider)
        deadline = self.app.settings.call_deadlines.get(d.priority)
        # out of rate for a moment: the delivery waits in line for a token in its own
        # slot (the dispatcher's ``most_wait``), the lane's other slots go on. Through
        # the timer topic the wait would be a round trip through the scheduler of the
        # main workers (behind whatever backlog they have: an OTP behind a campaign)
        rnd = await disp.send(d, reconciled=reconciled, deadline=deadline, most_wait=IN_SLOT_WAIT_S)
        waited = 0.0
        while not rnd.results and rnd.wait_s and waited + rnd.wait_s <= IN_SLOT_WAIT_S:
            # a breaker about to half-open: wait for it in the slot too
            await asyncio.sleep(rnd.wait_s)
            waited += rnd.wait_s
            rnd = await disp.send(d, reconciled=reconciled, deadline=deadline, most_wait=IN_SLOT_WAIT_S - waited)
        if not rnd.results:  # breakers open or out of rate for longer: try later, no attempt made
            data = d.asdict()
            data["due_at"] = now + (rnd.wait_s or 0.1)
            out.retry = Delivery(**data)
            return out
        cur = d
        for i, r in enumerate(rnd.results):
            metrics.attempts_of(r.provider, r.result).inc()
            metrics.send_latency_of(d.channel, d.priority).observe(r.latency_ms / 1000)
            nxt = after_send(cur, r.result, now, provider=r.provider, retry_after=r.retry_after,
                             permanent_kind=r.permanent_kind, provider_msg_id=r.provider_msg_id)
            att = Attempt(delivery_id=d.delivery_id, seq=cur.attempt + 1, channel=d.channel, provider=r.provider,
                          started_at=now, result=r.result, latency_ms=r.latency_ms, provider_msg_id=r.provider_msg_id,
                          retry_after=r.retry_after, next_at=nxt.retry.due_at if nxt.retry else None, error=r.error)
            out.outcomes.append(outcome(cur, d.channel, nxt.state, now, reason=nxt.reason, provider=r.provider,
                                        provider_msg_id=r.provider_msg_id, retry_count=cur.attempt + 1, attempt=att))
            out.state = nxt.state
            out.attempts_made = cur.attempt + 1
            last = i == len(rnd.results) - 1
            if not last:  # failed over to the next provider within this step
                cur = nxt.retry or cur
                continue
            out.retry = nxt.retry
            if nxt.dead_letter:
                out.dead_letter = nxt.reason
            if nxt.remove_device and d.address and ":" in d.address:
                out.remove_token = d.address.split(":", 1)[1]
                out.remove_at = r.unregistered_at
            if nxt.state == State.ACCEPTED and d.channel == "inbox":
                out.inbox = _inbox_item(d, now)
        return out

    async def contained_step(self, d: Delivery, disp, fate_unknown: bool) -> Step:
        """:meth:`step`, with an error other than the broker's transient ones contained
        to its delivery: FAILED ``agent_error`` and dead-lettered (``notify dlq replay
        --source lane`` sends it again), so one bad delivery never fails its batch nor
        crashes the lane."""
        try:
            return await self.step(d, disp, fate_unknown)
        except PASS_THROUGH:
            raise
        except Exception:  # noqa: BLE001 - one bad delivery must not stop a lane
            metrics.agent_errors.labels(f"lane.{d.channel}.{d.priority}").inc()
            log.exception("lane %s.%s failed on delivery %s; it is dead-lettered", d.channel, d.priority, d.delivery_id)
            out = Step(state=State.FAILED, attempts_made=d.attempt, dead_letter="agent_error")
            out.outcomes.append(outcome(d, d.channel, State.FAILED, clock.now(),
                                        reason="agent_error", retry_count=d.attempt))
            return out

    async def finish(self, d: Delivery, s: Step, partition: int, inbox: InboxWriter) -> None:
        """Send what one delivery's step decided, then cache its "done" mark."""
        if s.inbox:
            await inbox.add(s.inbox)
            s.outcomes.append(outcome(d, d.channel, State.DELIVERED, time.time(), reason="in_inbox",
                                      provider="inbox", provider_msg_id=d.delivery_id, retry_count=s.attempts_made))
        emit = self.emit
        await emit.outcomes(s.outcomes)
        if s.retry is not None:
            await emit.retry(s.retry)
        if s.dead_letter:
            await emit.dead_letter("lane", s.dead_letter, d.dumps(), key=d.delivery_id)
        if s.remove_token:
            await self.app.declared.devices.send(key=d.user_id, value=DeviceUpdate(
                user_id=d.user_id, token=s.remove_token, op="remove",
                at=s.remove_at if s.remove_at is not None else time.time()))
        # cached until the commit, so it is written after the outcomes above and their
        # records (agents/sink.py): a crash in between leaves "calling", and the replay
        # reconciles and records instead of skipping
        if marks_calls(d.channel):
            remember(self.app.user_tables.inflight, partition, d.delivery_id,
                     {"a": s.attempts_made, "s": s.state, "u": d.user_id, "t": clock.now(), "r": d.replay})

    def offer(self, d: Delivery) -> bool:
        """Hand ``d`` to its lane in memory (agents/handoff.py) when the lane runs here,
        this worker holds the delivery's partition of the lane's topic, the lane has
        room, and ``d`` is planned while an event is handled (the source, held until
        ``d`` is done). False: the caller sends it through the lane's topic."""
        h = self.handoffs.get((d.channel, d.priority))
        if h is None or not h.has_room(d.delivery_id):
            return False
        src = source_of(current_event())
        if src is None:
            return False
        app = self.app
        partition = app.transport.partition_for(h.topic, d.user_id.encode())
        if not app.consumer.owns(h.topic, partition):
            return False
        tp, offset = src
        app.consumer.holds.hold(tp, offset)
        h.put(d, Handed(tp, offset, partition, held=True))
        metrics.handoffs_of(d.channel, d.priority).inc()
        return True

    def make_lane(self, channel: str, priority: str):
        """The lane's agent: a window of up to ``lane_batch_size`` provider calls in flight
        (docs/adr/0001-lanes-as-continuous-pipelines.md). New deliveries are taken as
        slots free up, from the lane's topic and from its in-memory intake
        (agents/handoff.py), calls finish in any order, and each entry is acknowledged
        when its delivery is done: the committed offset stops below the lowest
        unfinished one (of the lane's topic, or of the event a handed delivery came from)."""
        app = self.app
        topic = app.declared.lanes[(channel, priority)]
        topic_name = topic.get_topic_name()
        window = app.settings.lane_batch_size(channel, priority)
        inflight = app.user_tables.inflight
        name = f"lane.{channel}.{priority}"
        marked = marks_calls(channel)
        handoff = app.settings.env.handoff  # NOTIFY_HANDOFF: an in-memory intake (agents/handoff.py)

        async def lane(stream):
            turn = turns_for(stream)
            slots = asyncio.Semaphore(window)
            running: dict[str, asyncio.Future] = {}
            again: dict[str, list] = {}  # delivery id started → copies of it (Handed) met meanwhile
            failed: list[BaseException] = []
            inbox = InboxWriter(app.resources.with_store)
            holds = app.consumer.holds  # the committed offset stays below a call in flight
            waiting = [0]  # deliveries taken (from the topic or the intake) that wait for a slot
            intake = Handoff(topic_name, lambda: window - len(running) - waiting[0], again)

            async def settle(src: Handed) -> None:
                """Done with ``src``: its topic entry acknowledged, its hold released."""
                if src.event is not None:
                    await stream.ack(src.event)
                if src.held:
                    src.held = False
                    holds.release(src.tp, src.offset)

            async def to_topic(d: Delivery, src: Handed) -> None:
                """A handed delivery this lane will not call: through the topic, then let go."""
                await self.emit.send(topic, d.user_id, d)
                await settle(src)

            async def call(src: Handed, d: Delivery, disp, fate_unknown: bool, mark) -> None:
                try:
                    try:
                        # the "calling" mark is durable before the call: wait for this write
                        # only (a producer flush would also wait for everything else sent);
                        # None: a lane that keeps no marks (marks_calls)
                        if mark is not None:
                            await mark
                    except ProducerFenced:
                        # refused: this worker lost the partition (paused past its lease, a
                        # zombie); its new owner reads the delivery again (a handed one, from
                        # the topic, where it is written now), so no call here
                        log.warning("lane %s: delivery %s fenced (partition lost), left to its new owner",
                                    name, d.delivery_id)
                        running.pop(d.delivery_id, None)  # a copy read from now on is handled anew
                        for c in (src, *again.pop(d.delivery_id, ())):
                            await (settle(c) if c.event is not None else to_topic(d, c))
                        return
                    s = await self.contained_step(d, disp, fate_unknown)
                    await self.finish(d, s, src.partition, inbox)
                    # this delivery, and any copy of it met while the call ran, is done (a copy
                    # read from now on finds the done mark: superseded)
                    running.pop(d.delivery_id, None)
                    for c in (src, *again.pop(d.delivery_id, ())):
                        await settle(c)
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:  # a transient error: the agent crashes, as it did
                    failed.append(exc)
                    return  # the entry stays held: no commit passes it until the worker restarts
                finally:
                    running.pop(d.delivery_id, None)
                    slots.release()

            async def start(items: list, disp) -> None:
                """Start the calls of ``items`` ((Handed, Delivery) pairs), each as a slot frees."""
                starting = []  # (source, delivery, fate unknown) of the deliveries this take starts
                marks: dict[int, dict] = {}  # partition → the "calling" marks of its deliveries
                for src, d in items:
                    if d.delivery_id in running or d.delivery_id in again:
                        # a copy met while the call runs (read again after a rebalance's seek,
                        # or a duplicate): let go when the call is done, never before, so the
                        # committed offset cannot pass an unfinished delivery
                        again.setdefault(d.delivery_id, []).append(src)
                        continue
                    st = inflight.get(d.delivery_id)
                    if superseded(st, d.attempt, d.replay):
                        await settle(src)  # superseded or done: a replay or duplicate
                        continue
                    fate_unknown = bool(st and st["s"] == "calling" and st["a"] == d.attempt
                                        and st.get("r", 0) == d.replay)
                    again[d.delivery_id] = []
                    starting.append((src, d, fate_unknown))
                    if marked:
                        marks.setdefault(src.partition, {})[d.delivery_id] = {
                            "a": d.attempt, "s": "calling", "r": d.replay}
                # the "calling" marks of the take: one changelog entry per partition
                # (tables.put_many), durable before any of its calls starts
                written = {p: put_many(inflight, p, m) for p, m in marks.items()}
                waiting[0] += len(starting)
                left = len(starting)
                try:
                    for src, d, fate_unknown in starting:
                        await turn()
                        # a free slot, then this delivery starts at once: it never waits for
                        # the rest of its take to find slots (that is, for the slowest call)
                        await slots.acquire()
                        if not src.held:
                            src.held = True
                            holds.hold(src.tp, src.offset)
                        mark = written.get(src.partition)  # None: a lane without marks
                        running[d.delivery_id] = asyncio.ensure_future(call(src, d, disp, fate_unknown, mark))
                        left -= 1
                        waiting[0] -= 1
                finally:
                    waiting[0] -= left

            async def take_handed() -> None:
                try:
                    while True:
                        items = await intake.take(window)
                        await start(items, await app.resources.dispatcher())
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:  # noqa: BLE001 - the lane's loop raises it
                    failed.append(exc)
                    # no more hand-offs: what comes goes through the topic, whose next
                    # entry wakes the lane's loop, which then raises
                    left = intake.close()
                    if left:
                        await _to_topic_all(to_topic, left)

            handed = None
            if handoff:
                handed = asyncio.ensure_future(take_handed())
                self.handoffs[(channel, priority)] = intake
            try:
                async for events in take_ready(stream, window, ack=False):
                    if failed:
                        raise failed[0]
                    items = [(Handed(ev.message.tp, ev.message.offset, ev.message.partition, ev), ev.value)
                             for ev in events]
                    await start(items, await app.resources.dispatcher())
            finally:
                if self.handoffs.get((channel, priority)) is intake:
                    del self.handoffs[(channel, priority)]
                if handed is not None:
                    handed.cancel()
                left = intake.close()
                if left:  # queued, never started: to the topic, then let go (in the background)
                    asyncio.ensure_future(_to_topic_all(to_topic, left))
                for task in list(running.values()):
                    task.cancel()  # the fate of a call cut short is unknown: its replay asks the provider

        lane.__name__ = f"lane_{channel}_{priority}"
        return topic, name, lane


async def _to_topic_all(to_topic: Any, left: list) -> None:
    for src, d in left:
        try:
            await to_topic(d, src)
        except Exception:  # noqa: BLE001 - its source stays held: replayed after a restart
            log.exception("lane: a handed delivery %s could not be written to its topic", d.delivery_id)


def register(app: Any, emit: Any) -> Lanes:
    """A lane agent for every channel × priority lane of this app's role."""
    lanes = Lanes(app, emit)
    emit.handoff = lanes.offer
    for key, topic in app.declared.lanes.items():
        if app.runs(topic):
            topic, name, fun = lanes.make_lane(*key)
            app.agent(topic, name=name)(fun)
    return lanes
