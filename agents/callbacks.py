"""callbacks: producers hear back. Every state change of an event's notifications
(the outcome stream's states: PENDING, SCHEDULED, FILTERED with its reason,
ACCEPTED, DELIVERED, UNDELIVERED, FAILED, …) is POSTed to the event's
``callback_url``, or to its producer's default (``notify keys add P
--callback-url URL``), signed the Standard Webhooks way with the producer's
``whsec_`` secret(s), batched per event, at least once with an idempotency id per
change, retried with backoff and jitter for at least 24 hours. Seed 002's
message model's ``callbackUrl``; issue 27, item 1.

Two parts, neither in the way of a delivery:

* the agent ``callbacks`` reads ``notify.callbacks``: the outcomes of the events
  that have a callback target, and only those. Expand marks an event's intents
  (``callback``: the event names a URL or its producer has a default,
  :meth:`Callbacks.wanted`), its deliveries and outcomes carry the mark, and
  :meth:`agents.emit.Emit.outcomes` sends a marked outcome on that stream beside
  ``notify.outcomes`` (a receipt's or a poll's outcome by what its record keeps,
  the store's ``callback`` column, :meth:`Callbacks.heard`; a record written
  before the column by looking its event up, :meth:`Callbacks.wanted_keys`). So
  the outcomes of the events nobody asked to hear of are never read back
  (before, this agent read every outcome: a fifth of a main worker's CPU per
  record, bench/RESULTS.md "real: what the default configuration costs"). The
  agent takes what is ready, finds each event's target (one ``MGET`` a take: the
  URL expand wrote for the event, else the producer's default from the key
  file), and adds the changes to the durable
  callback set in the broker (pipeline/callback_queue.py), grouped per event. It
  makes no HTTP call, so a slow or dead endpoint never holds it; its entries are
  acknowledged (and committed) only once the changes are written there.
* the sender (:func:`run_sender`, a task of every worker that runs the agent)
  claims due callbacks, at most ``[callbacks] concurrency`` POSTs in flight and a
  quarter of them per host, and POSTs each (adapters/callbacks.py: the webhook
  channel's signer and SSRF guard). 2xx: done. Else the callback is rescheduled
  (pipeline/rules/callbacks.py ``after_failure``: ``base_delay_s`` doubling to
  ``max_delay_s``, half of it random) in the broker: no sleeping in the agent,
  nothing in memory; any worker takes it when due, after a restart too. Given up
  after ``retry_for_s`` of failures (``notify callbacks ls --failed``,
  ``notify callbacks replay``).

Where an event's target lives: ``<ns>:{cb}:t:<producer>|<biz_key>`` in the
broker, written by expand (:func:`remember`) before it plans the event's first
intent, kept ``target_ttl_s`` past the event's ``send_at``. The outcome carries
producer and biz_key, so no record between (Intent, Delivery, Outcome) carries
the URL. A Faust table would not do: expand reads an event where its first
recipient's partition is (or its biz_key's), the outcomes are keyed by each
recipient, so the table's key would be on another worker's partition.

Metrics (each worker's /metrics): ``notify_callbacks_sent_total`` (changes a
producer acknowledged), ``notify_callbacks_failed_total{reason}`` (changes given
up), ``notify_callbacks_retries_total`` (failed POSTs rescheduled),
``notify_callbacks_pending`` / ``notify_callbacks_retrying`` (callbacks waiting /
of them scheduled for later: the broker's set, the same on every worker),
``notify_callbacks_lag_seconds{stage}`` (``read``: how far behind the outcome
stream the agent reads; ``send``: how overdue the oldest due callback is) and
``notify_callbacks_delay_seconds`` (a change's outcome → its acknowledgment).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter as Tally
from typing import Any, Awaitable, Callable, Optional
from urllib.parse import urlsplit

import orjson
from prometheus_client import Counter, Gauge, Histogram

from adapters.callbacks import CallbackSender, PostResult
from pipeline.callback_queue import CallbackQueue, Claimed
from pipeline.entries import send_dead_letter
from pipeline.keyfile import ProducerCallbacks
from pipeline.models import Event, State
from pipeline.redact import mask_url
from pipeline.rules import callbacks as rules
from pipeline.take import take_ready
from pipeline.topics import CALLBACKS
from pipeline.transport.client import TRANSIENT_ERRORS, connect

log = logging.getLogger(__name__)

#: outcomes the agent takes at once
TAKE = 500
#: longest the sender sleeps before looking at the set again (other workers add to it)
POLL_S = 0.5
#: how often the sender refreshes the set's gauges
GAUGES_S = 2.0

sent_total = Counter("notify_callbacks_sent_total", "State changes a producer's callback endpoint acknowledged")
failed_total = Counter("notify_callbacks_failed_total", "State changes whose callback was given up", ["reason"])
retries_total = Counter("notify_callbacks_retries_total", "Callback POSTs that failed and were rescheduled")
skipped_total = Counter("notify_callbacks_skipped_total", "Entries of notify.outcomes that are not an outcome")
pending_gauge = Gauge("notify_callbacks_pending", "Callbacks waiting to be POSTed (the broker's set)")
retrying_gauge = Gauge("notify_callbacks_retrying", "Callbacks scheduled for a later try (or in flight)")
lag_gauge = Gauge("notify_callbacks_lag_seconds",
                  "read: the outcome stream's newest change taken, behind now; send: the oldest due callback, overdue",
                  ["stage"])
delay_hist = Histogram("notify_callbacks_delay_seconds", "From a state change to its callback acknowledged",
                       buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 86400))

async def _patiently(op: Callable[[], Awaitable[Any]], what: str) -> Any:
    """``op()``, tried again while the broker is unreachable: the agent waits (its
    entries stay unacknowledged), nothing is dropped."""
    wait = 0.1
    while True:
        try:
            return await op()
        except TRANSIENT_ERRORS as exc:
            log.warning("callbacks: could not %s (%s); trying again in %.1f s", what, exc, wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, 5.0)


def _outcome(value: Any) -> Optional[dict]:
    """The fields a callback needs from a raw outcome entry, or None when it is not one."""
    try:
        o = orjson.loads(value)
    except (orjson.JSONDecodeError, TypeError):
        return None
    if not isinstance(o, dict):
        return None
    if not all(isinstance(o.get(f), str) and o.get(f) for f in ("delivery_id", "biz_key")):
        return None
    if o.get("state") not in State.ALL or not isinstance(o.get("producer") or "", str):
        return None
    if not isinstance(o.get("retry_count") or 0, int):
        return None
    return o


def _host(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


class Callbacks:
    """The callbacks agent and sender of one app."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.cfg = cfg = app.settings.callbacks
        self.producers = ProducerCallbacks(os.path.join(app.settings.data_dir, "api_keys.json"),
                                           operator_secret=app.settings.env.callback_secret)
        #: a claimed callback is another worker's to take again after this long (a POST takes
        #: at most its connect and read timeouts; one still running then is sent twice: at least once)
        self.lease_s = 3 * cfg.timeout_s + 5
        self._queue: Optional[CallbackQueue] = None
        self._connecting: Optional[asyncio.Future] = None
        self._wake = asyncio.Event()

    async def queue(self) -> CallbackQueue:
        """The callback set, through a connection pool of its own: the callbacks' broker
        traffic never waits for (nor holds) a connection the transport's fetches, commits
        and changelog writes use. (Sharing the transport's client, a sender polling at
        start-up made expand handle an entry read before the end of recovery's seek a
        second time: tests/cli/test_cli.py saw a dead letter twice.)"""
        if self._queue is None:
            if self._connecting is None:
                self._connecting = asyncio.ensure_future(connect([self.app.transport.broker_url], pool_size=16))
            try:
                client = await asyncio.shield(self._connecting)
            except BaseException:
                self._connecting = None
                raise
            if self._queue is None:
                self._queue = CallbackQueue(client, self.app.transport.keys.ns)
        return self._queue

    def wanted(self, ev: Event) -> bool:
        """Whether ``ev``'s state changes are POSTed: it names a callback URL, or its
        producer has a default (expand sets the intents' ``callback`` by it, so only
        these changes go on notify.callbacks). A producer's default applies to the
        events expanded after it was set."""
        return self.cfg.enabled and bool(ev.callback_url or self.producers.default_url(ev.producer))

    async def targets(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], Optional[str]]:
        """Where the changes of the events ``(producer, biz_key)`` go: each event's own
        URL (one ``MGET``), else its producer's default; None: nowhere."""
        keys = list(dict.fromkeys(keys))
        if not keys:
            return {}
        q = await self.queue()
        urls = await _patiently(lambda: q.targets(keys), "read the events' callback targets")
        return {k: url or self.producers.default_url(k[0]) for k, url in zip(keys, urls)}

    async def wanted_keys(self, keys: list[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which of the events ``(producer, biz_key)`` have a callback target, for the
        changes made where no intent or delivery carries the flag (a provider's receipt,
        matched to its record)."""
        if not self.cfg.enabled:
            return set()
        return {k for k, url in (await self.targets(keys)).items() if url}

    async def heard(self, rows: list[dict]) -> list[bool]:
        """For each record row (the record store's, with its ``callback`` column),
        whether its event's producer hears of its state changes: what the record
        keeps (the flag expand set on its intents, written with its first outcome),
        without a broker read; for a row written before the store kept it (NULL),
        the event's target looked up (:meth:`wanted_keys`)."""
        if not self.cfg.enabled:
            return [False] * len(rows)
        unknown = [(r.get("producer") or "", r["biz_key"]) for r in rows if r.get("callback") is None]
        looked_up = await self.wanted_keys(unknown) if unknown else set()
        return [bool(r["callback"]) if r.get("callback") is not None else
                (r.get("producer") or "", r["biz_key"]) in looked_up for r in rows]

    async def remember(self, ev: Event) -> None:
        """An event's own callback URL, for the outcomes to come (expand, before it plans
        the event): kept ``target_ttl_s`` past its ``send_at``."""
        if not ev.callback_url or not self.cfg.enabled:
            return
        ahead = max(0.0, (ev.send_at or 0.0) - time.time())
        await (await self.queue()).remember(ev.producer, ev.biz_key, ev.callback_url, self.cfg.target_ttl_s + ahead)

    # ---------------------------------------------------------------- the agent

    async def on_outcomes(self, events: list) -> int:
        """One take of outcome entries → their changes in the callback set. Returns how
        many changes were added."""
        items = []
        for ev in events:
            o = _outcome(ev.value)
            if o is None:  # skipped, as `notify records replay` skips it: the outcome stream is the analysts'
                skipped_total.inc()
                msg = ev.message
                log.warning("callbacks: %s[%s]@%s is not an outcome; skipped", msg.topic, msg.partition, msg.offset)
                continue
            items.append(o)
        if not items:
            return 0
        newest = max((o.get("at") for o in items if isinstance(o.get("at"), (int, float))), default=None)
        if newest is not None:
            lag_gauge.labels("read").set(max(0.0, time.time() - newest))
        urls = await self.targets([(o.get("producer") or "", o["biz_key"]) for o in items])
        pairs = [(o, url) for o in items if (url := urls[(o.get("producer") or "", o["biz_key"])])]
        if not pairs:
            return 0
        q = await self.queue()
        batches = rules.group(pairs, self.cfg.max_batch)
        await _patiently(lambda: q.enqueue(batches, self.cfg.max_batch), "add callbacks")
        self._wake.set()
        return sum(len(b.changes) for b in batches)

    async def callbacks(self, stream):
        async for events in take_ready(stream, TAKE):
            try:
                await self.on_outcomes(events)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a bug must not stop the agent: the take is dead-lettered
                log.exception("callbacks: a take of %d outcomes failed; they are dead-lettered", len(events))
                for ev in events:
                    msg = ev.message
                    await send_dead_letter(self.app.declared.dlq, msg.topic, "agent_error", msg.value,
                                           detail=f"callbacks: {type(exc).__name__}: {exc}", key=msg.key,
                                           partition=msg.partition, offset=msg.offset)

    # ---------------------------------------------------------------- the sender

    async def post_one(self, q: CallbackQueue, sender: CallbackSender, c: Claimed) -> PostResult:
        """POST one claimed callback and record what came of it."""
        if not c.changes:
            await q.done(c)
            return PostResult(True)
        body, ids = rules.body(c.producer, c.biz_key, c.changes.values())
        secrets = self.producers.secrets(c.producer)
        if not secrets:
            res = PostResult(False, permanent=True,
                             error=f"no_secret: producer {c.producer or '(operator)'} has no callback secret")
        else:
            res = await sender.post(c.url, rules.message_id(ids), body, secrets)
        now = time.time()
        try:
            if res.ok:
                await q.done(c)
                sent_total.inc(len(ids))
                for data in c.changes.values():
                    at = orjson.loads(data).get("at")
                    if isinstance(at, (int, float)):
                        delay_hist.observe(max(0.0, now - at))
                return res
            r = rules.after_failure(c.attempts + 1, c.since or now, now, base_s=self.cfg.base_delay_s, max_s=self.cfg.max_delay_s,
                                    retry_for_s=self.cfg.retry_for_s, retry_after=res.retry_after, permanent=res.permanent,
                                    error=res.error)
            if r.give_up:
                await q.give_up(c, r.reason, now)
                failed_total.labels(r.reason.split(":", 1)[0]).inc(len(ids))
                log.warning("callback %s to %s for %s/%s given up after %d tries: %s", c.id, mask_url(c.url),
                            c.producer, c.biz_key, c.attempts + 1, r.reason)
            else:
                await q.retry(c, r.at, res.error, now)
                retries_total.inc()
        except TRANSIENT_ERRORS as exc:  # its lease ends and it is POSTed again (at least once)
            log.warning("callback %s: could not record the try's result: %s", c.id, exc)
        return res

    async def run_sender(self) -> None:
        """Claim due callbacks and POST them, for as long as the worker runs."""
        q = await self.queue()
        sender = CallbackSender(allow=self.cfg.allow, timeout=self.cfg.timeout_s, max_connections=self.cfg.concurrency)
        if self.cfg.allow:
            log.warning("callback targets allowed besides public addresses: %s", ", ".join(self.cfg.allow))
        tasks: set[asyncio.Task] = set()
        hosts: Tally = Tally()
        per_host = max(1, self.cfg.concurrency // 4)
        gauges_at = 0.0

        def finished(task: asyncio.Task, host: str) -> None:
            tasks.discard(task)
            hosts[host] -= 1
            self._wake.set()
            if not task.cancelled() and task.exception() is not None:
                log.error("callbacks: a POST task failed", exc_info=task.exception())

        try:
            while True:
                try:
                    free = self.cfg.concurrency - len(tasks)
                    got = await q.claim(free, self.lease_s) if free > 0 else []
                    started = 0
                    for c in got:
                        host = _host(c.url)
                        if hosts[host] >= per_host:  # this host has its share in flight: the others go first
                            await q.release(c, time.time() + 0.2)
                            continue
                        hosts[host] += 1
                        started += 1
                        t = asyncio.ensure_future(self.post_one(q, sender, c))
                        tasks.add(t)
                        t.add_done_callback(lambda t, h=host: finished(t, h))
                    now = time.time()
                    if now - gauges_at >= GAUGES_S:
                        gauges_at = now
                        total, later, lag = await q.gauges(now)
                        pending_gauge.set(total)
                        retrying_gauge.set(later)
                        lag_gauge.labels("send").set(lag)
                    if got and started == len(got) == free:  # a full claim, all started: there may be more
                        await asyncio.sleep(0)
                        continue
                    nxt = await q.next_due()
                    wait = POLL_S if nxt is None else min(POLL_S, max(0.001, nxt - time.time()))
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), wait)
                    except asyncio.TimeoutError:
                        pass
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the loop must outlive a bad pass (the broker away)
                    log.warning("callbacks: sender pass failed (%s: %s); trying again", type(exc).__name__, exc)
                    await asyncio.sleep(1.0)
        finally:
            for t in tasks:
                t.cancel()
            await sender.close()


def register(app: Any) -> Callbacks:
    """The callbacks agent (reading notify.callbacks) and its sender, where the role
    reads that topic (pipeline/roles.py), when ``[callbacks] enabled``."""
    cb = Callbacks(app)
    if cb.cfg.enabled and app.runs(CALLBACKS):
        app.agent(app.declared.callbacks, name="callbacks")(cb.callbacks)
        app.task(cb.run_sender)
    return cb
