"""guard: notify.intents.<priority> (one agent per priority) → the user's tables → plan (rules in pipeline/rules/plan.py)
→ outcomes, deliveries on the priority lanes, deferred intents on the timer topic.

Expand plans an intent itself, with the same function (:func:`plan_and_send`),
when this worker runs the guard for the intent's user (:func:`plans_here`):
events with one recipient are keyed by that user (pipeline/topics.py
``event_key``), so theirs always are, and the intent is never written to
notify.intents.<priority> to be read back by this same worker.

Replay-safe: a dedup entry remembers the message that made the intent (the
event's topic, offset and recipient: ``Intent.origin``, set by expand), so the
same intent read again after a crash is planned again instead of being taken for
a duplicate of itself, and is not counted twice against the daily limit, whether
it came the first time from expand in this worker and the second through
notify.intents.<priority> or the other way round (a worker taking partitions over
one lease at a time plans some intents of an event here and writes others; the
intent's offset in that topic, the token of before, differed between the two
ways, and the replay was FILTERED ``duplicate`` and never sent). Intents written
before carry no origin: their offset stands for it. Re-sent deliveries are made
idempotent by the lanes' inflight table.

One dedup entry per intent: the channels of a (user, business key) share one
table key (pipeline/rules/plan.py ``dedup_entry_key``), each channel with its own
time and replay token in the value, so an intent planned on three channels writes
one changelog entry, not three. Per-channel entries written before are still
read (and purged when their window ends).

The daily counters and the sliding windows' send times live in the same table as
the dedup entries (keys ``("daily", <counter key>)`` and ``("window", <window
key>)``: tuples, never equal to a dedup entry's text key), so the changes one
commit makes to a user's guard state are one group entry of one changelog
(pipeline/transport/groups.py): durable together or lost together. Apart, a
failover that lost the tail of one changelog and not the other's left dedup
entries whose counts were gone: their intents, read again, were recognised as
replays and not counted again, and the next intent over the limit was sent
(tests/transport/test_cluster_failover.py). The ``daily`` and ``recent_sends``
tables of before are still read until their entries expire, and purged.
"""

import logging
from datetime import date, timedelta
from typing import Any, Optional

from pipeline import clock, metrics
from pipeline.entries import contained
from pipeline.fair import turns_for
from pipeline.models import Intent, State
from pipeline.rules.attempts import DONE_STATES
from pipeline.rules.channels import OPTED_OUT, UNREACHABLE
from pipeline.rules.guard import dedup_expired, window_expired
from pipeline.rules.plan import dedup_entry_key, plan_intent
from pipeline.topics import INTENT_TOPICS
from pipeline.transport import ProducerFenced
from tables import DELETED, put_many, remember

__all__ = ["Guard", "register"]

log = logging.getLogger(__name__)

DAILY_KEEP_DAYS = 2

#: the first element of a daily counter's and a sliding window's key in the dedup table
DAILY, WINDOW = "daily", "window"


