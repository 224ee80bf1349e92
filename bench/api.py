"""Benchmark (not a test): the API's door under many concurrent clients (issue 26,
item 3). ``POST /v1/events`` at 100, 1,000 and 5,000 concurrent clients: accepted
events per second, request latency p50 / p99, and everything that is not a 202
counted: 429 ``over_capacity`` (the API's answer when every broker connection
stays busy, pipeline/api/errors.py), other 4xx, 5xx, and dropped connections
(a reset, a refused connect, no answer within ``--timeout``).

    python bench/api.py [--clients 100,1000,5000] [--requests 20000] [--timeout 60]
    python bench/api.py --clients 100 --requests 500          # a quick sanity check
    python bench/api.py --url http://127.0.0.1:8080 --key "$KEY"   # against a running `notify run`

Without ``--url`` it starts what ``notify run`` starts for the API: the embedded
server (valkey-server, AOF everysec) and ``python -m pipeline.cli api`` in its own
process (pipeline/api/server.py: the door's header and body deadlines), with a
bootstrap key; no worker runs (acceptance only: an event is accepted once it is in
its stream with its idempotency record). With ``--url`` it posts to that API with
``--key`` (scope events:write). Each client is its own TCP connection (aiohttp,
real sockets, kept alive), posting one event per request, each a new business key
(transaction / order_shipped, one recipient), as fast as its answers come back,
until the level's ``--requests`` are sent. Prints a markdown table; writes nothing
to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import orjson

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))

from bench.e2e import cpu_seconds, wait  # noqa: E402
from bench.otp import pct  # noqa: E402
from pipeline.embedded import free_port  # noqa: E402
from pipeline.procs import stop_process  # noqa: E402

KEY = "bench-api-key-" + uuid.uuid4().hex
PARTITIONS = 8


@dataclass
class Level:
    clients: int
    requests: int
    seconds: float = 0.0
    accepted: int = 0
    latency_ms: list = field(default_factory=list)  # of every answered request
    statuses: Counter = field(default_factory=Counter)  # answered, not 202: status → count
    dropped: Counter = field(default_factory=Counter)  # no answer: exception name → count
    api_cpu: Optional[float] = None
    gen_cpu: float = 0.0

    @property
    def rate(self) -> float:
        return self.accepted / self.seconds if self.seconds else 0.0

    @property
    def server_errors(self) -> int:
        return sum(n for s, n in self.statuses.items() if s >= 500)


def event(tag: str, i: int) -> bytes:
    return orjson.dumps({
        "biz_key": f"{tag}:{i}", "category": "transaction", "template": "order_shipped",
        "recipients": [f"u{i % 100_000}"],
        "params": {"order_no": f"O{i}", "carrier": "UPS", "tracking_no": f"1Z{i:08d}",
                   "tracking_url": f"https://t.example/{i}"},
    })


async def run_level(url: str, key: str, level: Level, timeout: float) -> None:
    import aiohttp

    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    tag = f"bench-api-{level.clients}-{uuid.uuid4().hex[:8]}"
    loop = asyncio.get_running_loop()
    next_i = iter(range(level.requests))

    async def client(session: "aiohttp.ClientSession") -> None:
        for i in next_i:  # shared: the clients together send level.requests
            t = loop.time()
            try:
                async with session.post(url, data=event(tag, i), headers=headers) as resp:
                    await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                level.dropped[type(exc).__name__] += 1
                continue
            level.latency_ms.append((loop.time() - t) * 1000)
            if status == 202:
                level.accepted += 1
            else:
                level.statuses[status] += 1

    # one connection per client: no pool limit, none shared between two clients at once
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        t0 = loop.time()
        await asyncio.gather(*(client(session) for _ in range(level.clients)))
        level.seconds = loop.time() - t0


def raise_fd_limit(need: int) -> None:
    """Sockets for every client here and in the API (a child inherits the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, need)) if hard != resource.RLIM_INFINITY else max(soft, need)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if want < need:
        print(f"warning: at most {want} open files (need ~{need}): connections may fail", flush=True)


