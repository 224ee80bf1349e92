"""pipeline/store/rows.py: rows written as a few statements of many rows are the
rows ``executemany`` writes, value for value and type for type, into columns of
each affinity, plain inserts and upserts alike (conflicts inside one statement
included), with the same count of rows changed. Real SQLite files, no server."""

import sqlite3

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from pipeline.store import rows as rows_mod
from pipeline.store.rows import bind, insert_rows, run

COLUMNS = ("k", "t", "i", "r", "n", "b")
TABLE = "CREATE TABLE x (id INTEGER PRIMARY KEY, k TEXT UNIQUE, t TEXT, i INTEGER, r REAL, n NUMERIC, b)"
UPSERT = "ON CONFLICT (k) DO UPDATE SET t = excluded.t, i = coalesce(excluded.i, i), r = max(r, excluded.r)"

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 5.0, 1e300, 2.5e-300]),
    st.text(), st.sampled_from(["null", "1", "1.0", "a\x00b", "ü\u2028", ""]), st.binary(max_size=4),
)
ROWS = st.lists(st.tuples(st.text(max_size=2), VALUES, VALUES, VALUES, VALUES, VALUES), max_size=40)


def _written(path, write) -> tuple:
    db = sqlite3.connect(path)
    try:
        db.execute(TABLE)
        changed = write(db)
        return changed, db.execute(
            "SELECT id, " + ", ".join(f"typeof({c}), quote({c})" for c in COLUMNS) + " FROM x ORDER BY id").fetchall()
    finally:
        db.close()


def _same(tmp, rows, tail, into="INSERT INTO x"):
    values = f"{into} ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})" + (f" {tail}" if tail else "")
    ours = _written(tmp / "ours.db", lambda db: run(db, bind(insert_rows(into, COLUMNS, tail), rows)))
    theirs = _written(tmp / "theirs.db", lambda db: db.executemany(values, rows).rowcount)
    assert ours == theirs


@pytest.fixture
def small_statements(monkeypatch):
    monkeypatch.setattr(rows_mod, "MAX_ROWS", 8)  # several statements, and every power of two under it


@hsettings(max_examples=150, deadline=None)
@given(rows=ROWS)
def test_an_upsert_writes_what_executemany_writes(tmp_path_factory, rows):
    _same(tmp_path_factory.mktemp("rows"), rows, UPSERT)


@hsettings(max_examples=100, deadline=None)
@given(rows=ROWS)
def test_an_insert_or_ignore_writes_what_executemany_writes(tmp_path_factory, rows):
    _same(tmp_path_factory.mktemp("rows"), rows, "", into="INSERT OR IGNORE INTO x")


def test_a_batch_is_statements_of_the_largest_power_of_two_rows(tmp_path, small_statements):
    stmt = insert_rows("INSERT INTO x", COLUMNS)
    rows = [(str(n), "t", n, 0.5, None, True) for n in range(8 + 4 + 2 + 1)]
    bound = bind(stmt, rows)
    assert [len(params) // len(COLUMNS) for _sql, params in bound] == [8, 4, 2, 1]
    assert bound[0][0] == stmt.sql(8) and stmt.sql(8) is stmt.sql(8)
    _same(tmp_path, rows, UPSERT)
    assert bind(stmt, []) == []


def test_what_executemany_refuses_is_refused(tmp_path):
    big = [("d", "t", 2**64, 0.0, None, None)]
    db = sqlite3.connect(tmp_path / "a.db")
    db.execute(TABLE)
    with pytest.raises(OverflowError):
        db.executemany(f"INSERT INTO x ({', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?)", big)
    with pytest.raises(OverflowError):
        run(db, bind(insert_rows("INSERT INTO x", COLUMNS), big))
