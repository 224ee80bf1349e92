"""Faust transport for Redis Streams: ``broker="redis://host:port/db"``.

Registered on the ``faust.transports`` entry point as ``redis`` and ``rediss``.
Options go in the URL query string:

    redis://127.0.0.1:6379/0?slots=2&slot=0&lease=10&prefix=nfs&compact=60

``slots``   number of ownership slots N: worker i of N owns partitions p mod N == i
``slot``    preferred slot of this worker (default: any free one)
``lease``   lease time in seconds (heartbeat every lease/3)
``max_slots`` most slots one worker takes over (default N)
``grace``   seconds after start before taking over slots other than the preferred one
``prefix``  key namespace (default ``nfs``)
``compact`` changelog compaction and topic trimming interval in seconds (0 = off)
``tombstones`` seconds a deleted key's tombstone is kept in a changelog (default 600)
``keep``    seconds consumed topic entries are kept once every reader group has
            committed past them (default 600; -1 = never trim)
``members`` ``static`` (default: the leased slots above) or ``dynamic``: members
            join and leave freely, partitions (and table standbys, app setting
            ``table_standby_replicas``) are assigned by Faust's PartitionAssignor
            per group generation (see :mod:`.membership`); ``lease`` is then the
            member lease
``sync``    dynamic members: seconds a member has to revoke and acknowledge a
            new generation before it is expelled (default 3 x lease, at least 5)
"""

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import redis
from aiokafka.partitioner import DefaultPartitioner
from faust.transport import base
from faust.types import TP
from yarl import URL

from .bulkload import read_changelog
from .client import BrokerUnavailable, BrokerURLError, connect, is_cluster, parse_url, public_url, raw_reply
from .consumer import Consumer
from .elastic import ElasticConsumer
from .keys import Keys
from .membership import Membership
from .ownership import SlotLeases
from .producer import Producer, ProducerFenced
from .scripts import DECLARE

__all__ = [
    "Transport",
    "TransportOptions",
    "TopicPartitionsMismatch",
    "BrokerURLError",
    "BrokerUnavailable",
    "ProducerFenced",
]


class TopicPartitionsMismatch(ValueError):
    """A topic exists with a different partition count than declared."""


def _opt(q: Any, name: str, cast: Any, default: Any) -> Any:
    raw = q.get(name)
    if raw is None or raw == "":
        return default
    try:
        return cast(raw)
    except ValueError as exc:
        raise BrokerURLError(f"broker URL option {name}={raw!r} is not a valid {cast.__name__}") from exc


@dataclass(frozen=True)
class TransportOptions:
    slots: int = 1
    slot: Optional[int] = None
    lease_s: float = 10.0
    max_slots: Optional[int] = None
    takeover_grace_s: Optional[float] = None
    prefix: str = "nfs"
    compact_interval_s: float = 60.0
    tombstone_grace_s: float = 600.0
    keep_s: float = 600.0
    members: str = "static"
    sync_s: Optional[float] = None

    @classmethod
    def from_url(cls, url: URL) -> "TransportOptions":
        q = url.query
        opts = cls(
            slots=_opt(q, "slots", int, 1),
            slot=_opt(q, "slot", int, None),
            lease_s=_opt(q, "lease", float, 10.0),
            max_slots=_opt(q, "max_slots", int, None),
            takeover_grace_s=_opt(q, "grace", float, None),
            prefix=q.get("prefix") or "nfs",
            compact_interval_s=_opt(q, "compact", float, 60.0),
            tombstone_grace_s=_opt(q, "tombstones", float, 600.0),
            keep_s=_opt(q, "keep", float, 600.0),
            members=q.get("members") or "static",
            sync_s=_opt(q, "sync", float, None),
        )
        if opts.members not in ("static", "dynamic"):
            raise BrokerURLError(f"broker URL {public_url(url)}: members must be static or dynamic, got {opts.members!r}")
        if opts.members == "dynamic":  # no slots: the group assigns partitions
            opts = dataclasses.replace(opts, slots=1, slot=None, max_slots=None)
        if opts.slots < 1 or (opts.slot is not None and not 0 <= opts.slot < opts.slots):
            raise BrokerURLError(f"broker URL {public_url(url)}: need slots >= 1 and 0 <= slot < slots")
        return opts


#: keys whose partition is remembered, per partition count, before the memo starts over
PARTITION_MEMO = 100_000


