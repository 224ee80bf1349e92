"""Property tests (hypothesis) of every parser and rule hostile input reaches, in
the invariant style: any input either parses into a valid record or raises the
module's own validation error (never another exception type), and what parses
round-trips. What tests/rules already covers (arbitrary bytes and objects into
parse_event/parse_preferences, the renderer raising only TemplateError) is not
repeated; this adds the round trips, the stream-entry decoders, receipts,
signatures, template params as data, the sandbox, addresses and log masking."""

from __future__ import annotations

import asyncio
import json
import math
import string

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings as hsettings, strategies as st

from adapters.receipts import (
    MemoryReplayGuard,
    ReceiptRejected,
    ReceiptVerifier,
    parse_twilio_callback,
    parse_vendor_callback,
    twilio_signature,
    vendor_signature_header,
    verify_twilio_signature,
    verify_vendor_signature,
)
from config.settings import CHANNELS, PRIORITIES, load_settings
from pipeline import entries, redact
from pipeline.models import Attempt, Delivery, DeviceUpdate, Intent, Outcome, Preferences, Receipt, State, Timer
from pipeline.parsers.messages import parse_delivery, parse_intent, parse_outcome, parse_timer
from pipeline.parsers.events import (
    InvalidEvent,
    address_ok,
    parse_device_update,
    parse_event,
    parse_preferences,
    parse_receipt,
)
from pipeline.templates import Renderer, TemplateError, truncate

SETTINGS = load_settings(env={})
R = Renderer.from_settings(SETTINGS)
FAST = hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=15,
)
ids = st.text(string.ascii_letters + string.digits + "-_:@.", min_size=1, max_size=40)


def only_invalid_event(fn, *args):
    """``fn(*args)``, or None when it raised InvalidEvent (anything else fails)."""
    try:
        return fn(*args)
    except InvalidEvent as err:
        assert err.reason and isinstance(err.reason, str)
        return None


# ------------------------------------------------------------------ events: round trip, params size


@st.composite
def valid_events(draw):
    code = draw(st.sampled_from(["otp", "promo", "order_shipped", "welcome", "security_alert"]))
    doc = {
        # no control, format or separator characters in an id (tests/security/test_door.py)
        "biz_key": draw(st.text(st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Zl", "Zp")),
                                min_size=1, max_size=64).filter(str.strip)),
        "category": draw(st.sampled_from(sorted(SETTINGS.categories))),
        "template": code,
        "recipients": draw(st.lists(ids | st.integers(0, 10**12), min_size=1, max_size=6)),
        "params": draw(st.dictionaries(st.text(max_size=10), json_values, max_size=6)),
    }
    for field, strat in {
        "channels": st.lists(st.sampled_from(CHANNELS), min_size=1, max_size=5),
        "locale": st.sampled_from(["en", "zh-CN", "pt_BR"]),
        "priority": st.sampled_from(PRIORITIES),
        "send_at": st.floats(0, 1.7e9),  # at most max_send_ahead_s (30 days) from now
        "template_version": st.just(1),
    }.items():
        if draw(st.booleans()):
            doc[field] = draw(strat)
    return doc


@FAST
@given(valid_events())
def test_valid_events_parse_and_round_trip(doc):
    ev = parse_event(orjson.dumps(doc), SETTINGS, R)
    again = parse_event(ev.dumps(), SETTINGS, R)
    assert again.asdict() == ev.asdict()
    assert ev.recipients == list(dict.fromkeys(str(r).strip() for r in doc["recipients"]))
    assert ev.params == doc["params"]


@hsettings(max_examples=60, deadline=None)
@given(st.integers(0, 2 * SETTINGS.max_params_bytes), st.text(max_size=5))
def test_params_size_limit(n, key):
    params = {key: "x" * n}
    doc = {"biz_key": "k", "category": "otp", "template": "otp", "recipients": ["u"], "params": params}
    size = len(orjson.dumps(params))
    try:
        ev = parse_event(orjson.dumps(doc), SETTINGS, R)
    except InvalidEvent as err:
        expected = "oversized" if len(orjson.dumps(doc)) > SETTINGS.max_event_bytes else "params_too_large"
        assert err.reason == expected and size > SETTINGS.max_params_bytes
        return
    assert size <= SETTINGS.max_params_bytes and ev.params == params


# ------------------------------------------------------------------ preferences: round trip


