"""backpressure: how far behind the pipeline is, read every 2 s from the same
lag the status page shows (the oldest unprocessed entry of every lane and
intents topic); the guard throttles the categories of ``[backpressure]`` while
it is on (rules: pipeline/rules/backpressure.py)."""

import logging
from typing import Any

from pipeline import metrics
from pipeline.lag import read_lags
from pipeline.rules.backpressure import oldest_age, throttle

__all__ = ["Pressure", "register"]

log = logging.getLogger("notify.backpressure")


class Pressure:
    """The throttle's state in this worker, and the age it was decided on."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state = {"on": False, "age": 0.0}

    def on(self) -> bool:
        return self.state["on"]

    async def watch(self) -> None:
        app, bp = self.app, self.app.settings.backpressure
        if not bp.categories:
            return
        try:
            lags = await read_lags(await app.resources.side_client(), app.transport.keys, app.settings.partitions)
        except Exception as exc:  # noqa: BLE001 - the broker is away: keep the last decision
            log.debug("backpressure: lag not read (%s)", exc)
            return
        age = oldest_age((t, max(tl.oldest_age, default=0.0)) for t, tl in lags.items())
        new = throttle(self.state["on"], age, bp.after_s)
        if new != self.state["on"]:
            log.warning("backpressure %s: the oldest unprocessed entry is %.0f s old (throttled: %s)",
                        "on" if new else "off", age, ", ".join(bp.categories))
        self.state.update(on=new, age=age)
        metrics.backpressure.set(1.0 if new else 0.0)
        metrics.backlog_age.set(age)


def register(app: Any) -> Pressure:
    pressure = Pressure(app)
    app.timer(2.0, name="backpressure.watch")(pressure.watch)
    return pressure
