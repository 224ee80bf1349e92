"""The command line: :func:`build_parser` (every command and its options) and
:func:`main`, which runs one and turns every error into one line on stderr and an
exit code."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional

from config.environment import debug_requested

from .broker import CLIError
from .demo import cmd_demo
from .providers import cmd_providers
from .read import cmd_callbacks, cmd_dlq, cmd_outcomes, cmd_records, cmd_slo, cmd_stats
from .run import cmd_api, cmd_run, cmd_worker
from .send import cmd_send, cmd_user
from .status import cmd_status
from .text import one_line

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="notify", description="notify-stream: notifications as a stream pipeline")
    ap.add_argument("--debug", action="store_true",
                    help="the traceback of an unexpected error (also NOTIFY_DEBUG=1)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="embedded server (unless REDIS_URL) and workers")
    run.add_argument("--workers", type=int, default=0,
                     help="main workers (default: one per core), beside the high-priority process")
    run.add_argument("--priority-workers", type=_at_least_one, default=1,
                     help="processes of the OTP / security path (default 1), splitting its partitions")
    run.add_argument("--no-priority-process", dest="priority_process", action="store_false",
                     help="no process of its own for the OTP / security path: N workers of role 'all'")
    run.add_argument("--simulators-in-worker", action="store_true",
                     help="the simulators inside each worker process (as before), not in their processes "
                          "(one per provider family: push, sms, email, webhook)")
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
    sts = sub.add_parser("stats", help="delivery, click and read rates per template and channel")
    sts.add_argument("--since", help="unix seconds or ISO 8601 (default: 24 h ago)")
    sts.add_argument("--until", help="unix seconds or ISO 8601 (default: now)")
    sts.add_argument("--json", action="store_true")
    sts.set_defaults(fn=cmd_stats)
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



def _at_least_one(text: str) -> int:
    """A count of processes: an integer of at least 1 (argparse names the flag in its error)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _debug(args: Any) -> bool:
    return bool(getattr(args, "debug", False)) or debug_requested()


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
        print(f"notify: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `notify outcomes tail | head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # one clear line, never a traceback
        from redis.exceptions import RedisClusterException, RedisError

        from config.settings import ConfigError
        from pipeline.parsers.events import InvalidEvent
        from pipeline.transport.client import BrokerURLError

        if _debug(args):
            raise
        if isinstance(exc, (BrokerURLError, InvalidEvent)):
            print(f"notify: {one_line(str(exc))}", file=sys.stderr)
            return 2
        if isinstance(exc, (ConfigError, ConnectionError, OSError, RedisError, RedisClusterException)):
            print(f"notify: {type(exc).__name__}: {one_line(str(exc))}", file=sys.stderr)
            return 1
        print(f"notify: unexpected {type(exc).__name__}: {one_line(str(exc))} "
              f"(--debug or NOTIFY_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
