"""``notify demo --events N``: a realistic mixed load against the provider
simulators (pipeline/cli/mixes.py), with a progress line, ending in a summary
table of states, reasons and p50/p99 latency (acceptance → terminal state) per
priority.

It uses a running ``notify run`` (REDIS_URL or data/broker.url) if there is one,
otherwise starts ``notify run`` itself (the embedded server, the workers and the
simulators of its default layout, no API), its log in data/demo-run.log, and
stops it at the end.
"""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from pipeline.store.schema import of_record

from .broker import CLIError, NoBroker, broker_keys, broker_url, current_settings, redis_client
from .mixes import demo_events, demo_users
from .send import send_raw

__all__ = ["cmd_demo", "run_demo", "wait_ready"]

TERMINAL = ("FILTERED", "ACCEPTED", "DELIVERED", "UNDELIVERED", "FAILED", "REVIEW")
DEFERRED = ("SCHEDULED",)  # quiet hours or send_at: due later, reported apart


def cmd_demo(args) -> int:
    return run_demo(args.events, users=args.users)


def _query(db: Path, sql: str, params: tuple) -> list:
    """Rows of a read-only query of the record store; none while the file or its tables
    are not there yet."""
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return con.execute(sql, params).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


def _counts(db: Path, prefix: str) -> tuple[int, int, int, int]:
    """(records, terminal, deferred, events with a record) of this run (business keys ``prefix``…)."""
    rows = _query(
        db,
        f"SELECT count(*), sum(status IN ({','.join('?' * len(TERMINAL))})), "
        f"sum(status IN ({','.join('?' * len(DEFERRED))})), count(DISTINCT biz_key) "
        "FROM notify_record WHERE biz_key >= ? AND biz_key < ?",
        (*TERMINAL, *DEFERRED, prefix, prefix + "\uffff"),
    )
    total, done, deferred, events = rows[0] if rows else (0, 0, 0, 0)
    return total or 0, done or 0, deferred or 0, events or 0


#: what a record still in flight is waiting for, by (state, reason) (pipeline/rules/attempts.py)
_WAITING_FOR = {
    ("UNKNOWN", "timeout"): "a call timed out: the provider is asked what became of it",
    ("UNKNOWN", "reconcile_retry"): "the provider is asked again, with backoff, what became of a timed-out call",
    ("PENDING", "rate_limited"): "answered 429: backing off to retry",
    ("PENDING", "transient_error"): "a provider error: backing off to retry",
    ("PENDING", "reconciled_not_found"): "the provider never got it: sending again",
}


def _in_flight(db: Path, prefix: str) -> list[tuple[str, str, int, Optional[float]]]:
    """This run's records neither terminal nor deferred: (state, reason, count, the
    latest time one of them is due to be tried again, from its attempts; None when
    none says)."""
    marks = ",".join("?" * (len(TERMINAL) + len(DEFERRED)))
    return _query(
        db,
        f"SELECT status, coalesce(reason, ''), count(*), max((SELECT max(a.next_at) FROM attempts a"
        f" WHERE {of_record('a.delivery_id', 'r.delivery_id')})) FROM notify_record r"
        f" WHERE biz_key >= ? AND biz_key < ? AND status NOT IN ({marks}) GROUP BY 1, 2 ORDER BY 3 DESC",
        (prefix, prefix + "\uffff", *TERMINAL, *DEFERRED))


def describe_in_flight(rows: list[tuple[str, str, int, Optional[float]]], now: float) -> str:
    """``"2 in flight (2 PENDING rate_limited: answered 429: backing off to retry, the
    last due in 18 s)"``, or ``""``."""
    parts = []
    for state, reason, n, due in rows:
        part = f"{n} {state} {reason}".rstrip()
        if (state, reason) in _WAITING_FOR:
            part += f": {_WAITING_FOR[state, reason]}"
            if state == "PENDING" and due is not None and due > now:
                part += f", the last due in {due - now:.0f} s"
        parts.append(part)
    return f"{sum(r[2] for r in rows)} in flight ({'; '.join(parts)})" if rows else ""


