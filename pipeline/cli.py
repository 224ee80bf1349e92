"""``notify``: the command line.

    notify run [--workers N]     embedded server (unless REDIS_URL) + worker(s)
    notify worker [--role R]     one worker against REDIS_URL / the running embedded server
    notify send ... [--wait]     one event from flags or --json (checked as the API checks it)
    notify user set ID ...       a user's phone, e-mail, zone, quiet hours, devices
    notify outcomes tail         print the outcome stream (--from, --group: resumable)
    notify dlq ls                list dead letters
    notify records show BIZ_KEY  the records of a business key
    notify records replay        write the records again from the outcome stream
    notify status                lag per topic, leases, DLQ depth

Errors are one clear line on stderr and a non-zero exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

__all__ = ["main"]


class CLIError(Exception):
    pass


def _settings():
    from config.settings import load_settings

    return load_settings()


def _broker_file(settings) -> Path:
    return Path(settings.data_dir) / "broker.url"


def broker_url(settings=None) -> str:
    settings = settings or _settings()
    if os.environ.get("NOTIFY_BROKER"):
        return os.environ["NOTIFY_BROKER"]
    if settings.redis_url:
        return settings.redis_url
    f = _broker_file(settings)
    if f.exists():
        return f.read_text().strip()
    raise CLIError("no broker: set REDIS_URL, or start `notify run` first (it writes data/broker.url)")


def _redis(url: str):
    import redis

    return redis.Redis.from_url(url.split("?")[0])


# -- run / worker -----------------------------------------------------------


def cmd_run(args) -> int:
    settings = _settings()
    server = None
    if settings.redis_url:
        url = settings.redis_url
    else:
        from pipeline.embedded import EmbeddedRedis

        server = EmbeddedRedis(Path(settings.data_dir) / "redis", port=args.port).start()
        url = server.url
        _broker_file(settings).parent.mkdir(parents=True, exist_ok=True)
        _broker_file(settings).write_text(url)
        print(f"embedded server {url} (AOF everysec in {server.data_dir})", flush=True)
    env = dict(os.environ, NOTIFY_BROKER=url)
    if args.providers == "simulators":
        # the simulators sign their receipts with secrets the API's receipts endpoint knows
        import secrets

        env.setdefault("NOTIFY_TWILIO_AUTH_TOKEN", secrets.token_hex(16))
        env.setdefault("NOTIFY_VENDOR_SECRET", secrets.token_hex(16))
        env["NOTIFY_PROVIDERS"] = "simulators"
        if args.api_port:
            env.setdefault("NOTIFY_RECEIPTS_URL", f"http://127.0.0.1:{args.api_port}/v1/receipts")
    from pipeline import layout
    from pipeline.supervise import Child, Supervisor, redis_reporter
    from pipeline.transport.keys import Keys

    workers = args.workers or layout.default_workers()
    info = str(Path(settings.data_dir).resolve() / "simulators.json") \
        if args.providers == "simulators" and not args.simulators_in_worker else None
    procs = layout.plan(env, workers=workers, priority_process=args.priority_process, api_port=args.api_port,
                        metrics_port=args.metrics_port, loglevel=args.loglevel, simulators_info=info)
    print("processes (restarted when they exit):\n" + layout.describe(procs), flush=True)
    children = []
    if server is not None:
        children.append(Child("broker", lambda: server.start().proc, proc=server.proc, started_at=time.time()))
    workers_of = tuple(p.name for p in procs if "worker" in p.argv)
    children += [Child(p.name, _spawn(p.argv, p.env, p.waits_for),
                       restart_with=workers_of if p.name == "simulators" else ()) for p in procs]
    sup = Supervisor(children, report=redis_reporter(url, Keys().supervisor))
    stop = {"now": False}

    def _stop(*_: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        sup.start()
        if args.api_port:
            print(f"API and status page on http://127.0.0.1:{args.api_port}/ "
                  f"(keys: NOTIFY_API_KEY or `notify keys add`)", flush=True)
        print("running; stop with Ctrl-C or SIGTERM", flush=True)
        while not stop["now"]:
            sup.tick()
            time.sleep(0.2)
        return 0
    finally:
        # the workers and the API first, so they release their leases while the broker answers
        sup.stop(until=lambda c: c.name == "broker")


def _spawn(argv: Any, env: dict, waits_for: Optional[str] = None, timeout: float = 30.0) -> Any:
    """A factory of ``python -m <argv>`` processes with ``env``; with ``waits_for``,
    each start removes that file and returns once the process wrote it again."""
    def start() -> subprocess.Popen:
        if waits_for:
            Path(waits_for).unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-m", *argv], env=env, stdout=subprocess.DEVNULL if waits_for else None)
        deadline = time.monotonic() + timeout
        while waits_for and not Path(waits_for).exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{argv[0]} did not start (exit {proc.poll()})")
            time.sleep(0.05)
        return proc
    return start


def cmd_worker(args) -> int:
    if getattr(args, "role", None):
        os.environ["NOTIFY_ROLE"] = args.role  # read when pipeline.app is imported below
    settings = _settings()
    os.environ.setdefault("NOTIFY_BROKER", broker_url(settings))
    os.makedirs(os.path.join(settings.data_dir, "worker"), exist_ok=True)
    if os.environ.get("NOTIFY_METRICS_PORT"):
        from prometheus_client import start_http_server

        start_http_server(int(os.environ["NOTIFY_METRICS_PORT"]), addr="127.0.0.1")
    import faust

    from pipeline.lean import tune_gc, use_fast_loop

    use_fast_loop()  # before anything creates the loop
    import agents
    from pipeline import roles

    roles.lower_priority()  # a main worker yields the core to the priority worker (pipeline/roles.py)
    tune_gc()
    worker = faust.Worker(agents.app, loglevel=args.loglevel, quiet=True)
    worker.execute_from_commandline()
    return 0


# -- producing ---------------------------------------------------------------


def _parse_params(items: list[str]) -> dict:
    out = {}
    for it in items or []:
        if "=" not in it:
            raise CLIError(f"--param wants key=value, got {it!r}")
        k, v = it.split("=", 1)
        out[k] = v
    return out


async def _send_raw(url: str, topic: str, items: list[tuple[bytes, bytes]]) -> list:
    """Write (key, value) pairs to a topic with the transport's producer; their metadata
    (partition, offset) in order."""
    import faust

    settings = _settings()
    app = faust.App(f"notify-cli-{os.getpid()}", broker=url, topic_partitions=settings.partitions, web_enabled=False)
    await app.producer.start()
    try:
        futs = [await app.producer.send(topic, k, v, None, None, None) for k, v in items]
        return list(await asyncio.gather(*futs))
    finally:
        await app.producer.stop()
        await app.transport.close()


async def _send_events(url: str, events: list[dict]) -> None:
    import orjson

    from pipeline.topics import event_key, event_topic

    settings = _settings()
    by_topic: dict[str, list] = {}
    for e in events:
        topic = event_topic(settings, e.get("category"), e.get("priority"))
        by_topic.setdefault(topic, []).append((event_key(e["biz_key"], e.get("recipients")), orjson.dumps(e)))
    for topic, items in by_topic.items():
        await _send_raw(url, topic, items)


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args.events, users=args.users)


def cmd_send(args) -> int:
    """One event, checked as the API checks it (unknown category, template or channel,
    missing fields: a one-line error and exit 2); with ``--wait`` the final state of
    each of its notifications is printed when it is known."""
    from pipeline.rules.validate import InvalidEvent, check_params, parse_event
    from pipeline.templates import Renderer

    if args.json:
        try:
            event = json.loads(Path(args.json[1:]).read_text() if args.json.startswith("@") else args.json)
        except (OSError, ValueError) as exc:
            raise CLIError(f"--json is not a JSON event: {exc}") from None
        if not isinstance(event, dict):
            raise CLIError("--json must be a JSON object")
        event.setdefault("biz_key", f"cli:{time.time_ns()}")
    else:
        if not (args.category and args.template and args.to):
            raise CLIError("send needs --json, or --category, --template and --to")
        event = {
            "biz_key": args.biz_key or f"cli:{time.time_ns()}",
            "category": args.category,
            "template": args.template,
            "recipients": args.to,
            "params": _parse_params(args.param),
        }
        if args.channel:
            event["channels"] = args.channel
        if args.locale:
            event["locale"] = args.locale
    event.setdefault("accepted_at", time.time())
    settings = _settings()
    try:
        renderer = Renderer.from_settings(settings)
        check_params(parse_event(json.dumps(event).encode(), settings, renderer), renderer)
    except InvalidEvent as exc:
        raise CLIError(f"invalid event: {exc.reason}: {exc}") from None
    asyncio.run(_send_events(broker_url(settings), [event]))
    print(json.dumps({"accepted": event["biz_key"]}), flush=True)
    if args.wait:
        return _wait_final(settings, event["biz_key"], args.wait)
    return 0


#: how long ``--wait`` waits for the receipt of an ACCEPTED notification (a provider
#: without receipts, or a deployment whose API the provider cannot reach, sends none)
RECEIPT_WAIT_S = 5.0

#: states after which a notification's record does not move without a receipt
_SETTLED = ("DELIVERED", "UNDELIVERED", "FAILED", "FILTERED", "REVIEW", "SCHEDULED")


def _wait_final(settings, biz_key: str, timeout: float) -> int:
    """Print each record of ``biz_key`` once settled (ACCEPTED waits for its receipt
    until ``timeout``): "u1 sms DELIVERED via twilio in 420 ms"."""
    from pipeline.store import RecordStore

    async def rows() -> list:
        if not Path(settings.db_path).exists():
            return []
        store = RecordStore(settings.db_path)
        await store.open()
        try:
            return (await store.find(biz_key=biz_key, limit=1000))[0]
        finally:
            await store.close()

    deadline, got = time.time() + timeout, []
    receipt_by = None  # once every record is terminal: how long an ACCEPTED one waits for its receipt
    while time.time() < deadline:
        got = asyncio.run(rows())
        if got and all(r["status"] in _SETTLED for r in got):
            break
        if got and receipt_by is None and all(r["status"] in (*_SETTLED, "ACCEPTED") for r in got):
            receipt_by = time.time() + RECEIPT_WAIT_S
        if receipt_by is not None and time.time() >= receipt_by:
            break
        time.sleep(0.3)
    if not got:
        raise CLIError(f"no record of {biz_key!r} within {timeout:g}s (is `notify run` running?)")
    for r in sorted(got, key=lambda r: (r["user_id"], r["channel"])):
        via = f" via {r['provider']}" if r.get("provider") else ""
        why = f" ({r['reason']})" if r.get("reason") else ""
        took = f" in {r['latency_ms']:.0f} ms" if r.get("latency_ms") is not None else ""
        print(f"{r['user_id']} {r['channel']} {r['status']}{why}{via}{took}")
    return 0 if all(r["status"] not in ("FAILED", "UNDELIVERED") for r in got) else 1


def _wait_applied(url: str, written: list, timeout: float = 15.0) -> None:
    """Until every running consumer group (the main and the priority role each keep a
    copy of users' data) has committed past the entries ``written``, so the next
    `notify send` finds the user as set; at most ``timeout`` seconds."""
    from pipeline.roles import GROUPS
    from pipeline.transport.keys import Keys

    keys, r = Keys(), _redis(url)
    groups = [g for g in GROUPS if r.exists(keys.lease(g, 0))]
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(int(r.hget(keys.offsets(g), keys.tp_field(m.topic, m.partition)) or 0) > m.offset
               for g in groups for m in written):
            return
        time.sleep(0.1)


def cmd_user(args) -> int:
    """``notify user set ID --phone … --email … --tz … --quiet-hours … --device apns:TOKEN``:
    a user's contact data and push devices, checked as the API checks them."""
    import orjson

    from pipeline.rules.validate import InvalidEvent, parse_device_update, parse_preferences

    settings = _settings()
    prefs = {"user_id": args.id, "version": int(time.time() * 1000)}
    for field in ("phone", "email", "tz", "quiet_hours", "webhook_url"):
        if getattr(args, field, None):
            prefs[field] = getattr(args, field)
    devices = []
    for dev in args.device or []:
        platform, _, token = dev.partition(":")
        devices.append({"user_id": args.id, "platform": platform, "token": token, "op": "add", "at": time.time()})
    try:
        parse_preferences(prefs, settings)
        for d in devices:
            parse_device_update(d)
    except InvalidEvent as exc:
        raise CLIError(f"invalid user data: {exc.reason}: {exc}") from None
    url = broker_url(settings)
    written = asyncio.run(_send_raw(url, "notify.preferences", [(args.id.encode(), orjson.dumps(prefs))]))
    if devices:
        written += asyncio.run(_send_raw(url, "notify.devices",
                                         [(args.id.encode(), orjson.dumps(d)) for d in devices]))
    _wait_applied(url, written)
    print(json.dumps({"user": args.id, "preferences": sorted(k for k in prefs if k not in ("user_id", "version")),
                      "devices": len(devices)}))
    return 0


# -- reading -----------------------------------------------------------------


def _read_topic(url: str, topic: str, partitions: int, follow: bool, limit: Optional[int]):
    """The values of ``topic`` from its oldest kept entry (pipeline/reader.py)."""
    from pipeline.reader import TopicReader

    for shown, (_p, _off, value) in enumerate(TopicReader(_redis(url), topic, partitions).read(follow), 1):
        yield value
        if limit and shown >= limit:
            return


def cmd_outcomes(args) -> int:
    """``notify outcomes tail [-f] [-n N] [--from start|end|TIME] [--group NAME [--member i/n]]``:
    every state change as analysts read it, one JSON object a line; with ``--group`` the
    reader resumes where the group stopped (committed every 500 lines and at the end:
    a reader killed in between sees up to 500 lines again)."""
    from pipeline.reader import TopicReader, parse_start
    from pipeline.topics import OUTCOMES

    settings = _settings()
    try:
        start = parse_start(args.start)
        i, _, n = (args.member or "0/1").partition("/")
        member = (int(i), int(n))
        if not 0 <= member[0] < member[1]:
            raise ValueError
    except ValueError as exc:
        raise CLIError(str(exc) if str(exc) else "--member must be i/n with 0 <= i < n") from None
    reader = TopicReader(_redis(broker_url(settings)), OUTCOMES, settings.partitions, start=start, group=args.group,
                         member=member)
    shown = 0
    try:
        for _p, _off, v in reader.read(args.follow):
            print(v.decode() if v else "null", flush=True)
            shown += 1
            if shown % 500 == 0:
                reader.commit()
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

    settings = _settings()
    url = broker_url(settings)
    letters = list(_read_topic(url, DLQ, settings.partitions, False, args.limit))
    if args.action == "ls":
        for v in letters:
            print(v.decode("utf-8", "replace") if v else "null")
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
        asyncio.run(_send_raw(url, topic, items))
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

    settings = _settings()
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
    from pipeline.rules.records import parse_outcome
    from pipeline.rules.validate import InvalidEvent
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
            for v in _read_topic(broker_url(settings), OUTCOMES, settings.partitions, False, None):
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


def cmd_status(args) -> int:
    from pipeline.topics import ALL, UNREAD
    from pipeline.transport.keys import Keys

    settings = _settings()
    url = broker_url(settings)
    r = _redis(url)
    keys = Keys()
    committed = {k.decode(): int(v) for k, v in r.hgetall(keys.offsets("notify")).items() if not k.endswith(b"@")}
    print(f"broker {url}")
    print(f"{'topic':34} {'highwater':>10} {'committed':>10} {'lag':>8}")
    for topic in ALL:
        hw = cm = 0
        for p in range(settings.partitions):
            hw += int(r.get(keys.counter(topic, p)) or 0)
            cm += committed.get(keys.tp_field(topic, p), 0)
        if topic in UNREAD:  # no agent reads it: a depth, no lag
            print(f"{topic:34} {hw:>10} {'-':>10} {'-':>8}")
            continue
        print(f"{topic:34} {hw:>10} {cm:>10} {hw - cm:>8}")
    leases = {k.decode().rsplit(":", 1)[1]: r.get(k).decode() for k in r.scan_iter(keys.lease("notify", 0)[:-1] + "*")}
    print("slots:", ", ".join(f"{s}→{o}" for s, o in sorted(leases.items())) or "none held")
    from pipeline.transport.membership import format_group, read_group_sync

    group = read_group_sync(r, keys, "notify")
    if group.gen:
        print(format_group(group, now_ms=int(r.time()[0] * 1000)))
    print_processes(r.hgetall(keys.supervisor))
    print_breakers(r.hgetall(keys.breakers))
    return 0


def print_breakers(raw: dict) -> None:
    """Every worker's circuit breakers (pipeline/breakers.py), one line each."""
    from pipeline.breakers import read_breakers

    boards = read_breakers(raw)
    if not boards:
        return
    print(f"{'provider':12} {'worker':28} {'breaker':>10} {'since':>20}")
    for provider, workers in sorted(boards.items()):
        for worker, b in sorted(workers.items()):
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(b.get("since", 0)))
            print(f"{provider:12} {worker:28} {b.get('state', '?'):>10} {since:>20}")


