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
            held = [d for d in (devices.get(upd.user_id) or []) if d[1] != upd.token]
            if upd.op == "add":
                held.append([upd.platform, upd.token, upd.at])
            devices[upd.user_id] = held[-10:] or None
            if not held:
                devices.pop(upd.user_id, None)
