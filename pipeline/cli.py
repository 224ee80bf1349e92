"""``notify``: the command line.

    notify run [--workers N]     embedded server (unless REDIS_URL) + worker(s)
    notify worker [--role R]     one worker against REDIS_URL / the running embedded server
    notify send ... [--wait]     one event from flags or --json (checked as the API checks it)
    notify user set ID ...       a user's phone, e-mail, zone, quiet hours, devices
    notify outcomes tail         print the outcome stream (--from, --group: resumable)
    notify dlq ls                list dead letters
    notify records show BIZ_KEY  the records of a business key
    notify records replay        write the records again from the outcome stream
    notify callbacks ls|replay   producers' status callbacks waiting or given up
    notify status                lag per topic, leases, DLQ depth
    notify providers check       the config's providers: each one's credentials tried

Errors are one clear line on stderr and a non-zero exit code (``--debug`` or
``NOTIFY_DEBUG=1``: the traceback of an unexpected one).

The broker is ``NOTIFY_BROKER`` (set by ``notify run`` for its children), else
``REDIS_URL``, else ``data/broker.url``: the broker of the running ``notify run``,
the embedded server it started with the password it generated or the ``REDIS_URL``
it was given (a Redis Cluster's too; the file is its user's only, mode 0600). Files
are created with umask 0o077; ``notify run`` holds ``data/notify.lock`` while it runs.

Every command works on a Redis Cluster (pipeline/transport/client.py ``sync_client``
gives the cluster client; a topic is read one partition, one hash slot, at a time)
and uses the key namespace of the URL's ``prefix=`` (default ``nfs``), as the
workers and the API do.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

__all__ = ["main"]


class CLIError(Exception):
    pass


class NoBroker(CLIError):
    """No broker configured and no `notify run` running (``notify demo`` starts one)."""


def _settings():
    from config.settings import load_settings

    return load_settings()


def _broker_file(settings) -> Path:
    return Path(settings.data_dir) / "broker.url"


def broker_url(settings=None) -> str:
    """The broker URL every command uses, checked (a bad one is a one-line error
    naming where it came from, without its password)."""
    settings = settings or _settings()
    if os.environ.get("NOTIFY_BROKER"):
        url, source = os.environ["NOTIFY_BROKER"], "NOTIFY_BROKER"
    elif settings.redis_url:
        url, source = settings.redis_url, "REDIS_URL"
    else:
        f = _broker_file(settings)
        if not f.exists():
            raise NoBroker("no broker: set REDIS_URL, or start `notify run` first (it writes data/broker.url)")
        try:
            url, source = f.read_text().strip(), str(f)
        except (OSError, UnicodeDecodeError) as exc:
            raise CLIError(f"cannot read {f}: {exc}") from None
    return _checked(url, source)


def _checked(url: str, source: str) -> str:
    from pipeline.transport.client import BrokerURLError, parse_url

    try:
        parse_url(url)
    except BrokerURLError as exc:
        raise CLIError(f"{source}: {exc}") from None
    return url


def _redis(url: str):
    """A client for the broker: a ``RedisCluster`` on a cluster (pipeline/transport/client.py)."""
    from pipeline.transport.client import sync_client

    return sync_client(url)


def _keys(url: str):
    """The transport's key layout in the URL's namespace (``?prefix=``, default ``nfs``)."""
    from pipeline.transport.client import parse_url
    from pipeline.transport.keys import Keys

    return Keys(parse_url(url).query.get("prefix") or "nfs")


def _write_private(path: Path, text: str) -> None:
    """``text`` in ``path``, readable by this user only (mode 0600), replaced at once."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _private_data_dir(settings) -> Path:
    """The data directory, created 0700; what an earlier version left readable to
    other users (the directory 0755, records.db 0644, the AOF) made this user's only."""
    data = Path(settings.data_dir)
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    db = Path(settings.db_path)
    redis_dir = data / "redis"
    aof = redis_dir / "appendonlydir"
    dirs = [data, redis_dir, aof, data / "worker"]
    files = [data / "broker.url", data / "api_keys.json", data / "simulators.json", redis_dir / "server.log",
             redis_dir / "server.conf", db, Path(f"{db}-wal"), Path(f"{db}-shm"), Path(f"{db}-journal")]
    if aof.is_dir() and not aof.is_symlink():
        files += list(aof.iterdir())
    for path, mode in [(d, 0o700) for d in dirs] + [(f, 0o600) for f in files]:
        try:
            if path.is_symlink() or not path.exists() or path.stat().st_uid != os.getuid():
                continue
            if (path.stat().st_mode & 0o777) & ~mode:
                os.chmod(path, mode)
        except OSError:
            continue
    return data


