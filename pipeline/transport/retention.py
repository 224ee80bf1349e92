"""Trimming consumed topic streams: Redis keeps a stream in memory until told
otherwise, so a topic would grow for ever.

Kafka deletes a topic's old segments by age whatever its consumers have read.
Here memory is the limit, so the rule is tighter and safer at once: a partition's
entries are trimmed once **every consumer group that reads the topic has
committed past them** and they are at least ``keep`` seconds old (broker URL
``keep``; -1 never trims). A group that has not committed on a partition holds
its whole stream. Changelogs are not trimmed here: they are compacted
(:mod:`.compactor`). A topic the app writes and does not read (the hooks' ``trim_written``:
the outcome stream, which analysts read) is trimmed by its partitions' owners as
Kafka would, by age, and no further than any reader group has committed.

Readers register themselves in ``<ns>:readers:<topic>`` (a sorted set, group →
last seen ms) every trimming round; a group not seen for a week no longer holds
a stream (a retired app must not pin memory for ever). An outside reader that
does not commit through this transport (``notify outcomes tail``) sees at least
the last ``keep`` seconds, like a Kafka consumer sees what retention left.

"Old" is measured without clocks in the entries: each worker samples every
partition's highwater when it trims; the horizon is the highwater it sampled
``keep`` seconds ago or more (a restarted worker trims nothing for ``keep``
seconds).
"""

import bisect
from collections import deque
from typing import Any, Iterable, Optional

from .keys import Keys, entry_id

__all__ = ["Horizons", "READER_TTL_S", "trim_horizon", "trim_partition"]

#: A reader group not seen for this long no longer holds a topic's entries.
READER_TTL_S = 7 * 86400


def trim_horizon(committed: Iterable[Optional[int]], aged: int) -> int:
    """First offset to keep: the lowest committed offset among the readers, and
    no later than ``aged`` (the highwater ``keep`` seconds ago). 0 (trim nothing)
    when a reader has not committed or there is no reader."""
    lowest: Optional[int] = None
    for c in committed:
        if c is None:
            return 0
        lowest = c if lowest is None else min(lowest, c)
    return 0 if lowest is None else max(0, min(lowest, aged))


class Horizons:
    """Highwater samples per partition: what the highwater was ``keep_s`` ago."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._samples: dict[Any, deque] = {}

    def observe(self, tp: Any, now: float, highwater: int) -> None:
        s = self._samples.setdefault(tp, deque())
        s.append((now, highwater))
        # one sample at or before the keep boundary is all that is needed
        while len(s) > 1 and s[1][0] <= now - self.keep_s:
            s.popleft()

    def aged(self, tp: Any, now: float) -> int:
        s = self._samples.get(tp)
        if not s:
            return 0
        times = [t for t, _hw in s]
        i = bisect.bisect_right(times, now - self.keep_s)
        return s[i - 1][1] if i else 0

    def forget(self, keep: Iterable[Any]) -> None:
        """Drop the samples of partitions no longer assigned."""
        keep = set(keep)
        for tp in [tp for tp in self._samples if tp not in keep]:
            del self._samples[tp]


async def trim_partition(client: Any, keys: Keys, topic: str, partition: int, horizon: int) -> int:
    """Delete the entries below offset ``horizon``; returns the number deleted."""
    if horizon <= 0:
        return 0
    return int(await client.xtrim(keys.stream(topic, partition), minid=entry_id(horizon), approximate=False))
