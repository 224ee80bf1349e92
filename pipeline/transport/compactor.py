"""Changelog compaction: Redis does not compact streams, so we do.

Keeps the latest entry per key, drops entries older than the topic's retention
(windowed tables), and never deletes a partition's tail entry: Faust recovers a
table by reading up to ``highwater - 1`` and would wait forever for an offset
that no longer exists.
"""

import time
from typing import Any, Optional

from .keys import Keys
from .scripts import DELETE_EXCEPT_TAIL

__all__ = ["compact_partition", "plan_compaction"]


def plan_compaction(
    entries: list[tuple[bytes, Optional[bytes], float]],
    retention_s: Optional[float] = None,
    now: Optional[float] = None,
) -> list[bytes]:
    """Ids to delete from ``entries`` (id, key, timestamp) given in stream order.

    Pure: the tail-protection is applied again inside Lua when deleting.
    """
    cutoff = (now if now is not None else time.time()) - retention_s if retention_s else None
    latest: dict[Optional[bytes], bytes] = {}
    doomed: list[bytes] = []
    for eid, key, ts in entries:
        if cutoff is not None and ts < cutoff:
            doomed.append(eid)
            continue
        prev = latest.get(key)
        if prev is not None:
            doomed.append(prev)
        latest[key] = eid
    if entries and entries[-1][0] in doomed:
        doomed.remove(entries[-1][0])
    return doomed


async def compact_partition(
    client: Any,
    keys: Keys,
    topic: str,
    partition: int,
    *,
    retention_s: Optional[float] = None,
    now: Optional[float] = None,
    chunk: int = 10_000,
) -> int:
    """Compact one changelog partition; returns the number of entries deleted."""
    stream = keys.stream(topic, partition)
    entries: list[tuple[bytes, Optional[bytes], float]] = []
    start: bytes | str = "-"
    while True:
        batch = await client.xrange(stream, min=start, max="+", count=chunk)
        if not batch:
            break
        entries.extend((eid, f.get(b"k"), float(f.get(b"t", 0))) for eid, f in batch)
        start = b"(" + batch[-1][0]
        if len(batch) < chunk:
            break
    doomed = plan_compaction(entries, retention_s, now)
    script = client.register_script(DELETE_EXCEPT_TAIL)
    deleted = 0
    for i in range(0, len(doomed), 1000):
        deleted += int(await script(keys=[stream], args=doomed[i : i + 1000]))
    return deleted
