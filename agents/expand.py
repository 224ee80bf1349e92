"""expand: notify.events and notify.events.high (raw bytes) → validate → one Intent
per recipient, keyed by user_id on notify.intents.<priority>. Bad input goes to
notify.dlq with the reason.

Two agents, one per topic: ``expand`` and ``expand.high``. The API writes events of
high-priority categories to notify.events.high, so a marketing campaign of a
million events in notify.events never stands in front of an OTP (that topic is
read apart from all others: pipeline/transport/priority.py). An event on either
topic is planned by its own category's priority."""

import time

from pipeline import metrics
from pipeline.fair import turns_for
from pipeline.app import app, events_topics, intents_topics, renderer, settings
from pipeline.ids import notification_id
from pipeline.models import Intent
from pipeline.rules.validate import InvalidEvent, parse_event

from . import emit


async def expand(stream):
    turn = turns_for(stream)
    async for event in stream.events():
        await turn()
        metrics.events_in.inc()
        raw = event.value
        try:
            ev = parse_event(raw if isinstance(raw, bytes) else bytes(raw or b""), settings, renderer)
        except InvalidEvent as exc:
            await emit.dead_letter("expand", exc.reason, raw or b"", detail=str(exc))
            continue
        accepted = ev.accepted_at or event.message.timestamp or time.time()
        priority = ev.priority or settings.category(ev.category).priority
        out = intents_topics[priority]
        for user in ev.recipients:
            await emit.send(out, user, Intent(
                notification_id=notification_id(ev.biz_key, user),
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
            ))


expanders = [app.agent(topic, name=name)(expand) for topic, name in zip(events_topics, ("expand", "expand.high"))]
