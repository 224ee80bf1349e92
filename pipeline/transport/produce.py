"""Calling the ``PRODUCE`` script (:mod:`.scripts`), written once for the Faust
producer (:mod:`.producer`) and the API, which writes to topics without a worker.

A batch to a single server is one ``EVALSHA PRODUCE_MANY`` for all its
topic-partitions (Redis's time per call, ~15-20 µs on this machine, was paid once
per partition: a flush wrote ~1.6 partitions); to a Redis Cluster, one
non-transactional pipeline of one ``EVALSHA PRODUCE`` per topic-partition (a
partition's keys share a slot, two partitions' do not). Not ``Script.__call__``: it awaits the queued command, and awaiting a
``ClusterPipeline`` re-initializes it (empties its queue), and on a plain
pipeline it makes every execute ask ``SCRIPT EXISTS`` first (one more round
trip); nor ``pipe.evalsha``, which ``ClusterPipeline`` blocks. On a cluster the
slot comes from the keys (all under one hash tag).

A call refused with NOSCRIPT (a restarted or failed-over node lost the script,
or nobody loaded it yet) did not run: the script is loaded (``SCRIPT LOAD``
reaches every primary of a cluster) and those calls are sent once more.
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional, Sequence

from redis.exceptions import NoScriptError

from redis.exceptions import ResponseError

from .client import is_cluster
from .keys import Keys
from .scripts import PRODUCE, PRODUCE_MANY
from .wire import Wire, run_commands

__all__ = ["PRODUCE_SHA", "PRODUCE_MANY_SHA", "Entry", "ProduceBatch", "load_produce", "produce_args",
           "script_missing"]

#: what EVALSHA names (redis-py's ``Script.sha`` of the same text)
PRODUCE_SHA = hashlib.sha1(PRODUCE.encode()).hexdigest()
PRODUCE_MANY_SHA = hashlib.sha1(PRODUCE_MANY.encode()).hexdigest()

#: one entry: (timestamp as sent, key or None, value or None, headers as (name, value) pairs)
Entry = tuple[Any, Optional[bytes], Optional[bytes], Sequence[tuple[str, bytes]]]


def produce_args(token: Any, entries: Sequence[Entry]) -> list[Any]:
    """``PRODUCE``'s ARGV: the fencing token (``''`` = unfenced), the count, then
    per entry its timestamp, flags (bit0 key present, bit1 value present), key,
    value, header count and headers."""
    args: list[Any] = [token, len(entries)]
    for ts, key, value, headers in entries:
        flags = (key is not None) | ((value is not None) << 1)
        args += [ts, flags, key or b"", value or b"", len(headers)]
        for name, hv in headers:
            args += [name, hv]
    return args


async def load_produce(client: Any) -> None:
    await client.script_load(PRODUCE)
    await client.script_load(PRODUCE_MANY)


def script_missing(result: Any) -> bool:
    """A call's result says the node did not hold the script (the call did not run)."""
    return isinstance(result, NoScriptError)


class ProduceBatch:
    """``PRODUCE`` calls sent together: :meth:`add` one per topic-partition, then
    :meth:`run` once. With a ``wire`` (:mod:`.wire`: a single server, plain TCP)
    they go on that connection instead of a redis-py pipeline; the results are
    the same."""

    def __init__(self, client: Any, keys: Keys, wire: Optional[Wire] = None) -> None:
        self.client = client
        self.keys = keys
        self.wire = wire
        #: one server: the partitions in one PRODUCE_MANY call
        self.together = not is_cluster(client)
        self._calls: list[tuple[Sequence[str], list[Any]]] = []

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, topic: str, partition: int, token: Any, entries: Sequence[Entry]) -> None:
        self._calls.append((self.keys.produce_keys(topic, partition), produce_args(token, entries)))

    async def run(self) -> list[Any]:
        """One result per :meth:`add`, in order: the first offset of its entries, or
        the error the call answered (FENCED, a lost connection on a cluster node;
        still NOSCRIPT if loading the script did not help). A connection lost to a
        single server raises; the pipeline may then have partly run."""
        results = await self._execute(range(len(self._calls)))
        missing = [i for i, res in enumerate(results) if script_missing(res)]
        if missing:
            await load_produce(self.client)
            for i, res in zip(missing, await self._execute(missing)):
                results[i] = res
        return results

    async def _execute(self, which: Any) -> list[Any]:
        calls = self._calls
        if self.together and len(which) > 1:
            keys: list[Any] = []
            argv: list[Any] = []
            for i in which:
                keys += calls[i][0]
                argv += calls[i][1]
            [reply] = await run_commands(self.client, self.wire, [
                ("EVALSHA", PRODUCE_MANY_SHA, len(keys), *keys, *argv)], raise_on_error=False)
            if isinstance(reply, BaseException):  # NOSCRIPT, or the call refused as a whole
                return [reply] * len(which)
            return [int(r) if isinstance(r, int) else ResponseError(r.decode() if isinstance(r, bytes) else str(r))
                     for r in reply]
        return await run_commands(self.client, self.wire, [
            ("EVALSHA", PRODUCE_SHA, len(calls[i][0]), *calls[i][0], *calls[i][1]) for i in which],
            raise_on_error=False)
