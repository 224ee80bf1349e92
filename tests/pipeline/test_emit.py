"""agents/emit.py send: the entry Faust's Topic.send would have written (pure
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
