"""The HTTP API: an aiohttp application over the broker (Redis Streams) and the
record store (SQLite). It runs no Faust worker: writes go straight into the
topics' streams (:mod:`.producer`), reads come from the record store, the
idempotency records and the preferences read model in Redis.

Endpoints and scopes (``Authorization: Bearer <key>``, see :mod:`.auth`)::

    POST   /v1/events                          events:write
    GET    /v1/notifications/{id}              records:read
    GET    /v1/notifications                   records:read
    GET    /v1/users/{id}/preferences          records:read
    PUT    /v1/users/{id}/preferences          users:write
    PUT    /v1/users/{id}/devices/{token}      users:write
    DELETE /v1/users/{id}/devices/{token}      users:write
    GET    /v1/users/{id}/inbox                records:read
    POST   /v1/users/{id}/inbox/read           users:write
    POST   /v1/receipts/{provider}             provider signature (twilio, smsvendor; a sendgrid or ses provider's name)
    GET    /  /healthz  /metrics  /v1/status.json  /v1/openapi.json     open

Redis keys of the API (``<ns>`` is the transport's prefix, ``nfs`` by default)
------------------------------------------------------------------------------
``<ns>:api:biz:<biz_key>`` (string, JSON)
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
``<ns>:api:prefs`` (hash user_id → Preferences JSON)
    The read model of ``GET /v1/users/{id}/preferences``: the last PUT accepted
    by the API, written (compare-and-set on the version) before the update is
    produced to ``notify.preferences``. Updates that producers write straight
    to the topic are not reflected here.
``<ns>:api:receipt-seen:<scheme>:<sig>``
    The receipt replay guard (``SET NX PX``), see :mod:`adapters.receipts`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any, Optional

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from adapters.receipts import ReceiptRejected, ReceiptVerifier, RedisReplayGuard
from adapters.receipts_email import email_receipt_config, email_receipts
from pipeline import ids
from pipeline import topics as T
from pipeline.models import DeviceUpdate, Event
from config.settings import CHANNELS
from pipeline.rules import release, slo
from pipeline.rules.states import RANK
from pipeline.rules.priority import PRIORITY_ANY_HEADER, PRIORITY_ANY_SCOPE, above_cap
from pipeline.rules.validate import MAX_ID, TOKEN_RE, InvalidEvent, check_params, parse_event, parse_preferences
from pipeline.rules.validate import PUSH_PLATFORMS, id_problem
from pipeline.store import RecordStore
from pipeline.transport.client import connect, parse_url
from pipeline.transport.keys import Keys

from . import metrics_lag as M
from .auth import OPEN, PRINCIPAL, SIGNED, KeyStore, auth_middleware, requires
from .errors import api_error, error_body, error_middleware, json_response
from .openapi import build_openapi
from .producer import TopicWriter
from .status import PAGE, status_document

__all__ = ["make_app", "Api", "API_KEY", "DEFAULT_IDEMPOTENCY_TTL"]

log = logging.getLogger("notify.api")

API_KEY = web.AppKey("notify_api", "Api")
DEFAULT_IDEMPOTENCY_TTL = 7 * 86400
CLAIM_TTL = 30
PROVIDERS = ("twilio", "smsvendor")
_MAX_VERSION = 2**63 - 1

_NID_RE = re.compile(r"^n_[0-9a-f]{20}$")
_RELEASE_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_DID_RE = re.compile(r"^n_[0-9a-f]{20}\.(inbox|push|sms|email|webhook)$")

#: compare-and-delete of a claim (only the request that took it releases it)
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
#: compare-and-set of one user's preferences in the read model: ARGV uid, the
#: exact value expected now ('' = none), the new value ('' = delete); 1 if done
_PREFS_CAS = """
if (redis.call('HGET', KEYS[1], ARGV[1]) or '') ~= ARGV[2] then return 0 end
if ARGV[3] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) else redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) end
return 1
"""


def _record(row: dict[str, Any]) -> dict[str, Any]:
    """A record-store row as the API shows it (``state``, not the seed's ``status``)."""
    return {
        "delivery_id": row["delivery_id"],
        "notification_id": row["notification_id"],
        "biz_key": row["biz_key"],
        "user_id": row["user_id"],
        "channel": row["channel"],
        "category": row["category"],
        "template": row["template_code"],
        "priority": row["priority"],
        "state": row["status"],
        "reason": row["reason"],
        "provider": row["provider"],
        "provider_msg_id": row["provider_msg_id"],
        "retry_count": row["retry_count"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "sent_at": row["sent_at"],
        "delivered_at": row["delivered_at"],
        "accepted_at": row["accepted_at"],
        "latency_ms": row["latency_ms"],
        "producer": row["producer"],
        "pref_version": row["pref_version"],
        "template_version": row["template_version"],
    }


def _overall(states: list[str]) -> str:
    """One state for a notification's channels: the highest in the record precedence."""
    return max(states, key=lambda s: RANK.get(s, -1)) if states else "PENDING"


def _integral(value: Any) -> Any:
    """``409.0`` → ``409``: JSON does not tell 1 from 1.0 (nor does JSON Schema's
    ``integer``); the validators want Python ints."""
    if isinstance(value, float) and value.is_integer() and -(2**63) <= value < 2**63:
        return int(value)
    return value


def _coerce_integers(data: Any, fields: tuple[str, ...], list_fields: tuple[str, ...] = ()) -> bool:
    """Turn integral floats into ints in ``data``'s top-level ``fields`` and in
    the items of ``list_fields``; True if anything changed."""
    if not isinstance(data, dict):
        return False
    changed = False
    for f in fields:
        if f in data and _integral(data[f]) is not data[f]:
            data[f] = _integral(data[f])
            changed = True
    for f in list_fields:
        items = data.get(f)
        if isinstance(items, list):
            new = [_integral(x) for x in items]
            if any(a is not b for a, b in zip(new, items)):
                data[f] = new
                changed = True
    return changed


#: fields events gained later, left out of the fingerprint at their default, so a
#: repeat of an event accepted before they existed still matches its record
_LATER_FIELDS = {"producer": "", "callback_url": None}


def fingerprint(event: Event) -> str:
    d = event.asdict()
    d.pop("accepted_at", None)
    for name, default in _LATER_FIELDS.items():
        if d.get(name, default) == default:
            d.pop(name, None)
    return hashlib.sha256(orjson.dumps(d, option=orjson.OPT_SORT_KEYS)).hexdigest()


#: broker connections the API keeps at most (requests beyond wait for one)
BROKER_POOL = 64

#: statuses of refused events other than 400
_STATUS = {"oversized": 413, "missing_params": 422}


class _TrackingGuard:
    """The Redis replay guard, remembering what this request marked as seen, so
    a receipt we failed to write can be retried by the provider."""

    def __init__(self, inner: RedisReplayGuard) -> None:
        self.inner = inner
        self.marked: list[str] = []

    async def first_seen(self, key: str, ttl: float) -> bool:
        fresh = await self.inner.first_seen(key, ttl)
        if fresh:
            self.marked.append(key)
        return fresh

    async def forget(self) -> None:
        if self.marked:
            await self.inner.redis.delete(*(self.inner.prefix + k for k in self.marked))


class _ScheduledCount:
    """Records in state SCHEDULED, counted on a separate read-only connection at
    most every ``ttl`` seconds (a scrape never waits behind a long count)."""

    def __init__(self, path: str, ttl: float = 10.0) -> None:
        self.path = path
        self.ttl = ttl
        self.value: Optional[int] = None
        self._at = 0.0
        self._db: Any = None

    async def refresh(self) -> None:
        if time.monotonic() - self._at < self.ttl:
            return
        self._at = time.monotonic()
        try:
            import aiosqlite

            if self._db is None:
                uri = Path(os.path.abspath(self.path)).as_uri() + "?mode=ro"
                self._db = await aiosqlite.connect(uri, uri=True)
                await self._db.execute("PRAGMA busy_timeout=1000")
            async with self._db.execute("SELECT count(*) FROM notify_record WHERE status = 'SCHEDULED'") as cur:
                row = await cur.fetchone()
            self.value = int(row[0]) if row else 0
        except Exception:  # noqa: BLE001 - a missing metric, not a failed scrape
            log.debug("scheduled count failed", exc_info=True)
            self.value = None

    def __call__(self) -> Optional[int]:
        return self.value

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None


class Api:
    def __init__(
        self,
        settings: Any,
        *,
        broker_url: str,
        store_path: str,
        keys: KeyStore,
        renderer: Any,
        twilio_auth_token: Optional[str],
        vendor_secret: Optional[str],
        public_url: Optional[str],
        idempotency_ttl: int,
        batch_max_events: int,
    ) -> None:
        self.settings = settings
        self.broker_url = broker_url
        self.store_path = store_path
        self.keys = keys
        self.renderer = renderer
        self.twilio_auth_token = twilio_auth_token
        self.vendor_secret = vendor_secret
        self.public_url = public_url.rstrip("/") if public_url else None
        self.idempotency_ttl = int(idempotency_ttl)
        self.batch_max_events = batch_max_events
        prefix = parse_url(broker_url).query.get("prefix") or "nfs"
        self.rkeys = Keys(prefix)
        self.ns = prefix
        self.client: Any = None
        self.writer: Optional[TopicWriter] = None
        self.store: Optional[RecordStore] = None
        self.sampler: Optional[M.LagSampler] = None
        self.scheduled = _ScheduledCount(store_path)
        self.lag_registry: Any = None
        self.openapi = build_openapi(settings, renderer=renderer, batch_max_events=batch_max_events)

    # -- lifecycle ----------------------------------------------------------

    async def start(self) -> None:
        # a bounded pool: under a burst of producers a request waits for a connection
        # (up to 5 s, then 429 over_capacity) instead of opening one of its own
        self.client = await connect([self.broker_url], pool_size=BROKER_POOL, pool_timeout=5.0)
        self.writer = TopicWriter(self.client, self.rkeys, self.settings.partitions)
        Path(os.path.abspath(self.store_path)).parent.mkdir(parents=True, exist_ok=True)
        self.store = await RecordStore(self.store_path).open()
        self.sampler = M.LagSampler(self.client, self.rkeys, self.settings.partitions)
        self.lag_registry = M.new_registry(M.LagCollector(self.sampler, self.scheduled))

    async def stop(self) -> None:
        await self.scheduled.close()
        if self.store is not None:
            await self.store.close()
        if self.client is not None:
            await self.client.aclose()

    def biz_key(self, biz_key: str, producer: str = "") -> str:
        """A business key's idempotency record, in its producer's key space
        (producer names never hold a '/')."""
        return f"{self.ns}:api:biz:{producer}/{biz_key}" if producer else f"{self.ns}:api:biz:{biz_key}"

    @staticmethod
    def _reader_scope(request: web.Request) -> Optional[str]:
        """Whose records the caller may read: its own producer's, or every
        producer's (None) with the ``admin`` scope."""
        principal = request.get(PRINCIPAL)
        if principal is None or "admin" in principal.scopes:
            return None
        return principal.producer

    @property
    def prefs_key(self) -> str:
        return f"{self.ns}:api:prefs"

    # -- helpers ------------------------------------------------------------

    @property
    def body_timeout(self) -> float:
        api = getattr(self.settings, "api", None)
        return float(getattr(api, "body_timeout_s", 30.0))

    async def _read(self, request: web.Request) -> bytes:
        """The request's body, within ``[api] body_timeout_s`` (408 and the
        connection closed after it: a client holding a half-sent body holds
        nothing longer); a body that does not decode as its Content-Encoding says
        is a 400, not a 500 with a traceback."""
        try:
            async with asyncio.timeout(self.body_timeout):
                return await request.read()
        except TimeoutError:
            err = api_error(408, "body_timeout", f"the body did not arrive within {self.body_timeout:g} s")
            err.force_close()
            raise err from None
        except web.RequestPayloadError:
            # e.g. "Content-Encoding: gzip" over a body that is not gzip
            err = api_error(400, "bad_body", "the body could not be read as its Content-Encoding and "
                            "Transfer-Encoding say (nothing was taken)")
            err.force_close()
            raise err from None
        except ConnectionResetError:
            # the client left mid-body: nobody reads an answer, nothing to log but a line
            log.debug("client left before sending its body: %s %s", request.method, request.path)
            err = api_error(400, "bad_body", "the connection closed before the body arrived")
            err.force_close()
            raise err from None

    async def _json_body(self, request: web.Request, *, optional: bool = False) -> Any:
        raw = await self._read(request)
        if not raw.strip():
            if optional:
                return None
            raise api_error(400, "bad_json", "a JSON body is required")
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise api_error(400, "bad_json", str(exc)[:200]) from None

    @staticmethod
    def _user_id(request: web.Request) -> str:
        raw = request.match_info["id"]
        uid = raw.strip()
        if not uid or len(uid) > MAX_ID:
            raise api_error(400, "bad_value", f"user ids are 1..{MAX_ID} characters", field="id")
        problem = id_problem(raw)
        if problem is not None:
            raise api_error(400, "bad_value", f"no control, format or separator characters in a user id: "
                            f"{problem}", field="id")
        return uid

    @staticmethod
    def _int_param(request: web.Request, name: str, default: Optional[int], lo: int, hi: int) -> Optional[int]:
        raw = request.query.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise api_error(400, "wrong_type", f"{name} must be an integer", field=name) from None
        if not lo <= value <= hi:
            raise api_error(400, "bad_value", f"{name} must be in {lo}..{hi}", field=name)
        return value

    async def _all_records(self, biz_key: str, producer: str) -> list[dict[str, Any]]:
        assert self.store is not None
        rows: list[dict[str, Any]] = []
        cursor = None
        while True:
            page, cursor = await self.store.find(biz_key=biz_key, limit=1000, cursor=cursor, producer=producer)
            rows.extend(page)
            if cursor is None:
                return rows

    async def _states(self, biz_key: str, recipients: list[str], producer: str) -> list[dict[str, Any]]:
        """The original ids of a biz_key with their current states (PENDING if not recorded yet)."""
        by_nid: dict[str, list[dict[str, Any]]] = {}
        for row in await self._all_records(biz_key, producer):
            by_nid.setdefault(row["notification_id"], []).append(row)
        out = []
        for user in recipients:
            nid = ids.notification_id(biz_key, user, producer)
            rows = sorted(by_nid.get(nid, []), key=lambda r: r["channel"])
            out.append({
                "user_id": user,
                "notification_id": nid,
                "state": _overall([r["status"] for r in rows]),
                "channels": [
                    {"channel": r["channel"], "delivery_id": r["delivery_id"], "state": r["status"],
                     "reason": r["reason"]}
                    for r in rows
                ],
            })
        return out

    # -- events -------------------------------------------------------------

    def _parse_event(self, raw: bytes, priority_any: bool = False) -> Event:
        ev = self._parse_event_fields(raw, priority_any)
        check_params(ev, self.renderer)  # missing_params: 422, the variables named
        return ev

    def _parse_event_fields(self, raw: bytes, priority_any: bool = False) -> Event:
        # now: send_at is bounded both ways at the door; priority: capped by the
        # category unless the key holds priority:any
        kw = {"now": time.time(), "priority_any": priority_any}
        try:
            return parse_event(raw, self.settings, self.renderer, **kw)
        except InvalidEvent as exc:
            if exc.reason != "wrong_type":
                raise
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise exc from None
            if not _coerce_integers(data, ("v", "template_version"), ("recipients",)):
                raise
            return parse_event(orjson.dumps(data), self.settings, self.renderer, **kw)

    @requires("events:write")
    async def post_events(self, request: web.Request) -> web.Response:
        raw = await self._read(request)
        principal = request.get(PRINCIPAL)
        priority_any = principal is not None and PRIORITY_ANY_SCOPE in principal.scopes
        head = raw.lstrip()[:1]
        batch = head == b"["
        if batch:
            try:
                items = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise api_error(400, "bad_json", str(exc)[:200]) from None
            if not items:
                raise api_error(400, "empty_batch", "the batch is empty")
            if len(items) > self.batch_max_events:
                raise api_error(413, "batch_too_large", f"{len(items)} events > {self.batch_max_events} per request")
            events = []
            for i, item in enumerate(items):
                try:
                    events.append(self._parse_event(orjson.dumps(item), priority_any))
                except InvalidEvent as exc:
                    field = f"[{i}]" + (f".{exc.field}" if exc.field else "")
                    status = _STATUS.get(exc.reason, 400)
                    raise api_error(status, exc.reason, str(exc), field=field, index=i) from None
        else:
            try:
                events = [self._parse_event(raw, priority_any)]
            except InvalidEvent as exc:
                raise api_error(_STATUS.get(exc.reason, 400), exc.reason, str(exc), field=exc.field) from None
        results = await self._accept(events, principal.producer if principal else "")
        if not batch:
            r = results[0]
            if r["status"] == "accepted":
                return json_response(r, status=202)
            if r["status"] == "duplicate":
                return json_response(r, status=200)
            headers = {"Retry-After": "1"} if r["status"] == "in_progress" else None
            return json_response({"error": r.pop("error"), **r}, status=409, headers=headers)
        statuses = {r["status"] for r in results}
        code = 202 if "accepted" in statuses else 200 if statuses == {"duplicate"} else 409
        return json_response({"results": results}, status=code)

    async def _accept(self, events: list[Event], producer: str) -> list[dict[str, Any]]:
        """Claim, write and confirm (see the module doc); one result per event."""
        assert self.writer is not None
        now = time.time()
        results: list[Optional[dict[str, Any]]] = [None] * len(events)
        first: dict[str, int] = {}  # biz_key → index of its first event in this request
        claims: dict[int, tuple[str, bytes, dict[str, Any]]] = {}
        prepared: dict[int, tuple[Event, str]] = {}
        for i, ev in enumerate(events):
            # the caller's key space: a producer field in the body is replaced
            ev = Event(**{**ev.asdict(), "accepted_at": now, "producer": producer})
            fp = fingerprint(ev)
            prepared[i] = (ev, fp)
            if ev.biz_key in first:
                continue
            first[ev.biz_key] = i
            rec = {"fp": fp, "at": now, "st": "claim", "recipients": ev.recipients, "token": secrets.token_hex(8)}
            claims[i] = (self.biz_key(ev.biz_key, producer), orjson.dumps(rec), rec)

        pipe = self.client.pipeline(transaction=False)
        for key, value, _rec in claims.values():
            pipe.set(key, value, nx=True, ex=CLAIM_TTL)
            pipe.get(key)
        answers = await pipe.execute()
        ours: list[int] = []
        existing: dict[int, Optional[dict[str, Any]]] = {}
        for n, i in enumerate(claims):
            took, current = answers[2 * n], answers[2 * n + 1]
            if took:
                ours.append(i)
            else:
                try:
                    existing[i] = orjson.loads(current) if current else None
                except orjson.JSONDecodeError:
                    existing[i] = None

        # write the claimed events: one pipeline round trip for the whole request
        if ours:
            hdr = [("producer", producer.encode())] if producer else []
            # OTPs on notify.events.high: they never wait behind a campaign in notify.events
            # an event above its category's priority cap (only a priority:any key gets one
            # through) carries the mark that lets expand keep it (pipeline/rules/priority.py)
            msgs = [(T.event_topic(self.settings, ev.category, ev.priority), T.event_key(ev.biz_key, ev.recipients),
                     ev.dumps(),
                     hdr + [PRIORITY_ANY_HEADER] if above_cap(self.settings.category(ev.category), ev.priority)
                     else hdr)
                    for ev in (prepared[i][0] for i in ours)]
            try:
                await self.writer.send(msgs)
            except BaseException:
                await self._release([claims[i] for i in ours])
                raise
            # the events are in the stream: accepted, whatever happens next
            try:
                pipe = self.client.pipeline(transaction=False)
                for i in ours:
                    key, _v, rec = claims[i]
                    pipe.set(key, orjson.dumps({**rec, "st": "ok"}), ex=self.idempotency_ttl)
                await pipe.execute()
            except Exception:  # noqa: BLE001 - the claims expire; a later repeat may write again
                log.warning("accepted %d events but could not confirm their idempotency records; a repeat "
                            "within %ds answers in_progress, later ones are written again (the pipeline "
                            "dedups them)", len(ours), CLAIM_TTL, exc_info=True)
            M.events_accepted.inc(len(ours))
            for i in ours:
                ev = prepared[i][0]
                results[i] = {
                    "status": "accepted",
                    "biz_key": ev.biz_key,
                    "accepted_at": now,
                    "notifications": [
                        {"user_id": u, "notification_id": ids.notification_id(ev.biz_key, u, producer)}
                        for u in ev.recipients
                    ],
                }

        # repeats: of an earlier request (existing) or of an event earlier in this one
        for i, (ev, fp) in prepared.items():
            if results[i] is not None:
                continue
            j = first[ev.biz_key]
            rec: Optional[dict[str, Any]] = existing.get(j)
            done = results[j]
            if j != i and done is not None and done["status"] == "accepted":
                rec = {"fp": prepared[j][1], "at": now, "st": "ok", "recipients": prepared[j][0].recipients}
            results[i] = await self._repeat(ev, fp, rec)
        for i, (ev, _fp) in prepared.items():
            res = results[i]
            if res is not None and res["status"] in ("accepted", "duplicate"):
                # the lane the event runs on: its own priority, capped by its category, else the category's
                res["priority"] = ev.priority or self.settings.category(ev.category).priority
        return results  # type: ignore[return-value]

    async def _repeat(self, ev: Event, fp: str, rec: Optional[dict[str, Any]]) -> dict[str, Any]:
        if rec is None or rec.get("st") != "ok":
            return {
                "status": "in_progress",
                "biz_key": ev.biz_key,
                "error": error_body("in_progress", "an earlier request with this biz_key is still being written; "
                                    "retry in a second", field="biz_key")["error"],
            }
        if rec.get("fp") != fp:
            return {
                "status": "conflict",
                "biz_key": ev.biz_key,
                "accepted_at": rec.get("at"),
                "error": error_body("biz_key_conflict", "this biz_key was accepted with different content; "
                                    "nothing was written", field="biz_key")["error"],
            }
        M.events_duplicate.inc()
        return {
            "status": "duplicate",
            "biz_key": ev.biz_key,
            "accepted_at": rec.get("at"),
            "notifications": await self._states(ev.biz_key, list(rec.get("recipients") or ev.recipients),
                                                ev.producer),
        }

    async def _release(self, claims: list[tuple[str, bytes, dict[str, Any]]]) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            for key, value, _rec in claims:
                pipe.eval(_RELEASE, 1, key, value)
            await pipe.execute()
        except Exception:  # noqa: BLE001 - the claims expire after CLAIM_TTL anyway
            log.warning("could not release %d idempotency claims", len(claims), exc_info=True)

    # -- records ------------------------------------------------------------

    @requires("records:read")
    async def get_notification(self, request: web.Request) -> web.Response:
        assert self.store is not None
        key = request.match_info["id"]
        if not (_NID_RE.match(key) or _DID_RE.match(key)):
            raise api_error(404, "not_found", "not a notification id (n_…) or delivery id (n_….<channel>)",
                            field="id")
        rows = await self.store.get(key)
        scope = self._reader_scope(request)
        if scope is not None:  # another producer's notification is not found, not forbidden
            rows = [r for r in rows if r["producer"] == scope]
        if not rows:
            raise api_error(404, "not_found", "no record for this id (an accepted notification appears once "
                            "the pipeline records its first state)", field="id")
        deliveries = []
        for row in rows:
            rec = _record(row)
            rec["attempts"] = await self.store.attempts(row["delivery_id"])
            deliveries.append(rec)
        first = rows[0]
        return json_response({
            "notification_id": first["notification_id"],
            "biz_key": first["biz_key"],
            "user_id": first["user_id"],
            "state": _overall([r["status"] for r in rows]),
            "deliveries": deliveries,
        })

    @requires("records:read", query=("biz_key", "user_id", "limit", "cursor"))
    async def list_notifications(self, request: web.Request) -> web.Response:
        assert self.store is not None
        biz_key = request.query.get("biz_key") or None
        user_id = request.query.get("user_id") or None
        if biz_key is not None and len(biz_key) > 64:
            raise api_error(400, "bad_value", "biz_key is at most 64 characters", field="biz_key")
        if user_id is not None and len(user_id) > MAX_ID:
            raise api_error(400, "bad_value", f"user_id is at most {MAX_ID} characters", field="user_id")
        limit = self._int_param(request, "limit", 50, 1, 1000)
        cursor = self._int_param(request, "cursor", None, 1, 2**62)
        rows, nxt = await self.store.find(biz_key=biz_key, user_id=user_id, limit=limit, cursor=cursor,
                                          producer=self._reader_scope(request))
        return json_response({"items": [_record(r) for r in rows], "next_cursor": nxt})

    @requires("records:read", query=("since", "until", "month"))
    async def get_slo(self, request: web.Request) -> web.Response:
        """Seed 001's service level over the caller's events (every producer's
        with ``admin``): ``month=YYYY-MM`` (default: this month, UTC), or
        ``since``/``until`` (unix seconds or ISO 8601)."""
        assert self.store is not None
        now = time.time()
        q = request.query
        field = "month"
        try:
            since, until = slo.month_range(q.get("month"), now)
            if "since" in q or "until" in q:
                field = "since"
                since = slo.parse_time(q["since"]) if "since" in q else since
                field = "until"
                until = slo.parse_time(q["until"]) if "until" in q else now
        except ValueError as exc:
            raise api_error(400, "bad_value", str(exc), field=field) from None
        if until <= since:
            raise api_error(400, "bad_value", "until must be after since", field="until")
        rows = await self.store.slo_events(since, until, producer=self._reader_scope(request))
        return json_response(slo.summarize(rows, since, until, now))

    # -- gray releases (pipeline/rules/release.py) ---------------------------

    async def _releases(self) -> list[dict[str, Any]]:
        raw = await self.client.hgetall(self.rkeys.releases)
        out = {r.name: {**r.as_dict(), "source": "config"} for r in self.settings.releases}
        for k, v in raw.items():
            name = k.decode() if isinstance(k, bytes) else str(k)
            try:
                out[name] = {**release.parse_release(name, orjson.loads(v), CHANNELS).as_dict(), "source": "api"}
            except (ValueError, orjson.JSONDecodeError, TypeError):
                continue
        return [out[n] for n in sorted(out)]

    @requires("admin")
    async def list_releases(self, request: web.Request) -> web.Response:
        return json_response({"items": await self._releases()})

    @requires("admin")
    async def put_release(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if not _RELEASE_RE.fullmatch(name):
            raise api_error(400, "bad_value", "release names are a-z, 0-9, _ and -, up to 64", field="name")
        body = await self._json_body(request)
        try:
            r = release.parse_release(name, body, CHANNELS)
        except ValueError as exc:
            field = str(exc).split(":", 1)[0].removeprefix(f"releases.{name}").lstrip(".") or None
            raise api_error(400, "bad_value", str(exc).split(": ", 1)[-1], field=field) from None
        if r.template is not None and not self.renderer.has_template(r.template, r.version):
            raise api_error(400, "unknown_template", f"no template {r.template} v{r.version}", field="version")
        await self.client.hset(self.rkeys.releases, name, orjson.dumps(r.as_dict()))
        return json_response({**r.as_dict(), "source": "api"})

    @requires("admin")
    async def delete_release(self, request: web.Request) -> web.Response:
        removed = await self.client.hdel(self.rkeys.releases, request.match_info["name"])
        if not removed:
            raise api_error(404, "not_found", "no release of that name was set through the API", field="name")
        return json_response({"deleted": request.match_info["name"]})

    # -- users --------------------------------------------------------------

    @requires("users:read")
    async def get_preferences(self, request: web.Request) -> web.Response:
        uid = self._user_id(request)
        raw = await self.client.hget(self.prefs_key, uid)
        if raw is None:
            raise api_error(404, "not_found", "no preferences were set for this user through the API")
        return web.Response(body=raw, content_type="application/json")

    @requires("users:write")
    async def put_preferences(self, request: web.Request) -> web.Response:
        assert self.writer is not None
        uid = self._user_id(request)
        body = await self._json_body(request)
        if not isinstance(body, dict):
            raise api_error(400, "not_an_object", "the preferences are a JSON object")
        _coerce_integers(body, ("version", "v"))
        if body.get("user_id") is not None and str(body["user_id"]).strip() != uid:
            raise api_error(400, "bad_value", "user_id differs from the path", field="user_id")
        explicit = body.get("version")
        if isinstance(explicit, int) and not isinstance(explicit, bool) and explicit > _MAX_VERSION:
            raise api_error(400, "bad_value", f"version is at most {_MAX_VERSION}", field="version")
        for _ in range(8):
            cur = await self.client.hget(self.prefs_key, uid)
            cur_v = -1
            if cur is not None:
                try:
                    cur_v = int(orjson.loads(cur).get("version") or 0)
                except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
                    cur_v = 0
            doc = {**body, "user_id": uid, "version": explicit if explicit is not None else max(cur_v + 1, 1)}
            try:
                prefs = parse_preferences(doc, self.settings)
            except InvalidEvent as exc:
                raise api_error(400, exc.reason, str(exc), field=exc.field) from None
            if prefs.version > _MAX_VERSION:
                raise api_error(409, "stale_version", "the version is at its maximum", field="version",
                                current_version=cur_v)
            if prefs.version < cur_v:
                raise api_error(409, "stale_version", f"version {prefs.version} < current {cur_v}",
                                field="version", current_version=cur_v)
            value = prefs.dumps()
            if int(await self.client.eval(_PREFS_CAS, 1, self.prefs_key, uid, cur or b"", value)):
                break
        else:
            raise api_error(409, "conflict", "concurrent updates of these preferences; retry")
        try:
            await self.writer.send([(T.PREFERENCES, uid.encode(), value, [])])
        except BaseException:
            # put the read model back (only if nobody changed it since)
            try:
                await self.client.eval(_PREFS_CAS, 1, self.prefs_key, uid, value, cur or b"")
            except Exception:  # noqa: BLE001
                log.warning("could not restore the preferences read model of %s", uid, exc_info=True)
            raise
        return web.Response(body=value, status=202, content_type="application/json")

    def _token(self, request: web.Request) -> str:
        token = request.match_info["token"]
        if not TOKEN_RE.match(token):
            raise api_error(400, "bad_value", "a device token is 1..512 of A-Z a-z 0-9 : _ . -", field="token")
        return token

    async def _device(self, uid: str, token: str, platform: str, op: str) -> web.Response:
        assert self.writer is not None
        upd = DeviceUpdate(user_id=uid, token=token, platform=platform, op=op, at=time.time())
        await self.writer.send([(T.DEVICES, uid.encode(), upd.dumps(), [])])
        return json_response({"user_id": uid, "token": token, "platform": platform, "op": op, "at": upd.at},
                             status=202)

    @requires("users:write")
    async def put_device(self, request: web.Request) -> web.Response:
        uid = self._user_id(request)
        token = self._token(request)
        body = await self._json_body(request)
        if not isinstance(body, dict):
            raise api_error(400, "not_an_object", 'the body is {"platform": "apns"|"fcm"|"hms"}')
        platform = body.get("platform")
        if platform is None:
            raise api_error(400, "missing_field", "platform is required", field="platform")
        if platform not in PUSH_PLATFORMS:
            raise api_error(400, "bad_value", "platform is apns, fcm or hms", field="platform")
        return await self._device(uid, token, platform, "add")

    @requires("users:write", query=("platform",))
    async def delete_device(self, request: web.Request) -> web.Response:
        uid = self._user_id(request)
        token = self._token(request)
        platform = request.query.get("platform", "apns")
        if platform not in PUSH_PLATFORMS:
            raise api_error(400, "bad_value", "platform is apns, fcm or hms", field="platform")
        return await self._device(uid, token, platform, "remove")

    @requires("users:read", query=("limit", "before"))
    async def get_inbox(self, request: web.Request) -> web.Response:
        assert self.store is not None
        uid = self._user_id(request)
        limit = self._int_param(request, "limit", 50, 1, 200)
        before = self._int_param(request, "before", None, 1, 2**62)
        items, unread = await self.store.inbox(uid, limit=limit, before=before)
        nxt = items[-1]["id"] if len(items) == limit else None
        return json_response({"user_id": uid, "unread": unread, "items": items, "next_before": nxt})

    @requires("users:write")
    async def post_inbox_read(self, request: web.Request) -> web.Response:
        assert self.store is not None
        uid = self._user_id(request)
        body = await self._json_body(request)
        if not isinstance(body, dict):
            raise api_error(400, "not_an_object", 'the body is {"delivery_ids": [...]} or {"all": true}')
        dids = body.get("delivery_ids")
        if "all" in body and not isinstance(body["all"], bool):
            raise api_error(400, "wrong_type", "true or false", field="all")
        if "delivery_ids" in body:
            if not isinstance(dids, list) or not all(isinstance(d, str) for d in dids):
                raise api_error(400, "wrong_type", "a list of delivery ids", field="delivery_ids")
            if len(dids) > 1000:
                raise api_error(400, "bad_value", "at most 1000 ids at once", field="delivery_ids")
            marked = await self.store.mark_read(uid, dids)
        elif body.get("all") is True:
            marked = await self.store.mark_read(uid, None)
        else:
            raise api_error(400, "missing_field", 'send {"delivery_ids": [...]} or {"all": true}',
                            field="delivery_ids")
        _items, unread = await self.store.inbox(uid, limit=0)
        return json_response({"user_id": uid, "marked": marked, "unread": unread})

    # -- receipts -----------------------------------------------------------

    @requires(SIGNED)
    async def post_receipt(self, request: web.Request) -> web.Response:
        assert self.writer is not None
        provider = request.match_info["provider"]
        # a [providers.<name>] of kind sendgrid or ses: its events, verified with its own settings
        mail_cfg = email_receipt_config(getattr(self.settings, "providers", None) or {}, provider)
        if provider not in PROVIDERS and mail_cfg is None:
            raise api_error(404, "unknown_provider", f"receipts are taken for {', '.join(PROVIDERS)} and the "
                            f"providers of kind sendgrid or ses", field="provider")
        guard = _TrackingGuard(RedisReplayGuard(self.client, prefix=f"{self.ns}:api:receipt-seen:"))
        api = getattr(self.settings, "api", None)
        bounds = {} if api is None else {"receipt_max_age": api.receipt_max_age_s,
                                         "receipt_max_ahead": api.receipt_max_ahead_s}
        verifier = ReceiptVerifier(twilio_auth_token=self.twilio_auth_token, vendor_secret=self.vendor_secret,
                                   guard=guard, **bounds, **(mail_cfg["verifier"] if mail_cfg else {}))
        body = await self._read(request)
        try:
            if mail_cfg is not None:
                receipts = await email_receipts(verifier, mail_cfg["scheme"], body, request.headers)
            elif provider == "twilio":
                # the full URL Twilio called (its signature covers the query string), the
                # raw body (a form, or JSON with bodySHA256) and the signature headers
                url = (self.public_url + str(request.rel_url)) if self.public_url else str(request.url)
                one = await verifier.twilio_request(url, request.content_type, body, request.headers)
                receipts = [one] if one is not None else []
            else:
                receipts = await verifier.vendor(
                    body, request.headers.get("X-Vendor-Timestamp"), request.headers.get("X-Vendor-Signature")
                )
        except ReceiptRejected as exc:
            M.receipts_rejected.labels(provider, exc.reason).inc()
            if exc.reason == "malformed":
                raise api_error(400, "malformed", exc.detail or "malformed receipt", field=exc.field) from None
            raise api_error(401, exc.reason, exc.detail or exc.reason) from None
        if receipts:
            try:
                await self.writer.send(
                    [(T.RECEIPTS, r.provider_msg_id.encode(), r.dumps(), []) for r in receipts]
                )
            except BaseException:
                await guard.forget()  # let the provider's retry through
                raise
            for r in receipts:
                M.receipts_received.labels(provider, r.status).inc()
        return json_response({"received": len(receipts)})

    #: a callback URL may carry any query string (ours to choose; Twilio signs it)
    post_receipt.query = None  # type: ignore[attr-defined]

    # -- open endpoints -------------------------------------------------------

    @requires(OPEN)
    async def healthz(self, request: web.Request) -> web.Response:
        broker = store = False
        try:
            broker = bool(await asyncio.wait_for(self.client.ping(), 2.0))
        except Exception:  # noqa: BLE001
            pass
        try:
            assert self.store is not None
            await asyncio.wait_for(self.store.find(limit=1), 2.0)
            store = True
        except Exception:  # noqa: BLE001
            pass
        if broker and store:
            return json_response({"status": "ok", "broker": True, "store": True})
        return json_response(
            error_body("unhealthy", "a dependency is unavailable", broker=broker, store=store), status=503
        )

    @requires(OPEN)
    async def metrics(self, request: web.Request) -> web.Response:
        assert self.sampler is not None
        await self.sampler.snapshot(force=True)  # every scrape reads Redis
        await self.scheduled.refresh()
        body = generate_latest(REGISTRY) + generate_latest(self.lag_registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    @requires(OPEN)
    async def status_page(self, request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html", headers={"Cache-Control": "no-store"})

    @requires(OPEN)
    async def status_json(self, request: web.Request) -> web.Response:
        doc = await status_document(self.sampler, self.store, self.client, self.rkeys,
                                    self.settings.backpressure.after_s)
        return json_response(doc, headers={"Cache-Control": "no-store"})

    @requires(OPEN)
    async def openapi_json(self, request: web.Request) -> web.Response:
        return json_response(self.openapi)


def _metrics_middleware():
    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        started = time.perf_counter()
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        status = 500
        try:
            resp = await handler(request)
            status = resp.status
            return resp
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            M.api_requests.labels(request.method, route, str(status)).inc()
            M.api_latency.labels(route).observe(time.perf_counter() - started)

    return middleware


def make_app(
    settings: Any,
    *,
    broker_url: str,
    store_path: str,
    keys_path: Optional[str] = None,
    bootstrap_key: Optional[str] = None,
    twilio_auth_token: Optional[str] = None,
    vendor_secret: Optional[str] = None,
    public_url: Optional[str] = None,
    idempotency_ttl: Optional[int] = None,
    batch_max_events: int = 500,
    batch_max_bytes: int = 4 << 20,
    renderer: Any = None,
) -> web.Application:
    """The API application. Connects to the broker and opens the record store on
    startup (``broker_url`` is a ``redis://``/``rediss://`` URL; a ``prefix``
    query option is honoured like the transport's).

    Secrets default to the environment: ``NOTIFY_API_KEY`` (bootstrap key, all
    scopes), ``NOTIFY_TWILIO_AUTH_TOKEN``, ``NOTIFY_VENDOR_SECRET``;
    ``NOTIFY_API_PUBLIC_URL`` is the externally visible base URL (Twilio signs
    the URL it called: set it behind a proxy); ``NOTIFY_API_IDEMPOTENCY_TTL``
    (seconds) how long a biz_key is remembered.

    Bodies are capped at ``max(settings.max_event_bytes, batch_max_bytes)``
    (413 above); a batch holds at most ``batch_max_events`` events (413).
    """
    env = os.environ
    if keys_path is None:
        keys_path = os.path.join(settings.data_dir, "api_keys.json")
    if bootstrap_key is None:
        bootstrap_key = env.get("NOTIFY_API_KEY") or None
    if twilio_auth_token is None:
        twilio_auth_token = env.get("NOTIFY_TWILIO_AUTH_TOKEN") or None
    if vendor_secret is None:
        vendor_secret = env.get("NOTIFY_VENDOR_SECRET") or None
    if public_url is None:
        public_url = env.get("NOTIFY_API_PUBLIC_URL") or None
    if idempotency_ttl is None:
        idempotency_ttl = int(env.get("NOTIFY_API_IDEMPOTENCY_TTL") or DEFAULT_IDEMPOTENCY_TTL)
    if renderer is None:
        from pipeline.templates import Renderer

        renderer = Renderer.from_settings(settings)
    keys = KeyStore(keys_path, bootstrap_key=bootstrap_key)
    if not len(keys):
        log.warning("no API keys in %s and no NOTIFY_API_KEY: every authenticated endpoint answers 401 "
                    "(create one with `notify keys add <producer> --scopes ...`)", keys_path)
    api = Api(
        settings, broker_url=broker_url, store_path=str(store_path), keys=keys, renderer=renderer,
        twilio_auth_token=twilio_auth_token, vendor_secret=vendor_secret, public_url=public_url,
        idempotency_ttl=idempotency_ttl, batch_max_events=batch_max_events,
    )
    app = web.Application(
        client_max_size=max(settings.max_event_bytes + 1024, batch_max_bytes),
        middlewares=[_metrics_middleware(), error_middleware, auth_middleware(keys)],
    )
    app[API_KEY] = api

    async def lifecycle(_app: web.Application):
        await api.start()
        try:
            yield
        finally:
            await api.stop()

    app.cleanup_ctx.append(lifecycle)
    r = app.router
    r.add_get("/", api.status_page, allow_head=False)
    r.add_get("/healthz", api.healthz, allow_head=False)
    r.add_get("/metrics", api.metrics, allow_head=False)
    r.add_get("/v1/openapi.json", api.openapi_json, allow_head=False)
    r.add_get("/v1/status.json", api.status_json, allow_head=False)
    r.add_post("/v1/events", api.post_events)
    r.add_get("/v1/notifications", api.list_notifications, allow_head=False)
    r.add_get("/v1/notifications/{id}", api.get_notification, allow_head=False)
    r.add_get("/v1/slo", api.get_slo, allow_head=False)
    r.add_get("/v1/releases", api.list_releases, allow_head=False)
    r.add_put("/v1/releases/{name}", api.put_release)
    r.add_delete("/v1/releases/{name}", api.delete_release)
    r.add_get("/v1/users/{id}/preferences", api.get_preferences, allow_head=False)
    r.add_put("/v1/users/{id}/preferences", api.put_preferences)
    r.add_put("/v1/users/{id}/devices/{token}", api.put_device)
    r.add_delete("/v1/users/{id}/devices/{token}", api.delete_device)
    r.add_get("/v1/users/{id}/inbox", api.get_inbox, allow_head=False)
    r.add_post("/v1/users/{id}/inbox/read", api.post_inbox_read)
    r.add_post("/v1/receipts/{provider}", api.post_receipt)
    return app
