"""Where a consumer group's committed offsets are kept, and how they are read.

A group's commits of every topic's partition *p* live in one hash under the
tag ``{g|<group>|<p>}`` (:meth:`.keys.Keys.commits`), next to a copy of the fence
tokens they are checked against (:meth:`.keys.Keys.commit_fence`): the commits of
a group spread over a cluster's masters by partition index instead of all going
to the master of ``{g|<group>}``, where the leases, generations and membership
stay (docs/adr/0004-group-state-by-partition.md).

Readers read both that layout and the one before it (one hash per group,
:meth:`.keys.Keys.offsets`), and the larger offset wins: a deployment upgrades
in place (its old commits are found; the first commit of each partition writes
the new layout), and analysts' readers (pipeline/reader.py), which do not
fence, keep writing the one hash.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from .keys import Keys

__all__ = ["commands", "read", "read_sync", "read_all_sync", "combine", "pipeline_of"]

TP = tuple[str, int]


def _int(v: Any) -> Optional[int]:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def combine(a: Any, b: Any) -> Any:
    """The committed offset from two layouts' raw values: the larger number; a
    value that is not a number wins (a reader reports it as such); None if both
    are missing."""
    if a is None:
        return b
    if b is None:
        return a
    ia, ib = _int(a), _int(b)
    if ia is None:
        return a
    if ib is None:
        return b
    return a if ia >= ib else b


def commands(keys: Keys, group: str, tps: Sequence[TP]) -> tuple[list[tuple[str, tuple]], Callable[[Iterator], list]]:
    """The commands (name, args) reading ``group``'s committed offsets of ``tps`` in
    one pipeline, and the function turning their replies (an iterator, consumed
    in order) into the raw value per tp (None when none is committed)."""
    by_p: dict[int, list[int]] = {}
    for i, (_t, p) in enumerate(tps):
        by_p.setdefault(p, []).append(i)
    parts = sorted(by_p.items())
    fields = [Keys.tp_field(t, p) for t, p in tps]
    cmds: list[tuple[str, tuple]] = [("hmget", (keys.commits(group, p), [fields[i] for i in idx])) for p, idx in parts]
    if fields:
        cmds.append(("hmget", (keys.offsets(group), fields)))

    def parse(replies: Iterator) -> list:
        out: list = [None] * len(tps)
        for _p, idx in parts:
            for i, v in zip(idx, next(replies)):
                out[i] = v
        if fields:
            for i, v in enumerate(next(replies)):
                out[i] = combine(out[i], v)
        return out

    return cmds, parse


def pipeline_of(client: Any, cmds: Iterable[tuple[str, tuple]]) -> Any:
    """A non-transactional pipeline of the commands (name, args): one round trip
    (on a cluster, one per node)."""
    pipe = client.pipeline(transaction=False)
    for name, args in cmds:
        getattr(pipe, name)(*args)
    return pipe


async def read(client: Any, keys: Keys, group: str, tps: Sequence[TP]) -> list[Optional[int]]:
    """``group``'s committed offset of each of ``tps`` (None: none, or not a number),
    one round trip."""
    if not tps:
        return []
    cmds, parse = commands(keys, group, tps)
    return [_int(v) for v in parse(iter(await pipeline_of(client, cmds).execute()))]


def read_sync(client: Any, keys: Keys, group: str, tps: Sequence[TP]) -> list[Optional[int]]:
    """:func:`read` with a synchronous client."""
    if not tps:
        return []
    cmds, parse = commands(keys, group, tps)
    return [_int(v) for v in parse(iter(pipeline_of(client, cmds).execute()))]


def read_all_sync(client: Any, keys: Keys, group: str, partitions: Optional[int] = None) -> dict:
    """Every field of ``group``'s committed offsets (``"<topic>|<p>"`` → offset and
    ``"<topic>|<p>@"`` → the token that wrote it), both layouts merged, shaped as
    ``HGETALL`` of one hash would answer (for tests and tools). ``partitions``: how
    many partition indexes to read (default: the most any topic of ``<ns>:topics``
    has, at least 64)."""
    if partitions is None:
        counts = [_int(v) or 0 for v in client.hvals(keys.topics)]
        partitions = max(counts + [64])
    pipe = pipeline_of(client, [("hgetall", (keys.commits(group, p),)) for p in range(partitions)]
                     + [("hgetall", (keys.offsets(group),))])
    out: dict = {}
    for h in pipe.execute():
        for k, v in h.items():
            token = k.endswith(b"@" if isinstance(k, bytes) else "@")
            # the token of the new layout's offset first (it is read first)
            out[k] = out.get(k, v) if token else combine(out.get(k), v)
    return out
