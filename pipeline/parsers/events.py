"""Input validation: raw producer bytes → :class:`Event`, a preferences update →
:class:`Preferences`, a device update → :class:`DeviceUpdate`, a receipt →
:class:`Receipt`, or :class:`InvalidEvent` with a short machine reason.

Rule: reject early with the first problem found, never raise anything else, never
trust sizes or nesting. Unknown extra fields are ignored (producers may add metadata);
a newer schema version than ours is refused. Recipients may be strings or integers;
they become trimmed strings, deduplicated in order.

Reasons: bad_json, not_an_object, missing_field, wrong_type, bad_value, oversized,
unknown_version, unknown_category, unknown_template, unknown_channel, bad_priority,
no_recipients, too_many_recipients, params_too_deep, params_too_large; for
preferences also bad_timezone and bad_quiet_hours. At the door (the API and
``notify send``), :func:`check_params` also renders the event's templates:
``missing_params`` names the variables a template needs that the params lack.
"""

from __future__ import annotations

import math
import re
import time
import unicodedata
from functools import lru_cache
from collections.abc import Mapping  # (isinstance with typing's alias is a few Python calls)
from typing import Any, Optional
from urllib.parse import urlsplit

import orjson

from config.settings import CHANNELS, PRIORITIES
from pipeline.models import SCHEMA_VERSION, DeviceUpdate, Event, Preferences, Receipt

from ..rules.priority import capped
from ..rules.quiet_hours import load_zone, parse_quiet_hours

__all__ = ["InvalidEvent", "check_params", "MAX_BIZ_KEY", "MAX_ID", "MAX_PROVIDER_MSG_ID", "TOKEN_RE", "PUSH_PLATFORMS", "parse_event",
           "parse_preferences", "parse_device_update", "parse_receipt", "params_depth", "address_ok", "id_problem", "forbidden_id_ranges",
           "callback_url"]

#: seed 000: ``biz_key VARCHAR(64)``
MAX_BIZ_KEY = 64
#: longest user id / recipient we accept
MAX_ID = 128
#: longest provider message id a receipt may carry
MAX_PROVIDER_MSG_ID = 256
#: times at or after this (Sat Nov 20 2286) are not unix seconds (the record store refuses them)
MAX_TIME = 1e10
#: a push device token (APNs hex, FCM base64url with ':' and '-')
#: (``\Z``, not ``$``: ``$`` also matches before a trailing newline, so even a
#: ``TOKEN_RE.match`` refuses "token\n"; this module uses ``fullmatch``)
TOKEN_RE = re.compile(r"^[A-Za-z0-9:_.\-]{1,512}\Z")
#: the platforms a push device is registered with (its token goes to the provider of that
#: platform: APNs, FCM, Huawei Push Kit); an address on the push channel is ``<platform>:<token>``
PUSH_PLATFORMS = ("apns", "fcm", "hms")

_LOCALE_RE = re.compile(r"[A-Za-z]{2,8}(?:[-_][A-Za-z0-9]{1,8})*")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_TEMPLATE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_PHONE_STRIP_RE = re.compile(r"[\s().-]")
_PHONE_RE = re.compile(r"\+?[0-9]{6,15}")
_EMAIL_RE = re.compile(r"[^@\s]{1,64}@[^@\s]+\.[^@\s]+")
#: C0 and C1 control characters, DEL, and the Unicode line and paragraph separators
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class InvalidEvent(ValueError):
    """Input rejected: ``reason`` is a short machine word, ``field`` the offending field
    (dotted, may be None), ``detail`` a human hint."""

    def __init__(self, reason: str, field: Optional[str] = None, detail: Optional[str] = None) -> None:
        self.reason = reason
        self.field = field
        self.detail = detail
        msg = reason if field is None else f"{reason}: {field}"
        super().__init__(msg if detail is None else f"{msg} ({detail})")


# --------------------------------------------------------------------------- helpers


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) and math.isfinite(x)