class Guard:
    def __init__(self, app: Any, emit: Any, pressure: Any, releases: Any, applied: Any = None) -> None:
        self.app = app
        self.emit = emit
        self.pressure = pressure
        self.releases = releases
        #: the read barrier on the user updates (agents/applied.py)
        self.applied = applied
        env = app.settings.env
        self.purge_every_s = env.purge_every_s
        self.inflight_keep_s = env.inflight_keep_s
        #: tombstones sent by the purge before it waits for them to be written
        self.purge_chunk = env.purge_chunk

    async def guard(self, stream):
        turn = turns_for(stream)
        dlq = self.app.declared.dlq
        async for _ in stream:  # stream.events() without its generator: a resumption less an entry
            event = stream.current_event
            if event is None:
                continue
            await turn()
            async with contained(dlq, event, "guard"):
                intent = event.value
                # the event's message, carried by the intent (an intent of before: its own offset)
                token = intent.origin or event.message.offset
                await self.plan_and_send(intent, event.message.partition, token)

    async def plan_and_send(self, intent: Intent, partition: int, replay_token: Any) -> None:
        """Plan ``intent`` against its user's tables (of ``partition``, the user's partition
        of the user-keyed topics, owned by this worker) and send what the plan says.

        ``replay_token`` identifies the message the intent came from: the event's topic,
        offset and recipient (``intent.origin``; for an intent written before origins, its
        offset in notify.intents.<priority>). A dedup entry written under the same token
        is this intent's own, read again after a crash."""
        app, emit, tb = self.app, self.emit, self.app.user_tables
        dedup, daily, recent_sends = tb.dedup, tb.daily, tb.recent_sends
        now = clock.now()
        replayed = False

        # one dedup entry for every channel of the (user, business key): written once per
        # intent (pipeline/rules/plan.py dedup_entry_key); a per-channel entry of a table
        # written before it is still read until the purge drops it
        entry_key = dedup_entry_key(intent.user_id, intent.biz_key, intent.producer)

        def entry_channels() -> dict:
            merged = dedup.get(entry_key)
            return merged[3] if merged is not None else {}

        channels_seen = entry_channels()

        def seen(key: str):
            nonlocal replayed
            mark = channels_seen.get(key.rsplit("|", 1)[1])
            entry = mark if mark is not None else dedup.get(key)
            if entry is None:
                return None
            if entry[1] == replay_token:
                replayed = True
                return None
            return entry[0]

        def count(key: str) -> int:
            return 0 if replayed else counted(key)

        def counted(key: str) -> int:
            # .data: a missing key read through the table would be set to its default,
            # a change for the current event's partition (expand's, not the user's)
            n = dedup.data.get((DAILY, key))
            return n if n is not None else daily.data.get(key, 0)

        def recent(key: str) -> list:
            if replayed:
                return []
            times = dedup.data.get((WINDOW, key))
            return times if times is not None else (recent_sends.data.get(key) or [])

        def make_plan():
            return plan_intent(
                intent,
                settings=app.settings,
                renderer=app.renderer,
                prefs=tb.preferences.get(intent.user_id),
                devices=tb.devices.get(intent.user_id),
                now=now,
                dedup_seen=seen,
                count_today=count,
                recent_sends=recent,
                backpressure=self.pressure.on(),
                releases=self.releases.releases(),
                tracker=app.tracker,
            )

        plan = make_plan()
        if self.applied is not None and turned_down(plan):
            counter_key = plan.counter_key

            def state() -> tuple:
                # what the plan read of the user's guard state: the consumer's generation
                # (a rebalance), the intent's dedup entry and its daily count
                return (app.consumer_generation_id, dedup.data.get(entry_key),
                        counted(counter_key) if counter_key else None)

            before = state()
            pending = await self.applied.wait(partition, intent.accepted_at)
            if pending or state() != before:
                # an update of the user's written before the event was pending (applied now),
                # or the user's guard state moved while the barrier awaited the broker: a
                # rebalance recovered it (a master failing over can hold the barrier for
                # seconds), or another path planned this same intent or key meanwhile. The
                # dedup entry is read again and the intent planned again on the tables as
                # they are; planned on what it read before the wait, an intent whose own
                # entry came in meanwhile was counted a second time against the daily limit
                # (the cluster failover drill: a user's next intent FILTERED over_limit).
                # From here to the writes below nothing awaits
                channels_seen = entry_channels()
                plan = make_plan()
        if plan.no_channel and not replayed:
            metrics.no_channel.labels(intent.category, plan.no_channel).inc()
        if plan.devices_not_sent and not replayed:
            metrics.push_devices_not_sent.inc(plan.devices_not_sent)
        if plan.dedup_keys:
            chans = dict(channels_seen)
            chans.update((key.rsplit("|", 1)[1], [now, replay_token]) for key in plan.dedup_keys)
            remember(dedup, partition, entry_key, [now, replay_token, intent.category, chans])
        if plan.counter_key and not replayed:
            remember(dedup, partition, (DAILY, plan.counter_key), counted(plan.counter_key) + 1)
        if plan.window and not replayed:
            wkey, times = plan.window
            remember(dedup, partition, (WINDOW, wkey), times)
        for t in plan.timers:
            await emit.timer(intent.user_id, t)
        await emit.outcomes(plan.outcomes)
        for d in plan.deliveries:
            await emit.deliver(d)

    def plans_here(self, priority: str, user_id: str) -> Optional[int]:
        """The user's partition if this worker runs ``guard.<priority>`` for it now (it is
        assigned the user's partition of notify.intents.<priority>), else None: expand
        then plans the intent itself (:meth:`plan_and_send`) instead of writing it to
        that topic for this same worker to read back (an entry written, fetched,
        decoded and delivered through Faust, and a hop of latency, per recipient)."""
        app = self.app
        topic = app.declared.intents[priority].get_topic_name()
        partition = app.transport.partition_for(topic, user_id.encode())
        return partition if app.consumer.owns(topic, partition) else None

    async def purge_expired(self) -> None:
        """Drop dedup entries past their category's window, daily counters older than two
        days, sliding-window send times outside their category's longest window, and
        lane inflight marks of deliveries done an hour ago (tombstones on the
        changelog; the compactor then drops their history).

        Tombstones go out :attr:`purge_chunk` at a time, each chunk written before the
        next is made (one changelog entry per table and partition of the chunk): a
        purge of thousands of keys sent at once held a message, a
        future and a pending write per key until the producer caught up (a ~20 MB
        spike every purge in the soak, which the allocator kept as RSS)."""
        app, tb, settings = self.app, self.app.user_tables, self.app.settings
        dedup, daily, inflight, recent_sends = tb.dedup, tb.daily, tb.inflight, tb.recent_sends
        now = clock.now()
        keep_s = self.inflight_keep_s
        windows = {name: c.dedup_window_s for name, c in settings.categories.items()}
        longest = {name: max((w for w, _n in c.rate_windows), default=0) for name, c in settings.categories.items()}
        partition_of = app.transport.partition_for
        topic = INTENT_TOPICS[0]  # every user-keyed topic has the same partitions
        owned = {tp.partition for tp in app.consumer.assignment() if tp.topic == topic}
        oldest = (date.fromtimestamp(now) - timedelta(days=DAILY_KEEP_DAYS)).isoformat()

        def daily_expired(key: str) -> Optional[str]:
            """The user of an expired daily counter key (None: not expired)."""
            # "freq:<user>:<category>:<day>"; a user id may hold ":", categories and days do not
            user, _category, day = key.split(":", 1)[1].rsplit(":", 2)
            return user if day < oldest else None

        def window_user(key: str, times: Any) -> Optional[str]:
            """The user of a sliding window whose send times are all past (None: live)."""
            user, _, category = key.rpartition("|")
            return user if window_expired(times, now, longest.get(category, 0)) else None

        def expired():
            for key in list(dedup.data):
                entry = dedup.data.get(key)
                if entry is None:
                    continue
                if isinstance(key, tuple):  # the daily counters and windows (module docs)
                    user = daily_expired(key[1]) if key[0] == DAILY else window_user(key[1], entry)
                    if user is not None:
                        yield dedup, user, key
                elif dedup_expired(entry, now, windows):
                    yield dedup, key.split("|", 1)[0], key
            # a delivery done an hour ago can no longer be replayed from an uncommitted offset
            for key in list(inflight.data):
                st = inflight.data.get(key)
                if st is not None and st.get("t", now) < now - keep_s and st["s"] in DONE_STATES:
                    yield inflight, st["u"], key
            # the tables of before (module docs), until their entries have expired
            for key in list(daily.data):
                user = daily_expired(key)
                if user is not None:
                    yield daily, user, key
            for key in list(recent_sends.data):
                user = window_user(key, recent_sends.data.get(key))
                if user is not None:
                    yield recent_sends, user, key

        purged = 0
        chunk: dict[tuple[Any, int], dict] = {}  # (table, partition) → its tombstones

        async def send_chunk() -> None:
            # one changelog entry per (table, partition) of the chunk (tables.put_many)
            last = None
            for (table, p), items in chunk.items():
                last = put_many(table, p, items) or last
            chunk.clear()
            await _written(last)

        for table, user, key in expired():
            p = partition_of(topic, user.encode())
            if p not in owned:
                continue
            chunk.setdefault((table, p), {})[key] = DELETED
            purged += 1
            if purged % self.purge_chunk == 0:
                await send_chunk()
        await send_chunk()
        if purged:
            log.info("purged %d expired table entries", purged)


async def _written(fut) -> None:
    if fut is None:
        return
    try:
        await fut
    except ProducerFenced:
        pass  # the partition moved: its new owner purges it


def turned_down(plan: Any) -> bool:
    """Whether ``plan`` turned a channel down for want of an address or for an opt-out:
    a decision an update of the user's, written before the event and not yet applied,
    could change (agents/applied.py)."""
    return any(o.state == State.FILTERED and o.reason in (UNREACHABLE, OPTED_OUT) for o in plan.outcomes)


def register(app: Any, emit: Any, pressure: Any, releases: Any, applied: Any = None) -> Guard:
    """``guard.<priority>`` for the priorities this app's role runs, and the purge."""
    g = Guard(app, emit, pressure, releases, applied)
    for p, topic in app.declared.intents.items():
        if app.runs(topic):
            app.agent(topic, name=f"guard.{p}")(g.guard)
    app.timer(g.purge_every_s, name="guard.purge_expired")(g.purge_expired)
    return g