class Transport(base.Transport):
    Consumer = Consumer
    Producer = Producer
    driver_version = f"redis-py {redis.__version__}"

    leases: Optional[SlotLeases] = None
    #: set by the elastic consumer (``members=dynamic``)
    membership: Optional[Membership] = None
    #: True once connected to a Redis Cluster (set by :meth:`client`).
    is_cluster: bool = False

    def __init__(self, url: Any, app: Any, loop: Any = None) -> None:
        super().__init__(url, app, loop=loop)
        self.broker_url = parse_url(url)  # a list: Faust splits at ',' (several seed nodes)
        self.options = TransportOptions.from_url(self.broker_url)
        self.keys = Keys(self.options.prefix)
        self._client: Any = None
        self._connecting: Any = None
        self._partitions: dict[str, int] = {}
        #: (how many tables, their changelog topics): is_changelog
        self._changelogs: Optional[tuple[int, set]] = None
        self._retention: dict[str, Optional[float]] = {}
        self.partitioner = app.conf.producer_partitioner or DefaultPartitioner()
        # key → partition, per partition count, for the default partitioner only (a
        # pure function of the key; a custom one may not be): murmur2 costs ~3 µs a
        # key, and a notification's ~6 entries are all keyed by the same user id
        self._by_key: Optional[dict[int, dict[bytes, int]]] = (
            None if app.conf.producer_partitioner else {})

    async def client(self) -> Any:
        if self._client is None:
            import asyncio

            if self._connecting is None:
                self._connecting = asyncio.ensure_future(connect([self.broker_url]))
            try:
                client = await asyncio.shield(self._connecting)
            except BaseException:
                self._connecting = None
                raise
            self.is_cluster = is_cluster(client)
            # the consumer parses XREAD replies itself, without a dict per entry
            client.set_response_callback("XREAD", raw_reply)
            self._client = client
        return self._client

    reader = client

    def create_consumer(self, callback: Any, **kwargs: Any) -> Any:
        cls = ElasticConsumer if self.options.members == "dynamic" else self.Consumer
        return cls(self, callback=callback, loop=self.loop, **kwargs)

    # -- topic metadata ----------------------------------------------------

    async def declare(
        self,
        topic: str,
        partitions: int,
        *,
        retention: Any = None,
        compacting: Optional[bool] = None,
    ) -> int:
        client = await self.client()
        stored = int(await client.eval(DECLARE, 1, self.keys.topics, topic, partitions))
        if stored != partitions:
            raise TopicPartitionsMismatch(
                f"topic {topic!r} exists with {stored} partitions, declared with {partitions}"
            )
        self._partitions[topic] = stored
        if retention:
            seconds = float(getattr(retention, "total_seconds", lambda: retention)())
            await client.hset(f"{self.keys.topics}:retention", topic, seconds)
            self._retention[topic] = seconds
        return stored

    async def partitions(self, topic: str) -> int:
        n = self._partitions.get(topic)
        if n is None:
            client = await self.client()
            raw = await client.hget(self.keys.topics, topic)
            if raw is None:
                return await self.declare(topic, self.app.conf.topic_partitions)
            n = self._partitions[topic] = int(raw)
            ret = await client.hget(f"{self.keys.topics}:retention", topic)
            self._retention[topic] = float(ret) if ret else None
        return n

    def partitions_cached(self, topic: str) -> Optional[int]:
        return self._partitions.get(topic)

    def retention(self, topic: str) -> Optional[float]:
        return self._retention.get(topic)

    def partition_for(self, topic: str, key: Optional[bytes]) -> int:
        """Same mapping as Faust's Kafka default (murmur2 of the key mod N)."""
        n = self._partitions.get(topic) or self.app.conf.topic_partitions
        memo = self._by_key
        if memo is None or type(key) is not bytes:  # a custom partitioner, a random pick (None)
            parts = list(range(n))
            return self.partitioner(key, parts, parts)
        known = memo.get(n)
        if known is None:
            known = memo[n] = {}
        p = known.get(key)
        if p is None:
            if len(known) >= PARTITION_MEMO:
                known.clear()
            parts = list(range(n))
            p = known[key] = self.partitioner(key, parts, parts)
        return p

    async def read_changelog(self, topic: str, partition: int, start: int = 0) -> Any:
        """Chunks of ``(offset, key, value)`` of a partition, for a bulk table
        recovery (:mod:`.bulkload`, used by tables/store.py)."""
        client = await self.client()
        async for chunk in read_changelog(client, self.keys, topic, partition, start):
            yield chunk

    # -- fencing -----------------------------------------------------------

    def is_changelog(self, topic: str) -> bool:
        """Whether ``topic`` is a table's changelog: Faust's answer, a set it builds on
        every call (~1.3 a notification, from the producer), kept until a table is added."""
        tables = self.app.tables
        known = self._changelogs
        if known is None or known[0] != len(tables):
            known = self._changelogs = (len(tables), tables.changelog_topics)
        return topic in known[1]

    def fence_token(self, topic: str, partition: int) -> Optional[str]:
        """'' for unfenced topics; the owner token for changelogs; None if not ours."""
        if not self.is_changelog(topic):
            return ""
        if self.membership is not None:
            return self.membership.token_for(TP(topic, partition))
        if self.leases is None:
            return None
        return self.leases.token_for(partition)

    def on_fenced(self, topic: str, partition: int) -> None:
        consumer = getattr(self.app, "_consumer", None)
        if consumer is not None:
            consumer.on_fenced(partition)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
