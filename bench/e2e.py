"""Benchmark (not a test): the whole pipeline end to end on the embedded server
(valkey-server, AOF everysec), two worker processes splitting 8 partitions, the
in-process fake providers at zero latency.

    python bench/e2e.py [--events 20000] [--profile] [--calls] [--workers 2]

1. Users: phone/email preferences (some opted out of marketing, a few in quiet
   hours) and push devices go through notify.preferences / notify.devices; two
   workers apply them to the tables and stop (the tables then recover from their
   changelogs on the measured start, as after any restart).
2. A realistic mix of events (otp / transaction / marketing, several recipients,
   ~5% duplicates) is produced to notify.events *before* the workers start.
3. Two workers start; the clock runs from the first event consumed (first intent
   produced) to the last change of the record store (SQLite), once every topic's
   lag is zero. CPU (utime+stime from /proc) of each worker and of the server is
   taken over the same window.

``--calls`` runs the measured workers under cProfile and reports the Python
function calls per notification (both workers, their start and table recovery
included): a count this VM's noise does not move, for changes of a few % that its
timings (2x swings between hours) cannot show. The run's timings are then
cProfile's, not the pipeline's.

``--profile`` attaches ``py-spy record`` to every worker for ``--profile-s``
seconds (10) and writes bench/out/e2e-profile.svg (worker 0's flamegraph),
bench/out/e2e-profile.txt (functions by own and inclusive time, every worker)
and prints where the workers' CPU goes by part of the pipeline (bench/parts.py).

Run by bench/compare.py, which writes the "e2e" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import orjson

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))

from bench import parts  # noqa: E402
from pipeline.cli.mixes import make_events, make_users  # noqa: E402
from pipeline.embedded import EmbeddedRedis  # noqa: E402
from pipeline.reader import outcome_values  # noqa: E402
from pipeline.procs import stop_all, worker_env  # noqa: E402
from pipeline.topics import ALL, DEVICES, DLQ, EVENTS, PREFERENCES, UNREAD, event_key  # noqa: E402
from pipeline.transport import committed  # noqa: E402
from pipeline.transport.keys import Keys  # noqa: E402
from tests.transport.helpers import produce_async  # noqa: E402

PARTITIONS = 8
WORKERS = 2  # --workers
GROUP = "notify"
CLK = os.sysconf("SC_CLK_TCK")

# ---------------------------------------------------------------------------
# the mix: pipeline/cli/mixes.py (shared with bench/soak.py and bench/celery_peer.py)


# ---------------------------------------------------------------------------
# measuring


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (and of its children that were reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / CLK  # utime stime cutime cstime
    except (FileNotFoundError, ProcessLookupError):
        return 0.0


def machine_busy() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / CLK


def tree_cpu(pid: int) -> float:
    """CPU of ``pid`` and its live children (celery prefork children)."""
    total = cpu_seconds(pid)
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        kids = []
    return total + sum(tree_cpu(int(k)) for k in kids)


class Lag:
    """Highwater and committed offset of every consumed topic-partition."""

    def __init__(self, r, topics: list[str], group: str = GROUP):
        self.r = r
        self.group = group
        self.keys = Keys()
        self.tps = [(t, p) for t in topics for p in range(PARTITIONS)]

    def total(self) -> tuple[int, int]:
        hw = self.r.mget([self.keys.counter(t, p) for t, p in self.tps])
        cm = committed.read_sync(self.r, self.keys, self.group, self.tps)
        return sum(int(x or 0) for x in hw), sum(int(x or 0) for x in cm)

    def per_topic(self) -> dict[str, tuple[int, int]]:
        hw = self.r.mget([self.keys.counter(t, p) for t, p in self.tps])
        cm = committed.read_sync(self.r, self.keys, self.group, self.tps)
        out: dict[str, list[int]] = {}
        for (t, _p), a, b in zip(self.tps, hw, cm):
            acc = out.setdefault(t, [0, 0])
            acc[0] += int(a or 0)
            acc[1] += int(b or 0)
        return {t: (a, b) for t, (a, b) in out.items()}


#: seconds between the lines of bench/out/e2e-trace.txt
TRACE_S = float(os.environ.get("E2E_TRACE_S", 2))


class RecordWatch:
    """Watches the record store without scanning it: ``PRAGMA data_version`` on one
    persistent read-only connection changes whenever another connection commits."""

    def __init__(self, db: Path):
        self.db = db
        self.con: Optional[sqlite3.Connection] = None

    def _open(self) -> Optional[sqlite3.Connection]:
        if self.con is None and self.db.exists() and Path(str(self.db) + "-shm").exists():
            try:
                self.con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5)
                self.con.execute("SELECT 1 FROM notify_record LIMIT 1").fetchall()
            except sqlite3.OperationalError:
                self.con = None
        return self.con

    def version(self) -> int:
        con = self._open()
        return con.execute("PRAGMA data_version").fetchone()[0] if con else 0

    def counts(self) -> tuple[int, int]:
        """(records, records still PENDING)"""
        con = self._open()
        if not con:
            return 0, 0
        n, pending = con.execute("SELECT count(*), total(status = 'PENDING') FROM notify_record").fetchone()
        return int(n), int(pending)

    def close(self) -> None:
        if self.con:
            self.con.close()


def status_counts(db: Path) -> dict:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        rows = con.execute("SELECT status, coalesce(reason, ''), count(*) FROM notify_record GROUP BY 1, 2").fetchall()
    finally:
        con.close()
    return {f"{s}{'/' + r if r else ''}": n for s, r, n in sorted(rows, key=lambda x: -x[2])}


def failed_rows(db: Path, limit: int = 5) -> list[dict]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        out = []
        for did, channel, reason, retries in con.execute(
                "SELECT delivery_id, channel, reason, retry_count FROM notify_record WHERE status = 'FAILED' LIMIT ?",
                (limit,)):
            errs = [e for (e,) in con.execute("SELECT coalesce(error, result) FROM attempts WHERE delivery_id = ?"
                                               " ORDER BY seq", (did,))]
            out.append({"channel": channel, "reason": reason, "retry_count": retries, "attempts": errs})
        return out
    finally:
        con.close()


def outcome_counts(r) -> collections.Counter:
    keys = Keys()
    c: collections.Counter = collections.Counter()
    for p in range(PARTITIONS):
        start = "-"
        while True:
            batch = r.xrange(keys.stream("notify.outcomes", p), min=start, count=10000)
            for o in (orjson.loads(v) for _id, f in batch for v in outcome_values(f[b"v"])):
                c[(o["state"], o.get("reason") or "")] += 1
            if len(batch) < 10000:
                break
            start = "(" + batch[-1][0].decode()
    return c


# ---------------------------------------------------------------------------
# profile


def _samples(raws: list[Path]):
    """(frames named as :func:`_frame_name` names them, count) of each stack in
    py-spy's raw files."""
    for frames, n in parts.samples(raws):
        yield [_frame_name(f) for f in frames], n


