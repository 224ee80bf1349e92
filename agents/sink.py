"""record sink: notify.outcomes → the record store (SQLite), in batches.

Idempotent (the store merges by state precedence), so replaying the outcome
stream yields the same rows. A store that is unavailable (disk error, locked)
is retried with backoff and the batch is not acknowledged meanwhile: nothing
is lost. Duplicates (FILTERED ``duplicate``) are on the outcome stream for
analysts but do not touch the record: it keeps the original's state.
"""

from pipeline import runtime
from pipeline.app import app, outcomes_topic
from pipeline.rules.plan import DUPLICATE
from pipeline.store import InvalidOutcome

from . import emit


@app.agent(outcomes_topic, name="records")
async def records(stream):
    async for batch in stream.take(2000, within=0.05):
        rows = [o for o in batch if o.reason != DUPLICATE]
        while rows:
            try:
                await runtime.with_store(lambda store: store.apply_outcomes(rows), "record")
                break
            except InvalidOutcome as exc:
                bad = {id(o) for o in exc.outcomes}
                for o in exc.outcomes:
                    await emit.dead_letter("records", "invalid_outcome", o.dumps(), detail=str(exc), key=o.delivery_id)
                rows = [o for o in rows if id(o) not in bad]
