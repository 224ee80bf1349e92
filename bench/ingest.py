"""Benchmark (not a test): events/s accepted by ``POST /v1/events``, one event per
request and batches, against the real API (pipeline/api/, ``notify api`` in its
own process) on the embedded server (valkey-server, AOF everysec), from an aiohttp
load generator on loopback with several concurrent connections. Writes the
"ingest" section of bench/RESULTS.md.

    python bench/ingest.py [--seconds 20] [--connections 16] [--batch 100] [--quick]

No worker runs: this measures acceptance only (an event is accepted once it is
in the ``notify.events`` stream, with its idempotency record); every event has a
new business key (transaction / order_shipped, one recipient). Only 202 answers
count; any other status is reported. The first second of each run is a warm-up
and is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))

from bench.api import start_api  # noqa: E402
from bench.e2e import cpu_seconds, machine_busy  # noqa: E402
from bench.otp import pct  # noqa: E402
from pipeline.procs import stop_process  # noqa: E402

KEY = "bench-ingest-key-0123456789abcdef"
WARMUP_S = 1.0


@dataclass
class Run:
    mode: str  # "single" | "batch <n>"
    per_request: int
    connections: int
    seconds: float = 0.0
    events: int = 0
    requests: int = 0
    statuses: dict = field(default_factory=dict)  # non-202 status → count
    latency_ms: list = field(default_factory=list)  # per request
    cpu: dict = field(default_factory=dict)
    other_cpu: float = 0.0

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


def event(tag: str, i: int) -> dict:
    return {"biz_key": f"{tag}:{i}", "category": "transaction", "template": "order_shipped",
            "recipients": [f"u{i % 100_000}"],
            "params": {"order_no": f"O{i}", "carrier": "UPS", "tracking_no": f"1Z{i:08d}",
                       "tracking_url": f"https://t.example/{i}"}}


async def load(url: str, run: Run, seconds: float) -> None:
    import aiohttp

    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    loop = asyncio.get_running_loop()
    start = loop.time()
    count_from, end = start + WARMUP_S, start + WARMUP_S + seconds
    statuses: dict = {}

    async def conn(c: int, session) -> None:
        i = 0
        while True:
            if run.per_request == 1:
                body = orjson.dumps(event(f"s{c}", i))
            else:
                body = orjson.dumps([event(f"b{c}", i + j) for j in range(run.per_request)])
            i += run.per_request
            t = loop.time()
            if t >= end:
                return
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                status = resp.status
            done = loop.time()
            if done < count_from or done > end:
                continue
            if status == 202:
                run.events += run.per_request
                run.requests += 1
                run.latency_ms.append((done - t) * 1000)
            else:
                statuses[status] = statuses.get(status, 0) + 1

    connector = aiohttp.TCPConnector(limit=run.connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(conn(c, session) for c in range(run.connections)))
    run.seconds = seconds
    run.statuses = statuses


def measure(runs: list[Run], seconds: float, log=print) -> None:
    with tempfile.TemporaryDirectory(prefix="notify-ingest-") as tmpdir:
        tmp = Path(tmpdir)
        server, api, base = start_api(tmp, log, key=KEY, log_name="ingest-api.log")
        try:
            url = f"{base}/v1/events"
            pids = {"api": api.pid, "redis": server.proc.pid, "load generator": os.getpid()}
            for run in runs:
                c0 = {k: cpu_seconds(v) for k, v in pids.items()}
                busy0 = machine_busy()
                t0 = time.monotonic()
                asyncio.run(load(url, run, seconds))
                # CPU over the whole run including the warm-up, scaled to the counted window
                scale = seconds / (time.monotonic() - t0)
                run.cpu = {k: (cpu_seconds(v) - c0[k]) * scale for k, v in pids.items()}
                run.other_cpu = max(0.0, (machine_busy() - busy0) * scale - sum(run.cpu.values()))
                log(f"ingest {run.mode}: {run.rate:,.0f} events/s ({run.requests / seconds:,.0f} requests/s), "
                    f"p50 {pct(run.latency_ms, 50):.1f} ms p99 {pct(run.latency_ms, 99):.1f} ms per request"
                    + (f", other statuses {run.statuses}" if run.statuses else ""))
        finally:
            stop_process(api, 15)
            server.stop()


def report(runs: list[Run], seconds: float) -> str:
    cores = os.cpu_count() or 1
    lines = [
        f"Machine: {cores} cores. `notify api` (aiohttp, one process) on the embedded valkey-server (AOF everysec), "
        "no workers running; the load generator (this script, aiohttp) in its own process on loopback, each connection posting as fast as "
        f"its answers come back, {seconds:g} s per run after a 1 s warm-up; every event a new business key "
        "(transaction / order_shipped, one recipient). Counted: events answered 202 (in the stream, idempotency "
        "record written).",
        "",
        "| request | connections | events/s | requests/s | request p50 ms | p99 ms | CPU s: API / redis / generator "
        "| other | not 202 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        cpu = " / ".join(f"{r.cpu.get(k, 0):.1f}" for k in ("api", "redis", "load generator"))
        lines.append(f"| {r.mode} | {r.connections} | **{r.rate:,.0f}** | {r.requests / r.seconds:,.0f} "
                     f"| {pct(r.latency_ms, 50):.1f} | {pct(r.latency_ms, 99):.1f} | {cpu} | {r.other_cpu:.1f} "
                     f"| {r.statuses or '-'} |")
    api_bound = [r.mode for r in runs if r.cpu.get("api", 0) > 0.85 * r.seconds]
    gen_bound = [r.mode for r in runs if r.cpu.get("load generator", 0) > 0.85 * r.seconds]
    lines.append("")
    if api_bound:
        lines.append(f"The API process used > 85% of a core in: {', '.join(api_bound)} (it is one process: "
                     "that is its ceiling on this machine).")
    if gen_bound:
        lines.append(f"**The load generator used > 85% of a core in: {', '.join(gen_bound)}: those figures are "
                     "bounded by the generator, not the API.**")
    busy = [r.mode for r in runs if r.other_cpu > 0.05 * r.seconds * cores]
    if busy:
        lines.append(f"**Other processes used > 5% of the machine during: {', '.join(busy)}.**")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="counted seconds per run")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--batch", type=int, default=100, help="events per batch request (API limit 500)")
    ap.add_argument("--quick", action="store_true", help="3 s per run, prints only")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.no_write = 3.0, True
    runs = [Run("single event", 1, args.connections), Run(f"batch of {args.batch}", args.batch, args.connections),
            Run("single event, 1 connection", 1, 1)]
    t0 = time.monotonic()
    measure(runs, args.seconds, log=lambda m: print(f"[{time.monotonic() - t0:6.1f}s] {m}", flush=True))
    body = report(runs, args.seconds)
    print(body)
    if not args.no_write:
        from bench.results import write_section

        command = "python bench/ingest.py" + (f" --seconds {args.seconds:g}" if args.seconds != 20 else "") + (
            f" --connections {args.connections}" if args.connections != 16 else "") + (
            f" --batch {args.batch}" if args.batch != 100 else "")
        write_section("ingest", command, body)


if __name__ == "__main__":
    main()
