"""Run the simulators standalone: ``python -m adapters.simulators
[--family push|sms|email|webhook] [--receipts-url URL] [--clean] [--seed N]
[--smtp-tls] [--smtp-auth] [--ledger PATH] [--info PATH] [--hang-s S] [--nice N]``.

Without ``--family``, every simulator in this process: prints the URLs and
generated credentials as one JSON line (and writes it to ``--info``, atomically,
for ``NOTIFY_SIMULATORS``), then serves until interrupted. With ``--family``, only
that family's simulators (``notify run`` starts one process per family): the line
is the family's part, written next to ``--info`` (``simulators.sms.json``), and
``--info`` itself is written, merged, once every family's part is there
(``publish_part``). ``--ledger`` appends every provider call to a JSON-lines file
(one file may serve every family's process)."""

from __future__ import annotations

import argparse
import asyncio
import os

from config.environment import read_env

from . import FAMILIES, publish_part, start_all, start_family
from .group import add_standalone_args, profile_of, run_standalone


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m adapters.simulators")
    add_standalone_args(p, "receipts go to <url>/<provider>")
    families = "; ".join(f"{f}: {', '.join(n)}" for f, n in FAMILIES.items())
    p.add_argument("--family", choices=list(FAMILIES), default=None,
                   help=f"only this family's simulators ({families}); --info is then the merged file, written "
                        "once every family's part is there")
    p.add_argument("--smtp-tls", action="store_true")
    p.add_argument("--smtp-auth", action="store_true")
    p.add_argument("--ledger", default=None, help="append every provider call to this JSON-lines file")
    p.add_argument("--hang-s", type=float, default=None, help="how long a 'hang' keeps a request open")
    p.add_argument("--nice", type=int, default=0,
                   help="lower this process's CPU priority by N (notify run: 5; providers do not share our cores)")
    args = p.parse_args()
    if args.nice > 0:
        os.nice(args.nice)
    profile = profile_of(args, **({"hang_s": args.hang_s} if args.hang_s is not None else {}))
    # the secrets the receipts are signed with, when the API that verifies them set them
    env = read_env()
    kw = dict(profile=profile, smtp_tls=args.smtp_tls, smtp_auth=args.smtp_auth, ledger_path=args.ledger,
              twilio_auth_token=env.twilio_auth_token, vendor_secret=env.vendor_secret,
              hms_receipt_key=env.hms_receipt_key)
    if args.family:
        publish = (lambda part: publish_part(args.info, args.family, part)) if args.info else None
        asyncio.run(run_standalone(lambda: start_family(args.family, args.receipts_url, **kw), None, publish))
    else:
        asyncio.run(run_standalone(lambda: start_all(args.receipts_url, **kw), args.info))


if __name__ == "__main__":
    main()
