"""What a worker turns off or tunes for throughput, measured in bench/transport.py.

Faust's Monitor sensor, kept off the per-event path.

Records built, read into a dict and encoded without Faust's field descriptors
and codec registry: :func:`direct_init`.

Faust adds its ``Monitor`` to the app's sensors when a worker starts, and the
sensors are called on every message in and out, every stream event in and out,
every send and every table read and write: a dict built, clocks read and deques
appended per event. Nothing of ours reads it (our metrics are in
``pipeline/metrics.py`` and the lag comes from the streams), and profiled it
was a measurable share of each event. :func:`lean_sensors` gives the app a
sensor delegate that leaves the monitor out; sensors added on purpose still run,
and the monitor itself still exists for the few calls Faust makes on it directly.

The garbage collector: a worker allocates a few objects per event (message,
event, futures) that die young, and CPython's default first-generation threshold
(700 allocations) runs a collection every few dozen events. :func:`tune_gc`
raises it; what is alive at start is frozen out of the collections.

The event loop: a worker schedules a few callbacks and futures per message,
and asyncio's loop (with the selector) was a quarter of a worker's own time in
the end-to-end profile. :func:`use_fast_loop` installs uvloop (libuv, the loop
Faust recommends) before the worker or the API creates its loop;
``NOTIFY_LOOP=asyncio`` keeps the standard one. Measured with
``bench/e2e.py --event-loop both`` (bench/RESULTS.md "loop"): a few % less
worker CPU per notification, within this machine's run-to-run noise.
"""

import gc
from typing import Any

from faust.sensors.base import SensorDelegate

__all__ = ["LeanSensors", "direct_init", "lean_sensors", "tune_gc", "use_fast_loop"]


class LeanSensors(SensorDelegate):
    def add(self, sensor: Any) -> None:
        if sensor is self.app.monitor:
            return
        super().add(sensor)

    # rebalances are rare: the monitor still sees them (and Faust finds its state)
    def on_rebalance_start(self, app: Any) -> dict:
        state = super().on_rebalance_start(app)
        state[app.monitor] = app.monitor.on_rebalance_start(app)
        return state

    def on_rebalance_return(self, app: Any, state: dict) -> None:
        super().on_rebalance_return(app, state)
        if app.monitor in state:
            app.monitor.on_rebalance_return(app, state[app.monitor])

    def on_rebalance_end(self, app: Any, state: dict) -> None:
        super().on_rebalance_end(app, state)
        if app.monitor in state:
            app.monitor.on_rebalance_end(app, state[app.monitor])


def lean_sensors(app: Any) -> Any:
    """Call before the worker starts (the consumer binds the delegate's methods)."""
    app.sensors = LeanSensors(app)
    return app


#: first-generation threshold for a worker (CPython's default is 700)
GC_THRESHOLD = (100_000, 50, 1000)


def tune_gc() -> None:
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def use_fast_loop(loop: str = "uvloop") -> str:
    """Make the loops created from now on uvloop's (unless ``loop`` is ``asyncio``:
    ``NOTIFY_LOOP``, or uvloop is missing); returns the loop in use."""
    if loop == "asyncio":
        return "asyncio"
    try:
        import mode.loop

        mode.loop.use("uvloop")
    except ImportError:
        return "asyncio"
    return "uvloop"


