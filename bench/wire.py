"""Benchmark (not a test): the client CPU of one producer flush, written through
redis-py's pipeline (the baseline) and through the producer's own connection
(pipeline/transport/wire.py), in the same run, alternating, on the embedded
server and uvloop as the workers run. A flush is what a worker's producer sends
most often in the e2e run: two ``PRODUCE`` calls (docs/adr/0005), one of two
entries and one of one, values of ``--value-bytes``. Calls are sequential, so the
figures include the syscalls of a process that sleeps for each reply; a busy
worker pays less of those. Writes the "wire" section of bench/RESULTS.md.

    python bench/wire.py [--flushes 5000] [--rounds 3]
"""

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import write_section  # noqa: E402
from pipeline.embedded import EmbeddedRedis  # noqa: E402
from pipeline.lean import use_fast_loop  # noqa: E402
from pipeline.transport.client import connect  # noqa: E402
from pipeline.transport.keys import Keys  # noqa: E402
from pipeline.transport.produce import ProduceBatch, load_produce  # noqa: E402
from pipeline.transport.wire import Wire  # noqa: E402


async def flushes(url: str, n: int, value_bytes: int, own_wire: bool) -> tuple[float, float]:
    """(client CPU µs, wall µs) per flush."""
    client = await connect([url])
    await load_produce(client)
    wire = Wire.for_client(client) if own_wire else None
    keys = Keys()
    entries = [("1700000000.5", b"user-1", b"x" * value_bytes, []), ("1700000000.5", b"user-2", b"y" * value_bytes, [])]
    try:
        t0, w0 = time.process_time(), time.perf_counter()
        for i in range(n):
            batch = ProduceBatch(client, keys, wire)
            batch.add("bench.outcomes", i % 8, "", entries)
            batch.add("bench-changelog", i % 8, "", entries[:1])
            await batch.run()
        return 1e6 * (time.process_time() - t0) / n, 1e6 * (time.perf_counter() - w0) / n
    finally:
        if wire is not None:
            await wire.aclose()
        await client.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flushes", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--value-bytes", type=int, default=300)
    args = ap.parse_args()
    use_fast_loop()
    rows = {"redis-py pipeline (baseline)": [], "own connection (wire.py)": []}
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp)).start()
        try:
            for _ in range(args.rounds):
                for name, own in (("redis-py pipeline (baseline)", False), ("own connection (wire.py)", True)):
                    rows[name].append(asyncio.run(flushes(server.url, args.flushes, args.value_bytes, own)))
                    print(name, f"{rows[name][-1][0]:.1f} µs CPU", flush=True)
        finally:
            server.stop()
    base = statistics.median_high(c for c, _w in rows["redis-py pipeline (baseline)"])
    lines = ["| path | client CPU µs per flush (rounds) | median | wall µs per flush (median) | ratio to baseline |",
             "|---|---|---:|---:|---:|"]
    for name, vals in rows.items():
        med = statistics.median_high(c for c, _w in vals)
        wall = statistics.median_high(w for _c, w in vals)
        lines.append(f"| {name} | {', '.join(f'{c:.0f}' for c, _w in vals)} | {med:.0f} | "
                     f"{wall:.0f} | {med / base:.2f} |")
    lines += ["", f"A flush: two PRODUCE calls (2 + 1 entries of {args.value_bytes} bytes), {args.flushes} in a row "
              "per round, rounds alternating. uvloop, the embedded server (AOF everysec)."]
    body = "\n".join(lines)
    print(body)
    cmd = "python bench/wire.py" + (f" --flushes {args.flushes}" if args.flushes != 5000 else "") + (
        f" --rounds {args.rounds}" if args.rounds != 3 else "")
    write_section("wire", cmd, body)


if __name__ == "__main__":
    main()
