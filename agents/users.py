"""Preference and device updates, applied to the user's tables from their own
user-keyed topics (so they are replayable like everything else)."""

from typing import Any

from pipeline import metrics
from pipeline.entries import contained

__all__ = ["keep_newest", "register"]


def register(app: Any) -> None:
    """The agents applying notify.preferences and notify.devices to the user tables."""
    t, tables = app.declared, app.user_tables
    preferences, devices, dlq = tables.preferences, tables.devices, t.dlq
    #: tokens a user keeps (push goes to every one of them: pipeline/rules/plan.py per_device)
    max_devices = app.settings.channels["push"].max_devices

    async def apply_preferences(stream):
        async for event in stream.events():
            async with contained(dlq, event, "preferences"):
                prefs = event.value
                current = preferences.get(prefs.user_id)
                if current is None or prefs.version >= current.version:
                    preferences[prefs.user_id] = prefs

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
