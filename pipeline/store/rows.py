"""A batch of rows to SQLite in a few statements of many rows each
(docs/adr/0007-record-writes-in-one-hop.md).

``executemany`` steps its statement once per row, and Python's sqlite3 lets the
GIL go around every step; the writer's thread then needs it back for the next
row from an event loop that is busy, a wait of up to the interpreter's switch
interval (5 ms) each time: a batch of 1,400 records took 38 ms beside an idle
loop and 0.1-16 s beside a busy one (the store alone, docs/adr/0007). Here a
batch is ``INSERT ... VALUES (...), (...), ...`` of up to :data:`MAX_ROWS` rows a
statement, the rest in powers of two (a few statement texts, prepared once each):
one GIL wait per statement. The parameters are flattened in the event loop's
thread before the transaction (:func:`bind`); the writer's thread binds them.

The same SQL as ``executemany``'s, row after row: a later row's conflict with an
earlier one of the same statement is resolved as it would be a statement later,
and every value is bound as ``executemany`` binds it. (Rows as one JSON
parameter read by ``json_each`` were tried: one step for the whole batch, but
reading the values back cost about twice the SQL's CPU, and SQLite's JSON cuts a
text at a NUL.) tests/store/test_rows.py holds the rows written to what
``executemany`` writes.
"""

from __future__ import annotations

import sqlite3
from typing import Any, NamedTuple, Sequence

__all__ = ["MAX_ROWS", "Rows", "bind", "insert_rows", "run"]

#: rows in one statement at most (a power of two): 256 rows of the records' 27
#: columns are 6,912 parameters, well under SQLite's 32,766; binding them holds the
#: GIL in the writer's thread for about a millisecond
MAX_ROWS = 256


class Rows(NamedTuple):
    """An ``INSERT`` of many rows: the text before the rows, one row's
    placeholders, and what follows them (an ``ON CONFLICT`` clause or nothing)."""

    head: str
    row: str
    tail: str

    def sql(self, n: int) -> str:
        """The statement for ``n`` rows (its text made once per ``n``)."""
        key = (self, n)
        text = _TEXTS.get(key)
        if text is None:
            text = _TEXTS[key] = f"{self.head}{', '.join([self.row] * n)}{self.tail}"
        return text


_TEXTS: dict[tuple[Rows, int], str] = {}


def insert_rows(into: str, columns: Sequence[str], tail: str = "") -> Rows:
    """``INSERT ...`` (``into``: "INSERT INTO t", "INSERT OR IGNORE INTO t") of
    ``columns``, each row a sequence in ``columns``' order; ``tail``: an ``ON
    CONFLICT`` clause."""
    return Rows(f"{into} ({', '.join(columns)}) VALUES ", f"({', '.join('?' * len(columns))})",
                f" {tail}" if tail else "")


def bind(statement: Rows, rows: Sequence[Sequence]) -> list[tuple[str, list]]:
    """``statement`` for ``rows``: (text, parameters) of each statement, made here, in
    the event loop's thread, before the transaction (store.py ``_transact``)."""
    out = []
    i, n = 0, len(rows)
    while i < n:
        left = n - i
        size = MAX_ROWS if left >= MAX_ROWS else 1 << (left.bit_length() - 1)
        out.append((statement.sql(size), [v for r in rows[i:i + size] for v in r]))
        i += size
    return out


def run(conn: sqlite3.Connection, bound: list[tuple[str, Any]]) -> int:
    """Run a :func:`bind` result on ``conn`` (the writer's connection, in its
    thread); the rows it changed."""
    changed = 0
    for sql, params in bound:
        changed += conn.execute(sql, params).rowcount
    return changed
