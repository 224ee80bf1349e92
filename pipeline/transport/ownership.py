"""Leased partition ownership: worker i of N owns the partitions p with p mod N == i.

A slot is held by a lease key with an expiry; the owner renews it by heartbeat.
Taking a slot bumps the slot's generation and writes the owner's token
(``<worker>:<generation>``) into the group's fence hash; every commit and every
changelog write checks that token inside Lua, so a worker that was paused past
its lease (and whose slot was taken) cannot write anything.

Policy: a worker first takes its preferred slot (if configured) or any free one;
after a grace period it also takes over any slot whose lease is free (a crashed
or missing worker), up to ``max_slots``.
"""

import asyncio
import logging
import time
import uuid
from typing import Any, Optional

from .keys import Keys
from .scripts import ACQUIRE, RELEASE, RENEW

__all__ = ["SlotLeases"]

log = logging.getLogger(__name__)


class SlotLeases:
    def __init__(
        self,
        keys: Keys,
        group: str,
        slots: int,
        *,
        lease_s: float = 10.0,
        preferred: Optional[int] = None,
        max_slots: Optional[int] = None,
        takeover_grace_s: Optional[float] = None,
        worker_id: Optional[str] = None,
        clock: Any = time.monotonic,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        if preferred is not None and not 0 <= preferred < slots:
            raise ValueError(f"slot must be in [0, {slots}), got {preferred}")
        self.keys = keys
        self.group = group
        self.slots = slots
        self.lease_ms = int(lease_s * 1000)
        self.preferred = preferred
        self.max_slots = max_slots or slots
        self.grace = lease_s * 1.5 if takeover_grace_s is None else takeover_grace_s
        self.worker_id = worker_id or uuid.uuid4().hex[:12]
        self.owned: dict[int, str] = {}
        self._clock = clock
        self._started = clock()
        self._scripts: dict[str, Any] = {}
        # A heartbeat tick still in flight when the worker stops must not renew
        # (RENEW re-creates a lease whose key is gone) after release_all.
        self._lock = asyncio.Lock()
        self._released = False

    def slot_of(self, partition: int) -> int:
        return partition % self.slots

    def token_for(self, partition: int) -> Optional[str]:
        return self.owned.get(partition % self.slots)

    @staticmethod
    def generation(token: str) -> int:
        return int(token.rsplit(":", 1)[1])

    def _script(self, client: Any, lua: str) -> Any:
        s = self._scripts.get(lua)
        if s is None:
            s = self._scripts[lua] = client.register_script(lua)
        return s

    def _candidates(self) -> list[int]:
        if self.preferred is not None:
            order = [self.preferred] + [s for s in range(self.slots) if s != self.preferred]
        else:
            order = list(range(self.slots))
        in_grace = self._clock() - self._started < self.grace
        if in_grace and (self.preferred is not None or self.owned):
            order = [s for s in order if s == self.preferred] if self.preferred is not None else []
        return [s for s in order if s not in self.owned]

    async def tick(self, client: Any) -> tuple[set[int], set[int]]:
        """Renew owned leases and take free slots. Returns (gained, lost)."""
        async with self._lock:
            if self._released:
                return set(), set()
            return await self._tick(client)

    async def _tick(self, client: Any) -> tuple[set[int], set[int]]:
        k, g = self.keys, self.group
        gained: set[int] = set()
        lost: set[int] = set()
        renew = self._script(client, RENEW)
        for slot, token in list(self.owned.items()):
            r = await renew(keys=[k.lease(g, slot), k.group_fence(g)], args=[token, slot, self.lease_ms])
            if int(r) == 0:
                log.warning("lost the lease of slot %d (token %s)", slot, token)
                self.owned.pop(slot, None)  # on_fenced may have dropped it meanwhile
                lost.add(slot)
        if len(self.owned) < self.max_slots:
            acquire = self._script(client, ACQUIRE)
            for slot in self._candidates():
                if len(self.owned) >= self.max_slots:
                    break
                token = await acquire(
                    keys=[k.lease(g, slot), k.group_fence(g), k.gens(g)],
                    args=[self.worker_id, slot, self.lease_ms],
                )
                if token:
                    token = token.decode() if isinstance(token, bytes) else token
                    log.info("worker %s took slot %d/%d (token %s)", self.worker_id, slot, self.slots, token)
                    self.owned[slot] = token
                    gained.add(slot)
        await client.hset(k.members(g), self.worker_id, int(time.time() * 1000))
        return gained, lost

    def drop(self, slot: int) -> None:
        self.owned.pop(slot, None)

    async def release_all(self, client: Any) -> None:
        """Give every slot up (clean shutdown); later ticks do nothing."""
        async with self._lock:
            self._released = True
            release = self._script(client, RELEASE)
            for slot, token in list(self.owned.items()):
                await release(keys=[self.keys.lease(self.group, slot)], args=[token])
            self.owned.clear()
            await client.hdel(self.keys.members(self.group), self.worker_id)