def params_depth(obj: Any, limit: int = 1 << 30) -> int:
    """Nesting of dicts and lists (a flat dict is 1, a scalar 0); stops counting once
    past ``limit``."""
    if type(obj) is dict:  # the common case, a flat dict of scalars: no walk
        for v in obj.values():
            if isinstance(v, (dict, list, tuple)):
                break
        else:
            return 1
    deepest = 0
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _check_version(data: Mapping[str, Any]) -> int:
    v = data.get("v", SCHEMA_VERSION)
    if not _is_int(v):
        raise InvalidEvent("wrong_type", "v", "an integer")
    if v < 1 or v > SCHEMA_VERSION:
        raise InvalidEvent("unknown_version", "v", f"this build reads v1..v{SCHEMA_VERSION}, got {v}")
    return v


#: Unicode categories no id-like field may hold: controls (Cc: NUL, line breaks,
#: ESC, ...), format characters (Cf: bidi overrides such as U+202E, zero-width
#: U+200B..U+200D, the BOM U+FEFF, soft hyphen, ...), line and paragraph separators
FORBIDDEN_ID_CATEGORIES = frozenset(("Cc", "Cf", "Zl", "Zp"))


def id_problem(value: str) -> Optional[str]:
    """Why ``value`` cannot be an id (a business key, a user id, a provider message
    id, ...): the first character of a :data:`FORBIDDEN_ID_CATEGORIES` category,
    named (``U+202E RIGHT-TO-LEFT OVERRIDE``), so the refusal never echoes it raw;
    None when it has none. Such characters make two different ids look alike in
    a log, a terminal or a support tool, or break the lines they are printed on."""
    if value.isprintable():  # the common case, in C: no C*, Z* other than the space
        return None
    for i, ch in enumerate(value):
        if unicodedata.category(ch) in FORBIDDEN_ID_CATEGORIES:
            name = unicodedata.name(ch, "") or {"Cc": "control character"}.get(unicodedata.category(ch), "")
            return f"character {i} is U+{ord(ch):04X} {name}".rstrip()
    return None


@lru_cache(maxsize=1)
def forbidden_id_ranges() -> tuple[tuple[int, int], ...]:
    """The code point ranges of :data:`FORBIDDEN_ID_CATEGORIES` (for the OpenAPI
    document's patterns; computed once, ~0.2 s)."""
    out: list[tuple[int, int]] = []
    for cp in range(0x110000):
        if unicodedata.category(chr(cp)) in FORBIDDEN_ID_CATEGORIES:
            if out and out[-1][1] == cp - 1:
                out[-1] = (out[-1][0], cp)
            else:
                out.append((cp, cp))
    return tuple(out)


def _echo(value: str, n: int) -> str:
    """``value`` cut to ``n`` characters for an error's detail; escaped (``repr``)
    when it holds anything not printable, so a refusal never carries a bidi
    override or a line break back to a terminal or a log."""
    cut = value[:n]
    return cut if cut.isprintable() else repr(cut)


def _no_forbidden(value: str, field: str) -> None:
    problem = id_problem(value)
    if problem is not None:
        raise InvalidEvent("bad_value", field, f"no control, format or separator characters: {problem}")


def _str_field(data: Mapping[str, Any], field: str, max_len: int) -> str:
    value = data[field]
    if not isinstance(value, str):
        raise InvalidEvent("wrong_type", field, "a string")
    if not value.strip() or len(value) > max_len:
        raise InvalidEvent("bad_value", field, f"1..{max_len} characters")
    _no_forbidden(value, field)
    return value


def _id(value: Any, field: str) -> str:
    if isinstance(value, str):
        s = value.strip()
    elif _is_int(value):
        s = str(value)
    else:
        raise InvalidEvent("wrong_type", field, "a string or an integer")
    if not s or len(s) > MAX_ID:
        raise InvalidEvent("bad_value", field, f"1..{MAX_ID} characters")
    if isinstance(value, str):
        _no_forbidden(value, field)  # also around the id: "\nu1" is refused, not trimmed
    return s


