"""Producer: batches sends into one pipeline round trip per flush, one Lua call
per partition, dense offsets assigned inside the script.

On Redis Cluster the same pipeline is a ``ClusterPipeline``: redis-py splits it
per node and runs the node pipelines concurrently (one round trip per node).
"""

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Mapping  # (isinstance with typing's alias is a few Python calls)
from typing import TYPE_CHECKING, Any, Awaitable, Optional

from faust.transport import producer as base
from faust.types import TP, TopicT
from faust.types.tuples import FutureMessage, RecordMetadata
from mode import Service
from redis.exceptions import NoScriptError, ResponseError

from .client import TRANSIENT_ERRORS
from .cache import cached_tables, flush_tables
from .priority import in_priority_task, priority_topics
from .produce import ProduceBatch, load_produce
from .wire import Wire

if TYPE_CHECKING:
    from . import Transport

__all__ = ["Producer", "ProducerFenced", "normalize_headers", "retry_transient"]

log = logging.getLogger(__name__)

MAX_BATCH = 5000
#: messages handed to the producer and not yet written, past which streams wait
MAX_UNWRITTEN = 20_000


class ProducerFenced(RuntimeError):
    """A changelog write by a worker that no longer owns the partition."""


async def retry_transient(call: Any, what: str, first_delay: float = 0.05, max_delay: float = 2.0) -> Any:
    """``await call()`` until it does not fail with a transient broker error (lost
    connection, server loading), backing off from ``first_delay`` to ``max_delay``."""
    delay = first_delay
    while True:
        try:
            return await call()
        except TRANSIENT_ERRORS as exc:
            log.warning("%s failed (%s); retrying in %.2fs", what, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay)


def normalize_headers(headers: Any) -> list[tuple[str, bytes]]:
    if not headers:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(str(k), v if isinstance(v, bytes) else str(v).encode()) for k, v in items]


class _Queue:
    """Messages handed to the producer and not yet written, for one lane (MAIN or
    PRIORITY, see .priority): each lane is written by its own flush loop, in order."""

    __slots__ = ("pending", "wakeup", "written_cond", "enqueued", "written", "wire")

    def __init__(self) -> None:
        self.pending: list[tuple] = []
        self.wakeup = asyncio.Event()
        self.written_cond = asyncio.Condition()
        self.enqueued = 0  # messages ever handed to send()
        self.written = 0  # of those, written (pending is written in order, front first)
        #: this lane's own connection (.wire), or None: the client's pipelines
        self.wire: Optional[Wire] = None

    async def wait_written(self, target: int) -> None:
        if self.written < target:
            async with self.written_cond:
                await self.written_cond.wait_for(lambda: self.written >= target)


class _Buffer(base.ProducerBuffer):
    """Faust's producer buffer, whose ``wait_until_ebb`` the conductor awaits before
    every delivery: it also holds streams back while too much is unwritten."""

    producer: "Producer"

    async def wait_until_ebb(self) -> None:
        q = self.producer._main
        if q.enqueued - q.written > MAX_UNWRITTEN:
            await q.wait_written(q.enqueued - MAX_UNWRITTEN)
        if self.pending.qsize() > self.max_messages:
            await super().wait_until_ebb()


