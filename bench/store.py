"""Micro benchmark of RecordStore.apply_outcomes (not a test).

    python bench/store.py [--outcomes 200000] [--batch 2000[,500,5000]] [--record]

``--record`` also writes the figures to the "store" section of bench/RESULTS.md.

Builds realistic delivery histories (PENDING → ACCEPTED with an attempt →
DELIVERED, some FILTERED, some UNKNOWN → ACCEPTED), shuffles them within a
window so a delivery's outcomes straddle batches, then times only the store.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.results import write_section  # noqa: E402
from pipeline import ids  # noqa: E402
from pipeline.models import Attempt, Outcome, State  # noqa: E402
from pipeline.store import RecordStore  # noqa: E402

CHANNELS = ("push", "sms", "email", "inbox", "webhook")


def histories(n_outcomes: int, seed: int = 1) -> list[Outcome]:
    rnd = random.Random(seed)
    out: list[Outcome] = []
    t0 = time.time() - 3600
    i = 0
    while len(out) < n_outcomes:
        i += 1
        biz, user, ch = f"order_shipped:{i // 3}", f"u{rnd.randrange(1_000_000)}", CHANNELS[i % 5]
        did, nid = ids.delivery_id(biz, user, ch), ids.notification_id(biz, user)
        base = dict(
            delivery_id=did, notification_id=nid, biz_key=biz, user_id=user, channel=ch,
            category="order", template="order_shipped", priority="normal", accepted_at=t0 + i * 0.001,
        )  # fmt: skip
        at = t0 + i * 0.001
        kind = rnd.random()
        seq = 0

        def attempt(result: str, msg: str | None = None) -> Attempt:
            nonlocal seq
            seq += 1
            return Attempt(
                delivery_id=did, seq=seq, channel=ch, provider="prov-a", started_at=at,
                result=result, latency_ms=35.0, provider_msg_id=msg,
            )  # fmt: skip

        if kind < 0.1:
            out.append(Outcome(**base, state=State.FILTERED, at=at + 0.01, reason="opt_out"))
            continue
        out.append(Outcome(**base, state=State.PENDING, at=at + 0.01))
        if kind < 0.15:
            out.append(
                Outcome(**base, state=State.UNKNOWN, at=at + 0.5, provider="prov-a",
                        attempt=attempt("TIMEOUT_UNKNOWN"))
            )  # fmt: skip
        msg = f"m-{i}"
        out.append(
            Outcome(**base, state=State.ACCEPTED, at=at + 0.6, provider="prov-a",
                    provider_msg_id=msg, attempt=attempt("ACCEPTED", msg))
        )  # fmt: skip
        if kind < 0.7:
            out.append(
                Outcome(**base, state=State.DELIVERED, at=at + 3.0, provider="prov-a",
                        provider_msg_id=msg)
            )  # fmt: skip
    out = out[:n_outcomes]
    # local disorder: shuffle within windows of 4096
    for s in range(0, len(out), 4096):
        w = out[s : s + 4096]
        rnd.shuffle(w)
        out[s : s + 4096] = w
    return out


async def run(path: str, outcomes: list[Outcome], batch: int) -> float:
    store = await RecordStore(path).open()
    try:
        t = time.perf_counter()
        for s in range(0, len(outcomes), batch):
            await store.apply_outcomes(outcomes[s : s + batch])
        elapsed = time.perf_counter() - t
        rows = await store.find(limit=1)
        counts = await store.counts_today()
        print(f"records: {counts['total']} today, states {counts['states']}, last id {rows[0][0]['id']}")
    finally:
        await store.close()
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--outcomes", type=int, default=200_000)
    p.add_argument("--batch", default="2000", help="batch size, or several: 500,2000,5000")
    p.add_argument("--record", action="store_true", help="write bench/RESULTS.md's store section")
    args = p.parse_args()

    t = time.perf_counter()
    outcomes = histories(args.outcomes)
    print(f"built {len(outcomes)} outcomes in {time.perf_counter() - t:.1f}s")
    lines = ["| batch | seconds | outcomes/s |", "|---:|---:|---:|"]
    for batch in [int(b) for b in args.batch.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:  # a fresh file per run
            elapsed = asyncio.run(run(os.path.join(tmp, "bench.db"), outcomes, batch))
        rate = len(outcomes) / elapsed
        print(
            f"apply_outcomes: {len(outcomes)} outcomes in batches of {batch}: "
            f"{elapsed:.2f}s = {rate:,.0f} outcomes/s"
        )
        lines.append(f"| {batch} | {elapsed:.2f} | {rate:,.0f} |")
    if args.record:
        body = (
            f"RecordStore.apply_outcomes, {len(outcomes)} outcomes (PENDING/UNKNOWN/ACCEPTED"
            "+attempt/DELIVERED/FILTERED histories, shuffled in windows of 4096), fresh WAL file, "
            "synchronous=NORMAL.\n\n" + "\n".join(lines)
        )
        write_section("store", f"python bench/store.py --outcomes {args.outcomes} --batch {args.batch}", body)


if __name__ == "__main__":
    main()
