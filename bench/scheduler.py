"""Benchmark (not a test): the scheduler's firing delay under a 100,000-item
schedule (issue 24, item 10). Prints a markdown table; writes nothing.

    python bench/scheduler.py [--items 100000] [--window 60] [--lead 40]
                              [--workers 1] [--consume] [--quick]

Setup: a fresh embedded server (valkey, AOF everysec), 8 partitions, ``--workers``
worker processes of role ``main`` (the role that runs the scheduler) at normal CPU
priority. The schedule is filled as the pipeline fills it: ``--items`` timers
written to ``notify.timers`` keyed by their user (10,000 users), in random order,
a mix of what the pipeline defers: 60% deferred intents (``send_at`` / quiet
hours: kind ``intent``, the intent with ``resumed``), 40% delivery retries (kind
``delivery``). Their due times are spread evenly over ``--window`` seconds,
starting ``--lead`` seconds after the fill starts (the fill, written and taken
into the scheduler's table, must be done by then: the table says how long it took).

Firing delay: for every item, from its due time to the moment the worker wrote
its payload back into its stream (the ``t`` field of the entry in
``notify.intents.<p>`` / ``notify.send.<channel>.<p>``: the worker's
``time.time()`` when it queued the entry). By default the payloads are of
priority ``high``, whose topics a ``main`` worker does not read, so the figure is
the scheduler's own and not the guard's or the lanes' work on what it fires;
``--consume`` makes them ``normal`` (the guard and the lanes of the same worker
then plan and send each one: the delay includes competing with them).

Checks on the way: every item fired exactly once (``missing``, ``duplicates``)
and none before its due time (``early``).
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import orjson
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.embedded import EmbeddedRedis  # noqa: E402
from pipeline.ids import delivery_id, notification_id  # noqa: E402
from tests.pipeline.harness import Pipeline  # noqa: E402
from tests.transport.helpers import wait_until  # noqa: E402

PARTITIONS = 8
USERS = 10_000
TIMERS = "notify.timers"
BIZ = re.compile(rb'"biz_key":"sched:(\d+)"')


def timer(i: int, due: float, priority: str, kind: str) -> tuple[bytes, dict]:
    """Item ``i`` of the schedule, as the guard (deferred intent) or a lane (retry) writes it."""
    user = f"su{i % USERS}"
    biz = f"sched:{i}"
    nid = notification_id(biz, user)
    if kind == "intent":
        payload = {"notification_id": nid, "biz_key": biz, "user_id": user, "category": "otp" if priority == "high"
                   else "transaction", "template": "otp", "template_version": 1, "priority": priority,
                   "params": {"code": "123456"}, "channels": ["sms"], "send_at": due, "accepted_at": time.time(),
                   "resumed": True}
        tid = f"{nid}:intent"
    else:
        did = delivery_id(biz, user, "sms")
        payload = {"delivery_id": did, "notification_id": nid, "biz_key": biz, "user_id": user, "channel": "sms",
                   "category": "transaction", "template": "otp", "priority": priority, "address": "+15550001234",
                   "content": {"body": "Your code is 123456"}, "attempt": 1, "due_at": due,
                   "accepted_at": time.time()}
        tid = f"{did}:1:0"
    return user.encode(), {"timer_id": tid, "due_at": due, "kind": kind, "payload": payload}


def destinations(priority: str) -> list[str]:
    return [f"notify.intents.{priority}", f"notify.send.sms.{priority}"]


def fired(url: str, priority: str) -> list[tuple[int, float, float]]:
    """(item, time written, the due time its payload carries) of every entry in the
    destination streams (with ``--consume`` a lane's own retry of a delivery shows up
    there too, under the same item, with another due time)."""
    r = redis.Redis.from_url(url)
    out = []
    try:
        for topic in destinations(priority):
            for p in range(PARTITIONS):
                stream = f"nfs:{{{topic}|{p}}}:s"
                last = "-"
                while True:
                    batch = r.xrange(stream, min=last, max="+", count=10_000)
                    if last != "-" and batch and batch[0][0] == last:
                        batch = batch[1:]
                    if not batch:
                        break
                    for eid, f in batch:
                        m = BIZ.search(f.get(b"v", b""))
                        if m:
                            v = orjson.loads(f[b"v"])
                            out.append((int(m.group(1)), float(f[b"t"]), v.get("due_at") or v.get("send_at")))
                    last = batch[-1][0]
    finally:
        r.close()
    return out


def count_fired(url: str, priority: str) -> int:
    r = redis.Redis.from_url(url)
    try:
        return sum(r.xlen(f"nfs:{{{t}|{p}}}:s") for t in destinations(priority) for p in range(PARTITIONS))
    finally:
        r.close()


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))]


def run(items: int, window: float, lead: float, workers: int, consume: bool) -> dict:
    priority = "normal" if consume else "high"
    tmp = Path(tempfile.mkdtemp(prefix="bench-sched-"))
    server = EmbeddedRedis(tmp / "redis").start()
    pipe = Pipeline(server.url, tmp, "receipt_poll_s = 0\n", partitions=PARTITIONS, NOTIFY_ROLE="main",
                    NOTIFY_MAIN_SCHED="normal", NOTIFY_MAIN_NICE="0", NOTIFY_WORKERS=workers)
    try:
        for i in range(workers):
            pipe.start(f"worker{i}", NOTIFY_WORKER_INDEX=i)
        wait_until(lambda: all("Worker ready" in pipe.log(f"worker{i}") for i in range(workers)), 120, 0.2,
                   "workers ready")
        rnd = random.Random(1)
        t0 = time.time()
        base = t0 + lead
        order = list(range(items))
        rnd.shuffle(order)
        due = {}
        entries = []
        for i in order:
            due[i] = base + window * i / items
            key, value = timer(i, due[i], priority, "intent" if rnd.random() < 0.6 else "delivery")
            entries.append((key, orjson.dumps(value)))
        for k in range(0, len(entries), 20_000):
            pipe.send(TIMERS, entries[k:k + 20_000])
        written = time.time() - t0
        pipe.wait_committed({TIMERS: items}, timeout=lead * 4, group="notify")
        taken = time.time() - t0
        end = base + window
        wait_until(lambda: count_fired(server.url, priority) >= items or time.time() > end + 120, end - time.time()
                   + 180, 0.5, "the schedule fired")
        time.sleep(2)  # duplicates, if any, have a moment to show up
        got = fired(server.url, priority)
        logs = "".join(pipe.log(f"worker{i}") for i in range(workers))
    finally:
        pipe.stop()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    seen: dict[int, int] = {}
    delays = []
    early = 0
    for i, t, carried in got:
        if carried != due[i]:
            continue  # not the scheduled item: a lane's retry of it (--consume)
        seen[i] = seen.get(i, 0) + 1
        if seen[i] == 1:
            d = t - due[i]
            delays.append(d)
            early += d < 0
    passes = [float(x) for x in re.findall(r"scheduler pass: [0-9]+ fired in ([0-9.]+) s", logs)]
    return {
        "items": items, "window": window, "workers": workers, "priority": priority,
        "fill_written_s": written, "fill_taken_s": taken, "lead": lead,
        "fired": len(seen), "missing": items - len(seen), "duplicates": sum(n - 1 for n in seen.values()),
        "early": early, "p50": pct(delays, 0.50), "p99": pct(delays, 0.99), "max": max(delays, default=float("nan")),
        "slow_passes": len(passes), "longest_pass": max(passes, default=0.0),
    }


def table(rows: list[dict]) -> str:
    head = ("| items | due over | workers | payloads | schedule filled (written / in the table) | fired | missing "
            "| duplicates | early | delay p50 | delay p99 | max |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['items']:,} | {r['window']:.0f} s | {r['workers']} | {r['priority']} "
            f"| {r['fill_written_s']:.1f} s / {r['fill_taken_s']:.1f} s (window from {r['lead']:.0f} s) "
            f"| {r['fired']:,} | {r['missing']} | {r['duplicates']} | {r['early']} "
            f"| {r['p50'] * 1000:.0f} ms | {r['p99'] * 1000:.0f} ms | {r['max'] * 1000:.0f} ms |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--window", type=float, default=60.0, help="seconds over which the items come due")
    ap.add_argument("--lead", type=float, default=40.0, help="seconds from the fill's start to the first due time")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--consume", action="store_true", help="normal-priority payloads, planned and sent by the worker")
    ap.add_argument("--quick", action="store_true", help="10,000 items over 10 s")
    a = ap.parse_args()
    if a.quick:
        a.items, a.window, a.lead = 10_000, 10.0, 15.0
    r = run(a.items, a.window, a.lead, a.workers, a.consume)
    print(table([r]))
    if r["slow_passes"]:
        print(f"\nscheduler passes over 1 s: {r['slow_passes']}, the longest {r['longest_pass']:.1f} s")


if __name__ == "__main__":
    main()
