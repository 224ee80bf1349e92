"""expand: notify.events and notify.events.high (raw bytes) → validate → one Intent
per recipient, keyed by user_id on notify.intents.<priority>. Bad input goes to
notify.dlq with the reason.

Two agents, one per topic: ``expand`` and ``expand.high``. The API writes events of
high-priority categories to notify.events.high, so a marketing campaign of a
million events in notify.events never stands in front of an OTP (that topic is
read apart from all others: pipeline/transport/priority.py). An event on either
topic is planned by its own category's priority.

An intent whose user's guard runs in this worker (the user's partition of
notify.intents.<priority> is assigned here) is planned right here, by the guard's
own function (agents/guard.py ``plans_here``, ``plan_and_send``), not written to
that topic for this worker to read back. An event with one recipient is keyed by
that user (pipeline/topics.py ``event_key``), so it is read where the user's
tables are: the intent hop is skipped for it whenever the guard of its priority
runs with expand (every worker of role ``all``; ``main`` for normal and low,
``priority`` for high)."""

import time

from pipeline import metrics
from pipeline.fair import turns_for
from pipeline.app import app, dlq_topic, events_topics, intents_topics, renderer, settings
from pipeline.entries import contained
from pipeline.ids import notification_id
from pipeline.models import Intent
from pipeline.rules.priority import marked_any
from pipeline.rules.validate import InvalidEvent, parse_event

from . import callbacks, emit
from .guard import plan_and_send, plans_here


async def expand(stream):
    turn = turns_for(stream)
    async for event in stream.events():
        await turn()
        async with contained(dlq_topic, event, "expand"):
            await expand_one(event)


async def expand_one(event) -> None:
    """One event → its intents, planned here where the guard runs for the user."""
    metrics.events_in.inc()
    raw = event.value
    msg = event.message
    try:
        # priority capped by the category, unless the API let it through (a priority:any key)
        ev = parse_event(raw if isinstance(raw, bytes) else bytes(raw or b""), settings, renderer,
                         priority_any=marked_any(msg.headers))
    except InvalidEvent as exc:
        await emit.dead_letter("expand", exc.reason, raw or b"", detail=str(exc), key=msg.key,
                               partition=msg.partition, offset=msg.offset)
        return
    if ev.callback_url:  # where its outcomes are POSTed (agents/callbacks.py), known before the first one
        await callbacks.remember(ev)
    accepted = ev.accepted_at or event.message.timestamp or time.time()
    priority = ev.priority or settings.category(ev.category).priority
    out = intents_topics[priority]
    for i, user in enumerate(ev.recipients):
        intent = Intent(
            notification_id=notification_id(ev.biz_key, user, ev.producer),
            biz_key=ev.biz_key,
            user_id=user,
            category=ev.category,
            template=ev.template,
            template_version=ev.template_version,
            priority=priority,
            params=ev.params,
            channels=ev.channels,
            locale=ev.locale,
            send_at=ev.send_at,
            accepted_at=accepted,
            producer=ev.producer,
        )
        partition = plans_here(priority, user)
        if partition is None:
            await emit.send(out, user, intent)
        else:  # this worker runs the guard for the user: plan it here
            await plan_and_send(intent, partition, f"{msg.topic}:{msg.offset}:{i}")


expanders = [app.agent(topic, name=name)(expand) for topic, name in zip(events_topics, ("expand", "expand.high"))]
