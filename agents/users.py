"""Preference and device updates, applied to the user's tables from their own
user-keyed topics (so they are replayable like everything else)."""

from pipeline.app import app, devices_topic, dlq_topic, preferences_topic
from pipeline.entries import contained
from tables import devices, preferences


@app.agent(preferences_topic, name="preferences")
async def apply_preferences(stream):
    async for event in stream.events():
        async with contained(dlq_topic, event, "preferences"):
            prefs = event.value
            current = preferences.get(prefs.user_id)
            if current is None or prefs.version >= current.version:
                preferences[prefs.user_id] = prefs


@app.agent(devices_topic, name="devices")
async def apply_devices(stream):
    async for event in stream.events():
        async with contained(dlq_topic, event, "devices"):
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
            devices[upd.user_id] = held[-10:] or None
            if not held:
                devices.pop(upd.user_id, None)
