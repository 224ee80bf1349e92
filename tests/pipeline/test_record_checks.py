"""pipeline/parsers/messages.py: a model's compiled field checks (``_fields``) read a
decoded object as checking each field with its annotation's checker in turn does
(the reading they replaced, written out below): the same keyword arguments, of the
same types, or the same refusal (reason, field, detail). Pure logic: no server."""

import math

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from pipeline import models as M
from pipeline.parsers import messages
from pipeline.parsers.events import InvalidEvent

MODELS = [M.Intent, M.Delivery, M.Outcome, M.Attempt, M.Timer, M.Receipt]
_MISSING = object()


def field_by_field(model, data, prefix):
    """The reference: every field through ``_checker`` of its annotation."""
    opts = model._options
    kwargs = {}
    for name, tp in opts.fields.items():
        default = opts.defaults.get(name, _MISSING)
        value = data.get(name, _MISSING)
        if value is _MISSING or (value is None and default is _MISSING):
            if default is _MISSING:
                raise InvalidEvent("missing_field", prefix + name)
            continue
        kwargs[name] = messages._checker(tp)(value, prefix + name)
    return kwargs


def _outcome(fn, *args):
    try:
        kw = fn(*args)
    except InvalidEvent as exc:
        return ("refused", exc.reason, exc.field, exc.detail)
    return ("read", [(k, type(v), v) for k, v in sorted(kw.items())])


VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 2**40), st.text(max_size=5),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1.5, math.inf, -math.inf]),
    st.lists(st.integers(0, 3), max_size=2), st.lists(st.text(max_size=2), max_size=2),
    st.dictionaries(st.text(max_size=3), st.one_of(st.integers(), st.text(max_size=3)), max_size=2),
)


@st.composite
def objects(draw, model):
    """Each field of ``model`` absent or with any kind of value (a nested attempt too)."""
    out = {}
    for name in model._options.fields:
        if draw(st.booleans()):
            continue
        if name == "attempt" and model is M.Outcome and draw(st.booleans()):
            out[name] = draw(objects(M.Attempt))
        else:
            out[name] = draw(VALUES)
    if draw(st.booleans()):
        out["unknown"] = 1
    return out


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@hsettings(max_examples=300, deadline=None)
@given(data=st.data())
def test_compiled_checks_read_as_field_by_field_does(model, data):
    obj = data.draw(objects(model))
    prefix = data.draw(st.sampled_from(["", "payload.delivery."]))
    assert _outcome(messages._fields(model), obj, prefix) == _outcome(field_by_field, model, obj, prefix)


def test_a_whole_record_is_read_and_refused_as_before():
    good = M.Delivery(delivery_id="d1", notification_id="n", biz_key="b", user_id="u", channel="sms",
                      category="otp", template="otp", priority="high", content={"body": "x"}, attempt=2,
                      due_at=3).asdict()
    d = messages.parse_delivery(good)
    assert d.due_at == 3.0 and type(d.due_at) is float and d.attempt == 2 and d.content == {"body": "x"}
    with pytest.raises(InvalidEvent) as e:
        messages.parse_delivery({**good, "attempt": True})
    assert (e.value.reason, e.value.field) == ("wrong_type", "attempt")
    with pytest.raises(InvalidEvent) as e:
        messages.parse_delivery({**good, "due_at": float("inf")})
    assert (e.value.reason, e.value.field, e.value.detail) == ("wrong_type", "due_at", "a finite number")
    with pytest.raises(InvalidEvent) as e:
        messages.parse_delivery({k: v for k, v in good.items() if k != "user_id"})
    assert (e.value.reason, e.value.field) == ("missing_field", "user_id")
