"""The record sink: every outcome a worker publishes is also written to the
record store (SQLite) by that worker, in batches.

An outcome goes two ways from :meth:`agents.emit.Emit.outcomes`: onto
``notify.outcomes`` for analysts, and into this worker's :class:`Records`
queue, which one task writes to the store (up to :data:`MAX_BATCH` outcomes
per transaction, what arrived within :data:`WITHIN_S` of the first). No agent
reads the outcome stream back to write the records: that cost a consume, a
decode and a check per outcome, about two per notification.

Nothing is lost on a crash: a commit of the agents' offsets waits until the
outcomes of what they handled are written, here as on the stream (this is
the app's first sink, ``app.transport_hooks.sinks``: a commit flushes the
sinks, then the producer, then writes the offsets), so the input of an outcome not yet written is read and handled again; and a table
change that says the work is done (a lane's "done" mark, a fired timer removed)
is sent only after the records of the outcomes sent before it
(pipeline/transport/cache.py), or the replay would skip the work. Writing is
idempotent and order-free (the store merges by state precedence), so an outcome
written twice, or by two workers, gives the same row. A store that is unavailable
(disk error, locked) is retried with backoff; meanwhile commits wait and, past
:data:`MAX_UNWRITTEN` outcomes, so do the agents. Duplicates (FILTERED
``duplicate``) are on the outcome stream for analysts but do not touch the
record: it keeps the original's state. ``notify records replay`` writes the
records again from the outcome stream (what the stream still holds).
"""

import asyncio
import logging
from typing import Any, Awaitable, Callable, Iterable, Optional

from pipeline.rules.plan import DUPLICATE

__all__ = ["Records", "Unsubscribes", "register"]

log = logging.getLogger(__name__)

#: outcomes per transaction
MAX_BATCH = 2000
#: how long the first outcome of a batch waits for company (NOTIFY_RECORD_WITHIN_MS)
WITHIN_S = 0.020
#: outcomes queued and not written, past which the agents emitting them wait: two
#: batches, one being written and one gathering. A commit waits for what is queued
#: when it starts, so this bounds how long a commit lasts (the backlog over the
#: store's write rate). At 20,000 a main worker's commits lasted 30-33 s on the real
#: path (bench/real.py: CPU-starved workers write slowly) and 9-12 s on bench/e2e.py;
#: at 4,000, 7-8 s and 2-3 s, with as many notifications/s
#: (bench/RESULTS.md "sink-backlog")
MAX_UNWRITTEN = 4_000

#: what writes a batch: ``await with_store(op, what)`` (pipeline/runtime.py ``Resources.with_store``)
WithStore = Callable[[Callable[[Any], Awaitable[Any]], str], Awaitable[Any]]


class Records:
    """This worker's queue of outcomes to write, and the task that writes them: a
    sink (``add()``, ``flush()``) that every commit flushes first."""

    def __init__(self, with_store: WithStore, within_s: float = WITHIN_S, max_batch: int = MAX_BATCH,
                 max_unwritten: int = MAX_UNWRITTEN) -> None:
        self.with_store = with_store
        #: ``await on_refused(outcome, why)`` for an outcome the store refuses (set by
        #: agents/__init__.py: a dead letter)
        self.on_refused: Optional[Callable[[Any, str], Awaitable[None]]] = None
        self.within_s = within_s
        self.max_batch = max_batch
        self.max_unwritten = max_unwritten
        self.pending: list = []
        self.queued = 0  # outcomes ever queued
        self.written = 0  # of those, written (the queue is written in order)
        self._wakeup: Optional[asyncio.Event] = None
        self._written: Optional[asyncio.Condition] = None
        self._task: Optional[asyncio.Task] = None

    async def add(self, outcomes: Iterable[Any]) -> None:
        await self.queue([o for o in outcomes if o.reason != DUPLICATE])

    async def queue(self, rows: list) -> None:
        """Queue ``rows`` to be written (a commit waits for them); waits only when
        more than ``max_unwritten`` are queued and not written."""
        if not rows:
            return
        self.pending += rows
        self.queued += len(rows)
        self._start()
        assert self._wakeup is not None
        self._wakeup.set()
        if self.queued - self.written > self.max_unwritten:
            await self._until(self.queued - self.max_unwritten)

    #: what the store unavailable warnings call these rows
    what = "record"

    async def apply(self, store: Any, rows: list) -> Any:
        """Write ``rows`` in one transaction; returns the refused ``(row, why)`` pairs."""
        return await store.apply_valid_outcomes(rows)

    async def flush(self) -> None:
        """Until every outcome queued before this call is written (not those queued
        meanwhile: a busy worker is never idle)."""
        await self._until(self.queued)

    async def _until(self, target: int) -> None:
        if self.written >= target:
            return
        self._start()
        assert self._written is not None
        async with self._written:
            await self._written.wait_for(lambda: self.written >= target)

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._wakeup = self._wakeup or asyncio.Event()
            self._written = self._written or asyncio.Condition()
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        assert self._wakeup is not None and self._written is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if len(self.pending) < self.max_batch and self.within_s > 0:
                await asyncio.sleep(self.within_s)  # let a batch gather
            while self.pending:
                batch = self.pending[: self.max_batch]
                del self.pending[: len(batch)]
                await self._write(batch)
                self.written += len(batch)
                async with self._written:
                    self._written.notify_all()

    async def _write(self, rows: list) -> None:
        delay = 0.1
        while True:
            try:
                refused = await self.with_store(lambda store: self.apply(store, rows), self.what)
                break
            except Exception:
                # a bug, not the store being away: keep the rows (commits wait), say so loudly
                log.exception("writing %d records failed; retrying in %.1fs", len(rows), delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        for o, why in refused or ():
            if self.on_refused is not None:
                await self.on_refused(o, why)
            else:
                log.error("an outcome the store refused was dropped: %s (%s)", o.delivery_id, why)


class Unsubscribes(Records):
    """The opt-outs agents/users.py records (``unsubscribes`` rows), written in
    batches as the records are, a sink a commit flushes before it writes the tables'
    changes and the offsets: an update's row is durable before its table change."""

    what = "unsubscribes"

    async def apply(self, store: Any, rows: list) -> Any:
        await store.add_unsubscribes(rows)
        return ()


def register(app: Any) -> Records:
    """The app's record sink, the first thing its commits wait for."""
    records = Records(app.resources.with_store, within_s=app.settings.env.record_within_ms / 1000)
    app.transport_hooks.sinks.append(records)
    return records
