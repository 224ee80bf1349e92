"""Benchmark (not a test): OTP latency, from acceptance to the provider call, for
high-priority events arriving at a steady rate (a) on an idle pipeline and (b)
while a marketing backlog drains, for several low-lane batch sizes (the
``[lane_batch_size] low`` knob of config/defaults.toml): the curve of marketing
drain rate against OTP p50/p99/max. Writes the "otp" section of bench/RESULTS.md.

    python bench/otp.py [--backlog 100000] [--batches 10,50,100,500] [--rate 20]
                        [--window 60] [--idle-window 30] [--profile] [--quick]

Setup of every point (a fresh embedded server each, two workers, 8 partitions,
in-process fake providers at zero latency, ``bench_config`` of bench/e2e.py):

* users with a phone and an e-mail address (preferences through their topic);
* (b) only: ``--backlog`` marketing events (one recipient, e-mail only, so one
  low-lane delivery each; ``daily_limit`` and ``rate_windows`` of marketing lifted
  for the run so the backlog is sent, not capped) are written to ``notify.events``; the clock starts
  once they are all written, while the workers drain them through expand, the
  guard and the low e-mail lane (they started on it as it was written: "backlog
  left" in the table says what remained in ``notify.events``,
  ``notify.intents.low`` and ``notify.send.email.low`` at the window's end; the
  window ends early when nothing remains). Waiting for expand to finish first, as
  this did before, left nothing to drain once the guard and the lanes kept pace
  with expand;
* OTP events (sms) are written one at a time at ``--rate`` per second to
  ``notify.events.high`` (where the API writes high-priority categories) through the
  API's own write path (``pipeline.api.producer.TopicWriter``, the Lua PRODUCE the
  API runs before answering 202), ``accepted_at`` stamped just before the write as
  the API does; for ``--window`` s, or until the backlog is drained.

The workers run through a shim (``--worker-shim``) that timestamps, per OTP, the
moment expand parses it, the guard plans it, the lane marks it "calling" (takes
it), the lane's step starts (after the flush that makes the marks durable) and the
fake provider is called; and counts low-lane provider calls per second. All in
wall-clock time on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import orjson

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))

from bench.e2e import (  # noqa: E402
    PARTITIONS, WORKERS, Lag, Workers, cpu_seconds, machine_busy, summarize_inclusive, summarize_raw, wait)
from pipeline.embedded import EmbeddedRedis  # noqa: E402
from pipeline.procs import worker_env  # noqa: E402
from config.settings import load_settings  # noqa: E402
from pipeline.roles import app_id  # noqa: E402
from pipeline.topics import EVENTS, PREFERENCES, event_key, events_for  # noqa: E402
from tests.transport.helpers import produce_async  # noqa: E402

OTP_PREFIX = "otpb:"
TARGET_IDLE_P99_MS = 10.0
TARGET_BACKLOG_P99_MS = 50.0
STAGES = ("expand", "guard", "take", "step", "call")
STAGE_NAMES = {
    "expand": "accepted → expand (stream write, fetch, expand's queue)",
    "guard": "expand → guard (intent produced, fetched, guard's queue)",
    "take": "guard → lane takes it (handed to the local lane, or produced and fetched; lane batch)",
    "step": "lane takes it → step (inflight marks flushed durably)",
    "call": "step → provider call (dispatcher: breaker, bucket, routing)",
}


# ---------------------------------------------------------------------------
# the worker shim


def worker_shim(out: str) -> None:
    """A pipeline worker with timestamps per OTP stage and a count of low-lane calls
    per second, appended to ``out`` (JSON lines) every 0.2 s."""
    import agents  # noqa: F401
    import agents.emit
    import agents.expand
    import agents.guard
    import agents.lanes
    from adapters.fake import FakeProvider

    q: collections.deque = collections.deque()
    low: collections.deque = collections.deque()  # second of each low-lane call (deque: thread-safe)
    did_key: dict[str, str] = {}  # delivery_id → biz_key of OTP deliveries

    def wrap_sync(mod, name: str, stage: str, key_of) -> None:
        orig = getattr(mod, name, None)
        if orig is None:  # renamed: the breakdown says the stage was not measured
            print(f"otp shim: {mod.__name__}.{name} is gone; stage {stage!r} not measured", file=sys.stderr)
            return

        def wrapper(*a, **k):
            t = time.time()
            res = orig(*a, **k)
            try:
                key = key_of(a, k, res)
            except Exception:  # noqa: BLE001 - a probe never breaks the worker
                key = None
            for one in ([key] if isinstance(key, str) else key or ()):
                q.append((stage, one, t))
            return res

        setattr(mod, name, wrapper)

    def otp_key(bk):
        return bk if isinstance(bk, str) and bk.startswith(OTP_PREFIX) else None

    wrap_sync(agents.expand, "parse_event", "expand", lambda a, k, ev: otp_key(ev.biz_key))
    wrap_sync(agents.guard, "plan_intent", "guard", lambda a, k, _r: otp_key(a[0].biz_key))
    # the "calling" marks of a take (one changelog entry per partition: tables.put_many)
    # = the lane took the delivery (keyed by delivery id)
    wrap_sync(agents.lanes, "put_many", "take",
              lambda a, k, _r: ["did:" + did for did, m in a[2].items() if m.get("s") == "calling" and did in did_key])

    orig_step = agents.lanes.Lanes.step

    async def step(self, d, disp, unknown):
        if otp_key(d.biz_key):
            q.append(("step", d.biz_key, time.time()))
        return await orig_step(self, d, disp, unknown)

    agents.lanes.Lanes.step = step

    # delivery ids of OTPs are known once the guard emitted them: wrap emit.deliver
    orig_deliver = agents.emit.Emit.deliver

    async def deliver(self, d, *a, **k):
        if otp_key(d.biz_key):
            did_key[d.delivery_id] = d.biz_key
        return await orig_deliver(self, d, *a, **k)

    agents.emit.Emit.deliver = deliver

    orig_send = FakeProvider.send

    async def send(self, d):
        if d.priority == "low":
            low.append(int(time.time()))
        elif otp_key(d.biz_key) and not self.calls[d.delivery_id]:
            q.append(("call", d.biz_key, time.time()))
        return await orig_send(self, d)

    FakeProvider.send = send

    def dump() -> None:
        with open(out, "a") as f:
            while True:
                time.sleep(0.2)
                lines = []
                while q:
                    stage, key, t = q.popleft()
                    if key.startswith("did:"):
                        stage, key = "take", did_key.get(key[4:], key)
                    lines.append(json.dumps([stage, key, t]))
                counts = collections.Counter(low.popleft() for _ in range(len(low)))
                lines += [json.dumps(["low", sec, n]) for sec, n in counts.items()]
                if lines:
                    f.write("\n".join(lines) + "\n")
                    f.flush()

    threading.Thread(target=dump, daemon=True).start()
    from pipeline.cli import main as cli_main

    sys.exit(cli_main(["worker", "-l", "warn"]))


class ShimWorkers(Workers):
    """bench/e2e.py's workers, run through this module's shim."""

    def __init__(self, url: str, tmp: Path, extra_config: str, priority_worker: bool = False):
        super().__init__(url, tmp)
        #: roles of the processes: WORKERS of "all", or WORKERS of "main" and one "priority"
        self.roles = ["main"] * WORKERS + ["priority"] if priority_worker else ["all"] * WORKERS
        if self.config is None:
            self.config = tmp / "bench-config.toml"
            self.config.write_text("")
            self.env["NOTIFY_CONFIG"] = str(self.config)
        self.config.write_text(self.config.read_text() + extra_config)
        self.outs = [OUT / f"otp-probes-w{i}.jsonl" for i in range(len(self.roles))]

    def start(self, tag: str) -> None:
        for i, role in enumerate(self.roles):
            self.outs[i].unlink(missing_ok=True)
            log = open(OUT / f"otp-{tag}-w{i}.log", "w")
            env = worker_env(self.env, role=role, index=i)
            if role == "priority":  # a group of its own, every partition in this one process
                env = worker_env(env, workers=1, index=0)
            self.procs.append(subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--worker-shim", str(self.outs[i])], cwd=str(ROOT),
                env=env, stdout=log, stderr=subprocess.STDOUT))

    def check(self) -> None:
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                raise RuntimeError(f"worker {i} exited with {p.returncode}; see bench/out/otp-*-w{i}.log")


class Probes:
    """Reads what the shims appended since the last read."""

    def __init__(self, files: list[Path]):
        self.files = files
        self.pos = [0] * len(files)
        self.stages: dict[str, dict[str, float]] = collections.defaultdict(dict)  # biz_key → stage → t
        self.low: collections.Counter = collections.Counter()  # second → low-lane calls

    def read(self) -> None:
        for i, f in enumerate(self.files):
            if not f.exists():
                continue
            with open(f) as fh:
                fh.seek(self.pos[i])
                data = fh.read()
            end = data.rfind("\n") + 1
            self.pos[i] += len(data[:end].encode())
            for line in data[:end].splitlines():
                a, b, c = json.loads(line)
                if a == "low":
                    self.low[b] += c
                else:
                    self.stages[b].setdefault(a, c)

    def low_calls(self, t0: float, t1: float) -> int:
        return sum(n for s, n in self.low.items() if t0 <= s < t1)


# ---------------------------------------------------------------------------
# one point of the curve


@dataclass
class Point:
    label: str
    batch_low: Optional[int]
    backlog: int
    rate: float
    window_s: float = 0.0
    sent: int = 0
    called: int = 0
    lat_ms: list = field(default_factory=list)  # acceptance → provider call, per OTP
    stages_ms: dict = field(default_factory=dict)  # stage → [ms]
    low_calls: int = 0  # low-lane provider calls in the window's whole seconds
    low_window_s: int = 0
    accepted: dict = field(default_factory=dict)  # biz_key → accepted_at stamped by the load generator
    backlog_left: int = 0  # low-lane lag at the end of the window
    expand_s: float = 0.0  # time the backlog took to write
    send_late_ms: float = 0.0  # max lateness of the load generator against its schedule
    cpu: dict = field(default_factory=dict)
    other_cpu: float = 0.0
    profile: list = field(default_factory=list)  # --profile: py-spy summary of worker 0 in the window

    @property
    def drain_rate(self) -> float:
        return self.low_calls / self.low_window_s if self.low_window_s else 0.0


def pct(xs: list, q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


def make_users(n: int) -> list[tuple[bytes, bytes]]:
    # addresses end in ...99: no failure scenario of the fakes (adapters/fake.py)
    return [(f"u{i}".encode(), orjson.dumps({"user_id": f"u{i}", "version": 1, "tz": "UTC",
                                              "phone": f"+1555{i:06d}99", "email": f"user{i}99@example.com"}))
            for i in range(n)]


def backlog_events(start: int, stop: int, users: int) -> list[tuple[bytes, bytes]]:
    now = time.time()
    return [(f"mkt:{i}".encode(), orjson.dumps({
        "biz_key": f"mkt:{i}", "category": "marketing", "template": "promo", "channels": ["email"],
        "recipients": [f"u{i % users}"], "accepted_at": now,
        "params": {"headline": "Winter sale", "discount": "20%", "url": "https://shop.example/sale"}}))
        for i in range(start, stop)]


async def otp_load(url: str, rate: float, window: float, users: int, drained, p: Point) -> float:
    """OTP events at ``rate``/s for ``window`` s or until ``drained()``; returns the
    window's start (wall clock)."""
    import redis.asyncio as aioredis

    from pipeline.api.producer import TopicWriter
    from pipeline.transport.keys import Keys

    client = aioredis.Redis.from_url(url)
    writer = TopicWriter(client, Keys(), PARTITIONS)
    topic = events_for("high")  # where the API writes an OTP (pipeline/topics.py event_topic)
    await writer.partitions(topic)
    rng = random.Random(3)
    loop = asyncio.get_running_loop()
    start_wall, start = time.time(), loop.time()
    next_check = start
    i = 0
    try:
        while True:
            due = start + i / rate
            now = loop.time()
            if now >= start + window:
                break
            if now >= next_check:
                next_check = now + 0.5
                if drained():
                    break
            if due > now:
                await asyncio.sleep(due - now)
            p.send_late_ms = max(p.send_late_ms, (loop.time() - due) * 1000)
            user = f"u{rng.randrange(users)}"
            ev = {"biz_key": f"{OTP_PREFIX}{i}", "category": "otp", "template": "otp", "channels": ["sms"],
                  "recipients": [user], "params": {"code": f"{rng.randrange(10**6):06d}"}}
            ev["accepted_at"] = p.accepted[ev["biz_key"]] = time.time()
            await writer.send([(topic, event_key(ev["biz_key"], ev.get("recipients")), orjson.dumps(ev), [])])
            i += 1
    finally:
        p.sent = i
        p.window_s = time.time() - start_wall
        await client.aclose()
    return start_wall


