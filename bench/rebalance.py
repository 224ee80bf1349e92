"""Benchmark: elastic workers (``?members=dynamic``): rebalance time, and the time a
takeover takes with and without table standbys (``table_standby_replicas`` 1 / 0).

Per setting, on a server of its own: two workers of tests/transport/worker_app.py
load a table of ``--events`` keys (its changelog is what a takeover without a
warm standby replays), then

* join 2 → 3 and leave 3 → 2: the rebalance time, the server's (from the
  generation bump to the assignment written) and the members' (from seeing the
  generation to its assignment applied, the slowest member);
* leave takeover 2 → 1: a worker stops cleanly (SIGTERM); once it left the
  group (after its last commit) one probe event is sent to each partition it
  held; the time until all probes are processed;
* kill takeover 2 → 1: a new worker joins, gets half the partitions, and is
  killed (kill -9), same probes; this includes the lease running out (``--lease``).

    python bench/rebalance.py [--events 40000] [--lease 2]
"""

import argparse
import json
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import write_section  # noqa: E402
from pipeline.embedded import EmbeddedRedis  # noqa: E402
from pipeline.transport.keys import Keys  # noqa: E402
from pipeline.transport.membership import read_group_sync  # noqa: E402
from pipeline.transport.scripts import PRODUCE  # noqa: E402
from tests.transport.helpers import Worker, produce, wait_until  # noqa: E402

K = Keys()
PARTITIONS = 4
GROUP = "t"


def settled(r, n):
    st = read_group_sync(r, K, GROUP)
    return st if len(st.live) == n and st.assign_gen == st.gen and len(st.assignments) == n else None


def member_of(worker):
    found = re.findall(r"member (\w+) joined group", worker.log())
    return found[-1] if found else None


def applied_in(worker, gen):
    found = re.findall(rf"generation {gen} applied in ([0-9.]+)s", worker.log())
    return float(found[-1]) if found else None


def ops_partitions(st, member):
    a = json.loads(st.assignments[member])
    return sorted(a["actives"].get("ops", []))


def probe(r, parts, start_i):
    """One op per partition (keys chosen to land there), appended straight with the
    transport's PRODUCE script (a Faust producer takes longer to start than the
    takeover); returns the probe numbers."""
    from aiokafka.partitioner import DefaultPartitioner

    assert parts, "no partitions to probe"
    part = DefaultPartitioner()
    script = r.register_script(PRODUCE)
    nums, j = [], 0
    for p in parts:
        while True:
            key = f"probe{j}".encode()
            j += 1
            if part(key, list(range(PARTITIONS)), list(range(PARTITIONS))) == p:
                break
        i = start_i + len(nums)
        value = json.dumps({"op": "set", "v": i, "i": i}).encode()
        script(keys=[K.stream("ops", p), K.counter("ops", p), K.fence("ops", p)],
               args=["", 1, repr(time.time()), 3, key, value, 0])
        nums.append(i)
    return nums