def summarize_raw(raws: list[Path], top: int = 15) -> list[str]:
    """Own (leaf) and inclusive share per function from py-spy's collapsed stacks."""
    own: collections.Counter = collections.Counter()
    incl: collections.Counter = collections.Counter()
    total = 0
    for frames, n in _samples(raws):
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    lines = [f"{'own%':>6} {'incl%':>6}  function (file)   [{total} samples, {len(raws)} worker(s), idle excluded]"]
    for name, n in own.most_common(top):
        lines.append(f"{100 * n / total:6.1f} {100 * incl[name] / total:6.1f}  {name}")
    return lines


def summarize_inclusive(raws: list[Path], top: int = 25,
                        prefixes=("agents/", "pipeline/", "adapters/", "tables/")) -> list[str]:
    incl: collections.Counter = collections.Counter()
    total = 0
    for frames, n in _samples(raws):
        total += n
        for f in set(frames):
            incl[f] += n
    lines = [f"{'incl%':>6}  function (file)   [project code only]"]
    shown = 0
    for name, n in incl.most_common():
        if name.startswith(prefixes) and not name.startswith("pipeline/cli/"):  # the command line around it
            lines.append(f"{100 * n / total:6.1f}  {name}")
            shown += 1
            if shown >= top:
                break
    return lines