def start_api(tmp: Path, log, key: str = KEY, log_name: str = "api-bench.log"):
    """The embedded server and ``python -m pipeline.cli api`` (as ``notify run`` starts it),
    listening; ``key`` is its bootstrap key. Returns (server, API process, base URL)."""
    from pipeline.embedded import EmbeddedRedis

    server = EmbeddedRedis(tmp / "redis").start()  # AOF everysec
    port = free_port()
    env = dict(os.environ, NOTIFY_BROKER=server.url, NOTIFY_API_KEY=key, NOTIFY_DATA_DIR=str(tmp / "data"),
               NOTIFY_DB=str(tmp / "records.db"), NOTIFY_PARTITIONS=str(PARTITIONS), PYTHONPATH=str(ROOT))
    OUT.mkdir(parents=True, exist_ok=True)
    api = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "api", "--port", str(port)], cwd=str(ROOT),
                           env=env, stdout=open(OUT / log_name, "w"), stderr=subprocess.STDOUT)

    def listening() -> bool:
        if api.poll() is not None:
            raise RuntimeError(f"the API exited with {api.returncode}; see bench/out/{log_name}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    wait(listening, 60, "the API to listen")
    log(f"API on 127.0.0.1:{port} (pid {api.pid}), broker {server.url}")
    return server, api, f"http://127.0.0.1:{port}"


def measure(levels: list[Level], url: Optional[str], key: Optional[str], timeout: float, log=print) -> None:
    raise_fd_limit(2 * max(lv.clients for lv in levels) + 256)
    with tempfile.TemporaryDirectory(prefix="notify-api-bench-") as tmpdir:
        server = api = None
        if url is None:
            server, api, url = start_api(Path(tmpdir), log)
            key = KEY
        try:
            for level in levels:
                api0 = cpu_seconds(api.pid) if api else None
                gen0 = cpu_seconds(os.getpid())
                asyncio.run(run_level(url.rstrip("/") + "/v1/events", key or "", level, timeout))
                level.api_cpu = cpu_seconds(api.pid) - api0 if api else None
                level.gen_cpu = cpu_seconds(os.getpid()) - gen0
                log(f"{level.clients} clients: {level.accepted}/{level.requests} accepted in {level.seconds:.1f} s "
                    f"({level.rate:,.0f}/s), p50 {pct(level.latency_ms, 50):.1f} ms, p99 {pct(level.latency_ms, 99):.1f} ms"
                    + (f", not 202: {dict(level.statuses)}" if level.statuses else "")
                    + (f", dropped: {dict(level.dropped)}" if level.dropped else ""))
        finally:
            if api is not None:
                stop_process(api, 15)
            if server is not None:
                server.stop()


def report(levels: list[Level], external: bool) -> str:
    where = ("the API at --url" if external else
             "`python -m pipeline.cli api` (as `notify run` starts it) on the embedded valkey-server (AOF everysec), "
             "no workers")
    lines = [
        f"Machine: {os.cpu_count()} cores. {where}; the load generator (this script, aiohttp, one process) on "
        "loopback, one kept-alive connection per client, one event per request, each a new business key.",
        "",
        "| clients | requests | accepted/s | p50 ms | p99 ms | 202 | 429 | other 4xx | 5xx | dropped "
        "| CPU s: API / generator |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for lv in levels:
        n429 = lv.statuses.get(429, 0)
        other4 = sum(n for s, n in lv.statuses.items() if 400 <= s < 500 and s != 429)
        dropped = sum(lv.dropped.values())
        cpu = f"{lv.api_cpu:.1f} / {lv.gen_cpu:.1f}" if lv.api_cpu is not None else f"- / {lv.gen_cpu:.1f}"
        lines.append(f"| {lv.clients:,} | {lv.requests:,} | **{lv.rate:,.0f}** | {pct(lv.latency_ms, 50):.1f} "
                     f"| {pct(lv.latency_ms, 99):.1f} | {lv.accepted:,} | {n429:,} | {other4:,} | {lv.server_errors:,} "
                     f"| {dropped:,}{' ' + str(dict(lv.dropped)) if dropped else ''} | {cpu} |")
    bound = [str(lv.clients) for lv in levels if lv.gen_cpu > 0.85 * lv.seconds]
    if bound:
        lines += ["", f"**The load generator used > 85% of a core at {', '.join(bound)} clients: those figures are "
                      "bounded by the generator, not the API.**"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="100,1000,5000", help="concurrent clients per level, comma-separated")
    ap.add_argument("--requests", type=int, default=20000, help="requests per level (at least one per client)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds a request may take before it counts as dropped")
    ap.add_argument("--url", help="an API already running (e.g. `notify run`'s http://127.0.0.1:8080)")
    ap.add_argument("--key", default=os.environ.get("NOTIFY_API_KEY"),
                    help="its API key with events:write (default $NOTIFY_API_KEY)")
    args = ap.parse_args()
    clients = [int(c) for c in args.clients.split(",") if c.strip()]
    if args.url and not args.key:
        ap.error("--url needs --key (or NOTIFY_API_KEY)")
    levels = [Level(c, max(args.requests, c)) for c in clients]
    t0 = time.monotonic()
    measure(levels, args.url, args.key, args.timeout,
            log=lambda m: print(f"[{time.monotonic() - t0:6.1f}s] {m}", flush=True))
    print(report(levels, bool(args.url)))
    return 1 if any(lv.server_errors or lv.dropped for lv in levels) else 0


if __name__ == "__main__":
    sys.exit(main())
