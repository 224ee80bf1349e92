"""`notify outcomes tail` as an analyst's tool (issue 24, item 6): from the start, from
the end, from a time, and resumable under a group name; several members of a
group share its partitions. Against a real server, through the CLI."""

import asyncio
import json
import os
import time

from pipeline.reader import outcome_values
from tests.cli.test_cli import ROOT, notify
from tests.transport.helpers import produce_async

PARTITIONS = 4


def outcomes(tag: str, n: int) -> list:
    return [(f"u{i}".encode(), json.dumps({"tag": tag, "i": i}).encode()) for i in range(n)]


def tail(env, *args) -> list[dict]:
    return [json.loads(line) for line in notify(env, "outcomes", "tail", *args).stdout.splitlines()]


def test_tail_from_start_end_time_and_by_group(redis_url, tmp_path):
    env = dict(os.environ, NOTIFY_BROKER=redis_url, NOTIFY_PARTITIONS=str(PARTITIONS), PYTHONPATH=str(ROOT),
               NOTIFY_DATA_DIR=str(tmp_path / "data"))
    asyncio.run(produce_async(redis_url, "notify.outcomes", outcomes("a", 20), partitions=PARTITIONS))
    time.sleep(0.05)
    mark = time.time()
    time.sleep(0.05)
    asyncio.run(produce_async(redis_url, "notify.outcomes", outcomes("b", 12), partitions=PARTITIONS))

    assert len(tail(env)) == 32
    assert tail(env, "--from", "end") == []
    later = tail(env, "--from", str(mark))
    assert sorted(o["i"] for o in later) == list(range(12)) and {o["tag"] for o in later} == {"b"}
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(mark)) + f".{int(mark * 1e6) % 1_000_000:06d}"
    assert {o["tag"] for o in tail(env, "--from", iso)} == {"b"}

    # a group resumes where it stopped: nothing twice, nothing missed
    first = tail(env, "--group", "bi", "-n", "10")
    rest = tail(env, "--group", "bi")
    assert len(first) == 10 and len(rest) == 22
    key = lambda o: (o["tag"], o["i"])  # noqa: E731
    assert sorted(map(key, first + rest)) == sorted([("a", i) for i in range(20)] + [("b", i) for i in range(12)])
    assert tail(env, "--group", "bi") == []
    asyncio.run(produce_async(redis_url, "notify.outcomes", outcomes("c", 5), partitions=PARTITIONS))
    assert sorted(o["i"] for o in tail(env, "--group", "bi")) == list(range(5))

    # two members share the partitions: together they read everything once
    m0, m1 = tail(env, "--group", "share", "--member", "0/2"), tail(env, "--group", "share", "--member", "1/2")
    assert len(m0) + len(m1) == 37 and m0 and m1
    bad = notify(env, "outcomes", "tail", "--from", "yesterday", check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("notify: --from must be")


def test_an_entry_of_several_outcomes_is_a_line_each(redis_url, tmp_path):
    """With ``outcome_entries = "grouped"`` one step's outcomes of one user are one
    entry (a JSON array): the tail prints each on its line, and a group stopped by
    ``-n`` inside such an entry reads it again, never past what it did not print."""
    env = dict(os.environ, NOTIFY_BROKER=redis_url, NOTIFY_PARTITIONS="1", PYTHONPATH=str(ROOT),
               NOTIFY_DATA_DIR=str(tmp_path / "data"))
    group = json.dumps([{"tag": "g", "i": i} for i in range(3)]).encode()
    asyncio.run(produce_async(redis_url, "notify.outcomes", [(b"u1", group), (b"u1", b'{"tag": "s", "i": 3}')],
                              partitions=1))
    assert [o["i"] for o in tail(env)] == [0, 1, 2, 3]
    assert [o["i"] for o in tail(env, "--group", "bi", "-n", "2")] == [0, 1]
    assert [o["i"] for o in tail(env, "--group", "bi")] == [0, 1, 2, 3]  # the entry again, whole
    assert tail(env, "--group", "bi") == []
    # an array that is not of objects is one line, as it is
    asyncio.run(produce_async(redis_url, "notify.outcomes", [(b"u1", b"[1, 2]")], partitions=1))
    assert notify(env, "outcomes", "tail", "--from", "start").stdout.splitlines()[-1] == "[1, 2]"


def test_outcome_values():
    one = b'{"state": "PENDING"}'
    assert outcome_values(one) == [one]
    assert outcome_values(b'[{"a": 1}, {"b": [2]}]') == [b'{"a":1}', b'{"b":[2]}']
    for other in (None, b"", b"[", b"[]", b"[1, 2]", b'[{"a": 1}, 3]', b"\xff["):
        assert outcome_values(other) == [other]