@st.composite
def valid_preferences(draw):
    cats = sorted(SETTINGS.categories) + ["*"]
    keys = st.builds(lambda c, ch: f"{c}.{ch}", st.sampled_from(cats), st.sampled_from(list(CHANNELS) + ["*"]))
    start, end = draw(st.integers(0, 1439)), draw(st.integers(0, 1439))
    doc = {
        "user_id": draw(ids | st.integers(0, 10**9)),
        "version": draw(st.integers(0, 2**62)),
        "switches": draw(st.dictionaries(keys, st.booleans(), max_size=5)),
        "tz": draw(st.sampled_from(["UTC", "Europe/Paris", "Asia/Shanghai", "America/New_York"])),
        "phone": draw(st.from_regex(r"\+?[0-9]{6,15}", fullmatch=True)),
        "email": draw(st.from_regex(r"[a-z0-9._+]{1,20}@[a-z0-9]{1,10}\.[a-z]{2,5}", fullmatch=True)),
        "webhook_url": draw(st.from_regex(r"https://[a-z]{1,10}\.example/[a-z0-9/]{0,20}", fullmatch=True)),
        "locale": draw(st.sampled_from(["en", "zh-CN", None])),
    }
    if start != end:
        doc["quiet_hours"] = f"{start // 60:02d}:{start % 60:02d}-{end // 60:02d}:{end % 60:02d}"
    return doc


@FAST
@given(valid_preferences())
def test_valid_preferences_parse_and_round_trip(doc):
    p = parse_preferences(doc, SETTINGS)
    assert isinstance(p, Preferences)
    again = parse_preferences(orjson.loads(p.dumps()), SETTINGS)
    assert again.asdict() == p.asdict()


# ------------------------------------------------------------------ device updates, receipts

DEVICE_FIELDS = ["user_id", "token", "platform", "op", "at", "v"]
RECEIPT_FIELDS = ["provider", "provider_msg_id", "status", "at", "error", "v"]
plausible = {
    "token": st.from_regex(r"[A-Za-z0-9:_.\-]{1,80}", fullmatch=True),
    "platform": st.sampled_from(["apns", "fcm", "sms"]),
    "op": st.sampled_from(["add", "remove", "nuke"]),
    "status": st.sampled_from(["DELIVERED", "UNDELIVERED", "delivered", "SENT"]),
    "provider": st.sampled_from(["twilio", "smsvendor", "Twilio!", ""]),
    "provider_msg_id": ids,
    "user_id": ids,
    "at": st.floats(allow_nan=False, allow_infinity=False),
    "v": st.integers(-1, 3),
}


def docs(fields):
    return st.dictionaries(st.sampled_from(fields) | st.text(max_size=4),
                           st.deferred(lambda: st.one_of(*[plausible[f] for f in fields if f in plausible], json_values)))


@FAST
@given(docs(DEVICE_FIELDS))
def test_device_updates_parse_or_invalid_and_round_trip(doc):
    upd = only_invalid_event(parse_device_update, doc)
    if upd is None:
        return
    assert isinstance(upd, DeviceUpdate) and upd.platform in ("apns", "fcm") and upd.op in ("add", "remove")
    assert address_ok("push", f"{upd.platform}:{upd.token}")
    assert parse_device_update(orjson.loads(upd.dumps())).asdict() == upd.asdict()


@FAST
@given(docs(RECEIPT_FIELDS))
def test_receipts_parse_or_invalid_and_round_trip(doc):
    r = only_invalid_event(parse_receipt, doc)
    if r is None:
        return
    assert isinstance(r, Receipt) and r.status in ("DELIVERED", "UNDELIVERED") and math.isfinite(r.at)
    assert parse_receipt(orjson.loads(r.dumps())).asdict() == r.asdict()


# ------------------------------------------------------------------ the pipeline's own records

NOW = 1_700_000_000.0


def delivery_doc(**kw):
    d = Delivery(delivery_id="n_00000000000000000000.sms", notification_id="n_00000000000000000000", biz_key="b",
                 user_id="u1", channel="sms", category="otp", template="otp", priority="high",
                 address="+15550001234", content={"body": "code 1"})
    return {**d.asdict(), **kw}


def intent_doc(**kw):
    i = Intent(notification_id="n_1", biz_key="b", user_id="u1", category="otp", template="otp", template_version=1,
               priority="high", params={"code": "1"})
    return {**i.asdict(), **kw}


