"""The idempotency records of accepted events (``POST /v1/events``).

``<ns>:api:biz:<biz_key>`` (string, JSON; ``<ns>:api:biz:<producer>/<biz_key>``
in a producer's key space)
    The idempotency record of an accepted event: ``{"fp", "at", "st",
    "recipients", "token"}``. ``fp`` is the SHA-256 of the validated event
    without ``accepted_at`` (canonical JSON), ``at`` the acceptance time.
    Taken with ``SET NX`` as a *claim* (``st: "claim"``, 30 s TTL) before the
    event is written to ``notify.events``; set to ``st: "ok"`` with the
    idempotency TTL (7 days by default) once the write returned; deleted
    (compare-and-delete on the token) if the write failed, so the producer can
    retry. A process that dies in between leaves a claim that expires after
    30 s. A repeated request finds the record: same fingerprint → 200 with the
    original ids and their current states; another fingerprint → 409
    ``biz_key_conflict`` (the business key is taken by different content);
    a claim still in flight → 409 ``in_progress`` (retry after 1 s).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Optional

import orjson

from pipeline.models import Event
from pipeline.transport.wire import run_commands

__all__ = ["Idempotency", "Claim", "fingerprint", "CLAIM_TTL", "DEFAULT_IDEMPOTENCY_TTL"]

log = logging.getLogger("notify.api")

DEFAULT_IDEMPOTENCY_TTL = 7 * 86400
CLAIM_TTL = 30

#: compare-and-delete of a claim (only the request that took it releases it)
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"

#: fields events gained later, left out of the fingerprint at their default, so a
#: repeat of an event accepted before they existed still matches its record
_LATER_FIELDS = {"producer": "", "callback_url": None}

#: (record's key, the claim as stored, the claim)
Claim = tuple[str, bytes, dict[str, Any]]


def fingerprint(event: Event) -> str:
    d = event.asdict()
    d.pop("accepted_at", None)
    for name, default in _LATER_FIELDS.items():
        if d.get(name, default) == default:
            d.pop(name, None)
    return hashlib.sha256(orjson.dumps(d, option=orjson.OPT_SORT_KEYS)).hexdigest()


class Idempotency:
    """Claims, confirms and releases the records; ``api`` is the shared state
    (:class:`.state.Api`: its client, namespace and idempotency TTL)."""

    def __init__(self, api: Any) -> None:
        self.api = api

    async def _run(self, commands: list[tuple]) -> list:
        """One round trip, on the API's own connection when it has one; the first
        error reply raised."""
        return await run_commands(self.api.client, self.api.wire, commands)

    def key(self, biz_key: str, producer: str = "") -> str:
        """A business key's idempotency record, in its producer's key space
        (producer names never hold a '/')."""
        ns = self.api.ns
        return f"{ns}:api:biz:{producer}/{biz_key}" if producer else f"{ns}:api:biz:{biz_key}"

    async def claim(self, claims: dict[int, Claim]) -> tuple[list[int], dict[int, Optional[dict[str, Any]]]]:
        """``SET NX`` every claim (one round trip): the indexes taken, and the
        records found instead for the others (None if unreadable or gone)."""
        commands: list[tuple] = []
        for key, value, _rec in claims.values():
            commands += [("SET", key, value, "NX", "EX", CLAIM_TTL), ("GET", key)]
        answers = await self._run(commands)
        ours: list[int] = []
        existing: dict[int, Optional[dict[str, Any]]] = {}
        for n, i in enumerate(claims):
            took, current = answers[2 * n], answers[2 * n + 1]
            if took in (True, b"OK"):  # redis-py's pipeline answers True, the wire the reply
                ours.append(i)
            else:
                try:
                    existing[i] = orjson.loads(current) if current else None
                except orjson.JSONDecodeError:
                    existing[i] = None
        return ours, existing

    async def confirm(self, claims: list[Claim]) -> None:
        """The events are written: the claims become records for the idempotency TTL."""
        try:
            await self._run([("SET", key, orjson.dumps({**rec, "st": "ok"}), "EX", self.api.idempotency_ttl)
                             for key, _v, rec in claims])
        except Exception:  # noqa: BLE001 - the claims expire; a later repeat may write again
            log.warning("accepted %d events but could not confirm their idempotency records; a repeat "
                        "within %ds answers in_progress, later ones are written again (the pipeline "
                        "dedups them)", len(claims), CLAIM_TTL, exc_info=True)

    async def release(self, claims: list[Claim]) -> None:
        """The write failed: give the claims up (each only if still ours)."""
        try:
            await self._run([("EVAL", _RELEASE, 1, key, value) for key, value, _rec in claims])
        except Exception:  # noqa: BLE001 - the claims expire after CLAIM_TTL anyway
            log.warning("could not release %d idempotency claims", len(claims), exc_info=True)
