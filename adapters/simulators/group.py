"""What a set of simulators started together shares: :class:`Simulators`
(``start_all``) and :class:`CloudSims` (``start_cloud``) are both a
:class:`SimGroup`, and ``python -m adapters.simulators`` and ``python -m
adapters.simulators.cloud`` both run as :func:`run_standalone` says.

* :func:`receipt_url`: where one simulator posts its receipts, from the group's
  ``receipts_url`` (``<url>/<provider>``, or a template with ``{provider}``);
* :class:`SimGroup`: ``all`` (name → simulator), calls per simulator for one
  delivery id, an rng each, starting them all (and stopping those started when
  one fails), stopping them in reverse order;
* :func:`add_standalone_args`, :func:`profile_of` and :func:`run_standalone`: the
  command line's shared options (``--receipts-url``, ``--clean``, ``--seed``,
  ``--info``) and its run: print one JSON line of the URLs and generated
  credentials (and write it to ``--info``, atomically), serve until SIGINT or
  SIGTERM, stop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import sys
from typing import Any, Awaitable, Callable, Optional

import orjson

from .common import SimProfile

__all__ = ["SimGroup", "receipt_url", "add_standalone_args", "profile_of", "run_standalone"]


def receipt_url(base: Optional[str], provider: str) -> Optional[str]:
    if not base:
        return None
    if "{provider}" in base:
        return base.format(provider=provider)
    return base.rstrip("/") + "/" + provider


class SimGroup:
    """Simulators started and stopped together; a dataclass with ``_started: list``."""

    _started: list[Any]

    @property
    def all(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def calls(self, key: str) -> dict[str, int]:
        """Provider send calls per simulator for one delivery id."""
        return {name: n for name, sim in self.all.items() if (n := sim.core.calls(key))}

    def seed_rngs(self, profile: SimProfile, offset: int = 0) -> None:
        """One profile object, a SimCore per simulator: each gets its own rng, seeded
        with the profile's seed + ``offset`` + its place (unseeded without one)."""
        for i, sim in enumerate(self.all.values()):
            sim.core.rng = random.Random(None if profile.seed is None else profile.seed + offset + i)

    async def start_each(self) -> None:
        """Start every simulator; stop those started if one fails."""
        try:
            for sim in self.all.values():
                await sim.start()
                self._started.append(sim)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        for sim in reversed(self._started):
            with contextlib.suppress(Exception):
                await sim.stop()
        self._started.clear()


def add_standalone_args(p: argparse.ArgumentParser, receipts_help: str) -> None:
    p.add_argument("--receipts-url", default=None, help=receipts_help)
    p.add_argument("--clean", action="store_true", help="no random failures (deterministic)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--info", default=None, help="also write the JSON line (URLs, credentials) to this file")


def profile_of(args: argparse.Namespace, **kw: Any) -> SimProfile:
    """``--clean`` / ``--seed`` as a profile (``kw``: more of its fields)."""
    return SimProfile.clean(seed=args.seed, **kw) if args.clean else SimProfile.realistic(seed=args.seed, **kw)


async def run_standalone(start: Callable[[], Awaitable[Any]], info_path: Optional[str],
                         publish: Optional[Callable[[bytes], Any]] = None) -> None:
    """Start the group (``start()``), print its ``as_dict()`` as one JSON line (and
    write it to ``info_path``, atomically, or hand it to ``publish``: a family's
    part, adapters/simulators/__init__.py ``publish_part``), serve until SIGINT /
    SIGTERM, stop it."""
    sims = await start()
    info = orjson.dumps(sims.as_dict())
    if publish is not None:
        publish(info)
    elif info_path:
        tmp = info_path + ".tmp"
        with open(tmp, "wb") as fh:
            fh.write(info)
        os.replace(tmp, info_path)
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