def _lock_data_dir(data: Path) -> int:
    """An exclusive lock on ``data/notify.lock`` for as long as the returned file
    descriptor (and any process it was passed to) lives: one ``notify run`` per data
    directory. The kernel drops it when the holders exit, ``kill -9`` included."""
    path = data / "notify.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode("ascii", "replace").strip()
        os.close(fd)
        pid = holder if holder.isdigit() else "?"
        raise CLIError(f"{data} is in use by another `notify run` (pid {pid}) or the broker it started; "
                       f"one `notify run` per data directory (stop it, or set NOTIFY_DATA_DIR)") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


# -- run / worker -----------------------------------------------------------


def cmd_run(args) -> int:
    import secrets

    from pipeline.transport.client import public_url

    settings = _settings()
    os.umask(0o077)  # every file of notify run and of its children: this user's only
    data = _private_data_dir(settings)
    lock = _lock_data_dir(data)  # held by the broker too, passed to it, until it exits
    server = None
    if settings.redis_url:
        url = _checked(settings.redis_url, "REDIS_URL")
        _probe(url)
        print(f"broker {public_url(url)} (REDIS_URL; remembered in {_broker_file(settings)} while this runs)",
              flush=True)
    else:
        from pipeline.embedded import EmbeddedRedis

        # a password of this run: the server asks every client for it; it is in
        # data/broker.url (0600) and in the children's environment, never in argv
        server = EmbeddedRedis(data / "redis", port=args.port, password=secrets.token_hex(24),
                               pass_fds=(lock,)).start()
        url = server.url
        _write_private(_broker_file(settings), url)
        print(f"embedded server {public_url(url)} (AOF everysec in {server.data_dir}; "
              f"URL with its password in {_broker_file(settings)})", flush=True)
    env = dict(os.environ, NOTIFY_BROKER=url)
    # the config's own providers when it has [routes] (README "Real providers"), else the simulators
    args.providers = args.providers or ("config" if settings.routes else "simulators")
    env["NOTIFY_PROVIDERS"] = args.providers
    print(f"providers: {args.providers}" + (" ([providers.*] and [routes] of the config; `notify providers check` "
                                            "tries them)" if args.providers == "config" else ""), flush=True)
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
    sup = Supervisor(children, report=redis_reporter(url, _keys(url).supervisor))
    stop = {"now": False}

    def _stop(*_: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if server is None:  # remembered as the embedded server's is: later commands without REDIS_URL find it
        _write_private(_broker_file(settings), url)
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
        try:  # the broker of a `notify run` that is gone: commands say "no broker" instead
            if _broker_file(settings).read_text().strip() == url:
                _broker_file(settings).unlink()
        except OSError:
            pass
        os.close(lock)


def _probe(url: str) -> None:
    """A broker URL that cannot work is refused before anything starts (a database
    other than 0 on a Redis Cluster); a broker that does not answer yet is waited for
    by the workers, as before."""
    from pipeline.transport.client import BrokerUnavailable

    try:
        _redis(url).close()
    except BrokerUnavailable:
        pass


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
    from pipeline.providers import check_at_start

    check_at_start(settings)  # the config's credentials: a missing one is a ConfigError naming its key
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
        import orjson

        try:  # parsed as the API parses a body (orjson: no NaN, nesting and integers bounded)
            event = orjson.loads(Path(args.json[1:]).read_bytes() if args.json.startswith("@") else args.json.encode())
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

    keys, r = _keys(url), _redis(url)
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

#: what must not reach a terminal from a stream entry: C0/C1 controls (ESC starts
#: the sequences that retitle, clear or rewrite a terminal; a JSON text never holds
#: one unescaped), line and paragraph separators, bidirectional overrides
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _printable(value: Optional[bytes]) -> str:
    """A stream entry's value as one line that cannot drive the terminal: bytes that
    are not UTF-8 as ``\\xNN``, control characters as ``\\uNNNN`` (valid JSON
    lines print unchanged)."""
    if value is None:
        return "null"
    text = bytes(value).decode("utf-8", "backslashreplace")
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _read_topic(url: str, topic: str, partitions: int, follow: bool, limit: Optional[int]):
    """The values of ``topic`` from its oldest kept entry (pipeline/reader.py)."""
    from pipeline.reader import TopicReader

    reader = TopicReader(_redis(url), topic, partitions, keys=_keys(url))
    for shown, (_p, _off, value) in enumerate(reader.read(follow), 1):
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
    url = broker_url(settings)
    reader = TopicReader(_redis(url), OUTCOMES, settings.partitions, start=start, group=args.group,
                         member=member, keys=_keys(url))
    shown = 0
    try:
        for _p, _off, v in reader.read(args.follow):
            print(_printable(v), flush=True)
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
        from pipeline.redact import mask_letter_text

        for v in letters:  # addresses masked, a replayable payload's too (it stays whole in the stream)
            print(_printable(mask_letter_text(v).encode()))
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


def cmd_slo(args) -> int:
    """Seed 001's service level from the record store: this month (UTC) by
    default, ``--month YYYY-MM``, or ``--since``/``--until``."""
    from pipeline.rules import slo
    from pipeline.store import RecordStore

    settings = _settings()
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

    async def read() -> list:
        store = await RecordStore(settings.db_path).open()
        try:
            return await store.slo_events(since, until)
        finally:
            await store.close()

    report = slo.summarize(asyncio.run(read()), since, until, now)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(_slo_text(report))
    return 0


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


def cmd_status(args) -> int:
    """Lag per topic, slots, processes, breakers. Every key is read by name (a
    pipeline: one round trip per node on a Redis Cluster) except the slot leases,
    found with SCAN, on every master of a cluster."""
    from pipeline.reader import is_cluster_client
    from pipeline.topics import ALL, UNREAD
    from pipeline.transport.client import public_url

    settings = _settings()
    url = broker_url(settings)
    r = _redis(url)
    keys = _keys(url)

    def num(v: Any) -> Optional[int]:  # whatever another writer left there: "?"
        try:
            return int(v or 0)
        except (TypeError, ValueError):
            return None

    from pipeline.roles import offset_peers

    # a priority topic is read by notify-priority when that process runs (pipeline/roles.py):
    # as far as the furthest of the groups that take turns on it, as the API's lag says
    peers = offset_peers("main")
    offsets = {g: {k.decode("utf-8", "replace"): num(v) for k, v in r.hgetall(keys.offsets(g)).items()
                   if not k.endswith(b"@")} for g in {"notify", *(g for gs in peers.values() for g in gs)}}

    def committed_at(topic: str, p: int) -> Optional[int]:
        got = [offsets[g].get(keys.tp_field(topic, p), 0) for g in ("notify", *peers.get(topic, ()))]
        return None if None in got else max(got)
    cluster = is_cluster_client(r)
    print(f"broker {public_url(url)}" + (f" (Redis Cluster, {len(r.get_primaries())} masters)" if cluster else ""))
    print(f"{'topic':34} {'highwater':>10} {'committed':>10} {'lag':>8}")
    pipe = r.pipeline(transaction=False)
    for topic in ALL:
        for p in range(settings.partitions):
            pipe.get(keys.counter(topic, p))
    counters = iter(pipe.execute())
    for topic in ALL:
        hws = [num(next(counters)) for p in range(settings.partitions)]
        cms = [committed_at(topic, p) for p in range(settings.partitions)]
        hw: Any = "?" if None in hws else sum(hws)
        cm: Any = "?" if None in cms else sum(cms)
        if topic in UNREAD:  # no agent reads it: a depth, no lag
            print(f"{topic:34} {hw:>10} {'-':>10} {'-':>8}")
            continue
        lag = "?" if "?" in (hw, cm) else hw - cm
        print(f"{topic:34} {hw:>10} {cm:>10} {lag:>8}")
    leases = {_printable(k).rsplit(":", 1)[1]: _printable(r.get(k) or b"-")
              for k in r.scan_iter(keys.lease("notify", 0)[:-1] + "*")}
    print("slots:", ", ".join(f"{s}→{o}" for s, o in sorted(leases.items())) or "none held")
    from pipeline.transport.membership import format_group, read_group_sync

    group = read_group_sync(r, keys, "notify")
    if group.gen:
        print(format_group(group, now_ms=int(r.time()[0] * 1000)))
    print_processes(r.hgetall(keys.supervisor))
    print_breakers(r.hgetall(keys.breakers))
    print_scaling(url, keys, settings.partitions)
    return 0


def print_scaling(url: str, keys: Any, partitions: int) -> None:
    """Workers each priority needs to meet its latency goal at the drain rate
    measured over one second (pipeline/rules/scaling.py, docs/SCALING.md)."""
    from pipeline.api.metrics_lag import LagSampler, scaling
    from pipeline.transport.client import connect

    async def measure() -> list:
        client = await connect([url], attempts=1)
        try:
            sampler = LagSampler(client, keys, partitions, min_interval=0.0)
            await sampler.snapshot(force=True)
            await asyncio.sleep(1.0)
            snap = await sampler.snapshot(force=True)
            return scaling(snap) if snap.ok else []
        finally:
            await client.aclose()

    loads = asyncio.run(measure())
    if not loads:
        return
    print(f"{'priority':9} {'workers':>7} {'lag':>8} {'oldest':>9} {'drain':>9} {'goal':>6} {'needed':>7}")
    for x in loads:
        drain = "-" if x.time_to_drain_s is None else f"{x.time_to_drain_s:.1f}s"
        print(f"{x.priority:9} {x.workers:>7} {x.lag:>8} {x.oldest_age_s:>8.1f}s {drain:>9} {x.goal_s:>5.0f}s "
              f"{x.needed:>7}")


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


def cmd_providers(args) -> int:
    """``notify providers check [--config FILE]``: the config's providers, each built and
    its credentials tried without sending anything (adapters/registry.py ``probe``), one
    line each; exit 1 when one fails. Without [routes], the simulators ``notify run``
    started, when it runs."""
    from adapters.registry import check_all
    from config.settings import load_settings

    settings = load_settings(args.config) if args.config else _settings()
    specs, routes, env, source = settings.providers, settings.routes, os.environ, "config"
    info = Path(settings.data_dir) / "simulators.json"
    if not routes and not any(s.kind for s in specs.values()):
        if not info.exists():
            print("no [routes] and no provider with a kind in the config: notify run uses the provider "
                  "simulators (README \"Real providers\")")
            return 0
        from pipeline.layout import simulator_providers
        from pipeline.providers import provider_specs

        tables, env = simulator_providers(json.loads(info.read_text()))
        (specs, routes), source = provider_specs(tables, settings), f"the simulators ({info})"
    print(f"providers of {source}: " + "; ".join(f"{c}: {' → '.join(n) or '(off)'}" for c, n in routes.items()))
    lines = asyncio.run(check_all(specs, routes, env, timeout=args.timeout))
    for line in lines:
        print(f"{line.name:14} {line.kind or '-':9} {'ok' if line.ok else 'FAILED'}: {_one_line(line.message, 1000)}",
              flush=True)
    return 1 if any(not line.ok for line in lines) else 0


def cmd_callbacks(args) -> int:
    """``ls``: the status callbacks waiting (soonest first: pending, retrying, in
    flight) or, with ``--failed``, given up (newest first), one JSON line each;
    ``replay``: given-up ones due again now with a fresh retry horizon (and, with
    ``--pending``, the retrying ones now). pipeline/callback_queue.py."""
    from pipeline import callback_queue

    url = broker_url()
    client = _redis(url)
    try:
        if args.action == "ls":
            for row in callback_queue.list_callbacks(client, _keys(url).ns, failed=args.failed, limit=args.limit):
                print(_printable(json.dumps(row, ensure_ascii=False).encode()))
        else:
            failed, pending = callback_queue.replay(client, _keys(url).ns, args.ids, pending=args.pending)
            print(json.dumps({"replayed": failed, "due_now": pending}))
    finally:
        client.close()
    return 0


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
            kid, key = auth.add_key(keys_path, args.name, args.scopes.replace(" ", ",").split(","),
                                    callback_url=args.callback_url)
            # the key and its status callback secret (agents/callbacks.py), both shown once
            print(json.dumps({"key_id": kid, "producer": args.name, "key": key, "file": keys_path,
                              **auth.key_callback(keys_path, kid)}))
            print("store the key and its callback secret now: they are not shown again", file=sys.stderr)
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
    ap.add_argument("--debug", action="store_true",
                    help="the traceback of an unexpected error (also NOTIFY_DEBUG=1)")
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
    run.add_argument("--providers", choices=["config", "simulators", "fake"], default=None,
                     help="the config's [providers]/[routes] (default when it has routes), the provider "
                          "simulators on 127.0.0.1 (default otherwise) or in-process fakes")
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
    sl = sub.add_parser("slo", help="the service level from the record store (seed 001)")
    sl.add_argument("--month", help="YYYY-MM (UTC); default this month")
    sl.add_argument("--since", help="unix seconds or ISO 8601")
    sl.add_argument("--until", help="unix seconds or ISO 8601; default now")
    sl.add_argument("--json", action="store_true")
    sl.set_defaults(fn=cmd_slo)
    cb = sub.add_parser("callbacks", help="producers' status callbacks: ls [--failed] | replay [--pending] [ID ...]")
    cb.add_argument("action", choices=["ls", "replay"])
    cb.add_argument("ids", nargs="*", help="replay: these callbacks only (default: every given-up one)")
    cb.add_argument("--failed", action="store_true", help="ls: the given-up ones (default: those waiting)")
    cb.add_argument("--pending", action="store_true", help="replay: those waiting for a later retry too, now")
    cb.add_argument("-n", "--limit", type=int, default=100)
    cb.set_defaults(fn=cmd_callbacks)
    st = sub.add_parser("status", help="lag, slots")
    st.set_defaults(fn=cmd_status)
    pv = sub.add_parser("providers", help="providers check [--config FILE]: try each provider's credentials")
    pv.add_argument("action", choices=["check"])
    pv.add_argument("--config", help="the config file (default NOTIFY_CONFIG)")
    pv.add_argument("--timeout", type=float, default=10.0, help="seconds per provider")
    pv.set_defaults(fn=cmd_providers)
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
    ks.add_argument("--callback-url", dest="callback_url",
                    help="add: the producer's default status callback URL (README \"Status callbacks\")")
    ks.set_defaults(fn=cmd_api)
    return ap


_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/@\s]*@")


