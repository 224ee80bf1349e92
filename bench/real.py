"""The benchmark of record: what a user runs. ``notify run`` as it starts by default
(the priority process, a main worker per core, the simulators in a process per
provider family answering like providers: p50 ~30 ms, p99 ~300 ms, 1 in 1,000 calls
hanging until the client's timeout, 1% errors, quotas), the real adapters, a
campaign burst of N events (several recipients each, every channel) while OTPs
arrive at 20/s throughout; then the same run with ``--providers fake`` (in-process
fakes answering at once), for the ratio.

    .venv/bin/python bench/real.py [--events 50000] [--otp-rate 20] [--providers simulators,fake] [--calls] [--section real-run]

Reported per run: notifications/s (99% of the campaign's records over the time
from its first acceptance until 99% of them settled, i.e. reached their first
terminal state; the time the last one settled is shown beside it: retries end
minutes later by design; the OTPs, which arrive until the run ends, are not
counted in it), OTP p50/p99/max from acceptance to the provider call and to the
terminal state, per priority the share of records terminal within 60 s of
acceptance (quiet-hours deferrals excluded), CPU seconds per process and the
seconds each waited for a core, and the pipeline's CPU per record without the
simulators. The run writes its generated section of bench/RESULTS.md
(``--section``, default ``real-run``; the commentary of the hand-written "real"
section refers to it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.cli.demo import wait_applied, wait_ready  # noqa: E402
from pipeline.cli.send import send_raw  # noqa: E402
from pipeline.procs import stop_process  # noqa: E402
from pipeline.topics import event_key  # noqa: E402

TERMINAL = ("FILTERED", "ACCEPTED", "DELIVERED", "UNDELIVERED", "FAILED", "REVIEW", "SCHEDULED")


def users(n: int) -> tuple[list, list]:
    prefs, devs = [], []
    for i in range(n):
        u = f"r{i}"
        prefs.append((u.encode(), orjson.dumps({"user_id": u, "version": 1, "phone": f"+1555{i:06d}9",
                                                "email": f"r{i}@example.com"})))
        devs.append((u.encode(), orjson.dumps({"user_id": u, "token": f"{i:064x}" if i % 2 else f"tok-{i}",
                                               "platform": "apns" if i % 2 else "fcm", "op": "add"})))
    return prefs, devs


def campaign(start: int, n: int, n_users: int, rng: random.Random) -> list:
    out = []
    for i in range(start, start + n):
        to = [f"r{rng.randrange(n_users)}" for _ in range(rng.choice([1, 2, 3, 5]))]
        if i % 2:
            ev = {"category": "marketing", "template": "promo", "channels": ["push", "email", "inbox"],
                  "params": {"headline": "Sale", "discount": "20%", "url": "https://shop"}}
        else:
            ev = {"category": "transaction", "template": "order_shipped", "channels": ["sms", "email", "inbox", "push"],
                  "params": {"order_no": f"A{i}", "carrier": "UPS", "tracking_no": "1Z", "tracking_url": "https://t"}}
        ev.update(biz_key=f"real:c:{i}", recipients=to, accepted_at=time.time())
        out.append((event_key(ev["biz_key"], to), orjson.dumps(ev)))
    return out


def otp(i: int, n_users: int) -> tuple:
    u = f"r{(i * 7919) % n_users}"
    ev = {"biz_key": f"real:otp:{i}", "category": "otp", "template": "otp", "recipients": [u], "channels": ["sms"],
          "params": {"code": f"{i % 1_000_000:06d}"}, "accepted_at": time.time()}
    return event_key(ev["biz_key"], [u]), orjson.dumps(ev)


def counts(db: Path) -> tuple[int, int]:
    """Records of the campaign (not the OTPs, which keep coming until the end), and
    how many of them are settled."""
    if not db.exists():
        return 0, 0
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return con.execute(f"SELECT count(*), sum(status IN ({','.join('?' * len(TERMINAL))})) FROM notify_record"
                           " WHERE category != 'otp'", TERMINAL).fetchone()
    except sqlite3.OperationalError:
        return 0, 0
    finally:
        con.close()


def pct(xs: list, p: float) -> float:
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


def run(providers: str, events: int, n_users: int, otp_rate: float, timeout: float, calls: bool = False) -> dict:
    data = Path(tempfile.mkdtemp(prefix=f"real-{providers}-"))
    env = dict(os.environ, NOTIFY_DATA_DIR=str(data), PYTHONPATH=str(ROOT))
    if calls:  # every worker under cProfile (config/environment.py NOTIFY_PROFILE_DIR)
        env["NOTIFY_PROFILE_DIR"] = str(data / "profiles")
    env.pop("REDIS_URL", None)
    log = open(data / "run.log", "w")
    run = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", "--metrics-port", "0", "--api-port",
                            str(_free_port()), "--providers", providers], cwd=str(ROOT), env=env, stdout=log,
                           stderr=subprocess.STDOUT)
    try:
        flag = data / "broker.url"
        deadline = time.time() + 60
        while not flag.exists() and time.time() < deadline:
            time.sleep(0.1)
        url = flag.read_text().strip()
        wait_ready(url)
        prefs, devs = users(n_users)
        asyncio.run(send_raw(url, "notify.preferences", prefs))
        asyncio.run(send_raw(url, "notify.devices", devs))
        # the profiles applied in both consumer groups, as a deployment's are before its
        # traffic: a fixed 3 s was not always enough on a slow hour, and the OTPs of the
        # first seconds then waited on the guard's read barrier for their users' pending
        # updates (agents/applied.py), up to 2 s, which set the run's OTP p99
        took = wait_applied(url, ("notify.preferences", "notify.devices"), timeout=120)
        print(f"real: {len(prefs)} users and {len(devs)} devices applied in {took:.1f}s", flush=True)
        procs = {p.pid: p for p in psutil.Process(run.pid).children()}
        cpu0 = {pid: sum(p.cpu_times()[:2]) for pid, p in procs.items()}
        wait0 = {pid: waited_for_a_core(pid) for pid in procs}
        stop = threading.Event()
        sent = [0]

        def otps() -> None:  # 20/s throughout, as producers send them
            i = 0
            while not stop.is_set():
                asyncio.run(send_raw(url, "notify.events.high", [otp(i, n_users)]))
                i += 1
                sent[0] = i
                stop.wait(1 / otp_rate)

        t = threading.Thread(target=otps, daemon=True)
        t0 = time.time()
        t.start()
        rng = random.Random(11)
        for i in range(0, events, 5000):  # the burst, as fast as a producer writes it
            asyncio.run(send_raw(url, "notify.events", campaign(i, min(5000, events - i), n_users, rng)))
        db = data / "records.db"
        last, still = (0, 0), 0
        while time.time() - t0 < timeout:
            total, done = counts(db)
            if total and (total, done) == last and done == total:
                still += 1
                if still >= 4:
                    break
            else:
                still = 0
            last = (total, done)
            time.sleep(0.5)
        stop.set()
        t.join(5)
        time.sleep(2)  # the last OTPs
        elapsed = time.time() - t0
        cpu, waited = {}, {}
        for pid, p in procs.items():
            if p.is_running():
                name = f"{' '.join(p.cmdline()[2:])[:70]} [{pid}]"
                cpu[name] = sum(p.cpu_times()[:2]) - cpu0.get(pid, 0)
                waited[name] = waited_for_a_core(pid) - wait0.get(pid, 0)
        r = report(db, elapsed, cpu, providers)
        r["waited"] = waited
    finally:
        stop_process(run, 60)
    if calls:
        r["calls"] = main_worker_calls(data / "profiles")
    return r


def main_worker_calls(profiles: Path) -> int:
    """Python function calls of the main workers (their profiles, written as they
    stopped: their start and table recovery included, as bench/e2e.py --calls)."""
    from bench.e2e import python_calls

    return python_calls(sorted(profiles.glob("worker-main-*.prof")))


def waited_for_a_core(pid: int) -> float:
    """Seconds the process was runnable but not running (Linux schedstat's run
    delay): on a machine whose cores are all busy, time a wall-clock profiler
    (py-spy) counts at whatever line the process was preempted, often a socket
    write that woke the process at the other end."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def report(db: Path, elapsed: float, cpu: dict, providers: str) -> dict:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    rows = con.execute("""SELECT r.priority, r.category, r.status, r.reason, r.accepted_at, r.latency_ms,
                          (SELECT min(a.started_at) FROM attempts a WHERE a.delivery_id = r.delivery_id)
                          FROM notify_record r""").fetchall()
    con.close()
    # The rate is the campaign's (the OTPs arrive at a fixed rate until the end of the
    # run and would make it the run's length). A record settles at its first terminal
    # state (latency_ms), not at a later receipt. The span ends when 99% have settled:
    # the last few are retries that end by design minutes later (a push retried until
    # its attempts are exhausted) and would make the rate that of the retry schedule;
    # the last settlement is reported beside it.
    first = min((r[4] for r in rows if r[4] and r[1] != "otp"), default=0)
    ends = sorted(r[4] + r[5] / 1000 - first for r in rows if r[1] != "otp" and r[4] and r[5] is not None
                  and r[2] in TERMINAL)
    t99 = ends[min(len(ends) - 1, int(len(ends) * 0.99))] if ends else float("nan")
    otps = [r for r in rows if r[1] == "otp"]
    to_call = sorted((r[6] - r[4]) * 1000 for r in otps if r[6] and r[4])
    to_term = sorted(r[5] for r in otps if r[5] is not None and r[2] in ("ACCEPTED", "DELIVERED"))
    within = {}
    for prio in ("high", "normal", "low"):
        mine = [r for r in rows if r[0] == prio and not (r[2] == "SCHEDULED")]
        ok = [r for r in mine if r[2] in TERMINAL and r[5] is not None and r[5] <= 60_000]
        within[prio] = (len(ok), len(mine))
    return {"providers": providers, "records": len(rows), "rate": 0.99 * len(ends) / max(t99, 1e-9),
            "t99": t99, "t100": ends[-1] if ends else float("nan"),
            "elapsed": elapsed, "otp_n": len(otps), "otp_call": (pct(to_call, .5), pct(to_call, .99), to_call[-1]
                                                                 if to_call else float("nan")),
            "otp_term": (pct(to_term, .5), pct(to_term, .99), to_term[-1] if to_term else float("nan")),
            "within": within, "cpu": cpu}


def _free_port() -> int:
    from pipeline.embedded import free_port

    return free_port()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--users", type=int, default=20_000)
    ap.add_argument("--otp-rate", type=float, default=20.0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--providers", default="simulators,fake", help="the runs, in order (comma-separated)")
    ap.add_argument("--calls", action="store_true",
                    help="the workers under cProfile: Python calls per record of the main workers (slower; "
                         "compare counts, not rates)")
    ap.add_argument("--section", default="real-run",
                    help="the generated section of bench/RESULTS.md this run writes ('' writes none)")
    args = ap.parse_args()
    results = [run(p, args.events, args.users, args.otp_rate, args.timeout, args.calls)
               for p in args.providers.split(",")]
    lines = ["| providers | records | notifications/s | 99% / all settled s | OTPs | OTP → provider call p50 / p99 / max ms | "
             "OTP → ACCEPTED/DELIVERED p50 / p99 / max ms | terminal ≤ 60 s high / normal / low |",
             "|---|---:|---:|---:|---:|---|---|---|"]
    for r in results:
        w = " / ".join(f"{100 * a / b:.1f}%" if b else "-" for a, b in r["within"].values())
        lines.append(f"| {r['providers']} | {r['records']:,} | {r['rate']:,.0f} | {r['t99']:.0f} / {r['t100']:.0f} | "
                     f"{r['otp_n']} | {r['otp_call'][0]:.0f} / {r['otp_call'][1]:.0f} / {r['otp_call'][2]:.0f} | "
                     f"{r['otp_term'][0]:.0f} / {r['otp_term'][1]:.0f} / {r['otp_term'][2]:.0f} | {w} |")
    if len(results) == 2:
        lines.append(f"\nreal / fake throughput: {results[0]['rate'] / results[1]['rate']:.2f}")
    for r in results:
        lines.append(f"\nCPU seconds per process, and seconds it waited for a core ({r['providers']}):\n```")
        waited = r.get("waited", {})
        for name, s in sorted(r["cpu"].items(), key=lambda kv: -kv[1]):
            lines.append(f"  {s:7.1f} {waited.get(name, 0.0):7.1f}  {name}")
        records = max(r["records"], 1)
        main_s = sum(s for name, s in r["cpu"].items() if "--role main" in name)
        lines.append(f"  main workers: {main_s:.1f} s, {main_s / records * 1000:.3f} ms per record")
        if "calls" in r:
            lines.append(f"  main workers' Python calls (cProfile, their start included): {r['calls']:,}, "
                         f"{r['calls'] / records:,.0f} per record")
        ours = sum(s for name, s in r["cpu"].items() if "adapters.simulators" not in name)
        lines.append(f"  the pipeline (all but the simulators: workers, API, broker): {ours:.1f} s, "
                     f"{ours / records * 1000:.3f} ms per record\n```")
    body = "\n".join(lines)
    print(body)
    if args.section:
        from bench.results import write_section

        command = (f".venv/bin/python bench/real.py --events {args.events} --users {args.users} --timeout {args.timeout:g}"
                   + (f" --otp-rate {args.otp_rate:g}" if args.otp_rate != 20.0 else "")
                   + (f" --providers {args.providers}" if args.providers != "simulators,fake" else ""))
        write_section(args.section, command, body)


if __name__ == "__main__":
    main()
