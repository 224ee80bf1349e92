"""The app factory: :func:`create_app` builds the pipeline's Faust app for one role
from settings built once; :func:`agents.register_agents` then wires the agents of
that role onto it. Nothing is wired when a module is imported.

    settings = load_settings()                 # config file + environment, once
    app = create_app(settings, role="all")     # topics, tables, hooks, resources
    register_agents(app)                       # the agents of the role (agents/)

The app is a ``faust.App`` with what the agents need, declared and typed
(:class:`NotifyApp`): ``settings``, ``role``, ``renderer``, the pipeline's topics
(``app.declared``), its tables (``app.user_tables``), the process's resources
(``app.resources``: record store, provider dispatcher) and the transport's
hooks (``app.transport_hooks``: priority topics, offset peers, the sinks a commit
waits for, the topics trimmed by age, the rebalance callbacks).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

import faust

from config.settings import Settings

from . import clock, metrics, redact, roles
from . import topics as T
from .entries import checked_topic, guarded_topic
from .lean import lean_sensors
from .models import DeadLetter, Delivery, DeviceUpdate, Intent, Outcome, Preferences, Priority, Receipt, Timer
from .templates import Renderer
from .transport.cache import CachedTable
from .transport.hooks import TransportHooks

__all__ = ["NotifyApp", "Topics", "broker_url", "create_app"]


def broker_url(settings: Settings) -> str:
    """The worker's broker URL with its ownership options (``settings.env``: the
    slots, its preferred slot, the lease, elastic membership)."""
    env = settings.env
    base = env.broker or settings.redis_url or "redis://127.0.0.1:6379/0"
    opts = [f"slots={int(env.workers)}"]
    if env.worker_index is not None:
        opts.append(f"slot={int(env.worker_index)}")
    if env.lease is not None:
        opts.append(f"lease={float(env.lease)}")
    if env.members:  # "dynamic": elastic workers (pipeline/transport/membership.py)
        opts.append(f"members={env.members}")
    return base + ("&" if "?" in base else "?") + "&".join(opts)


@dataclass
class Topics:
    """The pipeline's topics as the agents read and write them (pipeline/topics.py
    names them). Topics an agent reads check their entries: bad ones go to ``dlq``."""

    dlq: Any
    events: list  # raw bytes: expand validates the events itself
    intents: dict  # priority → topic
    outcomes: Any
    callbacks: Any  # raw bytes: the callbacks agent reads the outcomes itself
    timers: Any
    timers_high: Any  # the high path's timers (pipeline/topics.py timers_for)
    receipts: Any
    preferences: Any
    devices: Any
    lanes: dict  # (channel, priority) → topic

    @classmethod
    def declare(cls, app: faust.App, settings: Settings) -> "Topics":
        dlq = app.topic(T.DLQ, key_type=str, value_type=DeadLetter)

        def checked(name: str, model: type) -> Any:
            return checked_topic(app, name, model, settings=settings, dlq=dlq)

        return cls(
            dlq=dlq,
            events=[guarded_topic(app, name, dlq=dlq) for name in (T.EVENTS, T.EVENTS_HIGH)],
            intents={p: checked(T.intents(p), Intent) for p in Priority.ALL},
            outcomes=checked(T.OUTCOMES, Outcome),
            callbacks=guarded_topic(app, T.CALLBACKS, dlq=dlq),
            timers=checked(T.TIMERS, Timer),
            timers_high=checked(T.TIMERS_HIGH, Timer),
            receipts=checked(T.RECEIPTS, Receipt),
            preferences=checked(T.PREFERENCES, Preferences),
            devices=checked(T.DEVICES, DeviceUpdate),
            lanes={(c, p): checked(T.lane(c, p), Delivery) for c, p in T.LANES},
        )


class NotifyApp(faust.App):
    """A ``faust.App`` with the pipeline's parts, declared (built by :func:`create_app`)."""

    settings: Settings
    role: str
    renderer: Renderer
    #: links rewritten to the API's signed redirect (pipeline/rules/tracking.py); None: off
    tracker: Any
    transport_hooks: TransportHooks
    declared: Topics
    user_tables: Any  # tables.Tables
    resources: Any  # pipeline.runtime.Resources
    parts: Any  # agents.Parts, once register_agents ran

    def __init__(self, id: str, *, settings: Settings, role: str, hooks: TransportHooks, **kwargs: Any) -> None:
        self.settings = settings
        self.role = role
        self.transport_hooks = hooks
        self.parts = None
        super().__init__(id, **kwargs)

    def runs(self, topic: Any) -> bool:
        """Whether this app's role runs the agent reading ``topic`` (pipeline/roles.py)."""
        name = topic if isinstance(topic, str) else topic.get_topic_name()
        return roles.runs(name, self.role)

    async def on_shutdown(self) -> None:
        # last: after the consumer's final commit and the producer's flush, which may
        # still write records (a store reopened after an earlier close kept the
        # process alive on aiosqlite's thread)
        await super().on_shutdown()
        await self.resources.close()


def make_tracker(settings: Settings) -> Any:
    """The guard's link rewriter from ``[tracking]`` and the tracking key, or None
    when tracking is off."""
    if not settings.tracking.enabled:
        return None
    from .keyfile import tracking_key
    from .rules.tracking import Tracker

    t = settings.tracking
    return Tracker(key=tracking_key(settings), base_url=t.base_url, open_pixel=t.open_pixel,
                   limits=settings.channel_limits())


def create_app(settings: Settings, role: Optional[str] = None, **conf: Any) -> NotifyApp:
    """The pipeline's app for ``role`` (``all``, ``main`` or ``priority``; default
    ``settings.env.role``), no agent registered yet. ``conf`` overrides Faust
    settings (a test's broker, say)."""
    from tables import define_tables

    from .runtime import Resources

    role = role or settings.env.role
    if role not in roles.ROLES:
        raise ValueError(f"role must be one of {', '.join(roles.ROLES)}, got {role!r}")
    redact.install()  # no phone number, e-mail address or push token in a worker's logs
    clock.configure(settings.env.clock_offset_s, settings.env.clock_file)
    # Faust logs every send at DEBUG (formatting a record per message when enabled)
    logging.getLogger("faust.topics").setLevel(logging.INFO)
    hooks = TransportHooks(
        priority_topics=T.PRIORITY,  # their own fetch loop and producer queue (pipeline/transport/priority.py)
        offset_peers=roles.offset_peers(role),  # a switch of roles goes on where the other group stopped
        # topics the workers write and no agent reads (analysts do): trimmed by age
        trim_written=frozenset() if role == "priority" else frozenset({T.OUTCOMES}),
        on_rebalance=metrics.on_rebalance,
        on_expelled=metrics.member_expelled.inc,
        on_offset_rollback=metrics.on_offset_rollback,  # a stream rolled back under its commits, repaired
    )
    options: dict[str, Any] = dict(
        broker=broker_url(settings),
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
        autodiscover=False,
    )
    options.update(conf)
    app = NotifyApp(roles.app_id(role), settings=settings, role=role, hooks=hooks, **options)
    lean_sensors(app)  # Faust's Monitor off the per-event path (pipeline/lean.py)
    app.renderer = Renderer.from_settings(settings)
    app.tracker = make_tracker(settings)
    app.declared = Topics.declare(app, settings)
    app.user_tables = define_tables(app, settings.partitions)
    app.resources = Resources(settings, app)
    return app
