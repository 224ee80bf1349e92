"""Checked topics: every stream entry an agent reads is decoded and validated
before the agent sees it; a bad one goes to ``notify.dlq`` with the reason and
the agent goes on with the next.

Faust's own decoding raises inside the agent's stream on a bad entry, which
crashes the agent (its supervisor restarts it, the entry is gone without a
trace, and entries read meanwhile may be lost). Here the topic's schema runs
:func:`decode` (JSON → the model's checks in :mod:`pipeline.rules`), and a
failure is acknowledged and dead-lettered by :class:`CheckedTopic` instead.

What is checked, per model: the size (``oversized``), JSON (``bad_json``,
``not_an_object``, ``empty`` for an entry without a value), the schema version
and every field (the reasons of :mod:`pipeline.rules.validate`), and for the
topics keyed by user, that the key is the record's ``user_id`` (``wrong_key``:
a user's tables live in the partition of their id). A key that is not UTF-8 is
``bad_key``.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

import faust
import orjson
from faust.exceptions import ValueDecodeError

from pipeline import metrics
from pipeline.models import DeadLetter, Delivery, DeviceUpdate, Intent, Outcome, Preferences, Receipt, Timer
from pipeline.rules import records
from pipeline.rules.validate import InvalidEvent, parse_device_update, parse_preferences, parse_receipt

__all__ = ["BadEntry", "CheckedSchema", "CheckedTopic", "checked_topic", "decode", "dead_letter", "entry_limit",
           "parser_for", "USER_KEYED_MODELS"]

log = logging.getLogger("notify.entries")

#: models whose topic is keyed by the record's user_id
USER_KEYED_MODELS = (Intent, Delivery, Preferences, DeviceUpdate)


def entry_limit(settings: Any) -> int:
    """Largest entry an agent reads (an event's limit leaves room for what the
    pipeline adds: rendered content, a delivery inside a timer)."""
    return max(1 << 20, 4 * settings.max_event_bytes)


def parser_for(model: type, settings: Any) -> Callable[[Any], Any]:
    """The checks of ``model``'s records (decoded JSON → record or InvalidEvent)."""
    depth = settings.max_params_depth
    parsers: dict[type, Callable[[Any], Any]] = {
        Intent: lambda d: records.parse_intent(d, depth, categories=settings.categories),
        Delivery: records.parse_delivery,
        Outcome: records.parse_outcome,
        Timer: lambda d: records.parse_timer(d, depth, settings.categories),
        Preferences: lambda d: parse_preferences(d, settings),
        DeviceUpdate: parse_device_update,
        Receipt: parse_receipt,
    }
    try:
        return parsers[model]
    except KeyError:
        raise TypeError(f"no checks for {model!r}") from None


def decode(model: type, value: Optional[bytes], key: Optional[bytes], settings: Any,
           parse: Optional[Callable[[Any], Any]] = None) -> Any:
    """One entry's value (and key) → a ``model`` record, or :class:`InvalidEvent`
    (``parse``: :func:`parser_for` of the model, computed once by the caller)."""
    if value is None:
        raise InvalidEvent("empty", None, "an entry without a value")
    limit = entry_limit(settings)
    if len(value) > limit:
        raise InvalidEvent("oversized", None, f"{len(value)} bytes > {limit}")
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise InvalidEvent("bad_json", None, str(exc)[:200]) from None
    record = (parse or parser_for(model, settings))(data)
    if model in USER_KEYED_MODELS:
        want = record.user_id
        if key is None or key.decode("utf-8", "replace") != want:
            raise InvalidEvent("wrong_key", None, "the key of this topic is the record's user_id")
    return record


class BadEntry(ValueDecodeError):
    """An entry :func:`decode` refused (carries the reason)."""

    def __init__(self, err: InvalidEvent) -> None:
        super().__init__(str(err))
        self.reason = err.reason
        self.detail = str(err)


class CheckedSchema(faust.Schema):
    """``value_type`` decoded by :func:`decode` (keys stay Faust's: UTF-8 text)."""

    def __init__(self, *, settings: Any, dlq: Any = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.settings = settings
        self.dlq = dlq
        self._parse = parser_for(self.value_type, settings)

    def loads_value(self, app: Any, message: Any, *, loads: Any = None, serializer: Any = None) -> Any:
        try:
            return decode(self.value_type, message.value, message.key, self.settings, self._parse)
        except InvalidEvent as exc:
            raise BadEntry(exc) from None


def _text(raw: Any) -> str:
    if raw is None:
        return ""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return bytes(raw).decode("utf-8", "replace")
    return str(raw)


def dead_letter(source: str, reason: str, payload: Any, *, detail: Optional[str] = None,
                key: Optional[str] = None) -> DeadLetter:
    """The DLQ record of something that could not be processed (the payload is
    kept as text, cut to 64 KiB; the key to 256 characters)."""
    return DeadLetter(source=source, reason=reason, at=time.time(), payload=_text(payload)[:65536],
                      detail=detail[:1000] if detail else detail, key=key[:256] if key else key)


class CheckedTopic(faust.Topic):
    """A topic whose undecodable or invalid entries are acknowledged and sent to
    the schema's ``dlq`` topic (source: this topic's name) instead of crashing
    the agent that reads it."""

    async def on_key_decode_error(self, exc: Exception, message: Any) -> None:
        await self._dead_letter("bad_key", f"bad_key ({exc})", message)

    async def on_value_decode_error(self, exc: Exception, message: Any) -> None:
        await self._dead_letter(getattr(exc, "reason", "undecodable"), getattr(exc, "detail", str(exc)), message)

    async def _dead_letter(self, reason: str, detail: str, message: Any) -> None:
        source = message.topic
        key = _text(message.key) or None
        metrics.dead_letters.labels(source, reason).inc()
        log.warning("dead letter from %s[%s]@%s: %s", source, message.partition, message.offset, detail)
        dlq = getattr(self.schema, "dlq", None)
        if dlq is None:
            return
        try:
            letter = dead_letter(source, reason, message.value, detail=detail, key=key)
            await dlq.send(key=(key or source)[:256], value=letter)
        except Exception:  # noqa: BLE001 - never crash the consumer over a bad entry
            log.exception("could not dead-letter a bad %s entry", source)


def checked_topic(app: Any, name: str, model: type, *, settings: Any, dlq: Any) -> CheckedTopic:
    """``app.topic(name, key_type=str, value_type=model)`` with checked entries."""
    return CheckedTopic(app, topics=[name], schema=CheckedSchema(key_type=str, value_type=model, settings=settings,
                                                                 dlq=dlq))

