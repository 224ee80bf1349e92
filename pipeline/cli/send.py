"""Producing: ``notify send`` (one event, checked as the API checks it, ``--wait``
for its final state), ``notify user set`` (contact data and devices) and
:func:`send_raw`, the writer every command that produces uses (``notify dlq
replay``, ``notify demo``, bench/real.py)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

from .broker import CLIError, broker_keys, broker_url, current_settings, redis_client

__all__ = ["send_raw", "send_events", "cmd_send", "cmd_user", "RECEIPT_WAIT_S"]


def _parse_params(items: list[str]) -> dict:
    out = {}
    for it in items or []:
        if "=" not in it:
            raise CLIError(f"--param wants key=value, got {it!r}")
        k, v = it.split("=", 1)
        out[k] = v
    return out


async def send_raw(url: str, topic: str, items: list[tuple[bytes, bytes]]) -> list:
    """Write (key, value) pairs to a topic with the transport's producer; their metadata
    (partition, offset) in order."""
    import faust

    settings = current_settings()
    app = faust.App(f"notify-cli-{os.getpid()}", broker=url, topic_partitions=settings.partitions, web_enabled=False)
    await app.producer.start()
    try:
        futs = [await app.producer.send(topic, k, v, None, None, None) for k, v in items]
        return list(await asyncio.gather(*futs))
    finally:
        await app.producer.stop()
        await app.transport.close()


async def send_events(url: str, events: list[dict]) -> None:
    import orjson

    from pipeline.topics import event_key, event_topic

    settings = current_settings()
    by_topic: dict[str, list] = {}
    for e in events:
        topic = event_topic(settings, e.get("category"), e.get("priority"))
        by_topic.setdefault(topic, []).append((event_key(e["biz_key"], e.get("recipients")), orjson.dumps(e)))
    for topic, items in by_topic.items():
        await send_raw(url, topic, items)


def cmd_send(args) -> int:
    """One event, checked as the API checks it (unknown category, template or channel,
    missing fields: a one-line error and exit 2); with ``--wait`` the final state of
    each of its notifications is printed when it is known."""
    from pipeline.parsers.events import InvalidEvent, check_params, parse_event
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
    settings = current_settings()
    try:
        renderer = Renderer.from_settings(settings)
        check_params(parse_event(json.dumps(event).encode(), settings, renderer), renderer)
    except InvalidEvent as exc:
        raise CLIError(f"invalid event: {exc.reason}: {exc}") from None
    asyncio.run(send_events(broker_url(settings), [event]))
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


#: how long ``notify user set`` waits for the running workers to apply what it wrote
APPLY_WAIT_S = 30.0


def meant_to_run(client, keys) -> list[str]:
    """The consumer groups (of the default layout's) that hold a slot now, or that a
    ``notify run`` supervises a worker of, up or about to restart (a group between two
    of its workers holds no slot for a moment)."""
    from pipeline.roles import GROUPS
    from pipeline.supervise import read_states

    states = read_states(client.hgetall(keys.supervisor)).values()
    supervised = {s.get("group") for s in states if s.get("up") or s.get("restart_at") is not None}
    return [g for g in GROUPS if g in supervised or client.exists(keys.lease(g, 0))]


def _wait_applied(url: str, written: list, timeout: float = APPLY_WAIT_S) -> list[str]:
    """Until every consumer group meant to run (:func:`meant_to_run`: the main and the
    priority role each keep a copy of users' data) has committed past the entries
    ``written``, so the next `notify send` finds the user as set; at most ``timeout``
    seconds. Returns the groups that had not by then."""
    from pipeline.transport import committed

    keys, r = broker_keys(url), redis_client(url)
    try:
        groups = meant_to_run(r, keys)
        deadline = time.time() + timeout
        tps = [(m.topic, m.partition) for m in written]
        while True:
            behind = [g for g in groups if not all((c or 0) > m.offset
                                                   for m, c in zip(written, committed.read_sync(r, keys, g, tps)))]
            if not behind or time.time() >= deadline:
                return behind
            time.sleep(0.1)
    finally:
        r.close()


def cmd_user(args) -> int:
    """``notify user set ID --phone … --email … --tz … --quiet-hours … --device apns:TOKEN``:
    a user's contact data and push devices, checked as the API checks them."""
    import orjson

    from pipeline.parsers.events import InvalidEvent, parse_device_update, parse_preferences

    settings = current_settings()
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
    written = asyncio.run(send_raw(url, "notify.preferences", [(args.id.encode(), orjson.dumps(prefs))]))
    if devices:
        written += asyncio.run(send_raw(url, "notify.devices",
                                         [(args.id.encode(), orjson.dumps(d)) for d in devices]))
    behind = _wait_applied(url, written)
    if behind:
        print(f"notify: not applied yet by {', '.join(behind)} within {APPLY_WAIT_S:g}s (are its workers up?): "
              "a notification sent now may not find this user as set", file=sys.stderr)
    print(json.dumps({"user": args.id, "preferences": sorted(k for k in prefs if k not in ("user_id", "version")),
                      "devices": len(devices)}))
    return 0
