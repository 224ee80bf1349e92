"""The messages that flow between agents, as typed Faust records.

Every record carries ``v`` (schema version) and is encoded with the ``orjson``
codec without Faust metadata, so analysts read plain JSON. The schema is
documented for producers and analysts in ``docs/SCHEMA.md``.

Flow: Event (one business fact, many recipients) → Intent (one user)
→ Delivery (one user × channel) → Attempt (one provider call) → Outcome
(one state change, on ``notify.outcomes``).
"""

from typing import Any, Optional

import faust

from . import codecs as _codecs  # noqa: F401  (registers "orjson")
from .lean import direct_init

__all__ = [
    "SCHEMA_VERSION",
    "State",
    "AttemptResult",
    "Priority",
    "Event",
    "Intent",
    "Delivery",
    "Attempt",
    "Outcome",
    "Preferences",
    "DeviceUpdate",
    "Timer",
    "DeadLetter",
    "Receipt",
]

SCHEMA_VERSION = 1


class State:
    """Delivery states (seed 000 names SENT what we call ACCEPTED)."""

    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    FILTERED = "FILTERED"
    ACCEPTED = "ACCEPTED"
    DELIVERED = "DELIVERED"
    UNDELIVERED = "UNDELIVERED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"
    REVIEW = "REVIEW"

    ALL = (PENDING, SCHEDULED, FILTERED, ACCEPTED, DELIVERED, UNDELIVERED, FAILED, UNKNOWN, REVIEW)
    #: A delivery in one of these states needs no more work from the pipeline
    #: (ACCEPTED may still move to DELIVERED/UNDELIVERED on a receipt).
    TERMINAL = (FILTERED, ACCEPTED, DELIVERED, UNDELIVERED, FAILED, REVIEW)


class AttemptResult:
    ACCEPTED = "ACCEPTED"
    TIMEOUT_UNKNOWN = "TIMEOUT_UNKNOWN"
    RATE_LIMITED = "RATE_LIMITED"
    TRANSIENT_ERROR = "TRANSIENT_ERROR"
    PERMANENT_ERROR = "PERMANENT_ERROR"

    ALL = (ACCEPTED, TIMEOUT_UNKNOWN, RATE_LIMITED, TRANSIENT_ERROR, PERMANENT_ERROR)


class Priority:
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    ALL = (HIGH, NORMAL, LOW)


class _Record(faust.Record, abstract=True, serializer="orjson", include_metadata=False):
    pass


class Event(_Record):
    """One business fact, as producers write it to ``notify.events``."""

    biz_key: str
    category: str
    template: str
    recipients: list[str]
    template_version: int = 1
    params: dict[str, Any] = {}
    channels: Optional[list[str]] = None
    locale: Optional[str] = None
    priority: Optional[str] = None
    send_at: Optional[float] = None
    accepted_at: float = 0.0
    #: the producer whose key space ``biz_key`` belongs to ("" = the operator's)
    producer: str = ""
    #: where every state change of the event's notifications is POSTed (signed; agents/callbacks.py)
    callback_url: Optional[str] = None
    v: int = SCHEMA_VERSION


class Intent(_Record):
    """One event for one user; keyed by ``user_id`` on ``notify.intents.<priority>``."""

    notification_id: str
    biz_key: str
    user_id: str
    category: str
    template: str
    template_version: int
    priority: str
    params: dict[str, Any] = {}
    channels: Optional[list[str]] = None
    locale: Optional[str] = None
    send_at: Optional[float] = None
    accepted_at: float = 0.0
    #: set when a deferred intent comes back from the scheduler (quiet hours passed)
    resumed: bool = False
    producer: str = ""
    #: times backpressure deferred it (pipeline/rules/backpressure.py)
    deferrals: int = 0
    #: its event's state changes are POSTed to a producer (agents/callbacks.py): set by
    #: expand, carried by its deliveries and outcomes
    callback: bool = False
    #: the message that made it, ``<events topic>:<offset>:<recipient index>`` (set by
    #: expand, kept on the intents topic and in a deferred intent's timer): the guard's
    #: replay token (agents/guard.py), the same whichever way the intent reached it
    origin: Optional[str] = None
    v: int = SCHEMA_VERSION


class Delivery(_Record):
    """One notification on one channel, rendered and addressed; keyed by ``user_id``."""

    delivery_id: str
    notification_id: str
    biz_key: str
    user_id: str
    channel: str
    category: str
    template: str
    priority: str
    address: str = ""
    content: dict[str, Any] = {}
    pref_version: int = 0
    attempt: int = 0
    #: provider that answered TIMEOUT_UNKNOWN: reconcile with it before any resend
    unknown_provider: Optional[str] = None
    reconcile_round: int = 0
    provider_msg_id: Optional[str] = None
    due_at: Optional[float] = None
    accepted_at: float = 0.0
    #: an operator's replay round (``notify dlq replay``): a replayed delivery is a new
    #: round of the same delivery, which the lane's inflight table lets through once
    replay: int = 0
    producer: str = ""
    #: the template version rendered (a gray release may give a newer one than asked)
    template_version: int = 0
    #: a push to one of the user's devices: how many devices this notification went
    #: to (its record's deliveries, docs/SCHEMA.md "Push to every device"); 0 = a
    #: delivery of the whole channel
    devices: int = 0
    #: its event's state changes are POSTed to a producer (the intent's ``callback``)
    callback: bool = False
    v: int = SCHEMA_VERSION


