"""Run the pipeline in the test's own process and event loop, on a real broker: the
app factory's app with the agents of a role, started and stopped around a block
(as Faust's ``agent.test_context()`` and bytewax's testing module let a test run
one dataflow without a worker process).

    async with running(settings, role="all") as app:
        await send_event(app, {...})
        rows = await wait_records(app, "b1")
        app.parts.guard.plan_and_send(...)   # or call a part directly

``settings`` come from ``load_settings(env={...})``: the test's ``REDIS_URL``,
``NOTIFY_DATA_DIR`` (the record store goes there), ``NOTIFY_PROVIDERS=fake``.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional

import orjson

from .app import NotifyApp, create_app
from .topics import event_key

__all__ = ["running", "send_event", "wait_records"]


@asynccontextmanager
async def running(settings: Any, role: Optional[str] = None, *, assigned_within: float = 30.0,
                  **conf: Any) -> AsyncIterator[NotifyApp]:
    """An app of ``role`` with its agents, started in this event loop; stopped (and
    its record store closed) on the way out. Yields once the app owns partitions and
    has recovered their tables (a table change made before would be replaced by the
    recovery's read of the changelog, as no agent's can be)."""
    from agents import register_agents

    app = create_app(settings, role, **conf)
    register_agents(app)
    await app.start()
    try:
        deadline = time.monotonic() + assigned_within
        while not (app.consumer.assignment() and app.tables.recovery.completed.is_set()
                   and not app.rebalancing):
            if time.monotonic() > deadline:
                raise TimeoutError("the app was assigned no partition, or did not recover its tables")
            await asyncio.sleep(0.02)
        yield app
    finally:
        await app.stop()


async def send_event(app: NotifyApp, event: dict, high: bool = False) -> None:
    """Write ``event`` (a dict as the API accepts it) to notify.events (or .high)."""
    topic = app.declared.events[1 if high else 0]
    await topic.send(key=event_key(event.get("biz_key"), event.get("recipients")), value=orjson.dumps(event))


async def wait_records(app: NotifyApp, biz_key: str, n: int = 1, timeout: float = 10.0,
                       states: tuple = ("ACCEPTED", "DELIVERED", "FAILED", "FILTERED", "UNDELIVERED", "REVIEW")) -> list:
    """The records of ``biz_key`` once ``n`` of them are in one of ``states``."""
    deadline = time.monotonic() + timeout
    while True:
        store = await app.resources.store()
        rows, _cursor = await store.find(biz_key=biz_key, limit=1000)
        if sum(1 for r in rows if r["status"] in states) >= n or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.05)
