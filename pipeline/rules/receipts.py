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

__all__ = ["split_by_provider"]


def split_by_provider(provider: str, rows: Sequence[Mapping[str, Any]]) -> tuple[list, list]:
    """Records carrying the receipt's message id → (those sent through
    ``provider``: the receipt applies to them; the others: it must not)."""
    mine = [r for r in rows if r.get("provider") == provider]
    others = [r for r in rows if r.get("provider") != provider]
    return mine, others