def direct_init(cls: type) -> type:
    """Give a ``faust.Record`` class an ``__init__`` that writes its fields straight
    into the instance's ``__dict__``.

    Faust's generated ``__init__`` assigns each field through its descriptor,
    whose ``__set__`` calls ``prepare_value`` (the identity unless the field
    coerces) and checks for a tag: a few method calls per field, 5 to 9 µs an
    Outcome (by how many of its 19 fields are given) against 1 µs here, and the
    pipeline builds about eight records per notification. The result is the same ``__dict__``
    (tests/pipeline/test_record_init.py); a class whose fields coerce, validate or
    are tagged keeps Faust's. Faust's ``__init__`` still does
    what this one does not: records decoded by Faust (``__strict__=False``) and
    unexpected arguments (its TypeError)."""
    opts: Any = cls._options  # type: ignore[attr-defined]
    descriptors = opts.descriptors
    # (a field coerced lazily, a nested record or a container, is coerced when read,
    # by the descriptor's __get__, whichever __init__ wrote it)
    if opts.coerce or opts.validation or hasattr(cls, "__post_init__") or any(
        d.coerce or d.tag for d in descriptors.values()
    ):
        return cls
    fields = list(opts.fieldpos.values())
    required = [f for f in fields if f not in opts.optionalset]
    optional = [f for f in fields if f in opts.optionalset]
    args = required + optional
    signature = ", ".join(["self", *required, *(f"{f}=None" for f in optional), "*", "__strict__=True",
                           "__faust=None", "**kwargs"])
    values = [f"{f!r}: {f}" for f in required] + [f"{f!r}: {f} if {f} is not None else _d_{f}" for f in optional]
    source = (
        f"def __init__({signature}):\n"
        f"    if kwargs or not __strict__:\n"
        f"        return _faust_init(self, {', '.join(args)}, __strict__=__strict__, __faust=__faust, **kwargs)\n"
        f"    self.__dict__.update({{'__evaluated_fields__': set(), {', '.join(values)}}})\n"
    )
    scope: dict[str, Any] = {"_faust_init": cls.__init__, **{f"_d_{f}": opts.defaults[f] for f in optional}}
    exec(compile(source, f"<direct_init {cls.__name__}>", "exec"), scope)  # noqa: S102 - our own fields
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__name__}.__init__"
    cls.__init__ = init  # type: ignore[misc]
    cls._faust_init = scope["_faust_init"]  # type: ignore[attr-defined]
    _direct_dumps(cls)
    return cls


def _direct_dumps(cls: type) -> None:
    """Give the class an ``asdict`` that builds the dict Faust's builds (every
    field, in order) from the instance's ``__dict__``, and a ``dumps`` that hands it
    to the orjson codec directly: 2.9 µs an Outcome against 4.7 through Faust's (a
    descriptor read per field, the codec registry). A field
    coerced lazily (a nested record or a container) is still read through its
    descriptor, as Faust's ``asdict`` does. Only for records with the orjson codec,
    no metadata and Faust's ``_prepare_dict``; ``dumps(serializer=...)`` keeps
    Faust's."""
    from faust.models.base import Model
    from faust.models.record import Record

    from .codecs import dumps as codec_dumps

    opts: Any = cls._options  # type: ignore[attr-defined]
    if opts.serializer != "orjson" or opts.include_metadata or cls._prepare_dict is not Record._prepare_dict:
        return
    items, raw = [], []
    for name, desc in opts.descriptors.items():
        if desc.exclude:
            continue
        lazy = getattr(desc, "lazy_coercion", False)
        items.append(f"{desc.output_name!r}: " + (f"self.{name}" if lazy else f"d[{name!r}]"))
        # what dumps reads: a lazy field's value as it is when it is None or already a
        # record (its descriptor would return it unchanged; the codec writes a record
        # by its own asdict), else through the descriptor, as asdict does
        raw.append(f"{desc.output_name!r}: " + (
            f"(d[{name!r}] if d[{name!r}] is None or isinstance(d[{name!r}], _Model) else self.{name})"
            if lazy else f"d[{name!r}]"))
    source = (
        "def asdict(self):\n"
        "    d = self.__dict__\n"
        f"    return {{{', '.join(items)}}}\n"
        "def dumps(self, *, serializer=None):\n"
        "    if serializer is not None:\n"
        "        return _faust_dumps(self, serializer=serializer)\n"
        "    d = self.__dict__\n"
        f"    return _codec_dumps({{{', '.join(raw)}}})\n"
    )
    cls._faust_asdict = cls.asdict  # type: ignore[attr-defined]  # (what the tests compare with)
    scope: dict[str, Any] = {"_faust_dumps": cls.dumps, "_codec_dumps": codec_dumps,  # type: ignore[attr-defined]
                             "_Model": Model}
    exec(compile(source, f"<direct_dumps {cls.__name__}>", "exec"), scope)  # noqa: S102 - our own fields
    for name in ("asdict", "dumps"):
        scope[name].__qualname__ = f"{cls.__name__}.{name}"
        setattr(cls, name, scope[name])
