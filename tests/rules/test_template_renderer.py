"""pipeline.templates: the shipped templates, locale fallback, limits, escaping, errors
and the sandbox."""

import orjson
import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from config.settings import load_settings
from pipeline.templates import CHANNEL_PARTS, OPTIONAL_PARTS, Renderer, TemplateError, truncate

SETTINGS = load_settings(env={})
R = Renderer.from_settings(SETTINGS)

PARAMS = {
    "otp": {"code": "482913", "ttl_minutes": 5},
    "order_shipped": {
        "order_no": "A-1001",
        "carrier": "UPS",
        "tracking_no": "1Z999",
        "tracking_url": "https://t.example/1Z999",
        "eta": "Friday",
        "name": "Ann",
    },
    "security_alert": {
        "event": "New sign-in",
        "device": "iPhone 15",
        "location": "Berlin",
        "time": "10:02",
        "action_url": "https://a.example/secure",
    },
    "promo": {"headline": "Spring sale", "discount": "20%", "url": "https://shop.example", "promo_code": "SPRING"},
    "welcome": {"name": "Ann", "url": "https://w.example"},
}
EXPECTED = {
    "otp": {"sms": ["en", "zh"], "push": ["en", "zh"], "email": ["en", "zh"], "inbox": ["en", "zh"]},
    "order_shipped": {ch: ["en", "zh"] for ch in CHANNEL_PARTS},
    "security_alert": {"push": ["en"], "sms": ["en"], "email": ["en"], "inbox": ["en"]},
    "promo": {"push": ["en", "zh"], "email": ["en", "zh"], "inbox": ["en", "zh"]},
    "welcome": {"email": ["en"], "inbox": ["en"]},
}
CASES = [(code, ch, loc) for code, chans in EXPECTED.items() for ch, locs in chans.items() for loc in locs]


@pytest.mark.parametrize("code, channel, locale", CASES)
def test_shipped_templates_render(code, channel, locale):
    assert R.resolve(code, 1, channel, locale) is not None
    out = R.render(code, 1, channel, locale, PARAMS[code])
    required = set(CHANNEL_PARTS[channel]) - OPTIONAL_PARTS.get(channel, frozenset())
    assert required <= set(out) <= set(CHANNEL_PARTS[channel])
    assert all(isinstance(v, str) and v for v in out.values())
    first = next(iter(PARAMS[code].values()))
    assert any(str(first) in v for v in out.values())


def test_optional_params_may_be_left_out():
    minimal = {k: v for k, v in PARAMS["order_shipped"].items() if k not in ("eta", "name")}
    for ch in CHANNEL_PARTS:
        R.render("order_shipped", 1, ch, "en", minimal)
    assert orjson.loads(R.render("order_shipped", 1, "webhook", "en", minimal)["body"])["eta"] is None


def test_has_template_and_channels():
    assert R.has_template("otp", 1)
    assert R.has_template("otp", 1, "sms")
    assert not R.has_template("otp", 1, "webhook")
    assert not R.has_template("otp", 2)
    assert not R.has_template("nope", 1)
    assert not R.has_template("otp", True)  # type: ignore[arg-type]
    assert R.channels_for("welcome", 1) == ["inbox", "email"]


@pytest.mark.parametrize(
    "asked, used",
    [("zh", "zh"), ("zh-CN", "zh"), ("zh_TW", "zh"), ("ZH-cn", "zh"), ("en-GB", "en"), ("fr", "en"), (None, "en"),
     ("../../etc", "en"), ("", "en")],
)
def test_locale_fallback(asked, used):
    assert R.resolve("otp", 1, "sms", asked)[0] == used


def test_english_only_template_falls_back_for_chinese_users():
    assert R.render("security_alert", 1, "push", "zh-CN", PARAMS["security_alert"])["title"] == "Security alert"


def test_missing_template_message():
    with pytest.raises(TemplateError) as err:
        R.render("otp", 2, "sms", "zh", {"code": "1"})
    assert str(err.value) == "template_missing: otp v2 sms zh"
    assert err.value.code == "template_missing"
    with pytest.raises(TemplateError, match="template_missing"):
        R.render("otp", 1, "webhook", "en", {"code": "1"})
    with pytest.raises(TemplateError, match="template_missing"):
        R.render("otp", 1, "fax", "en", {"code": "1"})


def test_undefined_variable():
    with pytest.raises(TemplateError) as err:
        R.render("otp", 1, "sms", "en", {})
    assert err.value.code == "undefined_variable"
    assert "code" in str(err.value)


def test_sms_truncated_to_limit():
    out = R.render("order_shipped", 1, "sms", "en", {**PARAMS["order_shipped"], "tracking_url": "https://x/" + "y" * 300})
    assert len(out["body"]) == 160 and out["body"].endswith("…")


def test_push_title_and_body_truncated():
    out = R.render("promo", 1, "push", "en", {**PARAMS["promo"], "headline": "H" * 100, "promo_code": "C" * 300})
    assert len(out["title"]) == 64 and out["title"].endswith("…")
    assert len(out["body"]) == 178 and out["body"].endswith("…")


