"""Process-wide resources of a worker, opened once and lazily: the record store
and the provider dispatcher.

The providers are a provider config built by :mod:`adapters.registry`; which one
(``NOTIFY_PROVIDERS``: ``config``, the settings' own ``[providers.*]`` and
``[routes]``, the default when the config has routes; ``fake``, the default
otherwise; ``simulators``) is :mod:`pipeline.providers`. With ``simulators`` the
simulators are started in this process, or, with ``NOTIFY_SIMULATORS=<file>`` (the
JSON ``python -m adapters.simulators --info`` writes), the adapters point at
simulators already running in another process, so a provider's state and call
ledger outlive this worker (the fault suite kills workers);
``NOTIFY_PROVIDER_TIMEOUT`` (s, default 5) is their timeout.

With the simulators, a user's webhook URL may reach the receiver simulator's
own address and port and nothing else on this machine (adapters/webhook.py);
``NOTIFY_WEBHOOK_ALLOW`` (comma-separated ``127.0.0.1:9000``, ``[::1]:9000``,
CIDRs or host names) allows more, explicitly: a receiver a developer runs locally.
"""

import asyncio
import logging
import os
from typing import Any, Awaitable, Callable, Optional

from adapters.dispatch import Dispatcher

from .providers import provider_set, provider_source
from .store import RecordStore, StoreUnavailable

__all__ = ["Resources", "StoreClosed"]

log = logging.getLogger(__name__)


class StoreClosed(RuntimeError):
    """The process is shutting down: its record store is closed for good."""


class Resources:
    """What a worker process opens once, lazily, and closes at its end: the record
    store, the provider dispatcher (and the in-process simulators, if any)."""

    def __init__(self, settings: Any, app: Any = None) -> None:
        self.settings = settings
        self.app = app
        self._store: Optional[RecordStore] = None
        self._dispatcher: Optional[Dispatcher] = None
        self._lock = asyncio.Lock()
        self.simulators: Any = None
        self._side: Any = None
        self.closed = False

    async def side_client(self) -> Any:
        """A small connection pool of this worker's own for its periodic reads (the
        backpressure lag, the releases: agents/pressure.py, agents/releases.py):
        never the transport's client, whose commands at start-up widen the window of
        a seek (agents/callbacks.py)."""
        if self._side is None:
            from .transport.client import connect

            self._side = await connect([self.app.transport.broker_url], pool_size=2)
        return self._side

    async def store(self) -> RecordStore:
        if self._store is None:
            if self.closed:  # never reopened after close: its thread would keep the process alive
                raise StoreClosed("the record store is closed (the worker is stopping)")
            async with self._lock:
                if self._store is None:
                    path = self.settings.db_path
                    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                    s = RecordStore(path)
                    await s.open()
                    self._store = s
        return self._store

    async def with_store(self, op: Callable[[RecordStore], Awaitable[Any]], what: str) -> Any:
        """``op(store)``, retried with backoff while the store is unavailable (disk full,
        file read-only; opening it may fail the same way): the agent waits, nothing is
        dropped (an exception would stop the agent for good)."""
        delay = 0.1
        while True:
            try:
                return await op(await self.store())
            except StoreUnavailable as exc:
                log.warning("%s store unavailable (%s); retrying in %.1fs", what, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def dispatcher(self) -> Dispatcher:
        if self._dispatcher is None:
            async with self._lock:
                if self._dispatcher is None:
                    self._dispatcher = await self._build_dispatcher()
        return self._dispatcher

    async def _build_dispatcher(self) -> Dispatcher:
        from adapters.registry import breaker_settings

        from . import metrics

        settings, env = self.settings, self.settings.env
        info = None
        if provider_source(settings) == "simulators":
            if env.simulators:
                import orjson

                with open(env.simulators, "rb") as fh:
                    info = orjson.loads(fh.read())
            else:
                from adapters.simulators import start_all

                self.simulators = await start_all(env.receipts_url, twilio_auth_token=env.twilio_auth_token,
                                                  vendor_secret=env.vendor_secret,
                                                  hms_receipt_key=env.hms_receipt_key)
                info = self.simulators.as_dict()
        built, specs = provider_set(settings, info=info)
        providers, routes = built.providers, built.routes
        log.info("providers (%s): %s", provider_source(settings), "; ".join(
            f"{c}: " + " → ".join(f"{n} ({k or '-'}{', ' + e if e else ''})" for n, k, e in chain)
            for c, chain in built.describe().items()))
        _allow_webhooks(providers, env.webhook_allow)
        b = settings.breaker
        breaker = {"failure_threshold": b.failure_threshold, "reset_timeout": b.reset_timeout_s,
                   "half_open_max": b.half_open_max}
        rates = {n: (p.rate, p.burst) for n, p in specs.items() if n in providers and p.rate is not None}
        board = self._breaker_board()

        def on_change(name: str, old: str, new: str) -> None:
            metrics.on_breaker_change(name, old, new)
            board.note(name, new)

        disp = Dispatcher(providers, routes, rates=rates, breaker=breaker, on_breaker_change=on_change,
                          on_fault=metrics.on_provider_fault)
        for name, spec in specs.items():  # a provider's own [providers.<name>.breaker]
            if name in disp.breakers and spec.breaker:
                for k, v in breaker_settings(breaker, spec).items():
                    setattr(disp.breakers[name], k, v)
        for name in providers:
            board.note(name, "closed")  # where every worker's breakers start
        return disp

    def _breaker_board(self) -> Any:
        """Where this worker's breaker states are published for the API (pipeline/breakers.py)."""
        from .breakers import BreakerBoard, worker_name

        # through this worker's side connections, never the transport's client (whose
        # commands during a start-up or rebalance seek widen its window: agents/callbacks.py)
        return BreakerBoard(self.side_client, self.app.transport.keys.breakers, worker=worker_name(self.settings.env))

    async def warm_up(self) -> None:
        """Open the store and build the providers at start (a task of the app): the
        first OTP after a start must not pay for loading the adapters, reading their
        keys and making their TLS contexts (about 0.7 s of CPU, measured on the
        priority worker's first burst). It waits for the tables' recovery, so that
        none of it runs while the consumer seeks to its committed offsets."""
        try:
            await self.app.tables.recovery.completed.wait()
            await self.store()
            await self.dispatcher()
        except Exception as exc:  # noqa: BLE001 - the first delivery tries again, and says why
            log.warning("warming up the worker's resources failed (%s: %s); the first delivery retries",
                        type(exc).__name__, exc)

    async def close(self) -> None:
        """Close what this process opened (aiosqlite's thread would keep it alive);
        nothing is opened again afterwards."""
        self.closed = True
        store, self._store = self._store, None
        if store is not None:
            await store.close()
        disp, self._dispatcher = self._dispatcher, None
        if disp is not None:
            await disp.close()
        sims, self.simulators = self.simulators, None
        if sims is not None:
            await sims.stop()
        side, self._side = self._side, None
        if side is not None:
            try:
                await side.aclose()
            except Exception:  # noqa: BLE001 - closing at exit, best effort
                pass


def _allow_webhooks(providers: dict, entries: str) -> None:
    """An operator's explicit additions to the webhook guard's allowlist."""
    from adapters.webhook import WebhookProvider, allowlist

    extra = allowlist([entries])
    for hook in providers.values():
        if extra and isinstance(hook, WebhookProvider):
            hook.guard.extend(extra)
            log.warning("webhook targets allowed besides public addresses: %s", ", ".join(hook.guard.allow))
