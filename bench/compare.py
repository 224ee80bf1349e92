"""Benchmark (not a test): the pipeline end to end, the Celery peer and the
ceiling (bench/ceiling.py: the same hops by hand on raw Redis Streams) in the same
run, one after the other on the same machine; writes the "e2e" section of
bench/RESULTS.md.

    python bench/compare.py [--events 20000] [--notifications 50000] [--rounds 1] [--profile] [--no-ceiling]

``--rounds 2`` runs the three again in the reverse order (pipeline, peer, ceiling;
then ceiling, peer, pipeline) and reports the ratios of the mean rates: this
VM's speed drifts by tens of % within minutes, and one sequence of runs gives
whichever system ran in the slower minutes a lower figure; a drift that is steady
over the rounds cancels out of the reversed order.

``--profile`` runs the pipeline a second time with py-spy attached to every worker
for 10 s and timing probes around the awaits that can stall a worker (the headline
figures come from the first, unprofiled run) and adds the top functions, the
workers' CPU by part (bench/parts.py) and the waits to the section; worker 0's
flamegraph is bench/out/e2e-profile.svg.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import ceiling, celery_peer, e2e  # noqa: E402
from bench.results import write_section  # noqa: E402

TARGET_RATE = 10_000  # notifications/s end to end, AOF everysec, 2 cores
TARGET_RATIO = 5.0  # x the Celery peer
TARGET_CEILING = 0.6  # x the ceiling (issue 19 item 4)
CORES = os.cpu_count() or 1


def _cpu_rows(cpu: dict, seconds: float) -> list[str]:
    return [f"{name}: {s:.1f} s CPU = {100 * s / seconds:.0f}% of one core" for name, s in cpu.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--notifications", type=int, default=50_000)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the ceiling run (bench/ceiling.py)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of the three runs, every other one in the reverse order; the ratios of the mean rates")
    ap.add_argument("--section", default="e2e", help="section of bench/RESULTS.md to write (e.g. e2e-full for"
                    " the issue's 1,000,000-notification size, --events 390000, kept next to the default run)")
    args = ap.parse_args()
    command = "python bench/compare.py" + (f" --events {args.events}" if args.events != 20_000 else "") + (
        f" --notifications {args.notifications}" if args.notifications != 50_000 else "") + (
        " --profile" if args.profile else "") + (" --no-ceiling" if args.no_ceiling else "") + (
        f" --section {args.section}" if args.section != "e2e" else "") + (
        f" --rounds {args.rounds}" if args.rounds != 1 else "")
    timeout = max(900.0, args.events / 50)  # the measured window, at 50 events/s at worst

    runners = {
        "pipeline": lambda: e2e.run(args.events, timeout=timeout),
        "celery peer": lambda: celery_peer.run(args.notifications),
        **({} if args.no_ceiling else {"ceiling": lambda: ceiling.run(args.events, timeout=timeout)}),
    }
    runs: dict[str, list] = {name: [] for name in runners}
    for r in range(max(1, args.rounds)):
        for name in (list(runners) if r % 2 == 0 else list(runners)[::-1]):
            runs[name].append(runners[name]())
            print(f"{name}: {runs[name][-1].rate:,.0f} notifications/s (round {r + 1})", flush=True)
    # the first round's runs are the ones described in full; the rates are the rounds' means
    a, b = runs["pipeline"][0], runs["celery peer"][0]
    c = runs["ceiling"][0] if "ceiling" in runs else None
    rates = {name: [x.rate for x in xs] for name, xs in runs.items()}
    mean = {name: sum(xs) / len(xs) for name, xs in rates.items()}
    for x, name in ((a, "pipeline"), (b, "celery peer"), (c, "ceiling")):
        if x is not None:
            x.rate = mean[name]
    prof = e2e.run(args.events, profile=True, diagnose=True, timeout=timeout) if args.profile else None

    ratio = a.rate / b.rate
    total_cpu_a = sum(a.cpu.values())
    total_cpu_b = sum(b.cpu.values())
    total_cpu_c = sum(c.cpu.values()) if c is not None else 0.0
    others = [(a, "the notify-stream"), (b, "the peer's")] + ([(c, "the ceiling's")] if c is not None else [])
    lines = [
        f"Machine: {os.cpu_count()} cores. {'All three' if c is not None else 'Both'} on the embedded valkey-server (AOF everysec), fake providers "
        "at zero latency, SQLite records; each run starts its own server and database.",
        "",
        *([f"{args.rounds} rounds, every other one in the reverse order; notifications/s in the table are the "
           "rounds' means (each round: " + "; ".join(
               f"{name} " + " / ".join(f"{r:,.0f}" for r in xs) for name, xs in rates.items())
           + "); the other columns are the first round's.", ""] if args.rounds > 1 else []),
        "| system | notifications | seconds | notifications/s | CPU s (all components) | notifications per CPU s |",
        "|---|---:|---:|---:|---:|---:|",
        f"| notify-stream: 2 Faust workers, 8 partitions | {a.notifications:,} | {a.seconds:.1f} | **{a.rate:,.0f}** "
        f"| {total_cpu_a:.1f} | {a.notifications / total_cpu_a:,.0f} |",
        f"| peer: Celery {b.celery} prefork --concurrency 2, task per notification | {b.notifications:,} "
        f"| {b.seconds:.1f} | **{b.rate:,.0f}** | {total_cpu_b:.1f} | {b.notifications / total_cpu_b:,.0f} |",
        *([f"| ceiling: the same hops by hand on raw Redis Streams, {c.planners + c.senders + 1} processes "
           f"| {c.notifications:,} | {c.seconds:.1f} | **{c.rate:,.0f}** | {total_cpu_c:.1f} "
           f"| {c.notifications / total_cpu_c:,.0f} |"] if c is not None else []),
        "",
        f"**Ratio notify-stream / peer: {ratio:.2f}x** (target ≥ {TARGET_RATIO:.0f}x: "
        + ("met" if ratio >= TARGET_RATIO else f"MISSED by {TARGET_RATIO / ratio:.1f}x") + ").  ",
        *([f"**Ratio notify-stream / ceiling: {a.rate / c.rate:.2f}** (target ≥ {TARGET_CEILING}: "
           + ("met" if a.rate / c.rate >= TARGET_CEILING else f"MISSED by {TARGET_CEILING / (a.rate / c.rate):.1f}x")
           + f"); per CPU second {(a.notifications / total_cpu_a) / (c.notifications / total_cpu_c):.2f}.  "]
          if c is not None else []),
        f"**End to end: {a.rate:,.0f} notifications/s** (target ≥ {TARGET_RATE:,} on 2 cores with AOF everysec: "
        + ("met" if a.rate >= TARGET_RATE else f"MISSED by {TARGET_RATE - a.rate:,.0f}/s, "
           f"{TARGET_RATE / a.rate:.1f}x short") + ").",
        "",
        "CPU per component over the measured window:",
        "",
        *[f"- notify-stream {row}" for row in _cpu_rows(a.cpu, a.seconds)],
        *[f"- peer {row}" for row in _cpu_rows(b.cpu, b.seconds)],
        *([f"- ceiling {row}" for row in _cpu_rows(c.cpu, c.seconds)] if c is not None else []),
        "- other processes on the machine (not these benchmarks): " + ", ".join(
            f"{x.other_cpu:.1f} s during {what} window ({100 * x.other_cpu / (x.seconds * CORES):.0f}% of the "
            f"{CORES} cores)" for x, what in others)
        + (" — **the machine was shared: the figures are lower bounds**" if max(
            x.other_cpu / (x.seconds * CORES) for x, _w in others) > 0.05 else ""),
        "",
        "notify-stream run: "
        f"{a.events:,} events (otp 30%, transaction 45% with 1-2 recipients, marketing 20% with 1-3 recipients "
        f"on push+email, ~5% duplicate business keys) for {a.users:,} users (92% with a phone, 85% an email, "
        "55% a push device, 10% opted out of marketing, 2% in quiet hours), set through notify.preferences / "
        "notify.devices first. Events pre-produced to notify.events "
        f"({a.produce_s:.1f} s), then two workers started (NOTIFY_WORKERS=2, index 0/1); clock from the first "
        f"event consumed ({a.startup_s:.1f} s after launch) to the last record committed to SQLite with every "
        "topic's lag at zero. notifications = records (one per user x channel) + duplicates filtered "
        f"({a.records:,} + {a.duplicates:,}); {a.outcomes:,} outcomes on notify.outcomes; "
        f"{a.events_rate:,.0f} events/s.",
        "",
        "Records by state: " + ", ".join(f"{k} {v:,}" for k, v in a.statuses.items()) + ".",
        "",
        *e2e.cost_lines(a),
    ]
    if a.overrides:
        lines += ["", "Settings changed for the notify-stream run (NOTIFY_CONFIG): " + "; ".join(a.overrides) + "."]
    if a.failed:
        lines += ["", "FAILED records (a sample): " + "; ".join(
            f"{f['channel']} {f['reason']} after {f['retry_count']} attempts {f['attempts'][:3]}" for f in a.failed)]
    if a.hung_on_stop:
        lines += ["", f"Note: {', '.join(a.hung_on_stop)} did not exit within 10 s of SIGTERM after the run "
                  "(killed; stacks in bench/out/e2e-stop-w*.txt)."]
    lines += [
        "",
        f"Peer run: {b.notifications:,} tasks from the same mix, expanded at enqueue time (recipients x channels "
        f"after opt-outs, reachability and quiet hours), pre-enqueued ({b.enqueue_s:.1f} s), worker started "
        f"after; clock from the first task started to the last record committed. Records by state: "
        + ", ".join(f"{k} {v:,}" for k, v in b.statuses.items()) + ".",
    ]
    if c is not None:
        lines += ["", ceiling.describe(c)]
    if prof is not None:
        lines += [
            "",
            f"Profile: a second pipeline run ({prof.rate:,.0f} notifications/s with py-spy attached), "
            "`py-spy record` on every worker for 10 s from the first event, 100 Hz, idle excluded; "
            "worker 0's flamegraph bench/out/e2e-profile.svg, full list bench/out/e2e-profile.txt. Top 15 by own time:",
            "",
            "```",
            *prof.profile[:16],
            "```",
            "",
            "Inclusive time, project code:",
            "",
            "```",
            *prof.profile_incl[:20],
            "```",
            "",
            *prof.parts,
            "",
            "Where the wall-clock time goes (the same run; timing probes wrapped around these awaits by "
            "`bench/e2e.py --diagnose`, summed over both workers and all callers of that name):",
            "",
            "```",
            *prof.probes,
            "```",
        ]
    body = "\n".join(lines)
    print(body)
    write_section(args.section, command, body)
    print(f"\nwrote the {args.section} section of bench/RESULTS.md ({platform.node()})")


if __name__ == "__main__":
    main()