def test_html_part_escaped_text_and_subject_not():
    out = R.render("welcome", 1, "email", "en", {"name": "<b>Ann</b> & Bob", "url": 'https://x/?a=1&b="2"'})
    assert "<b>Ann</b> & Bob" in out["subject"]
    assert "<b>Ann</b> & Bob" in out["text"]
    assert "&lt;b&gt;Ann&lt;/b&gt; &amp; Bob" in out["html"]
    assert "<b>Ann" not in out["html"]
    assert 'href="https://x/?a=1&amp;b=&#34;2&#34;"' in out["html"]


def test_subject_and_title_are_one_line():
    out = R.render("welcome", 1, "email", "en", {"name": "Ann\r\nBcc: evil@example.com", "url": "u"})
    assert "\n" not in out["subject"] and "\r" not in out["subject"]
    out = R.render("promo", 1, "push", "en", {**PARAMS["promo"], "headline": "a\n\nb"})
    assert out["title"] == "a b"


def test_webhook_is_json_even_with_hostile_params():
    evil = 'x", "admin": true, "y": "</script>'
    out = R.render("order_shipped", 1, "webhook", "en", {**PARAMS["order_shipped"], "order_no": evil})
    doc = orjson.loads(out["body"])
    assert doc["order_no"] == evil and "admin" not in doc


def test_params_with_template_syntax_are_inert():
    payload = "{{ ''.__class__.__mro__ }}{% for x in range(3) %}x{% endfor %}"
    out = R.render("otp", 1, "sms", "en", {"code": payload})
    assert payload in out["body"] or out["body"].endswith("…")
    assert "<class" not in out["body"]


def test_none_renders_empty():
    assert "expires in  minutes" in R.render("otp", 1, "sms", "en", {"code": "1", "ttl_minutes": None})["body"]


def test_non_string_keys_are_ignored():
    assert R.render("otp", 1, "sms", "en", {"code": "7", 1: "x", None: 2})["body"]


# ------------------------------------------------------------------ custom template dirs


def make(tmp_path, files):
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return Renderer(tmp_path, "en", {"sms": {"body": 10}})


def test_blockless_file_is_the_body(tmp_path):
    r = make(tmp_path, {"t/v1/sms.en.j2": "Hi {{ name }}!\n"})
    assert r.render("t", 1, "sms", None, {"name": "Bo"}) == {"body": "Hi Bo!"}


def test_a_block_sees_the_params_not_what_another_block_set(tmp_path):
    """The parts of one template are rendered in one context (as Jinja renders a
    whole template): a ``set`` inside a block stays in that block."""
    r = make(tmp_path, {"t/v1/push.en.j2": "{% block title %}{% set name = 'X' %}{{ name }}{% endblock %}"
                                            "{% block body %}{{ name }}{% endblock %}"})
    assert r.render("t", 1, "push", "en", {"name": "Bo"}) == {"title": "X", "body": "Bo"}
    assert r.render("t", 1, "push", "en", {"name": "Al"}) == {"title": "X", "body": "Al"}


def test_incomplete_template(tmp_path):
    r = make(tmp_path, {"t/v1/push.en.j2": "{% block body %}b{% endblock %}"})
    with pytest.raises(TemplateError, match="template_incomplete.*title"):
        r.render("t", 1, "push", "en", {})


def test_email_html_is_optional(tmp_path):
    r = make(tmp_path, {"t/v1/email.en.j2": "{% block subject %}s{% endblock %}{% block text %}t{% endblock %}"})
    assert r.render("t", 1, "email", "en", {}) == {"subject": "s", "text": "t"}


def test_syntax_error(tmp_path):
    r = make(tmp_path, {"t/v1/sms.en.j2": "{% if %}"})
    with pytest.raises(TemplateError, match="template_syntax"):
        r.render("t", 1, "sms", "en", {})


def test_bad_webhook_json(tmp_path):
    r = make(tmp_path, {"t/v1/webhook.en.j2": "{ not json {{ x }}"})
    with pytest.raises(TemplateError, match="bad_webhook_json"):
        r.render("t", 1, "webhook", "en", {"x": 1})


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ x.__class__ }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ x.update({'a': 1}) }}",
        "{{ l.append(1) }}",
        "{{ x.__dict__ }}",
    ],
)
def test_sandbox_escapes_refused(tmp_path, source):
    r = make(tmp_path, {"t/v1/sms.en.j2": source})
    with pytest.raises(TemplateError) as err:
        r.render("t", 1, "sms", "en", {"x": {"a": 0}, "l": []})
    assert err.value.code in ("sandbox_violation", "undefined_variable")


def test_filter_type_error_becomes_template_error(tmp_path):
    r = make(tmp_path, {"t/v1/sms.en.j2": "{{ n|round(2) }}{{ 1 / z }}"})
    with pytest.raises(TemplateError, match="render_failed"):
        r.render("t", 1, "sms", "en", {"n": "abc", "z": 0})


