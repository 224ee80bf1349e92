"""Writing a batch of rows: multi-row statements, not ``executemany`` (ADR 0006).

The record store's writer runs in aiosqlite's thread. ``executemany`` steps once
per row, and the sqlite3 module lets go of the GIL around every step and takes
it back after: while the worker's loop thread is busy, each take waits up to the
interpreter's switch interval (5 ms). 2,000 rows took 1.3 to 2.6 s that way
beside a busy thread, against 26 ms alone. One ``INSERT ... VALUES (...),
(...), ...`` of up to :data:`MAX_ROWS` rows is one step: 2,000 rows in 128-row
statements took 0.14-0.19 s beside the same busy thread, and no longer alone.

A statement's text depends only on its row count, and the counts are powers of
two (300 rows are 256 + 32 + 8 + 4), so sqlite3's statement cache holds the
few shapes there are. A row conflicting with an earlier row of the same
statement is applied after it, as ``executemany`` would (tests/store/test_rows.py);
the record batches are folded to one row per key before anyway
(pipeline/store/merge.py).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

__all__ = ["MAX_ROWS", "Rows", "write_rows"]

#: rows per statement at most (512 × 26 columns of a record: 13,312 parameters,
#: under SQLite's 32,766)
MAX_ROWS = 512


@dataclass(frozen=True)
class Rows:
    """An insert of rows: ``head`` (``INSERT ... INTO t (columns)``), the number of
    columns, and what follows the values (``ON CONFLICT ...``)."""

    head: str
    width: int
    tail: str = ""

    def sql(self, n: int = 1) -> str:
        return _sql(self, n)


@lru_cache(maxsize=64)
def _sql(stmt: Rows, n: int) -> str:
    row = "(" + ", ".join("?" * stmt.width) + ")"
    return f"{stmt.head} VALUES {', '.join([row] * n)}{stmt.tail}"


def write_rows(conn: sqlite3.Connection, stmt: Rows, rows: Sequence[Sequence[Any]]) -> int:
    """Write ``rows`` with ``stmt`` on ``conn`` (in the caller's transaction, in the
    writer's thread: RecordStore._write_in_thread); the number of rows changed."""
    changed = i = 0
    while i < len(rows):
        n = MAX_ROWS
        while n > len(rows) - i:
            n //= 2
        changed += conn.execute(stmt.sql(n), [v for r in rows[i:i + n] for v in r]).rowcount
        i += n
    return changed
