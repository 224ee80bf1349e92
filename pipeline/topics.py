"""Topic names of the pipeline. User-keyed topics share one partition count, so an
agent reading any of them finds the user's tables in its own partitions."""

from typing import Any

from config.settings import CHANNELS, PRIORITIES

EVENTS = "notify.events"  # raw producer bytes, key biz_key
EVENTS_HIGH = "notify.events.high"  # the same, for high-priority categories (the API writes them here)
INTENTS = "notify.intents"  # prefix: notify.intents.<priority>, Intent, key user_id
OUTCOMES = "notify.outcomes"  # Outcome, key user_id: every state change
CALLBACKS = "notify.callbacks"  # Outcome, key user_id: the changes a producer hears of (Outcome.callback)
TIMERS = "notify.timers"  # Timer, key user_id: delayed and retried work
TIMERS_HIGH = "notify.timers.high"  # the same, for high-priority deliveries and intents
RECEIPTS = "notify.receipts"  # Receipt, key provider_msg_id
DLQ = "notify.dlq"  # DeadLetter
PREFERENCES = "notify.preferences"  # Preferences, key user_id
DEVICES = "notify.devices"  # DeviceUpdate, key user_id


def events_for(priority: str) -> str:
    """The topic an event of ``priority`` is written to: notify.events.high for high,
    notify.events for the rest (both are read by expand)."""
    return EVENTS_HIGH if priority == "high" else EVENTS


def event_topic(settings, category: Any, priority: Any = None) -> str:
    """Where a producer (the API, ``notify send``) writes an event: by its own
    priority, else its category's. An unknown category goes to notify.events,
    where expand dead-letters it."""
    cat = settings.categories.get(category) if isinstance(category, str) else None
    return events_for(priority or (cat.priority if cat else ""))


def event_key(biz_key: str, recipients: Any) -> bytes:
    """The key an event is written with: its one recipient's user id, else its
    business key. Keyed by the user, an event lands in the user's partition (all
    topics share one partition count and partitioner), read by the worker that
    holds the user's tables, which then plans it without the intent hop
    (agents/expand.py). Repeats of a business key keep one key either way."""
    if isinstance(recipients, (list, tuple)) and len(recipients) == 1 and isinstance(recipients[0], str):
        return recipients[0].encode()
    return str(biz_key).encode()


def intents(priority: str) -> str:
    """``notify.intents.<priority>``: the guard reads each priority apart, so a burst of
    marketing intents never queues in front of an OTP's."""
    return f"{INTENTS}.{priority}"


INTENT_TOPICS = [intents(p) for p in PRIORITIES]


def lane(channel: str, priority: str) -> str:
    """``notify.send.<channel>.<priority>``: one topic (and one agent) per lane."""
    return f"notify.send.{channel}.{priority}"


LANES = [(c, p) for c in CHANNELS for p in PRIORITIES]


def timers_for(priority: Any) -> str:
    """Where a timer of a delivery or intent of ``priority`` is written: high ones on
    notify.timers.high, fired by the scheduler of the role that runs the high path
    (an OTP's retry never waits for the firing loop of the workers a campaign keeps
    busy); the rest, and timers of no priority (receipts), on notify.timers."""
    return TIMERS_HIGH if priority == "high" else TIMERS


#: read and written apart from every other topic (pipeline/transport/priority.py): a
#: low-priority backlog in any stream never stands in front of an OTP
PRIORITY = frozenset([EVENTS_HIGH, intents("high"), TIMERS_HIGH] + [lane(c, "high") for c in CHANNELS])

#: written by the pipeline and read by none of its agents: operators read the dead
#: letters, analysts the outcomes (records are written where outcomes are made:
#: agents/sink.py). No consumer lag to watch, only depth.
UNREAD = frozenset([DLQ, OUTCOMES])

USER_KEYED = (INTENT_TOPICS + [OUTCOMES, CALLBACKS, TIMERS, TIMERS_HIGH, PREFERENCES, DEVICES]
              + [lane(c, p) for c, p in LANES])
ALL = [EVENTS, EVENTS_HIGH, RECEIPTS, DLQ] + USER_KEYED
