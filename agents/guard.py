"""guard: notify.intents.<priority> (one agent per priority) → the user's tables → plan (rules in pipeline/rules/plan.py)
→ outcomes, deliveries on the priority lanes, deferred intents on the timer topic.

Replay-safe: a dedup entry remembers the offset of the intent that wrote it, so
the same intent read again after a crash (same offset) is planned again instead
of being taken for a duplicate of itself, and is not counted twice against the
daily limit. Re-sent deliveries are made idempotent by the lanes' inflight table.
"""

import logging
import os

from pipeline import clock
from pipeline.app import app, intents_topics, renderer, settings
from pipeline.rules.guard import dedup_expired
from pipeline.rules.plan import plan_intent
from tables import daily, dedup, devices, inflight, preferences

from . import emit

log = logging.getLogger(__name__)


async def guard(stream):
    async for event in stream.events():
        intent = event.value
        offset = event.message.offset
        now = clock.now()
        replayed = False

        def seen(key: str):
            nonlocal replayed
            entry = dedup.get(key)
            if entry is None:
                return None
            if entry[1] == offset:
                replayed = True
                return None
            return entry[0]

        def count(key: str) -> int:
            return 0 if replayed else daily[key]

        plan = plan_intent(
            intent,
            settings=settings,
            renderer=renderer,
            prefs=preferences.get(intent.user_id),
            devices=devices.get(intent.user_id),
            now=now,
            dedup_seen=seen,
            count_today=count,
        )
        for key in plan.dedup_keys:
            dedup[key] = [now, offset, intent.category]
        if plan.counter_key and not replayed:
            daily[plan.counter_key] += 1
        if plan.timer:
            await emit.timer(intent.user_id, plan.timer)
        await emit.outcomes(plan.outcomes)
        for d in plan.deliveries:
            await emit.deliver(d)


guards = {p: app.agent(topic, name=f"guard.{p}")(guard) for p, topic in intents_topics.items()}

PURGE_EVERY_S = float(os.environ.get("NOTIFY_PURGE_EVERY_S", "60"))
DAILY_KEEP_DAYS = 2
INFLIGHT_KEEP_S = float(os.environ.get("NOTIFY_INFLIGHT_KEEP_S", "3600"))
DONE_STATES = ("ACCEPTED", "DELIVERED", "FAILED", "REVIEW", "FILTERED")


@app.timer(PURGE_EVERY_S)
async def purge_expired() -> None:
    """Drop dedup entries past their category's window, daily counters older than two
    days and lane inflight marks of deliveries done an hour ago (tombstones on the
    changelog; the compactor then drops their history)."""
    from datetime import date, timedelta

    from pipeline.topics import INTENT_TOPICS
    from tables import delete

    now = clock.now()
    purged = 0
    windows = {name: c.dedup_window_s for name, c in settings.categories.items()}
    partition_of = app.transport.partition_for
    topic = INTENT_TOPICS[0]  # every user-keyed topic has the same partitions
    owned = {tp.partition for tp in app.consumer.assignment() if tp.topic == topic}
    for key, entry in list(dedup.data.items()):
        if dedup_expired(entry, now, windows):
            user = key.split("|", 1)[0]
            p = partition_of(topic, user.encode())
            if p in owned:
                delete(dedup, p, key)
                purged += 1
    # a delivery done an hour ago can no longer be replayed from an uncommitted offset
    for key, st in list(inflight.data.items()):
        if st.get("t", now) < now - INFLIGHT_KEEP_S and st["s"] in DONE_STATES:
            p = partition_of(topic, st["u"].encode())
            if p in owned:
                delete(inflight, p, key)
                purged += 1
    oldest = (date.fromtimestamp(now) - timedelta(days=DAILY_KEEP_DAYS)).isoformat()
    for key in list(daily.data.keys()):
        # "freq:<user>:<category>:<day>"; a user id may hold ":", categories and days do not
        user, _category, day = key.split(":", 1)[1].rsplit(":", 2)
        if day < oldest:
            p = partition_of(topic, user.encode())
            if p in owned:
                delete(daily, p, key)
                purged += 1
    if purged:
        log.info("purged %d expired table entries", purged)
