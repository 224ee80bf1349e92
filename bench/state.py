"""Benchmark (not a test): the guard's state. Memory per dedup key and per daily
counter (worker RSS and Redis), recovery time of a table with ``--keys`` keys
(default 1,000,000; target ≤ 10 s), and changelog size before and after
compaction. Writes the "state" section of bench/RESULTS.md.

    python bench/state.py [--keys 1000000] [--updates 3] [--quick]

The tables are the pipeline's own (tables/__init__.py, the ``memory-ordered``
store, ``notify`` app), in a real worker (``pipeline.cli worker``, all agents)
on the embedded server (AOF everysec), one worker owning all 8 partitions, the
transport's own compactor off (``compact=0``) so compaction happens only when
this script runs it. The changelogs are written by this script with the
transport's producer, as the guard writes them (``dedup``: key
``<user>|<biz_key>|<channel>`` → ``[seen, offset, category]``; ``daily``: key
``freq:<user>:<category>:<day>`` → count), spread over the partitions by key:

1. baseline: a worker with empty tables (its RSS is subtracted below);
2. dedup: ``--keys`` keys, one changelog entry each; Redis ``used_memory``
   before/after, worker start → table loaded (recovery), RSS; then the guard's
   purge of all of them (a tombstone each) and a compaction (tombstone grace 0 when
   the compactor has one);
3. daily: ``--keys`` counters, each incremented ``--updates`` times (one
   changelog entry per increment, as the guard writes them); recovery from the
   uncompacted changelog; compaction (``compact_partition`` of
   pipeline/transport/compactor.py on every partition); recovery again, RSS.

Recovery time = worker process started → every key in the table (polled every
50 ms in the worker), with the baseline worker's start-up (process start → its
agents consume a message) given alongside.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))

from bench.e2e import PARTITIONS, cpu_seconds, wait  # noqa: E402
from pipeline.embedded import EmbeddedRedis  # noqa: E402
from pipeline.procs import stop_process, worker_env  # noqa: E402
from tests.transport.helpers import produce_async  # noqa: E402

TARGET_RECOVERY_S = 10.0
APP_ID = "notify"  # pipeline/app.py
DEDUP_TOPIC, DAILY_TOPIC = f"{APP_ID}-dedup-changelog", f"{APP_ID}-daily-changelog"
CHUNK = 50_000


# ---------------------------------------------------------------------------
# the worker


def worker_shim(out: str) -> None:
    """A pipeline worker that reports, every 50 ms, the size of its dedup and daily
    tables and when they reached the expected size (JSON to ``out``)."""
    import tables

    t_start = time.time()

    def report() -> None:
        loaded_at: dict = {}
        first_at: dict = {}
        expect = {"dedup": int(os.environ.get("STATE_EXPECT_DEDUP", "0")),
                  "daily": int(os.environ.get("STATE_EXPECT_DAILY", "0"))}
        while True:
            time.sleep(0.05)
            try:
                n = {"dedup": len(tables.dedup.data), "daily": len(tables.daily.data)}
            except Exception:  # noqa: BLE001 - not started yet
                continue
            now = time.time()
            for k, v in n.items():
                if v and k not in first_at:
                    first_at[k] = now - t_start
                if expect[k] and v >= expect[k] and k not in loaded_at:
                    loaded_at[k] = now - t_start
            tmp = out + ".tmp"
            Path(tmp).write_text(json.dumps({"keys": n, "loaded_s": loaded_at, "first_s": first_at,
                                             "t": now - t_start}))
            os.replace(tmp, out)

    threading.Thread(target=report, daemon=True).start()
    from pipeline.cli import main as cli_main

    sys.exit(cli_main(["worker", "-l", "warn"]))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Load:
    what: str
    keys: dict
    loaded_s: float = 0.0  # process start → every key in the table (baseline: → agents running)
    first_s: float = 0.0  # process start → the first key in the table
    rss_mb: float = 0.0
    cpu_s: float = 0.0


def run_worker(url: str, tmp: Path, what: str, expect_dedup: int = 0, expect_daily: int = 0,
               timeout: float = 900, profile: bool = False) -> Load:
    """Start a worker, wait until the tables hold what is expected (with none
    expected: until it has consumed a preferences message written before its start,
    i.e. its agents run), settle 2 s, take its RSS, stop it."""
    import redis

    from bench.e2e import Lag
    from pipeline.topics import PREFERENCES

    r = redis.Redis.from_url(url)
    lag = Lag(r, [PREFERENCES])
    if not (expect_dedup or expect_daily):
        asyncio.run(produce_async(url, PREFERENCES, [(b"u0", json.dumps({"user_id": "u0", "version": 1}).encode())],
                                  partitions=PARTITIONS))
    t_spawn = time.time()
    out = OUT / f"state-probe-{what.split()[0]}.json"
    out.unlink(missing_ok=True)
    env = worker_env(os.environ, url + "?compact=0", workers=1, NOTIFY_DATA_DIR=tmp / "data",
                     NOTIFY_DB=tmp / "records.db", NOTIFY_PARTITIONS=PARTITIONS, NOTIFY_LEASE=5,
                     NOTIFY_PROVIDERS="fake", PYTHONPATH=ROOT, NOTIFY_PURGE_EVERY_S=86400,
                     STATE_EXPECT_DEDUP=str(expect_dedup), STATE_EXPECT_DAILY=str(expect_daily))
    log = open(OUT / f"state-{what.split()[0]}.log", "w")
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker-shim", str(out)],
                            cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT)
    spy = None
    if profile:
        pyspy = str(Path(sys.executable).with_name("py-spy"))
        spy = subprocess.Popen([pyspy, "record", "-p", str(proc.pid), "-r", "100", "--nonblocking", "-f", "raw",
                                "-o", str(OUT / "state-recovery.raw")],
                               stdout=subprocess.DEVNULL, stderr=open(OUT / "state-pyspy.log", "w"))
    try:
        def probe() -> Optional[dict]:
            if proc.poll() is not None:
                raise RuntimeError(f"state worker exited with {proc.returncode}; see {log.name}")
            if not out.exists():
                return None
            try:
                d = json.loads(out.read_text())
            except (json.JSONDecodeError, FileNotFoundError):
                return None
            if expect_dedup or expect_daily:
                return d if len(d["loaded_s"]) == bool(expect_dedup) + bool(expect_daily) else None
            hw, cm = lag.total()
            if hw and hw == cm:
                d["loaded_s"] = {"up": time.time() - t_spawn}
                return d
            return None

        d = wait(probe, timeout, f"the {what} worker to load its tables", interval=0.02)
        loaded_s = max(d["loaded_s"].values())
        if spy:
            spy.send_signal(2)  # SIGINT: py-spy writes what it sampled until now
            spy.wait(30)
        time.sleep(2.0)
        first_s = min(d.get("first_s", {}).values() or [0.0])
        res = Load(what, d["keys"], loaded_s, first_s, rss_mb(proc.pid), cpu_seconds(proc.pid))
        d = json.loads(out.read_text())
        res.keys = d["keys"]
        return res
    finally:
        # Faust's shutdown takes ~20 s here: kill after 5 s, then wait for the slot
        # leases to expire so that the next worker's recovery does not include that wait
        stop_process(proc, 5)
        wait(lambda: not any(r.scan_iter(match="*:lease:*")), 60, "the worker's slot leases to expire", interval=0.1)
        r.close()


# ---------------------------------------------------------------------------
# the changelogs


def dedup_entries(n: int, value: bool = True) -> Iterator[tuple[bytes, Optional[bytes]]]:
    now = time.time()
    for i in range(n):
        key = json.dumps(f"u{i // 4}|mkt:{i}|email").encode()  # ~4 keys per user; keys are JSON (Faust's tables)
        yield key, (json.dumps([now, i, "marketing"]).encode() if value else None)


def daily_entries(n: int, updates: int) -> Iterator[tuple[bytes, Optional[bytes]]]:
    day = date.today().isoformat()
    for u in range(1, updates + 1):  # each counter incremented `updates` times, in rounds
        for i in range(n):
            yield json.dumps(f"freq:u{i}:marketing:{day}").encode(), str(u).encode()


def produce(url: str, topic: str, items: Iterator) -> float:
    async def go() -> None:
        chunk: list = []
        for it in items:
            chunk.append(it)
            if len(chunk) >= CHUNK:
                await produce_async(url, topic, chunk, partitions=PARTITIONS)
                chunk = []
        if chunk:
            await produce_async(url, topic, chunk, partitions=PARTITIONS)

    t0 = time.perf_counter()
    asyncio.run(go())
    return time.perf_counter() - t0


@dataclass
class Log:
    entries: int
    used_mb: float  # Redis used_memory
    streams_mb: float  # MEMORY USAGE of the changelog streams


def changelog(r, topic: str) -> Log:
    from pipeline.transport.keys import Keys

    keys = Keys()
    entries = sum(r.xlen(keys.stream(topic, p)) for p in range(PARTITIONS))
    streams = sum(r.memory_usage(keys.stream(topic, p), samples=0) or 0 for p in range(PARTITIONS))
    return Log(entries, r.info("memory")["used_memory"] / 2**20, streams / 2**20)


def compact(url: str, topic: str) -> tuple[int, float]:
    """Every partition of ``topic`` through the transport's compactor (tombstone
    grace 0 where the compactor has one); returns (entries deleted, seconds)."""
    import redis.asyncio as aioredis

    from pipeline.transport.compactor import compact_partition
    from pipeline.transport.keys import Keys

    kw = {"tombstone_grace_s": 0.0} if "tombstone_grace_s" in inspect.signature(compact_partition).parameters else {}

    async def go() -> int:
        client = aioredis.Redis.from_url(url)
        try:
            deleted = 0
            for p in range(PARTITIONS):
                res = await compact_partition(client, Keys(), topic, p, **kw)
                deleted += len(res.doomed) if hasattr(res, "doomed") else int(res)
            return deleted
        finally:
            await client.aclose()

    t0 = time.perf_counter()
    n = asyncio.run(go())
    return n, time.perf_counter() - t0


# ---------------------------------------------------------------------------
# the run


@dataclass
class Result:
    keys: int
    updates: int
    baseline: Optional[Load] = None
    loads: list = field(default_factory=list)
    logs: list = field(default_factory=list)  # (label, Log)
    produce_s: dict = field(default_factory=dict)
    compaction: list = field(default_factory=list)  # (label, deleted, seconds)
    tombstone_grace: bool = False
    profile: list = field(default_factory=list)


def run(n: int, updates: int, profile: bool = False, log=print) -> Result:
    """Two servers, one per table: a worker recovers every table at start, so the
    daily figures must not include reading the dedup changelog."""
    import redis

    from pipeline.transport.compactor import compact_partition

    res = Result(n, updates, tombstone_grace="tombstone_grace_s" in inspect.signature(compact_partition).parameters)
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="notify-state-") as tmpdir:
        tmp = Path(tmpdir)
        server = EmbeddedRedis(tmp / "redis").start()  # AOF everysec
        r = redis.Redis.from_url(server.url)
        try:
            res.baseline = run_worker(server.url, tmp, "baseline (empty tables)")
            log(f"state: baseline worker up in {res.baseline.loaded_s:.1f}s, RSS {res.baseline.rss_mb:.0f} MB")
            res.logs.append(("empty", changelog(r, DEDUP_TOPIC)))
            res.produce_s["dedup"] = produce(server.url, DEDUP_TOPIC, dedup_entries(n))
            res.logs.append(("dedup", changelog(r, DEDUP_TOPIC)))
            log(f"state: {n} dedup entries written in {res.produce_s['dedup']:.1f}s")
            res.loads.append(run_worker(server.url, tmp, "dedup", expect_dedup=n, profile=profile))
            log(f"state: dedup recovered in {res.loads[-1].loaded_s:.1f}s, RSS {res.loads[-1].rss_mb:.0f} MB")
            produce(server.url, DEDUP_TOPIC, dedup_entries(n, value=False))  # the purge: a tombstone each
            res.logs.append(("dedup + purge tombstones", changelog(r, DEDUP_TOPIC)))
            deleted, secs = compact(server.url, DEDUP_TOPIC)
            res.compaction.append(("dedup", deleted, secs))
            res.logs.append(("dedup, compacted", changelog(r, DEDUP_TOPIC)))
            log(f"state: dedup compaction deleted {deleted} entries in {secs:.1f}s")
        finally:
            r.close()
            server.stop()
    with tempfile.TemporaryDirectory(prefix="notify-state-") as tmpdir:
        tmp = Path(tmpdir)
        server = EmbeddedRedis(tmp / "redis").start()
        r = redis.Redis.from_url(server.url)
        try:
            res.logs.append(("empty (second server)", changelog(r, DAILY_TOPIC)))
            res.produce_s["daily"] = produce(server.url, DAILY_TOPIC, daily_entries(n, updates))
            res.logs.append(("daily", changelog(r, DAILY_TOPIC)))
            log(f"state: {n} daily counters x {updates} increments written in {res.produce_s['daily']:.1f}s")
            res.loads.append(run_worker(server.url, tmp, f"daily ({updates} entries per key)", expect_daily=n))
            log(f"state: daily recovered in {res.loads[-1].loaded_s:.1f}s (uncompacted)")
            deleted, secs = compact(server.url, DAILY_TOPIC)
            res.compaction.append(("daily", deleted, secs))
            res.logs.append(("daily, compacted", changelog(r, DAILY_TOPIC)))
            log(f"state: daily compaction deleted {deleted} entries in {secs:.1f}s")
            res.loads.append(run_worker(server.url, tmp, "daily (compacted)", expect_daily=n))
            log(f"state: daily recovered in {res.loads[-1].loaded_s:.1f}s (compacted), "
                f"RSS {res.loads[-1].rss_mb:.0f} MB")
        finally:
            r.close()
            server.stop()
    if profile:
        from bench.e2e import summarize_inclusive, summarize_raw

        raw = OUT / "state-recovery.raw"
        if raw.exists() and raw.stat().st_size:
            res.profile = summarize_raw(raw, top=12) + [""] + summarize_inclusive(raw, top=12)
    return res


def report(res: Result) -> str:
    n = res.keys
    base = res.baseline
    logs = dict(res.logs)
    dedup_load, daily_raw, daily_load = res.loads
    mb = 2**20

    def per_key(delta_mb: float) -> str:
        return f"{delta_mb * mb / n:,.0f}"

    lines = [
        f"Machine: {os.cpu_count()} cores. One worker (`pipeline.cli worker`, all agents, the pipeline's tables and "
        f"`memory-ordered` store) owning all {PARTITIONS} partitions, on the embedded valkey-server (AOF everysec); "
        "the worker's own compactor off (`compact=0`); changelogs written by the benchmark with the transport's "
        f"producer in the guard's formats. **{n:,} keys per table.**",
        "",
        "Memory per key:",
        "",
        "| table (key → value) | worker RSS MB (baseline " + f"{base.rss_mb:.0f}) | bytes per key in the worker "
        "| Redis used_memory Δ MB | bytes per changelog entry in Redis |",
        "|---|---:|---:|---:|---:|",
        f"| dedup (`<user>\\|<biz_key>\\|<channel>` → `[seen, offset, category]`) | {dedup_load.rss_mb:.0f} "
        f"| {per_key(dedup_load.rss_mb - base.rss_mb)} | {logs['dedup'].used_mb - logs['empty'].used_mb:.0f} "
        f"| {per_key(logs['dedup'].used_mb - logs['empty'].used_mb)} |",
        f"| daily (`freq:<user>:<category>:<day>` → count), compacted | {daily_load.rss_mb:.0f} "
        f"| {per_key(daily_load.rss_mb - base.rss_mb)} "
        f"| {logs['daily, compacted'].used_mb - logs['empty (second server)'].used_mb:.0f} "
        f"| {per_key(logs['daily, compacted'].used_mb - logs['empty (second server)'].used_mb)} |",
        "",
        "Recovery (worker process started → every key in the table; the baseline worker with empty tables "
        f"starts in {base.loaded_s:.1f} s, included in each figure):",
        "",
        "| table | changelog entries | recovery s | first key at s | entries/s after the first key | worker CPU s "
        "| target |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for load, entries in ((dedup_load, logs["dedup"].entries), (daily_raw, logs["daily"].entries),
                          (daily_load, logs["daily, compacted"].entries)):
        rate = entries / (load.loaded_s - load.first_s) if load.loaded_s > load.first_s else float("nan")
        verdict = "met" if load.loaded_s <= TARGET_RECOVERY_S else (
            f"**MISSED** by {load.loaded_s - TARGET_RECOVERY_S:.1f} s ({load.loaded_s / TARGET_RECOVERY_S:.1f}x)")
        lines.append(f"| {load.what} | {entries:,} | **{load.loaded_s:.1f}** | {load.first_s:.1f} | {rate:,.0f} "
                     f"| {load.cpu_s:.1f} | ≤ {TARGET_RECOVERY_S:g} s: {verdict} |")
    lines += [
        "",
        "Changelog before and after compaction (`compact_partition` on every partition"
        + (", tombstone grace 0" if res.tombstone_grace else ", tombstones kept: this compactor has no grace")
        + "; Redis `MEMORY USAGE` of the streams and `used_memory`):",
        "",
        "| changelog | entries | streams MB | Redis used_memory MB |",
        "|---|---:|---:|---:|",
    ]
    for label, lg in res.logs:
        if not label.startswith("empty"):
            lines.append(f"| {label} | {lg.entries:,} | {lg.streams_mb:.1f} | {lg.used_mb:.0f} |")
    lines.append("")
    lines += [f"Compaction of {label}: {deleted:,} entries deleted in {secs:.1f} s." for label, deleted, secs
              in res.compaction]
    lines.append(f"Writing the changelogs (transport producer): dedup {res.produce_s['dedup']:.1f} s, daily "
                 f"{res.produce_s['daily']:.1f} s for {n * res.updates:,} entries.")
    if res.profile:
        lines += ["", "Where the dedup recovery's time goes (py-spy on the recovering worker, whole run):", "", "```",
                  *res.profile, "```"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--updates", type=int, default=3, help="changelog entries per daily counter before compaction")
    ap.add_argument("--quick", action="store_true", help="50,000 keys, prints only")
    ap.add_argument("--profile", action="store_true", help="py-spy on the worker recovering the dedup table")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--worker-shim", metavar="OUT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_shim:
        return worker_shim(args.worker_shim)
    if args.quick:
        args.keys, args.no_write = 50_000, True
    t0 = time.monotonic()
    res = run(args.keys, args.updates, args.profile, log=lambda m: print(f"[{time.monotonic() - t0:6.1f}s] {m}", flush=True))
    body = report(res)
    print(body)
    if not args.no_write:
        from bench.results import write_section

        command = "python bench/state.py" + (f" --keys {args.keys}" if args.keys != 1_000_000 else "") + (
            f" --updates {args.updates}" if args.updates != 3 else "") + (" --profile" if args.profile else "")
        write_section("state", command, body)


if __name__ == "__main__":
    main()
