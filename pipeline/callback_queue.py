"""The durable set of status callbacks to send (agents/callbacks.py), in the broker.

Every key shares the hash tag ``{cb}`` (each script touches one hash slot, so the
same code runs on Redis Cluster), in the transport's namespace ``<ns>``:

    <ns>:{cb}:t:<producer>|<biz_key>   an event's own callback_url (expand writes it;
                                       expires target_ttl_s after the event's send_at)
    <ns>:{cb}:e:<id>       hash: one callback (url, producer, biz_key, key, attempts,
                           created_at, first_failed_at, renewed_at, last_error,
                           last_at, claim, failed_at)
    <ns>:{cb}:c:<id>       hash: its state changes, change id → JSON
    <ns>:{cb}:due          zset: id → when to POST it next (in flight: until its lease ends)
    <ns>:{cb}:open         hash: <producer>|<biz_key> → the id of the callback that new
                           changes of the event join (one not being POSTed right now)
    <ns>:{cb}:failed       zset: id → when it was given up (kept for `notify callbacks ls`
                           and `replay`, the newest MAX_FAILED)
    <ns>:{cb}:seq          counter of ids

The broker is as durable as the streams (the embedded server: AOF ``everysec``):
a callback written here survives any worker's restart. The agent writes the
changes of an outcome here before the outcome's offset is committed, so a crash
in between writes them again (same change ids: the producer de-duplicates).

:meth:`CallbackQueue.claim` takes due callbacks and moves them a lease ahead
(``claim`` = a token of the taker): a worker that dies mid-POST leaves its claim
to expire, and another worker POSTs again (at least once). Only the claim's
holder removes a callback (:meth:`done`), reschedules it (:meth:`retry`) or gives
it up (:meth:`give_up`); a callback is closed to new changes while claimed, so
the body a POST signed is the body it acknowledges, and reopened after a failed
try, so changes arriving while the endpoint is down join it (one POST per event
when it is back).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

__all__ = ["CallbackQueue", "Claimed", "prefix", "list_callbacks", "replay", "MAX_FAILED"]

#: given-up callbacks kept (oldest dropped first)
MAX_FAILED = 100_000


def prefix(ns: str) -> str:
    return f"{ns}:{{cb}}:"


_ENQUEUE = """
local p = ARGV[1]
local now = ARGV[2]
local maxb = tonumber(ARGV[3])
local ng = tonumber(ARGV[4])
local i = 5
local made = 0
for g = 1, ng do
  local key, url, producer, biz, n = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], tonumber(ARGV[i + 4])
  i = i + 5
  local eid = redis.call('HGET', p .. 'open', key)
  local join = false
  if eid then
    local meta = p .. 'e:' .. eid
    if redis.call('HGET', meta, 'url') == url and redis.call('HLEN', p .. 'c:' .. eid) + n <= maxb then
      join = true
    end
  end
  if join then
    redis.call('HSET', p .. 'e:' .. eid, 'renewed_at', now)
  else
    eid = tostring(redis.call('INCR', p .. 'seq'))
    redis.call('HSET', p .. 'e:' .. eid, 'url', url, 'producer', producer, 'biz_key', biz, 'key', key,
               'attempts', 0, 'created_at', now)
    redis.call('ZADD', KEYS[1], now, eid)
    redis.call('HSET', p .. 'open', key, eid)
    made = made + 1
  end
  for j = 0, n - 1 do
    redis.call('HSETNX', p .. 'c:' .. eid, ARGV[i + 2 * j], ARGV[i + 2 * j + 1])
  end
  i = i + 2 * n