def finished(counts: tuple[int, int, int, int], events: int, still: int) -> bool:
    """Whether the demo has seen the end of its run: every event has a record (each
    yields at least one, FILTERED included) and every record is terminal or deferred,
    unchanged for 2 s; or nothing moved for 30 s (retries back off). Records alone
    are not enough: the OTPs' records can all be terminal before the first campaign
    event has been expanded."""
    total, done, deferred, seen = counts
    return still >= 60 or (seen >= events and total == done + deferred and still >= 4)


#: a record whose every provider call (a push's: each device's, delivery id ``<record's>.<device>``)
#: was answered ACCEPTED: no timeout (a hanging call's record can still turn DELIVERED by its
#: receipt, with no retry and no reconciliation), no 429, no error
_ANSWERED_FIRST = (
    f"NOT EXISTS (SELECT 1 FROM attempts a WHERE {of_record('a.delivery_id', 'r.delivery_id')}"
    " AND a.result != 'ACCEPTED')"
)


def _summary(db: Path, prefix: str) -> str:
    """This run's records by state and reason, and per priority the latency from
    acceptance to the first terminal state (ACCEPTED or DELIVERED)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    mine = "biz_key >= ? AND biz_key < ?"
    rng = (prefix, prefix + "\uffff")
    lines = [f"{'state':12} {'reason':26} {'count':>8}"]
    for state, reason, n in con.execute(
        f"SELECT status, coalesce(reason, ''), count(*) FROM notify_record WHERE {mine} GROUP BY 1, 2 ORDER BY 3 DESC",
        rng,
    ):
        note = "   (deferred: due later, not terminal)" if state in DEFERRED else ""
        lines.append(f"{state:12} {reason:26} {n:>8}{note}")
    lines.append("")
    lines.append(f"{'priority':10} {'n':>7} {'p50 ms':>9} {'p99 ms':>9} {'first try p99':>14}"
                 "   acceptance → ACCEPTED/DELIVERED")
    for prio in ("high", "normal", "low"):
        rows = con.execute(
            f"SELECT latency_ms, retry_count <= 1 AND coalesce(reason, '') != 'reconciled' AND {_ANSWERED_FIRST} "
            f"FROM notify_record r WHERE {mine} AND priority = ? AND status IN ('ACCEPTED','DELIVERED') "
            "AND latency_ms IS NOT NULL",
            (*rng, prio)).fetchall()
        lat = sorted(r[0] for r in rows)
        first = sorted(r[0] for r in rows if r[1])
        if lat:
            lines.append(f"{prio:10} {len(lat):>7} {_pct(lat, 0.5):>9.1f} {_pct(lat, 0.99):>9.1f} "
                         f"{_pct(first, 0.99) if first else float('nan'):>14.1f}")
    lines.append("first try: the records whose every call was answered ACCEPTED at once (the simulators'\n"
                 "scenario numbers hang to the 1.5 s deadline, answer 429 or fail on purpose: in p99 only)")
    con.close()
    return "\n".join(lines)


def _pct(sorted_values: list, q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def wait_ready(url: str, timeout: float = 60.0) -> None:
    """Until both consumer groups of the default layout hold their slots (workers up)."""
    from pipeline.roles import GROUPS

    keys, r = broker_keys(url), redis_client(url)
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            if all(r.exists(keys.lease(g, 0)) for g in GROUPS):
                return
            time.sleep(0.2)
    finally:
        r.close()


def wait_applied(url: str, topics: tuple[str, ...], timeout: float = 60.0) -> float:
    """Until both consumer groups of the default layout have committed everything
    written to ``topics`` (the users' updates: each role keeps its own copy); the
    seconds it took. The demo's users are set up before its events, as a
    deployment's are: a burst of 2,000 sign-ups in the same second as 1,500 OTPs
    would time the guard's read barrier on the updates (agents/applied.py), which
    holds an OTP for its user's pending update, not the notifications."""
    from pipeline.roles import GROUPS
    from pipeline.transport.committed import read_all_sync

    keys, r = broker_keys(url), redis_client(url)
    t0 = time.time()
    try:
        while time.time() < t0 + timeout:
            ends = {}
            for topic in topics:
                n = int(r.hget(keys.topics, topic) or 0)
                for p in range(n):
                    ends[f"{topic}|{p}".encode()] = int(r.get(keys.counter(topic, p)) or 0)
            if all(all(int(read.get(f, 0) or 0) >= end for f, end in ends.items())
                   for read in (read_all_sync(r, keys, g) for g in GROUPS)):
                return time.time() - t0
            time.sleep(0.1)
        return time.time() - t0
    finally:
        r.close()


def run_demo(events: int, users: int = 2000, seed: int = 7) -> int:
    import asyncio

    import orjson

    from pipeline.procs import stop_process
    from pipeline.topics import event_key, event_topic

    settings = current_settings()
    rng = random.Random(seed)
    run = None
    try:
        try:
            url = broker_url(settings)
        except NoBroker:
            # no pipeline running: start `notify run` as a user would (its default layout:
            # the priority process, a main worker per core, a process per simulators' family), no API
            # its log (the simulators' failure scenarios dead-letter a few deliveries on
            # purpose, and say so) goes to a file, not between the progress lines
            flag = Path(settings.data_dir) / "broker.url"
            run_log = Path(settings.data_dir) / "demo-run.log"
            run_log.parent.mkdir(parents=True, exist_ok=True)
            with open(run_log, "w") as out:
                run = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", "--api-port", "0",
                                        "--metrics-port", "0"], stdout=out, stderr=subprocess.STDOUT)
            print(f"started notify run (its log: {run_log})", flush=True)
            deadline = time.time() + 60
            while not flag.exists():
                if run.poll() is not None or time.time() > deadline:
                    tail = run_log.read_text(errors="replace").strip().splitlines()[-10:]
                    raise CLIError("notify run did not start:\n" + "\n".join(tail)) from None
                time.sleep(0.1)
            url = flag.read_text().strip()
            wait_ready(url)
        prefs, devices = demo_users(users, rng)
        asyncio.run(send_raw(url, "notify.preferences", [(p["user_id"].encode(), orjson.dumps(p)) for p in prefs]))
        asyncio.run(send_raw(url, "notify.devices", [(d["user_id"].encode(), orjson.dumps(d)) for d in devices]))
        took = wait_applied(url, ("notify.preferences", "notify.devices"))
        print(f"{len(prefs)} users and {len(devices)} devices applied in {took:.1f}s; now {events} events", flush=True)
        run_id = f"{int(time.time() * 1000):x}"
        prefix = f"demo:{run_id}:"
        evs = demo_events(events, users, rng, run_id)
        t0 = time.time()
        by_topic: dict[str, list] = {}
        for e in evs:  # where the API writes them: OTPs and security alerts on notify.events.high
            by_topic.setdefault(event_topic(settings, e["category"]), []).append(
                (event_key(e["biz_key"], e.get("recipients")), orjson.dumps(e)))
        for topic, items in sorted(by_topic.items(), reverse=True):  # the high topic first
            asyncio.run(send_raw(url, topic, items))
        db = Path(settings.db_path)
        tty = sys.stdout.isatty()
        last, still = (-1, -1, -1, -1), 0
        next_line = t0  # not a terminal: a line at once, then every 10 s, moved or not
        while not finished(last, len(evs), still):
            now = _counts(db, prefix)
            total, done, deferred, seen = now
            bar = "#" * int(30 * done / max(total, 1))
            line = (f"{done}/{total} records terminal, {deferred} deferred, "
                    f"{seen}/{len(evs)} events, {time.time() - t0:5.1f}s")
            if seen >= len(evs) and still >= 4 and total > done + deferred:
                # the stragglers: what they wait for, rather than a count that does not move
                line += "; " + describe_in_flight(_in_flight(db, prefix), time.time())
            if tty:
                print(f"\r[{bar:30}] {line}", end="", flush=True)
            elif time.time() >= next_line:
                print(line, flush=True)
                next_line += 10
            still = still + 1 if now == last and total else 0
            last = now
            time.sleep(0.5)
        if tty:
            print()
        print(_summary(db, prefix))
        if last[3] < len(evs):
            print(f"\n{len(evs) - last[3]} of {len(evs)} events have no record yet: nothing moved for 30 s")
        left = describe_in_flight(_in_flight(db, prefix), time.time())
        if left:
            print(f"\nnothing moved for 30 s; {left}. `notify records show <business key>` follows one")
        return 0
    finally:
        if run is not None:
            stop_process(run, 60)
