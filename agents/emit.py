"""Sending what the rules decided: outcomes, timers, dead letters, lane deliveries."""

import time
from typing import Iterable, Optional

from pipeline import clock, metrics
from pipeline.app import dlq_topic, lane_topics, outcomes_topic, timers_topic
from pipeline.models import DeadLetter, Delivery, Outcome, Timer


async def outcomes(items: Iterable[Outcome]) -> None:
    for o in items:
        metrics.outcomes.labels(o.state, o.reason or "").inc()
        await outcomes_topic.send(key=o.user_id, value=o)


async def timer(user_id: str, t: Timer) -> None:
    await timers_topic.send(key=user_id, value=t)


async def retry(d: Delivery) -> None:
    """Schedule ``d`` on the timer topic for ``d.due_at``."""
    await timer(d.user_id, Timer(timer_id=f"{d.delivery_id}:{d.attempt}:{d.reconcile_round}",
                                 due_at=d.due_at or clock.now(), kind="delivery", payload=d.asdict()))


async def deliver(d: Delivery) -> None:
    await lane_topics[(d.channel, d.priority)].send(key=d.user_id, value=d)


async def dead_letter(source: str, reason: str, payload: bytes | str, *, detail: Optional[str] = None,
                      key: Optional[str] = None) -> None:
    metrics.dead_letters.labels(source, reason).inc()
    text = payload.decode("utf-8", "replace") if isinstance(payload, (bytes, bytearray)) else payload
    await dlq_topic.send(key=key or source, value=DeadLetter(source=source, reason=reason, at=time.time(),
                                                            payload=text[:65536], detail=detail, key=key))
