"""Reading and repairing: ``notify outcomes tail``, ``notify dlq ls|replay``,
``notify records show|replay``, ``notify slo`` and ``notify callbacks ls|replay``."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Optional

from .broker import CLIError, broker_keys, broker_url, current_settings, redis_client
from .send import send_raw
from .text import printable

__all__ = ["cmd_outcomes", "cmd_dlq", "cmd_records", "cmd_slo", "cmd_stats", "cmd_callbacks", "read_topic"]


def read_topic(url: str, topic: str, partitions: int, follow: bool, limit: Optional[int]):
    """The values of ``topic`` from its oldest kept entry (pipeline/reader.py)."""
    from pipeline.reader import TopicReader

    reader = TopicReader(redis_client(url), topic, partitions, keys=broker_keys(url))
    for shown, (_p, _off, value) in enumerate(reader.read(follow), 1):
        yield value
        if limit and shown >= limit:
            return


def cmd_outcomes(args) -> int:
    """``notify outcomes tail [-f] [-n N] [--from start|end|TIME] [--group NAME [--member i/n]]``:
    every state change as analysts read it, one JSON object a line; with ``--group`` the
    reader resumes where the group stopped (committed every 500 lines and at the end:
    a reader killed in between sees up to 500 lines again)."""
    from pipeline.reader import TopicReader, outcome_values, parse_start
    from pipeline.topics import OUTCOMES

    settings = current_settings()
    try:
        start = parse_start(args.start)
        i, _, n = (args.member or "0/1").partition("/")
        member = (int(i), int(n))
        if not 0 <= member[0] < member[1]:
            raise ValueError
    except ValueError as exc:
        raise CLIError(str(exc) if str(exc) else "--member must be i/n with 0 <= i < n") from None
    url = broker_url(settings)
    reader = TopicReader(redis_client(url), OUTCOMES, settings.partitions, start=start, group=args.group,
                         member=member, keys=broker_keys(url))
    shown = 0
    try:
        for p, off, entry in reader.read(args.follow):
            values = outcome_values(entry)  # an entry may hold several (docs/SCHEMA.md)
            if args.limit and shown + len(values) > args.limit:
                values = values[:args.limit - shown]
                reader.pos[p] = off  # stopped inside the entry: a group resumes at it
            for v in values:
                print(printable(v), flush=True)
            if shown // 500 != (shown + len(values)) // 500:
                reader.commit()
            shown += len(values)
            if args.limit and shown >= args.limit:
                break
    finally:
        reader.commit()
    return 0


def cmd_dlq(args) -> int:
    """``ls`` prints dead letters; ``replay`` sends bad input (source expand) back to
    notify.events and failed deliveries (source lane) back to their lane as the next
    replay round of the same delivery (a new attempt, numbered after the calls already
    made; the lane runs it once). What is not replayed is listed with why: a delivery
    whose record has since moved on, or a letter of another kind."""
    import orjson

    from pipeline.topics import DLQ, EVENTS, lane

    settings = current_settings()
    url = broker_url(settings)
    letters = list(read_topic(url, DLQ, settings.partitions, False, args.limit))
    if args.action == "ls":
        from pipeline.redact import mask_letter_text

        for v in letters:  # addresses masked, a replayable payload's too (it stays whole in the stream)
            print(printable(mask_letter_text(v).encode()))
        return 0
    wanted = []
    for v in letters:
        try:
            dl = orjson.loads(v)
            if dl.get("source") == "lane":
                wanted.append(orjson.loads(dl["payload"])["delivery_id"])
        except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError):
            continue
    states = _record_states(settings, wanted)
    by_topic: dict[str, list] = {}
    refused: dict[str, int] = {}
    for v in letters:
        try:
            dl = orjson.loads(v)
            source = dl["source"]
        except (orjson.JSONDecodeError, TypeError, KeyError):
            refused["not a dead letter"] = refused.get("not a dead letter", 0) + 1
            continue
        if args.source and source != args.source:
            continue
        if source == "expand":
            by_topic.setdefault(EVENTS, []).append((b"replay", dl["payload"].encode()))
        elif source == "lane":
            d = orjson.loads(dl["payload"])
            status, calls = states.get(d["delivery_id"], (None, None))
            if status in ("ACCEPTED", "DELIVERED"):
                why = f"{d['delivery_id']}: already {status}"
                refused[why] = refused.get(why, 0) + 1
                continue
            d.update(attempt=max(int(d.get("attempt") or 0), calls or 0), replay=int(d.get("replay") or 0) + 1,
                     unknown_provider=None, reconcile_round=0, due_at=None)
            by_topic.setdefault(lane(d["channel"], d["priority"]), []).append((d["user_id"].encode(), orjson.dumps(d)))
        else:
            why = f"source {source} ({dl.get('reason')}): not replayable"
            refused[why] = refused.get(why, 0) + 1
    for topic, items in by_topic.items():
        asyncio.run(send_raw(url, topic, items))
    print(json.dumps({"replayed": {t: len(i) for t, i in by_topic.items()}, "not_replayed": refused}))
    return 0


def _record_states(settings, delivery_ids: list) -> dict[str, tuple[str, int]]:
    """delivery_id → (status, provider calls made) from the record store (empty without one)."""
    import sqlite3

    if not delivery_ids or not Path(settings.db_path).exists():
        return {}
    con = sqlite3.connect(f"file:{settings.db_path}?mode=ro", uri=True, timeout=5)
    out = {}
    try:
        for i in range(0, len(delivery_ids), 500):
            chunk = delivery_ids[i:i + 500]
            out.update({r[0]: (r[1], int(r[2] or 0)) for r in con.execute(
                f"SELECT delivery_id, status, retry_count FROM notify_record WHERE delivery_id IN "
                f"({','.join('?' * len(chunk))})", chunk)})
        return out
    except sqlite3.OperationalError:
        return out
    finally:
        con.close()


def cmd_records(args) -> int:
    from pipeline.store import RecordStore

    settings = current_settings()
    if args.action == "replay":
        return _replay_records(settings)
    if not args.biz_key:
        raise CLIError("records show needs a BIZ_KEY")
    if not Path(settings.db_path).exists():
        raise CLIError(f"no record store at {settings.db_path}")

    async def show() -> list:
        store = RecordStore(settings.db_path)
        await store.open()
        try:
            rows, _ = await store.find(biz_key=args.biz_key, limit=1000)
            for row in rows:
                row["attempts"] = await store.attempts(row["delivery_id"])
                devices = await store.deliveries(row["delivery_id"])  # a push: its delivery to each device
                if devices:
                    row["devices"] = devices
            return rows
        finally:
            await store.close()

    rows = asyncio.run(show())
    if not rows:
        raise CLIError(f"no records for biz_key {args.biz_key!r}")
    print(json.dumps(rows, indent=2, default=str))
    return 0


def _replay_records(settings) -> int:
    """Apply every outcome the stream still holds to the record store (created if
    missing): the merge is idempotent and order-free, so this rebuilds lost records
    and changes nothing already right. Entries that are not outcomes are counted
    and skipped."""
    import orjson

    from pipeline.models import Outcome
    from pipeline.rules.plan import DUPLICATE
    from pipeline.parsers.messages import parse_outcome
    from pipeline.parsers.events import InvalidEvent
    from pipeline.reader import outcome_values
    from pipeline.store import RecordStore
    from pipeline.topics import OUTCOMES

    async def replay() -> tuple[int, int]:
        Path(settings.db_path).parent.mkdir(parents=True, exist_ok=True)
        store = RecordStore(settings.db_path)
        await store.open()
        applied = skipped = 0
        batch: list[Outcome] = []

        async def apply() -> None:
            nonlocal applied, skipped
            refused = len(await store.apply_valid_outcomes(batch))
            applied += len(batch) - refused
            skipped += refused
            batch.clear()

        try:
            for v in (o for entry in read_topic(broker_url(settings), OUTCOMES, settings.partitions, False, None)
                      for o in outcome_values(entry)):
                try:
                    o = parse_outcome(orjson.loads(v or b"null"))
                except (orjson.JSONDecodeError, InvalidEvent, TypeError, ValueError):
                    skipped += 1
                    continue
                if o.reason == DUPLICATE:
                    continue
                batch.append(o)
                if len(batch) >= 2000:
                    await apply()
            if batch:
                await apply()
            return applied, skipped
        finally:
            await store.close()

    applied, skipped = asyncio.run(replay())
    print(json.dumps({"applied": applied, "skipped": skipped, "store": str(settings.db_path)}))
    return 0


def cmd_slo(args) -> int:
    """Seed 001's service level from the record store: this month (UTC) by
    default, ``--month YYYY-MM``, or ``--since``/``--until``."""
    from pipeline.rules import slo

    settings = current_settings()
    if not Path(settings.db_path).exists():
        raise CLIError(f"no record store at {settings.db_path}")
    now = time.time()
    try:
        since, until = slo.month_range(args.month, now)
        if args.since or args.until:
            since = slo.parse_time(args.since) if args.since else since
            until = slo.parse_time(args.until) if args.until else now
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if until <= since:
        raise CLIError("--until must be after --since")

    report = slo.summarize(_read_store(settings, lambda store: store.slo_events(since, until)), since, until, now)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(_slo_text(report))
    return 0


def _read_store(settings, op):
    """``op(store)`` on the record store, opened for this one read and closed."""
    from pipeline.store import RecordStore

    async def read():
        store = await RecordStore(settings.db_path).open()
        try:
            return await op(store)
        finally:
            await store.close()

    return asyncio.run(read())


def cmd_stats(args) -> int:
    """Delivery, click and read rates per template and channel from the record
    store: the last 24 h by default, or ``--since``/``--until``."""
    from pipeline.rules import slo

    settings = current_settings()
    if not Path(settings.db_path).exists():
        raise CLIError(f"no record store at {settings.db_path}")
    now = time.time()
    try:
        since = slo.parse_time(args.since) if args.since else now - 86400
        until = slo.parse_time(args.until) if args.until else now + 1
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if until <= since:
        raise CLIError("--until must be after --since")

    rows = _read_store(settings, lambda store: store.rates(since, until))
    if args.json:
        print(json.dumps({"since": since, "until": until, "rows": rows}, indent=2))
        return 0
    print(stats_text(rows, since, until))
    return 0


def stats_text(rows: list, since: float, until: float) -> str:
    def iso(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))

    def pct(x) -> str:
        return "—" if x is None else f"{100 * x:.1f}%"

    head = ("template", "channel", "sent", "delivered", "clicked", "read", "delivery", "click", "read rate")
    body = [(r["template"], r["channel"], str(r["sent"]), str(r["delivered"]), str(r["clicked"]), str(r["read"]),
             pct(r["delivery_rate"]), pct(r["click_rate"]), pct(r["read_rate"])) for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = [f"records created {iso(since)} – {iso(until)} UTC"]
    for cells in (head, *body):
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))))
    if not body:
        lines.append("(no records)")
    return "\n".join(lines)


def _slo_text(report: dict) -> str:
    def iso(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))

    def line(name: str, s: dict) -> str:
        ratio = "n/a" if s["ratio"] is None else f"{100 * s['ratio']:.3f}%"
        mark = "" if "met" not in s else ("  met" if s["met"] else "  MISSED")
        return (f"  {name:<12} {s['events']:>9} events  {ratio:>9} within {report['goal_s']:.0f} s{mark}"
                f"  p50 {s['p50_ms']} ms  p99 {s['p99_ms']} ms  open {s['open_past_goal']} late"
                f" + {s['open_in_goal']} in time")

    out = [f"SLO {iso(report['since'])} .. {iso(report['until'])} UTC: "
           f"{100 * report['target']:.1f}% of events terminal within {report['goal_s']:.0f} s of acceptance",
           line("all", report["all"])]
    out += [line(p, s) for p, s in report["priorities"].items()]
    if report["deferred"]:
        out.append("  deferred on purpose (quiet hours, send_at; not held to the goal):")
        out += [line(c, s) for c, s in report["deferred"].items()]
    return "\n".join(out)



def cmd_callbacks(args) -> int:
    """``ls``: the status callbacks waiting (soonest first: pending, retrying, in
    flight) or, with ``--failed``, given up (newest first), one JSON line each;
    ``replay``: given-up ones due again now with a fresh retry horizon (and, with
    ``--pending``, the retrying ones now). pipeline/callback_queue.py."""
    from pipeline import callback_queue

    url = broker_url()
    client = redis_client(url)
    try:
        if args.action == "ls":
            for row in callback_queue.list_callbacks(client, broker_keys(url).ns, failed=args.failed, limit=args.limit):
                print(printable(json.dumps(row, ensure_ascii=False).encode()))
        else:
            failed, pending = callback_queue.replay(client, broker_keys(url).ns, args.ids, pending=args.pending)
            print(json.dumps({"replayed": failed, "due_now": pending}))
    finally:
        client.close()
    return 0
