"""Run every simulator standalone: ``python -m adapters.simulators
[--receipts-url URL] [--clean] [--seed N] [--smtp-tls] [--smtp-auth]``.
Prints the URLs and generated credentials as one JSON line, then serves
until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

import orjson

from . import SimProfile, start_all


async def _main(args: argparse.Namespace) -> None:
    profile = SimProfile.clean(seed=args.seed) if args.clean else SimProfile.realistic(seed=args.seed)
    sims = await start_all(args.receipts_url, profile=profile, smtp_tls=args.smtp_tls, smtp_auth=args.smtp_auth)
    sys.stdout.write(orjson.dumps(sims.as_dict()).decode() + "\n")
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await sims.stop()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m adapters.simulators")
    p.add_argument("--receipts-url", default=None, help="receipts go to <url>/<provider>")
    p.add_argument("--clean", action="store_true", help="no random failures (deterministic)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--smtp-tls", action="store_true")
    p.add_argument("--smtp-auth", action="store_true")
    asyncio.run(_main(p.parse_args()))


if __name__ == "__main__":
    main()
