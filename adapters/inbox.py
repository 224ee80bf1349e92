"""The in-app inbox "provider".

It does no I/O: the inbox sink (the agent that owns the inbox table) writes
the row and bumps the unread count. ``send`` only confirms the hand-off, so
the inbox lane flows through the same attempt/outcome path as every other
channel. ``provider_msg_id`` is the delivery id, which is also the inbox row's
key, so a replayed delivery overwrites its own row instead of adding one.
"""

from __future__ import annotations

from typing import Optional

from pipeline.models import AttemptResult, Delivery

from .base import Provider, QueryResult, QueryStatus, SendResult

__all__ = ["InboxProvider"]


class InboxProvider(Provider):
    channel = "inbox"

    def __init__(self, name: str = "inbox") -> None:
        self.name = name

    async def send(self, delivery: Delivery) -> SendResult:
        return SendResult(AttemptResult.ACCEPTED, self.name, provider_msg_id=delivery.delivery_id, latency_ms=0.0)

    #: its deliveries are DELIVERED when written: no receipt to poll for
    status_query = False

    async def query(self, delivery_id: str, provider_msg_id: Optional[str] = None) -> QueryResult:
        # the inbox never times out; whatever the sink wrote is the answer
        return QueryResult(True, delivery_id, QueryStatus.ACCEPTED, provider=self.name)