class Producer(base.Producer):
    transport: "Transport"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.buffer = _Buffer(loop=self.loop, beacon=self.beacon)
        self.buffer.app = self.app
        self.buffer.producer = self

    def __post_init__(self) -> None:
        self._main = _Queue()
        self._priority = _Queue()  # the app's priority topics (.priority)
        self._priority_topics = priority_topics(self.app)

    async def on_start(self) -> None:
        await super().on_start()
        client = await self.transport.client()
        # Loaded once (on every primary of a cluster) and called by EVALSHA: a
        # pipeline holding Script objects would ask SCRIPT EXISTS on every flush,
        # one more round trip each. NOSCRIPT (a restarted server) reloads it (.produce).
        await load_produce(client)
        # each lane its own connection: a priority write never waits for the
        # replies of a main write sent before it on the same socket
        for q in (self._main, self._priority):
            q.wire = Wire.for_client(client)

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
            partition = await self._partition_for(topic, key)
        return self._enqueue(topic, partition, key, value, timestamp, headers)

    async def _partition_for(self, topic: str, key: Optional[bytes]) -> int:
        transport = self.transport
        if transport.partitions_cached(topic) is None:
            # the first send to a topic looks its partitions up: wait out a broker
            # blip here, as the writes do, instead of crashing the sending agent
            await retry_transient(lambda: transport.partitions(topic), f"partitions of {topic}")
        return transport.partition_for(topic, key)

    def _enqueue(
        self,
        topic: str,
        partition: int,
        key: Optional[bytes],
        value: Optional[bytes],
        timestamp: Any,
        headers: Any,
        fut: Any = None,
        soon: Any = None,
    ) -> "asyncio.Future[RecordMetadata]":
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
        # fut False: nobody waits for this message (send_record), only the flush does
        q = self._priority if topic in self._priority_topics or in_priority_task() else self._main
        q.pending.append(
            (topic, partition, key, value, timestamp or time.time(), normalize_headers(headers) if headers else [],
             fut, soon)
        )
        q.enqueued += 1
        q.wakeup.set()
        return fut

    async def send_record(self, topic: str, key: bytes, value: bytes) -> None:
        """Queue one entry of a topic (partitioned by ``key``) without a future for
        its result: what ``send`` does, for senders that never await the write
        (a commit still waits for it: :meth:`flush` counts what was queued). A
        write that fails for good is logged."""
        transport = self.transport
        if transport.partitions_cached(topic) is None:
            partition = await self._partition_for(topic, key)
        else:  # known: no coroutine to make and await per entry
            partition = transport.partition_for(topic, key)
        self._enqueue(topic, partition, key, value, None, None, False)

    def writes_directly(self) -> bool:
        """Whether entries go straight into our batches (:meth:`enqueue_entry`,
        :meth:`send_soon`): not when the app runs Faust's threaded producer."""
        return not self.app.conf.producer_threaded

    def enqueue_entry(self, topic: str, partition: int, key: Optional[bytes], value: Optional[bytes],
                      headers: Any = None) -> "asyncio.Future[RecordMetadata]":
        """Queue one serialized entry for ``partition`` in the next batch, in order
        with ``send``; the future resolves to its metadata once written (the tables'
        changelog writes: pipeline/transport/cache.py)."""
        return self._enqueue(topic, partition, key, value, None, headers)

    def send_soon(self, fut: FutureMessage) -> None:
        """Table changelog writes (and any ``Topic.send_soon``) go straight into the
        next batch, in order with ``send``, and are resolved when it is written.
        Faust's buffer would publish them one task step and one ``wait_for`` each."""
        msg = fut.message
        chan = msg.channel
        topic = chan.get_topic_name() if isinstance(chan, TopicT) else None
        partition = msg.partition
        if topic is None or not self.writes_directly() or (
            partition is None and self.transport.partitions_cached(topic) is None
        ):
            self.buffer.put(fut)  # Faust's path: resolves the topic and partitions first
            return
        if partition is None:
            partition = self.transport.partition_for(topic, msg.key)
        key, value = msg.key, msg.value
        state = self.app.sensors.on_send_initiated(
            self, topic, message=msg, keysize=len(key) if key else 0, valsize=len(value) if value else 0
        )
        self._enqueue(topic, partition, key, value, msg.timestamp, msg.headers, fut, (state,))

    def _resolve(self, item: tuple, md: RecordMetadata) -> None:
        fut, soon = item[6], item[7]
        if fut is False or fut.done():
            return
        fut.set_result(md)
        if soon is not None:  # a FutureMessage: what Faust does once it is sent
            if fut.message.callback:
                fut.message.callback(fut)
            self.app.sensors.on_send_completed(self, soon[0], md)

    def _fail(self, item: tuple, exc: BaseException) -> None:
        fut, soon = item[6], item[7]
        if fut is False:
            log.error("send to %s[%d] failed: %s", item[0], item[1], exc)
            return
        if fut.done():
            return
        fut.set_exception(exc)
        if soon is not None:
            self.app.sensors.on_send_error(self, exc, soon[0])
            log.warning("send to %s failed: %s", fut.message.channel, exc)

    async def send_and_wait(self, *args: Any, **kwargs: Any) -> RecordMetadata:
        return await (await self.send(*args, **kwargs))

    #: flush() sends the tables' cached changes first (.cache)
    flushes_table_caches = True

    async def flush(self) -> None:
        """Until everything sent before this call is written: what the app must have
        durable first (the sinks of the transport hooks: the records of the outcomes sent,
        agents/sink.py), then the table changes cached by then and Faust's buffer,
        then our pending messages up to the current count. It does not wait for messages
        other tasks send meanwhile (a busy worker is never idle: waiting for that
        stalled lanes and commits for seconds).

        The order matters: a table change says work is done (a lane's "done"
        mark, a fired timer removed), so it must not be durable before that work's
        records are, or a crash in between would skip the work on replay and its
        record would never be written."""
        await flush_tables(self.app, cached_tables(self.app))
        while self.buffer.size:
            await self.buffer.flush()
        targets = [(q, q.enqueued) for q in (self._main, self._priority)]
        for q, target in targets:
            await q.wait_written(target)

    async def on_stop(self) -> None:
        # deliver what was accepted before stopping
        for q in (self._priority, self._main):
            if q.pending:
                await self._write_all(q)
        for q in (self._priority, self._main):
            if q.wire is not None:
                await q.wire.aclose()

    @Service.task
    async def _flush_loop(self) -> None:
        await self._flush_queue(self._main)

    @Service.task
    async def _flush_loop_priority(self) -> None:
        await self._flush_queue(self._priority)

    async def _flush_queue(self, q: _Queue) -> None:
        while not self.should_stop:
            await q.wakeup.wait()
            q.wakeup.clear()
            await self._write_all(q)

    async def _write_all(self, q: _Queue) -> None:
        while q.pending:
            batch, q.pending = q.pending[:MAX_BATCH], q.pending[MAX_BATCH:]
            await self._write(batch, q.wire)
            q.written += len(batch)
            async with q.written_cond:
                q.written_cond.notify_all()

    async def _write(self, batch: list[tuple], wire: Optional[Wire] = None) -> None:
        groups: dict[tuple[str, int], list[tuple]] = defaultdict(list)
        for item in batch:
            groups[(item[0], item[1])].append(item)
        delay = 0.05
        while groups:
            try:
                groups = await self._write_groups(groups, wire)
                if not groups:
                    return
                err: Any = "connection lost"
            except TRANSIENT_ERRORS as exc:
                err = exc
            # The pipeline may have partly run: resending is at-least-once.
            log.warning("produce failed (%s); retrying %d partitions in %.2fs", err, len(groups), delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _write_groups(self, groups: dict, wire: Optional[Wire] = None) -> dict:
        transport = self.transport
        keys = transport.keys
        client = await transport.client()
        batch = ProduceBatch(client, keys, wire)
        order = []
        for (topic, partition), items in groups.items():
            token = transport.fence_token(topic, partition)
            if token is None:
                exc = ProducerFenced(f"not the owner of changelog {topic}[{partition}]")
                for item in items:
                    self._fail(item, exc)
                continue
            batch.add(topic, partition, token,
                      [(repr(ts), key, value, headers) for _t, _p, key, value, ts, headers, _f, _s in items])
            order.append(((topic, partition), items))
        if not order:
            return {}
        results = await batch.run()
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
                    self._fail(item, exc)
            elif isinstance(res, BaseException):
                if isinstance(res, TRANSIENT_ERRORS):
                    retry[(topic, partition)] = items
                    continue
                for item in items:
                    self._fail(item, res)
            else:
                base_offset = int(res)
                tp = TP(topic, partition)
                for i, item in enumerate(items):
                    if item[6] is not False:  # send_record's: nobody waits for its metadata
                        self._resolve(item, RecordMetadata(topic, partition, tp, base_offset + i, item[4], 0))
        if reload:
            await load_produce(client)
        return retry
