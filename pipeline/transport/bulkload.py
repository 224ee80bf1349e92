"""Reading a changelog partition in bulk, for table recovery.

Faust recovers a table message by message through the consumer (an Event, a
decode and a table callback per entry: ~10k entries/s on this machine). A store
that knows it runs on this transport (tables/store.py) reads the partition here
instead, 10,000 entries per XRANGE, before Faust's recovery starts, and tells
Faust the offset it holds; Faust then reads only what was written after.
"""

from typing import Any, AsyncIterator, Optional

from .keys import Keys, entry_id, offset_of

__all__ = ["read_changelog"]


async def read_changelog(
    client: Any, keys: Keys, topic: str, partition: int, start: int = 0, chunk: int = 10_000
) -> AsyncIterator[list[tuple[int, Optional[bytes], Optional[bytes]]]]:
    """Chunks of ``(offset, key, value)`` from offset ``start`` to the end of the
    partition as it is when each chunk is read (``value`` None: a tombstone)."""
    stream = keys.stream(topic, partition)
    low: bytes = entry_id(start)
    while True:
        batch = await client.xrange(stream, min=low, max="+", count=chunk)
        if not batch:
            return
        yield [(offset_of(eid), f.get(b"k"), f.get(b"v")) for eid, f in batch]
        if len(batch) < chunk:
            return
        low = b"(" + batch[-1][0]
