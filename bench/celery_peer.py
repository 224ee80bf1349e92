"""Benchmark (not a test): the peer a user would pick instead of notify-stream —
seed 000's design on Celery with a Redis broker, measured on the same machine.

    python bench/celery_peer.py [--notifications 50000]

* Broker: the same embedded valkey-server (AOF everysec), started here.
* One Celery task per notification (one user x one channel), pre-enqueued;
  ``celery worker --concurrency 2 --pool prefork`` (the two cores), defaults
  otherwise, no result backend.
* Each task: seed 000's Lua GUARD in Redis (verbatim, EVALSHA), the same template
  render (``pipeline.templates.Renderer`` from config), the same fake provider
  call (``adapters.fake.FakeProvider`` at zero latency, its coroutine driven
  synchronously: it never suspends), and one INSERT + COMMIT into a
  ``notify_record`` table with seed 000's columns (SQLite, WAL, synchronous=NORMAL
  like the pipeline's store); an inbox notification also writes the inbox row and
  bumps the unread count in the same transaction.
* The recipients' preferences (opt-outs, reachability, quiet hours) are applied
  when the tasks are enqueued (seed 000's pre-processing worker), so every task is
  one notification to guard, render, send and record.

Measured: from the first task started (its ``created_at``) to the last record
committed, and CPU (utime+stime from /proc) of the Celery worker (main process and
its prefork children) and of the server.

The module is also the Celery app: ``celery -A bench.celery_peer worker``
reads PEER_BROKER, PEER_DB.

Run by bench/compare.py, which writes the "e2e" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))

from celery import Celery  # noqa: E402

from pipeline.procs import stop_process  # noqa: E402

celery_app = Celery("peer", broker=os.environ.get("PEER_BROKER", "redis://127.0.0.1:6379/0"))
celery_app.conf.update(
    task_ignore_result=True,  # no result backend: nobody reads task results
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

# seed 000, verbatim:
# KEYS[1] 去重 key，KEYS[2] 当天的计数 key；ARGV[1] 去重窗口（秒），ARGV[2] 每日上限，ARGV[3] 计数 key 的过期时间（秒）
GUARD = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 1 end
local n = tonumber(redis.call('GET', KEYS[2]) or '0')
if n >= tonumber(ARGV[2]) then return 2 end
redis.call('SET', KEYS[1], '1', 'EX', ARGV[1])
redis.call('INCR', KEYS[2])
if n == 0 then redis.call('EXPIRE', KEYS[2], ARGV[3]) end
return 0"""
RESULT = ["PASS", "DUPLICATE", "OVER_LIMIT"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS notify_record (
    id              INTEGER PRIMARY KEY,
    biz_key         TEXT    NOT NULL,
    user_id         TEXT    NOT NULL,
    channel         TEXT    NOT NULL,
    template_code   TEXT    NOT NULL,
    status          TEXT    NOT NULL,
    reason          TEXT,
    provider        TEXT,
    provider_msg_id TEXT,
    retry_count     INTEGER NOT NULL DEFAULT 0,
    created_at      REAL    NOT NULL,
    sent_at         REAL,
    UNIQUE (biz_key, user_id, channel)
);
CREATE TABLE IF NOT EXISTS inbox (
    id INTEGER PRIMARY KEY, user_id TEXT NOT NULL, delivery_id TEXT NOT NULL UNIQUE,
    title TEXT NOT NULL, body TEXT NOT NULL, created_at REAL NOT NULL, read_at REAL
);
CREATE TABLE IF NOT EXISTS inbox_unread (user_id TEXT PRIMARY KEY, unread INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
"""
INSERT = ("INSERT OR IGNORE INTO notify_record (biz_key, user_id, channel, template_code, status, reason, provider,"
          " provider_msg_id, retry_count, created_at, sent_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?)")

# -- the worker side (one of each per prefork child, opened on its first task) ------

_state: Any = None


def _open() -> Any:
    global _state
    if _state is None:
        import redis

        from adapters.fake import FakeProvider
        from adapters.inbox import InboxProvider
        from config.settings import load_settings
        from pipeline.templates import Renderer

        settings = load_settings()
        r = redis.Redis.from_url(os.environ["PEER_BROKER"])
        db = sqlite3.connect(os.environ["PEER_DB"], timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        _state = SimpleNamespace(
            settings=settings,
            renderer=Renderer.from_settings(settings),
            guard=r.register_script(GUARD),
            db=db,
            providers={"push": FakeProvider("apns", "push"), "sms": FakeProvider("sms_a", "sms"),
                       "email": FakeProvider("email", "email"), "inbox": InboxProvider()},
        )
    return _state


def _run_sync(coro: Any) -> Any:
    """Drive a coroutine that never suspends (the fakes at zero latency)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("the provider suspended; use asyncio.run")


@celery_app.task(name="peer.send")
def send_notification(n: dict) -> None:
    from pipeline.ids import delivery_id
    from pipeline.models import AttemptResult, Delivery
    from pipeline.templates import TemplateError

    st = _open()
    created = time.time()
    uid, channel, category = n["user_id"], n["channel"], n["category"]
    cat = st.settings.category(category)
    day = datetime.now(timezone.utc).date().isoformat()
    keys = [f"notify:dedup:{{{uid}}}:{n['biz_key']}:{channel}", f"notify:freq:{{{uid}}}:{category}:{day}"]
    limit = cat.daily_limit if cat.daily_limit is not None else 2**31
    verdict = RESULT[st.guard(keys=keys, args=[cat.dedup_window_s, limit, 2 * 86400])]
    row = [n["biz_key"], uid, channel, n["template"], "FILTERED", None, None, None, created, None]
    inbox = None
    if verdict == "DUPLICATE":
        row[5] = "duplicate"  # the unique key keeps the original's record
    elif verdict == "OVER_LIMIT":
        row[5] = "over_limit"
    else:
        try:
            content = st.renderer.render(n["template"], 1, channel, n.get("locale"), n["params"])
        except TemplateError as exc:
            row[4], row[5] = "FAILED", exc.code
        else:
            did = delivery_id(n["biz_key"], uid, channel)
            d = Delivery(delivery_id=did, notification_id=did.rsplit(".", 1)[0], biz_key=n["biz_key"], user_id=uid,
                         channel=channel, category=category, template=n["template"], priority=cat.priority,
                         address=n["address"], content=content, accepted_at=created)
            res = _run_sync(st.providers[channel].send(d))
            if res.result == AttemptResult.ACCEPTED:
                row[4:8] = ["SENT", None, res.provider, res.provider_msg_id]
                row[9] = time.time()
                if channel == "inbox":
                    inbox = (uid, did, content.get("title", ""), content.get("body", ""), row[9])
            else:
                row[4:7] = ["FAILED", (res.error or res.result)[:64], res.provider]
    db = st.db
    db.execute("BEGIN")
    try:
        db.execute(INSERT, row)
        if inbox:
            cur = db.execute("INSERT OR IGNORE INTO inbox (user_id, delivery_id, title, body, created_at)"
                             " VALUES (?, ?, ?, ?, ?)", inbox)
            if cur.rowcount:
                db.execute("INSERT INTO inbox_unread (user_id, unread) VALUES (?, 1)"
                           " ON CONFLICT (user_id) DO UPDATE SET unread = unread + 1", (uid,))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


# -- the driver ---------------------------------------------------------------------


def make_notifications(n: int, seed: int = 8) -> list[dict]:
    """The e2e benchmark's mix (pipeline/cli/mixes.py, as bench/e2e.py sends it), expanded the seed's way: recipients x
    channels after preferences; quiet-hours users' normal/low notifications and
    opted-out or unreachable channels are dropped at this step."""
    from pipeline.cli.mixes import make_events, make_users
    from config.settings import load_settings
    from pipeline.rules.channels import pick_channels

    settings = load_settings()
    rng = random.Random(seed)
    users = make_users(max(1000, n // 3), rng)
    by_id = {u.id: u for u in users}
    hour = time.gmtime().tm_hour
    prefs = {u.id: SimpleNamespace(**{"switches": {}, **u.prefs(hour)}) for u in users}
    out: list[dict] = []
    events = make_events(n, users, rng)  # more than enough: >= 1 notification each on average
    for ev in events:
        cat = settings.category(ev["category"])
        for uid in ev["recipients"]:
            u = by_id[uid]
            if u.quiet and cat.priority != "high":
                continue  # deferred by the quiet hours
            chosen, _why = pick_channels(ev.get("channels"), cat, prefs[uid], bool(u.device))
            for ch in chosen:
                address = {"sms": u.phone, "email": u.email, "push": f"apns:{u.device}"}.get(ch) or ""
                out.append({"biz_key": ev["biz_key"], "user_id": uid, "channel": ch, "category": ev["category"],
                            "template": ev["template"], "params": ev["params"], "address": address})
                if len(out) >= n:
                    return out
    return out


@dataclass
class Result:
    notifications: int
    records: int = 0
    seconds: float = 0.0
    rate: float = 0.0
    enqueue_s: float = 0.0
    startup_s: float = 0.0
    cpu: dict = field(default_factory=dict)
    statuses: dict = field(default_factory=dict)
    celery: str = ""
    prefetch: Optional[int] = None
    other_cpu: float = 0.0  # CPU s used by processes outside this benchmark during the window


def cpu_tree(pid: int) -> float:
    from bench.e2e import tree_cpu

    return tree_cpu(pid)


def _forget_connections() -> None:
    """Celery keeps its broker connection pool and producer pool from the first
    use: a second run in the same process would publish to the first run's
    (stopped) server. Closed and dropped, they are made again for the new URL."""
    pool = getattr(celery_app, "_pool", None)
    if pool is not None:
        pool.force_close_all()
        celery_app._pool = None
    amqp = celery_app.amqp
    if getattr(amqp, "_producer_pool", None) is not None:
        amqp._producer_pool = None


def run(n: int, *, prefetch: Optional[int] = None, timeout: float = 900.0, log=print) -> Result:
    """``prefetch``: ``--prefetch-multiplier`` for the worker (None = Celery's default, 4)."""
    import celery
    import redis

    from pipeline.embedded import EmbeddedRedis

    OUT.mkdir(parents=True, exist_ok=True)
    t_begin = time.monotonic()

    def say(msg: str) -> None:
        log(f"[{time.monotonic() - t_begin:6.1f}s] {msg}")

    todo = make_notifications(n)
    expected_rows = len({(x["biz_key"], x["user_id"], x["channel"]) for x in todo})
    res = Result(notifications=len(todo), celery=celery.__version__, prefetch=prefetch)
    with tempfile.TemporaryDirectory(prefix="notify-peer-") as tmpdir:
        tmp = Path(tmpdir)
        db_path = tmp / "records.db"
        con = sqlite3.connect(db_path)
        con.execute("PRAGMA journal_mode=WAL")
        con.executescript(SCHEMA)
        con.close()
        server = EmbeddedRedis(tmp / "redis").start()  # AOF everysec
        os.environ["PEER_BROKER"] = server.url
        _forget_connections()  # a run before this one (compare.py --rounds) left its server's
        celery_app.conf.broker_url = server.url
        proc = None
        r = redis.Redis.from_url(server.url)
        try:
            t0 = time.perf_counter()
            with celery_app.producer_or_acquire() as producer:
                for x in todo:
                    send_notification.apply_async((x,), producer=producer)
            res.enqueue_s = time.perf_counter() - t0
            say(f"peer: {len(todo)} tasks enqueued in {res.enqueue_s:.1f}s ({expected_rows} distinct records); "
                f"queue length {r.llen('celery')}")
            env = dict(os.environ, PEER_BROKER=server.url, PEER_DB=str(db_path), PYTHONPATH=str(ROOT))
            t_launch = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "bench.celery_peer", "worker", "--concurrency", "2",
                 "--pool", "prefork", "--loglevel", "warning", "-n", f"peer{os.getpid()}@%h",
                 *(["--prefetch-multiplier", str(prefetch)] if prefetch else [])],
                cwd=str(ROOT), env=env, stdout=open(OUT / "peer-worker.log", "w"), stderr=subprocess.STDOUT)
            pids = {"celery worker (main + 2 children)": proc.pid, "redis": server.proc.pid}
            ro = None
            while ro is None:
                if proc.poll() is not None:
                    raise RuntimeError(f"celery worker exited with {proc.returncode}; see bench/out/peer-worker.log")
                try:
                    c = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
                    if c.execute("SELECT max(id) FROM notify_record").fetchone()[0]:
                        ro = c
                    else:
                        c.close()
                except sqlite3.OperationalError:
                    pass
                if time.monotonic() - t_launch > 120:
                    raise RuntimeError("no task ran within 120s")
                time.sleep(0.005)
            from bench.e2e import cpu_seconds, machine_busy

            cpu_start = {k: cpu_tree(pid) for k, pid in pids.items()}
            busy_start, self_start = machine_busy(), cpu_seconds(os.getpid())
            res.startup_s = time.monotonic() - t_launch
            say(f"peer: first task ran {res.startup_s:.1f}s after the worker was started")
            deadline = time.monotonic() + timeout
            next_log = time.monotonic() + 10
            last = 0
            while True:
                rows = ro.execute("SELECT max(id) FROM notify_record").fetchone()[0] or 0
                now = time.time()
                if rows >= expected_rows and r.llen("celery") == 0:
                    break
                if rows != last:
                    last = rows
                if proc.poll() is not None:
                    raise RuntimeError(f"celery worker exited with {proc.returncode}; see bench/out/peer-worker.log")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"peer not done after {timeout:.0f}s: {rows}/{expected_rows} records")
                if time.monotonic() > next_log:
                    say(f"peer: {rows}/{expected_rows} records")
                    next_log += 10
                time.sleep(0.02)
            cpu_end = {k: cpu_tree(pid) for k, pid in pids.items()}
            busy_end, self_end = machine_busy(), cpu_seconds(os.getpid())
            first = ro.execute("SELECT min(created_at) FROM notify_record").fetchone()[0]
            res.records = rows
            res.seconds = now - first
            res.rate = res.notifications / res.seconds
            res.cpu = {k: cpu_end[k] - cpu_start[k] for k in pids}
            res.other_cpu = max(0.0, (busy_end - busy_start) - sum(res.cpu.values()) - (self_end - self_start))
            res.statuses = {f"{s}{'/' + rs if rs else ''}": c for s, rs, c in ro.execute(
                "SELECT status, coalesce(reason, ''), count(*) FROM notify_record GROUP BY 1, 2 ORDER BY 3 DESC")}
            ro.close()
            say(f"peer: done: {res.notifications} notifications ({rows} records) in {res.seconds:.1f}s")
        finally:
            if proc:
                stop_process(proc, 20)
            r.close()
            server.stop()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--notifications", type=int, default=50_000)
    ap.add_argument("--prefetch", type=int, default=None, help="worker --prefetch-multiplier (default: Celery's, 4)")
    args = ap.parse_args()
    res = run(args.notifications, prefetch=args.prefetch)
    print(json.dumps(res.__dict__, indent=2))


if __name__ == "__main__":
    main()
