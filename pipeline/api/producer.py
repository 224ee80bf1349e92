"""Writing to topics from the API, without a Faust worker.

The API appends with the transport's own Lua ``PRODUCE`` script
(:mod:`pipeline.transport.scripts`): one call per topic-partition, dense
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
from redis.exceptions import NoScriptError

from pipeline.transport.client import TRANSIENT_ERRORS, is_cluster
from pipeline.transport.keys import Keys
from pipeline.transport.scripts import DECLARE, PRODUCE

__all__ = ["TopicWriter", "Message", "ProduceError"]

#: (topic, key, value, headers)
Message = tuple[str, bytes, bytes, Sequence[tuple[str, bytes]]]


class ProduceError(RuntimeError):
    """The broker refused a write (not a connection problem)."""


class TopicWriter:
    def __init__(self, client: Any, keys: Keys, partitions: int) -> None:
        self.client = client
        self.keys = keys
        self.default_partitions = partitions
        self._partitioner = DefaultPartitioner()
        self._counts: dict[str, int] = {}
        self._cluster = is_cluster(client)
        self._script = client.register_script(PRODUCE)
        self._loaded = False

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
        in order. One pipeline round trip (plus one the first time a topic is seen)."""
        msgs = list(messages)
        if not msgs:
            return []
        if self._cluster and not self._loaded:
            await self.client.script_load(PRODUCE)
            self._loaded = True
        groups: dict[tuple[str, int], list[int]] = defaultdict(list)
        for i, (topic, key, _v, _h) in enumerate(msgs):
            n = self._counts.get(topic) or await self.partitions(topic)
            groups[(topic, self.partition_for(key, n))].append(i)
        ts = repr(time.time())
        out: list[Optional[tuple[str, int, int]]] = [None] * len(msgs)
        for attempt in range(2):
            missing = await self._run(msgs, groups, ts, out)
            if not missing:
                return out  # type: ignore[return-value]
            # a restarted or failed-over node lost the script: those calls did not run
            await self.client.script_load(PRODUCE)
            groups = {tp: groups[tp] for tp in missing}
        raise ProduceError(f"script not loaded on the node of {sorted(groups)}")

    async def _run(self, msgs: list[Message], groups: dict[tuple[str, int], list[int]], ts: str,
                   out: list[Optional[tuple[str, int, int]]]) -> list[tuple[str, int]]:
        pipe = self.client.pipeline(transaction=False)
        order = []
        for (topic, partition), idx in groups.items():
            args: list[Any] = ["", len(idx)]
            for i in idx:
                _t, key, value, headers = msgs[i]
                args += [ts, 3, key, value, len(headers)]  # flags 3: key and value present
                for name, hv in headers:
                    args += [name, hv]
            skeys = [self.keys.stream(topic, partition), self.keys.counter(topic, partition),
                     self.keys.fence(topic, partition)]
            if self._cluster:
                # see pipeline/transport/producer.py: not Script.__call__ on a ClusterPipeline
                pipe.execute_command("EVALSHA", self._script.sha, len(skeys), *skeys, *args)
            else:
                await self._script(keys=skeys, args=args, client=pipe)
            order.append((topic, partition, idx))
        results = await pipe.execute(raise_on_error=False)
        missing = []
        for (topic, partition, idx), res in zip(order, results):
            if isinstance(res, NoScriptError):
                missing.append((topic, partition))
            elif isinstance(res, TRANSIENT_ERRORS):
                raise res
            elif isinstance(res, BaseException):
                raise ProduceError(f"write to {topic}[{partition}] refused: {res}")
            else:
                base = int(res)
                for j, i in enumerate(idx):
                    out[i] = (topic, partition, base + j)
        return missing
