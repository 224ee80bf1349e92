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
from typing import Any

from pipeline import metrics
from pipeline.entries import contained
from pipeline.fair import turns_for
from pipeline.ids import notification_id
from pipeline.models import Intent
from pipeline.rules.priority import marked_any
from pipeline.parsers.events import InvalidEvent, parse_event

__all__ = ["Expand", "register"]


class Expand:
    def __init__(self, app: Any, emit: Any, guard: Any, callbacks: Any) -> None:
        self.app = app
        self.emit = emit
        self.guard = guard
        self.callbacks = callbacks

    async def expand(self, stream):
        turn = turns_for(stream)
        dlq = self.app.declared.dlq
        async for _ in stream:  # stream.events() without its generator: a resumption less an entry
            event = stream.current_event
            if event is None:
                continue
            await turn()
            async with contained(dlq, event, "expand"):
                await self.expand_one(event)

    async def expand_one(self, event) -> None:
        """One event → its intents, planned here where the guard runs for the user."""
        app, emit, guard = self.app, self.emit, self.guard
        settings = app.settings
        metrics.events_in.inc()
        raw = event.value
        msg = event.message
        try:
            # priority capped by the category, unless the API let it through (a priority:any key)
            ev = parse_event(raw if isinstance(raw, bytes) else bytes(raw or b""), settings, app.renderer,
                             priority_any=marked_any(msg.headers))
        except InvalidEvent as exc:
            await emit.dead_letter("expand", exc.reason, raw or b"", detail=str(exc), key=msg.key,
                                   partition=msg.partition, offset=msg.offset)
            return
        if ev.callback_url:  # where its outcomes are POSTed (agents/callbacks.py), known before the first one
            await self.callbacks.remember(ev)
        callback = self.callbacks.wanted(ev)
        accepted = ev.accepted_at or event.message.timestamp or time.time()
        priority = ev.priority or settings.category(ev.category).priority
        out = app.declared.intents[priority]
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
                callback=callback,
                origin=f"{msg.topic}:{msg.offset}:{i}",
            )
            partition = guard.plans_here(priority, user)
            if partition is None:
                await emit.send(out, user, intent)
            else:  # this worker runs the guard for the user: plan it here
                await guard.plan_and_send(intent, partition, intent.origin)


def register(app: Any, emit: Any, guard: Any, callbacks: Any) -> Expand:
    """``expand`` (notify.events) and ``expand.high`` (notify.events.high), by role."""
    x = Expand(app, emit, guard, callbacks)
    for topic, name in zip(app.declared.events, ("expand", "expand.high")):
        if app.runs(topic):
            app.agent(topic, name=name)(x.expand)
    return x
