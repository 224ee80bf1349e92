"""pipeline/store/rows.py: a batch written as multi-row statements gives the rows
executemany gives (a real SQLite file)."""

import sqlite3

import pytest

from pipeline.store.rows import MAX_ROWS, Rows, write_rows

UPSERT = Rows("INSERT INTO t (k, n, s)", 3, " ON CONFLICT (k) DO UPDATE SET n = max(n, excluded.n), s = excluded.s")
SCHEMA = "CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT UNIQUE NOT NULL, n INTEGER, s TEXT)"


def test_statements_come_in_powers_of_two_up_to_the_max():
    assert UPSERT.sql(1) == ("INSERT INTO t (k, n, s) VALUES (?, ?, ?)"
                             " ON CONFLICT (k) DO UPDATE SET n = max(n, excluded.n), s = excluded.s")
    assert UPSERT.sql(2).count("(?, ?, ?)") == 2
    assert UPSERT.sql(MAX_ROWS).count("?") == 3 * MAX_ROWS < 32766


@pytest.mark.parametrize("n", [0, 1, 7, 300, MAX_ROWS, 2 * MAX_ROWS + 77])
def test_the_same_rows_as_executemany(tmp_path, n):
    # keys repeat (a row updating one of the same statement), None and floats pass as they are
    rows = [(f"k{i % 97}", i, None if i % 5 == 0 else f"s{i}") for i in range(n)]
    plain = sqlite3.connect(tmp_path / "plain.db")
    plain.execute(SCHEMA)
    plain.executemany(UPSERT.sql(1), rows)
    plain.commit()
    conn = sqlite3.connect(tmp_path / "rows.db", isolation_level=None)
    conn.execute(SCHEMA)
    conn.execute("BEGIN")
    changed = write_rows(conn, UPSERT, rows)
    conn.execute("COMMIT")
    got = conn.execute("SELECT id, k, n, s FROM t ORDER BY id").fetchall()
    assert changed == n
    assert got == plain.execute("SELECT id, k, n, s FROM t ORDER BY id").fetchall()
