"""receipts: a provider's delivery receipt (notify.receipts) → DELIVERED or
UNDELIVERED for the delivery that carries its provider_msg_id *and was sent
through that provider* (pipeline/rules/receipts.py): a record, or a push's
delivery to one device (Huawei Push Kit's receipts name the message sent to one
device; the outcome carries that device's delivery id and the record is derived
from its devices', pipeline/store/devices.py). ACCEPTED is never reported as
DELIVERED without one. A receipt that arrives before our ACCEPTED record is
written is retried a few times through the timer topic; one whose message id
belongs only to deliveries of other providers is refused at once: logged and
dead-lettered as ``provider_mismatch``, nothing changed (a provider's receipt
never decides another provider's delivery).

A receipt that is an opt-out (``Receipt.opt_out``: a spam complaint, the
provider's own unsubscribe link: adapters/receipts_email.py) also switches the
delivery's category off on its channel: a merge update on notify.preferences,
source ``provider:<provider name>``, applied and recorded as any opt-out by the
users agent (agents/users.py). A receipt read again sends it again; the users
agent finds the switch off already and records nothing."""

import logging
import time
from typing import Any

from pipeline import clock
from pipeline.entries import PASS_THROUGH, contained
from pipeline.models import Preferences, Receipt, State, Timer
from pipeline.rules.receipts import record_outcome, split_by_provider
from pipeline.take import take_ready

__all__ = ["Receipts", "register"]

MAX_TRIES = 5
#: receipts handled together (one store read, one write of outcomes)
TAKE = 200

log = logging.getLogger(__name__)


class Receipts:
    def __init__(self, app: Any, emit: Any, callbacks: Any) -> None:
        self.app = app
        self.emit = emit
        self.callbacks = callbacks

    async def receipts(self, stream):
        """A take of receipts at a time (:meth:`match_many`): one store read per take
        instead of per receipt (whether a producer hears of a change: the records
        say). A take that fails on something other than a transient error is
        handled again one receipt at a time, each contained: only the bad receipt
        is dead-lettered."""
        dlq = self.app.declared.dlq
        async for events in take_ready(stream, TAKE):
            try:
                await self.match_many([(ev.value, 0) for ev in events])
            except PASS_THROUGH:
                raise
            except Exception:  # noqa: BLE001 - found again below, receipt by receipt
                for ev in events:
                    async with contained(dlq, ev, "receipts"):
                        await self.match(ev.value, tries=0)

    async def match(self, r: Receipt, tries: int) -> None:
        await self.match_many([(r, tries)])

    async def match_many(self, receipts: list[tuple[Receipt, int]]) -> None:
        """Receipts (each with the tries made so far) → their outcomes, retries and dead
        letters; the outcomes of the whole list written together."""
        emit = self.emit
        store = await self.app.resources.store()
        found = await store.by_provider_msg_ids([r.provider_msg_id for r, _t in receipts])
        matched: list[tuple[Receipt, list]] = []
        for r, tries in receipts:
            rows, others = split_by_provider(r.provider, found.get(r.provider_msg_id, ()))
            if not rows and others:
                providers = sorted({str(o.get("provider")) for o in others})
                log.warning("refused a %s receipt for a message id of %d delivery(ies) of %s: provider_mismatch",
                            r.provider, len(others), ", ".join(providers))
                await emit.dead_letter("receipts", "provider_mismatch", r.dumps(), key=r.provider_msg_id,
                                       detail=f"receipt from {r.provider}; the message id is {', '.join(providers)}'s")
            elif not rows:
                if tries < MAX_TRIES:
                    await emit.timer(r.provider_msg_id, Timer(
                        timer_id=f"receipt:{r.provider}:{r.provider_msg_id}:{tries}", due_at=clock.now() + 2 ** tries,
                        kind="receipt", payload={"receipt": r.asdict(), "tries": tries + 1,
                                                 "user_id": r.provider_msg_id}))
                else:
                    await emit.dead_letter("receipts", "unmatched_receipt", r.dumps(), key=r.provider_msg_id)
            else:
                matched.append((r, rows))
        if not matched:
            return
        heard = iter(await self.callbacks.heard([row for _r, rows in matched for row in rows]))
        outcomes = []
        for r, rows in matched:
            state = State.DELIVERED if r.status == "DELIVERED" else State.UNDELIVERED
            outcomes.extend(record_outcome(
                row, state, r.at or time.time(), reason=r.error, provider=r.provider,
                provider_msg_id=r.provider_msg_id, callback=next(heard))
                for row in rows)
        await emit.outcomes(outcomes)
        for r, rows in matched:
            if r.opt_out:
                await self.opt_out(r, rows)

    async def opt_out(self, r: Receipt, rows: list) -> None:
        """The users of ``rows`` switch their category off on its channel (merge updates)."""
        categories = self.app.settings.categories
        seen = set()
        for row in rows:
            uid, cat, ch = row.get("user_id"), row.get("category") or "", row.get("channel") or ""
            if not uid or cat not in categories or (uid, cat, ch) in seen:
                continue  # a category this config no longer has: no switch to turn off
            seen.add((uid, cat, ch))
            await self.emit.send(self.app.declared.preferences, uid, Preferences(
                user_id=uid, switches={f"{cat}.{ch}": False}, merge=True, source=f"provider:{r.provider}",
                producer=row.get("producer") or ""))


def register(app: Any, emit: Any, callbacks: Any) -> Receipts:
    r = Receipts(app, emit, callbacks)
    if app.runs(app.declared.receipts):
        app.agent(app.declared.receipts, name="receipts")(r.receipts)
    return r