def run_point(label: str, batch_low: Optional[int], backlog: int, *, rate: float, window: float, users: int,
              profile: bool = False, priority_worker: bool = False, log=print) -> Point:
    import redis

    p = Point(label, batch_low, backlog, rate)
    extra = ""
    if backlog:
        # the backlog is sent, not capped: neither the daily limit nor the sliding
        # windows (1 in 10 minutes, 3 an hour: they refused ~90% of it) apply
        extra += '\n[categories.marketing]\ndaily_limit = "exempt"\nrate_windows = []\n'
    if batch_low:
        extra += f"\n[lane_batch_size]\nlow = {batch_low}\n"
    with tempfile.TemporaryDirectory(prefix="notify-otp-") as tmpdir:
        tmp = Path(tmpdir)
        server = EmbeddedRedis(tmp / "redis").start()
        workers = ShimWorkers(server.url, tmp, extra, priority_worker)
        r = redis.Redis.from_url(server.url)
        try:
            asyncio.run(produce_async(server.url, PREFERENCES, make_users(users), partitions=PARTITIONS))
            workers.start("run")
            pids = {f"worker {i}": pr.pid for i, pr in enumerate(workers.procs)}
            pids["redis"] = server.proc.pid
            for group in [app_id("main")] + ([app_id("priority")] if priority_worker else []):
                wait(lambda: (lambda hw, cm: hw and hw == cm)(*Lag(r, [PREFERENCES], group).total()), 180,
                     "preferences applied", workers.check, 0.2)
            log(f"otp[{label}]: workers up, {users} users applied")
            events_lag = Lag(r, [EVENTS])
            if backlog:
                t0 = time.monotonic()
                for s in range(0, backlog, 50_000):
                    asyncio.run(produce_async(server.url, EVENTS, backlog_events(s, min(backlog, s + 50_000), users),
                                              partitions=PARTITIONS))
                p.expand_s = time.monotonic() - t0
                hw, cm = events_lag.total()
                log(f"otp[{label}]: {backlog} marketing events written in {p.expand_s:.1f}s ({hw - cm} not expanded yet)")
            low_lag = Lag(r, [EVENTS, "notify.intents.low", "notify.send.email.low"])

            def drained() -> bool:
                workers.check()
                if not backlog:
                    return False
                hw, cm = low_lag.total()
                return hw == cm

            cpu0 = {k: cpu_seconds(v) for k, v in pids.items()}
            busy0, self0 = machine_busy(), cpu_seconds(os.getpid())
            raw = OUT / f"otp-profile-{batch_low or 'idle'}.raw"
            spy = subprocess.Popen(
                [str(Path(sys.executable).with_name("py-spy")), "record", "-p", str(workers.procs[0].pid), "-r", "100",
                 "--nonblocking", "-f", "raw", "-o", str(raw)],
                stdout=subprocess.DEVNULL, stderr=open(OUT / "otp-pyspy.log", "w")) if profile else None
            t_start = asyncio.run(otp_load(server.url, rate, window, users, drained, p))
            if spy:
                spy.send_signal(2)  # SIGINT: py-spy writes what it sampled in the window
                spy.wait(60)
                if raw.exists() and raw.stat().st_size:
                    p.profile = summarize_raw(raw, top=12) + [""] + summarize_inclusive(raw, top=15)
            t_end = t_start + p.window_s
            p.cpu = {k: cpu_seconds(v) - cpu0[k] for k, v in pids.items()}
            p.other_cpu = max(0.0, machine_busy() - busy0 - sum(p.cpu.values()) - (cpu_seconds(os.getpid()) - self0))
            hw, cm = low_lag.total()
            p.backlog_left = hw - cm
            log(f"otp[{label}]: {p.sent} OTPs in {p.window_s:.1f}s; waiting for their provider calls")
            probes = Probes(workers.outs)

            def all_called() -> bool:
                probes.read()
                return sum(1 for s in probes.stages.values() if "call" in s) >= p.sent

            try:
                wait(all_called, 60, "every OTP's provider call", workers.check, 0.3)
            except RuntimeError as exc:
                log(f"otp[{label}]: {exc}")
            time.sleep(0.5)
            probes.read()
            # drain rate over the whole seconds inside the window
            p.low_window_s = max(1, int(t_end) - int(t_start) - 1)
            p.low_calls = probes.low_calls(int(t_start) + 1, int(t_end))
            for bk, st in probes.stages.items():
                acc = p.accepted.get(bk)
                if "call" in st and acc:
                    p.lat_ms.append((st["call"] - acc) * 1000)
                    prev = acc
                    for s in STAGES:
                        if s in st:
                            p.stages_ms.setdefault(s, []).append((st[s] - prev) * 1000)
                            prev = st[s]
            p.called = len(p.lat_ms)
        finally:
            workers.stop()
            r.close()
            server.stop()
    return p