def outcome_doc(**kw):
    att = Attempt(delivery_id="d", seq=1, channel="sms", provider="twilio", started_at=NOW, result="ACCEPTED")
    o = Outcome(delivery_id="d", notification_id="n", biz_key="b", user_id="u1", channel="sms", category="otp",
                template="otp", priority="high", state=State.ACCEPTED, at=NOW, attempt=att)
    return {**orjson.loads(o.dumps()), **kw}


TIMER_DOCS = {
    "intent": {"timer_id": "t1", "due_at": NOW, "kind": "intent", "payload": intent_doc()},
    "delivery": {"timer_id": "t2", "due_at": NOW, "kind": "delivery", "payload": delivery_doc()},
    "poll": {"timer_id": "t3", "due_at": NOW, "kind": "poll",
             "payload": {"user_id": "u1", "delivery": delivery_doc(), "provider": "twilio"}},
    "receipt": {"timer_id": "t4", "due_at": NOW, "kind": "receipt",
                "payload": {"user_id": "m1", "tries": 1, "receipt": Receipt(
                    provider="twilio", provider_msg_id="m1", status="DELIVERED", at=NOW).asdict()}},
    "fire": {"timer_id": "t5", "due_at": NOW, "kind": "fire", "payload": {}},
}
BASES = {
    Intent: (lambda d: parse_intent(d, 8, categories=SETTINGS.categories), intent_doc()),
    Delivery: (parse_delivery, delivery_doc()),
    Outcome: (parse_outcome, outcome_doc()),
    **{("timer", k): (parse_timer, v) for k, v in TIMER_DOCS.items()},
}


def test_base_records_are_valid_and_round_trip():
    for model, (parse, doc) in BASES.items():
        rec = parse(doc)
        assert parse(orjson.loads(rec.dumps())).asdict() == rec.asdict(), model


def _paths(doc, prefix=()):
    """Every (path) into a nested JSON object."""
    for k, v in doc.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from _paths(v, prefix + (k,))


def _set(doc, path, value):
    doc = json.loads(json.dumps(doc))
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    if value is _DELETE:
        cur.pop(path[-1], None)
    else:
        cur[path[-1]] = value
    return doc


_DELETE = object()


@st.composite
def mutated_records(draw):
    """A valid record of each kind with one field (at any depth) replaced by any
    JSON value or removed."""
    key = draw(st.sampled_from(list(BASES)))
    parse, doc = BASES[key]
    path = draw(st.sampled_from(list(_paths(doc))))
    value = draw(st.just(_DELETE) | json_values | st.text(max_size=300))
    return key, parse, _set(doc, path, value)


@hsettings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_records())
def test_records_with_any_field_changed_parse_or_invalid(case):
    key, parse, doc = case
    rec = only_invalid_event(parse, doc)
    if rec is None:
        return
    # whatever passed is what the agents can use: known lookups, JSON-able, stable
    again = parse(orjson.loads(rec.dumps()))
    assert again.asdict() == rec.asdict()
    if isinstance(rec, Delivery):
        assert rec.channel in CHANNELS and rec.priority in PRIORITIES
        # the address is checked at the send (adapters/dispatch.py): FAILED bad_address
        # with a record, not a dead letter here (tests/security/test_addresses.py)
        assert isinstance(rec.address, str)
    if isinstance(rec, Intent):
        assert rec.priority in PRIORITIES and rec.category in SETTINGS.categories
    if isinstance(rec, Timer) and rec.kind == "intent":
        Intent(**rec.payload)  # the scheduler rebuilds it like this
    if isinstance(rec, Timer) and rec.kind == "delivery":
        Delivery(**rec.payload)
    if isinstance(rec, Timer) and rec.kind == "receipt":
        Receipt(**rec.payload["receipt"])


MODELS = [Intent, Delivery, Outcome, Timer, Preferences, DeviceUpdate, Receipt]


@FAST
@given(st.sampled_from(MODELS), st.binary(max_size=200) | json_values.map(orjson.dumps), st.none() | st.binary(max_size=10))
def test_stream_entries_decode_or_invalid(model, value, key):
    rec = only_invalid_event(entries.decode, model, value, key, SETTINGS)
    if rec is not None:
        assert isinstance(rec, model)


