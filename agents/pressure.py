"""backpressure: how far behind the pipeline is, read every 2 s from the same
lag the status page shows (the oldest unprocessed entry of every lane and
intents topic); the guard throttles the categories of ``[backpressure]`` while
it is on (rules: pipeline/rules/backpressure.py)."""

import logging
from typing import Any, Optional

from pipeline import metrics
from pipeline.app import app, settings
from pipeline.rules.backpressure import oldest_age, throttle

log = logging.getLogger("notify.backpressure")

#: the throttle's state in this worker, and the age it was decided on
state = {"on": False, "age": 0.0}
_sampler: Optional[Any] = None
_side: Optional[Any] = None


async def side_client() -> Any:
    """A small connection pool of this worker's own for its periodic reads (this
    module's lag, agents/releases.py): never the transport's client, whose
    commands at start-up widen the window of a seek (agents/callbacks.py)."""
    global _side
    if _side is None:
        from pipeline.transport.client import connect

        _side = await connect([app.transport.broker_url], pool_size=2)
    return _side


def on() -> bool:
    return state["on"]


@app.timer(2.0)
async def watch() -> None:
    global _sampler
    bp = settings.backpressure
    if not bp.categories:
        return
    if _sampler is None:
        from pipeline.api.metrics_lag import LagSampler

        _sampler = LagSampler(await side_client(), app.transport.keys, settings.partitions, min_interval=0.0)
    snap = await _sampler.snapshot(force=True)
    if not snap.ok:
        return  # the broker is away: keep the last decision
    age = oldest_age((t, max(tl.oldest_age, default=0.0)) for t, tl in snap.topics.items())
    new = throttle(state["on"], age, bp.after_s)
    if new != state["on"]:
        log.warning("backpressure %s: the oldest unprocessed entry is %.0f s old (throttled: %s)",
                    "on" if new else "off", age, ", ".join(bp.categories))
    state.update(on=new, age=age)
    metrics.backpressure.set(1.0 if new else 0.0)
    metrics.backlog_age.set(age)
