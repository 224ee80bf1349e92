"""``notify status``: lag per topic (pipeline/lag.py), slots, processes, circuit
breakers and the scaling signal."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .broker import broker_keys, broker_url, current_settings, redis_client
from .text import printable

__all__ = ["cmd_status", "print_lag", "print_scaling", "print_breakers", "print_processes"]


def cmd_status(args) -> int:
    """Lag per topic, slots, processes, breakers. Every key is read by name (a
    pipeline: one round trip per node on a Redis Cluster) except the slot leases,
    found with SCAN, on every master of a cluster."""
    from pipeline.lag import read_positions_sync
    from pipeline.reader import is_cluster_client
    from pipeline.topics import ALL
    from pipeline.transport.client import public_url

    settings = current_settings()
    url = broker_url(settings)
    r = redis_client(url)
    keys = broker_keys(url)
    positions, _ = read_positions_sync(r, keys, {topic: settings.partitions for topic in ALL})
    cluster = is_cluster_client(r)
    print(f"broker {public_url(url)}" + (f" (Redis Cluster, {len(r.get_primaries())} masters)" if cluster else ""))
    print_lag(positions)
    leases = {printable(k).rsplit(":", 1)[1]: printable(r.get(k) or b"-")
              for k in r.scan_iter(keys.lease("notify", 0)[:-1] + "*")}
    print("slots:", ", ".join(f"{s}→{o}" for s, o in sorted(leases.items())) or "none held")
    from pipeline.transport.membership import format_group, read_group_sync

    group = read_group_sync(r, keys, "notify")
    if group.gen:
        print(format_group(group, now_ms=int(r.time()[0] * 1000)))
    print_processes(r.hgetall(keys.supervisor))
    print_breakers(r.hgetall(keys.breakers))
    print_scaling(url, keys, settings.partitions)
    return 0


def print_lag(positions: Any) -> None:
    """Highwater, committed offset and lag of every topic read (pipeline/lag.py
    ``Positions``: a priority topic is as far as the furthest of the groups that take
    turns on it, as the API's lag says); "?" where another writer left something
    that is not a number."""
    from pipeline.topics import UNREAD

    print(f"{'topic':34} {'highwater':>10} {'committed':>10} {'lag':>8}")
    for topic, partitions in positions.counts.items():
        hws = [positions.highwater[(topic, p)] for p in range(partitions)]
        cms = [positions.committed((topic, p)) for p in range(partitions)]
        hw: Any = "?" if None in hws else sum(hws)
        cm: Any = "?" if None in cms else sum(cms)
        if topic in UNREAD:  # no agent reads it: a depth, no lag
            print(f"{topic:34} {hw:>10} {'-':>10} {'-':>8}")
            continue
        lag = "?" if "?" in (hw, cm) else hw - cm
        print(f"{topic:34} {hw:>10} {cm:>10} {lag:>8}")


def print_scaling(url: str, keys: Any, partitions: int) -> None:
    """Workers each priority needs to meet its latency goal at the drain rate
    measured over one second (pipeline/rules/scaling.py, docs/SCALING.md)."""
    from pipeline.api.metrics_lag import LagSampler, scaling
    from pipeline.transport.client import connect

    async def measure() -> list:
        client = await connect([url], attempts=1)
        try:
            sampler = LagSampler(client, keys, partitions, min_interval=0.0)
            await sampler.snapshot(force=True)
            await asyncio.sleep(1.0)
            snap = await sampler.snapshot(force=True)
            return scaling(snap) if snap.ok else []
        finally:
            await client.aclose()

    loads = asyncio.run(measure())
    if not loads:
        return
    print(f"{'priority':9} {'workers':>7} {'lag':>8} {'oldest':>9} {'drain':>9} {'goal':>6} {'needed':>7}")
    for x in loads:
        drain = "-" if x.time_to_drain_s is None else f"{x.time_to_drain_s:.1f}s"
        print(f"{x.priority:9} {x.workers:>7} {x.lag:>8} {x.oldest_age_s:>8.1f}s {drain:>9} {x.goal_s:>5.0f}s "
              f"{x.needed:>7}")


def print_breakers(raw: dict) -> None:
    """Every worker's circuit breakers (pipeline/breakers.py), one line each."""
    from pipeline.breakers import read_breakers

    boards = read_breakers(raw)
    if not boards:
        return
    print(f"{'provider':12} {'worker':28} {'breaker':>10} {'since':>20}")
    for provider, workers in sorted(boards.items()):
        for worker, b in sorted(workers.items()):
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(b.get("since", 0)))
            print(f"{provider:12} {worker:28} {b.get('state', '?'):>10} {since:>20}")


def print_processes(raw: dict) -> None:
    """The processes `notify run` supervises (pipeline/supervise.py), one line each."""
    from pipeline.supervise import read_states

    states = read_states(raw)
    if not states:
        return
    print(f"{'process':28} {'state':>8} {'pid':>8} {'restarts':>8} {'last exit':>9}")
    for name, st in sorted(states.items()):
        state = "LOOPING" if st.get("crash_loop") else ("up" if st.get("up") else "down")
        print(f"{name:28} {state:>8} {st.get('pid') or '-':>8} {st.get('restarts', 0):>8} "
              f"{'-' if st.get('last_exit') is None else st['last_exit']:>9}")
