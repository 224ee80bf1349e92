"""The Faust app of the pipeline, its settings, renderer and typed topics.

The broker is ``REDIS_URL`` (or ``NOTIFY_BROKER``, set by ``notify run`` after it
started the embedded server). Worker ownership options come from
``NOTIFY_WORKERS`` (N slots) and ``NOTIFY_WORKER_INDEX`` (preferred slot).
"""

import logging
import os

import faust

from config.settings import load_settings

from . import redact, roles
from . import topics as T
from .entries import checked_topic, guarded_topic
from .lean import lean_sensors
from .models import DeadLetter, DeviceUpdate, Delivery, Intent, Outcome, Preferences, Priority, Receipt, Timer
from .templates import Renderer
from .transport.cache import CachedTable

settings = load_settings()
redact.install()  # no phone number, e-mail address or push token in a worker's logs

# Faust logs every send at DEBUG (formatting a record per message when enabled)
logging.getLogger("faust.topics").setLevel(logging.INFO)
renderer = Renderer.from_settings(settings)


def broker_url() -> str:
    base = os.environ.get("NOTIFY_BROKER") or settings.redis_url or "redis://127.0.0.1:6379/0"
    opts = [f"slots={int(os.environ.get('NOTIFY_WORKERS', '1'))}"]
    if os.environ.get("NOTIFY_WORKER_INDEX"):
        opts.append(f"slot={int(os.environ['NOTIFY_WORKER_INDEX'])}")
    if os.environ.get("NOTIFY_LEASE"):
        opts.append(f"lease={float(os.environ['NOTIFY_LEASE'])}")
    if os.environ.get("NOTIFY_MEMBERS"):  # "dynamic": elastic workers (pipeline/transport/membership.py)
        opts.append(f"members={os.environ['NOTIFY_MEMBERS']}")
    return base + ("&" if "?" in base else "?") + "&".join(opts)


app = faust.App(
    roles.app_id(),  # "notify", or "notify-priority" for NOTIFY_ROLE=priority (pipeline/roles.py)
    broker=broker_url(),
    store="memory-ordered://",
    topic_partitions=settings.partitions,
    web_enabled=False,
    datadir=os.path.join(settings.data_dir, "worker"),
    broker_commit_interval=0.5,
    stream_buffer_maxsize=8192,
    broker_max_poll_records=50,  # per partition per read: a deep low lane must not hold up a fetch cycle
    producer_max_batch_size=16384,
    topic_disable_leader=True,
    Table=CachedTable,  # changelog writes coalesced per key until the next commit
)
lean_sensors(app)  # Faust's Monitor off the per-event path (pipeline/lean.py)
app.priority_topics = T.PRIORITY  # their own fetch loop and producer queue (pipeline/transport/priority.py)
app.offset_peers = roles.offset_peers()  # a switch of roles goes on where the other group stopped
#: awaited by the producer's flush, before every commit: what else must be durable first
#: (agents/sink.py: the records of the outcomes sent)
app.commit_waits_for = []
#: topics the workers write and no agent reads (analysts do): trimmed by age, and no
#: further than any reader group has committed (pipeline/transport/retention.py)
app.trim_written = set() if roles.ROLE == "priority" else {T.OUTCOMES}

dlq_topic = app.topic(T.DLQ, key_type=str, value_type=DeadLetter)
#: raw bytes: expand validates the events itself; malformed entries are dead-lettered
events_topics = [guarded_topic(app, name, dlq=dlq_topic) for name in (T.EVENTS, T.EVENTS_HIGH)]


def _checked(name: str, model: type):
    """A topic an agent reads: bad entries go to notify.dlq (pipeline/entries.py)."""
    return checked_topic(app, name, model, settings=settings, dlq=dlq_topic)


intents_topics = {p: _checked(T.intents(p), Intent) for p in Priority.ALL}
outcomes_topic = _checked(T.OUTCOMES, Outcome)
timers_topic = _checked(T.TIMERS, Timer)
receipts_topic = _checked(T.RECEIPTS, Receipt)
preferences_topic = _checked(T.PREFERENCES, Preferences)
devices_topic = _checked(T.DEVICES, DeviceUpdate)
lane_topics = {(c, p): _checked(T.lane(c, p), Delivery) for c, p in T.LANES}

