"""pipeline/entries.py ``GuardedSchema.compile``: the decoder every checked topic runs
on each entry gives what Faust's compiled decoder gives (the event's key, value,
headers and message; or the same decode error, raised or handed to the topic's
callback), for any key, value and headers (pure logic: no server)."""

import asyncio

import faust
import orjson
from hypothesis import given, settings as hsettings, strategies as st

from config.settings import load_settings
from pipeline.app import create_app
from pipeline.models import Intent
from pipeline.transport.consumer import MALFORMED
from faust.types import Message

APP = create_app(load_settings(env={}))
TOPICS = APP.declared
INTENT = Intent(notification_id="n", biz_key="b", user_id="ü1", category="transaction", template="order_shipped",
                template_version=1, priority="normal", params={"order": "1"}).dumps()


def _topics():
    return [TOPICS.events[0], TOPICS.events[1], TOPICS.intents["normal"], TOPICS.preferences, TOPICS.receipts]


def _run(coro):
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the decoder waited")


def _decoders(topic):
    """Ours and Faust's, each with callbacks that record what they were handed."""
    out = []
    for compile_ in (type(topic.schema).compile, faust.Schema.compile):
        seen = []

        async def on_key(exc, message, seen=seen):
            seen.append(("key", type(exc), str(exc)))

        async def on_value(exc, message, seen=seen):
            seen.append(("value", type(exc), getattr(exc, "reason", None)))

        out.append((compile_(topic.schema, APP, on_key_decode_error=on_key, on_value_decode_error=on_value), seen))
    return out


def _outcome(decode, message, propagate):
    try:
        event = _run(decode(message, propagate=propagate))
    except (faust.exceptions.KeyDecodeError, faust.exceptions.ValueDecodeError) as exc:
        return ("raised", type(exc), getattr(exc, "reason", None))
    if event is None:
        return None
    return (type(event), event.key, event.value, event.headers, event.message is message, event.app is APP)


keys = st.one_of(st.none(), st.binary(max_size=8), st.just("ü1".encode()), st.just(b"\xff\xfe"))  # (the transport gives bytes)
values = st.one_of(st.none(), st.binary(max_size=16), st.just(INTENT), st.just(b"{}"), st.just(orjson.dumps([1])))
headers = st.one_of(st.just([]), st.just([("x", b"1")]), st.just([(MALFORMED, b"timestamp")]))


@hsettings(max_examples=300, deadline=None)
@given(topic=st.sampled_from(range(5)), key=keys, value=values, hdrs=headers, propagate=st.booleans())
def test_the_decoder_gives_what_faust_s_gives(topic, key, value, hdrs, propagate):
    t = _topics()[topic]
    message = Message(topic=t.get_topic_name(), partition=0, offset=7, timestamp=1.0, timestamp_type=0,
                      headers=hdrs, key=key, value=value, checksum=None)
    (ours, ours_seen), (faust_, faust_seen) = _decoders(t)
    assert _outcome(ours, message, propagate) == _outcome(faust_, message, propagate)
    assert ours_seen == faust_seen


def test_the_topics_decode_with_ours_and_their_callbacks_dead_letter():
    """The topics an agent reads run this decoder (Faust compiles it when the topic is
    made, with the topic's own callbacks)."""
    for t in _topics():
        assert t.decode.__qualname__.startswith("GuardedSchema.compile")
    message = Message(topic=TOPICS.intents["normal"].get_topic_name(), partition=0, offset=7, timestamp=1.0,
                      timestamp_type=0, headers=[], key=b"other", value=INTENT, checksum=None)
    letters = []

    async def record(dlq, source, reason, payload, **kw):
        letters.append((source, reason))

    import pipeline.entries as entries

    real, entries.send_dead_letter = entries.send_dead_letter, record
    try:
        assert asyncio.run(TOPICS.intents["normal"].decode(message)) is None
    finally:
        entries.send_dead_letter = real
    assert letters == [(message.topic, "wrong_key")]
