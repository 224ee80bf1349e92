"""Sending what the rules decided: outcomes, timers, dead letters, lane deliveries."""

from typing import Any, Callable, Iterable, Optional

from pipeline import clock, metrics
from pipeline.entries import send_dead_letter
from pipeline.models import Delivery, Outcome, Timer
from pipeline.rules.slo import first_terminal
from pipeline.topics import TIMERS, TIMERS_HIGH, timers_for

__all__ = ["Emit"]


class Emit:
    """What every agent of one app sends through: the app's topics, its producer,
    and its record sink (agents/sink.py) for the outcomes."""

    def __init__(self, app: Any, records: Any) -> None:
        self.app = app
        self.records = records
        t = app.declared
        self.outcomes_topic, self.dlq_topic = t.outcomes, t.dlq
        self.outcomes_name = t.outcomes.get_topic_name()
        #: pipeline/topics.py timers_for's name → the topic
        self.timer_topics = {TIMERS: t.timers, TIMERS_HIGH: t.timers_high}
        self.callbacks_topic = t.callbacks
        #: several outcomes of one user in one entry (``outcome_entries``)
        self.grouped = app.settings.outcome_entries == "grouped"
        self.lane_topics = t.lanes
        #: hands a delivery to its lane on this worker (agents/lanes.py ``Lanes.offer``);
        #: False: through the lane's topic
        self.handoff: Optional[Callable[[Delivery], bool]] = None

    async def send(self, topic: Any, key: str, value: Any) -> None:
        """``await topic.send(key=key, value=value)`` for a topic keyed by text with a
        record value, handed straight to the producer: the same entry (key UTF-8,
        value the record's JSON), partitioned and queued by the same producer and
        written before the next commit (pipeline/transport/producer.py
        ``send_record``), without Faust's objects per send (message, future
        message, schema and sensor calls) nor a future for the result, which no
        sender here awaited. The hops' sends go through here."""
        await self.app.producer.send_record(topic.get_topic_name(), key.encode(), value.dumps())

    async def outcomes(self, items: Iterable[Outcome]) -> None:
        """Publish on notify.outcomes, and write the records (agents/sink.py). The
        outcomes of one user in ``items`` (one step's: an intent's plan on its
        channels) go out as one entry, a JSON array, unless ``outcome_entries`` is
        "single" (docs/SCHEMA.md). A change its producer hears of (``callback``: its
        event has a callback target) is sent on notify.callbacks too, one an entry,
        the one stream the callbacks agent reads: the outcomes of events without one
        are never read back."""
        items = list(items)
        send = self.app.producer.send_record
        topic = self.outcomes_name
        by_user: dict[str, list[bytes]] = {}
        for o in items:
            metrics.outcomes_of(o.state, o.reason or "").inc()
            if o.latency_ms and first_terminal(o):
                metrics.to_terminal_of(o.priority).observe(o.latency_ms / 1000.0)
            data = o.dumps()
            if self.grouped:
                by_user.setdefault(o.user_id, []).append(data)
            else:
                await send(topic, o.user_id.encode(), data)
            if o.callback:
                await send(self.callbacks_topic.get_topic_name(), o.user_id.encode(), data)
        for user, datas in by_user.items():
            await send(topic, user.encode(), datas[0] if len(datas) == 1 else b"[" + b",".join(datas) + b"]")
        if items:
            await self.records.add(items)

    async def timer(self, user_id: str, t: Timer) -> None:
        """Hold ``t`` on its timer topic: notify.timers.high for a high-priority
        delivery's or intent's (its payload's ``priority``), else notify.timers."""
        await self.send(self.timer_topics[timers_for(t.payload.get("priority"))], user_id, t)

    async def retry(self, d: Delivery) -> None:
        """Schedule ``d`` on the timer topic for ``d.due_at``."""
        await self.timer(d.user_id, Timer(timer_id=f"{d.delivery_id}:{d.attempt}:{d.reconcile_round}",
                                          due_at=d.due_at or clock.now(), kind="delivery", payload=d.asdict()))

    async def deliver(self, d: Delivery) -> None:
        """To the delivery's lane: in memory when the lane runs here and has room
        (agents/handoff.py), else through its topic."""
        if self.handoff is not None and self.handoff(d):
            return
        await self.send(self.lane_topics[(d.channel, d.priority)], d.user_id, d)

    async def dead_letter(self, source: str, reason: str, payload: bytes | str, *, detail: Optional[str] = None,
                          key: Any = None, partition: Optional[int] = None, offset: Optional[int] = None) -> None:
        """Send a dead letter (``partition``/``offset``: where the entry was, if from a stream)."""
        await send_dead_letter(self.dlq_topic, source, reason, payload, detail=detail, key=key,
                               partition=partition, offset=offset)

    async def refused_record(self, o: Outcome, why: str) -> None:
        """An outcome the record store refused: dead-lettered (the sink's ``on_refused``)."""
        await self.dead_letter("records", "invalid_outcome", o.dumps(), detail=why, key=o.delivery_id)
