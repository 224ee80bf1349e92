"""Master failover with replicas (issue 29 item 3): three masters with one replica
each, the real pipeline (two worker processes, the provider simulators in their own
process with a call ledger), a burst of events, and during it kill -9 of a master;
its replica takes over.

Target: the pipeline stalls (no new record settled) for at most the cluster's node
timeout + 5 s; 0 events lost; 0 duplicate provider calls (the effect ledger holds
across the failover). docs/adr/0003-cluster-failover.md says what stalls and why.

Which master is killed (both by default; ``NOTIFY_FAILOVER_VICTIM`` picks one):

``group``       the master holding the consumer group's state (``{g|notify}``:
                commits, leases, membership): the worst case, every lane waits
``partitions``  a master holding only partitions (and no group state)

Size: ``NOTIFY_FAILOVER_EVENTS`` (default :data:`EVENTS`). The figures are printed
(``pytest -s``).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from redis.cluster import RedisCluster

from tests.faults.drill import GROUP, K, Drill, verify
from tests.faults.scenarios import _crashes
from tests.faults.workload import make_workload
from pipeline.transport.committed import read_all_sync

from .cluster import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

EVENTS = int(os.environ.get("NOTIFY_FAILOVER_EVENTS") or 300)
VICTIMS = [os.environ["NOTIFY_FAILOVER_VICTIM"]] if os.environ.get("NOTIFY_FAILOVER_VICTIM") else ["group", "partitions"]
NODE_TIMEOUT_MS = 2000
STALL_BUDGET_S = NODE_TIMEOUT_MS / 1000 + 5


class _Server:
    """What :class:`Drill` wants of its server: a URL (one node, as ``notify run``
    is given one), and a stop (the cluster's)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.url = cluster.url

    def stop(self) -> None:
        self.cluster.stop()


class Progress(threading.Thread):
    """Samples the count of terminal records; the longest time without a new one."""

    def __init__(self, d: Drill) -> None:
        super().__init__(daemon=True)
        self.d = d
        self.samples: list[tuple[float, int]] = []
        self.stop_flag = False

    def run(self) -> None:
        last = -1
        while not self.stop_flag:
            n = self.d.count_terminal()
            if n != last:
                self.samples.append((time.monotonic(), n))
                last = n
            time.sleep(0.05)

    def longest_gap(self, since: float, until: float) -> float:
        """The longest interval in [since, until] with no new terminal record."""
        marks = [since] + [t for t, _ in self.samples if since < t < until] + [until]
        return max(b - a for a, b in zip(marks, marks[1:]))

    def first_settled_after(self, t: float) -> float:
        """When the count of terminal records first grew after ``t`` (inf if never)."""
        before = max((n for u, n in self.samples if u <= t), default=0)
        return next((u for u, n in self.samples if u > t and n > before), float("inf"))

    def settled_between(self, a: float, b: float) -> int:
        before = max((n for t, n in self.samples if t <= a), default=0)
        after = max((n for t, n in self.samples if t <= b), default=0)
        return after - before


def _victim(cluster: Cluster, which: str) -> int:
    group_node = cluster.node_of_key(K.offsets(GROUP))
    if which == "group":
        return group_node
    # a master with partitions but no group state, and not the seed node the workers were given
    return next(i for i in cluster.masters() if i not in (group_node, 0))


@pytest.mark.parametrize("which", VICTIMS)
def test_master_failover_during_a_burst(tmp_path: Path, which: str):
    cluster = Cluster(tmp_path / "cluster", replicas=True, node_timeout_ms=NODE_TIMEOUT_MS).start()
    w = make_workload(EVENTS, 29, prefix="fo", specials=1)
    d = Drill(tmp_path / "drill", server=_Server(cluster))  # stops the cluster too
    d.r.close()
    d.r = RedisCluster.from_url(cluster.url)
    # the harness's wait for applied preferences reads the group's offsets: from the cluster
    d.pipe.committed = lambda topic, group="notify": sum(  # type: ignore[method-assign]
        int(v) for k, v in read_all_sync(d.r, K, group).items()
        if k.startswith(topic.encode() + b"|") and not k.endswith(b"@"))
    progress = Progress(d)
    try:
        d.seed_users(w)
        d.start_all()
        d.wait_users()
        progress.start()
        victim = _victim(cluster, which)
        held = sorted({f"{t}|{p}" for t in ("notify.events", "notify.events.high") for p in range(4)
                       if cluster.node_of_key(K.stream(t, p)) == victim})
        feed_s = 8.0
        feeder_error: list[BaseException] = []

        def feed() -> None:
            # a producer's write that meets the dead master fails (the master, or the
            # cluster, is down until the promotion); like any producer it tries the
            # chunk again: a chunk written twice is deduplicated by its business keys
            size = -(-len(w.events) // 20)
            try:
                for i in range(0, len(w.events), size):
                    deadline = time.monotonic() + 4 * NODE_TIMEOUT_MS / 1000 + 10
                    while True:
                        try:
                            d.feed(w.events[i:i + size])
                            break
                        except Exception:  # noqa: BLE001 - the failover: tried again until the deadline
                            if time.monotonic() > deadline:
                                raise
                            time.sleep(0.5)
                    d.fed = i + len(w.events[i:i + size])
                    time.sleep(feed_s / 20)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                feeder_error.append(exc)

        feeder = threading.Thread(target=feed, daemon=True)
        t_burst = time.monotonic()
        feeder.start()
        while d.fed < 0.4 * len(w.events) and feeder.is_alive():
            time.sleep(0.02)
        done_at_kill = d.count_terminal()
        t_kill = time.monotonic()
        promoted, promote_s = cluster.kill_master(victim)
        t_promoted = time.monotonic()
        feeder.join(120)
        settle_s = d.wait_settled(w.expected, timeout=180, stall_s=60)
        t_end = time.monotonic()
        progress.stop_flag = True
        progress.join()

        got = d.records()
        ledger = d.sims.ledger()
        v = verify(w.expected, got, ledger, may_review=True)
        taken = Counter(r["key"] for r in ledger if r.get("op") == "send" and r.get("key")
                        and r.get("accepted") and not r.get("duplicate"))
        twice = sorted(k for k, n in taken.items() if n > 1)
        stall_s = progress.longest_gap(t_kill, t_end)
        # what settles while the master is down, not counting the work in flight at the kill
        settled_in_outage = progress.settled_between(t_kill + 1.0, t_promoted)
        resumed_after_promotion_s = progress.first_settled_after(max(t_kill + 1.0, t_promoted)) - t_promoted
        before_s = progress.longest_gap(t_burst, t_kill)
        crashes = _crashes(d)
        figures = {
            "events": len(w.events), "expected records": len(w.expected), "victim": f"node {victim} ({which})",
            "partitions of the events' topics on the victim": held, "terminal records at the kill": done_at_kill,
            "replica promoted (node)": promoted, "kill → promoted, cluster_state:ok (s)": round(promote_s, 2),
            "records settled while the master was down": progress.settled_between(t_kill, t_promoted),
            "... of them from 1 s after the kill (not work already in flight)": settled_in_outage,
            "first record settled after the promotion (s after it)": round(resumed_after_promotion_s, 2),
            "longest stall after the kill (s)": round(stall_s, 2),
            "longest gap before the kill (s)": round(before_s, 2),
            "stall budget (node timeout + 5 s)": STALL_BUDGET_S, "settled after the feed ended (s)": round(settle_s, 2),
            "lost": len(v.lost), "wrong state": len(v.wrong), "extra": len(v.extra),
            "provider calls": v.calls, "accepted calls": v.accepted_calls,
            "delivery ids taken twice by a provider": len(twice),
            "duplicates the promise allows (after a 'not found' query)": len(v.duplicated_allowed),
            "REVIEW": v.review, "reconciled": v.reconciled, "feeder error": repr(feeder_error[:1]),
            "workers alive": len(d.live()), "crashes": crashes,
        }
        print("\n== master failover with replicas ==")
        for k, val in figures.items():
            print(f"  {k}: {val}")
        assert not feeder_error, feeder_error
        assert not crashes, crashes
        assert not v.lost, f"lost {len(v.lost)}: {v.lost[:5]}"
        assert not v.wrong and not v.extra, v.problems()
        assert not twice and not v.duplicated, (twice[:5], v.duplicated[:5])
        assert stall_s <= STALL_BUDGET_S, figures
        # Measured (docs/adr/0003, "Which lanes keep moving"): 0 records settle from
        # 1 s after the kill to the promotion in either case (also with a producer
        # retrying a failed partition apart, tried on a branch): redis-py's ClusterPipeline retries a dead
        # node's connection errors inside execute() (5 retries, ~3 s of backoff), so
        # the batch holding it, and its live partitions, wait about the promotion.
        # What holds: the lanes move again soon after the promotion.
        assert resumed_after_promotion_s <= 2.0, figures
    finally:
        progress.stop_flag = True
        d.stop()
