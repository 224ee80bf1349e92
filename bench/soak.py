"""Soak (issue 6, "Load"): the whole pipeline at a steady rate for minutes, on the
embedded server (valkey-server, AOF everysec), with worker processes on the
in-process fake providers; memory and stream lengths sampled all along.

    python bench/soak.py --minutes 10 --rate 300 [--workers 2] [--users 5000]

* Users (preferences, devices) go through their topics first; then events are fed
  at ``--rate`` events/s (a realistic otp/transaction/marketing mix over a fixed
  population, ~5% repeats of a recent business key so the dedup table churns, and
  every transaction/marketing notification counts against the daily counter).
* Every ``--sample`` s: each worker's RSS (psutil), the server's ``INFO memory``
  ``used_memory``, XLEN and ``MEMORY USAGE`` of the changelog streams (per table)
  and of all streams, the lag of every consumed topic, records in SQLite.
* After a warm-up (first 20% of the feeding time) a least-squares slope per minute
  is fitted to each series over the rest of the feeding time; a series is flat when
  |slope| < 1% of its mean per minute (``--flat``).
* Then the feeding stops, the pipeline drains, and every fed event is checked to
  have its records (one per recipient at least), nothing in the dead-letter stream.

What the soak changes so that a steady state is reachable within minutes (all in
the run's NOTIFY_CONFIG / env, stated in the RESULTS section): the dedup windows
are ``--dedup-window`` s (default 60; the defaults are up to 86,400 s, and the
guard's purge keeps every dedup key for the *longest* window), the purge runs every
15 s (NOTIFY_PURGE_EVERY_S), lane inflight marks are kept 60 s
(NOTIFY_INFLIGHT_KEEP_S), changelog compaction every ``--compact`` s (broker URL
``compact``), daily limits lifted to 100,000 (the counters still count: the work
stays the same all run instead of turning into FILTERED/daily_limit) and the
sliding windows off (FILTERED/rate_window, the same reason), no quiet
hours, ``receipt_poll_s = 0`` and provider buckets lifted (as bench/e2e.py). The
fakes remember every delivery they accepted (adapters/fake.py ``calls`` and
``accepted``: a provider's state, kept on the provider's side in reality); the
workers run through a shim that caps those two dicts at the latest 2,000 entries
(``--full-fake-ledger`` turns the cap off), so the worker's RSS is the pipeline's.
The cap must be reached within the warm-up: with 20,000 the six dicts of a worker
grew by ~2,900 entries a minute each for seven minutes, which accounted for the
"+2-4 MB/min" a 10-minute soak measured (found with SOAK_TYPES, below).

Where a worker's memory grows: ``SOAK_TYPES=<file>`` (live objects by type and
allocated blocks every minute, cheap) or ``SOAK_TRACEMALLOC=<file>`` (top growing
allocation sites; slows the workers several times, so they fall behind).

Writes the ``soak`` section of bench/RESULTS.md (``--no-write`` to skip) and the
samples to bench/out/soak-samples.csv.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
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
from typing import Callable, Optional

import orjson

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))

from pipeline.cli.mixes import DUPLICATES, User, make_users, mix_event  # noqa: E402
from pipeline.embedded import EmbeddedRedis  # noqa: E402
from pipeline.procs import stop_all, worker_env  # noqa: E402
from pipeline.topics import ALL, DEVICES, DLQ, EVENTS, PREFERENCES, UNREAD, event_key  # noqa: E402
from pipeline.transport import committed  # noqa: E402
from pipeline.transport.keys import Keys  # noqa: E402

GROUP = "notify"
FAKE_LEDGER_CAP = 2_000
TABLES = ("preferences", "devices", "dedup", "daily", "timers", "inflight")

# ---------------------------------------------------------------------------
# the worker shim: caps the fakes' ledger, then runs `notify worker`


def worker_shim(loglevel: str) -> None:
    from collections import Counter, OrderedDict

    import adapters.fake as fake

    class CappedCounter(Counter):
        def __setitem__(self, k, v):
            if k not in self and len(self) >= FAKE_LEDGER_CAP:
                del self[next(iter(self))]
            super().__setitem__(k, v)

    class CappedDict(OrderedDict):
        def __setitem__(self, k, v):
            if k not in self and len(self) >= FAKE_LEDGER_CAP:
                self.popitem(last=False)
            super().__setitem__(k, v)

    init = fake.FakeProvider.__init__

    def capped_init(self, *a, **kw):
        init(self, *a, **kw)
        self.calls = CappedCounter()
        self.accepted = CappedDict()

    fake.FakeProvider.__init__ = capped_init
    if os.environ.get("SOAK_TYPES"):
        count_types(Path(os.environ["SOAK_TYPES"]))
    if os.environ.get("SOAK_TRACEMALLOC"):
        trace_growth(Path(os.environ["SOAK_TRACEMALLOC"]), frames=int(os.environ.get("SOAK_TRACEMALLOC_FRAMES", "1")))
    from pipeline.cli import main as cli_main

    sys.exit(cli_main(["worker", "-l", loglevel]))


def count_types(out: Path, first_s: float = 90.0, every_s: float = 60.0) -> None:
    """Which object types grow in a worker (SOAK_TYPES=<file>): live objects
    counted by type (gc.get_objects, no per-allocation cost) every ``every_s``,
    compared with the count at ``first_s``; written to ``<file>.<pid>``."""
    import collections
    import gc
    import threading

    path = out.with_name(f"{out.name}.{os.getpid()}")

    def census() -> collections.Counter:
        return collections.Counter(type(o).__qualname__ for o in gc.get_objects())

    def containers() -> tuple[dict, collections.Counter]:
        """Lengths of the containers the gc sees and of those they hold (a dict
        of str -> int is not tracked, but its holder is), and the atoms reached
        one step from a tracked object (count and bytes by type)."""
        sizes: dict[int, tuple[int, object]] = {}
        atoms: collections.Counter = collections.Counter()
        seen: set[int] = set()
        kinds = (dict, list, set, collections.deque)
        for o in gc.get_objects():
            if isinstance(o, kinds):
                sizes[id(o)] = (len(o), o)
            for r in gc.get_referents(o):
                if id(r) in seen:
                    continue
                if isinstance(r, kinds) and not gc.is_tracked(r):
                    seen.add(id(r))
                    sizes[id(r)] = (len(r), r)
                elif type(r) in (str, bytes, int, float, tuple):
                    seen.add(id(r))
                    atoms[type(r).__name__] += 1
                    atoms[type(r).__name__ + " bytes"] += sys.getsizeof(r)
        return sizes, atoms

    def owner(o: object) -> str:
        names = []
        for ref in gc.get_referrers(o)[:4]:
            if isinstance(ref, dict):
                for holder in gc.get_referrers(ref)[:4]:
                    if getattr(holder, "__dict__", None) is ref:
                        key = next((k for k, v in ref.items() if v is o), "?")
                        names.append(f"{type(holder).__qualname__}.{key}")
            elif not isinstance(ref, (list, type(sys._getframe()))):
                names.append(type(ref).__qualname__)
        return ", ".join(names[:3]) or "?"

    def loop() -> None:
        time.sleep(first_s)
        base, t0, blocks0 = census(), time.monotonic(), sys.getallocatedblocks()
        sizes0, atoms0 = containers()
        sizes0 = {k: n for k, (n, _) in sizes0.items()}
        while True:
            time.sleep(every_s)
            now = census()
            sizes, atoms = containers()
            grown = sorted(((now[k] - base.get(k, 0), k) for k in now), reverse=True)[:20]
            longer = sorted(((n - sizes0.get(i, 0), i) for i, (n, _) in sizes.items()), reverse=True)[:12]
            with open(path, "w") as f:
                f.write(f"{time.monotonic() - t0:.0f}s after the first census; gc-tracked objects"
                        f" {sum(now.values()):,} (first {sum(base.values()):,}); allocated blocks"
                        f" {sys.getallocatedblocks():,} (first {blocks0:,})\n")
                f.writelines(f"{d:+,} {k} ({now[k]:,})\n" for d, k in grown)
                f.write("\natoms one step from a tracked object (now, first):\n")
                f.writelines(f"  {k}: {atoms[k]:,} ({atoms0.get(k, 0):,})\n" for k in sorted(atoms))
                f.write("\ncontainers grown most (len now, growth, type, held by):\n")
                for d, i in longer:
                    n, o = sizes[i]
                    f.write(f"  {n:,} {d:+,} {type(o).__qualname__} {owner(o)}\n")
            del sizes

    threading.Thread(target=loop, daemon=True).start()


def trace_growth(out: Path, first_s: float = 90.0, every_s: float = 60.0, frames: int = 1) -> None:
    """Where a worker's memory grows (SOAK_TRACEMALLOC=<file>): tracemalloc
    snapshots every ``every_s`` compared with the one at ``first_s``; the top
    growing tracebacks are written to ``<file>.<pid>``."""
    import threading
    import tracemalloc

    tracemalloc.start(frames)
    path = out.with_name(f"{out.name}.{os.getpid()}")

    def loop() -> None:
        time.sleep(first_s)
        base = tracemalloc.take_snapshot()
        while True:
            time.sleep(every_s)
            snap = tracemalloc.take_snapshot()
            stats = snap.compare_to(base, "traceback" if frames > 1 else "lineno")[:15]
            with open(path, "w") as f:
                f.write(f"traced {tracemalloc.get_traced_memory()[0] / 2**20:.1f} MB\n")
                for st in stats:
                    f.write(f"\n{st.size_diff / 2**20:+.2f} MB {st.count_diff:+d} blocks\n")
                    f.write("\n".join(f"    {fr.filename}:{fr.lineno}" for fr in st.traceback) + "\n")

    threading.Thread(target=loop, daemon=True).start()


# ---------------------------------------------------------------------------
# the feed


class Feed:
    """An endless mix, bench/e2e.py's (pipeline/cli/mixes.py ``mix_event``); repeats
    draw from the last 2,000 events so they land inside the dedup window."""

    def __init__(self, users: list[User], rng: random.Random):
        self.ids = [u.id for u in users]
        self.rng = rng
        self.recent: list[dict] = []
        self.i = 0
        self.fed: dict[str, tuple] = {}  # biz_key -> recipients
        self.sent = 0
        self.repeats = 0

    def next(self) -> dict:
        rng, ids = self.rng, self.ids
        self.i += 1
        i = self.i
        r = rng.random()
        if r < DUPLICATES and self.recent:
            self.repeats += 1
            return dict(rng.choice(self.recent))
        ev = mix_event(r, rng, ids, i, tag="soak-")
        self.recent.append(ev)
        if len(self.recent) > 2000:
            del self.recent[:1000]
        return ev

    def batch(self, n: int) -> list[tuple[bytes, bytes]]:
        now = time.time()
        out = []
        for _ in range(n):
            e = self.next()
            self.fed[e["biz_key"]] = tuple(e["recipients"])
            out.append((event_key(e["biz_key"], e.get("recipients")), orjson.dumps(dict(e, accepted_at=now))))
        self.sent += n
        return out


class Producer:
    """One Faust producer on the transport, kept open for the whole run."""

    def __init__(self, url: str, partitions: int):
        import faust

        self.app = faust.App(f"soak-feed-{os.getpid()}", broker=url, topic_partitions=partitions,
                             web_enabled=False)
        self.partitions = partitions

    async def start(self, topics: list[str]) -> None:
        await self.app.producer.start()
        for t in topics:
            await self.app.transport.declare(t, self.partitions)

    async def send(self, topic: str, items: list[tuple[bytes, bytes]]) -> None:
        p = self.app.producer
        futs = [await p.send(topic, k, v, None, None, None) for k, v in items]
        await asyncio.gather(*futs)

    async def stop(self) -> None:
        await self.app.producer.stop()
        await self.app.transport.close()


# ---------------------------------------------------------------------------
# sampling


@dataclass
class Sample:
    t: float  # s since feeding started
    phase: str  # feed | drain
    fed: int
    rss: list  # bytes per worker
    used_memory: int
    cl_xlen: int  # changelog streams
    cl_mem: int
    streams_xlen: int  # every stream (topics and changelogs)
    streams_mem: int
    lag: int
    records: int
    aof: int
    per_table: dict = field(default_factory=dict)  # table -> (xlen, mem)


class Sampler:
    def __init__(self, r, partitions: int, pids: list[int], db: Path, aof_dir: Path):
        import psutil

        self.r = r
        self.keys = Keys()
        self.partitions = partitions
        self.procs = [psutil.Process(p) for p in pids]
        self.db = db
        self.aof_dir = aof_dir
        consumed = [t for t in ALL if t not in UNREAD]  # no agent reads the DLQ or the outcomes
        self.tps = [(t, p) for t in consumed for p in range(partitions)]
        self.con: Optional[sqlite3.Connection] = None

    def lag(self) -> int:
        hw = self.r.mget([self.keys.counter(t, p) for t, p in self.tps])
        cm = committed.read_sync(self.r, self.keys, GROUP, self.tps)
        return sum(int(a or 0) - int(b or 0) for a, b in zip(hw, cm))

    def streams(self) -> list[bytes]:
        return [k for k in self.r.scan_iter(match=f"{self.keys.ns}:{{*|*}}:s", count=1000)]

    def records(self) -> int:
        if self.con is None:
            if not (self.db.exists() and Path(str(self.db) + "-shm").exists()):
                return 0
            try:
                self.con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5)
            except sqlite3.OperationalError:
                return 0
        try:
            return int(self.con.execute("SELECT max(id) FROM notify_record").fetchone()[0] or 0)
        except sqlite3.OperationalError:
            return 0

    def take(self, t: float, phase: str, fed: int) -> Sample:
        rss = []
        for p in self.procs:
            try:
                rss.append(p.memory_info().rss)
            except Exception:  # noqa: BLE001 - a worker that died reads as 0
                rss.append(0)
        keys = self.streams()
        pipe = self.r.pipeline(transaction=False)
        for k in keys:
            pipe.xlen(k)
            pipe.memory_usage(k)
        vals = pipe.execute()
        s = Sample(t=t, phase=phase, fed=fed, rss=rss, used_memory=int(self.r.info("memory")["used_memory"]),
                   cl_xlen=0, cl_mem=0, streams_xlen=0, streams_mem=0, lag=self.lag(), records=self.records(),
                   aof=sum(f.stat().st_size for f in self.aof_dir.rglob("*.aof") if f.is_file()))
        per = {name: [0, 0] for name in TABLES}
        for i, k in enumerate(keys):
            n, mem = int(vals[2 * i] or 0), int(vals[2 * i + 1] or 0)
            s.streams_xlen += n
            s.streams_mem += mem
            topic = k.decode().split("{", 1)[1].rsplit("|", 1)[0]
            if topic.endswith("-changelog"):
                s.cl_xlen += n
                s.cl_mem += mem
                name = topic[len(f"{GROUP}-"):-len("-changelog")]
                acc = per.setdefault(name, [0, 0])
                acc[0] += n
                acc[1] += mem
        s.per_table = {k: tuple(v) for k, v in per.items()}
        return s

    def close(self) -> None:
        if self.con:
            self.con.close()


# ---------------------------------------------------------------------------
# analysis


def slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0


def series(samples: list[Sample], workers: int) -> dict[str, Callable[[Sample], float]]:
    out: dict[str, Callable[[Sample], float]] = {}
    for i in range(workers):
        out[f"worker {i} RSS (MB)"] = lambda s, i=i: s.rss[i] / 2**20
    out.update({
        "Redis used_memory (MB)": lambda s: s.used_memory / 2**20,
        "changelog streams XLEN": lambda s: s.cl_xlen,
        "changelog streams memory (MB)": lambda s: s.cl_mem / 2**20,
        "all streams XLEN": lambda s: s.streams_xlen,
        "all streams memory (MB)": lambda s: s.streams_mem / 2**20,
        "Redis used_memory less topic streams (MB)": lambda s: (s.used_memory - (s.streams_mem - s.cl_mem)) / 2**20,
        "lag (entries)": lambda s: s.lag,
    })
    for name in TABLES:
        out[f"{name} changelog XLEN"] = lambda s, name=name: s.per_table.get(name, (0, 0))[0]
    return out


@dataclass
class Fit:
    name: str
    first: float
    last: float
    mean: float
    lo: float
    hi: float
    per_min: float
    pct_per_min: float
    flat: bool
    #: slope of the per-minute peaks, % of the mean per minute (the envelope of a
    #: sawtooth: a compacted changelog doubles, is compacted, and doubles again)
    peak_pct_per_min: float = 0.0


def analyse(samples: list[Sample], warmup_s: float, workers: int, flat_pct: float) -> list[Fit]:
    steady = [s for s in samples if s.phase == "feed" and s.t >= warmup_s]
    fits = []
    for name, f in series(samples, workers).items():
        ys = [float(f(s)) for s in steady]
        if not ys:
            continue
        xs = [s.t / 60 for s in steady]
        k = slope(xs, ys)
        mean = sum(ys) / len(ys)
        pct = 100 * k / mean if mean else 0.0
        peaks: dict[int, float] = {}
        for x, y in zip(xs, ys):
            m = int(x - xs[0])
            peaks[m] = max(peaks.get(m, y), y)
        span = xs[-1] - xs[0]
        # the last minute counts only if it is (nearly) whole
        whole = sorted(peaks) if span - int(span) >= 0.9 else sorted(peaks)[:-1]
        kp = slope([float(m) for m in whole], [peaks[m] for m in whole])
        fits.append(Fit(name, ys[0], ys[-1], mean, min(ys), max(ys), k, pct, abs(pct) < flat_pct,
                        100 * kp / mean if mean else 0.0))
    return fits


# ---------------------------------------------------------------------------
# the run


@dataclass
class Result:
    minutes: float
    rate: float
    workers: int
    users: int
    partitions: int
    compact_s: float
    dedup_window_s: float
    tombstone_s: float = 60.0
    keep_s: float = 60.0
    fed: int = 0
    unique: int = 0
    repeats: int = 0
    feed_s: float = 0.0
    drain_s: float = 0.0
    drained: bool = False
    max_lag: int = 0
    records: int = 0
    statuses: dict = field(default_factory=dict)
    missing: int = 0  # (biz_key, recipient) pairs fed without a record
    missing_examples: list = field(default_factory=list)
    pending: int = 0
    dlq: int = 0
    worker_exits: list = field(default_factory=list)
    samples: list = field(default_factory=list)
    fits: list = field(default_factory=list)
    warmup_s: float = 0.0
    final_changelog: dict = field(default_factory=dict)  # after the last compaction (drain)
    cpu: dict = field(default_factory=dict)
    csv: str = ""
    settle_s: float = 0.0
    final_tombstones: dict = field(default_factory=dict)  # table -> entries without a value, after settling
    final_topics: int = 0  # entries left in the topic streams (not changelogs) after settling


def soak_config(tmp: Path, dedup_window_s: float) -> Path:
    import tomllib

    from config.settings import DEFAULTS_PATH

    defaults = tomllib.loads(DEFAULTS_PATH.read_text())
    text = "receipt_poll_s = 0\n\n"
    for n in defaults.get("providers") or {}:
        text += f"[providers.{n}]\nrate = 1000000\nburst = 1000000\n\n"
    for n, c in (defaults.get("categories") or {}).items():
        text += f"[categories.{n}]\ndedup_window_s = {int(dedup_window_s)}\n"
        if c.get("daily_limit") not in (None, "exempt"):
            text += "daily_limit = 100000\n"
        if c.get("rate_windows"):  # (seed 002's sliding windows: the same reason)
            text += "rate_windows = []\n"
        text += "\n"
    path = tmp / "soak-config.toml"
    path.write_text(text)
    return path


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:13]) / os.sysconf("SC_CLK_TCK")
    except (FileNotFoundError, ProcessLookupError):
        return 0.0


def run(minutes: float, rate: float, *, workers: int = 2, n_users: int = 5000, partitions: int = 8,
        sample_s: float = 5.0, compact_s: float = 30.0, dedup_window_s: float = 60.0, purge_s: float = 15.0,
        inflight_keep_s: float = 60.0, tombstone_s: float = 60.0, keep_s: float = 60.0, warmup_frac: float = 0.2, flat_pct: float = 1.0, seed: int = 6,
        full_fake_ledger: bool = False, drain_timeout: float = 180.0, settle_s: Optional[float] = None,
        tag: str = "soak",
        log: Callable[[str], None] = print) -> Result:
    import redis

    t_begin = time.monotonic()

    def say(msg: str) -> None:
        log(f"[{time.monotonic() - t_begin:6.1f}s] {msg}")

    OUT.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    users = make_users(n_users, rng)
    for u in users:
        u.quiet = False  # quiet hours defer for hours: timers that cannot fire within the soak
    res = Result(minutes=minutes, rate=rate, workers=workers, users=n_users, partitions=partitions,
                 compact_s=compact_s, dedup_window_s=dedup_window_s, tombstone_s=tombstone_s, keep_s=keep_s)
    feed = Feed(users, rng)
    hour = time.gmtime().tm_hour
    with tempfile.TemporaryDirectory(prefix="notify-soak-") as tmpdir:
        tmp = Path(tmpdir)
        server = EmbeddedRedis(tmp / "redis").start()  # AOF everysec
        url = f"{server.url}?compact={compact_s:g}&tombstones={tombstone_s:g}&keep={keep_s:g}"
        env = worker_env(
            os.environ, url, workers=workers, NOTIFY_CONFIG=soak_config(tmp, dedup_window_s),
            NOTIFY_DATA_DIR=tmp / "data", NOTIFY_DB=tmp / "records.db", NOTIFY_PARTITIONS=partitions,
            NOTIFY_LEASE=3, NOTIFY_PROVIDERS="fake", NOTIFY_PURGE_EVERY_S=purge_s,
            NOTIFY_INFLIGHT_KEEP_S=inflight_keep_s, PYTHONPATH=ROOT,
        )
        env.pop("REDIS_URL", None)
        procs: list[subprocess.Popen] = []
        r = redis.Redis.from_url(server.url)
        sampler: Optional[Sampler] = None
        try:
            prod = Producer(server.url, partitions)
            loop = asyncio.new_event_loop()
            loop.run_until_complete(prod.start([EVENTS, PREFERENCES, DEVICES]))
            loop.run_until_complete(prod.send(PREFERENCES, [(u.id.encode(), orjson.dumps(u.prefs(hour))) for u in users]))
            loop.run_until_complete(prod.send(DEVICES, [
                (u.id.encode(), orjson.dumps({"user_id": u.id, "token": u.device, "platform": "apns", "op": "add",
                                              "at": time.time()})) for u in users if u.device]))
            say(f"{tag}: {n_users} users produced; starting {workers} workers (compact every {compact_s:g}s)")
            for i in range(workers):
                cmd = [sys.executable, "-m", "pipeline.cli", "worker", "-l", "warn"]
                if not full_fake_ledger:
                    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker-shim", "warn"]
                procs.append(subprocess.Popen(cmd, cwd=str(ROOT), env=worker_env(env, index=i),
                                              stdout=open(OUT / f"{tag}-w{i}.log", "w"), stderr=subprocess.STDOUT))
            sampler = Sampler(r, partitions, [p.pid for p in procs], tmp / "records.db", tmp / "redis")

            def check() -> None:
                for i, p in enumerate(procs):
                    if p.poll() is not None and f"worker {i}" not in " ".join(res.worker_exits):
                        res.worker_exits.append(f"worker {i} exited with {p.returncode}")
                        say(f"{tag}: worker {i} exited with {p.returncode}; see bench/out/{tag}-w{i}.log")

            # wait for the users to be applied (the workers are up and own their slots)
            users_tps = [(t, p) for t in (PREFERENCES, DEVICES) for p in range(partitions)]
            deadline = time.monotonic() + 120
            while True:
                hw = r.mget([Keys().counter(t, p) for t, p in users_tps])
                cm = committed.read_sync(r, Keys(), GROUP, users_tps)
                if sum(int(x or 0) for x in cm) >= sum(int(x or 0) for x in hw) > 0:
                    break
                check()
                if res.worker_exits or time.monotonic() > deadline:
                    raise RuntimeError(f"users not applied: {res.worker_exits or 'timeout'}")
                time.sleep(0.2)
            say(f"{tag}: users applied; feeding {rate:g} events/s for {minutes:g} min")
            cpu0 = {f"worker {i}": cpu_seconds(p.pid) for i, p in enumerate(procs)}
            cpu0["redis"] = cpu_seconds(server.proc.pid)

            duration = minutes * 60
            res.warmup_s = warmup_frac * duration
            samples: list[Sample] = []

            async def feed_loop() -> None:
                t0 = time.monotonic()
                next_sample = t0
                next_log = t0 + 30
                while True:
                    now = time.monotonic()
                    el = now - t0
                    if el >= duration:
                        break
                    due = int(rate * el) - feed.sent
                    if due > 0:
                        await prod.send(EVENTS, feed.batch(min(due, int(rate) + 1)))
                    if now >= next_sample:
                        s = sampler.take(el, "feed", feed.sent)
                        samples.append(s)
                        res.max_lag = max(res.max_lag, s.lag)
                        next_sample += sample_s
                        check()
                    if now >= next_log:
                        s = samples[-1]
                        say(f"{tag}: fed {feed.sent}, lag {s.lag}, records {s.records}, RSS "
                            + "/".join(f"{x / 2**20:.0f}" for x in s.rss) + f" MB, redis {s.used_memory / 2**20:.0f} MB,"
                            f" changelogs {s.cl_xlen} entries, streams {s.streams_xlen}")
                        next_log += 30
                    await asyncio.sleep(0.05)
                res.feed_s = time.monotonic() - t0

            loop.run_until_complete(feed_loop())
            res.fed, res.unique, res.repeats = feed.sent, len(feed.fed), feed.repeats
            say(f"{tag}: fed {res.fed} events ({res.unique} business keys) in {res.feed_s:.0f}s; draining")

            # drain: lag zero, no PENDING record, the record store quiet; then one more compaction
            t_drain = time.monotonic()
            quiet_since = None
            last_n = -1
            while time.monotonic() - t_drain < drain_timeout:
                check()
                lag = sampler.lag()
                n = sampler.records()
                if lag == 0 and n == last_n:
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since > 2.0:
                        res.drained = True
                        break
                else:
                    quiet_since = None
                last_n = n
                time.sleep(0.25)
            res.drain_s = time.monotonic() - t_drain
            res.cpu = {f"worker {i}": cpu_seconds(p.pid) - cpu0[f"worker {i}"] for i, p in enumerate(procs)}
            res.cpu["redis"] = cpu_seconds(server.proc.pid) - cpu0["redis"]
            # what the changelogs settle at once nothing is fed:
            # every dedup key and inflight mark has expired, been purged (a tombstone), the
            # tombstone has passed its grace and a compaction has dropped it
            res.settle_s = settle_s if settle_s is not None else (
                max(dedup_window_s, inflight_keep_s) + purge_s + tombstone_s + 2 * compact_s + 2)
            time.sleep(res.settle_s)
            s = sampler.take(time.monotonic() - t_drain + res.feed_s, "drain", feed.sent)
            samples.append(s)
            res.final_changelog = {"total": s.cl_xlen, **{k: v[0] for k, v in s.per_table.items()}}
            res.final_tombstones = tombstones(r, partitions)
            res.final_topics = s.streams_xlen - s.cl_xlen
            say(f"{tag}: drained={res.drained} in {res.drain_s:.1f}s; changelogs {s.cl_xlen} entries after compaction")
            sampler.close()

            # nothing lost
            con = sqlite3.connect(f"file:{tmp / 'records.db'}?mode=ro", uri=True, timeout=10)
            try:
                have = set(con.execute("SELECT DISTINCT biz_key, user_id FROM notify_record").fetchall())
                res.records = con.execute("SELECT count(*) FROM notify_record").fetchone()[0]
                res.pending = con.execute("SELECT count(*) FROM notify_record WHERE status = 'PENDING'").fetchone()[0]
                res.statuses = {f"{st}{'/' + rs if rs else ''}": n for st, rs, n in con.execute(
                    "SELECT status, coalesce(reason, ''), count(*) FROM notify_record GROUP BY 1, 2 ORDER BY 3 DESC")}
            finally:
                con.close()
            missing = [(b, u) for b, rcpts in feed.fed.items() for u in rcpts if (b, u) not in have]
            res.missing, res.missing_examples = len(missing), missing[:5]
            res.dlq = sum(int(r.xlen(Keys().stream(DLQ, p))) for p in range(partitions))
            res.samples = samples
            res.fits = analyse(samples, res.warmup_s, workers, flat_pct)
            res.csv = str(write_csv(samples, workers, OUT / f"{tag}-samples.csv"))
            loop.run_until_complete(prod.stop())
            loop.close()
        finally:
            stop_all(procs, 15)
            r.close()
            server.stop()
            say(f"{tag}: workers and server stopped")
    return res


def tombstones(r, partitions: int) -> dict[str, int]:
    """Entries without a value (deletes) per changelog table."""
    keys = Keys()
    out = {}
    for t in TABLES:
        n = 0
        for p in range(partitions):
            start = "-"
            while True:
                batch = r.xrange(keys.stream(f"{GROUP}-{t}-changelog", p), min=start, count=10000)
                n += sum(1 for _id, f in batch if b"v" not in f)
                if len(batch) < 10000:
                    break
                start = "(" + batch[-1][0].decode()
        out[t] = n
    return out


def write_csv(samples: list[Sample], workers: int, path: Path) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "phase", "fed", *[f"rss_w{i}_bytes" for i in range(workers)], "redis_used_memory",
                    "changelog_xlen", "changelog_mem", "streams_xlen", "streams_mem", "lag", "records", "aof_bytes",
                    *[f"{t}_changelog_xlen" for t in TABLES], *[f"{t}_changelog_mem" for t in TABLES]])
        for s in samples:
            w.writerow([f"{s.t:.1f}", s.phase, s.fed, *s.rss, s.used_memory, s.cl_xlen, s.cl_mem, s.streams_xlen,
                        s.streams_mem, s.lag, s.records, s.aof,
                        *[s.per_table.get(t, (0, 0))[0] for t in TABLES],
                        *[s.per_table.get(t, (0, 0))[1] for t in TABLES]])
    return path


# ---------------------------------------------------------------------------
# report


def report(res: Result, flat_pct: float) -> str:
    steady = [s for s in res.samples if s.phase == "feed" and s.t >= res.warmup_s]
    lines = [
        f"{res.fed:,} events fed at {res.rate:g}/s for {res.feed_s / 60:.1f} min ({res.unique:,} business keys,"
        f" {res.repeats:,} repeats of a recent key) over {res.users:,} users; {res.workers} worker processes,"
        f" {res.partitions} partitions, embedded valkey-server (AOF everysec), fake providers.",
        f"Changelog compaction and topic trimming every {res.compact_s:g} s (tombstones kept {res.tombstone_s:g} s,"
        f" consumed topic entries kept {res.keep_s:g} s); dedup windows {res.dedup_window_s:g} s, purge every 15 s,"
        f" inflight marks kept 60 s, daily limits lifted to 100,000 (counted), sliding windows off, no quiet hours, `receipt_poll_s = 0`,"
        f" provider buckets lifted; the fakes' per-delivery ledger capped at {FAKE_LEDGER_CAP:,} entries"
        " (see the docstring of bench/soak.py).",
        "",
        f"{len(res.samples)} samples every ~5 s (bench/out/{Path(res.csv).name}); slopes are least squares over"
        f" the {len(steady)} samples after the warm-up (first {res.warmup_s:.0f} s) up to the end of the feed;"
        f" **flat** = |slope| < {flat_pct:g}% of the mean per minute. \"peaks\": the slope of each whole"
        " minute's highest sample (the envelope: a changelog grows until compacted, then drops, so the fit of"
        " the samples depends on where in that cycle the feed ends).",
        "",
        "| series | after warm-up | end of feed | min – max | slope / min | % of mean / min | peaks: % / min | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for f in res.fits:
        fmt = (lambda v: f"{v:,.1f}") if "MB" in f.name else (lambda v: f"{v:,.0f}")
        lines.append(f"| {f.name} | {fmt(f.first)} | {fmt(f.last)} | {fmt(f.lo)} – {fmt(f.hi)} | {f.per_min:+,.2f} |"
                     f" {f.pct_per_min:+.2f}% | {f.peak_pct_per_min:+.2f}% | {'flat' if f.flat else '**grows**' if f.per_min > 0 else 'falls'} |")
    lines += [
        "",
        f"Lag: at most {res.max_lag:,} entries during the feed; drained to zero: {res.drained}"
        f" ({res.drain_s:.1f} s after the feed stopped). CPU during feed and drain: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in res.cpu.items()) + ".",
        f"Changelogs {res.settle_s:.0f} s after the drain (a purge and a compaction later): {res.final_changelog.get('total', 0):,} entries ("
        + ", ".join(f"{k} {v:,}" for k, v in res.final_changelog.items() if k != "total") + "), of which"
        " tombstones (entries without a value): "
        + ", ".join(f"{k} {v:,}" for k, v in res.final_tombstones.items()) + f"; topic streams (consumed entries"
        f" trimmed): {res.final_topics:,} entries.",
        f"Nothing lost: {res.missing} (business key, recipient) pairs fed without a record, {res.pending} records"
        f" PENDING, {res.dlq} dead letters; {res.records:,} records: "
        + ", ".join(f"{k} {v:,}" for k, v in list(res.statuses.items())[:8]) + ".",
    ]
    if res.worker_exits:
        lines.append(f"Worker exits: {res.worker_exits}.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--rate", type=float, default=300, help="events/s")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--users", type=int, default=5000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--compact", type=float, default=30, help="changelog compaction interval (s)")
    ap.add_argument("--dedup-window", type=float, default=60, help="dedup_window_s of every category")
    ap.add_argument("--sample", type=float, default=5)
    ap.add_argument("--flat", type=float, default=1.0, help="flat = |slope| < this %% of the mean per minute")
    ap.add_argument("--full-fake-ledger", action="store_true", help="do not cap the fakes' per-delivery dicts")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/RESULTS.md")
    ap.add_argument("--worker-shim", metavar="LOGLEVEL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_shim:
        return worker_shim(args.worker_shim)
    res = run(args.minutes, args.rate, workers=args.workers, n_users=args.users, partitions=args.partitions,
              sample_s=args.sample, compact_s=args.compact, dedup_window_s=args.dedup_window, flat_pct=args.flat,
              full_fake_ledger=args.full_fake_ledger)
    body = report(res, args.flat)
    print(body)
    if not args.no_write:
        from bench.results import write_section

        cmd = f"python bench/soak.py --minutes {args.minutes:g} --rate {args.rate:g}"
        if args.workers != 2:
            cmd += f" --workers {args.workers}"
        if args.users != 5000:
            cmd += f" --users {args.users}"
        if args.full_fake_ledger:
            cmd += " --full-fake-ledger"
        write_section("soak", cmd, body)
    json.dump({k: v for k, v in res.__dict__.items() if k not in ("samples", "fits")}
              | {"fits": [f.__dict__ for f in res.fits]}, open(OUT / "soak-result.json", "w"), indent=1, default=str)


if __name__ == "__main__":
    main()
