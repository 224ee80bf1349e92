"""Consumer lag read from the broker, written once: ``notify status``
(pipeline/cli/status.py), the API's ``/metrics`` and status page
(pipeline/api/metrics_lag.py) and the backpressure timer read it here.

For a consumer group (``notify`` by default), every topic and partition:

* highwater: ``GET <ns>:{<topic>|<p>}:n`` (the next offset to assign);
* committed: ``HMGET <ns>:{g|<group>}:offsets "<topic>|<p>"`` (the next offset the
  group will read); a topic the groups take turns on (pipeline/roles.py
  ``offset_peers``: the priority path, read by ``notify-priority`` when that
  process runs) is as far as the furthest of them, as the consumer starts it
  (pipeline/transport/consumer.py ``_handed_over``);
* lag = highwater − committed; the age of the oldest unprocessed entry is now −
  the ``t`` field of the entry at the committed offset
  (``XRANGE <stream> <committed>-1 + COUNT 1``).

Every command names one key, so one hash slot: the reads are pipelines of such
commands, which run on a single Redis and on a Redis Cluster alike (redis-py
sends each node the commands of its slots). The functions take an asyncio client
(``redis.asyncio.Redis`` or ``RedisCluster``: pipeline/transport/client.py
``connect``); :func:`read_positions_sync` the synchronous one (``sync_client``).
A value another writer left that is not a number reads as ``None``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from pipeline import topics as T
from pipeline.roles import app_id, offset_peers
from pipeline.transport import committed
from pipeline.transport.keys import Keys

__all__ = ["GROUP", "PEERS", "TopicLag", "Positions", "agent_of", "as_int", "declared_partitions", "read_positions",
           "read_positions_sync", "oldest_ages", "topic_lags", "read_lags"]

TP = tuple[str, int]

GROUP = app_id("main")  # the Faust app id = consumer group
#: topic -> the group that reads it instead of GROUP when the high-priority path
#: runs in a process of its own (NOTIFY_ROLE=priority, pipeline/roles.py)
PEERS = offset_peers("main")


def as_int(v: Any) -> Optional[int]:
    """A counter or offset as Redis holds it: missing is 0, not a number is ``None``."""
    try:
        return int(v or 0)
    except (TypeError, ValueError):
        return None


def agent_of(topic: str) -> str:
    """The agent reading ``topic`` ('' when none: pipeline/topics.py UNREAD)."""
    if topic.startswith("notify.send."):
        return "lane." + topic[len("notify.send."):]
    if topic.startswith(T.INTENTS + "."):
        return "guard." + topic[len(T.INTENTS) + 1:]
    return {
        T.EVENTS: "expand",
        T.EVENTS_HIGH: "expand.high",
        T.INTENTS: "guard",
        T.TIMERS: "scheduler",
        T.TIMERS_HIGH: "scheduler.high",
        T.RECEIPTS: "receipts",
        T.PREFERENCES: "preferences",
        T.DEVICES: "devices",
    }.get(topic, "")


@dataclass
class TopicLag:
    topic: str
    agent: str
    highwater: list[int]
    committed: list[int]
    #: per partition: age (s) of the oldest unprocessed message; 0 if none
    oldest_age: list[float]
    #: messages/s consumed over the rate window (None until two snapshots)
    rate: Optional[float] = None

    @property
    def lag(self) -> int:
        return sum(max(0, h - c) for h, c in zip(self.highwater, self.committed))

    def as_dict(self) -> dict[str, Any]:
        lag = self.lag
        rate = self.rate
        if lag == 0:
            drain: Optional[float] = 0.0
        elif rate and rate > 0:
            drain = lag / rate
        else:
            drain = None  # not draining (or not measured yet)
        return {
            "topic": self.topic,
            "agent": self.agent,
            "partitions": len(self.highwater),
            "highwater": sum(self.highwater),
            "committed": sum(self.committed),
            "lag": lag,
            "oldest_age_s": round(max(self.oldest_age, default=0.0), 3),
            "rate_per_s": None if rate is None else round(rate, 2),
            "drain_s": None if drain is None else round(drain, 1),
        }


@dataclass
class Positions:
    """Highwater and committed offsets of a group, per topic-partition, as read."""

    group: str
    #: topic -> partitions read
    counts: dict[str, int]
    highwater: dict[TP, Optional[int]]
    #: group (``group`` and its peers) -> topic-partition -> committed offset (0 when none)
    offsets: dict[str, dict[TP, Optional[int]]]

    def order(self) -> list[TP]:
        return [(t, p) for t, n in self.counts.items() for p in range(n)]

    def readers(self, topic: str) -> tuple[str, ...]:
        return (self.group, *(g for g in PEERS.get(topic, ()) if g != self.group))

    def committed(self, tp: TP, bad: Optional[int] = None) -> Optional[int]:
        """The furthest committed offset of the groups reading ``tp``'s topic; a value
        that is not a number counts as ``bad`` (``None``: the result is ``None``)."""
        got = [self.offsets[g].get(tp, 0) for g in self.readers(tp[0])]
        got = [bad if v is None else v for v in got]
        return None if None in got else max(got)


async def declared_partitions(client: Any, keys: Keys, default: int, topics: Iterable[str] = T.ALL) -> dict[str, int]:
    """topic -> partitions, as declared (``<ns>:topics``), else ``default``, for the
    pipeline topics (changelogs are read only at recovery)."""
    topics = list(topics)
    raw = await client.hgetall(keys.topics)
    out = {}
    for k, v in raw.items():
        name = k.decode() if isinstance(k, bytes) else str(k)
        if name in topics:
            out[name] = as_int(v) or default
    return {name: out.get(name, default) for name in topics}


def _positions_commands(keys: Keys, counts: dict[str, int], group: str,
                        also: list[tuple[str, tuple]]) -> tuple[list[tuple[str, tuple]], Any]:
    """The commands of one round trip reading ``counts``' positions, and the function
    turning their replies into (:class:`Positions`, the replies of ``also``)."""
    groups = [group, *sorted({g for gs in PEERS.values() for g in gs} - {group})]
    order = [(t, p) for t, n in counts.items() for p in range(n)]
    reads = [committed.commands(keys, g, order) for g in groups]
    commands = [c for cmds, _parse in reads for c in cmds]
    commands += [("get", (keys.counter(t, p),)) for t, p in order]
    commands += also

    def parse(replies: list) -> tuple[Positions, list]:
        res = iter(replies)
        offsets = {g: {tp: as_int(v) for tp, v in zip(order, read(res))} for g, (_c, read) in zip(groups, reads)}
        highwater = {tp: as_int(next(res)) for tp in order}
        return Positions(group, dict(counts), highwater, offsets), list(res)

    return commands, parse


async def read_positions(client: Any, keys: Keys, counts: dict[str, int], group: str = GROUP,
                         also: Iterable[tuple[str, tuple]] = ()) -> tuple[Positions, list]:
    """Highwater and committed offsets of ``counts``' partitions (topic -> partitions)
    in one pipeline round trip; ``also``: more commands (name, args) for the same
    round trip, whose replies come back as the second item."""
    commands, parse = _positions_commands(keys, counts, group, list(also))
    return parse(await committed.pipeline_of(client, commands).execute())


def read_positions_sync(client: Any, keys: Keys, counts: dict[str, int], group: str = GROUP,
                        also: Iterable[tuple[str, tuple]] = ()) -> tuple[Positions, list]:
    """:func:`read_positions` with a synchronous client (``notify status``:
    pipeline/transport/client.py ``sync_client``)."""
    commands, parse = _positions_commands(keys, counts, group, list(also))
    return parse(committed.pipeline_of(client, commands).execute())


async def oldest_ages(client: Any, keys: Keys, lagging: dict[TP, int], now: Optional[float] = None) -> dict[TP, float]:
    """Age (s) of the entry at the committed offset of each lagging partition
    (``lagging``: topic-partition -> committed offset), from its ``t`` field; 0 when
    it has none. Partitions whose entry is gone are left out."""
    now = time.time() if now is None else now
    ages: dict[TP, float] = {}
    if not lagging:
        return ages
    pipe = committed.pipeline_of(client, [("xrange", (keys.stream(topic, p), b"%d-1" % cm, "+", 1))
                              for (topic, p), cm in lagging.items()])
    for tp, entries in zip(lagging, await pipe.execute()):
        if entries:
            fields = entries[0][1]
            t = fields.get(b"t") if isinstance(fields, dict) else None
            try:
                ages[tp] = max(0.0, now - float(t)) if t is not None else 0.0
            except ValueError:
                ages[tp] = 0.0
    return ages


async def topic_lags(client: Any, keys: Keys, positions: Positions, now: Optional[float] = None) -> dict[str, TopicLag]:
    """Per topic of ``positions``: highwater, committed (a value that is not a number
    as 0) and the oldest unprocessed entry's age of every partition."""
    hw = {tp: v or 0 for tp, v in positions.highwater.items()}
    cm = {tp: positions.committed(tp, bad=0) or 0 for tp in positions.order()}
    lagging = {tp: cm[tp] for tp in positions.order() if hw[tp] > cm[tp] and tp[0] not in T.UNREAD}
    ages = await oldest_ages(client, keys, lagging, now)
    return {topic: TopicLag(topic=topic, agent=agent_of(topic), highwater=[hw[(topic, p)] for p in range(n)],
                            committed=[cm[(topic, p)] for p in range(n)],
                            oldest_age=[ages.get((topic, p), 0.0) for p in range(n)])
            for topic, n in positions.counts.items()}


async def read_lags(client: Any, keys: Keys, partitions: int, group: str = GROUP,
                    now: Optional[float] = None) -> dict[str, TopicLag]:
    """The lag of every pipeline topic (pipeline/topics.py ALL, partitions as
    declared, else ``partitions``) for ``group``: two or three round trips. Raises
    what the client raises when the broker does not answer."""
    now = time.time() if now is None else now
    counts = await declared_partitions(client, keys, partitions)
    positions, _ = await read_positions(client, keys, counts, group)
    return await topic_lags(client, keys, positions, now)
