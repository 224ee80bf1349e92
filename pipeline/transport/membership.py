"""Dynamic group membership on Redis: members join and leave freely.

Opt-in with the broker URL option ``members=dynamic`` (the default stays the
static leased slots of :mod:`.ownership`).

* Every member has a lease (a deadline in the ``live`` sorted set, server
  time) renewed by its heartbeat; a member whose lease runs out is expelled by
  whoever runs a membership script next.
* A generation counter is bumped atomically whenever a member joins, leaves,
  is expelled or changes its subscription.
* Eager protocol: on a new generation every member revokes all its partitions
  (Faust's ``on_partitions_revoked`` commits under the old token), then
  acknowledges the generation.  Once every live member acknowledged, the
  leader (lowest member id) computes the assignment with Faust's
  PartitionAssignor and writes it once for that generation, together with the
  fence entries ``<topic>|<p> → <member>:<gen>`` of every active partition;
  every member reads the same assignment.  Members that do not acknowledge
  before the sync deadline are expelled and the generation is bumped again.
* Fencing: an expelled member's fence entries are deleted in the same script
  that expels it, so its commits are refused at once; the changelog fences
  (``SET_FENCE``, never backwards) move to ``<member>:<gen>`` of the new owner
  before it writes.

All scripts touch keys of the group's hash tag only (Redis Cluster safe).
"""

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from faust.types import TP

from .keys import Keys
from .scripts import MEMBER_ACK, MEMBER_ASSIGN, MEMBER_HEARTBEAT, MEMBER_JOIN, MEMBER_LEAVE

__all__ = ["Membership", "GroupState", "read_group"]

log = logging.getLogger(__name__)


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass
class GroupState:
    """A snapshot of the group as stored on Redis."""

    gen: int = 0
    live: dict[str, int] = field(default_factory=dict)  # member → lease deadline (ms)
    info: dict[str, dict] = field(default_factory=dict)  # member → {topics, url}
    acks: dict[str, int] = field(default_factory=dict)
    assign_gen: int = 0
    leader: Optional[str] = None
    assignments: dict[str, str] = field(default_factory=dict)  # member → ClientAssignment JSON
    rebalances: int = 0
    expelled: int = 0
    duration_ms: Optional[int] = None

    @property
    def members(self) -> list[str]:
        return sorted(self.live)

    def all_acked(self) -> bool:
        return bool(self.live) and all(self.acks.get(m) == self.gen for m in self.live)


def _queue_reads(pipe: Any, keys: Keys, group: str) -> Any:
    live, info, acks, state, assign, _fence = keys.member_keys(group)
    pipe.zrange(live, 0, -1, withscores=True)
    pipe.hgetall(info)
    pipe.hgetall(acks)
    pipe.hgetall(state)
    pipe.hgetall(assign)
    return pipe


async def read_group(client: Any, keys: Keys, group: str) -> GroupState:
    """Read the whole membership state (one pipeline; async client; a snapshot is
    enough: MEMBER_ASSIGN re-checks)."""
    return _state(*await _queue_reads(client.pipeline(transaction=False), keys, group).execute())


def read_group_sync(client: Any, keys: Keys, group: str) -> GroupState:
    """Same as :func:`read_group` with a synchronous client (CLI, tests)."""
    return _state(*_queue_reads(client.pipeline(transaction=False), keys, group).execute())


def _state(live: Any, info: Any, acks: Any, state: Any, assign: Any) -> GroupState:
    st = {_s(k): _s(v) for k, v in state.items()}
    a = {_s(k): _s(v) for k, v in assign.items()}
    meta = {"gen", "leader", "at", "duration_ms"}
    return GroupState(
        gen=int(st.get("gen", 0)),
        live={_s(m): int(score) for m, score in live},
        info={_s(k): json.loads(v) for k, v in info.items()},
        acks={_s(k): int(v) for k, v in acks.items()},
        assign_gen=int(a.get("gen", 0)),
        leader=a.get("leader"),
        assignments={k: v for k, v in a.items() if k not in meta},
        rebalances=int(st.get("rebalances", 0)),
        expelled=int(st.get("expelled", 0)),
        duration_ms=int(a["duration_ms"]) if "duration_ms" in a else None,
    )


def _ranges(parts: list[int]) -> str:
    return ",".join(str(p) for p in sorted(parts))


