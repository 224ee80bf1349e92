"""Where a worker's CPU goes, by part of the pipeline, from py-spy's raw stacks.

Each sample is given to one part: the frames are read from the innermost out,
and the first frame that belongs to a part names it (so ``orjson.dumps`` called
by ``Emit.outcomes`` is an outcome's cost, and a ``Event.set`` called by the
hand-off is the event loop's). The parts are set beside what the hand-written
ceiling (bench/ceiling.py) does for the same hops: docs/adr/0002, "Where the
CPU goes, by part".

py-spy samples by wall clock the threads that are not idle, so a thread that was
runnable but waited for a core (a socket write that wakes the other end, on two
busy cores) counts where it waited: a part's share is its CPU plus such waits.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Iterable, Iterator, Sequence

__all__ = ["PARTS", "samples", "part_of", "by_part", "part_lines"]

#: (part, substrings of a py-spy frame "function (path:line)"), tried in order on
#: each frame from the innermost out
PARTS: Sequence[tuple[str, Sequence[str]]] = (
    ("event loop (uvloop, asyncio's tasks, events, waits)",
     ("execute_from_commandline", "asyncio/", "uvloop", "selectors", "threading.py")),
    ("metrics", ("pipeline/tally.py", "prometheus_client", "pipeline/metrics.py")),
    ("render (Jinja2)", ("jinja2/", "markupsafe", "pipeline/templates.py", "config/templates")),
    ("links (tracking, unsubscribe)", ("pipeline/rules/tracking.py", "_unsubscribe_url")),
    ("parse events", ("pipeline/parsers/",)),
    ("rules and plan", ("pipeline/rules/", "pipeline/ids.py", "config/settings.py")),
    ("record store (SQLite, writer thread)", ("pipeline/store/", "aiosqlite", "sqlite3")),
    ("sink (record and outcome batches)", ("agents/sink.py",)),
    ("producer (entries written, the write to Redis)",
     ("pipeline/transport/producer.py", "pipeline/transport/produce.py", "pipeline/transport/wire.py", "hiredis")),
    ("tables and changelog", ("faust/tables/", "tables/", "pipeline/transport/cache.py",
                              "pipeline/transport/groups.py")),
    ("outcomes and entries encoded", ("agents/emit.py", "pipeline/lean.py", "pipeline/codecs.py",
                                      "pipeline/entries.py", "orjson", "pipeline/models.py", "faust/models/",
                                      "<direct_")),
    ("resilience (breakers, buckets, retries)", ("adapters/resilience", "pipeline/breakers.py",
                                                 "pipeline/providers.py")),
    ("adapters (the fakes' calls)", ("adapters/",)),
    ("lanes (windows, fair turns, hand-off)", ("agents/lanes.py", "agents/handoff.py", "pipeline/fair.py",
                                               "agents/pressure.py")),
    ("consume (fetch, Faust's streams, acks, commits, leases)",
     ("pipeline/transport/", "faust/transport/", "faust/streams.py", "faust/channels.py", "faust/events.py",
      "pipeline/take.py", "redis/")),
    ("agents' own code", ("agents/",)),
    ("Faust and mode runtime", ("faust/", "mode/")),
)


def part_of(frames: Sequence[str]) -> str:
    for frame in reversed(frames):
        for part, marks in PARTS:
            if any(m in frame for m in marks):
                return part
    return "other"


def samples(raws: Iterable[Path]) -> Iterator[tuple[list[str], int]]:
    """(frames, outermost first, and count) of each stack in py-spy's raw files
    (``frame;frame;... count`` lines)."""
    for raw in raws:
        for line in raw.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if stack:
                yield stack.split(";"), int(n)


def by_part(raws: Iterable[Path]) -> tuple[collections.Counter, int]:
    """Samples per part over py-spy raw files, and the total."""
    parts: collections.Counter = collections.Counter()
    total = 0
    for frames, n in samples(raws):
        total += n
        parts[part_of(frames)] += n
    return parts, total


def part_lines(raws: Iterable[Path], worker_us: float) -> list[str]:
    """A markdown table: each part's share of the samples and, at ``worker_us`` µs
    of worker CPU per notification, its µs per notification."""
    parts, total = by_part(raws)
    if not total:
        return []
    lines = [f"Where the workers' CPU goes, by part ({total:,} py-spy samples of every worker, idle excluded;"
             f" µs at {worker_us:,.0f} µs of worker CPU per notification):", "",
             "| part | share | µs per notification |", "|---|---:|---:|"]
    for part, n in parts.most_common():
        lines.append(f"| {part} | {100 * n / total:.1f}% | {worker_us * n / total:,.0f} |")
    return lines
