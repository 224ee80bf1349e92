"""Benchmark (not a test): `notify demo` on one server and on a Redis Cluster of three
masters, in the same run; writes nothing, prints a markdown section for
bench/RESULTS.md ("cluster").

    .venv/bin/python bench/cluster.py [--events 5000]

Each run: a fresh data directory, `notify run` as it starts by default (the
embedded server; or ``REDIS_URL`` naming one node of the cluster, which
`notify run` detects), then `notify demo --events N`, timed from its start to its
end (every record terminal). On the cluster it also reports, per master, the
commit scripts it served (``INFO commandstats``: evalsha of COMMIT_PART and the
others) and which of the group's keys it holds: the commits by partition index
(``{g|<group>|<p>}``, docs/adr/0004-group-state-by-partition.md) and the group's
own tag (leases, membership).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.cli.demo import wait_ready  # noqa: E402
from pipeline.procs import stop_process  # noqa: E402
from pipeline.transport.keys import Keys  # noqa: E402
from tests.transport.cluster import Cluster  # noqa: E402

GROUPS = ("notify", "notify-priority")


def _env(data: Path, redis_url: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "NOTIFY_BROKER", "NOTIFY_PARTITIONS")}
    env.update(NOTIFY_DATA_DIR=str(data), PYTHONPATH=str(ROOT))
    if redis_url:
        env["REDIS_URL"] = redis_url
    return env


def demo(events: int, redis_url: str | None = None) -> dict:
    data = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    env = _env(data, redis_url)
    log = open(data / "run.log", "w")
    run = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", "--api-port", "0", "--metrics-port", "0"],
                           cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        flag = data / "broker.url"
        deadline = time.time() + 60
        while not flag.exists() and time.time() < deadline:
            time.sleep(0.1)
        wait_ready(flag.read_text().strip())
        time.sleep(3)  # the workers own their slots
        t0 = time.time()
        out = subprocess.run([sys.executable, "-m", "pipeline.cli", "demo", "--events", str(events)], cwd=str(ROOT),
                             env=env, capture_output=True, text=True, timeout=1800).stdout
        took = time.time() - t0
    finally:
        stop_process(run, 60)
    table = out.split("state ", 1)[1].split("\n\n", 1)[0].splitlines()[1:] if "state " in out else []
    records = sum(int(m.group(1)) for line in table if (m := re.search(r"\s(\d+)(?:\s+\(|$)", line)))
    lat = {m.group(1): (int(m.group(2)), float(m.group(3)), float(m.group(4)))
           for m in re.finditer(r"^(high|normal|low)\s+(\d+)\s+([\d.]+)\s+([\d.]+)", out, re.M)}
    return {"records": records, "seconds": took, "rate": records / took, "latency": lat, "out": out}


def per_master(cluster: Cluster) -> list[dict]:
    keys = Keys()
    rows = []
    masters = cluster.masters()
    parts = range(8)
    for i in masters:
        with cluster.client(i) as r:
            stats = r.info("commandstats")
            ev = stats.get("cmdstat_evalsha", {}).get("calls", 0)
            hs = stats.get("cmdstat_hset", {}).get("calls", 0)
            total = sum(v.get("calls", 0) for v in stats.values())
        commits = [f"{g}|{p}" for g in GROUPS for p in parts if cluster.node_of_key(keys.commits(g, p)) == i]
        group = [g for g in GROUPS if cluster.node_of_key(keys.lease(g, 0)) == i]
        rows.append({"node": i, "evalsha": ev, "hset": hs, "commands": total, "commits": commits, "group": group})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=5000)
    args = ap.parse_args()
    single = demo(args.events)
    print(f"one server: {single['records']} records in {single['seconds']:.1f} s", flush=True)
    base = Path(tempfile.mkdtemp(prefix="cluster-nodes-"))
    cluster = Cluster(base).start()
    try:
        multi = demo(args.events, cluster.url)
        print(f"three masters: {multi['records']} records in {multi['seconds']:.1f} s", flush=True)
        masters = per_master(cluster)
    finally:
        cluster.stop()
    print(f"\n`.venv/bin/python bench/cluster.py --events {args.events}`\n")
    print("| broker | records | demo s | records/s | high p50 / p99 ms | normal p50 / p99 ms | low p50 / p99 ms |")
    print("|---|---:|---:|---:|---|---|---|")
    for name, r in (("one server (embedded)", single), ("Redis Cluster, three masters", multi)):
        lat = " | ".join(f"{r['latency'][p][1]:,.0f} / {r['latency'][p][2]:,.0f}" if p in r["latency"] else "-"
                         for p in ("high", "normal", "low"))
        print(f"| {name} | {r['records']:,} | {r['seconds']:.1f} | {r['rate']:,.0f} | {lat} |")
    print(f"\nCluster / one server: **{multi['rate'] / single['rate']:.2f}**\n")
    print("| master | commands | evalsha | commit hashes held (group\\|partition index) | group tag (leases) |")
    print("|---|---:|---:|---|---|")
    for m in masters:
        print(f"| {m['node']} | {m['commands']:,} | {m['evalsha']:,} | {', '.join(m['commits']) or '-'} | "
              f"{', '.join(m['group']) or '-'} |")


if __name__ == "__main__":
    main()
