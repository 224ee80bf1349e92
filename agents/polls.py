"""receipt polls: a delivery a provider took (ACCEPTED) whose receipt has not come
``receipt_poll_s`` after its send is asked about, if its provider has a status
query (Twilio, the SMS vendor: ``Provider.status_query``), and DELIVERED or
UNDELIVERED is recorded from the provider's own answer, never by assumption.

The polls are a sweep of the record store, not a timer per delivery:

* one task per database does them: the worker that holds ``<records.db>.polls``
  (pipeline/store/turn.py :class:`SoleTurn`; the others try again now and then,
  and one takes over when that worker dies);
* each round (every :data:`ROUND_S`, at once while a round is full) reads the
  records still ACCEPTED through a provider that can answer, sent after the
  cursor and at least ``receipt_poll_s`` ago, oldest first, at most
  :data:`BATCH` (the partial index ``ix_record_awaiting`` holds the ACCEPTED
  records only: a record whose receipt came is not even read);
* asks their providers, :data:`CONCURRENCY` queries at a time (each within its
  client's timeouts), sends the outcomes the answers decide (agents/emit.py: the
  outcome stream, the records, the producer's callbacks), waits for them to be
  written, then moves the cursor (``receipt_polls``, one row in the store) past
  the batch.

Before, every ACCEPTED delivery wrote a ``poll`` timer (an entry on
notify.timers, its changelog entry and its tombstone, read back by the scheduler,
then a record lookup), whatever its provider and whether its receipt came: a
quarter of a main worker's CPU per record (bench/RESULTS.md "real: what the
default configuration costs"). Timers of that kind held by a worker of before
still fire (agents/scheduler.py).

What it does not do: a record written to the store after the cursor passed its
``sent_at`` (a worker down for longer than ``receipt_poll_s`` between a send and
its record) is not polled; it stays ACCEPTED, which is what is known of it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Optional

from prometheus_client import Counter

from pipeline.models import State
from pipeline.rules.receipts import record_outcome
from pipeline.store.turn import SoleTurn

__all__ = ["Polls", "register"]

log = logging.getLogger(__name__)

#: records asked about in one round at most
BATCH = 200
#: provider queries in flight at once
CONCURRENCY = 16
#: pause between rounds that found less than a batch
ROUND_S = 1.0
#: how often a worker that does not hold the polls tries to take them over
TAKE_OVER_S = 5.0
#: the cursor is kept in memory between rounds that polled nothing, written this often
SAVE_S = 30.0
#: after every delivery id (they are of A-Z a-z 0-9 _ . : -): a cursor past all records sent at a time
PAST = "~"

polled_total = Counter("notify_receipt_polls_total", "Receipt polls: ACCEPTED records asked about, by answer",
                       ["provider", "answer"])


class Polls:
    """The receipt polls of one worker (run where it holds the database's turn)."""

    def __init__(self, app: Any, emit: Any, callbacks: Any) -> None:
        self.app = app
        self.emit = emit
        self.callbacks = callbacks
        self.poll_s = app.settings.receipt_poll_s
        self._turn: Optional[SoleTurn] = None
        self._cursor: Optional[tuple[float, str]] = None
        self._saved: Optional[tuple[float, str]] = None
        self._saved_at = 0.0

    async def run(self) -> None:
        """Poll for as long as the worker runs (a task of the worker)."""
        try:
            while True:
                try:
                    store = await self.app.resources.store()
                    if self._turn is None and store.path != ":memory:":  # (a store of one process)
                        self._turn = SoleTurn(store.path, "polls")
                    if self._turn is not None and not self._turn.take():
                        await asyncio.sleep(TAKE_OVER_S)
                        continue
                    n = await self.sweep(time.time())
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the loop must outlive a bad round (the store away)
                    log.warning("receipt polls: a round failed (%s: %s); trying again", type(exc).__name__, exc)
                    n = 0
                await asyncio.sleep(0 if n >= BATCH else ROUND_S)
        finally:
            if self._turn is not None:
                self._turn.close()

    async def sweep(self, now: float) -> int:
        """One round: the records due for a poll, asked about; how many were."""
        store = await self.app.resources.store()
        disp = await self.app.resources.dispatcher()
        providers = {n: p for n, p in disp.providers.items() if p.status_query}
        until = now - self.poll_s
        if self._cursor is None:
            # a store never polled starts with the records sent from now on (a worker of
            # before gave the ones sent until now a timer each)
            self._cursor = self._saved = await store.poll_cursor() or (until, "")
        rows = await store.awaiting_receipts(self._cursor, until, sorted(providers), BATCH)
        if rows:
            await self._ask(rows, providers)
        cursor = (rows[-1]["sent_at"], rows[-1]["delivery_id"]) if len(rows) >= BATCH else (until, PAST)
        self._cursor = max(self._cursor, cursor)
        if self._cursor != self._saved and (rows or now - self._saved_at >= SAVE_S):
            await store.set_poll_cursor(self._cursor)
            self._saved, self._saved_at = self._cursor, now
        return len(rows)

    async def _ask(self, rows: list[dict], providers: dict) -> None:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def ask(row: dict) -> Any:
            async with gate:
                return await providers[row["provider"]].query(row["delivery_id"], row.get("provider_msg_id"))

        answers = await asyncio.gather(*(ask(r) for r in rows))
        now = time.time()
        decided = [(r, q) for r, q in zip(rows, answers) if q.status in (State.DELIVERED, State.UNDELIVERED)]
        for r, q in zip(rows, answers):
            polled_total.labels(r["provider"], q.status).inc()
        if not decided:
            return
        heard = await self.callbacks.heard([r for r, _ in decided])
        await self.emit.outcomes([
            record_outcome(r, q.status, now, reason="polled", provider=r["provider"],
                           provider_msg_id=q.provider_msg_id or r.get("provider_msg_id"), callback=h)
            for (r, q), h in zip(decided, heard, strict=True)])
        # written (the outcome stream, the records) before the cursor passes them
        await self.app.producer.flush()


def register(app: Any, emit: Any, callbacks: Any) -> Polls:
    """The polls task, on the workers that run the scheduler (not the priority
    process), when ``receipt_poll_s`` is set."""
    polls = Polls(app, emit, callbacks)
    if app.settings.receipt_poll_s and app.runs(app.declared.timers):
        app.task(polls.run)
    return polls
