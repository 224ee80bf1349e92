"""Agents: thin async loops that read a stream, call the rules, and send.

    expand     notify.events, notify.events.high → notify.intents.<priority> (and notify.dlq)
    guard.*    notify.intents.<priority> → outcomes, lanes, timers
    lane.*     notify.send.<channel>.<priority> → providers → outcomes, timers, dlq
    scheduler  notify.timers   → intents / lanes when due
    sink       (no stream) the outcomes every agent sends → SQLite record store
    receipts   notify.receipts → DELIVERED / UNDELIVERED
    callbacks  notify.outcomes → producers' status callbacks (signed POSTs, retried)
    pressure   (a timer) how far behind the lanes are → the guard's backpressure
    releases   (a timer) the gray releases set through the API → the guard
    preferences, devices       → the user tables

A worker runs the agents of its role (``NOTIFY_ROLE``, pipeline/roles.py): all of
them by default, or the high-priority path apart from the rest.
"""

from . import callbacks, expand, guard, lanes, pressure, receipts, releases, scheduler, sink, users  # noqa: F401
from pipeline import roles, runtime  # noqa: E402
from pipeline.app import app  # noqa: E402

__all__ = ["app"]

for _name in [n for n, a in app.agents.items() if not roles.runs(a.channel.get_topic_name())]:
    del app.agents[_name]


@app.on_before_shutdown.connect
async def _close_runtime(sender, **kwargs) -> None:
    await runtime.close()
