"""Records built by pipeline/lean.py direct_init equal those Faust's own __init__
builds (pure logic: no server)."""

import pytest

from pipeline import models as M
from pipeline.lean import direct_init

SAMPLES = {
    M.Event: dict(biz_key="b1", category="otp", template="otp", recipients=["u1"], params={"code": "1"}),
    M.Intent: dict(notification_id="n", biz_key="b", user_id="u", category="otp", template="otp",
                   template_version=1, priority="high", channels=["sms"], send_at=None, accepted_at=2.5),
    M.Delivery: dict(delivery_id="d", notification_id="n", biz_key="b", user_id="u", channel="sms",
                     category="otp", template="otp", priority="high", content={"body": "x"}, attempt=2),
    M.Attempt: dict(delivery_id="d", seq=1, channel="sms", provider="sms_a", started_at=1.0, result="ACCEPTED"),
    M.Outcome: dict(delivery_id="d", notification_id="n", biz_key="b", user_id="u", channel="sms",
                    category="otp", template="otp", priority="high", state="ACCEPTED", at=3.0, reason=None,
                    attempt=M.Attempt(delivery_id="d", seq=1, channel="sms", provider="p", started_at=1.0,
                                      result="ACCEPTED")),
    M.Preferences: dict(user_id="u", switches={"marketing.sms": False}, tz="Asia/Shanghai"),
    M.DeviceUpdate: dict(user_id="u", token="t"),
    M.Timer: dict(timer_id="t", due_at=1.0, kind="delivery", payload={"a": 1}),
    M.DeadLetter: dict(source="s", reason="r", at=1.0, payload="p"),
    M.Receipt: dict(provider="p", provider_msg_id="m", status="DELIVERED", at=1.0),
}


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_direct_init_builds_what_faust_builds(cls):
    assert hasattr(cls, "_faust_init"), "every record of the pipeline takes the direct __init__"
    kw = SAMPLES[cls]
    fast = cls(**kw)
    slow = cls.__new__(cls)
    cls._faust_init(slow, **kw)
    assert fast.__dict__ == slow.__dict__
    assert fast.dumps() == slow.dumps()
    assert fast == slow and fast.asdict() == slow.asdict()
    # defaults are Faust's (the same objects), missing ones filled in
    assert set(fast.__dict__) >= set(cls._options.fields)
    assert type(fast).loads(fast.dumps()).dumps() == fast.dumps()


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_direct_asdict_and_dumps_give_what_faust_s_give(cls):
    from faust.serializers import codecs

    x = cls(**SAMPLES[cls])
    assert x.asdict() == cls._faust_asdict(x)
    assert list(x.asdict()) == list(cls._faust_asdict(x))  # the same key order: the same bytes
    assert x.dumps() == codecs.dumps("orjson", cls._faust_asdict(x))
    assert x.dumps(serializer="json") == codecs.dumps("json", x.asdict())  # another codec: Faust's path
    decoded = cls.loads(x.dumps())  # nested records and containers read back through their descriptors
    assert decoded.dumps() == x.dumps()


def test_positional_arguments_and_errors_are_faust_s():
    # required fields first, then the optional ones, as in Faust's signature
    t = M.Timer("t1", 2.0, "poll", {"x": 1})
    assert (t.timer_id, t.due_at, t.kind, t.payload, t.v) == ("t1", 2.0, "poll", {"x": 1}, M.SCHEMA_VERSION)
    with pytest.raises(TypeError, match="unexpected argument"):
        M.Timer(timer_id="t", due_at=1.0, kind="k", payload={}, bogus=1)
    with pytest.raises(TypeError):
        M.Timer(timer_id="t")


def test_a_record_whose_fields_coerce_keeps_faust_s_init():
    import faust

    class Coerced(faust.Record, coerce=True):
        n: int

    init = Coerced.__init__
    assert direct_init(Coerced) is Coerced and Coerced.__init__ is init
    assert Coerced(n="3").n == 3
