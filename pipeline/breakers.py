"""Every worker's circuit breakers, visible to the API, the status page and
``notify status`` (which run in other processes): each transition is written to
the hash ``Keys.breakers`` as ``<host>/<worker>/<provider>`` → JSON ``{state, since}``,
and every provider's state when a worker builds its dispatcher. ``<worker>`` is
the role and index (``main-0``, ``priority-0``), stable across restarts, so a
restarted worker overwrites its own fields. Writing is best effort, off the
caller's path (a breaker changes state inside a provider call).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any, Callable, Optional

import orjson

__all__ = ["BreakerBoard", "read_breakers", "worker_name"]

log = logging.getLogger(__name__)


def worker_name(env: Any = None) -> str:
    """``<host>/<role>-<index>`` of this worker (``env``: ``settings.env``)."""
    from config.environment import read_env

    env = env if env is not None else read_env()
    return f"{socket.gethostname()}/{env.worker_slot()}"


class BreakerBoard:
    """Collects transitions and writes them with one HSET, from a task of its own."""

    def __init__(self, client: Callable[[], Any], key: str, worker: Optional[str] = None) -> None:
        self._client = client  # async () -> redis client
        self._key = key
        self._worker = worker or worker_name()
        self._pending: dict[str, bytes] = {}
        self._task: Optional[asyncio.Future] = None

    def note(self, provider: str, state: str, since: Optional[float] = None) -> None:
        self._pending[f"{self._worker}/{provider}"] = orjson.dumps({"state": state, "since": since or time.time()})
        if self._task is None or self._task.done():
            try:
                self._task = asyncio.ensure_future(self._write())
            except RuntimeError:  # no running loop (a test building a dispatcher)
                pass

    async def _write(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, {}
            try:
                await (await self._client()).hset(self._key, mapping=batch)
            except Exception as exc:  # noqa: BLE001 - best effort: the page shows the last known
                log.debug("could not publish breaker states: %s", exc)
                return


def read_breakers(raw: dict) -> dict[str, dict[str, dict]]:
    """The hash as ``{provider: {worker: {state, since}}}`` (bad fields skipped)."""
    out: dict[str, dict[str, dict]] = {}
    for k, v in (raw or {}).items():
        try:
            field = k.decode() if isinstance(k, bytes) else str(k)
            worker, provider = field.rsplit("/", 1)
            out.setdefault(provider, {})[worker] = orjson.loads(v)
        except (ValueError, orjson.JSONDecodeError, UnicodeDecodeError):
            continue
    return out
