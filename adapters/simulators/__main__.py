"""Run every simulator standalone: ``python -m adapters.simulators
[--receipts-url URL] [--clean] [--seed N] [--smtp-tls] [--smtp-auth]
[--ledger PATH] [--info PATH] [--hang-s S]``.
Prints the URLs and generated credentials as one JSON line (and writes it to
``--info``, atomically, for ``NOTIFY_SIMULATORS``), then serves until
interrupted. ``--ledger`` appends every provider call to a JSON-lines file."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys

import orjson

from . import SimProfile, start_all


async def _main(args: argparse.Namespace) -> None:
    extra = {"hang_s": args.hang_s} if args.hang_s is not None else {}
    profile = SimProfile.clean(seed=args.seed, **extra) if args.clean else SimProfile.realistic(seed=args.seed, **extra)
    # the secrets the receipts are signed with, when the API that verifies them set them
    sims = await start_all(args.receipts_url, profile=profile, smtp_tls=args.smtp_tls, smtp_auth=args.smtp_auth,
                           ledger_path=args.ledger, twilio_auth_token=os.environ.get("NOTIFY_TWILIO_AUTH_TOKEN"),
                           vendor_secret=os.environ.get("NOTIFY_VENDOR_SECRET"))
    info = orjson.dumps(sims.as_dict())
    if args.info:
        tmp = args.info + ".tmp"
        with open(tmp, "wb") as fh:
            fh.write(info)
        os.replace(tmp, args.info)
    sys.stdout.write(info.decode() + "\n")
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
    p.add_argument("--ledger", default=None, help="append every provider call to this JSON-lines file")
    p.add_argument("--info", default=None, help="also write the JSON line (URLs, credentials) to this file")
    p.add_argument("--hang-s", type=float, default=None, help="how long a 'hang' keeps a request open")
    asyncio.run(_main(p.parse_args()))


if __name__ == "__main__":
    main()