def _frame_name(frame: str) -> str:
    # py-spy raw frames: "function (path/to/file.py:line)"
    fn, _, loc = frame.partition(" (")
    path = loc.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", str(ROOT) + "/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{fn}"


def start_profile(pids: list[int], seconds: int) -> list[subprocess.Popen]:
    """py-spy on each worker: raw stacks (bench/out/e2e-profile-w<i>.raw), and worker
    0's flamegraph."""
    pyspy = str(Path(sys.executable).with_name("py-spy"))
    common = ["record", "-d", str(seconds), "-r", "100", "--nonblocking"]
    spies = [subprocess.Popen([pyspy, *common, "-p", str(pids[0]), "-f", "flamegraph",
                               "-o", str(OUT / "e2e-profile.svg")],
                              stdout=subprocess.DEVNULL, stderr=open(OUT / "e2e-pyspy-svg.log", "w"))]
    for i, pid in enumerate(pids):
        profile_raw(i).unlink(missing_ok=True)  # no samples of an earlier run
        spies.append(subprocess.Popen([pyspy, *common, "-p", str(pid), "-f", "raw", "-o", str(profile_raw(i))],
                                      stdout=subprocess.DEVNULL, stderr=open(OUT / f"e2e-pyspy-raw-w{i}.log", "w")))
    return spies


def profile_raw(worker: int) -> Path:
    return OUT / f"e2e-profile-w{worker}.raw"


# ---------------------------------------------------------------------------
# --diagnose: workers with wait probes (timing wrappers; no pipeline code changed)


def worker_shim(out: str) -> None:
    """Run one pipeline worker with timing probes around the awaits that can stall
    it, written to ``out`` (JSON) every 2 s: calls, total and max seconds, by caller."""
    import threading

    from faust.transport.consumer import Consumer

    from pipeline.store import RecordStore
    from pipeline.transport.producer import Producer

    stats: dict = {}

    def probe(cls, name: str) -> None:
        orig = getattr(cls, name)

        async def wrapper(*a, **k):
            caller = sys._getframe(1).f_code.co_name
            t = time.perf_counter()
            try:
                return await orig(*a, **k)
            finally:
                d = time.perf_counter() - t
                st = stats.setdefault(f"{cls.__name__}.{name} <- {caller}", [0, 0.0, 0.0])
                st[0] += 1
                st[1] += d
                st[2] = max(st[2], d)

        setattr(cls, name, wrapper)

    probe(Producer, "flush")
    probe(Producer, "_write_groups")
    probe(Consumer, "_commit_offsets")
    probe(RecordStore, "apply_outcomes")

    import agents

    register = agents.register_agents

    def register_with_probe(app):  # the worker's app, as `notify worker` builds it
        parts = register(app)
        app.task(loop_lag)
        return parts

    agents.register_agents = register_with_probe

    async def loop_lag() -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(0.01)
            d = loop.time() - t - 0.01
            st = stats.setdefault("event loop lag (10 ms sleeps)", [0, 0.0, 0.0])
            st[0] += 1
            st[1] += d
            st[2] = max(st[2], d)

    def dump() -> None:
        while True:
            time.sleep(2)
            snap = {k: {"calls": v[0], "total_s": round(v[1], 3), "max_s": round(v[2], 3)}
                    for k, v in list(stats.items())}
            Path(out).write_text(json.dumps(snap, indent=1))

    threading.Thread(target=dump, daemon=True).start()
    from pipeline.cli import main as cli_main

    sys.exit(cli_main(["worker", "-l", "warn"]))


def read_probes() -> list[str]:
    lines = [f"{'calls':>7} {'total s':>8} {'max s':>7}  await <- caller   [both workers]"]
    merged: dict = {}
    for i in range(WORKERS):
        f = OUT / f"e2e-probes-w{i}.json"
        if f.exists():
            for k, v in json.loads(f.read_text()).items():
                m = merged.setdefault(k, [0, 0.0, 0.0])
                m[0] += v["calls"]
                m[1] += v["total_s"]
                m[2] = max(m[2], v["max_s"])
    for k, (calls, total, mx) in sorted(merged.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"{calls:7d} {total:8.1f} {mx:7.2f}  {k}")
    return lines


