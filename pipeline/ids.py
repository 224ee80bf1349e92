"""Deterministic ids: the same (biz_key, user_id[, channel]) always yields the same id,
so a replayed event or a repeated API call finds the original notification."""

from hashlib import blake2b

__all__ = ["notification_id", "delivery_id", "split_delivery_id"]


def notification_id(biz_key: str, user_id: str) -> str:
    digest = blake2b(f"{biz_key}\x1f{user_id}".encode(), digest_size=10).hexdigest()
    return f"n_{digest}"


def delivery_id(biz_key: str, user_id: str, channel: str) -> str:
    return f"{notification_id(biz_key, user_id)}.{channel}"


def split_delivery_id(did: str) -> tuple[str, str]:
    """``n_….push`` → (notification id, channel)."""
    nid, _, channel = did.rpartition(".")
    return nid, channel
