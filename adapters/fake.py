"""In-process fake providers: the pipeline's tests and benchmarks use them where a
real wire protocol adds nothing. Behaviour per message follows the simulators'
scenario table (by the last four digits in the address: phone number, e-mail
local part, token), so a test reads the same either way:

    …0001 permanent (invalid number)       …0004 accepted, then the answer times out
    …0002 429 on the first call (Retry-After 1)  …0006 503 on the first call
    …0007 always 500                        anything else: accepted

0001 describes the recipient and holds on every provider; the others describe a
provider's behaviour and hold only on a ``primary`` fake (provider A), so a
failover to B finds a healthy provider.

Each fake keeps a ledger (``calls``: delivery_id → number of calls, ``accepted``:
delivery_ids the provider took), answers reconciliation queries from it, and has a
``mode`` ("ok" | "down" | "slow") that tests can flip.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections import Counter
from typing import Optional

from pipeline.models import AttemptResult, Delivery

from .base import Provider, QueryResult, QueryStatus, SendResult

__all__ = ["FakeProvider"]

_DIGITS = re.compile(r"\d{4,}")


class FakeProvider(Provider):
    def __init__(
        self, name: str, channel: str, *, latency_s: float = 0.0, query_supported: bool = True, primary: bool = True
    ) -> None:
        self.name = name
        self.primary = primary
        self.channel = channel
        self.latency_s = latency_s
        self.query_supported = query_supported
        self.mode = "ok"
        self.calls: Counter[str] = Counter()
        self.accepted: dict[str, str] = {}
        self._ids = itertools.count(1)

    def _scenario(self, address: str) -> str:
        found = _DIGITS.findall(address)
        s = found[-1][-4:] if found else ""
        return s if self.primary or s == "0001" else ""

    async def send(self, delivery: Delivery) -> SendResult:
        t0 = time.perf_counter()
        did = delivery.delivery_id
        self.calls[did] += 1
        n = self.calls[did]
        if self.latency_s:
            await asyncio.sleep(self.latency_s)

        def result(kind: str, **kw) -> SendResult:
            return SendResult(kind, self.name, latency_ms=(time.perf_counter() - t0) * 1000, **kw)

        if self.mode == "down":
            return result(AttemptResult.TRANSIENT_ERROR, error="503 service unavailable")
        s = self._scenario(delivery.address or "")
        if s == "0001":
            return result(AttemptResult.PERMANENT_ERROR, error="invalid number", permanent_kind="invalid_number")
        if s == "0002" and n == 1:
            return result(AttemptResult.RATE_LIMITED, retry_after=1.0, error="429")
        if s == "0006" and n == 1:
            return result(AttemptResult.TRANSIENT_ERROR, error="503")
        if s == "0007":
            return result(AttemptResult.TRANSIENT_ERROR, error="500")
        msg_id = self.accepted.get(did) or f"{self.name}-{next(self._ids)}"
        self.accepted[did] = msg_id
        if s == "0004" and n == 1:
            return result(AttemptResult.TIMEOUT_UNKNOWN, error="read timeout after send")
        return result(AttemptResult.ACCEPTED, provider_msg_id=msg_id)

    @property
    def status_query(self) -> bool:
        return self.query_supported

    async def query(self, delivery_id: str, provider_msg_id: Optional[str] = None) -> QueryResult:
        if not self.query_supported:
            return QueryResult(False, status=QueryStatus.NOT_FOUND, supported=False, provider=self.name)
        msg_id = self.accepted.get(delivery_id)
        if msg_id:
            # what the provider's status endpoint says a while after sending
            return QueryResult(True, msg_id, QueryStatus.DELIVERED, provider=self.name)
        return QueryResult(False, status=QueryStatus.NOT_FOUND, provider=self.name)
