"""Failover policy between providers of one channel (e.g. SMS A → B). Pure.

Failing over means sending the same delivery through another provider, so it
is only allowed when the last provider certainly did *not* take the message:

* its breaker is open (we did not call it: :data:`BREAKER_OPEN`),
* it answered TRANSIENT_ERROR (5xx, connection refused: not accepted),
* it answered RATE_LIMITED (429: not accepted, RFC 6585), unless the limit
  was one recipient's (APNs throttles per device token): then no provider helps.

Never after TIMEOUT_UNKNOWN: the first provider may have sent the message, and
a second provider would send it again. A delivery whose
``unknown_provider`` is set is pinned to that provider, and may go to it
only after reconciliation (``provider.query``) said NOT_FOUND.
PERMANENT_ERROR and ACCEPTED end the attempt chain too.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping, Optional, Sequence

from pipeline.models import AttemptResult

from ..base import Fault
from .breaker import CircuitBreaker

__all__ = ["BREAKER_OPEN", "may_failover", "choose_provider"]

#: pseudo-result: the provider was skipped because its breaker is open
BREAKER_OPEN = "BREAKER_OPEN"

_FAILOVER_OK = frozenset({BREAKER_OPEN, AttemptResult.TRANSIENT_ERROR, AttemptResult.RATE_LIMITED})


def _result_of(last_result: Any) -> Optional[str]:
    if last_result is None or isinstance(last_result, str):
        return last_result
    return getattr(last_result, "result", None)


def may_failover(last_result: Any) -> bool:
    """May the next attempt of this delivery use *another* provider?

    ``last_result``: an ``AttemptResult`` string, :data:`BREAKER_OPEN`, or
    anything with a ``.result`` (``SendResult``, ``Attempt``). A fault of the
    recipient (``fault="recipient"``: one device throttled) never fails over:
    the device, not the provider, needs time.
    """
    if getattr(last_result, "fault", None) == Fault.RECIPIENT:
        return False
    return _result_of(last_result) in _FAILOVER_OK


def choose_provider(
    providers_in_order: Sequence[str],
    breakers: Mapping[str, CircuitBreaker],
    delivery: Any,
    *,
    reconciled: bool = False,
    avoid: Collection[str] = (),
) -> Optional[str]:
    """The provider for the next attempt, or None (nothing may be called now:
    re-schedule, e.g. after the shortest ``breaker.retry_in()``).

    * ``delivery.unknown_provider`` set → that provider only, and only with
      ``reconciled=True`` (its query said NOT_FOUND) and its breaker allowing.
    * otherwise the first provider in order whose breaker allows a call,
      trying those in ``avoid`` (e.g. the one that just failed with a result
      for which :func:`may_failover` is True) last.

    Calls ``allow()`` on the breakers it tries, stopping at the first that
    allows: the caller must ``record()`` the outcome on the chosen one (or
    ``release()`` it if the call is not made).
    """
    unknown = getattr(delivery, "unknown_provider", None)
    if unknown:
        if not reconciled:
            return None
        breaker = breakers.get(unknown)
        return unknown if breaker is None or breaker.allow() else None
    ordered = [p for p in providers_in_order if p not in avoid] + [p for p in providers_in_order if p in avoid]
    for name in ordered:
        breaker = breakers.get(name)
        if breaker is None or breaker.allow():
            return name
    return None
