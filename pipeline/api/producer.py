"""Writing to topics from the API, without a Faust worker.

The API appends with the transport's own Lua ``PRODUCE`` script, called the
transport's way (:mod:`pipeline.transport.produce`): one call per topic-partition, dense
offsets assigned inside the script, ``''`` as the fencing token (these topics
are not changelogs). Keys are partitioned exactly like the Faust producer
(``aiokafka``'s ``DefaultPartitioner``: murmur2 of the key bytes mod N), so a
user's preferences land on the partition that holds the user's tables.

A batch is one pipeline round trip whatever its size. A write either returns
the offsets (the messages are in the streams: "accepted") or raises; a
transient broker error may leave part of a pipeline applied, so a retry is
at-least-once (the pipeline's ids and dedup make a re-sent event harmless).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Iterable, Optional, Sequence

from aiokafka.partitioner import DefaultPartitioner

from pipeline.transport.client import TRANSIENT_ERRORS
from pipeline.transport.keys import Keys
from pipeline.transport.produce import ProduceBatch, script_missing
from pipeline.transport.scripts import DECLARE
from pipeline.transport.wire import Wire

__all__ = ["TopicWriter", "Message", "ProduceError"]

#: (topic, key, value, headers)
Message = tuple[str, bytes, bytes, Sequence[tuple[str, bytes]]]


class ProduceError(RuntimeError):
    """The broker refused a write (not a connection problem)."""


class TopicWriter:
    def __init__(self, client: Any, keys: Keys, partitions: int, wire: Optional[Wire] = None) -> None:
        self.client = client
        self.keys = keys
        #: the writes' connection (pipeline/transport/wire.py), or None: the client's pipelines
        self.wire = wire
        self.default_partitions = partitions
        self._partitioner = DefaultPartitioner()
        self._counts: dict[str, int] = {}

    async def partitions(self, topic: str) -> int:
        """The topic's partition count: as declared in ``<ns>:topics``, declaring it
        with ``settings.partitions`` if nobody did yet (the same idempotent
        ``DECLARE`` the workers run)."""
        n = self._counts.get(topic)
        if n is None:
            n = int(await self.client.eval(DECLARE, 1, self.keys.topics, topic, self.default_partitions))
            self._counts[topic] = n
        return n

    def partition_for(self, key: bytes, n: int) -> int:
        parts = list(range(n))
        return self._partitioner(key, parts, parts)

    async def send(self, messages: Iterable[Message]) -> list[tuple[str, int, int]]:
        """Append every message; returns ``(topic, partition, offset)`` per message,
        in order. One pipeline round trip (plus one the first time a topic is seen,
        and a ``SCRIPT LOAD`` and a second one when a node did not hold the script)."""
        msgs = list(messages)
        if not msgs:
            return []
        groups: dict[tuple[str, int], list[int]] = defaultdict(list)
        for i, (topic, key, _v, _h) in enumerate(msgs):
            n = self._counts.get(topic) or await self.partitions(topic)
            groups[(topic, self.partition_for(key, n))].append(i)
        ts = repr(time.time())
        batch = ProduceBatch(self.client, self.keys, self.wire)
        for (topic, partition), idx in groups.items():
            # '' as the token: these topics are not changelogs
            batch.add(topic, partition, "", [(ts, msgs[i][1], msgs[i][2], msgs[i][3]) for i in idx])
        results = await batch.run()
        out: list[Optional[tuple[str, int, int]]] = [None] * len(msgs)
        missing = []
        for ((topic, partition), idx), res in zip(groups.items(), results):
            if script_missing(res):  # even once loaded again (.produce)
                missing.append((topic, partition))
                continue
            if isinstance(res, TRANSIENT_ERRORS):
                raise res
            if isinstance(res, BaseException):
                raise ProduceError(f"write to {topic}[{partition}] refused: {res}")
            base = int(res)
            for j, i in enumerate(idx):
                out[i] = (topic, partition, base + j)
        if missing:
            raise ProduceError(f"script not loaded on the node of {sorted(missing)}")
        return out  # type: ignore[return-value]
