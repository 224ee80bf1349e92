"""Agents: thin async loops that read a stream, call the rules, and send.

    expand     notify.events, notify.events.high → notify.intents.<priority> (and notify.dlq)
    guard.*    notify.intents.<priority> → outcomes, lanes, timers
    lane.*     notify.send.<channel>.<priority> → providers → outcomes, timers, dlq
    scheduler  notify.timers   → intents / lanes when due (scheduler.high: notify.timers.high)
    sink       (no stream) the outcomes every agent sends → SQLite record store
    receipts   notify.receipts → DELIVERED / UNDELIVERED
    polls      (a timer) the records still ACCEPTED receipt_poll_s after the send → the provider's status query
    callbacks  notify.callbacks (the outcomes of events with a callback target) → producers'
               status callbacks (signed POSTs, retried)
    pressure   (a timer) how far behind the lanes are → the guard's backpressure
    releases   (a timer) the gray releases set through the API → the guard
    preferences, devices       → the user tables

Nothing is registered when a module is imported: :func:`register_agents` wires
the agents of the app's role (pipeline/roles.py) onto an app built by
``pipeline.app.create_app``, and returns the parts, so a test can call a part
(``parts.guard.plan_and_send``) on an app it built.
"""

from dataclasses import dataclass
from typing import Any

from . import applied, callbacks, emit, expand, guard, lanes, polls, pressure, receipts, releases, scheduler, sink, users

__all__ = ["Parts", "register_agents"]


@dataclass
class Parts:
    records: sink.Records
    emit: emit.Emit
    pressure: pressure.Pressure
    releases: releases.Releases
    callbacks: callbacks.Callbacks
    guard: guard.Guard
    expand: expand.Expand
    lanes: lanes.Lanes
    receipts: receipts.Receipts
    scheduler: scheduler.Scheduler
    polls: polls.Polls
    applied: applied.Applied


def register_agents(app: Any) -> Parts:
    """Register the agents, timers and tasks of ``app.role`` on ``app`` (once)."""
    if app.parts is not None:
        raise RuntimeError("the agents are registered on this app already")
    records = sink.register(app)
    out = emit.Emit(app, records)
    records.on_refused = out.refused_record
    press = pressure.register(app)
    rel = releases.register(app)
    cb = callbacks.register(app)
    fresh = applied.attach(app)
    g = guard.register(app, out, press, rel, fresh)
    x = expand.register(app, out, g, cb)
    ln = lanes.register(app, out)
    users.register(app, fresh)
    rc = receipts.register(app, out, cb)
    sch = scheduler.register(app, out, rc)
    pl = polls.register(app, out, cb)
    app.task(app.resources.warm_up)  # the providers built before the first delivery, not by it
    app.parts = Parts(records=records, emit=out, pressure=press, releases=rel, callbacks=cb, guard=g, expand=x,
                      lanes=ln, receipts=rc, scheduler=sch, polls=pl, applied=fresh)
    return app.parts
