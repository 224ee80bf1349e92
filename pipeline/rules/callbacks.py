"""Producer status callbacks, the pure part: what a producer is told about which
outcome, how state changes are batched into one POST, and when a failed POST
is tried again (issue 27, item 1; the agent is agents/callbacks.py, the durable
retry set pipeline/callback_queue.py, the signed POST adapters/callbacks.py).

* **One change per outcome.** Every Outcome on ``notify.outcomes`` is one state
  change of one delivery; its producer hears it as a *change* (:func:`change`)
  whose ``id`` is ``<delivery_id>.<STATE>.<seq>`` (:func:`change_id`), ``seq``
  the provider calls made so far (the outcome's ``retry_count``). The id is a
  function of the outcome alone, so an outcome read twice (a worker's replay
  after a crash) or a POST sent twice (at least once) carries the same id, and
  the producer de-duplicates on it.
* **Batched per event.** The changes of one event (producer, biz_key) that
  arrive together go in one POST (:func:`body`: ``{"type", "producer",
  "biz_key", "changes": [...]}``), at most ``max_batch`` changes each; the
  POST's ``webhook-id`` (:func:`message_id`) is a digest of its change ids, the
  same for every retry of the same content.
* **Backoff with jitter** (:func:`delay`, :func:`after_failure`): the n-th
  retry waits ``min(max_delay, base * 2**(n-1))``, half of it fixed and half
  random ("equal jitter", so retries of many producers spread out but never
  come sooner than half the step); a ``Retry-After`` longer than that is
  honoured. A callback is given up only once ``retry_for_s`` (24 h by default)
  has passed since its first failed try (or since a change was last merged into
  it): at least 24 hours of tries, whatever the steps.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

import orjson

__all__ = [
    "CHANGE_FIELDS",
    "Retry",
    "change",
    "change_id",
    "target_key",
    "split_target_key",
    "group",
    "body",
    "message_id",
    "delay",
    "after_failure",
    "schedule",
]

#: the outcome fields a producer is told, besides ``id`` (docs/SCHEMA.md "Status callbacks")
CHANGE_FIELDS = ("notification_id", "delivery_id", "user_id", "channel", "state", "reason", "detail", "at",
                 "provider", "retry_count", "category")

#: what the ``type`` of a callback body says
TYPE = "notification.status"


def change_id(outcome: Mapping[str, Any]) -> str:
    """``<delivery_id>.<STATE>.<seq>``: the idempotency id of one state change
    (``seq``: the provider calls made when it happened)."""
    seq = outcome.get("retry_count") or 0
    return f"{outcome['delivery_id']}.{outcome['state']}.{int(seq)}"


def change(outcome: Mapping[str, Any]) -> dict[str, Any]:
    """The change a producer receives for one outcome: its id and the fields of
    :data:`CHANGE_FIELDS` (absent ones as null). No address: the producer
    knows its users by id."""
    out: dict[str, Any] = {"id": change_id(outcome)}
    for name in CHANGE_FIELDS:
        out[name] = outcome.get(name)
    out["retry_count"] = int(out["retry_count"] or 0)
    return out


def target_key(producer: str, biz_key: str) -> str:
    """The event a callback is about: ``<producer>|<biz_key>`` (a producer's name
    holds no ``|``, pipeline/parsers/events.py PRODUCER_RE)."""
    return f"{producer}|{biz_key}"


def split_target_key(key: str) -> tuple[str, str]:
    producer, _, biz_key = key.partition("|")
    return producer, biz_key


@dataclass(frozen=True)
class Batch:
    """State changes of one event, for one URL: at most ``max_batch`` of them."""

    producer: str
    biz_key: str
    url: str
    changes: tuple[tuple[str, bytes], ...]  # (change id, the change as JSON)


def group(items: Iterable[tuple[Mapping[str, Any], str]], max_batch: int) -> list[Batch]:
    """``(outcome, url)`` pairs → batches per event and URL, in order of first
    appearance, each at most ``max_batch`` changes; a change id seen twice (an
    outcome read twice in one take) is kept once."""
    if max_batch < 1:
        raise ValueError("max_batch must be >= 1")
    by: dict[tuple[str, str, str], dict[str, bytes]] = {}
    for outcome, url in items:
        k = (outcome.get("producer") or "", outcome["biz_key"], url)
        c = change(outcome)
        by.setdefault(k, {}).setdefault(c["id"], orjson.dumps(c))
    out = []
    for (producer, biz_key, url), changes in by.items():
        pairs = list(changes.items())
        for i in range(0, len(pairs), max_batch):
            out.append(Batch(producer, biz_key, url, tuple(pairs[i:i + max_batch])))
    return out


def _order(c: Mapping[str, Any]) -> tuple:
    at = c.get("at")
    return (at if isinstance(at, (int, float)) and math.isfinite(at) else 0.0, c.get("id") or "")


def body(producer: str, biz_key: str, changes: Iterable[bytes | Mapping[str, Any]]) -> tuple[bytes, list[str]]:
    """The JSON body of one callback POST and the ids of its changes: the
    changes in the order they happened (then by id), so the same changes make
    the same bytes."""
    parsed = [orjson.loads(c) if isinstance(c, (bytes, bytearray, str)) else dict(c) for c in changes]
    parsed.sort(key=_order)
    doc = {"type": TYPE, "producer": producer, "biz_key": biz_key, "changes": parsed}
    return orjson.dumps(doc), [c["id"] for c in parsed]


def message_id(change_ids: Iterable[str]) -> str:
    """The ``webhook-id`` of a POST: ``msg_`` + a digest of its change ids (any
    order): a retry of the same changes carries the same id, a POST that gained a
    change carries a new one."""
    h = hashlib.blake2b("\n".join(sorted(change_ids)).encode("utf-8", "surrogatepass"), digest_size=16)
    return "msg_" + h.hexdigest()


def delay(attempt: int, base_s: float, max_s: float, rand: float) -> float:
    """Seconds before retry number ``attempt`` (1 = the first retry):
    ``d = min(max_s, base_s * 2**(attempt-1))``, then ``d/2 + rand * d/2``
    (``rand`` in [0, 1))."""
    attempt = max(1, int(attempt))
    d = min(max_s, base_s * (2.0 ** min(attempt - 1, 60)))
    return d / 2 + max(0.0, min(1.0, rand)) * d / 2


@dataclass(frozen=True)
class Retry:
    """What a failed POST leads to: ``give_up`` (with ``reason``) or a try at ``at``."""

    give_up: bool
    at: float = 0.0
    reason: str = ""


def after_failure(attempts: int, since: float, now: float, *, base_s: float, max_s: float, retry_for_s: float,
                  retry_after: Optional[float] = None, permanent: bool = False, error: str = "",
                  rand: Optional[float] = None) -> Retry:
    """A POST failed; ``attempts`` tries have failed so far (this one included),
    the first at ``since`` (or the last change merged in since). A permanent
    failure (the URL refused by the target guard, a ``410 Gone``) is given up at
    once; any other is tried again after :func:`delay` (or ``retry_after`` when
    longer), until ``retry_for_s`` has passed since ``since``."""
    if permanent:
        return Retry(True, reason=error or "permanent")
    if now - since >= retry_for_s:
        return Retry(True, reason=f"retries_exhausted: {error}" if error else "retries_exhausted")
    wait = delay(attempts, base_s, max_s, random.random() if rand is None else rand)
    if retry_after is not None and math.isfinite(retry_after) and retry_after > wait:
        wait = min(retry_after, max_s)
    return Retry(False, at=now + wait)


def schedule(base_s: float, max_s: float, retry_for_s: float, rand: float = 0.5) -> list[float]:
    """The times (seconds after the first failure) of every retry of a callback
    whose endpoint never answers, ``rand`` fixing the jitter: what the defaults
    promise, written out (tests/rules/test_rule_callbacks.py)."""
    out: list[float] = []
    t, n = 0.0, 1
    while True:
        r = after_failure(n, 0.0, t, base_s=base_s, max_s=max_s, retry_for_s=retry_for_s, rand=rand)
        if r.give_up:
            return out
        t = r.at
        out.append(t)
        n += 1