def _one_line(msg: str, limit: int = 600) -> str:
    """An error message as one line: no credentials of a URL, no control characters."""
    msg = _CREDENTIALS.sub(r"\1***@", " ".join(str(msg).split()))
    msg = _printable(msg.encode("utf-8", "backslashreplace"))
    return msg if len(msg) <= limit else msg[:limit] + "…"


def _debug(args: Any) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get("NOTIFY_DEBUG", "") not in ("", "0")


def main(argv: Optional[list[str]] = None) -> int:
    """Run one command. Errors are one line on stderr, never a traceback: 2 for what
    the command refuses (bad input, no broker), 1 for what failed (the broker, a
    file, the config), 1 with a hint for anything unexpected (``--debug`` or
    ``NOTIFY_DEBUG=1`` shows its traceback)."""
    from pipeline import redact

    redact.install()  # recipients are masked in every log line of every command
    os.umask(0o077)  # what a command creates (keys, records, worker state): this user's only
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except CLIError as exc:
        print(f"notify: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `notify outcomes tail | head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # one clear line, never a traceback
        from redis.exceptions import RedisClusterException, RedisError

        from config.settings import ConfigError
        from pipeline.rules.validate import InvalidEvent
        from pipeline.transport.client import BrokerURLError

        if _debug(args):
            raise
        if isinstance(exc, (BrokerURLError, InvalidEvent)):
            print(f"notify: {_one_line(str(exc))}", file=sys.stderr)
            return 2
        if isinstance(exc, (ConfigError, ConnectionError, OSError, RedisError, RedisClusterException)):
            print(f"notify: {type(exc).__name__}: {_one_line(str(exc))}", file=sys.stderr)
            return 1
        print(f"notify: unexpected {type(exc).__name__}: {_one_line(str(exc))} "
              f"(--debug or NOTIFY_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