def test_stream_entry_reasons():
    d = orjson.dumps(delivery_doc())
    assert entries.decode(Delivery, d, b"u1", SETTINGS).user_id == "u1"
    # a bad address decodes: the lane refuses it at the send, FAILED bad_address (never PENDING)
    bad = orjson.dumps(delivery_doc(address="a@b.c\r\nBcc: x@y.z", channel="email"))
    assert entries.decode(Delivery, bad, b"u1", SETTINGS).address == "a@b.c\r\nBcc: x@y.z"
    cases = [
        (Delivery, None, b"u1", "empty"),
        (Delivery, b"", b"u1", "bad_json"),
        (Delivery, b"\xff\xfe\x00", b"u1", "bad_json"),
        (Delivery, b" " * (entries.entry_limit(SETTINGS) + 1), b"u1", "oversized"),
        (Delivery, d, b"u2", "wrong_key"),
        (Delivery, d, None, "wrong_key"),
        (Delivery, orjson.dumps(delivery_doc(v=2)), b"u1", "unknown_version"),
        (Delivery, orjson.dumps(delivery_doc(content={"body": {"x": 1}})), b"u1", "wrong_type"),
        (Intent, orjson.dumps(intent_doc(category="gossip")), b"u1", "unknown_category"),
        (Intent, orjson.dumps(intent_doc(params={"a": [[[[[[[[1]]]]]]]]})), b"u1", "params_too_deep"),
        (Timer, orjson.dumps({**TIMER_DOCS["intent"], "due_at": "soon"}), b"u1", "wrong_type"),
        (Timer, orjson.dumps({**TIMER_DOCS["intent"], "kind": "nope"}), b"u1", "bad_value"),
        (Receipt, orjson.dumps({"provider": "twilio", "provider_msg_id": "m", "status": "SENT", "at": 1}), b"m", "bad_value"),
        (Preferences, orjson.dumps({"user_id": "u9"}), b"u1", "wrong_key"),
    ]
    for model, value, key, reason in cases:
        with pytest.raises(InvalidEvent) as err:
            entries.decode(model, value, key, SETTINGS)
        assert err.value.reason == reason, (model, value[:80] if value else value, err.value)


# ------------------------------------------------------------------ receipts from providers

twilio_keys = st.sampled_from(["MessageSid", "SmsSid", "MessageStatus", "SmsStatus", "ErrorCode", "To", "From"])
twilio_values = st.sampled_from(["delivered", "read", "failed", "undelivered", "sent", "queued", ""]) | st.text(max_size=300)


@FAST
@given(st.lists(st.tuples(twilio_keys | st.text(max_size=6), twilio_values), max_size=8))
def test_twilio_callbacks_parse_into_receipts_the_pipeline_accepts(pairs):
    try:
        r = parse_twilio_callback(pairs, now=NOW)
    except ReceiptRejected as err:
        assert err.reason == "malformed"
        return
    if r is not None:
        # what the API writes to notify.receipts is never dead-lettered by the pipeline
        assert parse_receipt(orjson.loads(r.dumps())).asdict() == r.asdict()


vendor_items = st.fixed_dictionaries(
    {},
    optional={
        "message_id": ids | json_values,
        "status": st.sampled_from(["delivered", "failed", "expired", "accepted"]) | json_values,
        "timestamp": st.sampled_from(["nan", "inf", "-1", "1e400", 7]) | json_values,
        "error": json_values,
    },
)


@FAST
@given(st.one_of(
    vendor_items,
    st.lists(vendor_items, max_size=3),
    st.fixed_dictionaries({"receipts": st.lists(vendor_items, max_size=3) | json_values}),
    json_values,
).map(orjson.dumps) | st.binary(max_size=50))
def test_vendor_callbacks_parse_into_receipts_the_pipeline_accepts(body):
    try:
        got = parse_vendor_callback(body, now=NOW)
    except ReceiptRejected as err:
        assert err.reason == "malformed"
        return
    for r in got:
        assert parse_receipt(orjson.loads(r.dumps())).asdict() == r.asdict()


# ------------------------------------------------------------------ signatures and replays

any_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@FAST
@given(st.dictionaries(any_text, any_text, min_size=1, max_size=6), st.data())
def test_twilio_signature_binds_every_param(params, data):
    url = "https://notify.example/v1/receipts/twilio"
    sig = twilio_signature("tok", url, params)
    assert verify_twilio_signature("tok", url, params, sig)
    name = data.draw(st.sampled_from(sorted(params)))
    other = data.draw(any_text.filter(lambda v: v != params[name]))
    assert not verify_twilio_signature("tok", url, {**params, name: other}, sig)
    assert not verify_twilio_signature("tok2", url, params, sig)
    assert not verify_twilio_signature("tok", url + "x", params, sig)


