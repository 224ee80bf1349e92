"""After a provider call or a reconciliation query: the delivery's next state. Pure.

==================  ==============================================================
result              next
==================  ==============================================================
ACCEPTED            ACCEPTED (DELIVERED only ever comes from a receipt)
PERMANENT_ERROR     FAILED <kind>; dead-lettered; a bad push token is removed
RATE_LIMITED,       retry at backoff (seed 000: [cap/2, cap], base 1 s, cap 10 min;
TRANSIENT_ERROR     Retry-After is a lower bound); after the budget FAILED
                    ``retries_exhausted``, dead-lettered
TIMEOUT_UNKNOWN     UNKNOWN; pinned to that provider; reconcile by query first
==================  ==============================================================

Reconciliation (query by our idempotency key): the provider has it → ACCEPTED
(no resend); it certainly does not → resend to the same provider; the query
failed or the protocol has none → ask again later, REVIEW after the budget.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Optional

from pipeline.models import AttemptResult, Delivery, State

from .backoff import retry_at

__all__ = ["Next", "after_send", "after_query", "superseded", "DONE_STATES", "MAX_ATTEMPTS", "RECONCILE_BUDGET"]

#: a delivery's inflight mark in one of these states: its attempt is finished
DONE_STATES = frozenset({State.ACCEPTED, State.FAILED, State.REVIEW, State.FILTERED, State.DELIVERED})


def superseded(mark: Optional[dict], attempt: int, replay: int = 0) -> bool:
    """Whether a lane's inflight ``mark`` (``{"a": attempts, "s": state, "r": replay
    round}``) says a delivery read with ``attempt`` in ``replay`` round was already
    handled: a later attempt was made, or this one finished, in the same round. A
    replay (``notify dlq replay``) is the next round and runs once; an older round
    is always superseded."""
    if not mark:
        return False
    round_ = mark.get("r", 0)
    if round_ != replay:
        return round_ > replay
    return mark["a"] > attempt or (mark["s"] in DONE_STATES and mark["a"] >= attempt)

MAX_ATTEMPTS = 5
RECONCILE_BUDGET = 3


@dataclass
class Next:
    state: str
    reason: Optional[str] = None
    retry: Optional[Delivery] = None  # schedule this delivery at retry.due_at
    dead_letter: bool = False
    remove_device: bool = False
    resend_now: bool = False  # reconciliation said NOT_FOUND: send again, same provider
    provider_msg_id: Optional[str] = None


def _again(d: Delivery, due: float, **changes: Any) -> Delivery:
    data = d.asdict()
    data.update(changes)
    data["due_at"] = due
    return Delivery(**data)


def after_send(
    d: Delivery,
    result: str,
    now: float,
    *,
    provider: str,
    retry_after: Optional[float] = None,
    permanent_kind: Optional[str] = None,
    provider_msg_id: Optional[str] = None,
    max_attempts: int = MAX_ATTEMPTS,
    rand: Callable[[], float] = random.random,
) -> Next:
    """``d.attempt`` is the number of provider calls made before this one."""
    made = d.attempt + 1
    if result == AttemptResult.ACCEPTED:
        return Next(State.ACCEPTED, provider_msg_id=provider_msg_id)
    if result == AttemptResult.PERMANENT_ERROR:
        kind = permanent_kind or "permanent_error"
        return Next(State.FAILED, kind, dead_letter=True, remove_device=kind == "bad_token")
    if result == AttemptResult.TIMEOUT_UNKNOWN:
        due = retry_at(now, 0, None, rand=rand)
        return Next(State.UNKNOWN, "timeout", retry=_again(d, due, attempt=made, unknown_provider=provider,
                                                             reconcile_round=0))
    # RATE_LIMITED, TRANSIENT_ERROR: not taken, safe to try again (another provider allowed)
    if made >= max_attempts:
        return Next(State.FAILED, "retries_exhausted", dead_letter=True)
    due = retry_at(now, made - 1, retry_after, rand=rand)
    return Next(State.PENDING, result.lower(), retry=_again(d, due, attempt=made))


def after_query(
    d: Delivery,
    status: str,
    supported: bool,
    now: float,
    *,
    provider_msg_id: Optional[str] = None,
    budget: int = RECONCILE_BUDGET,
    rand: Callable[[], float] = random.random,
) -> Next:
    if status in ("ACCEPTED", "DELIVERED", "UNDELIVERED"):
        return Next(State.ACCEPTED, "reconciled", provider_msg_id=provider_msg_id)
    if status == "NOT_FOUND" and supported:
        return Next(State.PENDING, "reconciled_not_found", resend_now=True)
    rnd = d.reconcile_round + 1
    if not supported or rnd >= budget:
        return Next(State.REVIEW, "unknown_unreconciled" if not supported else "reconcile_budget")
    due = retry_at(now, rnd, None, rand=rand)
    return Next(State.UNKNOWN, "reconcile_retry", retry=_again(d, due, reconcile_round=rnd))
