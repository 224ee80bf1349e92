"""``notify providers check``: the config's providers, each one's credentials tried."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from .broker import current_settings
from .text import one_line

__all__ = ["cmd_providers"]


def cmd_providers(args) -> int:
    """``notify providers check [--config FILE]``: the config's providers, each built and
    its credentials tried without sending anything (adapters/registry.py ``probe``), one
    line each; exit 1 when one fails. Without [routes], the simulators ``notify run``
    started, when it runs."""
    from adapters.registry import check_all
    from config.settings import load_settings

    settings = load_settings(args.config) if args.config else current_settings()
    specs, routes, env, source = settings.providers, settings.routes, os.environ, "config"
    info = Path(settings.data_dir) / "simulators.json"
    if not routes and not any(s.kind for s in specs.values()):
        if not info.exists():
            print("no [routes] and no provider with a kind in the config: notify run uses the provider "
                  "simulators (README \"Real providers\")")
            return 0
        from pipeline.layout import simulator_providers
        from pipeline.providers import provider_specs

        tables, env = simulator_providers(json.loads(info.read_text()))
        (specs, routes), source = provider_specs(tables, settings), f"the simulators ({info})"
    print(f"providers of {source}: " + "; ".join(f"{c}: {' → '.join(n) or '(off)'}" for c, n in routes.items()))
    lines = asyncio.run(check_all(specs, routes, env, timeout=args.timeout))
    for line in lines:
        print(f"{line.name:14} {line.kind or '-':9} {'ok' if line.ok else 'FAILED'}: {one_line(line.message, 1000)}",
              flush=True)
    return 1 if any(not line.ok for line in lines) else 0
