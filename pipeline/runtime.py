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

from .app import settings
from .layout import SIMULATOR_ROUTES as ROUTES_SIM  # noqa: F401  (re-exported)
from .providers import ROUTES_FAKE, fake_providers, provider_set, provider_source  # noqa: F401  (re-exported)
from .store import RecordStore, StoreUnavailable

log = logging.getLogger(__name__)

_store: Optional[RecordStore] = None
_dispatcher: Optional[Dispatcher] = None
_lock = asyncio.Lock()
simulators: Any = None

async def store() -> RecordStore:
    global _store
    if _store is None:
        async with _lock:
            if _store is None:
                os.makedirs(os.path.dirname(os.path.abspath(settings.db_path)), exist_ok=True)
                s = RecordStore(settings.db_path)
                await s.open()
                _store = s
    return _store


async def with_store(op: Callable[[RecordStore], Awaitable[Any]], what: str) -> Any:
    """``op(store)``, retried with backoff while the store is unavailable (disk full,
    file read-only; opening it may fail the same way): the agent waits, nothing is
    dropped (an exception would stop the agent for good)."""
    delay = 0.1
    while True:
        try:
            return await op(await store())
        except StoreUnavailable as exc:
            log.warning("%s store unavailable (%s); retrying in %.1fs", what, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def dispatcher() -> Dispatcher:
    global _dispatcher, simulators
    if _dispatcher is None:
        async with _lock:
            if _dispatcher is None:
                from adapters.registry import breaker_settings

                from . import metrics

                info = None
                if provider_source(settings) == "simulators":
                    if os.environ.get("NOTIFY_SIMULATORS"):
                        import orjson

                        with open(os.environ["NOTIFY_SIMULATORS"], "rb") as fh:
                            info = orjson.loads(fh.read())
                    else:
                        from adapters.simulators import start_all

                        simulators = await start_all(
                            os.environ.get("NOTIFY_RECEIPTS_URL"),
                            twilio_auth_token=os.environ.get("NOTIFY_TWILIO_AUTH_TOKEN"),
                            vendor_secret=os.environ.get("NOTIFY_VENDOR_SECRET"),
                        )
                        info = simulators.as_dict()
                built, specs = provider_set(settings, info=info)
                providers, routes = built.providers, built.routes
                log.info("providers (%s): %s", provider_source(settings), "; ".join(
                    f"{c}: " + " → ".join(f"{n} ({k or '-'}{', ' + e if e else ''})" for n, k, e in chain)
                    for c, chain in built.describe().items()))
                _allow_webhooks(providers, os.environ.get("NOTIFY_WEBHOOK_ALLOW", ""))
                b = settings.breaker
                breaker = {"failure_threshold": b.failure_threshold, "reset_timeout": b.reset_timeout_s,
                           "half_open_max": b.half_open_max}
                rates = {n: (p.rate, p.burst) for n, p in specs.items() if n in providers and p.rate is not None}
                board = _breaker_board()

                def on_change(name: str, old: str, new: str) -> None:
                    metrics.on_breaker_change(name, old, new)
                    board.note(name, new)

                _dispatcher = Dispatcher(providers, routes, rates=rates, breaker=breaker, on_breaker_change=on_change,
                                         on_fault=metrics.on_provider_fault)
                for name, spec in specs.items():  # a provider's own [providers.<name>.breaker]
                    if name in _dispatcher.breakers and spec.breaker:
                        for k, v in breaker_settings(breaker, spec).items():
                            setattr(_dispatcher.breakers[name], k, v)
                for name in providers:
                    board.note(name, "closed")  # where every worker's breakers start
    return _dispatcher


def _allow_webhooks(providers: dict, entries: str) -> None:
    """An operator's explicit additions to the webhook guard's allowlist."""
    from adapters.webhook import WebhookProvider, allowlist

    extra = allowlist([entries])
    for hook in providers.values():
        if extra and isinstance(hook, WebhookProvider):
            hook.guard.extend(extra)
            log.warning("webhook targets allowed besides public addresses: %s", ", ".join(hook.guard.allow))


def _breaker_board():
    """Where this worker's breaker states are published for the API (pipeline/breakers.py)."""
    from .app import app
    from .breakers import BreakerBoard
    from .transport.keys import Keys

    return BreakerBoard(app.transport.client, Keys().breakers)


async def close() -> None:
    """Close what this process opened (aiosqlite's thread would keep it alive)."""
    global _store, _dispatcher, simulators
    if _store is not None:
        await _store.close()
        _store = None
    if _dispatcher is not None:
        await _dispatcher.close()
        _dispatcher = None
    if simulators is not None:
        await simulators.stop()
        simulators = None