end
return made
"""

_CLAIM = """
local p = ARGV[1]
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[4]))
local out = {}
for _, eid in ipairs(ids) do
  local meta = p .. 'e:' .. eid
  local m = redis.call('HGETALL', meta)
  if #m == 0 then
    redis.call('ZREM', KEYS[1], eid)
    redis.call('DEL', p .. 'c:' .. eid)
  else
    redis.call('ZADD', KEYS[1], ARGV[3], eid)
    local key = redis.call('HGET', meta, 'key')
    if key and redis.call('HGET', p .. 'open', key) == eid then
      redis.call('HDEL', p .. 'open', key)
    end
    redis.call('HSET', meta, 'claim', ARGV[5])
    table.insert(out, eid)
    table.insert(out, m)
    table.insert(out, redis.call('HGETALL', p .. 'c:' .. eid))
  end
end
return out
"""

_DONE = """
local p = ARGV[1]
local eid = ARGV[2]
local meta = p .. 'e:' .. eid
local claim = redis.call('HGET', meta, 'claim')
if claim ~= ARGV[3] then return 0 end
local key = redis.call('HGET', meta, 'key')
if key and redis.call('HGET', p .. 'open', key) == eid then redis.call('HDEL', p .. 'open', key) end
redis.call('DEL', meta, p .. 'c:' .. eid)
redis.call('ZREM', KEYS[1], eid)
return 1
"""

# ARGV: prefix, id, token, next due, now, error, attempts (0: not a failed try: only released)
_RETRY = """
local p = ARGV[1]
local eid = ARGV[2]
local meta = p .. 'e:' .. eid
if redis.call('HGET', meta, 'claim') ~= ARGV[3] then return 0 end
redis.call('HDEL', meta, 'claim')
if tonumber(ARGV[7]) > 0 then
  redis.call('HSET', meta, 'attempts', ARGV[7], 'last_error', ARGV[6], 'last_at', ARGV[5])
  redis.call('HSETNX', meta, 'first_failed_at', ARGV[5])
end
redis.call('ZADD', KEYS[1], ARGV[4], eid)
local key = redis.call('HGET', meta, 'key')
if key then redis.call('HSETNX', p .. 'open', key, eid) end
return 1
"""

# ARGV: prefix, id, token, now, reason, max kept
_GIVE_UP = """
local p = ARGV[1]
local eid = ARGV[2]
local meta = p .. 'e:' .. eid
if redis.call('HGET', meta, 'claim') ~= ARGV[3] then return 0 end
redis.call('HDEL', meta, 'claim')
redis.call('HSET', meta, 'failed_at', ARGV[4], 'last_error', ARGV[5], 'last_at', ARGV[4])
local key = redis.call('HGET', meta, 'key')
if key and redis.call('HGET', p .. 'open', key) == eid then redis.call('HDEL', p .. 'open', key) end
redis.call('ZREM', KEYS[1], eid)
redis.call('ZADD', p .. 'failed', ARGV[4], eid)
local n = redis.call('ZCARD', p .. 'failed') - tonumber(ARGV[6])
if n > 0 then
  for _, old in ipairs(redis.call('ZRANGE', p .. 'failed', 0, n - 1)) do
    redis.call('DEL', p .. 'e:' .. old, p .. 'c:' .. old)
  end
  redis.call('ZREMRANGEBYRANK', p .. 'failed', 0, n - 1)
end
return 1
"""

# ARGV: prefix, now, with pending (0/1), ids… (none: every given-up one)
_REPLAY = """
local p = ARGV[1]
local now = ARGV[2]
local ids = {}
for i = 4, #ARGV do table.insert(ids, ARGV[i]) end
if #ids == 0 then ids = redis.call('ZRANGE', p .. 'failed', 0, -1) end
local failed, pending = 0, 0
for _, eid in ipairs(ids) do
  local meta = p .. 'e:' .. eid
  if redis.call('ZREM', p .. 'failed', eid) == 1 and redis.call('EXISTS', meta) == 1 then
    redis.call('HDEL', meta, 'failed_at', 'first_failed_at', 'renewed_at', 'claim')
    redis.call('HSET', meta, 'attempts', 0)
    redis.call('ZADD', KEYS[1], now, eid)
    failed = failed + 1
  end
