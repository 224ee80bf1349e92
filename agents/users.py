"""Preference and device updates, applied to the user's tables from their own
user-keyed topics (so they are replayable like everything else).

Every opt-out is recorded here, once, whatever sent it (the API's PUT, a
producer writing notify.preferences, a one-click unsubscribe link, a provider's
spam complaint or unsubscribe event): a switch an update turns off compared with
the table's current value (pipeline/rules/preferences.py) becomes an
``unsubscribes`` row with the update's ``source`` and ``producer``, written
before the table changes. Replays add no second row, two ways:

* the table's current value: an update re-applied after its table change was
  kept turns nothing off any more, so it records nothing;
* a UNIQUE key on ``(user_id, category, channel, at)`` (pipeline/store/schema.py),
  ``at`` being the update's own broker timestamp, the same on every replay (and
  for every consumer group): the row goes to a sink (agents/sink.py
  ``Unsubscribes``, written in batches) that every commit flushes before it sends
  the tables' changes and the offsets, so the row is durable before the table
  change, and an update read again after a crash between the two finds its row and
  the insert is ignored. (Awaiting one transaction per update here made a burst of
  preference updates crawl: the fault drill's users took over 60 s to apply.)

Every role keeps its own copy of the preferences table; only a worker of a role
other than ``priority`` records (one writer is enough, and the UNIQUE key would
absorb the second anyway).
"""

import time
from typing import Any

from pipeline import metrics
from pipeline.entries import contained
from pipeline.rules.preferences import apply_update, opt_outs

from .sink import Unsubscribes

__all__ = ["keep_newest", "register"]


def register(app: Any, applied: Any) -> None:
    """The agents applying notify.preferences and notify.devices to the user tables
    (each update handled is marked on ``applied``: agents/applied.py)."""
    t, tables = app.declared, app.user_tables
    preferences, devices, dlq = tables.preferences, tables.devices, t.dlq
    #: tokens a user keeps (push goes to every one of them: pipeline/rules/plan.py per_device)
    max_devices = app.settings.channels["push"].max_devices

    records = app.role != "priority"
    sink = None
    if records:
        sink = Unsubscribes(app.resources.with_store, within_s=app.settings.env.record_within_ms / 1000)
        app.transport_hooks.sinks.append(sink)

    async def apply_preferences(stream):
        async for event in stream.events():
            async with contained(dlq, event, "preferences"):
                await apply_preference(event)
            applied.mark(event.message)

    async def apply_preference(event) -> None:
        update = event.value
        current = preferences.get(update.user_id)
        new = apply_update(current, update)
        if new is None:
            return
        off = opt_outs(current, new) if records else []
        if off:
            # the message's own time: the same on a replay (see the module's doc)
            at = float(getattr(event.message, "timestamp", 0.0) or 0.0) or time.time()
            await sink.queue([(new.user_id, cat, ch, new.source, at, new.producer) for cat, ch in off])
        preferences[update.user_id] = new

    async def apply_devices(stream):
        async for event in stream.events():
            async with contained(dlq, event, "devices"):
                upd = event.value
                current = devices.get(upd.user_id) or []
                if upd.op == "remove":
                    # removed as of upd.at (APNs says since when a token is dead): a token
                    # registered again after that stays; no time said (0) removes it
                    cutoff = upd.at or float("inf")
                    held = [d for d in current if d[1] != upd.token or d[2] > cutoff]
                else:
                    held = [d for d in current if d[1] != upd.token]
                    held.append([upd.platform, upd.token, upd.at])
                    held = keep_newest(held, max_devices)
                if held:
                    devices[upd.user_id] = held
                else:
                    devices.pop(upd.user_id, None)
            applied.mark(event.message)

    app.agent(t.preferences, name="preferences")(apply_preferences)
    app.agent(t.devices, name="devices")(apply_devices)


def keep_newest(held: list, cap: int) -> list:
    """The ``cap`` most recently registered of a user's devices (by their time, then
    their order), in their order; the older are dropped and counted."""
    if len(held) <= cap:
        return held
    keep = set(sorted(range(len(held)), key=lambda i: (_at(held[i]), i))[-cap:])
    metrics.push_devices_dropped.inc(len(held) - cap)
    return [d for i, d in enumerate(held) if i in keep]


def _at(dev: list) -> float:
    at = dev[2] if len(dev) > 2 else 0
    return at if isinstance(at, (int, float)) else 0
