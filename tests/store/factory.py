"""Outcome factory and a database dump for the store tests."""

from __future__ import annotations

import sqlite3
from typing import Any, Optional

from pipeline import ids
from pipeline.models import Attempt, Outcome

#: seed 000's notify_record columns, in order
SEED_000_COLUMNS = (
    "id", "biz_key", "user_id", "channel", "template_code", "status", "reason",
    "provider", "provider_msg_id", "retry_count", "created_at", "sent_at",
)  # fmt: skip


def outcome(
    state: str,
    at: float,
    *,
    biz_key: str = "order_shipped:1",
    user_id: str = "u1",
    channel: str = "sms",
    seq: Optional[int] = None,
    result: str = "ACCEPTED",
    **kw: Any,
) -> Outcome:
    did = ids.delivery_id(biz_key, user_id, channel)
    attempt = None
    if seq is not None:
        attempt = Attempt(
            delivery_id=did, seq=seq, channel=channel, provider=kw.get("provider") or "prov-a",
            started_at=100.0 + seq, result=result, latency_ms=12.5,
        )  # fmt: skip
    return Outcome(
        delivery_id=kw.pop("delivery_id", did),
        notification_id=ids.notification_id(biz_key, user_id),
        biz_key=biz_key,
        user_id=user_id,
        channel=channel,
        category=kw.pop("category", "order"),
        template=kw.pop("template", "order_shipped"),
        priority=kw.pop("priority", "normal"),
        state=state,
        at=at,
        attempt=attempt,
        **kw,
    )


def dump(path: str) -> dict[str, list[tuple]]:
    """Every row of the store's tables, straight from the file (a separate connection)."""
    con = sqlite3.connect(path)
    try:
        out = {}
        for t in ("notify_record", "attempts", "inbox", "inbox_unread"):
            n = len(con.execute(f"PRAGMA table_info({t})").fetchall())
            order = ", ".join(str(i) for i in range(1, n + 1))
            out[t] = con.execute(f"SELECT * FROM {t} ORDER BY {order}").fetchall()
        return out
    finally:
        con.close()
