"""Poison entries: one entry that the transport itself cannot decode (its fields
written by hand, not by the transport's producer) in any partition of any stream
the workers read, and a changelog entry that does not decode, never stop the
pipeline. Each is dead-lettered with its topic, partition, offset and reason, its
offset is committed, and the good events after it on every partition reach their
records (issue 26, item 1). Against a real worker process on the test's server.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from pipeline.entries import contained
from pipeline.topics import ALL, UNREAD
from pipeline.transport.committed import read_sync
from pipeline.transport.keys import Keys
from tests.pipeline.harness import PARTITIONS, Pipeline
from tests.security.test_stream_fuzz import dead_letters
from tests.transport.helpers import wait_until

#: every topic an agent reads
READ = [t for t in ALL if t not in UNREAD]
CHANGELOG = "notify-preferences-changelog"
#: transport fields no producer of ours writes: a timestamp that is not a number,
#: a header name that is not UTF-8
MALFORMED = [
    [b"t", b"soon", b"k", b"fz-x", b"v", b"{}"],
    [b"t", b"1.5", b"h:\xff\xfe", b"x", b"k", b"fz-x", b"v", b"{}"],
]
USERS = [f"pz-{i}" for i in range(12)]  # spread over every partition


#: the partition's next offset and the entry at it in one step, as the producer's
#: script does: apart, a worker's write between the two made the XADD fail
_XADD_NEXT = """
local offset = redis.call('INCR', KEYS[1]) - 1
redis.call('XADD', KEYS[2], offset .. '-1', unpack(ARGV))
return offset
"""


def xadd_raw(r, topic: str, partition: int, fields: list) -> int:
    """Write one entry with the given fields at the partition's next offset."""
    keys = Keys()
    return int(r.eval(_XADD_NEXT, 2, keys.counter(topic, partition), keys.stream(topic, partition), *fields))


@pytest.fixture
def pipe(redis_url, tmp_path):
    p = Pipeline(redis_url, tmp_path)
    yield p
    p.stop()


def good_events(tag: str) -> list[dict]:
    evs = [{"biz_key": f"pz:{tag}:{u}", "category": "transaction", "template": "order_shipped", "recipients": [u],
            "channels": ["inbox"], "params": {"order_no": "1", "carrier": "UPS", "tracking_no": "1Z",
                                              "tracking_url": "https://t.example/x"}} for u in USERS]
    evs += [{"biz_key": f"pz:{tag}:otp:{u}", "category": "otp", "template": "otp", "recipients": [u],
             "channels": ["inbox"], "params": {"code": "123456"}} for u in USERS[:4]]
    return evs


def test_malformed_entries_in_every_partition_are_dead_lettered_and_the_partitions_go_on(pipe, redis_sync):
    r = redis_sync
    # a changelog entry that does not decode, before the worker recovers its tables
    bad_changelog = xadd_raw(r, CHANGELOG, 1, [b"t", b"1", b"k", b'"pz-0"', b"v", b"{not json"])
    proc = pipe.start()
    wait_until(lambda: "Worker ready" in pipe.log() or proc.poll() is not None, 60, 0.1, "the worker ready")
    assert proc.poll() is None, pipe.log()[-3000:]

    pipe.events(good_events("before"))
    expected = Counter()
    where = set()
    for topic in READ:
        for p in range(PARTITIONS):
            for fields in MALFORMED:
                where.add((topic, p, xadd_raw(r, topic, p, fields)))
                expected[(topic, "malformed_entry")] += 1
    pipe.events(good_events("after"))

    want = {(e["biz_key"], e["recipients"][0], "inbox") for tag in ("before", "after") for e in good_events(tag)}

    state = {}

    def settled():
        assert proc.poll() is None, pipe.log()[-3000:]
        rows = pipe.rows()
        state["missing"] = sorted(k for k in want if rows.get(k, {}).get("status") != "DELIVERED")
        state["letters"] = Counter((d["source"], d["reason"]) for d in dead_letters(r))
        return not state["missing"] and len(dead_letters(r)) >= sum(expected.values()) + 1

    try:
        wait_until(settled, 90, 0.3, "good events delivered and every malformed entry dead-lettered")
    except AssertionError:
        raise AssertionError(f"not delivered: {state.get('missing')}; dead letters short: "
                             f"{expected - state.get('letters', Counter())}\n{pipe.log()[-3000:]}") from None
    got = dead_letters(r)
    mal = [d for d in got if d["reason"] == "malformed_entry"]
    assert Counter((d["source"], d["reason"]) for d in mal) == expected
    assert {(d["source"], d["partition"], d["offset"]) for d in mal} == where
    assert all("malformed entry" in d["detail"] for d in mal)
    chl = [d for d in got if d["reason"] == "bad_changelog_entry"]
    assert [(d["source"], d["partition"], d["offset"]) for d in chl] == [(CHANGELOG, 1, bad_changelog)]

    # each malformed entry's offset is committed: every read partition is past it
    def committed_past() -> bool:
        got = read_sync(r, Keys(), "notify", [(t, p) for t, p, _off in where])
        return all((c or 0) > off for c, (_t, _p, off) in zip(got, where))

    wait_until(committed_past, 30, 0.2, "offsets committed past every malformed entry")
    log = pipe.log()
    for marker in ("Crashed", "Restarting dead", "Traceback"):
        assert marker not in log, log[log.index(marker) - 2000: log.index(marker) + 2000]


class _DLQ:
    def __init__(self) -> None:
        self.sent: list = []

    async def send(self, key, value) -> None:
        self.sent.append((key, value))


def _event(value=b"{}"):
    return SimpleNamespace(message=SimpleNamespace(topic="notify.timers", partition=3, offset=41, key=b"u1",
                                                   value=value))


async def test_contained_dead_letters_an_agent_error_and_swallows_it():
    dlq = _DLQ()
    async with contained(dlq, _event(), "scheduler"):
        raise KeyError("payload")
    (key, letter), = dlq.sent
    assert key == "u1"
    assert (letter.source, letter.reason, letter.partition, letter.offset) == ("notify.timers", "agent_error", 3, 41)
    assert "scheduler: KeyError" in letter.detail


async def test_contained_lets_transient_errors_through():
    dlq = _DLQ()
    with pytest.raises(ConnectionError):
        async with contained(dlq, _event(), "guard"):
            raise ConnectionError("broker gone")
    assert dlq.sent == []
    async with contained(dlq, _event(), "guard"):
        pass
    assert dlq.sent == []

