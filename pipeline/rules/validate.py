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
from typing import Any, Mapping, Optional
from urllib.parse import urlsplit

import orjson

from config.settings import CHANNELS, PRIORITIES
from pipeline.models import SCHEMA_VERSION, DeviceUpdate, Event, Preferences, Receipt

from .quiet_hours import load_zone, parse_quiet_hours

__all__ = ["InvalidEvent", "check_params", "MAX_BIZ_KEY", "MAX_ID", "MAX_PROVIDER_MSG_ID", "TOKEN_RE", "parse_event",
           "parse_preferences", "parse_device_update", "parse_receipt", "params_depth", "address_ok"]

#: seed 000: ``biz_key VARCHAR(64)``
MAX_BIZ_KEY = 64
#: longest user id / recipient we accept
MAX_ID = 128
#: longest provider message id a receipt may carry
MAX_PROVIDER_MSG_ID = 256
#: a push device token (APNs hex, FCM base64url with ':' and '-')
TOKEN_RE = re.compile(r"^[A-Za-z0-9:_.\-]{1,512}$")

_LOCALE_RE = re.compile(r"^[A-Za-z]{2,8}(?:[-_][A-Za-z0-9]{1,8})*$")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_TEMPLATE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_PHONE_STRIP_RE = re.compile(r"[\s().-]")
_PHONE_RE = re.compile(r"^\+?[0-9]{6,15}$")
_EMAIL_RE = re.compile(r"^[^@\s]{1,64}@[^@\s]+\.[^@\s]+$")


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


def _str_field(data: Mapping[str, Any], field: str, max_len: int) -> str:
    value = data[field]
    if not isinstance(value, str):
        raise InvalidEvent("wrong_type", field, "a string")
    if not value.strip() or len(value) > max_len:
        raise InvalidEvent("bad_value", field, f"1..{max_len} characters")
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
    return s


def _opt_locale(data: Mapping[str, Any], field: str = "locale") -> Optional[str]:
    value = data.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidEvent("wrong_type", field, "a string")
    if not _LOCALE_RE.match(value):
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


def parse_event(raw: bytes | bytearray | memoryview | str, settings: Any, renderer: Any) -> Event:
    """Validate one producer message; ``renderer.has_template(code, version)`` decides
    whether the template exists. Raises :class:`InvalidEvent` and nothing else."""
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
        raise InvalidEvent("unknown_category", "category", category[:64])

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
    if not _TEMPLATE_RE.match(template) or not renderer.has_template(template, version):
        raise InvalidEvent("unknown_template", "template", f"{template[:64]} v{version}")

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
                raise InvalidEvent("unknown_channel", "channels", c[:32])
        channels = list(dict.fromkeys(channels))

    priority = data.get("priority")
    if priority is not None:
        if not isinstance(priority, str):
            raise InvalidEvent("wrong_type", "priority", "a string")
        if priority not in PRIORITIES:
            raise InvalidEvent("bad_priority", "priority", priority[:32])

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
        send_at=_opt_time(data, "send_at"),
        accepted_at=_opt_time(data, "accepted_at") or 0.0,
        v=v,
    )


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
            if not _NAME_RE.match(cat):
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

    tz = raw.get("tz")
    tz = "UTC" if tz is None else tz
    if not isinstance(tz, str):
        raise InvalidEvent("wrong_type", "tz", "an IANA zone name")
    try:
        load_zone(tz)
    except ValueError as exc:
        raise InvalidEvent("bad_timezone", "tz", str(exc)) from None

    return Preferences(
        user_id=user_id,
        version=version,
        switches=clean,
        quiet_hours=quiet,
        tz=tz,
        phone=_phone(raw.get("phone")),
        email=_email(raw.get("email")),
        webhook_url=_webhook(raw.get("webhook_url")),
        locale=_opt_locale(raw),
        v=v,
    )


def _opt_str(value: Any, field: str) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidEvent("wrong_type", field, "a string")
    return value.strip() or None


def _phone(value: Any) -> Optional[str]:
    s = _opt_str(value, "phone")
    if s is None:
        return None
    s = _PHONE_STRIP_RE.sub("", s)
    if not _PHONE_RE.match(s):
        raise InvalidEvent("bad_value", "phone", "6 to 15 digits, optionally starting with +")
    return s


def _email(value: Any) -> Optional[str]:
    s = _opt_str(value, "email")
    if s is None:
        return None
    if len(s) > 254 or not _EMAIL_RE.match(s):
        raise InvalidEvent("bad_value", "email", "an address like name@example.com")
    return s


def _webhook(value: Any) -> Optional[str]:
    s = _opt_str(value, "webhook_url")
    if s is None:
        return None
    try:
        parts = urlsplit(s)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and len(s) <= 2048
    except ValueError:
        ok = False
    if not ok:
        raise InvalidEvent("bad_value", "webhook_url", "an http(s) URL")
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
    if not TOKEN_RE.match(token):
        raise InvalidEvent("bad_value", "token", "1..512 of A-Z a-z 0-9 : _ . -")
    return DeviceUpdate(
        user_id=user_id,
        token=token,
        platform=_choice(raw, "platform", ("apns", "fcm"), "apns"),
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
    if not _NAME_RE.match(provider):
        raise InvalidEvent("bad_value", "provider", "a provider name (a-z, 0-9, _)")
    msg_id = _str_field(raw, "provider_msg_id", MAX_PROVIDER_MSG_ID)
    status = _choice(raw, "status", ("DELIVERED", "UNDELIVERED"))
    error = raw.get("error")
    if error is not None:
        if not isinstance(error, str):
            raise InvalidEvent("wrong_type", "error", "a string")
        if len(error) > 1000:
            raise InvalidEvent("bad_value", "error", "at most 1000 characters")
    return Receipt(provider=provider, provider_msg_id=msg_id, status=status, at=_finite(raw, "at", 0.0),
                   error=error, v=v)


def address_ok(channel: str, address: str) -> bool:
    """Whether ``address`` has the form of an address on ``channel`` (a phone
    number, an e-mail address, ``apns:``/``fcm:`` + token, an http(s) URL; the
    inbox needs none). Nothing with a line break or a control character passes, so
    no address can inject a header or a protocol line."""
    if not isinstance(address, str):
        return False
    if channel == "sms":
        return bool(_PHONE_RE.match(address))
    if channel == "email":
        return len(address) <= 254 and bool(_EMAIL_RE.match(address))
    if channel == "push":
        platform, _, token = address.partition(":")
        return platform in ("apns", "fcm") and bool(TOKEN_RE.match(token))
    if channel == "webhook":
        if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in address):
            return False
        try:
            return _webhook(address) is not None
        except InvalidEvent:
            return False
    return True