def _opt_locale(data: Mapping[str, Any], field: str = "locale") -> Optional[str]:
    value = data.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidEvent("wrong_type", field, "a string")
    if not _LOCALE_RE.fullmatch(value):
        raise InvalidEvent("bad_value", field, "a locale like 'en' or 'zh-CN'")
    return value


def _opt_time(data: Mapping[str, Any], field: str) -> Optional[float]:
    value = data.get(field)
    if value is None:
        return None
    if not _is_number(value):
        raise InvalidEvent("wrong_type", field, "a unix time in seconds")
    if value < 0:
        raise InvalidEvent("bad_value", field, "a unix time in seconds ≥ 0")
    return float(value)


# --------------------------------------------------------------------------- events


#: a producer's name, as API keys name it (pipeline/api/auth.py)
PRODUCER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}")


def _opt_producer(data: Mapping[str, Any]) -> str:
    """The producer whose key space the event's biz_key belongs to: set by the API
    from the caller's key (a body's own value is replaced there); a producer
    writing straight to the stream may name itself; "" is the operator's."""
    value = data.get("producer")
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or not PRODUCER_RE.fullmatch(value):
        raise InvalidEvent("bad_value", "producer", "letters, digits, _.:@-; up to 64")
    return value


def parse_event(raw: bytes | bytearray | memoryview | str, settings: Any, renderer: Any, *,
                now: Optional[float] = None, priority_any: bool = False) -> Event:
    """Validate one producer message; ``renderer.has_template(code, version)`` decides
    whether the template exists. Raises :class:`InvalidEvent` and nothing else.

    ``priority`` is lowered to the category's cap (pipeline/rules/priority.py)
    unless ``priority_any`` (an API key with the ``priority:any`` scope, or the
    API's mark on the stream entry). ``send_at`` is at most
    ``settings.max_send_ahead_s`` after ``now`` (default: the time of the call);
    at the door (the API passes ``now``) also at most ``settings.max_send_past_s``
    before it."""
    try:
        size = len(raw.encode("utf-8", "surrogatepass")) if isinstance(raw, str) else len(raw)
    except TypeError:
        raise InvalidEvent("bad_json", None, f"expected bytes, got {type(raw).__name__}") from None
    if size > settings.max_event_bytes:
        raise InvalidEvent("oversized", None, f"{size} bytes > {settings.max_event_bytes}")
    try:
        data = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
        raise InvalidEvent("bad_json", None, str(exc)[:200]) from None
    if not isinstance(data, dict):
        raise InvalidEvent("not_an_object", None, type(data).__name__)
    v = _check_version(data)
    for field in ("biz_key", "category", "template", "recipients"):
        if data.get(field) is None:
            raise InvalidEvent("missing_field", field)

    biz_key = _str_field(data, "biz_key", MAX_BIZ_KEY)

    category = data["category"]
    if not isinstance(category, str):
        raise InvalidEvent("wrong_type", "category", "a string")
    if category not in settings.categories:
        raise InvalidEvent("unknown_category", "category", _echo(category, 64))

    template = data["template"]
    if not isinstance(template, str):
        raise InvalidEvent("wrong_type", "template", "a string")
    version = data.get("template_version", 1)
    if version is None:
        version = 1
    if not _is_int(version):
        raise InvalidEvent("wrong_type", "template_version", "an integer")
    if version < 1:
        raise InvalidEvent("bad_value", "template_version", "≥ 1")
    _no_forbidden(template, "template")
    if not _TEMPLATE_RE.fullmatch(template) or not renderer.has_template(template, version):
        raise InvalidEvent("unknown_template", "template", f"{_echo(template, 64)} v{version}")

    recipients_raw = data["recipients"]
    if not isinstance(recipients_raw, list):
        raise InvalidEvent("wrong_type", "recipients", "a list of user ids")
    recipients = list(dict.fromkeys(_id(r, "recipients") for r in recipients_raw))
    if not recipients:
        raise InvalidEvent("no_recipients", "recipients")
    if len(recipients) > settings.max_recipients:
        raise InvalidEvent("too_many_recipients", "recipients", f"{len(recipients)} > {settings.max_recipients}")

    params = data.get("params")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InvalidEvent("wrong_type", "params", "an object")
    if params_depth(params, settings.max_params_depth) > settings.max_params_depth:
        raise InvalidEvent("params_too_deep", "params", f"nesting > {settings.max_params_depth}")
    max_params = getattr(settings, "max_params_bytes", None)
    if max_params is not None and params:
        params_size = len(orjson.dumps(params))
        if params_size > max_params:
            raise InvalidEvent("params_too_large", "params", f"{params_size} bytes > {max_params} as JSON")

    channels = data.get("channels")
    if channels is not None:
        if not isinstance(channels, list) or not all(isinstance(c, str) for c in channels):
            raise InvalidEvent("wrong_type", "channels", "a list of channel names")
        if not channels:
            raise InvalidEvent("bad_value", "channels", "omit channels for the category's defaults")
        for c in channels:
            if c not in CHANNELS:
                raise InvalidEvent("unknown_channel", "channels", _echo(c, 32))
        channels = list(dict.fromkeys(channels))

    priority = data.get("priority")
    if priority is not None:
        if not isinstance(priority, str):
            raise InvalidEvent("wrong_type", "priority", "a string")
        if priority not in PRIORITIES:
            raise InvalidEvent("bad_priority", "priority", _echo(priority, 32))
        priority = capped(settings.categories[category], priority, any_allowed=priority_any)

    return Event(
        biz_key=biz_key,
        category=category,
        template=template,
        recipients=recipients,
        template_version=version,
        params=params,
        channels=channels,
        locale=_opt_locale(data),
        priority=priority,
        send_at=_send_at(data, settings, now),
        accepted_at=_opt_time(data, "accepted_at") or 0.0,
        producer=_opt_producer(data),
        callback_url=callback_url(data.get("callback_url")),
        v=v,
    )


