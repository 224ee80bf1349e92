"""The status page (``/``) and its data (``/v1/status.json``).

One self-contained HTML page, no build step: inline CSS and JS that fetches
``/v1/status.json`` every 2 s and redraws four tables — lag, oldest unprocessed
age, consume rate and drain-time estimate per topic and lane; breaker states
(from the metrics registry of this process, when it runs the dispatcher);
today's records per state and reason; today's delivery, click and read
rates per template and channel (aggregates only); the latest dead letters.

``/v1/status.json`` is open like ``/metrics`` (ops dashboards poll it without a
key). It carries no message contents: a dead letter is shown as source,
reason, detail (cut to 300 characters), key and time, never its payload — read
payloads with ``notify dlq ls`` (addresses masked) or whole straight from the stream. Recipients that a
detail or a key quotes (a phone number sent as a time zone, a webhook URL …)
are masked (:func:`pipeline.redact.mask_text`; letters are also masked when
written, this covers older ones).
"""

from __future__ import annotations

import time
from typing import Any, Optional

import orjson

from pipeline import topics as T
from pipeline.breakers import read_breakers
from pipeline.redact import mask_text

from pipeline.rules.backpressure import oldest_age, throttle

from .metrics_lag import scaling

__all__ = ["PAGE", "latest_dead_letters", "status_document"]


def _s(v: Any) -> Optional[str]:
    if v is None:
        return None
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


async def latest_dead_letters(client: Any, keys: Any, partitions: int, n: int = 10) -> list[dict[str, Any]]:
    """The newest ``n`` dead letters over every partition of notify.dlq (one
    round trip: XREVRANGE … COUNT n per partition, merged by time)."""
    pipe = client.pipeline(transaction=False)
    for p in range(partitions):
        pipe.xrevrange(keys.stream(T.DLQ, p), max="+", min="-", count=n)
    rows = []
    for p, entries in enumerate(await pipe.execute()):
        for eid, fields in entries or []:
            try:
                dl = orjson.loads(fields.get(b"v") or b"{}")
            except orjson.JSONDecodeError:
                dl = {}
            if not isinstance(dl, dict):
                dl = {}
            try:
                at = float(dl.get("at") or fields.get(b"t") or 0)
            except (TypeError, ValueError):
                at = 0.0
            detail = _s(dl.get("detail"))
            key = _s(dl.get("key")) or _s(fields.get(b"k"))
            rows.append({
                "at": at,
                "source": _s(dl.get("source")) or "?",
                "reason": _s(dl.get("reason")) or "?",
                # a detail may quote the bad value (a phone number given as a time zone …)
                "detail": mask_text(detail[:300]) if detail else None,
                "key": mask_text(key[:256]) if key else key,
                "partition": p,
                "offset": int(_s(eid).split("-", 1)[0]),
            })
    rows.sort(key=lambda r: (r["at"], r["offset"]), reverse=True)
    return rows[:n]


#: the throttle as this page last judged it (the workers decide alike, from the same lag)
_throttle = {"on": False}


def backpressure_view(snap: Any, after_s: float) -> dict[str, Any]:
    age = oldest_age((t, max(tl.oldest_age, default=0.0)) for t, tl in snap.topics.items())
    _throttle["on"] = throttle(_throttle["on"], age, after_s)
    return {"on": _throttle["on"], "oldest_age_s": round(age, 3), "after_s": after_s}