end
if ARGV[3] == '1' then
  local later = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
  for _, eid in ipairs(later) do
    if redis.call('HEXISTS', p .. 'e:' .. eid, 'claim') == 0 then
      redis.call('ZADD', KEYS[1], now, eid)
      pending = pending + 1
    end
  end
end
return {failed, pending}
"""


@dataclass
class Claimed:
    """A callback taken for one POST."""

    id: str
    token: str
    meta: dict[str, str]
    changes: dict[str, bytes] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.meta.get("url", "")

    @property
    def producer(self) -> str:
        return self.meta.get("producer", "")

    @property
    def biz_key(self) -> str:
        return self.meta.get("biz_key", "")

    @property
    def attempts(self) -> int:
        return int(float(self.meta.get("attempts") or 0))

    def number(self, name: str) -> Optional[float]:
        v = self.meta.get(name)
        return float(v) if v not in (None, "") else None

    @property
    def since(self) -> Optional[float]:
        """When its retry horizon started: its first failed try, or the last change
        merged into it since (None: never failed)."""
        first = self.number("first_failed_at")
        renewed = self.number("renewed_at")
        if first is None:
            return None
        return max(first, renewed or first)


def _text(v: Any) -> str:
    return v.decode("utf-8", "surrogateescape") if isinstance(v, (bytes, bytearray)) else str(v)


def _pairs(flat: Sequence[Any]) -> list[tuple[Any, Any]]:
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat) - 1, 2)]


class CallbackQueue:
    """The callbacks of one broker namespace, through an asyncio redis-py client."""

    def __init__(self, client: Any, ns: str = "nfs") -> None:
        self.r = client
        self.p = prefix(ns)
        self.due = self.p + "due"

    def target(self, producer: str, biz_key: str) -> str:
        return f"{self.p}t:{producer}|{biz_key}"

    async def remember(self, producer: str, biz_key: str, url: str, ttl_s: float) -> None:
        """The event's own callback URL, kept ``ttl_s`` seconds."""
        await self.r.set(self.target(producer, biz_key), url.encode(), ex=max(1, int(ttl_s)))

    async def targets(self, keys: Sequence[tuple[str, str]]) -> list[Optional[str]]:
        """The callback URL each event named (None: none, or expired)."""
        if not keys:
            return []
        values = await self.r.mget([self.target(p, b) for p, b in keys])
        return [_text(v) if v is not None else None for v in values]

    async def enqueue(self, batches: Iterable[Any], max_batch: int, now: Optional[float] = None) -> int:
        """Add state changes (:class:`pipeline.rules.callbacks.Batch` es): each joins
        its event's open callback for the same URL when it has room, else starts one,
        due at once. Returns how many callbacks were started."""
        args: list[Any] = []
        n = 0
        for b in batches:
            args += [f"{b.producer}|{b.biz_key}", b.url, b.producer, b.biz_key, len(b.changes)]
            for cid, data in b.changes:
                args += [cid, data]
            n += 1
        if not n:
            return 0
        now = time.time() if now is None else now
        return int(await self.r.eval(_ENQUEUE, 1, self.due, self.p, repr(now), max_batch, n, *args))

    async def claim(self, limit: int, lease_s: float, now: Optional[float] = None) -> list[Claimed]:
        """Up to ``limit`` due callbacks, each moved ``lease_s`` ahead and closed to new changes."""
        if limit < 1:
            return []
        now = time.time() if now is None else now
        token = secrets.token_hex(8)
        raw = await self.r.eval(_CLAIM, 1, self.due, self.p, repr(now), repr(now + lease_s), limit, token)
        out = []
        for i in range(0, len(raw), 3):
            meta = {_text(k): _text(v) for k, v in _pairs(raw[i + 1])}
            changes = {_text(k): bytes(v) for k, v in _pairs(raw[i + 2])}
            out.append(Claimed(_text(raw[i]), token, meta, changes))
        return out

    async def done(self, c: Claimed) -> bool:
        """The POST was acknowledged: the callback is removed (only by its claim's holder)."""
        return bool(await self.r.eval(_DONE, 1, self.due, self.p, c.id, c.token))

    async def retry(self, c: Claimed, at: float, error: str, now: Optional[float] = None) -> bool:
        """A failed try: POST again at ``at``; open again to the event's new changes."""
        now = time.time() if now is None else now
        return bool(await self.r.eval(_RETRY, 1, self.due, self.p, c.id, c.token, repr(at), repr(now),
                                      error[:300], c.attempts + 1))

    async def release(self, c: Claimed, at: float) -> bool:
        """Not tried (no slot for its host now): due again at ``at``, no try counted."""
        return bool(await self.r.eval(_RETRY, 1, self.due, self.p, c.id, c.token, repr(at), repr(time.time()),
                                      "", 0))

    async def give_up(self, c: Claimed, reason: str, now: Optional[float] = None) -> bool:
        now = time.time() if now is None else now
        return bool(await self.r.eval(_GIVE_UP, 1, self.due, self.p, c.id, c.token, repr(now), reason[:300],
                                      MAX_FAILED))

    async def next_due(self) -> Optional[float]:
        first = await self.r.zrange(self.due, 0, 0, withscores=True)
        return float(first[0][1]) if first else None

    async def gauges(self, now: Optional[float] = None) -> tuple[int, int, float]:
        """(callbacks waiting, of which scheduled later (retrying or in flight), seconds
        the oldest due one is overdue)."""
        now = time.time() if now is None else now
        pipe = self.r.pipeline(transaction=False)
        pipe.zcard(self.due)
        pipe.zcount(self.due, f"({now!r}", "+inf")
        pipe.zrange(self.due, 0, 0, withscores=True)
        total, later, first = await pipe.execute()
        lag = max(0.0, now - float(first[0][1])) if first else 0.0
        return int(total), int(later), lag


