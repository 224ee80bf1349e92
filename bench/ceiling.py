"""Benchmark (not a test): the ceiling beside notify-stream (issue 19 item 4) — the
same hops written by hand on raw Redis Streams, with the same records and the same
rules, so "how close to the limit" is a ratio measured in the same run.

    python bench/ceiling.py [--events 20000] [--planners 2] [--senders 1]

* Server: the embedded valkey-server (AOF everysec), started here, as bench/e2e.py's.
* Users and events: bench/e2e.py's (pipeline/cli/mixes.py, the same seed and
  sizes). Preferences and devices go into two plain hashes (``ceil:prefs``,
  ``ceil:devices``), which every hop loads into memory before it reads its first
  entry (the pipeline's tables also recover before its first event).
* The events are pre-written to one stream (``ceil:events``) before the hops start.
* One process per hop, each reading its stream(s) in batches with XREADGROUP and
  acknowledging per batch (XACK in the same round trip as the batch's output);
  uvloop and hiredis when installed:

  - plan (``--planners`` of them, one consumer group): an event's recipients →
    channels (``pipeline.rules.channels.pick_channels``: opt-outs, reachability,
    inbox fallback) → quiet hours (``pipeline.rules.quiet_hours``; deferred
    ones go to a timer stream, SCHEDULED) → the guard, ONE Lua call per batch:
    dedup per (user, biz_key, channel) within the category's window, the daily
    counter per (user, category, day) against the category's ``daily_limit``
    (INCR, counted once per notification), the category's sliding windows
    (``rate_windows``, a ZSET per user x category) → render with the project's
    ``pipeline.templates.Renderer`` (sandboxed Jinja2, from config), the
    tracking link rewrite (``pipeline.rules.tracking.rewrite``) and, for a
    category with ``one_click_unsubscribe``, the user's signed unsubscribe link,
    as the guard's plan adds them → a delivery on
    ``ceil:send:<channel>`` (push: one per device), and one outcome entry per
    state change on ``ceil:outcomes``.
  - send (``--senders``): the unsubscribe re-check, then the fake provider call
    (``adapters.fake.FakeProvider``, zero latency, as the pipeline's fakes and
    the Celery peer; the inbox is accepted as the pipeline's inbox provider
    does) → outcomes ACCEPTED (inbox: ACCEPTED, then DELIVERED ``in_inbox``).
  - record (one): ``ceil:outcomes`` → the record store's own schema (created by
    ``pipeline.store.RecordStore``: notify_record, attempts, device_deliveries,
    inbox with its unread trigger), one aiosqlite transaction per batch, a
    hand-written upsert by state precedence; duplicates are not written (the
    record keeps the original's), as in the pipeline.

Measured as bench/e2e.py measures: notifications = records + duplicates filtered;
the clock runs from the first entry any hop wrote to the last change of the
SQLite file once every stream's group has no lag and nothing pending and no
record is PENDING; CPU (utime+stime from /proc) of every process and of the
server over the same window.

What it leaves out (so the ratio is read honestly): :data:`LEAVES_OUT`.

Run by bench/compare.py (after the pipeline and the Celery peer), which writes
the ratio to the "e2e" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import orjson

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))

EVENTS = "ceil:events"
OUTCOMES = "ceil:outcomes"
TIMERS = "ceil:timers"
DLQ = "ceil:dlq"
SEND = {c: f"ceil:send:{c}" for c in ("push", "sms", "email", "inbox", "webhook")}
PREFS = "ceil:prefs"
DEVICES = "ceil:devices"
GROUPS = {EVENTS: "plan", OUTCOMES: "record", **{s: "send" for s in SEND.values()}}

PLANNERS = 1
SENDERS = 1
#: entries one XREADGROUP takes (the planner's is events; ~2.5 notifications each)
BATCH = {"plan": 400, "send": 1000, "record": 5000}

#: what the ceiling does not do that notify-stream does: the paragraph under the ratio
LEAVES_OUT = (
    "No exactly-once effects: no inflight ledger (the pipeline marks every delivery \"calling\" durably "
    "before the provider call and \"done\" after, so a replay neither sends twice nor skips), no replay "
    "safety (a hop that dies between the guard's Lua call and its XACK would, read again, take its own "
    "dedup keys for duplicates and count the daily limit twice), no transactional link between a hop's "
    "output and its acknowledgement. No changelog tables: the guard's state is Redis keys, the users are "
    "loaded once from two hashes (no preferences/devices agents, no table recovery, no purge). No "
    "partitions, consumer leases, fencing or rebalancing (one consumer group per stream, no per-user "
    "order), no priority lanes (one stream per channel, no window of calls in flight, no fair turns), no "
    "retries, failover, circuit breakers, token buckets or receipt polls (every fake send is accepted "
    "first time in this mix, so none would run), no backpressure, gray releases, callbacks or metrics; "
    "event validation is a few checks, not the full parser (pipeline/parsers/events.py); one aiosqlite "
    "writer with a hand-written upsert (state precedence only, a push record taken from its one device) "
    "in place of the order-free merge; deferred notifications are written to a timer stream that nothing "
    "reads (no scheduler)."
)


# ---------------------------------------------------------------------------
# the hops (child processes: python bench/ceiling.py --role plan|send|record)

# One call per planner batch. Per notification (one user x one event), in the
# pipeline's order (pipeline/rules/plan.py): the channels already seen within the
# dedup window are duplicates; if any channel is left, the daily counter at or
# over the limit refuses them all (over_limit), else a sliding window full
# refuses them (rate_window); else the counter goes up by one, the send time is
# added to the window, and the fresh channels' dedup keys are set (EX window).
#
# KEYS per notification: one dedup key per channel, the counter, the window key.
# ARGV: now, counter ttl; then per notification: channels, dedup window s, daily
# limit (-1 = exempt), windows, [window s, max] per window, window member.
# Reply per notification: duplicate-channel bitmask * 4 + verdict (0 pass,
# 1 over_limit, 2 rate_window).
GUARD = """
local now = tonumber(ARGV[1])
local ttl = ARGV[2]
local a, k, out = 3, 1, {}
while a <= #ARGV do
  local nch, dedup_s, limit, nwin = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  a = a + 4
  local wins, longest = {}, 0
  for i = 1, nwin do
    local w, n = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    wins[i] = {w, n}
    if w > longest then longest = w end
    a = a + 2
  end
  local member = ARGV[a]
  a = a + 1
  local fresh, mask, bit = {}, 0, 1
  for i = 0, nch - 1 do
    local key = KEYS[k + i]
    if dedup_s > 0 and redis.call('EXISTS', key) == 1 then mask = mask + bit else fresh[#fresh + 1] = key end
    bit = bit * 2
  end
  local ckey, wkey = KEYS[k + nch], KEYS[k + nch + 1]
  k = k + nch + 2
  local verdict = 0
  if #fresh > 0 then
    if limit >= 0 and tonumber(redis.call('GET', ckey) or '0') >= limit then verdict = 1 end
    if verdict == 0 and nwin > 0 then
      redis.call('ZREMRANGEBYSCORE', wkey, '-inf', now - longest)
      for i = 1, nwin do
        if redis.call('ZCOUNT', wkey, '(' .. (now - wins[i][1]), now) >= wins[i][2] then verdict = 2 end
      end
      if verdict == 0 then
        redis.call('ZADD', wkey, now, member)
        redis.call('EXPIRE', wkey, longest)
      end
    end
    if verdict == 0 then
      if limit >= 0 and redis.call('INCR', ckey) == 1 then redis.call('EXPIRE', ckey, ttl) end
      if dedup_s > 0 then
        for _, key in ipairs(fresh) do redis.call('SET', key, '1', 'EX', dedup_s) end
      end
    end
  end
  out[#out + 1] = mask * 4 + verdict
end
return out
"""


async def _connect(url: str):
    import redis.asyncio as aredis

    return aredis.Redis.from_url(url)


async def _load_users(r) -> tuple[dict, dict]:
    """Preferences (as attribute bags for the rule functions) and devices
    (``[[platform, token, at], ...]``) of every user, from the two hashes."""
    prefs = {k.decode(): SimpleNamespace(**{"switches": {}, **orjson.loads(v)})
             for k, v in (await r.hgetall(PREFS)).items()}
    devices = {k.decode(): orjson.loads(v) for k, v in (await r.hgetall(DEVICES)).items()}
    return prefs, devices


def _outcome(state: str, did: str, rid: str, nid: str, ev: dict, uid: str, channel: str, category: str,
             priority: str, now: float, reason: Optional[str] = None) -> bytes:
    o = {"s": state, "d": did, "n": nid, "b": ev["biz_key"], "u": uid, "c": channel, "k": category,
         "t": ev["template"], "p": priority, "at": now, "acc": ev.get("accepted_at") or now}
    if rid != did:
        o["rid"] = rid
    if reason:
        o["r"] = reason
    return orjson.dumps(o)


def _unsubscribe_url(tracking: Any, tracker: Any, cat: Any, uid: str, channel: str) -> Optional[str]:
    """The user's signed one-click unsubscribe link, as the guard's plan adds it
    (pipeline/rules/plan.py ``_unsubscribe_url``) for a category with
    ``one_click_unsubscribe``; None where the plan adds none (or this checkout's
    tracking has no such link yet)."""
    if tracker is None or not getattr(cat, "one_click_unsubscribe", False) \
            or channel not in getattr(tracking, "UNSUBSCRIBE_CHANNELS", ()):
        return None
    try:
        return tracking.unsubscribe_url(tracker, uid, cat.name, channel)
    except ValueError:
        return None


def _mentions(renderer: Any, code: str, version: int, channel: str, locale: Optional[str], word: str) -> bool:
    mentions = getattr(renderer, "mentions", None)
    return True if mentions is None else bool(mentions(code, version, channel, locale, word))


async def plan_hop(url: str, name: str, batch: int) -> None:
    from config.settings import CHANNELS, load_settings
    from pipeline.ids import delivery_id, device_delivery_id, notification_id
    from pipeline.models import State
    from pipeline.rules import tracking
    from pipeline.rules.channels import OPTED_OUT, UNREACHABLE, is_unsubscribed, pick_channels
    from pipeline.rules.guard import COUNTER_TTL_S, day_key
    from pipeline.rules.plan import push_targets
    from pipeline.rules.quiet_hours import channel_quiet_ends
    from pipeline.templates import Renderer, TemplateError

    settings = load_settings()
    renderer = Renderer.from_settings(settings)
    tr = settings.tracking
    tracker = (tracking.Tracker(key=os.urandom(32), base_url=tr.base_url, open_pixel=tr.open_pixel,
                                limits=settings.channel_limits()) if tr.enabled else None)
    push_cap = settings.channels["push"].max_devices
    r = await _connect(url)
    prefs_of, devices_of = await _load_users(r)
    guard = r.register_script(GUARD)
    days: dict = {}
    FILTERED, SCHEDULED, PENDING, FAILED = State.FILTERED, State.SCHEDULED, State.PENDING, State.FAILED
    while True:
        got = await r.xreadgroup("plan", name, {EVENTS: ">"}, count=batch, block=1000)
        if not got:
            continue
        entries = got[0][1]
        now = time.time()
        outcomes: list[bytes] = []
        timers: list[bytes] = []
        dead: list[bytes] = []
        todo: list[tuple] = []  # notifications that reach the guard
        keys: list[str] = []
        argv: list[Any] = [repr(now), COUNTER_TTL_S]
        for _id, f in entries:
            raw = f[b"v"]
            try:
                ev = orjson.loads(raw)
                cat = settings.categories[ev["category"]]
                recipients = ev["recipients"]
                version = ev.get("template_version", 1)
                if not (isinstance(recipients, list) and recipients and isinstance(ev["biz_key"], str)
                        and renderer.has_template(ev["template"], version)):
                    raise ValueError("bad event")
            except Exception as exc:  # noqa: BLE001 - any bad input is a dead letter
                dead.append(orjson.dumps({"reason": type(exc).__name__, "raw": raw.decode("utf-8", "replace")}))
                continue
            priority = cat.priority
            wanted = list(dict.fromkeys(c for c in (ev.get("channels") or cat.default_channels) if c in CHANNELS))
            biz = ev["biz_key"]
            for uid in dict.fromkeys(recipients):
                prefs, devs = prefs_of.get(uid), devices_of.get(uid)
                nid = notification_id(biz, uid)
                chosen, _why = pick_channels(wanted, cat, prefs, bool(devs))
                for c in wanted:
                    if c not in chosen:
                        why = OPTED_OUT if is_unsubscribed(prefs, cat.name, c) else UNREACHABLE
                        did = delivery_id(biz, uid, c)
                        outcomes.append(_outcome(FILTERED, did, did, nid, ev, uid, c, cat.name, priority, now, why))
                if not chosen:
                    continue
                quiet = channel_quiet_ends(priority, prefs, chosen, now)
                later: dict[float, list[str]] = {}
                for c in chosen:
                    if quiet[c] is not None:
                        later.setdefault(quiet[c], []).append(c)
                for due, chans in later.items():
                    for c in chans:
                        did = delivery_id(biz, uid, c)
                        outcomes.append(_outcome(SCHEDULED, did, did, nid, ev, uid, c, cat.name, priority, now,
                                                 "deferred"))
                    timers.append(orjson.dumps({"due": due, "user_id": uid, "channels": chans, "event": ev}))
                chans = [c for c in chosen if quiet[c] is None]
                if not chans:
                    continue
                tz = getattr(prefs, "tz", None)
                day = days.get(tz)
                if day is None:
                    day = days[tz] = day_key(tz, now)
                keys += [f"ceil:dedup:{uid}|{biz}|{c}" for c in chans]
                keys += [f"ceil:freq:{uid}:{cat.name}:{day}", f"ceil:win:{uid}|{cat.name}"]
                argv += [len(chans), cat.dedup_window_s, -1 if cat.daily_limit is None else cat.daily_limit,
                         len(cat.rate_windows)]
                for w, n in cat.rate_windows:
                    argv += [w, n]
                argv.append(nid)
                todo.append((ev, uid, nid, cat, priority, chans, prefs, devs, version))
        verdicts = await guard(keys=keys, args=argv) if todo else []
        deliveries: list[tuple[str, bytes]] = []
        for (ev, uid, nid, cat, priority, chans, prefs, devs, version), code in zip(todo, verdicts):
            mask, verdict = divmod(int(code), 4)
            biz = ev["biz_key"]
            for i, c in enumerate(chans):
                did = delivery_id(biz, uid, c)
                why = ("duplicate" if mask >> i & 1 else "over_limit" if verdict == 1
                       else "rate_window" if verdict == 2 else None)
                if why:
                    outcomes.append(_outcome(FILTERED, did, did, nid, ev, uid, c, cat.name, priority, now, why))
                    continue
                locale = ev.get("locale") or getattr(prefs, "locale", None)
                params = ev.get("params") or {}
                unsub = _unsubscribe_url(tracking, tracker, cat, uid, c)
                try:
                    if unsub is not None and "unsubscribe_url" not in params and _mentions(
                            renderer, ev["template"], version, c, locale, "unsubscribe_url"):
                        params = {**params, "unsubscribe_url": unsub}
                    content = renderer.render(ev["template"], version, c, locale, params)
                except TemplateError:
                    outcomes.append(_outcome(FAILED, did, did, nid, ev, uid, c, cat.name, priority, now,
                                             "template_error"))
                    continue
                if tracker is not None:
                    content, _links = tracking.rewrite(tracker, c, did, content)
                if unsub is not None and c == "email":
                    content["unsubscribe_url"] = unsub
                d = {"d": did, "n": nid, "b": biz, "u": uid, "c": c, "k": cat.name, "t": ev["template"],
                     "p": priority, "content": content, "acc": ev.get("accepted_at") or now}
                if c == "push":
                    targets, _left_out = push_targets(devs, push_cap)
                    for platform, token in targets:
                        dd = device_delivery_id(did, platform, token)
                        deliveries.append((c, orjson.dumps({**d, "d": dd, "rid": did, "addr": f"{platform}:{token}",
                                                            "dev": len(targets)})))
                        outcomes.append(_outcome(PENDING, dd, did, nid, ev, uid, c, cat.name, priority, now))
                    continue
                d["addr"] = {"sms": getattr(prefs, "phone", ""), "email": getattr(prefs, "email", "")}.get(c, "")
                deliveries.append((c, orjson.dumps(d)))
                outcomes.append(_outcome(PENDING, did, did, nid, ev, uid, c, cat.name, priority, now))
        pipe = r.pipeline(transaction=False)
        for v in outcomes:
            pipe.execute_command("XADD", OUTCOMES, "*", "v", v)
        for c, v in deliveries:
            pipe.execute_command("XADD", SEND[c], "*", "v", v)
        for v in timers:
            pipe.execute_command("XADD", TIMERS, "*", "v", v)
        for v in dead:
            pipe.execute_command("XADD", DLQ, "*", "v", v)
        pipe.execute_command("XACK", EVENTS, "plan", *[i for i, _f in entries])
        await pipe.execute()


async def send_hop(url: str, name: str, batch: int) -> None:
    from adapters.fake import FakeProvider
    from adapters.inbox import InboxProvider
    from pipeline.models import AttemptResult, State
    from pipeline.rules.channels import is_unsubscribed

    providers = {"push": FakeProvider("apns", "push"), "sms": FakeProvider("sms_a", "sms"),
                 "email": FakeProvider("email", "email"), "inbox": InboxProvider(),
                 "webhook": FakeProvider("webhook", "webhook")}
    r = await _connect(url)
    prefs_of, _devices = await _load_users(r)
    streams = {s: ">" for s in SEND.values()}
    while True:
        got = await r.xreadgroup("send", name, streams, count=batch, block=1000)
        if not got:
            continue
        pipe = r.pipeline(transaction=False)
        for stream, entries in got:
            for _id, f in entries:
                d = orjson.loads(f[b"v"])
                c = d["c"]
                base = {k: d[k] for k in ("d", "n", "b", "u", "c", "k", "t", "p", "acc")}
                if "rid" in d:
                    base["rid"] = d["rid"]
                now = time.time()
                if is_unsubscribed(prefs_of.get(d["u"]), d["k"], c):
                    pipe.execute_command("XADD", OUTCOMES, "*", "v", orjson.dumps(
                        {**base, "s": State.FILTERED, "r": "unsubscribed", "at": now}))
                    continue
                res = await providers[c].send(SimpleNamespace(delivery_id=d["d"], address=d.get("addr", "")))
                ok = res.result == AttemptResult.ACCEPTED
                o = {**base, "s": State.ACCEPTED if ok else State.FAILED, "at": now, "pv": res.provider,
                     "m": res.provider_msg_id, "rc": 1, "lat": res.latency_ms, "res": res.result}
                if not ok:
                    o["r"] = (res.error or res.result)[:64]
                    o["err"] = res.error
                pipe.execute_command("XADD", OUTCOMES, "*", "v", orjson.dumps(o))
                if ok and c == "inbox":
                    content = d["content"]
                    pipe.execute_command("XADD", OUTCOMES, "*", "v", orjson.dumps(
                        {**base, "s": State.DELIVERED, "r": "in_inbox", "at": time.time(), "pv": "inbox",
                         "m": d["d"], "rc": 1, "inbox": [content.get("title", ""), content.get("body", "")]}))
            pipe.execute_command("XACK", stream, "send", *[i for i, _f in entries])
        await pipe.execute()


_RECORD_COLS = ("biz_key", "user_id", "channel", "template_code", "status", "reason", "provider", "provider_msg_id",
                "retry_count", "created_at", "sent_at", "delivery_id", "notification_id", "category", "priority",
                "updated_at", "delivered_at", "accepted_at", "latency_ms", "state_key")
_UPSERT_RECORD = (
    f"INSERT INTO notify_record ({', '.join(_RECORD_COLS)}) VALUES ({', '.join('?' * len(_RECORD_COLS))})"
    " ON CONFLICT (delivery_id) DO UPDATE SET status = excluded.status, reason = excluded.reason,"
    " state_key = excluded.state_key, updated_at = excluded.updated_at, latency_ms = excluded.latency_ms,"
    " provider = coalesce(excluded.provider, provider), provider_msg_id = coalesce(excluded.provider_msg_id,"
    " provider_msg_id), retry_count = max(retry_count, excluded.retry_count),"
    " sent_at = coalesce(sent_at, excluded.sent_at), delivered_at = coalesce(delivered_at, excluded.delivered_at)"
    " WHERE excluded.state_key > notify_record.state_key"
)
_DEVICE_COLS = ("record_id", "delivery_id", "status", "reason", "state_key", "provider", "provider_msg_id",
                "retry_count", "devices", "created_at", "updated_at", "sent_at", "delivered_at", "latency_ms")
_UPSERT_DEVICE = (
    f"INSERT INTO device_deliveries ({', '.join(_DEVICE_COLS)}) VALUES ({', '.join('?' * len(_DEVICE_COLS))})"
    " ON CONFLICT (record_id, delivery_id) DO UPDATE SET status = excluded.status, reason = excluded.reason,"
    " state_key = excluded.state_key, updated_at = excluded.updated_at, latency_ms = excluded.latency_ms,"
    " provider = coalesce(excluded.provider, provider), provider_msg_id = coalesce(excluded.provider_msg_id,"
    " provider_msg_id), retry_count = max(retry_count, excluded.retry_count),"
    " sent_at = coalesce(sent_at, excluded.sent_at), delivered_at = coalesce(delivered_at, excluded.delivered_at)"
    " WHERE excluded.state_key > device_deliveries.state_key"
)
_INSERT_ATTEMPT = ("INSERT OR IGNORE INTO attempts (notification_id, seq, channel, provider, started_at, result,"
                   " latency_ms, provider_msg_id, error, delivery_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_INSERT_INBOX = "INSERT OR IGNORE INTO inbox (user_id, delivery_id, title, body, created_at) VALUES (?, ?, ?, ?, ?)"


_CREATED = 9  # created_at, in a record row and in a device row


def _merge(rows: dict, key: Any, row: list, skey: int, fields: tuple[int, ...]) -> None:
    """Fold ``row`` into ``rows[key]`` (the batch's row for that record): the higher
    state wins; provider, message id, sent/delivered times are kept from any
    outcome, the creation time from the first."""
    old = rows.get(key)
    if old is None:
        rows[key] = row
        return
    if row[skey] > old[skey]:
        for i in fields:
            if row[i] is None:
                row[i] = old[i]
        row[_CREATED] = old[_CREATED]
        rows[key] = row
    else:
        for i in fields:
            if old[i] is None:
                old[i] = row[i]


async def record_hop(url: str, name: str, batch: int, db_path: str) -> None:
    import aiosqlite

    from pipeline.rules.states import RANK

    db = await aiosqlite.connect(db_path)
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "wal_autocheckpoint=10000",
                   "journal_size_limit=67108864", "cache_size=-65536", "temp_store=MEMORY"):
        await db.execute(f"PRAGMA {pragma}")
    r = await _connect(url)
    # positions in a record row / a device row of the fields merged across outcomes
    rec_keep = (6, 7, 10, 16)  # provider, provider_msg_id, sent_at, delivered_at
    dev_keep = (5, 6, 11, 12)
    try:
        while True:
            got = await r.xreadgroup("record", name, {OUTCOMES: ">"}, count=batch, block=1000)
            if not got:
                continue
            entries = got[0][1]
            records: dict = {}
            devices: dict = {}
            attempts: list = []
            inbox: list = []
            for _id, f in entries:
                o = orjson.loads(f[b"v"])
                if o.get("r") == "duplicate":
                    continue  # the record keeps the original's state (agents/sink.py)
                state, at, did = o["s"], o["at"], o["d"]
                rid = o.get("rid", did)
                skey = RANK[state]
                provider, msg = o.get("pv"), o.get("m")
                sent = at if state == "ACCEPTED" else None
                delivered = at if state == "DELIVERED" else None
                latency = max(0.0, (at - o["acc"]) * 1000.0)
                _merge(records, rid, [o["b"], o["u"], o["c"], o["t"], state, o.get("r"), provider, msg,
                                      o.get("rc", 0), at, sent, rid, o["n"], o["k"], o["p"], at, delivered,
                                      o["acc"], latency, skey], 19, rec_keep)
                if rid != did:
                    _merge(devices, (rid, did), [rid, did, state, o.get("r"), skey, provider, msg, o.get("rc", 0),
                                                 o.get("dev", 1), at, at, sent, delivered, latency], 4, dev_keep)
                if "res" in o:
                    attempts.append((o["n"], o["rc"], o["c"], provider, at, o["res"], o.get("lat"), msg,
                                     o.get("err"), did))
                if "inbox" in o:
                    title, body = o["inbox"]
                    inbox.append((o["u"], did, title, body, at))
            await db.executemany(_UPSERT_RECORD, list(records.values()))
            if devices:
                await db.executemany(_UPSERT_DEVICE, list(devices.values()))
            if attempts:
                await db.executemany(_INSERT_ATTEMPT, attempts)
            if inbox:
                await db.executemany(_INSERT_INBOX, inbox)
            await db.commit()
            await r.xack(OUTCOMES, "record", *[i for i, _f in entries])
    finally:
        await db.close()


def hop_main(role: str, name: str, url: str, batch: int, db: Optional[str]) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency here
        uvloop = None

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            if role == "plan":
                await plan_hop(url, name, batch)
            elif role == "send":
                await send_hop(url, name, batch)
            else:
                await record_hop(url, name, batch, db)
        except asyncio.CancelledError:
            pass

    if uvloop is not None:
        uvloop.run(main())
    else:
        asyncio.run(main())


# ---------------------------------------------------------------------------
# the driver


@dataclass
class Result:
    events: int
    users: int
    notifications: int = 0  # records + duplicates filtered, as bench/e2e.py counts them
    records: int = 0
    duplicates: int = 0
    seconds: float = 0.0
    rate: float = 0.0
    events_rate: float = 0.0
    cpu: dict = field(default_factory=dict)  # process -> CPU seconds in the window
    statuses: dict = field(default_factory=dict)
    outcomes: int = 0
    produce_s: float = 0.0
    startup_s: float = 0.0
    planners: int = PLANNERS
    senders: int = SENDERS
    uvloop: bool = False
    hiredis: bool = False
    other_cpu: float = 0.0  # CPU s used by processes outside this benchmark during the window
    dead_letters: int = 0
    timers: int = 0


def _backlog(r) -> int:
    """Entries not yet read plus entries read and not acknowledged, over every stream's group."""
    total = 0
    for stream, group in GROUPS.items():
        for g in r.xinfo_groups(stream):
            if g["name"].decode() == group:
                total += int(g.get("lag") or 0) + int(g["pending"])
    return total


def _count_outcomes(r) -> collections.Counter:
    c: collections.Counter = collections.Counter()
    start = "-"
    while True:
        batch = r.xrange(OUTCOMES, min=start, count=10000)
        for _id, f in batch:
            o = orjson.loads(f[b"v"])
            c[(o["s"], o.get("r") or "")] += 1
        if len(batch) < 10000:
            return c
        start = "(" + batch[-1][0].decode()


async def _create_store(path: Path) -> None:
    """The record store's schema, exactly as the pipeline creates it."""
    from pipeline.store.store import RecordStore

    store = await RecordStore(str(path)).open()
    await store.close()


def run(n_events: int, *, n_users: Optional[int] = None, seed: int = 8, planners: int = PLANNERS,
        senders: int = SENDERS, timeout: float = 900.0, log=print) -> Result:
    """The ceiling on bench/e2e.py's workload (the same users and events for the same
    ``n_events``, ``n_users`` and ``seed``)."""
    import redis

    from bench.e2e import RecordWatch, cpu_seconds, machine_busy, status_counts
    from pipeline.cli.mixes import make_events, make_users
    from pipeline.embedded import EmbeddedRedis
    from pipeline.procs import stop_all

    t_begin = time.monotonic()

    def say(msg: str) -> None:
        log(f"[{time.monotonic() - t_begin:6.1f}s] ceiling: {msg}")

    OUT.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    n_users = n_users or max(1000, n_events)
    users = make_users(n_users, rng)
    events = make_events(n_events, users, rng)
    res = Result(events=n_events, users=n_users, planners=planners, senders=senders)
    try:
        import uvloop  # noqa: F401

        res.uvloop = True
    except ImportError:
        pass
    from redis.utils import HIREDIS_AVAILABLE

    res.hiredis = bool(HIREDIS_AVAILABLE)
    hour = time.gmtime().tm_hour
    with tempfile.TemporaryDirectory(prefix="notify-ceiling-") as tmpdir:
        tmp = Path(tmpdir)
        db = tmp / "records.db"
        asyncio.run(_create_store(db))
        server = EmbeddedRedis(tmp / "redis").start()  # AOF everysec
        r = redis.Redis.from_url(server.url)
        procs: list[subprocess.Popen] = []
        try:
            # users: two plain hashes
            now = time.time()
            pipe = r.pipeline(transaction=False)
            for i, u in enumerate(users):
                pipe.hset(PREFS, u.id, orjson.dumps(u.prefs(hour)))
                if u.device:
                    pipe.hset(DEVICES, u.id, orjson.dumps([["apns", u.device, now]]))
                if i % 2000 == 1999:
                    pipe.execute()
            pipe.execute()
            for stream, group in GROUPS.items():
                r.xgroup_create(stream, group, id="0", mkstream=True)
            # the events, before the hops start
            t0 = time.perf_counter()
            now = time.time()
            pipe = r.pipeline(transaction=False)
            for i, e in enumerate(events):
                pipe.execute_command("XADD", EVENTS, "*", "v", orjson.dumps(dict(e, accepted_at=now)))
                if i % 2000 == 1999:
                    pipe.execute()
            pipe.execute()
            res.produce_s = time.perf_counter() - t0
            say(f"{len(users)} users, {len(events)} events written in {res.produce_s:.1f}s; starting "
                f"{planners} planner(s), {senders} sender(s), 1 recorder")

            roles = [("plan", f"plan {i}") for i in range(planners)] + [
                ("send", f"send {i}") for i in range(senders)] + [("record", "record")]
            t_launch = time.monotonic()
            for role, name in roles:
                logf = open(OUT / f"ceiling-{name.replace(' ', '')}.log", "w")
                procs.append(subprocess.Popen(
                    [sys.executable, str(Path(__file__).resolve()), "--role", role, "--name", name.replace(" ", ""),
                     "--url", server.url, "--db", str(db), "--batch", str(BATCH[role])],
                    cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=logf,
                    stderr=subprocess.STDOUT))
            pids = {name: p.pid for (_role, name), p in zip(roles, procs)}
            pids["redis"] = server.proc.pid

            def check() -> None:
                for (_role, name), p in zip(roles, procs):
                    if p.poll() is not None:
                        raise RuntimeError(f"ceiling {name} exited with {p.returncode}; see "
                                           f"bench/out/ceiling-{name.replace(' ', '')}.log")

            def sample() -> dict:
                out = {k: cpu_seconds(pid) for k, pid in pids.items()}
                out["_machine"], out["_self"] = machine_busy(), cpu_seconds(os.getpid())
                return out

            written = [OUTCOMES, TIMERS, DLQ, *SEND.values()]
            while not sum(r.xlen(s) for s in written):
                check()
                if time.monotonic() - t_launch > 120:
                    raise RuntimeError("no event consumed within 120s")
                time.sleep(0.005)
            t_start = time.time()
            cpu_start = sample()
            res.startup_s = time.monotonic() - t_launch
            say(f"first event consumed {res.startup_s:.1f}s after the hops were started")

            watch = RecordWatch(db)
            last_ver, t_last, cpu_last = None, t_start, cpu_start
            quiet_since = None
            deadline = time.monotonic() + timeout
            next_log = time.monotonic() + 10
            while True:
                now = time.time()
                ver = watch.version()
                cpu_now = sample()
                if ver != last_ver:
                    last_ver, t_last, cpu_last = ver, now, cpu_now
                    quiet_since = None
                backlog = _backlog(r)
                if not backlog and ver:
                    n, pending = watch.counts()
                    if n and not pending:
                        quiet_since = quiet_since or time.monotonic()
                        if time.monotonic() - quiet_since > 1.5:
                            break
                else:
                    quiet_since = None
                check()
                mono = time.monotonic()
                if mono > deadline:
                    raise RuntimeError(f"not done after {timeout:.0f}s: backlog {backlog}, records {watch.counts()}")
                if mono >= next_log:
                    n, pending = watch.counts()
                    say(f"{n} records ({pending} pending), backlog {backlog}, {now - t_start:.0f}s")
                    next_log += 10
                time.sleep(0.05)
            n_records, _ = watch.counts()
            watch.close()
            say(f"done: {n_records} records in {t_last - t_start:.1f}s")
            res.seconds = t_last - t_start
            res.cpu = {k: cpu_last[k] - cpu_start[k] for k in pids}
            res.other_cpu = max(0.0, (cpu_last["_machine"] - cpu_start["_machine"]) - sum(res.cpu.values())
                                - (cpu_last["_self"] - cpu_start["_self"]))
            stop_all(procs, 10)
            procs = []
            res.records = n_records
            res.statuses = status_counts(db)
            oc = _count_outcomes(r)
            res.outcomes = sum(oc.values())
            res.duplicates = sum(n for (_s, reason), n in oc.items() if reason == "duplicate")
            res.dead_letters = r.xlen(DLQ)
            res.timers = r.xlen(TIMERS)
            res.notifications = res.records + res.duplicates
            res.rate = res.notifications / res.seconds
            res.events_rate = n_events / res.seconds
        finally:
            stop_all(procs, 10)
            r.close()
            server.stop()
            say("hops and server stopped")
    return res


def describe(res: Result) -> str:
    """What the ceiling run was, for the e2e section."""
    return (
        f"Ceiling run (`bench/ceiling.py`): the same {res.events:,} events and {res.users:,} users on raw Redis "
        f"Streams, a process per hop ({res.planners} planner(s), {res.senders} sender(s), 1 record writer; "
        f"{'uvloop' if res.uvloop else 'asyncio'}, {'hiredis' if res.hiredis else 'the pure-Python parser'}), "
        "XREADGROUP in batches and XACK per batch: the planner takes the channels (opt-outs, reachability, inbox "
        "fallback) and quiet hours with the pipeline's rule functions, then ONE Lua call per batch for dedup "
        "(EXISTS/SET EX per user x biz_key x channel), the daily counter (INCR per user x category x day, the "
        "category's cap) and the sliding windows (a ZSET per user x category), then renders with the project's "
        "Renderer (sandboxed Jinja2), the tracking link rewrite and a category's one-click unsubscribe link as the "
        "guard's plan adds them; the sender re-checks the opt-out and calls "
        "the same zero-latency fakes; every state change is one entry on an outcome stream, which one writer "
        "upserts into the record store's own schema (aiosqlite, one transaction per batch, attempts, push "
        f"devices and inbox rows included). {res.records:,} records + {res.duplicates:,} duplicates, "
        f"{res.outcomes:,} outcomes; events written in {res.produce_s:.1f} s, first consumed "
        f"{res.startup_s:.1f} s after launch. Records by state: "
        + ", ".join(f"{k} {v:,}" for k, v in res.statuses.items()) + ".\n\n"
        "What the ceiling does not do, so the ratio is read honestly: " + LEAVES_OUT
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--users", type=int, default=None, help="default: max(1000, events), as bench/e2e.py")
    ap.add_argument("--planners", type=int, default=PLANNERS)
    ap.add_argument("--senders", type=int, default=SENDERS)
    ap.add_argument("--role", choices=("plan", "send", "record"), help=argparse.SUPPRESS)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        return hop_main(args.role, args.name, args.url, args.batch, args.db)
    res = run(args.events, n_users=args.users, planners=args.planners, senders=args.senders)
    print(json.dumps(res.__dict__, indent=2))
    print(f"\nceiling: {res.rate:,.0f} notifications/s ({res.events_rate:,.0f} events/s); CPU "
          + ", ".join(f"{k} {v:.1f} s" for k, v in res.cpu.items()))


if __name__ == "__main__":
    main()
