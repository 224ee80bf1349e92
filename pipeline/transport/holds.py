"""Commit holds: offsets whose work is still in flight, below which a commit must
stop, whatever the consumer's acknowledgement bookkeeping says.

A lane keeps provider calls in flight while it reads on (docs/adr/0001). Faust
commits the highest offset below which everything is acknowledged, but it also
counts as done the offsets it takes for gaps in what it was handed (the drain
skips the rest of a batch made stale by a seek, then sees the next offset jump),
so a commit could pass a delivery whose call had not returned, and a kill -9
then lost it (the elastic fault drill). A holder registers the offset of each
entry it is still working on; :meth:`Consumer._commit` writes no offset above
the lowest one held for its partition.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional

from faust.types import TP

__all__ = ["CommitHolds"]


class CommitHolds:
    def __init__(self) -> None:
        self._held: dict[TP, Counter] = {}

    def hold(self, tp: TP, offset: int) -> None:
        self._held.setdefault(tp, Counter())[offset] += 1

    def release(self, tp: TP, offset: int) -> None:
        held = self._held.get(tp)
        if held is None:
            return
        held[offset] -= 1
        if held[offset] <= 0:
            del held[offset]
        if not held:
            del self._held[tp]

    def cap(self, tp: TP, offset: int) -> int:
        """``offset`` (the next to read), lowered to the lowest offset still held."""
        held = self._held.get(tp)
        low: Optional[int] = min(held) if held else None
        return offset if low is None else min(offset, low)