# ------------------------------------------------------------------ the CLI's side (sync client)


def list_callbacks(client: Any, ns: str, *, failed: bool = False, limit: int = 100,
                   now: Optional[float] = None) -> list[dict[str, Any]]:
    """The callbacks waiting (soonest first) or given up (newest first), as
    ``notify callbacks ls`` prints them (URLs masked)."""
    from pipeline.redact import mask_url

    p = prefix(ns)
    now = time.time() if now is None else now
    if failed:
        ids = client.zrevrange(p + "failed", 0, max(0, limit - 1), withscores=True)
    else:
        ids = client.zrange(p + "due", 0, max(0, limit - 1), withscores=True)
    out = []
    for raw_id, score in ids:
        eid = _text(raw_id)
        meta = {_text(k): _text(v) for k, v in (client.hgetall(f"{p}e:{eid}") or {}).items()}
        if not meta:
            continue
        attempts = int(float(meta.get("attempts") or 0))
        if failed:
            state = "failed"
        elif meta.get("claim") and score > now:
            state = "in_flight"
        elif attempts:
            state = "retrying"
        else:
            state = "pending"
        out.append({
            "id": eid, "state": state, "producer": meta.get("producer", ""), "biz_key": meta.get("biz_key", ""),
            "url": mask_url(meta.get("url", "")), "changes": int(client.hlen(f"{p}c:{eid}")),
            "attempts": attempts, "next_at": None if failed else float(score),
            "failed_at": float(score) if failed else None, "last_error": meta.get("last_error") or None,
            "created_at": float(meta["created_at"]) if meta.get("created_at") else None,
        })
    return out


def replay(client: Any, ns: str, ids: Sequence[str] = (), *, pending: bool = False,
           now: Optional[float] = None) -> tuple[int, int]:
    """Given-up callbacks (``ids``, or all) due again now, with a fresh 24 h of tries;
    with ``pending``, the ones waiting for a later retry too. → (failed, pending) replayed."""
    p = prefix(ns)
    now = time.time() if now is None else now
    res = client.eval(_REPLAY, 1, p + "due", p, repr(now), "1" if pending else "0", *ids)
    return int(res[0]), int(res[1])
