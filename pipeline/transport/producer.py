"""Producer: batches sends into one pipeline round trip per flush, one Lua call
per partition, dense offsets assigned inside the script.

On Redis Cluster the same pipeline is a ``ClusterPipeline``: redis-py splits it
per node and runs the node pipelines concurrently (one round trip per node).
"""

import asyncio
import logging
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Awaitable, Mapping, Optional

from faust.transport import producer as base
from faust.types import TP
from faust.types.tuples import RecordMetadata
from mode import Service
from redis.exceptions import NoScriptError, ResponseError

from .client import TRANSIENT_ERRORS
from .scripts import PRODUCE

if TYPE_CHECKING:
    from . import Transport

__all__ = ["Producer", "ProducerFenced", "normalize_headers"]

log = logging.getLogger(__name__)

MAX_BATCH = 5000


class ProducerFenced(RuntimeError):
    """A changelog write by a worker that no longer owns the partition."""


def normalize_headers(headers: Any) -> list[tuple[str, bytes]]:
    if not headers:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(str(k), v if isinstance(v, bytes) else str(v).encode()) for k, v in items]


class Producer(base.Producer):
    transport: "Transport"

    def __post_init__(self) -> None:
        self._pending: list[tuple] = []
        self._wakeup = asyncio.Event()
        self._written_cond = asyncio.Condition()
        self._enqueued = 0  # messages ever handed to send()
        self._written = 0  # of those, written (pending is written in order, front first)
        self._script: Any = None

    async def on_start(self) -> None:
        await super().on_start()
        client = await self.transport.client()
        self._script = client.register_script(PRODUCE)
        # Loaded once (on every primary of a cluster) and called by EVALSHA: a
        # pipeline holding Script objects would ask SCRIPT EXISTS on every flush,
        # one more round trip each. NOSCRIPT (a restarted server) reloads it.
        await client.script_load(PRODUCE)

    def supports_headers(self) -> bool:
        return True

    def key_partition(self, topic: str, key: bytes) -> TP:
        return TP(topic, self.transport.partition_for(topic, key))

    async def create_topic(self, topic: str, partitions: int, replication: int, **kwargs: Any) -> None:
        await self.transport.declare(
            topic, partitions, retention=kwargs.get("retention"), compacting=kwargs.get("compacting")
        )

    async def send(
        self,
        topic: str,
        key: Optional[bytes],
        value: Optional[bytes],
        partition: Optional[int],
        timestamp: Optional[float],
        headers: Any,
        *,
        transactional_id: Optional[str] = None,
    ) -> Awaitable[RecordMetadata]:
        if partition is None:
            if self.transport.partitions_cached(topic) is None:
                await self.transport.partitions(topic)
            partition = self.transport.partition_for(topic, key)
        fut = asyncio.get_running_loop().create_future()
        self._pending.append(
            (topic, partition, key, value, timestamp or time.time(), normalize_headers(headers), fut)
        )
        self._enqueued += 1
        self._wakeup.set()
        return fut

    async def send_and_wait(self, *args: Any, **kwargs: Any) -> RecordMetadata:
        return await (await self.send(*args, **kwargs))

    async def flush(self) -> None:
        """Until everything sent before this call is written: Faust's buffer (table
        changes) first, then our pending messages up to the current count. It does
        not wait for messages other tasks send meanwhile (a busy worker is never
        idle: waiting for that stalled lanes and commits for seconds)."""
        while self.buffer.size:
            await self.buffer.flush()
        target = self._enqueued
        if self._written < target:
            async with self._written_cond:
                await self._written_cond.wait_for(lambda: self._written >= target)

    async def on_stop(self) -> None:
        # deliver what was accepted before stopping
        if self._pending:
            await self._write_all()

    @Service.task
    async def _flush_loop(self) -> None:
        while not self.should_stop:
            await self._wakeup.wait()
            self._wakeup.clear()
            await self._write_all()

    async def _write_all(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            await self._write(batch)
            self._written += len(batch)
            async with self._written_cond:
                self._written_cond.notify_all()

    async def _write(self, batch: list[tuple]) -> None:
        groups: dict[tuple[str, int], list[tuple]] = defaultdict(list)
        for item in batch:
            groups[(item[0], item[1])].append(item)
        delay = 0.05
        while groups:
            try:
                groups = await self._write_groups(groups)
                if not groups:
                    return
                err: Any = "connection lost"
            except TRANSIENT_ERRORS as exc:
                err = exc
            # The pipeline may have partly run: resending is at-least-once.
            log.warning("produce failed (%s); retrying %d partitions in %.2fs", err, len(groups), delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _write_groups(self, groups: dict) -> dict:
        transport = self.transport
        keys = transport.keys
        client = await transport.client()
        pipe = client.pipeline(transaction=False)
        order = []
        for (topic, partition), items in groups.items():
            token = transport.fence_token(topic, partition)
            if token is None:
                exc = ProducerFenced(f"not the owner of changelog {topic}[{partition}]")
                for item in items:
                    if not item[6].done():
                        item[6].set_exception(exc)
                continue
            args: list[Any] = [token, len(items)]
            for _t, _p, key, value, ts, headers, _f in items:
                flags = (key is not None) | ((value is not None) << 1)
                args += [repr(ts), flags, key or b"", value or b"", len(headers)]
                for name, hv in headers:
                    args += [name, hv]
            skeys = [keys.stream(topic, partition), keys.counter(topic, partition), keys.fence(topic, partition)]
            # Not Script.__call__: it awaits the queued command, and awaiting a
            # ClusterPipeline re-initializes it (empties its queue); nor
            # pipe.evalsha, which ClusterPipeline blocks. On a cluster the slot
            # comes from the keys (all under one hash tag).
            pipe.execute_command("EVALSHA", self._script.sha, len(skeys), *skeys, *args)
            order.append(((topic, partition), items))
        if not order:
            return {}
        results = await pipe.execute(raise_on_error=False)
        retry: dict = {}
        reload = False
        for ((topic, partition), items), res in zip(order, results):
            if isinstance(res, NoScriptError):
                # e.g. a cluster node restarted or failed over: the script did not run
                reload = True
                retry[(topic, partition)] = items
            elif isinstance(res, ResponseError) and str(res).startswith("FENCED"):
                exc = ProducerFenced(f"changelog {topic}[{partition}] is fenced: {res}")
                transport.on_fenced(topic, partition)
                for item in items:
                    if not item[6].done():
                        item[6].set_exception(exc)
            elif isinstance(res, BaseException):
                if isinstance(res, TRANSIENT_ERRORS):
                    retry[(topic, partition)] = items
                    continue
                for item in items:
                    if not item[6].done():
                        item[6].set_exception(res)
            else:
                base_offset = int(res)
                tp = TP(topic, partition)
                for i, item in enumerate(items):
                    fut = item[6]
                    if not fut.done():
                        fut.set_result(RecordMetadata(topic, partition, tp, base_offset + i, item[4], 0))
        if reload:
            await client.script_load(PRODUCE)
        return retry