def format_group(st: GroupState, now_ms: Optional[int] = None) -> str:
    """Members, generation and assignment, for ``notify status``."""
    took = f", last took {st.duration_ms} ms" if st.duration_ms is not None else ""
    pending = "" if st.assign_gen == st.gen else f" (rebalancing; assignment of generation {st.assign_gen})"
    lines = [
        f"group generation {st.gen}{pending}: {len(st.live)} members, leader {st.leader or '-'}, "
        f"{st.rebalances} rebalances, {st.expelled} expelled{took}"
    ]
    for m in st.members:
        left = f", lease {max(0, st.live[m] - now_ms) / 1000:.1f}s left" if now_ms is not None else ""
        acked = "" if st.acks.get(m) == st.gen or st.assign_gen == st.gen else ", revoking"
        lines.append(f"  member {m}{left}{acked}")
        raw = st.assignments.get(m) if st.assign_gen else None
        if raw:
            a = json.loads(raw)
            for kind in ("actives", "standbys"):
                for topic, parts in sorted(a.get(kind, {}).items()):
                    if parts and (kind == "actives" or topic.endswith("-changelog")):
                        lines.append(f"    {kind[:-1]:7} {topic}[{_ranges(parts)}]")
    return "\n".join(lines)


class Membership:
    """One member of a dynamic group: its lease, generation and active partitions."""

    def __init__(
        self,
        keys: Keys,
        group: str,
        *,
        lease_s: float = 10.0,
        sync_s: Optional[float] = None,
        member_id: Optional[str] = None,
    ) -> None:
        self.keys = keys
        self.group = group
        self.lease_ms = int(lease_s * 1000)
        self.sync_ms = int((sync_s if sync_s is not None else max(3 * lease_s, 5.0)) * 1000)
        # never all digits: the log redaction (pipeline/redact.py) masks a bare run of
        # 7-15 digits as a phone number, and a member id masked in the log is one
        # nobody can find again (the elastic drill read "53********97" for its zombie)
        self.member_id = member_id or "m" + uuid.uuid4().hex[:11]
        #: generation whose assignment is applied (0: none)
        self.applied_gen = 0
        #: generation this member revoked (and acknowledged) for
        self.revoked_gen = 0
        self.joined = False
        self.info_json: Optional[str] = None
        #: active topic-partitions → token "<member>:<gen>" (commits, changelog writes)
        self.active: dict[TP, str] = {}
        self._scripts: dict[str, Any] = {}
        self._keys = keys.member_keys(group)
        self._left = False

    def token(self, gen: int) -> str:
        return f"{self.member_id}:{gen}"

    def token_for(self, tp: TP) -> Optional[str]:
        return self.active.get(tp)

    @staticmethod
    def fence_field(tp: TP) -> str:
        return Keys.tp_field(tp.topic, tp.partition)

    def drop_all(self) -> None:
        """Stop writing at once (fenced or expelled): no token is ours any more."""
        self.active = {}

    def _script(self, client: Any, lua: str) -> Any:
        s = self._scripts.get(lua)
        if s is None:
            s = self._scripts[lua] = client.register_script(lua)
        return s

    async def join(self, client: Any, topics: Any, url: str = "") -> int:
        self.info_json = json.dumps({"topics": sorted(topics), "url": url}, sort_keys=True)
        gen = await self._script(client, MEMBER_JOIN)(
            keys=self._keys, args=[self.member_id, self.info_json, self.lease_ms, self.sync_ms]
        )
        self.joined = True
        self._left = False
        log.info("member %s joined group %s (generation %s)", self.member_id, self.group, gen)
        return int(gen)

    async def heartbeat(self, client: Any) -> tuple[int, int, int]:
        """(1 | -1 expelled, generation, generation of the written assignment)."""
        if self._left or not self.joined:
            return 0, 0, 0
        status, gen, agen = await self._script(client, MEMBER_HEARTBEAT)(
            keys=self._keys, args=[self.member_id, self.lease_ms, self.sync_ms]
        )
        return int(status), int(gen), int(agen)

    async def ack(self, client: Any, gen: int) -> int:
        r = int(await self._script(client, MEMBER_ACK)(keys=self._keys, args=[self.member_id, gen]))
        if r == 1:
            self.revoked_gen = gen
        return r

    async def write_assignment(
        self, client: Any, gen: int, assignments: dict[str, str], fences: dict[str, str]
    ) -> bool:
        members = sorted(assignments)
        args: list[Any] = [gen, self.member_id, len(members), *members, *(assignments[m] for m in members)]
        args.append(len(fences))
        for f, t in sorted(fences.items()):
            args += [f, t]
        return int(await self._script(client, MEMBER_ASSIGN)(keys=self._keys, args=args)) == 1

    async def read(self, client: Any) -> GroupState:
        return await read_group(client, self.keys, self.group)

    async def leave(self, client: Any) -> None:
        self._left = True
        self.active = {}
        if self.joined:
            await self._script(client, MEMBER_LEAVE)(keys=self._keys, args=[self.member_id, self.sync_ms])
            self.joined = False