def print_processes(raw: dict) -> None:
    """The processes `notify run` supervises (pipeline/supervise.py), one line each."""
    from pipeline.supervise import read_states

    states = read_states(raw)
    if not states:
        return
    print(f"{'process':28} {'state':>8} {'pid':>8} {'restarts':>8} {'last exit':>9}")
    for name, st in sorted(states.items()):
        state = "LOOPING" if st.get("crash_loop") else ("up" if st.get("up") else "down")
        print(f"{name:28} {state:>8} {st.get('pid') or '-':>8} {st.get('restarts', 0):>8} "
              f"{'-' if st.get('last_exit') is None else st['last_exit']:>9}")


def cmd_api(args) -> int:
    """``notify api`` serves the HTTP API (pipeline/api); ``notify keys add|ls|rm``
    manages its API keys (the key itself is printed once, only its hash is kept)."""
    from pipeline.api import auth, serve
    settings = _settings()
    keys_path = args.keys or os.path.join(settings.data_dir, "api_keys.json")
    try:
        if args.cmd == "api":
            from pipeline.lean import use_fast_loop

            use_fast_loop()  # the server's loop; `keys` needs none
            serve(host=args.host, port=args.port, settings=settings, broker_url=broker_url(settings),
                  keys_path=keys_path)
        elif args.action == "add":
            if not args.name:
                raise CLIError("keys add needs a producer name")
            kid, key = auth.add_key(keys_path, args.name, args.scopes.replace(" ", ",").split(","))
            print(json.dumps({"key_id": kid, "producer": args.name, "key": key, "file": keys_path}))
            print("store the key now: it is not shown again", file=sys.stderr)
        elif args.action == "ls":
            for k in auth.list_keys(keys_path):
                print(json.dumps(k))
        elif not (args.name and auth.revoke_key(keys_path, args.name)):
            raise CLIError(f"no key {args.name!r} in {keys_path}")
    except auth.KeyFileError as exc:
        raise CLIError(str(exc)) from None
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="notify", description="notify-stream: notifications as a stream pipeline")
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="embedded server (unless REDIS_URL) and workers")
    run.add_argument("--workers", type=int, default=0,
                     help="main workers (default: one per core), beside the high-priority process")
    run.add_argument("--no-priority-process", dest="priority_process", action="store_false",
                     help="no process of its own for the OTP / security path: N workers of role 'all'")
    run.add_argument("--simulators-in-worker", action="store_true",
                     help="the simulators inside each worker process (as before), not in a process of their own")
    run.add_argument("--port", type=int, default=None, help="embedded server port (default: a free one)")
    run.add_argument("--api-port", type=int, default=8080, help="HTTP API port (0 = no API)")
    run.add_argument("--providers", choices=["simulators", "fake"], default="simulators",
                     help="provider simulators on 127.0.0.1 (default) or in-process fakes")
    run.add_argument("--metrics-port", type=int, default=9100, help="first worker's /metrics port (0 = none)")
    run.add_argument("-l", "--loglevel", default="warn")
    run.set_defaults(fn=cmd_run)
    w = sub.add_parser("worker", help="one worker")
    w.add_argument("-l", "--loglevel", default="warn")
    w.add_argument("--role", choices=["all", "main", "priority"],
                   help="agents to run (NOTIFY_ROLE; default all): 'priority' runs the high-priority path in a "
                        "process of its own, beside 'main' workers (pipeline/roles.py)")
    w.set_defaults(fn=cmd_worker)
    s = sub.add_parser("send", help="send one event")
    s.add_argument("--json", help="the event as JSON, or @file")
    s.add_argument("--category")
    s.add_argument("--template")
    s.add_argument("--to", action="append", help="recipient user id (repeatable)")
    s.add_argument("--param", action="append", help="key=value (repeatable)")
    s.add_argument("--channel", action="append")
    s.add_argument("--locale")
    s.add_argument("--biz-key", dest="biz_key")
    s.add_argument("--wait", type=float, nargs="?", const=30.0, default=None, metavar="SECONDS",
                   help="print each notification's final state (default: wait up to 30 s)")
    s.set_defaults(fn=cmd_send)
    u = sub.add_parser("user", help="a user's contact data and devices: user set ID --phone … --device apns:TOKEN")
    u.add_argument("action", choices=["set"])
    u.add_argument("id")
    u.add_argument("--phone")
    u.add_argument("--email")
    u.add_argument("--tz", help="IANA time zone, e.g. Europe/Paris")
    u.add_argument("--quiet-hours", dest="quiet_hours", help="HH:MM-HH:MM in the user's zone")
    u.add_argument("--webhook-url", dest="webhook_url")
    u.add_argument("--device", action="append", help="platform:token (apns or fcm; repeatable)")
    u.set_defaults(fn=cmd_user)
    o = sub.add_parser("outcomes", help="the outcome stream")
    o.add_argument("action", choices=["tail"])
    o.add_argument("-f", "--follow", action="store_true")
    o.add_argument("-n", "--limit", type=int, default=None)
    o.add_argument("--from", dest="start", default="start",
                   help="start (default), end (only what comes next), Unix seconds or an ISO 8601 time")
    o.add_argument("--group", help="a named reader: resume where it stopped (its position is kept in the broker)")
    o.add_argument("--member", help="i/n: reader i of n sharing the group's partitions")
    o.set_defaults(fn=cmd_outcomes)
    d = sub.add_parser("dlq", help="dead letters")
    d.add_argument("action", choices=["ls", "replay"])
    d.add_argument("--source", choices=["expand", "lane"], help="replay only this source")
    d.add_argument("-n", "--limit", type=int, default=100)
    d.set_defaults(fn=cmd_dlq)
    rec = sub.add_parser("records", help="the record store")
    rec.add_argument("action", choices=["show", "replay"])
    rec.add_argument("biz_key", nargs="?")
    rec.set_defaults(fn=cmd_records)
    dm = sub.add_parser("demo", help="mixed load against the simulators, then a summary")
    dm.add_argument("--events", type=int, default=2000)
    dm.add_argument("--users", type=int, default=2000)
    dm.set_defaults(fn=cmd_demo)
    st = sub.add_parser("status", help="lag, slots")
    st.set_defaults(fn=cmd_status)
    api = sub.add_parser("api", help="the HTTP API, /metrics and the status page")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=8080)
    api.add_argument("--keys", help="API key file (default <data_dir>/api_keys.json)")
    api.set_defaults(fn=cmd_api)
    ks = sub.add_parser("keys", help="API keys: add <producer> --scopes a,b | ls | rm <key_id>")
    ks.add_argument("action", choices=["add", "ls", "rm"])
    ks.add_argument("name", nargs="?", help="producer (add) or key id (rm)")
    ks.add_argument("--scopes", default="", help="comma-separated: events:write,records:read,users:write")
    ks.add_argument("--keys", help="API key file (default <data_dir>/api_keys.json)")
    ks.set_defaults(fn=cmd_api)
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    from pipeline import redact

    redact.install()  # recipients are masked in every log line of every command
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except CLIError as exc:
        print(f"notify: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # one clear line, never a traceback for expected failures
        from config.settings import ConfigError

        if isinstance(exc, (ConfigError, ConnectionError, OSError)):
            print(f"notify: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