# ---------------------------------------------------------------------------
# the run


@dataclass
class Result:
    events: int
    users: int
    notifications: int = 0  # records + duplicates filtered (user x channel decisions)
    records: int = 0
    duplicates: int = 0
    seconds: float = 0.0
    rate: float = 0.0
    events_rate: float = 0.0
    cpu: dict = field(default_factory=dict)  # component -> CPU seconds in the window
    statuses: dict = field(default_factory=dict)
    outcomes: int = 0
    produce_s: float = 0.0
    startup_s: float = 0.0
    calls: int = 0  # --calls: Python function calls of the workers (cProfile)
    profile: list = field(default_factory=list)
    profile_incl: list = field(default_factory=list)
    parts: list = field(default_factory=list)  # --profile: the workers' CPU by part (bench/parts.py)
    hung_on_stop: list = field(default_factory=list)
    failed: list = field(default_factory=list)  # a few FAILED records with their attempts
    probes: list = field(default_factory=list)  # --diagnose: time spent in awaits that can stall
    overrides: list = field(default_factory=list)  # settings changed for the run (bench_config)
    other_cpu: float = 0.0  # CPU s used by processes outside this benchmark during the window
    written: dict = field(default_factory=dict)  # topic -> stream entries written during the run
    redis_cmds: dict = field(default_factory=dict)  # command -> [calls, usec] during the run


def written_entries(r, ns: str = "nfs") -> dict:
    """topic → entries ever written (the dense-offset counters ``<ns>:{<topic>|<p>}:n``,
    summed over partitions)."""
    keys = list(r.scan_iter(match=f"{ns}:{{*}}:n", count=1000))
    out: collections.Counter = collections.Counter()
    for k, v in zip(keys, r.mget(keys) if keys else []):
        topic = k.decode().split("{", 1)[1].rsplit("|", 1)[0]
        out[topic] += int(v or 0)
    return dict(out)


def command_stats(r) -> dict:
    """command → [calls, usec] from INFO commandstats (server-side time only)."""
    return {name.removeprefix("cmdstat_"): [int(v["calls"]), int(v["usec"])]
            for name, v in r.info("commandstats").items()}


def delta(after: dict, before: dict) -> dict:
    """``after - before`` of :func:`written_entries` or :func:`command_stats` results."""
    def sub(a, b):
        return [x - y for x, y in zip(a, b)] if isinstance(a, list) else a - b

    zero = lambda v: [0] * len(v) if isinstance(v, list) else 0  # noqa: E731
    out = {k: sub(v, before.get(k, zero(v))) for k, v in after.items()}
    return {k: v for k, v in out.items() if (any(v) if isinstance(v, list) else v)}


def python_calls(profiles: list) -> int:
    """Python function calls in cProfile output files (``--calls``; bench/real.py's)."""
    import pstats

    return sum(pstats.Stats(str(p)).total_calls for p in profiles)


