"""Committed offsets ahead of their stream: found and repaired at every seek.

A partition's stream and counter can roll back while a group's committed offset
does not: Redis with AOF ``everysec`` loses up to a second of writes on a crash,
and a replica promoted by a failover may not have received the last ones, while
the committed offset lives elsewhere (another shard of a cluster: the offsets
hash has a hash tag of its own) or was fsynced. The counter then assigns again
offsets the group has already committed past, and without a check the group
would wait for offset ``committed`` and silently skip every entry appended below
it, for ever.

The check runs where the consumer takes its positions
(``Consumer.seek_to_committed``: worker start and every rebalance or failover
that assigns partitions). For each assigned partition with a committed offset,
:func:`check` compares it with the partition's end, the next offset it assigns
(:func:`stream_end`): a committed offset at or below the end is kept as it is; one
past the end is a rollback. It is logged as an ERROR, reported through
``TransportHooks.on_offset_rollback(topic, partition, committed, end)`` and
repaired: the group reads the partition again from the first entry the stream
holds (``start``) and its committed offset in Redis is rewritten to that
(:func:`rewrite_committed`), so that the next seek, the commits that follow (the
COMMIT script never moves an offset backwards) and ``notify status`` agree.

Why the first entry and not the end: the entries appended since the rollback sit
at offsets the group had committed past, below the end, and nothing in the
stream tells them from the entries that survived it (which the group handled
before). Reading from the end would skip them as surely as reading from the
committed offset. Reading what survived once more is safe: the pipeline's effect
ledger makes handling an entry again a no-op (the guard's dedup entries remember
the message that wrote them, the lanes' inflight table holds a delivery's durable
"calling" mark and result, delivery ids are derived from the event), and the
trimmer (:mod:`.retention`) keeps little more than ``keep`` seconds of entries
below what every group committed, which bounds how much is read again.

What the check cannot see: a rollback followed by so many new entries that the
end is past the committed offset again before the group seeks (the numbers alone
cannot tell it from a group that simply lags), and a worker that keeps its
partitions through the failover without seeking (its reads wait for offset
``committed``; the next rebalance or restart finds it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["REWRITE_COMMITTED", "Verdict", "check", "rewrite_committed", "stream_end"]

log = logging.getLogger(__name__)


def stream_end(counter: Optional[int], last: Optional[int]) -> int:
    """The next offset ``topic[p]`` assigns: its counter, or the offset after the
    stream's last entry when that is higher (the counter key is missing, or fell
    behind its stream); 0 for a partition never written."""
    return max(counter or 0, last + 1 if last is not None else 0)


@dataclass(frozen=True)
class Verdict:
    """What a seek does with one partition's committed offset."""

    #: the committed offset read (None: the group never committed on the partition)
    committed: Optional[int]
    #: the partition's end: the next offset it assigns
    end: int
    #: where the group reads from: the committed offset, or after a rollback the
    #: first entry the stream holds (the end if it holds none); None without a
    #: committed offset (the group's ``auto_offset_reset`` decides)
    start: Optional[int]

    @property
    def rolled_back(self) -> bool:
        """The committed offset is past the end: the stream lost writes."""
        return self.committed is not None and self.committed > self.end


def check(committed: Optional[int], end: int, first: Optional[int]) -> Verdict:
    """Decide for one partition: ``committed`` (the group's), ``end``
    (:func:`stream_end`), ``first`` (offset of the first entry the stream holds, None
    if it holds none). Pure: no I/O."""
    if committed is None:
        return Verdict(None, end, None)
    if committed <= end:  # the normal case, a lag of end - committed
        return Verdict(committed, end, committed)
    start = end if first is None else min(first, end)
    return Verdict(committed, end, start)


#: Rewrite a group's committed offset after a rollback: compare-and-set, fenced
#: as COMMIT (scripts.py) is, so that it never overwrites a commit it did not see.
#: KEYS: offsets hash, fence hash (one hash slot: the consumer passes a partition
#: index's commits and fence copy, docs/adr/0004).  ARGV: field, expected
#: (the committed offset the check read, '' for none), new offset, fence field,
#: token.  Writes the offset (and ``<field>@`` = token, as COMMIT does) only if the
#: caller's token still owns the fence field and the offset is still ``expected``.
#: Returns {1, new} written, {0, current ('' for none)} if it changed meanwhile,
#: or error FENCED <fence field>.
REWRITE_COMMITTED = """
if redis.call('HGET', KEYS[2], ARGV[4]) ~= ARGV[5] then
  return redis.error_reply('FENCED ' .. ARGV[4])
end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local want = -1
if ARGV[2] ~= '' then want = tonumber(ARGV[2]) end
local have = -1
if cur then have = tonumber(cur) end
if have ~= want then return {0, cur or ''} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3], ARGV[1] .. '@', ARGV[5])
return {1, ARGV[3]}
"""


async def rewrite_committed(
    script: Any, offsets_key: str, fence_key: str, field: str, verdict: Verdict,
    fence: tuple[Any, str], attempts: int = 3,
) -> int:
    """Rewrite the committed offset of ``field`` from ``verdict.committed`` to
    ``verdict.start`` (``script``: :data:`REWRITE_COMMITTED` registered on the
    client); returns where the group should read from: ``verdict.start``, or the
    committed offset found if a commit changed it meanwhile to one within the
    stream (that commit wins). A changed offset still past the end is compared
    and set again, up to ``attempts`` times. Raises ResponseError FENCED when the
    token no longer owns the partition."""
    expected = verdict.committed
    for _ in range(attempts):
        done, cur = await script(
            keys=[offsets_key, fence_key],
            args=[field, "" if expected is None else expected, verdict.start, fence[0], fence[1]],
        )
        if int(done):
            return verdict.start  # type: ignore[return-value]
        found = int(cur) if cur not in (b"", "", None) else None
        if found is not None and found <= verdict.end:
            log.warning("committed offset of %s changed to %d while it was repaired: reading from there",
                        field, found)
            return found
        expected = found
    log.warning("committed offset of %s kept changing: not rewritten", field)
    return verdict.start  # type: ignore[return-value]
