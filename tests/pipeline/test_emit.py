"""agents/emit.py: ``send`` writes the entry Faust's Topic.send would have written,
``outcomes`` groups one step's outcomes of a user into one entry (pure logic and
serialization: no server)."""

from agents.emit import Emit
from config.settings import load_settings
from pipeline.app import create_app
from pipeline.models import Delivery, Intent, Outcome, Timer


def _faust_bytes(topic, key, value):
    k = topic.prepare_key(key, None, None)
    v = topic.prepare_value(value, None, None)
    k = k[0] if isinstance(k, tuple) else k
    v = v[0] if isinstance(v, tuple) else v
    return k, v


def test_send_writes_the_bytes_topic_send_would():
    o = Outcome(delivery_id="d", notification_id="n", biz_key="b", user_id="ü1", channel="sms", category="otp",
                template="otp", priority="high", state="ACCEPTED", at=1.5)
    d = Delivery(delivery_id="d", notification_id="n", biz_key="b", user_id="ü1", channel="sms", category="otp",
                 template="otp", priority="high", content={"body": "é"})
    i = Intent(notification_id="n", biz_key="b", user_id="ü1", category="otp", template="otp", template_version=1,
               priority="high", params={"code": "1"})
    t = Timer(timer_id="t", due_at=1.0, kind="delivery", payload=d.asdict())
    topics = create_app(load_settings(env={})).declared
    for topic, value in ((topics.outcomes, o), (topics.lanes[("sms", "high")], d), (topics.intents["high"], i),
                         (topics.timers, t)):
        assert _faust_bytes(topic, "ü1", value) == ("ü1".encode(), value.dumps())
    assert callable(Emit.send)


class _Producer:
    def __init__(self):
        self.sent = []

    async def send_record(self, topic, key, value):
        self.sent.append((topic, key, value))


class _Records:
    def __init__(self):
        self.added = []

    async def add(self, items):
        self.added += items


def _emit(tmp_path, entries):
    (tmp_path / "n.toml").write_text(f'outcome_entries = "{entries}"\n')
    app = create_app(load_settings(tmp_path / "n.toml", env={}))
    app.producer = _Producer()  # pure logic: what goes to which topic, no server
    return Emit(app, _Records()), app.producer.sent


def test_one_steps_outcomes_of_a_user_are_one_entry(tmp_path):
    import asyncio

    def o(user, channel, state, callback=False):
        return Outcome(delivery_id=f"{user}.{channel}", notification_id="n", biz_key="b", user_id=user,
                       channel=channel, category="otp", template="otp", priority="high", state=state, at=1.0,
                       callback=callback)

    items = [o("u1", "sms", "PENDING", callback=True), o("u2", "sms", "PENDING"), o("u1", "push", "FILTERED")]
    emit, sent = _emit(tmp_path, "grouped")
    asyncio.run(emit.outcomes(items))
    outcomes = [(k, v) for t, k, v in sent if t == "notify.outcomes"]
    assert outcomes == [(b"u1", b"[" + items[0].dumps() + b"," + items[2].dumps() + b"]"), (b"u2", items[1].dumps())]
    assert [(t, k, v) for t, k, v in sent if t == "notify.callbacks"] == [("notify.callbacks", b"u1", items[0].dumps())]
    assert emit.records.added == items

    emit, sent = _emit(tmp_path, "single")
    asyncio.run(emit.outcomes(items))
    assert [(k, v) for t, k, v in sent if t == "notify.outcomes"] == [(i.user_id.encode(), i.dumps()) for i in items]
