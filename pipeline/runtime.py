"""Process-wide resources of a worker, opened once and lazily: the record store
and the provider dispatcher.

``NOTIFY_PROVIDERS``: ``fake`` (default; in-process fakes, see adapters/fake.py)
or ``simulators`` (the protocol-level simulators, started in this process, with
the real adapters pointed at them). With ``simulators`` and
``NOTIFY_SIMULATORS=<file>`` (the JSON ``python -m adapters.simulators --info``
writes), the adapters point at simulators already running in another process
instead, so a provider's state and call ledger outlive this worker (the fault
suite kills workers); ``NOTIFY_PROVIDER_TIMEOUT`` (s, default 5) is their timeout.
"""

import asyncio
import logging
import os
from typing import Any, Awaitable, Callable, Optional

from adapters.dispatch import Dispatcher
from adapters.fake import FakeProvider
from adapters.inbox import InboxProvider

from .app import settings
from .store import RecordStore, StoreUnavailable

log = logging.getLogger(__name__)

_store: Optional[RecordStore] = None
_dispatcher: Optional[Dispatcher] = None
_lock = asyncio.Lock()
simulators: Any = None

ROUTES_FAKE = {
    "inbox": ["inbox"],
    "push": ["apns", "fcm"],
    "sms": ["sms_a", "sms_b"],
    "email": ["email"],
    "webhook": ["webhook"],
}
ROUTES_SIM = {
    "inbox": ["inbox"],
    "push": ["apns", "fcm"],
    "sms": ["twilio", "smsvendor"],
    "email": ["smtp"],
    "webhook": ["webhook"],
}


def fake_providers() -> dict:
    latency = float(os.environ.get("NOTIFY_FAKE_LATENCY", "0"))
    out: dict = {"inbox": InboxProvider()}
    for name, channel in (("apns", "push"), ("fcm", "push"), ("sms_a", "sms"), ("sms_b", "sms"),
                          ("email", "email"), ("webhook", "webhook")):
        out[name] = FakeProvider(name, channel, latency_s=latency, primary=name != "sms_b")
    return out


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
                from . import metrics

                kind = os.environ.get("NOTIFY_PROVIDERS", "fake")
                if kind == "simulators" and os.environ.get("NOTIFY_SIMULATORS"):
                    import orjson

                    from adapters.simulators import build_providers_from_info

                    with open(os.environ["NOTIFY_SIMULATORS"], "rb") as fh:
                        info = orjson.loads(fh.read())
                    timeout = float(os.environ.get("NOTIFY_PROVIDER_TIMEOUT", "5"))
                    providers, routes = build_providers_from_info(info, timeout), ROUTES_SIM
                elif kind == "simulators":
                    from adapters.simulators import start_all

                    simulators = await start_all(
                        os.environ.get("NOTIFY_RECEIPTS_URL"),
                        twilio_auth_token=os.environ.get("NOTIFY_TWILIO_AUTH_TOKEN"),
                        vendor_secret=os.environ.get("NOTIFY_VENDOR_SECRET"),
                    )
                    providers, routes = simulators.build_providers(), ROUTES_SIM
                else:
                    providers, routes = fake_providers(), ROUTES_FAKE
                b = settings.breaker
                breaker = {"failure_threshold": b.failure_threshold, "reset_timeout": b.reset_timeout_s,
                           "half_open_max": b.half_open_max}
                rates = {n: (p.rate, p.burst) for n, p in settings.providers.items() if n in providers}
                board = _breaker_board()

                def on_change(name: str, old: str, new: str) -> None:
                    metrics.on_breaker_change(name, old, new)
                    board.note(name, new)

                _dispatcher = Dispatcher(providers, routes, rates=rates, breaker=breaker, on_breaker_change=on_change,
                                         on_fault=metrics.on_provider_fault)
                for name in providers:
                    board.note(name, "closed")  # where every worker's breakers start
    return _dispatcher


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
