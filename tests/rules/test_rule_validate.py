"""pipeline.parsers.events: events and preferences in, InvalidEvent with a reason out."""

import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from config.settings import load_settings
from pipeline.models import SCHEMA_VERSION, Event, Preferences
from pipeline.parsers.events import InvalidEvent, params_depth, parse_event, parse_preferences
from pipeline.templates import Renderer

SETTINGS = load_settings(env={})
R = Renderer.from_settings(SETTINGS)
GOOD = {
    "biz_key": "order_shipped:A-1001",
    "category": "transaction",
    "template": "order_shipped",
    "recipients": ["u1"],
    "params": {"order_no": "A-1001"},
}


def ev(**changes):
    doc = {**GOOD, **changes}
    return orjson.dumps({k: v for k, v in doc.items() if v is not ...})


def parse(raw):
    return parse_event(raw, SETTINGS, R)


def reason_of(raw):
    with pytest.raises(InvalidEvent) as err:
        parse(raw)
    return err.value.reason, err.value.field


def test_good_event():
    e = parse(
        ev(
            recipients=["u1", 2, "u1", " 3 ", 2],
            channels=["sms", "push", "sms"],
            locale="zh-CN",
            priority="low",  # at most the category's cap (transaction: normal; pipeline/rules/priority.py)
            send_at=1_700_000_000,
            accepted_at=1_699_999_999.5,
            template_version=1,
            v=SCHEMA_VERSION,
            extra_metadata={"trace": "x"},
        )
    )
    assert isinstance(e, Event)
    assert e.recipients == ["u1", "2", "3"]
    assert e.channels == ["sms", "push"]
    assert (e.locale, e.priority, e.send_at, e.accepted_at) == ("zh-CN", "low", 1_700_000_000.0, 1_699_999_999.5)
    assert e.params == {"order_no": "A-1001"}


def test_defaults():
    e = parse(ev(params=...))
    assert (e.template_version, e.params, e.channels, e.locale, e.priority, e.send_at) == (1, {}, None, None, None, None)
    assert e.v == SCHEMA_VERSION and e.accepted_at == 0.0


def test_accepts_str_and_bytearray():
    assert parse(ev().decode()).biz_key == GOOD["biz_key"]
    assert parse(bytearray(ev())).biz_key == GOOD["biz_key"]
    assert parse(memoryview(ev())).biz_key == GOOD["biz_key"]


@pytest.mark.parametrize(
    "raw, reason, field",
    [
        (b"", "bad_json", None),
        (b"{nope", "bad_json", None),
        (b"\xff\xfe", "bad_json", None),
        (b"[1]", "not_an_object", None),
        (b'"s"', "not_an_object", None),
        (b"null", "not_an_object", None),
        (ev(v=SCHEMA_VERSION + 1), "unknown_version", "v"),
        (ev(v=0), "unknown_version", "v"),
        (ev(v="1"), "wrong_type", "v"),
        (ev(biz_key=...), "missing_field", "biz_key"),
        (ev(category=None), "missing_field", "category"),
        (ev(template=...), "missing_field", "template"),
        (ev(recipients=...), "missing_field", "recipients"),
        (ev(biz_key=5), "wrong_type", "biz_key"),
        (ev(biz_key=" "), "bad_value", "biz_key"),
        (ev(biz_key="k" * 65), "bad_value", "biz_key"),
        (ev(category=1), "wrong_type", "category"),
        (ev(category="gossip"), "unknown_category", "category"),
        (ev(template=["x"]), "wrong_type", "template"),
        (ev(template="nope"), "unknown_template", "template"),
        (ev(template="../otp"), "unknown_template", "template"),
        (ev(template_version=2), "unknown_template", "template"),
        (ev(template_version="1"), "wrong_type", "template_version"),
        (ev(template_version=True), "wrong_type", "template_version"),
        (ev(template_version=0), "bad_value", "template_version"),
        (ev(recipients="u1"), "wrong_type", "recipients"),
        (ev(recipients=[]), "no_recipients", "recipients"),
        (ev(recipients=[1.5]), "wrong_type", "recipients"),
        (ev(recipients=[True]), "wrong_type", "recipients"),
        (ev(recipients=[None]), "wrong_type", "recipients"),
        (ev(recipients=[""]), "bad_value", "recipients"),
        (ev(recipients=["x" * 129]), "bad_value", "recipients"),
        (ev(recipients=[str(i) for i in range(10001)]), "too_many_recipients", "recipients"),
        (ev(params=[1]), "wrong_type", "params"),
        (ev(params={"a": [[[[[[[[1]]]]]]]]}), "params_too_deep", "params"),
        (ev(channels="sms"), "wrong_type", "channels"),
        (ev(channels=[1]), "wrong_type", "channels"),
        (ev(channels=[]), "bad_value", "channels"),
        (ev(channels=["sms", "fax"]), "unknown_channel", "channels"),
        (ev(locale=5), "wrong_type", "locale"),
        (ev(locale="../../etc"), "bad_value", "locale"),
        (ev(priority="urgent"), "bad_priority", "priority"),
        (ev(priority=1), "wrong_type", "priority"),
        (ev(send_at="tomorrow"), "wrong_type", "send_at"),
        (ev(send_at=-1), "bad_value", "send_at"),
        (ev(send_at=True), "wrong_type", "send_at"),
        (ev(accepted_at="x"), "wrong_type", "accepted_at"),
        (b"{" + b" " * (256 * 1024) + b"}", "oversized", None),
    ],
)
def test_reasons(raw, reason, field):
    assert reason_of(raw) == (reason, field)


