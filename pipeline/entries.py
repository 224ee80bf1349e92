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
and every field (the reasons of :mod:`pipeline.parsers.events`), and for the
topics keyed by user, that the key is the record's ``user_id`` (``wrong_key``:
a user's tables live in the partition of their id). A key that is not UTF-8 is
``bad_key``. An entry whose transport fields could not be decoded (a timestamp
that is not a number, a header name that is not UTF-8) is ``malformed_entry``,
refused before anything else is decoded (:class:`GuardedSchema`, every topic an
agent reads, the raw event topics included).

Every dead letter says where the entry was: topic (``source``), partition and
offset. What an agent raises while handling one entry is contained the same way
(:func:`contained`): that entry is dead-lettered (``agent_error``) and the agent
goes on with the next, instead of crashing and leaving the entry unacknowledged,
which stalls its partition's commit and replays it into the same crash on every
restart. Only the broker's transient errors go through: the entry is read again
once it is back.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

import faust
import orjson
from faust.exceptions import KeyDecodeError, ValueDecodeError

from pipeline import metrics, redact
from pipeline.models import DeadLetter, Delivery, DeviceUpdate, Intent, Outcome, Preferences, Receipt, Timer
from pipeline.parsers import messages as records
from pipeline.parsers.events import InvalidEvent, parse_device_update, parse_preferences, parse_receipt
from pipeline.transport import ProducerFenced
from pipeline.transport.client import TRANSIENT_ERRORS
from pipeline.transport.consumer import MALFORMED

__all__ = ["BadEntry", "CheckedSchema", "CheckedTopic", "GuardedSchema", "checked_topic", "contained", "decode",
           "dead_letter", "entry_limit", "guarded_topic", "malformed", "parser_for", "send_dead_letter",
           "USER_KEYED_MODELS"]

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


class MalformedEntry(KeyDecodeError):
    """An entry whose transport fields could not be decoded (the consumer marked it)."""

    reason = "malformed_entry"

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.detail = f"malformed entry: {why}"


def malformed(message: Any) -> Optional[str]:
    """Why the transport could not decode ``message``'s fields, or None."""
    headers = message.headers
    if headers:
        for name, value in headers:
            if name == MALFORMED:
                return _text(value)
    return None


def refuse_malformed(message: Any) -> None:
    """Raise :class:`MalformedEntry` for an entry the transport marked malformed."""
    if message.headers:
        why = malformed(message)
        if why is not None:
            raise MalformedEntry(why)


async def _ignored(exc: Exception, message: Any) -> None:
    """A decode error nobody handles (Faust's default, when no topic compiles the decoder)."""
    return None


