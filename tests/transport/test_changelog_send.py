"""A CachedTable's changelog writes go straight to our producer
(pipeline/transport/cache.py ``CachedTable._send``): the same entry Faust's
``send_changelog`` hands a producer, and the store learns its offset once written."""

import asyncio

import faust
import pytest
from faust.types import TP
from faust.types.tuples import RecordMetadata

from pipeline.models import Timer
from pipeline.transport.cache import CachedTable
from pipeline.transport.groups import DELETED


class Producer:
    """What CachedTable needs of pipeline/transport/producer.py, recording the entries."""

    def __init__(self, direct: bool) -> None:
        self.direct = direct
        self.entries: list[tuple] = []  # (topic, partition, key, value, headers)
        self.soon: list = []  # Faust's FutureMessages

    def writes_directly(self) -> bool:
        return self.direct

    def enqueue_entry(self, topic, partition, key, value, headers=None):
        self.entries.append((topic, partition, key, value, list((headers or {}).items())))
        return asyncio.get_running_loop().create_future()

    def send_soon(self, fut) -> None:
        m = fut.message
        self.soon.append(fut)
        self.entries.append((m.channel.get_topic_name(), m.partition, m.key, m.value, list((m.headers or {}).items())))


def _tables(direct: bool):
    app = faust.App(f"changelog-send-{direct}", broker="memory://", store="memory://", Table=CachedTable)
    app._producer = Producer(direct)
    plain = app.Table("marks", default=None, partitions=4)
    typed = app.Table("timers", default=None, value_type=Timer, partitions=4)
    return app, plain, typed


def _write(plain, typed) -> list:
    futs = [plain.send_changelog(1, "d1", {"a": 1, "s": "calling", "r": 0}),
            plain.send_changelog(2, ("daily", "u|otp|2026-12-07"), 3),
            plain.send_changelog(3, "gone", None, value_serializer="raw"),
            plain.send_group(0, [("x", {"s": "ACCEPTED"}), ("y", DELETED)]),
            typed.send_changelog(2, "t1", Timer(timer_id="t1", due_at=5.0, kind="intent", payload={"a": 1}))]
    return futs


async def test_the_same_entries_as_faust_s_path():
    _app, plain, typed = _tables(direct=False)
    _write(plain, typed)
    faust_entries = _app.producer.entries
    app, plain, typed = _tables(direct=True)
    _write(plain, typed)
    ours = app.producer.entries
    # (a memory store does not take group entries: the group's two keys are two entries)
    assert len(ours) == 6 and not app.producer.soon
    assert [e[1:] for e in ours] == [e[1:] for e in faust_entries]
    assert [e[0].rsplit("-", 2)[1:] for e in ours] == [e[0].rsplit("-", 2)[1:] for e in faust_entries]


async def test_the_store_learns_the_offset_once_written_and_not_on_failure():
    app, plain, _typed = _tables(direct=True)
    seen = []
    plain.data.set_persisted_offset = lambda tp, offset: seen.append((tp, offset))
    ok = plain.send_changelog(1, "d1", {"s": "calling"})
    bad = plain.send_changelog(1, "d2", {"s": "calling"})
    tp = TP(plain.changelog_topic.get_topic_name(), 1)
    ok.set_result(RecordMetadata(tp.topic, 1, tp, 41, 0.0, 0))
    bad.set_exception(RuntimeError("fenced"))
    await asyncio.sleep(0)
    assert seen == [(tp, 41)]
    with pytest.raises(RuntimeError):
        bad.result()
