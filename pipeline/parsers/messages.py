"""The pipeline's own records read back from a stream (Intent, Delivery, Outcome,
Timer): a decoded JSON object → the typed record, or :class:`InvalidEvent`.

Agents write these records, but anything may write to a stream, so an agent
never trusts what it reads: every field must have its declared type
(``str``, ``int``, finite ``float``, ``bool``, ``Optional[...]``, ``list[...]``,
``dict[str, ...]``, a nested record), required fields must be present, unknown
fields are ignored, and the values the agents look things up by must be known
ones (channel, priority, state, timer kind). Reasons are those of
:mod:`.validate`: missing_field, wrong_type, bad_value, unknown_version,
params_too_deep.

Rule: pure functions; raise :class:`InvalidEvent` and nothing else.
"""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Mapping  # (isinstance with typing's alias is a few Python calls)
from typing import Any, Callable

from config.settings import CHANNELS, PRIORITIES
from pipeline.models import SCHEMA_VERSION, Delivery, Intent, Outcome, Receipt, State, Timer

from .events import InvalidEvent, params_depth

__all__ = ["check_record", "parse_intent", "parse_delivery", "parse_outcome", "parse_timer", "TIMER_KINDS"]

#: what the scheduler does with a timer: its kind decides what its payload must be
TIMER_KINDS = ("intent", "delivery", "poll", "receipt", "fire")
#: ids and names that end up in protocol headers (e-mail Message-ID, X-Notify-*)
_ID_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")
#: the parts templates render (pipeline/templates.py): always text
_TEXT_PARTS = ("title", "body", "subject", "text", "html")
_CATEGORY_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

_Check = Callable[[Any, str], Any]
_MISSING = object()


def _fail(field: str, expected: str) -> InvalidEvent:
    return InvalidEvent("wrong_type", field, expected)


def _check_str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise _fail(field, "a string")
    return value


def _check_int(value: Any, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _fail(field, "an integer")
    return value


def _check_float(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(field, "a finite number")
    return float(value)


def _check_bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(field, "true or false")
    return value


def _check_any(value: Any, field: str) -> Any:
    return value


def _checker(tp: Any) -> _Check:
    """A function checking one value against the annotation ``tp``."""
    if tp is str:
        return _check_str
    if tp is int:
        return _check_int
    if tp is float:
        return _check_float
    if tp is bool:
        return _check_bool
    if tp is Any:
        return _check_any
    if isinstance(tp, type) and hasattr(tp, "_options"):  # a nested faust.Record
        return lambda value, field: check_record(tp, value, field + ".")
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"unsupported annotation {tp!r}")
        check = _checker(inner[0])
        return lambda value, field: None if value is None else check(value, field)
    if origin is list:
        item = _checker(args[0]) if args else _check_any

        def check_list(value: Any, field: str) -> list:
            if not isinstance(value, list):
                raise _fail(field, "a list")
            return [item(x, f"{field}[{i}]") for i, x in enumerate(value)]

        return check_list
    if origin is dict:
        item = _checker(args[1]) if args else _check_any

        def check_dict(value: Any, field: str) -> dict:
            if not isinstance(value, dict):
                raise _fail(field, "an object")
            return {k: item(v, f"{field}.{k}") for k, v in value.items()}

        return check_dict
    raise TypeError(f"unsupported annotation {tp!r}")


#: the check of one scalar annotation, inline in a model's compiled checks: the test
#: that refuses ``x`` (the common exact type first, without a call), what the error
#: says was expected
_INLINE: dict[Any, tuple[str, str]] = {
    str: ("type(x) is not str and not isinstance(x, str)", "a string"),
    int: ("type(x) is not int and (not isinstance(x, int) or isinstance(x, bool))", "an integer"),
    bool: ("x is not True and x is not False", "true or false"),
}

_FIELDS: dict[type, Callable[[Mapping, str], dict]] = {}


def _scalar(tp: Any) -> tuple[Any, bool]:
    """(the scalar type, None allowed) of an annotation checked inline, or (None, False)."""
    if tp in _INLINE or tp is float:
        return tp, False
    if typing.get_origin(tp) is typing.Union:
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) == 1 and (inner[0] in _INLINE or inner[0] is float):
            return inner[0], True
    return None, False