def test_duplicates_count_once_for_the_recipient_limit():
    assert len(parse(ev(recipients=["a"] * 20000)).recipients) == 1


def test_params_depth_limit_is_inclusive():
    deep7 = {"a": [[[[[[1]]]]]]}  # params itself = 1, then 1 dict level... 8 in all
    assert params_depth(deep7) == 7
    parse(ev(params={"a": [[[[[[[1]]]]]]]}))  # depth 8: allowed
    assert params_depth({}) == 1 and params_depth(1) == 0 and params_depth({"a": {"b": {}}}) == 3


def _walked_depth(obj, depth=1):
    """The nesting counted by plain recursion (what params_depth's flat-dict shortcut must agree with)."""
    if isinstance(obj, dict):
        return max([depth, *(_walked_depth(v, depth + 1) for v in obj.values())])
    if isinstance(obj, (list, tuple)):
        return max([depth, *(_walked_depth(v, depth + 1) for v in obj)])
    return depth - 1


_JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=3),
                        lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=2), kids, max_size=3),
                        max_leaves=12)


@hsettings(max_examples=300, deadline=None)
@given(_JSONISH)
def test_params_depth_is_the_nesting_flat_or_not(obj):
    assert params_depth(obj) == _walked_depth(obj)


def test_invalid_event_message():
    err = InvalidEvent("unknown_channel", "channels", "fax")
    assert str(err) == "unknown_channel: channels (fax)"
    assert isinstance(err, ValueError)


@hsettings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_only_invalid_event(raw):
    try:
        assert isinstance(parse(raw), Event)
    except InvalidEvent:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
FIELDS = ["biz_key", "category", "template", "recipients", "template_version", "params", "channels", "locale",
          "priority", "send_at", "accepted_at", "v"]
PLAUSIBLE = {
    "category": st.sampled_from(["otp", "marketing", "nope"]),
    "template": st.sampled_from(["otp", "promo", "nope"]),
    "recipients": st.lists(st.integers() | st.text(max_size=5), max_size=5),
    "channels": st.lists(st.sampled_from(["sms", "push", "fax"]), max_size=3),
    "priority": st.sampled_from(["high", "low", "meh"]),
}


@st.composite
def event_docs(draw):
    doc = {}
    for f in draw(st.lists(st.sampled_from(FIELDS), unique=True)):
        strat = PLAUSIBLE.get(f, json_values)
        doc[f] = draw(st.one_of(strat, json_values))
    return doc


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_docs())
def test_arbitrary_objects_only_invalid_event(doc):
    try:
        e = parse(json.dumps(doc).encode())  # json: big ints too
    except InvalidEvent as err:
        assert err.reason
        return
    assert e.recipients and len(e.recipients) == len(set(e.recipients))
    assert all(isinstance(r, str) for r in e.recipients)
    assert R.has_template(e.template, e.template_version)


# ------------------------------------------------------------------ preferences