@FAST
@given(st.binary(min_size=1, max_size=200), st.integers(0, 2**40), st.data())
def test_vendor_signature_binds_body_and_timestamp(body, ts, data):
    header = vendor_signature_header("sec", ts, body)
    assert verify_vendor_signature("sec", str(ts), body, header)
    i = data.draw(st.integers(0, len(body) - 1))
    flipped = body[:i] + bytes([body[i] ^ data.draw(st.integers(1, 255))]) + body[i + 1:]
    assert not verify_vendor_signature("sec", str(ts), flipped, header)
    assert not verify_vendor_signature("sec", str(ts + 1), body, header)
    assert not verify_vendor_signature("other", str(ts), body, header)


@hsettings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(ids, st.sampled_from(["delivered", "failed"])), min_size=1, max_size=5, unique=True))
def test_each_signed_callback_is_taken_once(callbacks):
    async def run():
        v = ReceiptVerifier(vendor_secret="s", twilio_auth_token="t", now=lambda: NOW,
                            guard=MemoryReplayGuard(now=lambda: NOW))
        url = "https://n.example/v1/receipts/twilio"
        for mid, status in callbacks:
            body = orjson.dumps({"message_id": mid, "status": status})
            sig = vendor_signature_header("s", int(NOW), body)
            assert [r.provider_msg_id for r in await v.vendor(body, str(int(NOW)), sig)] == [mid.strip()]
            form = {"MessageSid": mid, "MessageStatus": status}
            assert (await v.twilio(url, form, twilio_signature("t", url, form))).provider_msg_id == mid.strip()
        for mid, status in callbacks:
            body = orjson.dumps({"message_id": mid, "status": status})
            with pytest.raises(ReceiptRejected, match="replay"):
                await v.vendor(body, str(int(NOW)), vendor_signature_header("s", int(NOW), body))
            form = {"MessageSid": mid, "MessageStatus": status}
            # Twilio retries identical callbacks: acknowledged, nothing taken a second time
            assert await v.twilio(url, form, twilio_signature("t", url, form)) is None

    asyncio.run(run())


@pytest.mark.parametrize("ts", ["nan", "NaN", "inf", "-inf", "1e400", "-5", "", "soon"])
async def test_vendor_timestamp_must_be_a_real_time(ts):
    """A signed "nan" compares as never stale: it must be refused, not taken."""
    v = ReceiptVerifier(vendor_secret="s", now=lambda: NOW, guard=MemoryReplayGuard(now=lambda: NOW))
    body = b'{"message_id": "m", "status": "delivered"}'
    with pytest.raises(ReceiptRejected) as err:
        await v.vendor(body, ts, vendor_signature_header("s", ts, body))
    assert err.value.reason in ("malformed", "stale")


# ------------------------------------------------------------------ templates: params are data, the sandbox holds

template_text = st.lists(
    st.sampled_from(list("{}%#()[]._'\"|~ ") + ["{{", "}}", "{%", "%}", "{#", "#}", "__class__", "__mro__",
                                                 "range", "cycler", "lipsum", "self", "config", "x", "7*7"])
    | st.characters(blacklist_categories=("Cs", "Cc")),
    max_size=20,
).map("".join)


@FAST
@given(template_text)
@example("{{ ''.__class__.__mro__[1].__subclasses__() }}")
@example("{% for c in [].__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}")
@example("{{ 7*7 }}")
def test_params_are_rendered_as_data_never_as_template(value):
    out = R.render("otp", 1, "sms", "en", {"code": value})
    expected = f"Acme: your verification code is {value}. It expires in 5 minutes. Never share this code with anyone."
    assert out["body"] == truncate(expected.strip(), SETTINGS.channel_limits()["sms"]["body"])


UNSAFE = ["__class__", "__mro__", "__subclasses__", "__globals__", "__init__", "__dict__", "__builtins__",
          "__code__", "__base__", "__bases__", "__reduce__", "__getattribute__", "__module__", "func_globals",
          "gi_frame", "f_globals", "mro"]
MUTATORS = ["append", "update", "pop", "clear", "setdefault", "insert", "remove", "popitem", "extend"]


