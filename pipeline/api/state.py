"""What every route module shares (:mod:`.routes`): the settings, the broker
client and the topic writer, the record store, the lag sampler, and their
lifecycle (connected and opened on the application's startup, closed on its
cleanup). :func:`pipeline.api.app.make_app` builds one and hands it to each
route module."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Optional

from pipeline.store import RecordStore
from pipeline.transport.client import connect, parse_url
from pipeline.transport.keys import Keys
from pipeline.transport.wire import Wire

from . import metrics_lag as M
from .auth import KeyStore
from .openapi import build_openapi
from .producer import TopicWriter

__all__ = ["Api", "BROKER_POOL"]

log = logging.getLogger("notify.api")

#: broker connections the API keeps at most (requests beyond wait for one)
BROKER_POOL = 64


class _ScheduledCount:
    """Records in state SCHEDULED, counted on a separate read-only connection at
    most every ``ttl`` seconds (a scrape never waits behind a long count)."""

    def __init__(self, path: str, ttl: float = 10.0) -> None:
        self.path = path
        self.ttl = ttl
        self.value: Optional[int] = None
        self._at = 0.0
        self._db: Any = None

    async def refresh(self) -> None:
        if time.monotonic() - self._at < self.ttl:
            return
        self._at = time.monotonic()
        try:
            import aiosqlite

            if self._db is None:
                uri = Path(os.path.abspath(self.path)).as_uri() + "?mode=ro"
                self._db = await aiosqlite.connect(uri, uri=True)
                await self._db.execute("PRAGMA busy_timeout=1000")
            async with self._db.execute("SELECT count(*) FROM notify_record WHERE status = 'SCHEDULED'") as cur:
                row = await cur.fetchone()
            self.value = int(row[0]) if row else 0
        except Exception:  # noqa: BLE001 - a missing metric, not a failed scrape
            log.debug("scheduled count failed", exc_info=True)
            self.value = None

    def __call__(self) -> Optional[int]:
        return self.value

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None


class Api:
    """The API's shared state. ``client``, ``writer``, ``store``, ``sampler`` and
    ``lag_registry`` are None until :meth:`start`."""

    def __init__(
        self,
        settings: Any,
        *,
        broker_url: str,
        store_path: str,
        keys: KeyStore,
        renderer: Any,
        twilio_auth_token: Optional[str],
        vendor_secret: Optional[str],
        public_url: Optional[str],
        idempotency_ttl: int,
        batch_max_events: int,
        hms_receipt_key: Optional[str] = None,
    ) -> None:
        self.settings = settings
        self.broker_url = broker_url
        self.store_path = store_path
        self.keys = keys
        self.renderer = renderer
        self.twilio_auth_token = twilio_auth_token
        self.vendor_secret = vendor_secret
        #: the Push Kit simulator's receipt callback key (NOTIFY_HMS_RECEIPT_KEY): /v1/receipts/hms
        self.hms_receipt_key = hms_receipt_key
        self.public_url = public_url.rstrip("/") if public_url else None
        self.idempotency_ttl = int(idempotency_ttl)
        self.batch_max_events = batch_max_events
        prefix = parse_url(broker_url).query.get("prefix") or "nfs"
        self.rkeys = Keys(prefix)
        self.ns = prefix
        self.client: Any = None
        #: the writes of every request on one connection of our own (pipeline/transport/wire.py),
        #: pipelined; None on a cluster, TLS or a Unix socket (the client's pipelines)
        self.wire: Optional[Wire] = None
        self.writer: Optional[TopicWriter] = None
        self.store: Optional[RecordStore] = None
        self.sampler: Optional[M.LagSampler] = None
        self.scheduled = _ScheduledCount(store_path)
        self.lag_registry: Any = None
        self.openapi = build_openapi(settings, renderer=renderer, batch_max_events=batch_max_events,
                                     hms_simulator=bool(hms_receipt_key))

    async def start(self) -> None:
        # a bounded pool: under a burst of producers a request waits for a connection
        # (up to 5 s, then 429 over_capacity) instead of opening one of its own
        self.client = await connect([self.broker_url], pool_size=BROKER_POOL, pool_timeout=5.0)
        self.wire = Wire.for_client(self.client)
        self.writer = TopicWriter(self.client, self.rkeys, self.settings.partitions, wire=self.wire)
        Path(os.path.abspath(self.store_path)).parent.mkdir(parents=True, exist_ok=True)
        self.store = await RecordStore(self.store_path).open()
        self.sampler = M.LagSampler(self.client, self.rkeys, self.settings.partitions)
        self.lag_registry = M.new_registry(M.LagCollector(self.sampler, self.scheduled))

    async def stop(self) -> None:
        await self.scheduled.close()
        if self.store is not None:
            await self.store.close()
        if self.wire is not None:
            await self.wire.aclose()
        if self.client is not None:
            await self.client.aclose()

    @property
    def body_timeout(self) -> float:
        api = getattr(self.settings, "api", None)
        return float(getattr(api, "body_timeout_s", 30.0))
