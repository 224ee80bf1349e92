"""expand: notify.events (raw bytes) → validate → one Intent per recipient, keyed by
user_id on notify.intents.<priority>. Bad input goes to notify.dlq with the reason."""

import time

from pipeline import metrics
from pipeline.app import app, events_topic, intents_topics, renderer, settings
from pipeline.ids import notification_id
from pipeline.models import Intent
from pipeline.rules.validate import InvalidEvent, parse_event

from . import emit


@app.agent(events_topic, name="expand")
async def expand(stream):
    async for event in stream.events():
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
            await out.send(key=user, value=Intent(
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