@pytest.fixture(scope="module")
def hostile_renderer(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpl")
    sources = {
        "attr": "{{ x.%s }}",
        "call": "{{ x.%s() }}",
        "filter": "{{ x|attr('%s') }}",
        "item": "{{ x['%s'] }}",
        "format": "{{ '{0.%s}'.format(x) }}",
        "mutate": "{{ x.%s(1) }}",
    }
    made = {}
    for kind, src in sources.items():
        for name in UNSAFE + MUTATORS:
            code = f"{kind}{abs(hash(name)) % 10**8}"
            p = root / code / "v1" / "sms.en.j2"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(src % name)
            made[(kind, name)] = code
    return Renderer(root, "en"), made


@hsettings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["attr", "call", "filter", "item", "format", "mutate"]), st.sampled_from(UNSAFE + MUTATORS),
       st.sampled_from([{}, [], "s", 1, 1.5, {"a": [1]}, None, True]))
def test_sandbox_refuses_attribute_walks_and_mutation(hostile_renderer, kind, name, x):
    renderer, made = hostile_renderer
    code = made[(kind, name)]
    try:
        out = renderer.render(code, 1, "sms", "en", {"x": x})
    except TemplateError as err:
        assert err.code in ("sandbox_violation", "undefined_variable", "render_failed"), err
        return
    # rendered without an error: only a plain value or an empty string, never Python internals
    body = out["body"]
    assert "<class" not in body and "<built-in" not in body and "<function" not in body and "module" not in body
    assert name in MUTATORS or name == "mro" or kind in ("item",), (kind, name, body)
    if isinstance(x, (dict, list)):
        assert x in ({}, [], {"a": [1]})  # params were not changed by the template


# ------------------------------------------------------------------ addresses, log masking

controls = st.sampled_from(["\r", "\n", "\x00", "\r\n", "\x1b", "\t", " "])


@FAST
@given(st.sampled_from(["sms", "email", "push", "webhook"]), st.text(max_size=20), controls, st.text(max_size=20))
def test_no_address_with_a_line_break_or_control(channel, a, bad, b):
    assert not address_ok(channel, a + bad + b)


phones = st.from_regex(r"\+[1-9][0-9]{7,13}", fullmatch=True) | st.from_regex(r"[1-9][0-9]{8,13}", fullmatch=True)
emails = st.from_regex(r"[a-z][a-z0-9._]{2,20}@[a-z]{2,10}\.(com|org|example)", fullmatch=True)
tokens = (st.from_regex(r"[0-9a-f]{64}", fullmatch=True)
          | st.from_regex(r"(apns|fcm):[A-Za-z0-9_\-]{20,160}", fullmatch=True)
          | st.from_regex(r"[A-Za-z0-9_\-]{100,160}", fullmatch=True))
prose = st.text(st.sampled_from(list(string.ascii_letters + " ,;=()[]'\"")), max_size=30)


@FAST
@given(prose, st.one_of(phones, emails, tokens), prose)
def test_redact_masks_recipients_in_free_text(before, secret, after):
    out = redact.redact(f"{before} {secret} {after}")
    assert secret not in out
    assert before.strip() in out or not before.strip()


@FAST
@given(phones, emails, tokens)
def test_mask_helpers_never_return_the_value(phone, email, token):
    assert phone not in redact.mask_phone(phone) and phone[-2:] == redact.mask_phone(phone)[-2:]
    assert email not in redact.mask_email(email) and redact.mask_email(email).endswith(email.split("@")[1])
    assert token not in redact.mask_token(token)
    assert token.split(":", 1)[-1] not in redact.mask_address("push", token)


async def test_delivery_pinned_to_an_unknown_provider_goes_to_review():
    """A delivery read from a lane may name any provider as the one that timed out:
    the dispatcher has nobody to ask, and the rules send it to REVIEW (no KeyError
    in the lane, no resend)."""
    from adapters.dispatch import Dispatcher
    from adapters.fake import FakeProvider
    from pipeline.rules.attempts import after_query

    providers = {"sms_a": FakeProvider("sms_a", "sms")}
    disp = Dispatcher(providers, {"sms": ["sms_a"]})
    d = parse_delivery(delivery_doc(unknown_provider="carrier-pigeon", attempt=1))
    q = await disp.query(d)
    assert not q.supported and q.provider == "carrier-pigeon"
    assert after_query(d, q.status, q.supported, NOW).state == State.REVIEW
    assert providers["sms_a"].calls == {}
    await disp.close()