async def status_document(sampler: Any, store: Any, client: Any, keys: Any,
                          backpressure_after_s: float = 60.0) -> dict[str, Any]:
    snap = await sampler.snapshot()
    doc: dict[str, Any] = {"at": time.time(), "broker": {"ok": snap.ok, "error": snap.error}}
    topics = [tl.as_dict() for tl in snap.topics.values()]
    doc["topics"] = [t for t in topics if not t["topic"].startswith("notify.send.") and t["topic"] not in T.UNREAD]
    doc["lanes"] = [t for t in topics if t["topic"].startswith("notify.send.")]
    doc["dlq_depth"] = snap.dlq_depth if snap.ok else None
    published = snap.topics.get(T.OUTCOMES)
    # entries, not outcomes: an entry may hold several outcomes of one user (outcome_entries)
    doc["outcome_entries_published"] = sum(published.highwater) if snap.ok and published else None
    try:  # every worker's breakers (pipeline/breakers.py), not this process's registry
        doc["breakers"] = read_breakers(await client.hgetall(keys.breakers))
    except Exception as exc:  # noqa: BLE001 - the page shows what it can
        doc["breakers"] = {}
        doc["broker"]["error"] = f"{type(exc).__name__}: {exc}"
    doc["processes"] = snap.processes
    doc["scaling"] = [load.as_dict() for load in scaling(snap)] if snap.ok else []
    doc["backpressure"] = backpressure_view(snap, backpressure_after_s) if snap.ok else None
    try:
        doc["today"] = await store.counts_today()
        # delivery, click and read rates per template and channel (README "Tracking")
        day = doc["today"]["since"]
        doc["engagement"] = await store.rates(day, day + 86400)
    except Exception as exc:  # noqa: BLE001 - the page shows what it can
        doc["today"] = None
        doc["engagement"] = []
        doc["store_error"] = f"{type(exc).__name__}: {exc}"
    if snap.ok:
        dl_parts = len(snap.topics[T.DLQ].highwater) if T.DLQ in snap.topics else sampler.partitions
        try:
            doc["dead_letters"] = await latest_dead_letters(client, keys, dl_parts)
        except Exception as exc:  # noqa: BLE001
            doc["dead_letters"] = []
            doc["broker"]["error"] = f"{type(exc).__name__}: {exc}"
    else:
        doc["dead_letters"] = []
    return doc


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>notify-stream status</title>
<style>
 body{font:14px/1.4 system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5em;color:#1d2430;background:#f6f7f9}
 h1{font-size:1.3em;margin:0 0 .2em} h2{font-size:1.05em;margin:1.4em 0 .4em}
 .meta{color:#667;font-size:.9em} .err{color:#b00020;font-weight:600}
 table{border-collapse:collapse;background:#fff;min-width:32em;box-shadow:0 1px 2px #0001}
 th,td{padding:.25em .7em;border-bottom:1px solid #e4e6ea;text-align:right;white-space:nowrap}
 th{background:#eef0f4;font-weight:600} td:first-child,th:first-child{text-align:left}
 td.l{text-align:left;white-space:normal;max-width:40em} .warn{color:#b36b00} .bad{color:#b00020;font-weight:600}
 .ok{color:#137333} .grid{display:flex;flex-wrap:wrap;gap:2em} .grid>div{flex:0 0 auto}
</style></head>
<body>
<h1>notify-stream</h1>
<div class="meta">updated <span id="updated">never</span> · refreshes every 2 s · <span id="broker"></span></div>
<div class="grid">
 <div><h2>Topics</h2><table id="topics"></table></div>
 <div><h2>Lanes</h2><table id="lanes"></table></div>
</div>
<div class="grid">
 <div><h2>Breakers</h2><table id="breakers"></table></div>
 <div><h2>Processes</h2><table id="processes"></table></div>
 <div><h2>Scaling <span id="bp" class="meta"></span></h2><table id="scaling"></table></div>
 <div><h2>Today (UTC) <span id="total" class="meta"></span></h2><table id="today"></table></div>
</div>
<h2>Engagement today (UTC) <span class="meta">rates of the sent</span></h2><table id="engagement"></table>
<h2>Latest dead letters <span id="dlq" class="meta"></span></h2><table id="dead"></table>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
function cell(row, text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; row.appendChild(td); return td; }
function table(id, head, rows) {
  const t = $(id); t.replaceChildren();
  const h = t.insertRow(); for (const x of head) { const th = document.createElement("th"); th.textContent = x; h.appendChild(th); }
  if (!rows.length) { const r = t.insertRow(); const td = cell(r, "none", "l"); td.colSpan = head.length; }
  for (const cells of rows) { const r = t.insertRow(); for (const c of cells) Array.isArray(c) ? cell(r, c[0], c[1]) : cell(r, c); }
}
function dur(s) { if (s === null || s === undefined) return "—"; if (s < 1) return "0 s"; if (s < 120) return s.toFixed(0) + " s"; if (s < 7200) return (s / 60).toFixed(1) + " min"; return (s / 3600).toFixed(1) + " h"; }
function lagRows(list) {
  return list.map((t) => [t.topic, t.agent || "—", [String(t.lag), t.lag > 1000 ? "bad" : t.lag > 0 ? "warn" : ""],
    dur(t.oldest_age_s), t.rate_per_s === null ? "—" : t.rate_per_s.toFixed(1) + "/s",
    t.lag === 0 ? "0 s" : (t.drain_s === null ? ["stalled?", "warn"] : dur(t.drain_s))]);
}
async function refresh() {
  try {
    const r = await fetch("/v1/status.json", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    const d = await r.json();
    $("updated").textContent = new Date(d.at * 1000).toLocaleTimeString();
    $("broker").textContent = d.broker.ok ? "broker ok" : "broker: " + (d.broker.error || "unreachable");
    $("broker").className = d.broker.ok ? "ok" : "err";
    const head = ["topic", "agent", "lag", "oldest", "rate", "drain"];
    table("topics", head, lagRows(d.topics)); table("lanes", head, lagRows(d.lanes));
    const names = {closed: "ok", half_open: "warn", open: "bad"};
    const brows = [];
    for (const [p, workers] of Object.entries(d.breakers)) for (const [w, b] of Object.entries(workers))
      brows.push([p, w, [b.state, names[b.state] || ""], new Date(b.since * 1000).toLocaleTimeString()]);
    table("breakers", ["provider", "worker", "state", "since"], brows);
    table("processes", ["process", "state", "restarts", "last exit"], Object.entries(d.processes || {}).map(([p, s]) =>
      [p, s.crash_loop ? ["crash looping", "bad"] : s.up ? ["up", "ok"] : ["restarting", "warn"], String(s.restarts),
       s.last_exit === null ? "—" : String(s.last_exit)]));
    table("scaling", ["priority", "workers", "lag", "oldest", "drain", "goal", "needed"], (d.scaling || []).map((x) =>
      [x.priority, String(x.workers), String(x.lag), dur(x.oldest_age_s), x.time_to_drain_s === null ? "—" : dur(x.time_to_drain_s),
       dur(x.goal_s), [String(x.workers_needed), x.workers_needed > x.workers ? "bad" : "ok"]]));
    const bp = d.backpressure;
    $("bp").textContent = bp ? (bp.on ? "backpressure ON: marketing waits (oldest " + dur(bp.oldest_age_s) + ")" : "no backpressure") : "";
    $("bp").className = bp && bp.on ? "meta bad" : "meta";
    const today = d.today || {states: {}, reasons: {}, total: 0};
    $("total").textContent = d.today ? today.total + " records" : "(store unavailable)";
    const rows = [];
    for (const [state, n] of Object.entries(today.states)) {
      rows.push([state, "", String(n)]);
      for (const [reason, m] of Object.entries(today.reasons[state] || {})) rows.push(["", reason, String(m)]);
    }
    table("today", ["state", "reason", "count"], rows);
    const pct = (x) => x === null || x === undefined ? "—" : (100 * x).toFixed(1) + "%";
    table("engagement", ["template", "channel", "sent", "delivered", "clicked", "read", "delivery", "click", "read rate"],
      (d.engagement || []).map((x) => [x.template, x.channel, String(x.sent), String(x.delivered), String(x.clicked),
        String(x.read), pct(x.delivery_rate), pct(x.click_rate), pct(x.read_rate)]));
    $("dlq").textContent = d.dlq_depth === null ? "" : "(" + d.dlq_depth + " in notify.dlq)";
    table("dead", ["time", "source", "reason", "detail", "key"], d.dead_letters.map((x) =>
      [new Date(x.at * 1000).toLocaleString(), x.source, x.reason, [x.detail || "", "l"], x.key || ""]));
  } catch (e) {
    $("broker").textContent = "status fetch failed: " + e.message; $("broker").className = "err";
  }
}
refresh(); setInterval(refresh, 2000);
</script>
</body></html>
"""
