"""Deterministic ids: the same (producer, biz_key, user_id[, channel]) always yields
the same id, so a replayed event or a repeated API call finds the original
notification.

A business key belongs to its producer: the same ``biz_key`` from two producers
is two events. The operator's own key space (events written straight to the
streams, the bootstrap key) is the producer ``""``, whose ids are those of the
bare business key, as before producers were told apart.
"""

from hashlib import blake2b

__all__ = ["scoped", "notification_id", "delivery_id", "device_delivery_id", "record_id", "split_delivery_id"]


def scoped(biz_key: str, producer: str = "") -> str:
    """The business key in its producer's key space (the identity the guard's
    dedup keys and the ids are built from)."""
    return f"{producer}\x1e{biz_key}" if producer else biz_key


def notification_id(biz_key: str, user_id: str, producer: str = "") -> str:
    digest = blake2b(f"{scoped(biz_key, producer)}\x1f{user_id}".encode(), digest_size=10).hexdigest()
    return f"n_{digest}"


def delivery_id(biz_key: str, user_id: str, channel: str, producer: str = "") -> str:
    return f"{notification_id(biz_key, user_id, producer)}.{channel}"


def device_delivery_id(record: str, platform: str, token: str) -> str:
    """The delivery of a push to one device: ``<record's delivery_id>.<12 hex>``,
    the hex a digest of the device (never the token itself), so the same device
    always gets the same delivery (its own provider idempotency key, inflight
    mark, attempts and retries), whatever other devices the user has."""
    digest = blake2b(f"{platform}:{token}".encode(), digest_size=6).hexdigest()
    return f"{record}.{digest}"


def record_id(did: str) -> str:
    """The delivery_id of the record a delivery belongs to: ``n_….push.<device>`` →
    ``n_….push``; a delivery of a whole channel is its own record."""
    nid, _, rest = did.partition(".")
    channel, dot, _device = rest.partition(".")
    return f"{nid}.{channel}" if dot else did


def split_delivery_id(did: str) -> tuple[str, str]:
    """``n_….push`` (or a device's ``n_….push.<device>``) → (notification id, channel)."""
    nid, _, rest = did.partition(".")
    return nid, rest.partition(".")[0]