def _send_at(data: Mapping[str, Any], settings: Any, now: Optional[float]) -> Optional[float]:
    """``send_at`` within its bounds (1e300 would be SCHEDULED forever)."""
    send_at = _opt_time(data, "send_at")
    if send_at is None:
        return None
    ref = time.time() if now is None else now
    ahead = float(getattr(settings, "max_send_ahead_s", 30 * 86400.0))
    if send_at > ref + ahead:
        raise InvalidEvent("bad_value", "send_at", f"at most {ahead:.0f} s (max_send_ahead_s) from now")
    past = float(getattr(settings, "max_send_past_s", 86400.0))
    if now is not None and send_at < now - past:
        raise InvalidEvent("bad_value", "send_at", f"at most {past:.0f} s (max_send_past_s) before now")
    return send_at


# --------------------------------------------------------------------------- preferences


def check_params(ev: Event, renderer: Any) -> None:
    """Raise ``missing_params`` when a template of the event's channels (all of its
    template's channels when it names none) cannot render with its params in its
    locale: every variable missing, and the template, channel and locale, named.
    (A template changed after acceptance still fails later, as ``template_error``
    with the variable in the record's reason.)"""
    channels = ev.channels or renderer.channels_for(ev.template, ev.template_version)
    problems = []
    for channel in channels:
        missing = renderer.missing_variables(ev.template, ev.template_version, channel, ev.locale, ev.params)
        if missing:
            name, names = missing
            problems.append(f"{name} ({channel}, {ev.locale or 'default locale'}) needs {', '.join(names)}")
    if problems:
        raise InvalidEvent("missing_params", "params", "; ".join(problems))


#: quiet windows a channel may hold
MAX_CHANNEL_WINDOWS = 8


