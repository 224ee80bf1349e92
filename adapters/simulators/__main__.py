"""Run every simulator standalone: ``python -m adapters.simulators
[--receipts-url URL] [--clean] [--seed N] [--smtp-tls] [--smtp-auth]
[--ledger PATH] [--info PATH] [--hang-s S]``.
Prints the URLs and generated credentials as one JSON line (and writes it to
``--info``, atomically, for ``NOTIFY_SIMULATORS``), then serves until
interrupted. ``--ledger`` appends every provider call to a JSON-lines file."""

from __future__ import annotations

import argparse
import asyncio

from config.environment import read_env

from . import start_all
from .group import add_standalone_args, profile_of, run_standalone


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m adapters.simulators")
    add_standalone_args(p, "receipts go to <url>/<provider>")
    p.add_argument("--smtp-tls", action="store_true")
    p.add_argument("--smtp-auth", action="store_true")
    p.add_argument("--ledger", default=None, help="append every provider call to this JSON-lines file")
    p.add_argument("--hang-s", type=float, default=None, help="how long a 'hang' keeps a request open")
    args = p.parse_args()
    profile = profile_of(args, **({"hang_s": args.hang_s} if args.hang_s is not None else {}))
    # the secrets the receipts are signed with, when the API that verifies them set them
    env = read_env()
    asyncio.run(run_standalone(lambda: start_all(
        args.receipts_url, profile=profile, smtp_tls=args.smtp_tls, smtp_auth=args.smtp_auth, ledger_path=args.ledger,
        twilio_auth_token=env.twilio_auth_token, vendor_secret=env.vendor_secret,
        hms_receipt_key=env.hms_receipt_key), args.info))


if __name__ == "__main__":
    main()