def test_odd_layout_is_ignored_and_reload(tmp_path):
    r = make(tmp_path, {"t/vx/sms.en.j2": "a", "t/v1/fax.en.j2": "a", "t/v1/sms.en.txt": "a", "../t2": "a"})
    assert not r.has_template("t", 1)
    (tmp_path / "t/v1/sms.en.j2").write_text("ok")
    assert not r.has_template("t", 1)
    r.reload()
    assert r.render("t", 1, "sms", "en", {}) == {"body": "ok"}


def test_compiled_templates_are_cached():
    r = Renderer.from_settings(SETTINGS)
    r.render("otp", 1, "sms", "en", {"code": "1"})
    (key,) = list(r._compiled)
    tmpl = r._compiled[key]
    r.render("otp", 1, "sms", "en", {"code": "2"})
    assert r._compiled[key] is tmpl


def test_not_a_directory(tmp_path):
    with pytest.raises(ValueError):
        Renderer(tmp_path / "missing")


# ------------------------------------------------------------------ truncate


@given(st.text(), st.integers(min_value=1, max_value=300))
def test_truncate_within_limit_and_prefix(text, limit):
    out = truncate(text, limit)
    assert len(out) <= limit
    if len(text) <= limit:
        assert out == text
    else:
        assert out.endswith("…") and text.startswith(out[:-1])


def test_truncate_keeps_surrogate_pairs_and_drops_dangling_joiner():
    assert truncate("ab😀😀😀", 4) == "ab😀…"
    assert truncate("ab\u200d\u200dzzzz", 4) == "ab…"


# ------------------------------------------------------------------ properties

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
NAMES = sorted({k for p in PARAMS.values() for k in p} | {"app_name", "ttl_minutes", "unsubscribe_url"})
params_st = st.dictionaries(st.sampled_from(NAMES) | st.text(max_size=10), json_values, max_size=12)


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CASES), params_st)
def test_renderer_raises_only_template_error(case, params):
    code, channel, locale = case
    try:
        out = R.render(code, 1, channel, locale, params)
    except TemplateError:
        return
    limits = SETTINGS.channel_limits().get(channel, {})
    for part, text in out.items():
        assert isinstance(text, str)
        if part in limits:
            assert len(text) <= limits[part]
    if channel == "webhook":
        orjson.loads(out["body"])


@hsettings(max_examples=100, deadline=None)
@given(st.sampled_from(CASES), st.dictionaries(st.sampled_from(NAMES), st.text(max_size=60)))
def test_full_string_params_always_render(case, extra):
    """With every needed param present as a string, every template renders, and no
    injected markup survives into an email's HTML."""
    code, channel, locale = case
    params = {k: str(v) for k, v in PARAMS[code].items()}
    params.update({k: "<script>" + v for k, v in extra.items()})
    out = R.render(code, 1, channel, locale, params)
    if "html" in out:
        assert "<script>" not in out["html"]


# ------------------------------------------------------------------ render memo


def test_same_params_render_once_and_callers_get_their_own_copy(tmp_path, monkeypatch):
    r = make(tmp_path, {"t/v1/push.en.j2": "{% block title %}T {{ a }}{% endblock %}{% block body %}B{% endblock %}"})
    calls = []
    real = r._render
    monkeypatch.setattr(r, "_render", lambda *a: calls.append(a) or real(*a))
    first = r.render("t", 1, "push", "en", {"a": 1})
    first["title"] = "changed by a caller"
    again = r.render("t", 1, "push", "en", {"a": 1})
    assert again == {"title": "T 1", "body": "B"} and len(calls) == 1
    assert r.render("t", 1, "push", "en", {"a": 2})["title"] == "T 2" and len(calls) == 2


def test_memo_keeps_param_order_apart(tmp_path):
    r = make(tmp_path, {"t/v1/sms.en.j2": "{% for k in params %}{{ k }}{% endfor %}"})
    assert r.render("t", 1, "sms", None, {"params": {"x": 1, "y": 2}})["body"] == "xy"
    assert r.render("t", 1, "sms", None, {"params": {"y": 2, "x": 1}})["body"] == "yx"


@pytest.mark.parametrize("source", [
    "{{ [1, 2, 3, 4, 5, 6, 7, 8, 9] | random }}",
    "{{ lipsum(1, False, 1, 3) }}",
    '{% include "t/v1/part.txt" %}',
])
def test_templates_that_may_draw_at_random_are_not_remembered(tmp_path, monkeypatch, source):
    r = make(tmp_path, {"t/v1/sms.en.j2": source, "t/v1/part.txt": "{{ [1, 2] | random }}"})
    calls = []
    real = r._render
    monkeypatch.setattr(r, "_render", lambda *a: calls.append(a) or real(*a))
    r.render("t", 1, "sms", None, {})
    r.render("t", 1, "sms", None, {})
    assert len(calls) == 2


def test_reload_forgets_what_was_rendered(tmp_path):
    r = make(tmp_path, {"t/v1/sms.en.j2": "one"})
    assert r.render("t", 1, "sms", None, {})["body"] == "one"
    (tmp_path / "t/v1/sms.en.j2").write_text("two")
    r.reload()
    assert r.render("t", 1, "sms", None, {})["body"] == "two"