class Attempt(_Record):
    """One provider call (seed 001's ``attempts`` row)."""

    delivery_id: str
    seq: int
    channel: str
    provider: str
    started_at: float
    result: str
    latency_ms: float = 0.0
    provider_msg_id: Optional[str] = None
    retry_after: Optional[float] = None
    next_at: Optional[float] = None
    error: Optional[str] = None
    v: int = SCHEMA_VERSION


class Outcome(_Record):
    """One state change of one delivery, on ``notify.outcomes``."""

    delivery_id: str
    notification_id: str
    biz_key: str
    user_id: str
    channel: str
    category: str
    template: str
    priority: str
    state: str
    at: float
    reason: Optional[str] = None
    provider: Optional[str] = None
    provider_msg_id: Optional[str] = None
    retry_count: int = 0
    attempt: Optional[Attempt] = None
    accepted_at: float = 0.0
    latency_ms: float = 0.0
    #: human detail of the reason (e.g. which template variable was missing)
    detail: Optional[str] = None
    producer: str = ""
    #: the version of the user's preferences the decision was taken with
    pref_version: int = 0
    #: the template version used (asked for, or a gray release's)
    template_version: int = 0
    #: an outcome of a push to one device (``delivery_id`` is that device's delivery):
    #: how many devices the notification went to; 0 = of the whole channel
    devices: int = 0
    #: this change is also sent on notify.callbacks, for the producer's status callback
    #: (agents/callbacks.py); the outcome stream's readers may ignore it
    callback: bool = False
    v: int = SCHEMA_VERSION


class Preferences(_Record):
    """A user's settings; the value of the ``preferences`` table, keyed by user_id.

    ``switches`` maps ``"<category>.<channel>"`` (or ``"*.<channel>"``,
    ``"<category>.*"``) to on/off; anything not listed is on.
    ``quiet_hours`` is ``"HH:MM-HH:MM"`` in ``tz`` (IANA), or None;
    ``channel_quiet_hours`` overrides it per channel, with several windows each.

    As an update on ``notify.preferences`` it also says where it comes from:
    ``source`` (``stream``: a producer writing the topic; ``api``: a PUT;
    ``one_click``: an unsubscribe link; ``provider:<name>``: a provider's
    feedback, a spam complaint or an unsubscribe) and ``producer`` (whose, where
    known), which the unsubscribe records keep (agents/users.py). ``merge``:
    only ``switches`` are applied over the user's current preferences, whatever
    their version (the opt-outs that do not know the whole document:
    pipeline/rules/preferences.py).
    """

    user_id: str
    version: int = 0
    switches: dict[str, bool] = {}
    quiet_hours: Optional[str] = None
    #: quiet windows per channel (``{"push": ["22:00-07:00"], "sms": []}``): a channel
    #: listed here uses its own (``[]``: never quiet), the others ``quiet_hours``
    channel_quiet_hours: dict[str, list[str]] = {}
    tz: str = "UTC"
    phone: Optional[str] = None
    email: Optional[str] = None
    webhook_url: Optional[str] = None
    locale: Optional[str] = None
    source: str = "stream"
    producer: str = ""
    merge: bool = False
    v: int = SCHEMA_VERSION


class DeviceUpdate(_Record):
    """Add or remove one push token (``notify.devices``, keyed by user_id)."""

    user_id: str
    token: str
    platform: str = "apns"  # apns | fcm | hms (pipeline.parsers.events.PUSH_PLATFORMS)
    op: str = "add"  # add | remove
    at: float = 0.0
    v: int = SCHEMA_VERSION


class Timer(_Record):
    """Work due later: a delayed or retried delivery, or a deferred intent."""

    timer_id: str
    due_at: float
    kind: str  # "delivery" | "intent" | "reconcile" | "receipt_poll"
    payload: dict[str, Any]
    v: int = SCHEMA_VERSION


class DeadLetter(_Record):
    """Anything the pipeline could not process, with why (``notify.dlq``)."""

    source: str
    reason: str
    at: float
    payload: str  # the original bytes, decoded as UTF-8 with replacement
    detail: Optional[str] = None
    key: Optional[str] = None
    partition: Optional[int] = None  # where the entry was in ``source`` (a stream's name) ...
    offset: Optional[int] = None  # ... when it came from one
    v: int = SCHEMA_VERSION


class Receipt(_Record):
    """A provider's delivery receipt (``notify.receipts``)."""

    provider: str
    provider_msg_id: str
    status: str  # DELIVERED | UNDELIVERED
    at: float
    error: Optional[str] = None
    #: the recipient opted out through the provider (a spam complaint, the
    #: provider's unsubscribe link): the delivery's category is switched off on
    #: its channel (agents/receipts.py)
    opt_out: bool = False
    v: int = SCHEMA_VERSION


# fields written straight into each record, not through Faust's descriptors (pipeline/lean.py)
for _cls in (Event, Intent, Delivery, Attempt, Outcome, Preferences, DeviceUpdate, Timer, DeadLetter, Receipt):
    direct_init(_cls)
