"""Benchmark (not a test): Redis's own time per entry in the transport's PRODUCE
script, against a baseline in the same run: the same script with its general path
only (a field table built and unpacked for every entry, as PRODUCE was until the
common entry got its own XADD). Both scripts run on the embedded server, the
same entries (key, value of ``--value-bytes``, no headers), fenced (changelogs)
and unfenced, ``--batch`` entries per call; Redis's time comes from INFO
commandstats. Writes the "produce-script" section of bench/RESULTS.md.

    python bench/produce_script.py [--entries 40000] [--value-bytes 300]
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import write_section  # noqa: E402
from pipeline.embedded import EmbeddedRedis  # noqa: E402
from pipeline.transport.scripts import PRODUCE  # noqa: E402

#: what selects PRODUCE's path for the common entry (key and value, no headers)
COMMON_ENTRY = "if ARGV[i + 1] == '3' and ARGV[i + 4] == '0' then"
assert COMMON_ENTRY in PRODUCE, "PRODUCE's test for the common entry changed: update the baseline"
#: the baseline: PRODUCE with its general path only (the common entry's test never true)
GENERAL_ONLY = PRODUCE.replace(COMMON_ENTRY, "if false then")


STREAMS = 40


def usec_per_entry(r, name: str, script: str, entries: int, batch: int, token: str, value: bytes) -> float:
    sha = r.script_load(script)
    for s in range(STREAMS):
        r.set(f"{name}:f{s}", token or "-")
    r.config_resetstat()
    pipe = r.pipeline(transaction=False)
    for c in range(entries // batch):
        s = c % STREAMS
        args: list = [token, batch]
        for m in range(batch):
            args += [repr(time.time()), 3, b"user-%d" % m, value, 0]
        pipe.execute_command("EVALSHA", sha, 3, f"{name}:s{s}", f"{name}:n{s}", f"{name}:f{s}", *args)
        if c % 100 == 99:
            pipe.execute()
    pipe.execute()
    stats = r.info("commandstats")["cmdstat_evalsha"]
    return stats["usec"] / (stats["calls"] * batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=40_000)
    ap.add_argument("--value-bytes", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    command = "python bench/produce_script.py" + (f" --entries {args.entries}" if args.entries != 40_000 else "") + (
        f" --value-bytes {args.value_bytes}" if args.value_bytes != 300 else "") + (
        f" --rounds {args.rounds}" if args.rounds != 3 else "")
    value = b"x" * args.value_bytes
    rows = []
    with tempfile.TemporaryDirectory(prefix="notify-produce-") as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis").start()
        try:
            r = redis.Redis.from_url(server.url)
            for batch in (4, 16):
                for token in ("", "tok"):
                    base, new = [], []
                    for k in range(args.rounds):  # alternating, ABAB
                        base.append(usec_per_entry(r, f"b{batch}{token}{k}", GENERAL_ONLY, args.entries, batch,
                                                   token, value))
                        new.append(usec_per_entry(r, f"n{batch}{token}{k}", PRODUCE, args.entries, batch,
                                                  token, value))
                    b, n = sorted(base)[len(base) // 2], sorted(new)[len(new) // 2]
                    rows.append(f"| {batch} | {'fenced' if token else 'unfenced'} | {b:.2f} | {n:.2f} | "
                                f"{b / n:.2f}x |")
                    print(rows[-1], flush=True)
            version = r.info("server").get("valkey_version") or r.info("server")["redis_version"]
            r.close()
        finally:
            server.stop()
    body = "\n".join([
        f"Redis's time inside EVALSHA per entry (INFO commandstats), median of {args.rounds} alternating rounds "
        f"of {args.entries:,} entries each; embedded valkey-server {version}; entries with a key, a "
        f"{args.value_bytes}-byte value, no headers, spread over {STREAMS} partitions.",
        "",
        "| entries per call | entry | baseline: general path only (µs) | PRODUCE (µs) | faster |",
        "|---:|---|---:|---:|---:|",
        *rows,
        "",
        "The e2e section's cost table gives the share of this in a notification: EVALSHA was about two thirds "
        "of Redis's time there, and Redis under a fifth of the CPU.",
    ])
    print(body)
    write_section("produce-script", command, body)


if __name__ == "__main__":
    main()