# ---------------------------------------------------------------------------
# report


def _ms(x: float) -> str:
    return f"{x:,.1f}"


def verdict(p99: float, target: float) -> str:
    return "met" if p99 <= target else f"**MISSED** by {p99 - target:,.0f} ms ({p99 / target:.1f}x)"


def report(idle: Point, curve: list[Point], args, default_batch: int) -> str:
    lines = [
        f"Machine: {os.cpu_count()} cores. Embedded valkey-server (AOF everysec), {WORKERS} workers, {PARTITIONS} "
        "partitions, in-process fake providers at zero latency, provider token buckets lifted (`bench_config` of "
        "bench/e2e.py). OTP events (category otp, sms, one recipient) written one at a time at "
        f"{args.rate:g}/s to `notify.events.high` through the API's write path (`TopicWriter`, the Lua PRODUCE the "
        "API runs before its 202; the API writes high-priority categories there), `accepted_at` stamped just before "
        "the write; latency = provider call (fake `send` entered, timestamped in the worker) − `accepted_at`. "
        "The HTTP hop itself is measured by bench/ingest.py."
        + (" **Priority worker**: the two workers run `NOTIFY_ROLE=main` and a third process runs the high-priority "
           "path (`NOTIFY_ROLE=priority`: expand.high, guard.high, lane.*.high; pipeline/roles.py); the main "
           f"workers lower their CPU priority: scheduling class `{load_settings().env.main_sched}` (`NOTIFY_MAIN_SCHED`) and nice "
           f"+{load_settings().env.main_nice} (`NOTIFY_MAIN_NICE`)."
           if args.priority_worker else ""),
        "",
        f"(b): a backlog of **{args.backlog:,} marketing events** (one recipient, e-mail only: one low-lane delivery "
        "each; marketing's daily limit and sliding windows lifted for the run) written to `notify.events` first, the workers draining it "
        "as it is written; the window starts once it is all written and lasts "
        f"{args.window:g} s or until the backlog is drained (nothing left in `notify.events`, `notify.intents.low` "
        "or `notify.send.email.low`). The knob: `[lane_batch_size] low = N` "
        f"(config/defaults.toml; unset = the channel's `lane_batch_size`, {default_batch}).",
        "",
        "| run | low-lane batch | window s | OTPs sent / called | OTP p50 ms | p99 ms | max ms "
        "| marketing drained /s | backlog left | CPU w0 / w1" + (" / priority" if args.priority_worker else "")
        + " / redis s | other CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in [idle, *curve]:
        cpu = " / ".join(f"{p.cpu.get(k, 0):.0f}" for k in p.cpu)
        lines.append(
            f"| {p.label} | {p.batch_low or f'{default_batch} (default)'} | {p.window_s:.0f} | {p.sent} / {p.called} "
            f"| {_ms(pct(p.lat_ms, 50))} | **{_ms(pct(p.lat_ms, 99))}** | {_ms(max(p.lat_ms or [float('nan')]))} "
            f"| {p.drain_rate:,.0f} | {p.backlog_left:,} | {cpu} | {p.other_cpu:.0f} |")
    lines += ["", f"Targets: OTP p99 ≤ {TARGET_IDLE_P99_MS:g} ms idle: {verdict(pct(idle.lat_ms, 99), TARGET_IDLE_P99_MS)}."]
    for p in curve:
        lines.append(f"≤ {TARGET_BACKLOG_P99_MS:g} ms while the backlog drains, low batch "
                     f"{p.batch_low or default_batch}: {verdict(pct(p.lat_ms, 99), TARGET_BACKLOG_P99_MS)}.")
    lines += ["", "Where the time goes (per OTP, between consecutive timestamps; p50 / p99 / max ms):", "",
              "| stage | " + " | ".join(p.label for p in [idle, *curve]) + " |",
              "|---|" + "---:|" * (1 + len(curve))]
    for s in STAGES:
        cells = []
        for p in [idle, *curve]:
            xs = p.stages_ms.get(s, [])
            if not xs:
                cells.append("not measured")
                continue
            cells.append(f"{_ms(pct(xs, 50))} / {_ms(pct(xs, 99))} / {_ms(max(xs or [float('nan')]))}")
        lines.append(f"| {STAGE_NAMES[s]} | " + " | ".join(cells) + " |")
    late = max(p.send_late_ms for p in [idle, *curve])
    busy = [p for p in [idle, *curve] if p.window_s and p.other_cpu / (p.window_s * (os.cpu_count() or 1)) > 0.05]
    lines += ["", f"Load generator's worst lateness against its schedule: {late:,.0f} ms."
              + (" **Other processes used > 5% of the machine during " + ", ".join(p.label for p in busy)
                 + ": the figures are pessimistic.**" if busy else "")]
    for p in [idle, *curve]:
        if p.profile:
            lines += ["", f"Profile of worker 0 during the window of {p.label} (py-spy, 100 Hz, waiting excluded):", "",
                      "```", *p.profile, "```"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backlog", type=int, default=100_000, help="marketing events in the backlog")
    ap.add_argument("--batches", default="10,50,100,500", help="low-lane batch sizes of the curve")
    ap.add_argument("--rate", type=float, default=20.0, help="OTP events per second")
    ap.add_argument("--window", type=float, default=60.0, help="s of OTPs while the backlog drains (at most)")
    ap.add_argument("--idle-window", type=float, default=30.0, help="s of OTPs on the idle pipeline")
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--quick", action="store_true", help="sanity check: 20,000 backlog, 10 s windows, "
                    "batches 10,500, 1,000 users; writes nothing to RESULTS.md")
    ap.add_argument("--no-write", action="store_true", help="print, do not write bench/RESULTS.md")
    ap.add_argument("--section", default="otp", help="section of bench/RESULTS.md to write (e.g. otp-full for"
                    " --backlog 1000000, kept next to the default curve)")
    ap.add_argument("--profile", action="store_true", help="py-spy on worker 0 during every window")
    ap.add_argument("--main-nice", type=int, help="with --priority-worker: the main workers' nice increment "
                    "(NOTIFY_MAIN_NICE; default pipeline/roles.py MAIN_NICE, 0 = none)")
    ap.add_argument("--priority-worker", action="store_true",
                    help="the high-priority path in a third process (NOTIFY_ROLE=priority beside two 'main' workers, "
                         "pipeline/roles.py) instead of two workers running everything")
    ap.add_argument("--worker-shim", metavar="OUT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_shim:
        return worker_shim(args.worker_shim)
    if args.quick:
        args.backlog, args.batches, args.window, args.idle_window, args.users = 20_000, "10,500", 10.0, 10.0, 1000
        args.no_write = True
    OUT.mkdir(parents=True, exist_ok=True)
    from config.settings import load_settings

    default_batch = load_settings(env={}).channels["email"].lane_batch_size
    batches = [int(b) for b in args.batches.split(",") if b]
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)

    if args.main_nice is not None:
        os.environ["NOTIFY_MAIN_NICE"] = str(args.main_nice)  # the workers inherit it
    kw = dict(rate=args.rate, users=args.users, profile=args.profile, priority_worker=args.priority_worker, log=log)
    idle = run_point("(a) idle", None, 0, window=args.idle_window, **kw)
    log(f"idle: p50 {pct(idle.lat_ms, 50):.1f} p99 {pct(idle.lat_ms, 99):.1f} max {max(idle.lat_ms or [0]):.1f} ms")
    curve = []
    for b in batches:
        p = run_point(f"(b) low batch {b}", b, args.backlog, window=args.window, **kw)
        log(f"batch {b}: drain {p.drain_rate:,.0f}/s, OTP p50 {pct(p.lat_ms, 50):.1f} p99 {pct(p.lat_ms, 99):.1f} "
            f"max {max(p.lat_ms or [0]):.1f} ms")
        curve.append(p)
    body = report(idle, curve, args, default_batch)
    print(body)
    if not args.no_write:
        defaults = {"backlog": 100_000, "batches": "10,50,100,500", "rate": 20.0, "window": 60.0,
                    "idle_window": 30.0, "users": 10_000}
        command = "python bench/otp.py" + "".join(
            f" --{k.replace('_', '-')} {getattr(args, k):g}" if isinstance(v, float) else
            f" --{k.replace('_', '-')} {getattr(args, k)}"
            for k, v in defaults.items() if getattr(args, k) != v) + (" --profile" if args.profile else "") + (
            " --priority-worker" if args.priority_worker else "") + (
            f" --main-nice {args.main_nice}" if args.main_nice is not None else "") + (
            f" --section {args.section}" if args.section != "otp" else "")
        from bench.results import write_section

        write_section(args.section, command, body)


if __name__ == "__main__":
    main()
