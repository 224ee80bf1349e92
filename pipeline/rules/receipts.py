"""Which deliveries a delivery receipt applies to. Pure; no I/O.

A receipt is matched on (provider, provider_msg_id), never on the message id
alone: message ids are the providers' own, so one provider's id may be
another's, and a receipt signed by one provider (``Receipt.provider`` is the
name of the signature scheme that verified it, adapters/receipts.py) must not
decide the fate of a message another provider carried. A receipt whose id is
only known under other providers is refused (the receipts agent dead-letters it
as ``provider_mismatch``; nothing changes), one whose id is not known at all may
be early (retried, then ``unmatched_receipt``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from pipeline.models import Outcome

__all__ = ["split_by_provider", "record_outcome"]


def split_by_provider(provider: str, rows: Sequence[Mapping[str, Any]]) -> tuple[list, list]:
    """Records carrying the receipt's message id → (those sent through
    ``provider``: the receipt applies to them; the others: it must not)."""
    mine = [r for r in rows if r.get("provider") == provider]
    others = [r for r in rows if r.get("provider") != provider]
    return mine, others


def record_outcome(row: Mapping[str, Any], state: str, at: float, **kw: Any) -> Outcome:
    """The outcome ``state`` of the delivery a record ``row`` (the store's columns)
    stands for: what a receipt or a receipt poll decides, where no delivery record
    of the pipeline is at hand. ``kw``: the outcome's other fields (reason, provider,
    provider_msg_id, callback)."""
    return Outcome(
        delivery_id=row["delivery_id"], notification_id=row["notification_id"], biz_key=row["biz_key"],
        user_id=row["user_id"], channel=row["channel"], category=row.get("category") or "",
        template=row.get("template_code") or "", priority=row.get("priority") or "", state=state, at=at,
        accepted_at=row.get("accepted_at") or 0.0, producer=row.get("producer") or "",
        pref_version=row.get("pref_version") or 0, **kw,
    )