class GuardedSchema(faust.Schema):
    """A schema that refuses an entry the transport marked malformed, before its key
    is decoded; ``dlq``: where :class:`CheckedTopic` sends what it refuses."""

    def __init__(self, *, dlq: Any = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.dlq = dlq

    def loads_key(self, app: Any, message: Any, *, loads: Any = None, serializer: Any = None) -> Any:
        refuse_malformed(message)
        return super().loads_key(app, message, loads=loads, serializer=serializer)

    def compile(self, app: Any, *, on_key_decode_error: Any = _ignored, on_value_decode_error: Any = _ignored,
                default_propagate: bool = False) -> Callable[..., Any]:
        """The topic's decoder (what Faust's ``Schema.compile`` builds: key, then
        value, then the event; a decode error raised when ``propagate``, else handed to
        its callback and None returned), with the key and value read straight from the
        entry where the types are raw bytes or text: Faust's compiled decoder goes
        through its serializer registry, which looks the codec and the event class up
        again for every entry (~60 calls an event).
        The result is Faust's (tests/pipeline/test_entry_decode.py)."""
        key_of, value_of = self._key_reader(app), self._value_reader(app)
        allow_empty = self.allow_empty
        if type(app).create_event is faust.App.create_event:
            event_class = app.conf.Event

            def create_event(k: Any, v: Any, headers: Any, message: Any) -> Any:
                return event_class(app, k, v, headers, message)
        else:
            create_event = app.create_event

        async def decode(message: Any, *, propagate: bool = default_propagate) -> Any:
            try:
                k = key_of(message)
            except KeyDecodeError as exc:
                if propagate:
                    raise
                await on_key_decode_error(exc, message)
            else:
                try:
                    if message.value is None and allow_empty:
                        return create_event(k, None, message.headers, message)
                    v = value_of(message)
                except ValueDecodeError as exc:
                    if propagate:
                        raise
                    await on_value_decode_error(exc, message)
                else:
                    return create_event(k, v, message.headers, message)
            return None

        return decode

    def _key_reader(self, app: Any) -> Callable[[Any], Any]:
        serializer = self.key_serializer or app.serializers.key_serializer
        if serializer != "raw" or self.key_type not in (str, bytes):
            loads = app.serializers.loads_key
            return lambda message: self.loads_key(app, message, loads=loads)
        text = self.key_type is str

        def key_of(message: Any) -> Any:
            refuse_malformed(message)
            key = message.key
            if key is None or not text:  # Faust's raw codec: text given is encoded
                return key.encode() if isinstance(key, str) else key
            try:  # Faust's: to bytes, then text
                if isinstance(key, str):
                    key = key.encode()
                return key.decode() if isinstance(key, bytes) else key
            except UnicodeError as exc:
                raise KeyDecodeError(str(exc)) from exc

        return key_of

    def _value_reader(self, app: Any) -> Callable[[Any], Any]:
        loads = app.serializers.loads_value
        if self.value_type is bytes and (self.value_serializer or app.serializers.value_serializer) == "raw":
            def value_of(message: Any) -> Any:
                value = message.value
                return value.encode() if isinstance(value, str) else value
            return value_of
        return lambda message: self.loads_value(app, message, loads=loads)


class CheckedSchema(GuardedSchema):
    """``value_type`` decoded by :func:`decode` (keys stay Faust's: UTF-8 text)."""

    def __init__(self, *, settings: Any, dlq: Any = None, **kw: Any) -> None:
        super().__init__(dlq=dlq, **kw)
        self.settings = settings
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
                key: Optional[str] = None, partition: Optional[int] = None,
                offset: Optional[int] = None) -> DeadLetter:
    """The DLQ record of something that could not be processed (the payload is
    kept as text, cut to 64 KiB; the key to 256 characters); ``partition`` and
    ``offset``: where the entry was in ``source``, when it came from a stream."""
    return DeadLetter(source=source, reason=reason, at=time.time(), payload=_text(payload)[:65536],
                      detail=detail[:1000] if detail else detail, key=key[:256] if key else key,
                      partition=partition, offset=offset)


async def send_dead_letter(dlq: Any, source: str, reason: str, payload: Any, *, detail: Optional[str] = None,
                           key: Any = None, partition: Optional[int] = None, offset: Optional[int] = None) -> None:
    """Count, log and send one dead letter to ``dlq``; never raises (a bad entry must
    not crash what reads it, even when the dead letter cannot be written).

    Addresses never reach the letter in clear where a person reads it: the detail,
    the key and the reason are masked as free text (a phone number given as a time
    zone, an e-mail address quoted by a parser, a webhook URL with its secret
    path), and so is the payload (its address fields by kind), except the payload
    of a letter ``notify dlq replay`` sends again (``expand``: an event; ``lane``: a
    delivery, whose address the replay needs), kept whole and masked where it is
    shown (``notify dlq ls``, the status page: :func:`pipeline.redact.mask_dead_letter`)."""
    metrics.dead_letters.labels(source, reason).inc()
    reason = redact.mask_text(reason)
    detail = redact.mask_text(detail) if detail else detail
    where = f"{source}[{partition}]@{offset}" if partition is not None else source
    text = redact.mask_text(_text(key)) or None
    log.warning("dead letter from %s: %s%s%s", where, reason, f" (key {text[:256]})" if text else "",
                f": {detail}" if detail else "")
    if dlq is None:
        return
    try:
        if source not in redact.REPLAYABLE:
            payload = redact.mask_payload(_text(payload)[:65536])
        letter = dead_letter(source, reason, payload, detail=detail, key=text, partition=partition, offset=offset)
        await dlq.send(key=(text or source)[:256], value=letter)
    except Exception:  # noqa: BLE001 - never crash the consumer over a bad entry
        log.exception("could not dead-letter a bad %s entry", source)


