"""Agents: thin async loops that read a stream, call the rules, and send.

    expand     notify.events   → notify.intents.<priority> (and notify.dlq)
    guard.*    notify.intents.<priority> → outcomes, lanes, timers
    lane.*     notify.send.<channel>.<priority> → providers → outcomes, timers, dlq
    scheduler  notify.timers   → intents / lanes when due
    records    notify.outcomes → SQLite record store
    receipts   notify.receipts → DELIVERED / UNDELIVERED
    preferences, devices       → the user tables
"""

from . import expand, guard, lanes, receipts, scheduler, sink, users  # noqa: F401
from pipeline import runtime  # noqa: E402
from pipeline.app import app  # noqa: E402

__all__ = ["app"]


@app.on_before_shutdown.connect
async def _close_runtime(sender, **kwargs) -> None:
    await runtime.close()