def _fields(model: type) -> Callable[[Mapping, str], dict]:
    """``model``'s field checks compiled into one function: ``(data, prefix)`` → the
    keyword arguments of the record, or :class:`InvalidEvent`.

    The same checks as calling ``_checker(annotation)`` on each field in turn (a
    decoded intent or delivery has ~20 fields: one Python call each, and ~100 calls a
    record), with the scalar ones (str, int, float, bool, and their Optional) written
    out inline; lists, dicts and nested records still call their checker.
    tests/pipeline/test_record_checks.py holds it to that field-by-field reading."""
    fn = _FIELDS.get(model)
    if fn is not None:
        return fn
    opts = model._options  # type: ignore[attr-defined]
    scope: dict[str, Any] = {"_M": _MISSING, "InvalidEvent": InvalidEvent, "_fail": _fail, "float": float}
    lines = ["def fields(data, prefix):", "    g = data.get", "    kw = {}"]
    for n, (name, tp) in enumerate(opts.fields.items()):
        required = name not in opts.defaults
        lines.append(f"    x = g({name!r}, _M)")
        if required:
            lines += ["    if x is _M or x is None:",
                      f"        raise InvalidEvent('missing_field', prefix + {name!r})"]
            ind = "    "
        else:
            lines.append("    if x is not _M:")
            ind = "        "
        scalar, nullable = _scalar(tp)
        if scalar is None:
            scope[f"_c{n}"] = _checker(tp)
            lines.append(f"{ind}kw[{name!r}] = _c{n}(x, prefix + {name!r})")
            continue
        guard = "x is not None and " if nullable and not required else ""
        if scalar is float:
            # _check_float: a finite int or float (not bool), as a float; x - x is 0.0
            # for a finite float, nan for inf and nan
            lines += [f"{ind}if {guard}type(x) is float:",
                      f"{ind}    if x - x != 0.0:",
                      f"{ind}        raise _fail(prefix + {name!r}, 'a finite number')",
                      f"{ind}elif {guard}(isinstance(x, bool) or not isinstance(x, (int, float)) or x - x != 0):",
                      f"{ind}    raise _fail(prefix + {name!r}, 'a finite number')",
                      f"{ind}elif x is not None:",
                      f"{ind}    x = float(x)"]
        else:
            test, expected = _INLINE[scalar]
            lines += [f"{ind}if {guard}{test}:",
                      f"{ind}    raise _fail(prefix + {name!r}, {expected!r})"]
        lines.append(f"{ind}kw[{name!r}] = x")
    lines.append("    return kw")
    exec(compile("\n".join(lines) + "\n", f"<checks {model.__name__}>", "exec"), scope)  # noqa: S102 - our own fields
    fn = _FIELDS[model] = scope["fields"]
    return fn


def check_record(model: type, data: Any, prefix: str = "") -> Any:
    """``data`` (a decoded JSON object) as a ``model`` record, every field checked
    against its annotation; unknown fields are dropped."""
    if not isinstance(data, Mapping):
        if prefix:
            raise _fail(prefix.rstrip("."), "an object")
        raise InvalidEvent("not_an_object", None, type(data).__name__)
    v = data.get("v", SCHEMA_VERSION)  # first: a newer record may have other fields
    if not isinstance(v, int) or isinstance(v, bool):
        raise _fail(prefix + "v", "an integer")
    if v < 1 or v > SCHEMA_VERSION:
        raise InvalidEvent("unknown_version", prefix + "v", f"this build reads v1..v{SCHEMA_VERSION}, got {v}")
    return model(**_fields(model)(data, prefix))


# --------------------------------------------------------------------------- what agents look up


def _one_of(value: Any, choices: tuple[str, ...] | list[str], field: str) -> None:
    if value not in choices:
        raise InvalidEvent("bad_value", field, " | ".join(choices))


def _nonempty(value: str, field: str) -> None:
    if not value.strip():
        raise InvalidEvent("bad_value", field, "not empty")


def _not_negative(value: float, field: str) -> None:
    if value < 0:
        raise InvalidEvent("bad_value", field, "≥ 0")


