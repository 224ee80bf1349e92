"""Faust app for bench/transport.py: MODE=stateless|table; N events to count."""

import os
import time

import faust
import redis.asyncio as aioredis

from pipeline.transport.cache import CachedTable

N = int(os.environ["N"])
MODE = os.environ.get("MODE", "stateless")
BROKER = os.environ["BROKER"]
LEAN = os.environ.get("LEAN", "1") == "1"  # as the notify worker: pipeline/lean.py, pipeline/transport/cache.py
app = faust.App(f"bench-{MODE}", broker=BROKER, store="memory://", topic_partitions=4, web_enabled=False,
                datadir=os.environ.get("DATADIR", "/tmp/bench-transport"),
                **({"Table": CachedTable} if LEAN else {}))
topic = app.topic("bench", key_type=str, value_type=bytes, value_serializer="raw", partitions=4)
if LEAN:
    from pipeline.lean import lean_sensors, tune_gc

    lean_sensors(app)
    tune_gc()
table = app.Table("bench-counts", default=int, partitions=4)
state = {"n": 0, "first": 0.0}


@app.agent(topic)
async def consume(stream):
    async for key, _value in stream.items():
        if state["n"] == 0:
            state["first"] = time.perf_counter()
        state["n"] += 1
        if MODE == "table":
            table[key] += 1
        if state["n"] == N:
            elapsed = time.perf_counter() - state["first"]
            r = aioredis.Redis.from_url(BROKER.split("?")[0])
            await r.set(f"bench:{MODE}", f"{elapsed}")
            await r.aclose()