class CheckedTopic(faust.Topic):
    """A topic whose malformed, undecodable or invalid entries are acknowledged and
    sent to the schema's ``dlq`` topic (source: this topic's name, with the
    entry's partition and offset) instead of crashing the agent that reads it."""

    async def on_key_decode_error(self, exc: Exception, message: Any) -> None:
        reason = getattr(exc, "reason", "bad_key")
        await self._dead_letter(reason, getattr(exc, "detail", None) or f"bad_key ({exc})", message)

    async def on_value_decode_error(self, exc: Exception, message: Any) -> None:
        await self._dead_letter(getattr(exc, "reason", "undecodable"), getattr(exc, "detail", str(exc)), message)

    async def _dead_letter(self, reason: str, detail: str, message: Any) -> None:
        # whoever follows what the agent of this topic handled hears of an entry it never
        # sees (the schema's ``on_skip``, kept by the clones Faust makes of a topic:
        # agents/applied.py)
        on_skip = getattr(self.schema, "on_skip", None)
        if on_skip is not None:
            on_skip(message)
        # An entry delivered again after a seek (the end of a recovery reads again from
        # the committed offsets while the fetcher runs) is decoded again before the
        # stream drops it as delivered: dead-letter each offset of a partition once.
        lettered = self.__dict__.setdefault("_lettered", {})
        tp = (message.topic, message.partition)
        if message.offset <= lettered.get(tp, -1):
            return
        lettered[tp] = message.offset
        await send_dead_letter(getattr(self.schema, "dlq", None), message.topic, reason, message.value,
                               detail=detail, key=message.key, partition=message.partition, offset=message.offset)


def checked_topic(app: Any, name: str, model: type, *, settings: Any, dlq: Any) -> CheckedTopic:
    """``app.topic(name, key_type=str, value_type=model)`` with checked entries."""
    return CheckedTopic(app, topics=[name], schema=CheckedSchema(key_type=str, value_type=model, settings=settings,
                                                                 dlq=dlq))


def guarded_topic(app: Any, name: str, *, dlq: Any) -> CheckedTopic:
    """A topic of raw bytes (key and value) whose malformed entries are dead-lettered;
    the agent validates the value itself."""
    return CheckedTopic(app, topics=[name], schema=GuardedSchema(
        key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw", dlq=dlq))


#: what an agent may raise that is not the entry's fault: the entry is read again
PASS_THROUGH = (*TRANSIENT_ERRORS, ProducerFenced)


class contained:
    """``async with contained(dlq, event, agent):`` handle one entry (``event``)
    inside: an exception other than a transient one dead-letters the entry
    (``agent_error``, with the exception) and is swallowed, so the agent
    acknowledges it and goes on with the next. (A class, not a generator: it runs
    once per entry, and the generator's context manager cost a few calls more.)"""

    __slots__ = ("dlq", "event", "agent")

    def __init__(self, dlq: Any, event: Any, agent: str) -> None:
        self.dlq, self.event, self.agent = dlq, event, agent

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, typ: Any, exc: Any, tb: Any) -> bool:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, PASS_THROUGH):
            return False
        agent = self.agent
        metrics.agent_errors.labels(agent).inc()
        msg = self.event.message
        log.error("agent %s failed on %s[%s]@%s; the entry is dead-lettered", agent, msg.topic, msg.partition,
                  msg.offset, exc_info=(typ, exc, tb))
        await send_dead_letter(self.dlq, msg.topic, "agent_error", msg.value,
                               detail=f"{agent}: {type(exc).__name__}: {exc}", key=msg.key, partition=msg.partition,
                               offset=msg.offset)
        return True