def _channel_quiet_hours(value: Any) -> dict[str, list[str]]:
    """``{"push": ["22:00-07:00", "12:00-13:00"], "sms": []}``: each channel's own
    quiet windows (``[]``: never quiet, whatever ``quiet_hours`` says)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidEvent("wrong_type", "channel_quiet_hours", 'an object like {"push": ["22:00-07:00"]}')
    out: dict[str, list[str]] = {}
    for chan, windows in value.items():
        field = f"channel_quiet_hours.{chan}"
        if not isinstance(chan, str) or chan not in CHANNELS:
            raise InvalidEvent("unknown_channel", "channel_quiet_hours", str(chan)[:32])
        if not isinstance(windows, list) or not all(isinstance(w, str) for w in windows):
            raise InvalidEvent("wrong_type", field, "a list of 'HH:MM-HH:MM' windows")
        if len(windows) > MAX_CHANNEL_WINDOWS:
            raise InvalidEvent("bad_quiet_hours", field, f"at most {MAX_CHANNEL_WINDOWS} windows")
        for w in windows:
            try:
                parse_quiet_hours(w)
            except ValueError as exc:
                raise InvalidEvent("bad_quiet_hours", field, str(exc)) from None
        out[chan] = list(dict.fromkeys(w.replace(" ", "") for w in windows))
    return out


def parse_preferences(raw: Mapping[str, Any], settings: Any = None) -> Preferences:
    """Validate a preferences document (switches, quiet hours, zone, addresses). With
    ``settings``, switch categories must be known ones. Raises :class:`InvalidEvent`."""
    if not isinstance(raw, Mapping):
        raise InvalidEvent("not_an_object", None, type(raw).__name__)
    v = _check_version(raw)
    if raw.get("user_id") is None:
        raise InvalidEvent("missing_field", "user_id")
    user_id = _id(raw["user_id"], "user_id")

    version = raw.get("version", 0)
    if not _is_int(version):
        raise InvalidEvent("wrong_type", "version", "an integer")
    if version < 0:
        raise InvalidEvent("bad_value", "version", "≥ 0")

    switches = raw.get("switches")
    switches = {} if switches is None else switches
    if not isinstance(switches, Mapping):
        raise InvalidEvent("wrong_type", "switches", 'an object like {"marketing.sms": false}')
    clean: dict[str, bool] = {}
    for key, on in switches.items():
        field = f"switches.{key}"
        if not isinstance(key, str):
            raise InvalidEvent("wrong_type", "switches", "string keys")
        cat, dot, chan = key.partition(".")
        if not dot or "." in chan:
            raise InvalidEvent("bad_value", field, "keys look like '<category>.<channel>' ('*' for any)")
        if cat != "*":
            if not _NAME_RE.fullmatch(cat):
                raise InvalidEvent("bad_value", field, "category names are a-z, 0-9, _")
            if settings is not None and cat not in settings.categories:
                raise InvalidEvent("unknown_category", field, cat)
        if chan != "*" and chan not in CHANNELS:
            raise InvalidEvent("unknown_channel", field, chan[:32])
        if not isinstance(on, bool):
            raise InvalidEvent("wrong_type", field, "true or false")
        clean[key] = on

    quiet = raw.get("quiet_hours") or None
    if quiet is not None:
        if not isinstance(quiet, str):
            raise InvalidEvent("wrong_type", "quiet_hours", "a string like '22:00-07:00'")
        try:
            parse_quiet_hours(quiet)
        except ValueError as exc:
            raise InvalidEvent("bad_quiet_hours", "quiet_hours", str(exc)) from None
        quiet = quiet.replace(" ", "")
    per_channel = _channel_quiet_hours(raw.get("channel_quiet_hours"))

    tz = raw.get("tz")
    tz = "UTC" if tz is None else tz
    if not isinstance(tz, str):
        raise InvalidEvent("wrong_type", "tz", "an IANA zone name")
    try:
        load_zone(tz)
    except ValueError as exc:
        raise InvalidEvent("bad_timezone", "tz", str(exc)) from None

    source = raw.get("source")
    source = "stream" if source is None or source == "" else source
    if not isinstance(source, str) or not _SOURCE_RE.fullmatch(source):
        raise InvalidEvent("bad_value", "source", "stream, api, one_click, provider:<name> (a-z, 0-9, _, then :name)")
    merge = raw.get("merge", False)
    if not isinstance(merge, bool):
        raise InvalidEvent("wrong_type", "merge", "true or false")

    return Preferences(
        user_id=user_id,
        version=version,
        switches=clean,
        quiet_hours=quiet,
        channel_quiet_hours=per_channel,
        tz=tz,
        phone=_phone(raw.get("phone")),
        email=_email(raw.get("email")),
        webhook_url=_webhook(raw.get("webhook_url")),
        locale=_opt_locale(raw),
        source=source,
        producer=_opt_producer(raw),
        merge=merge,
        v=v,
    )


#: where a preferences update comes from (Preferences.source)
_SOURCE_RE = re.compile(r"[a-z][a-z0-9_]{0,31}(:[A-Za-z0-9_.-]{1,64})?")


def _opt_str(value: Any, field: str) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidEvent("wrong_type", field, "a string")
    return value.strip() or None


def _address_str(value: Any, field: str) -> Optional[str]:
    """An address field as text: None when absent or blank; a control character
    anywhere (a line break, a NUL, a tab …) is refused, before any trimming."""
    if isinstance(value, str) and _CONTROL_RE.search(value):
        raise InvalidEvent("bad_value", field, "no control characters (line breaks, NUL, tabs)")
    return _opt_str(value, field)


def _phone(value: Any) -> Optional[str]:
    s = _address_str(value, "phone")
    if s is None:
        return None
    s = _PHONE_STRIP_RE.sub("", s)
    if not address_ok("sms", s):
        raise InvalidEvent("bad_value", "phone", "6 to 15 digits, optionally starting with +")
    return s


def _email(value: Any) -> Optional[str]:
    s = _address_str(value, "email")
    if s is None:
        return None
    if not address_ok("email", s):
        raise InvalidEvent("bad_value", "email", "an address like name@example.com")
    return s


def _webhook_ok(s: str) -> bool:
    """An http(s) URL with a host (a host name, IDNA-encodable, or an address) and
    a valid port, at most 2048 characters, with no whitespace or control character
    anywhere (a receiver's URL never has one: a space is %20)."""
    if len(s) > 2048 or _CONTROL_RE.search(s) or any(c.isspace() for c in s):
        return False
    try:
        parts = urlsplit(s)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return False
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
        host = parts.hostname
        if ":" not in host:
            host.rstrip(".").encode("idna")
    except (ValueError, UnicodeError):
        return False
    return True


def callback_url(value: Any, field: str = "callback_url") -> Optional[str]:
    """A producer's status callback URL (an event's ``callback_url``, an API key's
    default): None when absent or ""; an http(s) URL as for a webhook (:func:`_webhook_ok`:
    host, port, at most 2048 characters, no whitespace nor control character,
    checked before any trimming), no format or separator character either (a
    bidi override would disguise it in a log), no credentials in it (a secret
    does not belong in a URL that is logged and stored; the POST is signed)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidEvent("wrong_type", field, "a string")
    if not _webhook_ok(value) or id_problem(value) is not None:
        raise InvalidEvent("bad_value", field, "an http(s) URL, without spaces or control characters")
    if urlsplit(value).username is not None or "@" in urlsplit(value).netloc:
        raise InvalidEvent("bad_value", field, "no credentials in the URL (the callbacks are signed)")
    return value


def _webhook(value: Any) -> Optional[str]:
    s = _address_str(value, "webhook_url")
    if s is None:
        return None
    if not _webhook_ok(s):
        raise InvalidEvent("bad_value", "webhook_url", "an http(s) URL, without spaces or control characters")
    return s


# --------------------------------------------------------------------------- devices, receipts


def _finite(data: Mapping[str, Any], field: str, default: float) -> float:
    value = data.get(field)
    if value is None:
        return default
    if not _is_number(value):
        raise InvalidEvent("wrong_type", field, "a finite number")
    if value < 0:
        raise InvalidEvent("bad_value", field, "≥ 0")
    return float(value)


def _choice(data: Mapping[str, Any], field: str, choices: tuple[str, ...], default: Optional[str] = None) -> str:
    value = data.get(field)
    if value is None:
        if default is None:
            raise InvalidEvent("missing_field", field)
        return default
    if not isinstance(value, str):
        raise InvalidEvent("wrong_type", field, "a string")
    if value not in choices:
        raise InvalidEvent("bad_value", field, " or ".join(choices))
    return value


def parse_device_update(raw: Mapping[str, Any]) -> DeviceUpdate:
    """Validate an add/remove of one push token (``notify.devices``). Raises
    :class:`InvalidEvent`."""
    if not isinstance(raw, Mapping):
        raise InvalidEvent("not_an_object", None, type(raw).__name__)
    v = _check_version(raw)
    for field in ("user_id", "token"):
        if raw.get(field) is None:
            raise InvalidEvent("missing_field", field)
    user_id = _id(raw["user_id"], "user_id")
    token = raw["token"]
    if not isinstance(token, str):
        raise InvalidEvent("wrong_type", "token", "a string")
    if not TOKEN_RE.fullmatch(token):
        raise InvalidEvent("bad_value", "token", "1..512 of A-Z a-z 0-9 : _ . -")
    return DeviceUpdate(
        user_id=user_id,
        token=token,
        platform=_choice(raw, "platform", PUSH_PLATFORMS, "apns"),
        op=_choice(raw, "op", ("add", "remove"), "add"),
        at=_finite(raw, "at", 0.0),
        v=v,
    )


def parse_receipt(raw: Mapping[str, Any]) -> Receipt:
    """Validate a delivery receipt (``notify.receipts``; the API writes them after
    checking the provider's signature). Raises :class:`InvalidEvent`."""
    if not isinstance(raw, Mapping):
        raise InvalidEvent("not_an_object", None, type(raw).__name__)
    v = _check_version(raw)
    for field in ("provider", "provider_msg_id", "status"):
        if raw.get(field) is None:
            raise InvalidEvent("missing_field", field)
    provider = raw["provider"]
    if not isinstance(provider, str):
        raise InvalidEvent("wrong_type", "provider", "a string")
    if not _NAME_RE.fullmatch(provider):
        raise InvalidEvent("bad_value", "provider", "a provider name (a-z, 0-9, _)")
    msg_id = _str_field(raw, "provider_msg_id", MAX_PROVIDER_MSG_ID)
    status = _choice(raw, "status", ("DELIVERED", "UNDELIVERED"))
    error = raw.get("error")
    if error is not None:
        if not isinstance(error, str):
            raise InvalidEvent("wrong_type", "error", "a string")
        if len(error) > 1000:
            raise InvalidEvent("bad_value", "error", "at most 1000 characters")
    at = _finite(raw, "at", 0.0)
    if at >= MAX_TIME:  # the year 2286: a receipt in milliseconds, or a forgery; the store refuses it
        raise InvalidEvent("bad_value", "at", "a unix time in seconds")
    opt_out = raw.get("opt_out", False)
    if not isinstance(opt_out, bool):
        raise InvalidEvent("wrong_type", "opt_out", "true or false")
    return Receipt(provider=provider, provider_msg_id=msg_id, status=status, at=at, error=error, opt_out=opt_out,
                   v=v)


def address_ok(channel: str, address: str) -> bool:
    """Whether ``address`` has the form of an address on ``channel`` (a phone
    number, an e-mail address, ``apns:``/``fcm:``/``hms:`` + token, an http(s) URL; the
    inbox needs none). Nothing with a line break or a control character passes
    (the whole value is matched: ``fullmatch``, never ``match`` with ``$``, which
    lets a trailing newline through), so no address can inject a header or a
    protocol line. The same check decides at the door (the API's PUTs, the users'
    topics: :func:`parse_preferences`) and at the send (adapters/dispatch.py:
    an address that fails it is FAILED ``bad_address``, never retried)."""
    if not isinstance(address, str) or _CONTROL_RE.search(address):
        return False
    if channel == "sms":
        return bool(_PHONE_RE.fullmatch(address))
    if channel == "email":
        return len(address) <= 254 and bool(_EMAIL_RE.fullmatch(address))
    if channel == "push":
        platform, _, token = address.partition(":")
        return platform in PUSH_PLATFORMS and bool(TOKEN_RE.fullmatch(token))
    if channel == "webhook":
        return _webhook_ok(address)
    return True