def parse_intent(data: Any, max_params_depth: int = 8, prefix: str = "", categories: Any = None) -> Intent:
    """``categories``: the configured ones (the guard looks the intent's up)."""
    i: Intent = check_record(Intent, data, prefix)
    _nonempty(i.user_id, prefix + "user_id")
    _nonempty(i.biz_key, prefix + "biz_key")
    _one_of(i.priority, PRIORITIES, prefix + "priority")
    if categories is not None and i.category not in categories:
        raise InvalidEvent("unknown_category", prefix + "category", i.category[:64])
    for n, c in enumerate(i.channels or ()):
        _one_of(c, CHANNELS, f"{prefix}channels[{n}]")
    if i.template_version < 1:
        raise InvalidEvent("bad_value", prefix + "template_version", "≥ 1")
    if params_depth(i.params, max_params_depth) > max_params_depth:
        raise InvalidEvent("params_too_deep", prefix + "params", f"nesting > {max_params_depth}")
    return i


def parse_delivery(data: Any, prefix: str = "") -> Delivery:
    d: Delivery = check_record(Delivery, data, prefix)
    if not _ID_RE.match(d.delivery_id):
        raise InvalidEvent("bad_value", prefix + "delivery_id", "1..200 of A-Z a-z 0-9 _ . : -")
    _nonempty(d.user_id, prefix + "user_id")
    _one_of(d.channel, CHANNELS, prefix + "channel")
    _one_of(d.priority, PRIORITIES, prefix + "priority")
    if not _CATEGORY_RE.match(d.category):
        raise InvalidEvent("bad_value", prefix + "category", "a category name (a-z, 0-9, _)")
    # the address is checked at the send (adapters/dispatch.py, address_ok): one that
    # is not an address of its channel ends FAILED ``bad_address`` there, with its
    # record, instead of a dead letter here that would leave the record PENDING
    for part in _TEXT_PARTS:
        if part in d.content and not isinstance(d.content[part], str):
            raise InvalidEvent("wrong_type", f"{prefix}content.{part}", "rendered text")
    _not_negative(d.attempt, prefix + "attempt")
    _not_negative(d.reconcile_round, prefix + "reconcile_round")
    _not_negative(d.replay, prefix + "replay")
    _not_negative(d.devices, prefix + "devices")
    return d


def parse_outcome(data: Any) -> Outcome:
    o: Outcome = check_record(Outcome, data)
    _nonempty(o.delivery_id, "delivery_id")
    _one_of(o.state, State.ALL, "state")
    return o


def _payload_field(payload: Mapping[str, Any], name: str) -> Any:
    if payload.get(name) is None:
        raise InvalidEvent("missing_field", f"payload.{name}")
    return payload[name]


def parse_timer(data: Any, max_params_depth: int = 8, categories: Any = None) -> Timer:
    """A timer whose payload is what its kind needs when it fires, normalised (the
    records in it hold exactly their model's fields, so the scheduler can rebuild
    them with ``Model(**payload)``)."""
    t: Timer = check_record(Timer, data)
    _one_of(t.kind, TIMER_KINDS, "kind")
    _nonempty(t.timer_id, "timer_id")
    p = t.payload
    user = p.get("user_id")
    if user is not None:
        _check_str(user, "payload.user_id")
    if t.kind == "intent":
        payload = parse_intent(p, max_params_depth, "payload.", categories).asdict()
    elif t.kind == "delivery":
        payload = parse_delivery(p, "payload.").asdict()
    elif t.kind == "poll":
        d = parse_delivery(_payload_field(p, "delivery"), "payload.delivery.")
        provider = _check_str(_payload_field(p, "provider"), "payload.provider")
        payload = {**p, "delivery": d.asdict(), "provider": provider}
    elif t.kind == "receipt":
        r: Receipt = check_record(Receipt, _payload_field(p, "receipt"), "payload.receipt.")
        _nonempty(r.provider_msg_id, "payload.receipt.provider_msg_id")
        tries = _check_int(_payload_field(p, "tries"), "payload.tries")
        _not_negative(tries, "payload.tries")
        payload = {**p, "receipt": r.asdict(), "tries": tries}
    else:
        return t
    return Timer(timer_id=t.timer_id, due_at=t.due_at, kind=t.kind, payload=payload, v=t.v)