def run(standbys, n_events, lease, workdir):
    server = EmbeddedRedis(workdir / "redis").start()
    r = redis.Redis.from_url(server.url)
    url = server.url + f"?members=dynamic&lease={lease}&compact=0"
    env = dict(PARTITIONS=PARTITIONS, STANDBYS=standbys)
    workers = []
    out = {"standbys": standbys}
    try:
        # distinct keys: the changelog holds one entry per op whatever the table
        # cache coalesces between commits
        ops = [(f"k{i}".encode(), json.dumps({"op": "set", "v": i, "i": i}).encode()) for i in range(n_events)]
        for start in range(0, n_events, 5000):
            produce(server.url, "ops", ops[start:start + 5000], partitions=PARTITIONS)
        w1 = Worker(url, workdir, f"s{standbys}-w1", **env).start()
        w2 = Worker(url, workdir, f"s{standbys}-w2", **env).start()
        workers += [w1, w2]
        wait_until(lambda: settled(r, 2), 120, what="2 members")
        wait_until(lambda: r.scard("ops-seen") >= n_events, 600, 0.2, what="table loaded")
        time.sleep(2.0)  # standbys catch up with the changelog tail
        # join 2 → 3, then leave 3 → 2: rebalance times
        w3 = Worker(url, workdir, f"s{standbys}-w3", **env).start()
        workers.append(w3)
        st = wait_until(lambda: settled(r, 3), 120, what="3 members")
        wait_until(lambda: all(applied_in(w, st.gen) is not None for w in workers), 60, what="all applied")
        out["join_server_ms"] = st.duration_ms
        out["join_member_s"] = max(applied_in(w, st.gen) for w in workers)
        time.sleep(1.0)
        w3.stop()
        workers.remove(w3)
        st = wait_until(lambda: settled(r, 2), 60, what="w3 left")
        out["leave_server_ms"] = st.duration_ms
        time.sleep(2.0)
        # leave takeover 2 → 1: the survivor has room for every partition, so Faust's
        # assignor promotes its standbys (with 3 → 2 the capacity rule may hand the
        # leaver's partitions to a member without a copy)
        leaver = member_of(w2)
        mine = ops_partitions(st, leaver)
        w2.signal(signal.SIGTERM)
        # from the moment it left the group (after its last commit): it processes
        # whatever arrives before, so the probes go out then
        wait_until(lambda: leaver not in read_group_sync(r, K, GROUP).live, 60, 0.005, what="w2 left")
        t0 = time.monotonic()
        nums = probe(r, mine, n_events)
        wait_until(lambda: all(r.sismember("ops-seen", i) for i in nums), 120, 0.01, what="probes after leave")
        out["leave_takeover_s"] = time.monotonic() - t0
        w2.stop()
        workers.remove(w2)
        # kill takeover 2 → 1: a new worker joins, takes half the partitions (the
        # survivor keeps a standby copy of them), and is killed
        w4 = Worker(url, workdir, f"s{standbys}-w4", **env).start()
        workers.append(w4)
        st = wait_until(lambda: settled(r, 2), 120, what="w4 joined")
        wait_until(lambda: member_of(w4) in st.live and ops_partitions(st, member_of(w4)), 10, what="w4 active")
        mine = ops_partitions(st, member_of(w4))
        time.sleep(3.0)  # standbys catch up
        t0 = time.monotonic()
        w4.kill()
        nums = probe(r, mine, n_events + 100)
        st = wait_until(lambda: settled(r, 1), 60, 0.01, what="w4 expelled")
        out["kill_detect_s"] = time.monotonic() - t0
        wait_until(lambda: all(r.sismember("ops-seen", i) for i in nums), 120, 0.01, what="probes after kill")
        out["kill_takeover_s"] = time.monotonic() - t0
        out["changelog_entries"] = sum(r.xlen(K.stream("t-kv-changelog", p)) for p in range(PARTITIONS))
    finally:
        for w in workers:
            w.kill()
        r.close()
        server.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=40000)
    ap.add_argument("--lease", type=float, default=2.0)
    ap.add_argument("--no-write", action="store_true", help="print only (do not touch bench/RESULTS.md)")
    ap.add_argument("--keep", help="directory for the worker logs (default: a temporary one)")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for standbys in (0, 1):
            d = Path(args.keep) / f"s{standbys}" if args.keep else Path(tmp) / f"s{standbys}"
            d.mkdir()
            res = run(standbys, args.events, args.lease, d)
            print(res, flush=True)
            results.append(res)
    f = lambda v, nd=2: "-" if v is None else f"{v:.{nd}f}"  # noqa: E731
    rows = [
        "| standbys | changelog entries | join: server ms | join: slowest member s | leave: server ms "
        "| leave: takeover s | kill -9: expelled after s | kill -9: takeover s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in results:
        rows.append(
            f"| {x['standbys']} | {x['changelog_entries']:,} | {x['join_server_ms']} | {f(x['join_member_s'], 3)} "
            f"| {x['leave_server_ms']} | {f(x['leave_takeover_s'])} | {f(x['kill_detect_s'])} "
            f"| {f(x['kill_takeover_s'])} |"
        )
    body = (
        f"{PARTITIONS} partitions, a table of {args.events:,} keys (one set op each) "
        f"(memory-ordered store), workers of tests/transport/worker_app.py, member lease "
        f"{args.lease:g} s.\n\n" + "\n".join(rows) + "\n\n"
        "Join: the server's time from the generation bump to the assignment written, and the slowest member's "
        "time from seeing the generation to its assignment applied (revoke, commit, acknowledge, wait for "
        "the leader, fence, hand over to Faust). Takeover: from the worker leaving the group (clean stop, after "
        "its last commit) or from its kill -9 until one probe "
        "event on every partition the worker held is processed by a survivor: with a standby the survivor "
        "reads only the changelog tail it has not applied; without, it replays the partition's whole "
        "changelog. The kill -9 takeover includes the lease running out.\n"
    )
    print(body)
    if not args.no_write:
        write_section("rebalance", f"python bench/rebalance.py --events {args.events} --lease {args.lease:g}", body)


if __name__ == "__main__":
    main()