def cost_lines(res: "Result") -> list[str]:
    """Where a notification's cost goes: stream entries written per notification by
    topic, Redis's own time per command, and CPU per component, per notification."""
    n = res.notifications or 1
    total = sum(res.written.values())
    lines = [f"Per notification over the run ({n:,} notifications): "
             f"{total / n:.2f} stream entries written ({total:,}), "
             + ", ".join(f"{k} {1e6 * v / n:,.0f} µs" for k, v in res.cpu.items()) + " of CPU.", "",
             "| topic | entries written | per notification |", "|---|---:|---:|"]
    for topic, c in sorted(res.written.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {topic} | {c:,} | {c / n:.2f} |")
    busy = sum(us for _c, us in res.redis_cmds.values())
    lines += ["", f"Redis, time inside commands (INFO commandstats): {busy / n:,.0f} µs per notification; "
              "by command: " + ", ".join(
                  f"{cmd} {calls:,} calls {us / max(calls, 1):,.1f} µs each ({us / n:,.0f} µs/notification)"
                  for cmd, (calls, us) in sorted(res.redis_cmds.items(), key=lambda kv: -kv[1][1])[:6]) + "."]
    return lines


def bench_config(tmp: Path) -> Optional[Path]:
    """A user config (NOTIFY_CONFIG) for the run, written only when the defaults have
    these settings: every provider's token bucket (``[providers.*]``) lifted, since the
    fakes answer at zero latency and this measures the pipeline, not quotas; and
    ``receipt_poll_s = 0`` (no status poll 60 s after ACCEPTED: it is reconciliation,
    not sending, and would stretch the measured window by its delay)."""
    import tomllib

    from config.settings import DEFAULTS_PATH

    defaults = tomllib.loads(DEFAULTS_PATH.read_text())
    text = ""
    if "receipt_poll_s" in defaults:
        text += "receipt_poll_s = 0\n\n"
    for n in defaults.get("providers") or {}:
        text += f"[providers.{n}]\nrate = 1000000\nburst = 1000000\n\n"
    if not text:
        return None
    path = tmp / "bench-config.toml"
    path.write_text(text)
    return path


class Workers:
    def __init__(self, url: str, tmp: Path, diagnose: bool = False, loop: Optional[str] = None,
                 calls: bool = False):
        self.diagnose = diagnose
        self.calls = calls
        config = self.config = bench_config(tmp)
        self.env = worker_env(
            os.environ, url, workers=WORKERS, NOTIFY_CONFIG=config, NOTIFY_DATA_DIR=tmp / "data",
            NOTIFY_DB=tmp / "records.db", NOTIFY_PARTITIONS=PARTITIONS, NOTIFY_LEASE=3,
            NOTIFY_PROVIDERS="fake", PYTHONPATH=ROOT, NOTIFY_LOOP=loop or None,
        )
        self.procs: list[subprocess.Popen] = []

    def start(self, tag: str) -> None:
        for i in range(WORKERS):
            log = open(OUT / f"e2e-{tag}-w{i}.log", "w")
            cmd = [sys.executable, "-m", "pipeline.cli", "worker", "-l", "warn"]
            if self.diagnose and tag == "run":
                cmd = [sys.executable, str(Path(__file__).resolve()), "--worker-shim", str(OUT / f"e2e-probes-w{i}.json")]
            elif self.calls and tag == "run":
                (OUT / f"e2e-calls-w{i}.prof").unlink(missing_ok=True)
                cmd[1:2] = ["-m", "cProfile", "-o", str(OUT / f"e2e-calls-w{i}.prof"), "-m"]
            self.procs.append(subprocess.Popen(
                cmd, cwd=str(ROOT),
                env=worker_env(self.env, index=i), stdout=log, stderr=subprocess.STDOUT))

    def check(self) -> None:
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                raise RuntimeError(f"worker {i} exited with {p.returncode}; see bench/out/e2e-*-w{i}.log")

    def stop(self, grace: float = 10.0) -> list[str]:
        """SIGTERM, then SIGKILL after ``grace`` s; a worker still running then gets its
        stacks dumped (py-spy dump) to bench/out/e2e-stop-w<i>.txt. Returns the hung ones."""
        def dump(p: subprocess.Popen) -> None:
            i = self.procs.index(p)
            pyspy = str(Path(sys.executable).with_name("py-spy"))
            with open(OUT / f"e2e-stop-w{i}.txt", "w") as f:
                subprocess.run([pyspy, "dump", "-p", str(p.pid)], stdout=f, stderr=subprocess.STDOUT, timeout=30)

        hung = [f"worker {self.procs.index(p)}" for p in stop_all(self.procs, grace, on_hung=dump)]
        self.procs = []
        return hung


def wait(cond, timeout: float, what: str, check=None, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if check:
            check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def run(n_events: int, *, profile: bool = False, diagnose: bool = False, n_users: Optional[int] = None,
        seed: int = 8, timeout: float = 900.0, loop: Optional[str] = None, log=print, calls: bool = False,
        profile_s: int = 10) -> Result:
    import redis

    t_begin = time.monotonic()
    _log = log

    def log(msg: str) -> None:
        _log(f"[{time.monotonic() - t_begin:6.1f}s] {msg}")

    OUT.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    n_users = n_users or max(1000, n_events)
    users = make_users(n_users, rng)
    events = make_events(n_events, users, rng)
    res = Result(events=n_events, users=n_users)
    hour = time.gmtime().tm_hour
    with tempfile.TemporaryDirectory(prefix="notify-e2e-") as tmpdir:
        tmp = Path(tmpdir)
        server = EmbeddedRedis(tmp / "redis").start()  # AOF everysec
        workers = Workers(server.url, tmp, diagnose, loop, calls)
        if workers.config:
            import tomllib

            cfg = tomllib.loads(workers.config.read_text())
            if cfg.get("providers"):
                res.overrides.append("provider token buckets (`[providers.*]`: " + ", ".join(sorted(cfg["providers"]))
                                     + ") lifted: the fakes have no quota, and the peer has no rate limiter either")
            if "receipt_poll_s" in cfg:
                res.overrides.append("`receipt_poll_s = 0`: no receipt status poll 60 s after ACCEPTED (reconciliation, "
                                     "not sending; it would stretch the window by its delay); the peer polls nothing")
        for f in OUT.glob("e2e-probes-w*.json"):
            f.unlink()
        r = redis.Redis.from_url(server.url)
        try:
            # 1. users: preferences and devices through their topics, applied by the workers
            prefs = [(u.id.encode(), orjson.dumps(u.prefs(hour))) for u in users]
            devs = [(u.id.encode(), orjson.dumps({"user_id": u.id, "token": u.device, "platform": "apns",
                                                   "op": "add", "at": time.time()})) for u in users if u.device]
            asyncio.run(produce_async(server.url, "notify.preferences", prefs, partitions=PARTITIONS))
            asyncio.run(produce_async(server.url, "notify.devices", devs, partitions=PARTITIONS))
            log(f"e2e: {len(prefs)} preferences, {len(devs)} devices produced; loading the tables")
            workers.start("load")
            users_lag = Lag(r, [PREFERENCES, DEVICES])
            wait(lambda: (lambda hw, cm: hw and hw == cm)(*users_lag.total()), 300, "users applied", workers.check, 0.2)
            time.sleep(1.0)  # let the last changelog writes go out
            log("e2e: users applied; stopping the loading workers")
            workers.stop()

            # 2. the events, before the workers start
            items = []
            now = time.time()
            for e in events:
                e = dict(e, accepted_at=now)
                items.append((event_key(e["biz_key"], e.get("recipients")), orjson.dumps(e)))
            t0 = time.perf_counter()
            asyncio.run(produce_async(server.url, EVENTS, items, partitions=PARTITIONS))
            res.produce_s = time.perf_counter() - t0
            log(f"e2e: {len(items)} events produced in {res.produce_s:.1f}s; starting {WORKERS} workers")

            # 3. measure
            consumed = [t for t in ALL if t not in UNREAD]  # no agent reads the DLQ or the outcomes
            lag = Lag(r, consumed)
            # first event consumed = first message any agent produced (intents, dlq, ...)
            produced = [Keys().counter(t, p) for t in ALL if t not in (EVENTS, PREFERENCES, DEVICES)
                        for p in range(PARTITIONS)]
            db = tmp / "records.db"
            written_before, cmds_before = written_entries(r), command_stats(r)
            t_launch = time.monotonic()
            workers.start("run")
            pids = {f"worker {i}": p.pid for i, p in enumerate(workers.procs)}
            pids["redis"] = server.proc.pid

            def sample() -> dict:
                out = {k: cpu_seconds(pid) for k, pid in pids.items()}
                out["_machine"], out["_self"] = machine_busy(), cpu_seconds(os.getpid())
                return out

            while not any(int(x or 0) for x in r.mget(produced)):
                workers.check()
                if time.monotonic() - t_launch > 120:
                    raise RuntimeError("no event consumed within 120s")
                time.sleep(0.005)
            t_start = time.time()
            cpu_start = sample()
            res.startup_s = time.monotonic() - t_launch
            log(f"e2e: first event consumed {res.startup_s:.1f}s after the workers were started")
            spies = start_profile([p.pid for p in workers.procs], profile_s) if profile else []

            watch = RecordWatch(db)
            trace = open(OUT / "e2e-trace.txt", "w")
            trace.write("# t(s)  cpu w0 w1 redis (s)  then per topic: highwater/committed (summed over partitions)\n")
            last_ver, t_last, cpu_last = None, t_start, cpu_start
            quiet_since = None
            deadline = time.monotonic() + timeout
            next_log = next_trace = time.monotonic()
            while True:
                now = time.time()
                ver = watch.version()
                cpu_now = sample()
                if ver != last_ver:
                    last_ver, t_last, cpu_last = ver, now, cpu_now
                    quiet_since = None
                hw, cm = lag.total()
                if hw == cm and ver:
                    n, pending = watch.counts()
                    if n and not pending:
                        quiet_since = quiet_since or time.monotonic()
                        if time.monotonic() - quiet_since > 1.5:
                            break
                else:
                    quiet_since = None
                workers.check()
                mono = time.monotonic()
                if mono > deadline:
                    raise RuntimeError(f"not done after {timeout:.0f}s: lag {hw - cm}, records {watch.counts()}")
                if mono >= next_trace:
                    per = lag.per_topic()
                    n, pending = watch.counts()
                    trace.write(f"{now - t_start:6.1f}  " + " ".join(f"{cpu_now[k]:.1f}" for k in pids)
                                + f" machine {cpu_now['_machine'] - cpu_start['_machine']:.1f}  records {n} ({pending} pending)  "
                                + " ".join(f"{t}={a}/{b}" for t, (a, b) in per.items() if a) + "\n")
                    trace.flush()
                    next_trace += TRACE_S
                if mono >= next_log:
                    n, pending = watch.counts()
                    log(f"e2e: {n} records ({pending} pending), lag {hw - cm}, {now - t_start:.0f}s")
                    next_log += 10
                time.sleep(0.05)
            trace.close()
            n_records, _ = watch.counts()
            watch.close()
            log(f"e2e: done: {n_records} records in {t_last - t_start:.1f}s")
            for s in spies:
                s.wait(60)
            time.sleep(2.5 if diagnose else 0)  # one more probe dump
            res.hung_on_stop = workers.stop()
            if diagnose:
                res.probes = read_probes()
            res.written = delta(written_entries(r), written_before)
            res.redis_cmds = delta(command_stats(r), cmds_before)
            res.seconds = t_last - t_start
            res.cpu = {k: cpu_last[k] - cpu_start[k] for k in pids}
            res.other_cpu = max(0.0, (cpu_last["_machine"] - cpu_start["_machine"]) - sum(res.cpu.values())
                                - (cpu_last["_self"] - cpu_start["_self"]))  # tick accounting: ~±1 s
            res.records = n_records
            res.failed = failed_rows(db)
            res.statuses = status_counts(db)
            oc = outcome_counts(r)
            res.outcomes = sum(oc.values())
            res.duplicates = sum(n for (state, reason), n in oc.items() if reason == "duplicate")
            res.notifications = res.records + res.duplicates
            res.rate = res.notifications / res.seconds
            res.events_rate = n_events / res.seconds
            if profile:
                raws = [profile_raw(i) for i in range(WORKERS)
                        if profile_raw(i).exists() and profile_raw(i).stat().st_size]
                if raws:
                    res.profile = summarize_raw(raws)
                    res.profile_incl = summarize_inclusive(raws)
                    worker_s = sum(v for k, v in res.cpu.items() if k.startswith("worker"))
                    worker_us = 1e6 * worker_s / max(res.notifications, 1)
                    res.parts = parts.part_lines(raws, worker_us)
                    (OUT / "e2e-profile.txt").write_text(
                        "\n".join(res.profile) + "\n\nInclusive, project and library frames:\n"
                        + "\n".join(res.profile_incl) + "\n\n" + "\n".join(res.parts) + "\n")
                else:
                    log("e2e: py-spy wrote no samples; see bench/out/e2e-pyspy-raw-w*.log")
        finally:
            workers.stop()
            r.close()
            server.stop()
            log("e2e: workers and server stopped")
    if calls:
        profs = [OUT / f"e2e-calls-w{i}.prof" for i in range(WORKERS)]
        if all(f.exists() for f in profs) and res.notifications:
            res.calls = python_calls(profs)
        else:
            log("e2e: a worker wrote no cProfile output (bench/out/e2e-calls-w*.prof)")
    return res


def compare_loops(n_events: int, n_users: Optional[int]) -> None:
    """The same run with the workers on asyncio's loop and on uvloop, ABAB."""
    from bench.results import write_section

    rates: dict[str, list[float]] = {"asyncio": [], "uvloop": []}
    cpu: dict[str, list[float]] = {"asyncio": [], "uvloop": []}
    for loop in ("asyncio", "uvloop", "asyncio", "uvloop"):
        r = run(n_events, n_users=n_users, loop=loop)
        rates[loop].append(r.rate)
        cpu[loop].append(sum(v for k, v in r.cpu.items() if k.startswith("worker")) / r.notifications)
        print(f"{loop}: {r.rate:,.0f} notifications/s", flush=True)
    mean = {k: sum(v) / len(v) for k, v in rates.items()}
    per = {k: 1e6 * sum(v) / len(v) for k, v in cpu.items()}
    lines = [
        f"The end-to-end run (`bench/e2e.py`, {n_events:,} events) four times in a row, the workers on asyncio's"
        " event loop and on uvloop alternately (`NOTIFY_LOOP`, pipeline/lean.py).",
        "",
        "| loop | runs (notifications/s) | mean | worker CPU µs per notification |",
        "|---|---|---:|---:|",
        *(f"| {k} | {', '.join(f'{x:,.0f}' for x in rates[k])} | {mean[k]:,.0f} | {per[k]:,.0f} |" for k in rates),
        "",
        f"**uvloop / asyncio: {mean['uvloop'] / mean['asyncio']:.2f}x** throughput,"
        f" {per['asyncio'] / per['uvloop']:.2f}x less worker CPU per notification.",
    ]
    body = "\n".join(lines)
    print(body)
    cmd = "python bench/e2e.py --event-loop both" + (f" --events {n_events}" if n_events != 20_000 else "")
    write_section("loop", cmd, body)


def main() -> None:
    global WORKERS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--users", type=int, default=None, help="default: max(1000, events)")
    ap.add_argument("--profile", action="store_true",
                    help="py-spy on every worker from the first event: functions, and the CPU by part")
    ap.add_argument("--profile-s", type=int, default=10, help="seconds of --profile (default 10)")
    ap.add_argument("--calls", action="store_true",
                    help="the workers under cProfile: Python calls per notification (timings are cProfile's)")
    ap.add_argument("--diagnose", action="store_true", help="workers with timing probes around awaits that stall")
    ap.add_argument("--event-loop", choices=("uvloop", "asyncio", "both"), default=None,
                    help="the workers' event loop (NOTIFY_LOOP); 'both' runs asyncio and uvloop twice each,"
                         " alternating, and writes the 'loop' section of bench/RESULTS.md")
    ap.add_argument("--workers", type=int, default=WORKERS,
                    help="worker processes (default 2); 1 keeps every hop in one process (no intents"
                         " hop between workers)")
    ap.add_argument("--worker-shim", metavar="OUT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    WORKERS = args.workers
    if args.worker_shim:
        return worker_shim(args.worker_shim)
    if args.event_loop == "both":
        return compare_loops(args.events, args.users)
    res = run(args.events, profile=args.profile, diagnose=args.diagnose, n_users=args.users, loop=args.event_loop,
              calls=args.calls, profile_s=args.profile_s)
    print(json.dumps({k: v for k, v in res.__dict__.items() if k not in ("profile", "profile_incl", "parts", "probes")},
                     indent=2))
    if res.calls:
        print(f"Python calls per notification (cProfile, {WORKERS} workers, their start and table recovery"
              f" included): {res.calls / res.notifications:,.0f} ({res.calls:,} calls, {res.notifications:,}"
              " notifications)")
    for block in (cost_lines(res), res.profile, res.profile_incl, res.parts, res.probes):
        if block:
            print("\n".join(block))


if __name__ == "__main__":
    main()