def test_good_preferences():
    p = parse_preferences(
        {
            "user_id": 42,
            "version": 3,
            "switches": {"marketing.sms": False, "*.email": True, "otp.*": True, "*.*": True},
            "quiet_hours": "22:00 - 07:00",
            "tz": "Asia/Shanghai",
            "phone": "+1 (555) 000-1111",
            "email": "a@example.com",
            "webhook_url": "https://hooks.example/x",
            "locale": "zh-CN",
        },
        SETTINGS,
    )
    assert isinstance(p, Preferences)
    assert (p.user_id, p.version, p.quiet_hours, p.tz, p.phone) == ("42", 3, "22:00-07:00", "Asia/Shanghai", "+15550001111")
    assert p.switches["marketing.sms"] is False


def test_minimal_preferences():
    p = parse_preferences({"user_id": "u1", "phone": "", "quiet_hours": None})
    assert (p.tz, p.switches, p.quiet_hours, p.phone) == ("UTC", {}, None, None)


@pytest.mark.parametrize(
    "doc, reason, field",
    [
        ([], "not_an_object", None),
        ({}, "missing_field", "user_id"),
        ({"user_id": 1.5}, "wrong_type", "user_id"),
        ({"user_id": "u", "v": 99}, "unknown_version", "v"),
        ({"user_id": "u", "version": -1}, "bad_value", "version"),
        ({"user_id": "u", "version": "1"}, "wrong_type", "version"),
        ({"user_id": "u", "switches": []}, "wrong_type", "switches"),
        ({"user_id": "u", "switches": {"marketing": False}}, "bad_value", "switches.marketing"),
        ({"user_id": "u", "switches": {"a.b.c": False}}, "bad_value", "switches.a.b.c"),
        ({"user_id": "u", "switches": {"Mark.sms": False}}, "bad_value", "switches.Mark.sms"),
        ({"user_id": "u", "switches": {"gossip.sms": False}}, "unknown_category", "switches.gossip.sms"),
        ({"user_id": "u", "switches": {"marketing.fax": False}}, "unknown_channel", "switches.marketing.fax"),
        ({"user_id": "u", "switches": {"marketing.sms": "off"}}, "wrong_type", "switches.marketing.sms"),
        ({"user_id": "u", "quiet_hours": "late"}, "bad_quiet_hours", "quiet_hours"),
        ({"user_id": "u", "quiet_hours": "10:00-10:00"}, "bad_quiet_hours", "quiet_hours"),
        ({"user_id": "u", "quiet_hours": 5}, "wrong_type", "quiet_hours"),
        ({"user_id": "u", "tz": "Mars/Olympus"}, "bad_timezone", "tz"),
        ({"user_id": "u", "tz": "../../etc/passwd"}, "bad_timezone", "tz"),
        ({"user_id": "u", "tz": 8}, "wrong_type", "tz"),
        ({"user_id": "u", "phone": "call me"}, "bad_value", "phone"),
        ({"user_id": "u", "phone": 5550001111}, "wrong_type", "phone"),
        ({"user_id": "u", "email": "nope"}, "bad_value", "email"),
        ({"user_id": "u", "webhook_url": "ftp://x/y"}, "bad_value", "webhook_url"),
        ({"user_id": "u", "webhook_url": "https://"}, "bad_value", "webhook_url"),
        ({"user_id": "u", "webhook_url": "http://[::1"}, "bad_value", "webhook_url"),
        ({"user_id": "u", "locale": "x"}, "bad_value", "locale"),
    ],
)
def test_preference_reasons(doc, reason, field):
    with pytest.raises(InvalidEvent) as err:
        parse_preferences(doc, SETTINGS)
    assert (err.value.reason, err.value.field) == (reason, field)


def test_switch_categories_unchecked_without_settings():
    assert parse_preferences({"user_id": "u", "switches": {"gossip.sms": False}}).switches == {"gossip.sms": False}


PREF_FIELDS = ["user_id", "version", "switches", "quiet_hours", "tz", "phone", "email", "webhook_url", "locale", "v"]


@hsettings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(PREF_FIELDS) | st.text(max_size=5), json_values | st.text(max_size=30)))
def test_arbitrary_preferences_only_invalid_event(doc):
    try:
        assert isinstance(parse_preferences(doc, SETTINGS), Preferences)
    except InvalidEvent:
        pass
