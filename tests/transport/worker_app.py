"""A small Faust app used by the transport tests, run as a real worker process.

Agent ``numbers``: for every message (key k, value v) appends
"<partition>:<offset>:<v>" to the Redis list ``seen`` and adds 1 to table
``counts[k]``.  Agent ``ops``: applies {"op": "set"|"del", "k", "v"} to table
``kv``; an op "dump" writes the worker's view of ``kv`` to the hash
``dump:<partition>`` (sent to every partition by the test).

An op may carry "i" (an event number): it is added to the Redis set
``ops-seen`` once applied (the elastic scale test checks every event was processed).

Agents ``backlog`` and ``urgent`` (topics of the same names): each appends the
message's value to the Redis list of its topic's name; ``backlog`` then sleeps
SLOW_BACKLOG seconds, ``urgent`` also records how many backlog messages were done
by then. With PRIORITY=1, ``urgent`` is a priority topic (the hooks' priority_topics,
pipeline/transport/priority.py); PRIORITY=<topic>,... names the priority topics.

Agent ``batched`` (topic ``batched``): takes batches with pipeline/take.py
``take_ready`` (at most TAKE_MAX, default 5) and appends each batch's values,
comma-joined, to the Redis list ``batches``.

Environment: BROKER (URL), PARTITIONS, APP_ID, SLOW (seconds per message),
SLOW_SEEK (seconds Faust's seek at the end of each recovery waits before it
reads the committed offsets, as on a loaded broker: the fetcher runs meanwhile),
DROP (``<topic>:<partition>:<offset>``: the first delivery of that entry never
reaches its stream) and REREAD_S (the consumer's ``REREAD_AFTER_S`` then),
STANDBYS (``table_standby_replicas``, Faust's default 1), BUFFER
(``stream_buffer_maxsize``), SLOW_BACKLOG, PRIORITY, WRITTEN (``app.trim_written``).
"""

import asyncio
import os

import faust
import redis.asyncio as aioredis

from pipeline.transport.cache import CachedTable
from pipeline.transport.hooks import TransportHooks

BROKER = os.environ["BROKER"]
PARTITIONS = int(os.environ.get("PARTITIONS", "4"))
SLOW = float(os.environ.get("SLOW", "0"))
DATA = os.environ.get("DATA_URL", BROKER.split("?")[0])

app = faust.App(
    os.environ.get("APP_ID", "t"),
    broker=BROKER,
    store="memory-ordered://",
    topic_partitions=PARTITIONS,
    web_enabled=False,
    broker_commit_interval=0.5,
    datadir=os.environ.get("DATADIR", "/tmp/notify-test-worker"),
    Table=CachedTable,  # as the notify app (pipeline/app.py)
    **({"table_standby_replicas": int(os.environ["STANDBYS"])} if os.environ.get("STANDBYS") else {}),
    **({"stream_buffer_maxsize": int(os.environ["BUFFER"])} if os.environ.get("BUFFER") else {}),
)
# a plain Faust app: what the transport needs beyond Faust's settings comes through
# the typed hooks (pipeline/transport/hooks.py), set before the worker starts
hooks = TransportHooks()
if os.environ.get("PRIORITY"):  # "1": urgent; else the topics named
    hooks.priority_topics = frozenset(["urgent"] if os.environ["PRIORITY"] == "1" else os.environ["PRIORITY"].split(","))
if os.environ.get("WRITTEN"):  # topics this app only writes, trimmed by age (pipeline/transport/retention.py)
    hooks.trim_written = frozenset(os.environ["WRITTEN"].split(","))
app.transport_hooks = hooks
SLOW_BACKLOG = float(os.environ.get("SLOW_BACKLOG", "0"))
numbers = app.topic("numbers", key_type=str, value_type=int, partitions=PARTITIONS)
ops = app.topic("ops", key_type=str, value_serializer="json", partitions=PARTITIONS)
counts = app.Table("counts", default=int, partitions=PARTITIONS)
SLOW_SEEK = float(os.environ.get("SLOW_SEEK", "0"))
if SLOW_SEEK:
    from pipeline.transport.consumer import Consumer

    _perform_seek = Consumer.perform_seek

    async def _slow_perform_seek(self) -> None:
        await asyncio.sleep(SLOW_SEEK)
        await _perform_seek(self)

    Consumer.perform_seek = _slow_perform_seek
DROP = os.environ.get("DROP")
if DROP:  # "<topic>:<partition>:<offset>": the first delivery of that entry never reaches its stream
    from pipeline.transport import consumer as _consumer

    _topic, _partition, _offset = DROP.rsplit(":", 2)
    _target = (_topic, int(_partition), int(_offset))
    _init = _consumer.Consumer.__init__

    def _dropping_init(self, *args, **kwargs) -> None:
        _init(self, *args, **kwargs)
        deliver, dropped = self.callback, []

        async def callback(message) -> None:
            if not dropped and (message.topic, message.partition, message.offset) == _target:
                dropped.append(message)
                return
            await deliver(message)

        self.callback = callback

    _consumer.Consumer.__init__ = _dropping_init
    _consumer.REREAD_AFTER_S = float(os.environ.get("REREAD_S", "2"))
kv = app.Table("kv", default=None, partitions=PARTITIONS)
_data = None


def data():
    global _data
    if _data is None:
        from redis.asyncio.retry import Retry
        from redis.backoff import ExponentialBackoff
        from redis.exceptions import ConnectionError, TimeoutError

        _data = aioredis.Redis.from_url(
            DATA, retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 40),
            retry_on_error=[ConnectionError, TimeoutError],
        )
    return _data


@app.agent(numbers)
async def count(stream):
    async for event in stream.events():
        counts[event.key] += 1
        await data().rpush("seen", f"{event.message.partition}:{event.message.offset}:{event.value}")
        if SLOW:
            await asyncio.sleep(SLOW)


@app.agent(ops)
async def apply_ops(stream):
    async for event in stream.events():
        op = event.value
        if op["op"] == "set":
            kv[event.key] = op["v"]
        elif op["op"] == "del":
            kv.pop(event.key, None)
        if "i" in op:
            await data().sadd("ops-seen", op["i"])
        elif op["op"] == "dump":
            p = event.message.partition
            partition_of = app.transport.partition_for
            mine = {k: v for k, v in kv.items() if partition_of("ops", k.encode()) == p}
            pipe = data().pipeline()
            pipe.delete(f"dump:{p}")
            if mine:
                pipe.hset(f"dump:{p}", mapping={k: str(v) for k, v in mine.items()})
            pipe.rpush("dumped", f"{op['round']}:{p}")
            await pipe.execute()


backlog_topic = app.topic("backlog", value_type=bytes, value_serializer="raw", partitions=PARTITIONS)
urgent_topic = app.topic("urgent", value_type=bytes, value_serializer="raw", partitions=PARTITIONS)


@app.agent(backlog_topic)
async def work_backlog(stream):
    async for value in stream:
        await data().rpush("backlog", value)
        await asyncio.sleep(SLOW_BACKLOG)


@app.agent(urgent_topic)
async def work_urgent(stream):
    async for value in stream:
        await data().rpush("urgent", b"%s:%d" % (value, await data().llen("backlog")))


batched_topic = app.topic("batched", value_type=bytes, value_serializer="raw", partitions=PARTITIONS)


@app.agent(batched_topic)
async def work_batched(stream):
    from pipeline.take import take_ready

    async for events in take_ready(stream, int(os.environ.get("TAKE_MAX", "5"))):
        await data().rpush("batches", b",".join(e.value for e in events))
