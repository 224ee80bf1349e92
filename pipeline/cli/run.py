"""``notify run`` (the embedded server unless REDIS_URL, and the supervised
processes), ``notify worker``, ``notify api`` and ``notify keys``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from .broker import (CLIError, broker_file, broker_keys, broker_url, checked_url, current_settings, lock_data_dir,
                     private_data_dir, probe_broker, write_private)

__all__ = ["cmd_run", "cmd_worker", "cmd_api", "spawner", "start_together"]


def cmd_run(args) -> int:
    import secrets

    from pipeline.procs import worker_env
    from pipeline.transport.client import public_url

    # from the first moment: a SIGTERM or Ctrl-C while it starts (the embedded server
    # up, the processes not yet) stops it as one while running does, the broker last,
    # instead of killing this process and leaving its broker running, orphaned, with
    # the data directory's lock
    stop = {"now": False}

    def _stop(*_: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    settings = current_settings()
    os.umask(0o077)  # every file of notify run and of its children: this user's only
    data = private_data_dir(settings)
    lock = lock_data_dir(data)  # held by the broker too, passed to it, until it exits
    server = None
    if settings.redis_url:
        url = checked_url(settings.redis_url, "REDIS_URL")
        probe_broker(url)
        print(f"broker {public_url(url)} (REDIS_URL; remembered in {broker_file(settings)} while this runs)",
              flush=True)
    else:
        from pipeline.embedded import EmbeddedRedis

        # a password of this run: the server asks every client for it; it is in
        # data/broker.url (0600) and in the children's environment, never in argv
        server = EmbeddedRedis(data / "redis", port=args.port, password=secrets.token_hex(24),
                               pass_fds=(lock,)).start()
        url = server.url
        write_private(broker_file(settings), url)
        print(f"embedded server {public_url(url)} (AOF everysec in {server.data_dir}; "
              f"URL with its password in {broker_file(settings)})", flush=True)
    env = worker_env(os.environ, url)  # pipeline/layout.py adds each process's role and share
    # the config's own providers when it has [routes] (README "Real providers"), else the simulators
    args.providers = args.providers or ("config" if settings.routes else "simulators")
    env["NOTIFY_PROVIDERS"] = args.providers
    print(f"providers: {args.providers}" + (" ([providers.*] and [routes] of the config; `notify providers check` "
                                            "tries them)" if args.providers == "config" else ""), flush=True)
    if args.providers == "simulators":
        # the simulators sign their receipts with secrets the API's receipts endpoint knows
        env.setdefault("NOTIFY_TWILIO_AUTH_TOKEN", secrets.token_hex(16))
        env.setdefault("NOTIFY_VENDOR_SECRET", secrets.token_hex(16))
        env.setdefault("NOTIFY_HMS_RECEIPT_KEY", secrets.token_hex(16))  # Push Kit's callback key
        env["NOTIFY_PROVIDERS"] = "simulators"
        if args.api_port:
            env.setdefault("NOTIFY_RECEIPTS_URL", f"http://127.0.0.1:{args.api_port}/v1/receipts")
    from pipeline import layout
    from pipeline.supervise import Child, Supervisor, redis_reporter

    workers = args.workers or layout.default_workers()
    info = str(Path(settings.data_dir).resolve() / "simulators.json") \
        if args.providers == "simulators" and not args.simulators_in_worker else None
    procs = layout.plan(env, workers=workers, priority_process=args.priority_process, api_port=args.api_port,
                        metrics_port=args.metrics_port, loglevel=args.loglevel, simulators_info=info,
                        priority_workers=args.priority_workers)
    print("processes (restarted when they exit):\n" + layout.describe(procs), flush=True)
    children = []
    if server is not None:
        children.append(Child("broker", lambda: server.start().proc, proc=server.proc, started_at=time.time()))
    workers_of = tuple(p.name for p in procs if p.group)  # the worker processes
    planned = [(p, Child(p.name, spawner(p.argv, p.env, p.waits_for),
                         restart_with=workers_of if p.restarts_workers else (), group=p.group)) for p in procs]
    children += [c for _, c in planned]
    sims = [c for p, c in planned if p.restarts_workers]  # the simulators' families
    if info:  # what an earlier run left: the info file is written anew once every family's part is
        for path in [info] + [p.waits_for for p, _ in planned if p.restarts_workers and p.waits_for]:
            Path(path).unlink(missing_ok=True)
    sup = Supervisor(children, report=redis_reporter(url, broker_keys(url).supervisor))
    if server is None:  # remembered as the embedded server's is: later commands without REDIS_URL find it
        write_private(broker_file(settings), url)
    try:
        start_together(sims)  # the simulators' families at once (each ready when its part is written)
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
            if broker_file(settings).read_text().strip() == url:
                broker_file(settings).unlink()
        except OSError:
            pass
        os.close(lock)


def start_together(children: list) -> None:
    """Start these supervised children (pipeline/supervise.py ``Child``) at once, each
    ``start`` in a thread of its own (it waits until its process is ready): the
    simulators' families, ready in the time of one instead of the sum. Those that
    started are the children's processes even when another one failed (its error
    is raised then): the supervisor stops them."""
    if not children:
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(children)) as pool:
        futures = [(c, pool.submit(c.start)) for c in children]
    error = None
    for c, future in futures:
        try:
            c.proc, c.started_at = future.result(), time.time()
        except Exception as exc:  # noqa: BLE001 - the first is raised once every other one is kept
            error = error or exc
    if error is not None:
        raise error


def spawner(argv: Any, env: dict, waits_for: Optional[str] = None, timeout: float = 30.0) -> Any:
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
    """``notify worker [--role R]``: one worker process: the app of its role built by
    the factory (pipeline/app.py ``create_app``), its agents registered
    (agents/__init__.py ``register_agents``), then Faust's worker runs it."""
    import dataclasses

    settings = current_settings()
    env = settings.env
    role = getattr(args, "role", None) or env.role
    # the broker this worker uses (data/broker.url for the embedded one), and the role,
    # as the rest of the process sees them (breakers, process names)
    env = dataclasses.replace(env, broker=broker_url(settings), role=role)  # checked: a bad one is one line
    settings = dataclasses.replace(settings, env=env)
    from pipeline.providers import check_at_start

    check_at_start(settings)  # the config's credentials: a missing one is a ConfigError naming its key
    os.makedirs(os.path.join(settings.data_dir, "worker"), exist_ok=True)
    if env.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(env.metrics_port, addr="127.0.0.1")
    import faust

    from pipeline.lean import tune_gc, use_fast_loop

    use_fast_loop(env.loop)  # before anything creates the loop
    from agents import register_agents
    from pipeline import roles
    from pipeline.app import create_app

    app = create_app(settings, role)
    register_agents(app)
    # a main worker yields the core to the priority worker (pipeline/roles.py)
    roles.lower_priority(role, env.main_nice, env.main_sched)
    tune_gc()
    worker = faust.Worker(app, loglevel=args.loglevel, quiet=True)
    # Faust's terminal spinner (made even when quiet) sets the root logger to DEBUG so
    # that every record spins it: every library's debug call on the hot path (hpack per
    # header, mode's timers, aiohttp, redis) then built a record and ran the redaction
    # (pipeline/redact.py) to be dropped by the handler. Without it the root logger stays
    # at --loglevel: 3.4% of the priority worker's samples under `notify demo` were these.
    worker.spinner = None
    if not env.profile_dir:
        worker.execute_from_commandline()
        return 0
    import cProfile

    try:  # where the profile goes is checked before the worker runs, not when it stops
        os.makedirs(env.profile_dir, exist_ok=True)
        if not os.access(env.profile_dir, os.W_OK):
            raise OSError("not writable")
    except OSError as exc:
        raise CLIError(f"NOTIFY_PROFILE_DIR={env.profile_dir}: {exc}") from None
    profile = cProfile.Profile()
    profile.enable()
    try:
        worker.execute_from_commandline()
    finally:
        profile.disable()
        profile.dump_stats(os.path.join(env.profile_dir, f"worker-{role}-{os.getpid()}.prof"))
    return 0


def cmd_api(args) -> int:
    """``notify api`` serves the HTTP API (pipeline/api); ``notify keys add|ls|rm``
    manages its API keys (the key itself is printed once, only its hash is kept)."""
    from pipeline.api import auth, serve
    settings = current_settings()
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
