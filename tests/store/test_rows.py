"""pipeline/store/rows.py: rows written in one statement from a JSON parameter are
the rows ``executemany`` writes, value for value and type for type, into columns of
each affinity, plain inserts and upserts alike; and the batches it hands to
``executemany`` instead (a NUL in a text, an integer orjson cannot encode) are.
Real SQLite files, no server."""

import sqlite3

from hypothesis import given, settings as hsettings, strategies as st

from pipeline.store.rows import bind, insert_rows, run

COLUMNS = ("k", "t", "i", "r", "n", "b")
TABLE = "CREATE TABLE x (id INTEGER PRIMARY KEY, k TEXT UNIQUE, t TEXT, i INTEGER, r REAL, n NUMERIC, b)"
UPSERT = "ON CONFLICT (k) DO UPDATE SET t = excluded.t, i = coalesce(excluded.i, i), r = max(r, excluded.r)"

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0.0, -0.0, 5.0, 1e300, 2.5e-300]),
    st.text(), st.sampled_from(["null", "true", "1", "1.0", '"q"', "[1]", '{"a": 1}', "\\", "ü\u2028", ""]),
)
ROWS = st.lists(st.tuples(st.text(max_size=3), VALUES, VALUES, VALUES, VALUES, VALUES), max_size=25)


class _Db:
    """The writer's connection, counting the statements of each form it was given."""

    def __init__(self, db):
        self.db, self.json, self.many = db, 0, 0

    def execute(self, sql, params):
        self.json += 1
        return self.db.execute(sql, params)

    def executemany(self, sql, rows):
        self.many += 1
        return self.db.executemany(sql, rows)


def _written(tmp_path, name, write) -> list:
    tmp_path.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(tmp_path / f"{name}.db")
    try:
        db.execute(TABLE)
        write(db)
        return db.execute("SELECT id, " + ", ".join(f"typeof({c}), {c}" for c in COLUMNS) + " FROM x ORDER BY id")\
            .fetchall()
    finally:
        db.close()


def _same(tmp_path, rows, tail, into="INSERT INTO x") -> _Db:
    values = f"{into} ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})" + (f" {tail}" if tail else "")
    used = []

    def ours_write(db):
        shim = _Db(db)
        used.append(shim)
        run(shim, bind(insert_rows(into, COLUMNS, tail), rows))

    ours = _written(tmp_path, "ours", ours_write)
    theirs = _written(tmp_path, "theirs", lambda db: db.executemany(values, rows))
    assert ours == theirs
    return used[0]


@hsettings(max_examples=150, deadline=None)
@given(rows=ROWS)
def test_an_upsert_writes_what_executemany_writes(tmp_path_factory, rows):
    _same(tmp_path_factory.mktemp("rows"), rows, UPSERT)


@hsettings(max_examples=100, deadline=None)
@given(rows=ROWS)
def test_an_insert_or_ignore_writes_what_executemany_writes(tmp_path_factory, rows):
    _same(tmp_path_factory.mktemp("rows"), rows, "", into="INSERT OR IGNORE INTO x")


def test_a_batch_is_one_statement_unless_a_text_has_a_nul(tmp_path):
    rows = [("a", "t", 1, 0.5, None, True), ("b", "ü", 2, 1.0, "x", False)]
    assert (_same(tmp_path / "1", rows, UPSERT).json, _same(tmp_path / "2", rows, UPSERT).many) == (1, 0)
    nul = [*rows, ("c", "before\x00after", 3, 1.5, None, None)]
    shim = _same(tmp_path / "3", nul, UPSERT)
    assert (shim.json, shim.many) == (0, 1), "executemany keeps the text after the NUL"
    big = [("d", "t", 2**64, 0.0, None, None)]  # orjson refuses it; sqlite3 refuses it too
    for d in ("4", "5"):
        (tmp_path / d).mkdir()
    try:
        _same(tmp_path / "4", big, "")
    except OverflowError:
        pass
    else:
        raise AssertionError("sqlite3 takes no integer past 64 bits")


def test_no_rows_write_nothing(tmp_path):
    assert _same(tmp_path, [], UPSERT).json == 1
