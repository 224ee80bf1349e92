"""Settings: ``config/defaults.toml`` merged with an optional user TOML file and a few
environment variables, validated once at load into frozen dataclasses.

Rule: any bad value fails at load with :class:`ConfigError` naming the key and the
value, never later inside an agent.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from .environment import Environment, EnvError, read_env

__all__ = [
    "CHANNELS",
    "PRIORITIES",
    "ConfigError",
    "ChannelConfig",
    "CategoryConfig",
    "ApiConfig",
    "BackpressureConfig",
    "TrackingConfig",
    "Settings",
    "load_settings",
    "DEFAULTS_PATH",
    "PACKAGE_TEMPLATES_DIR",
]

#: The channels the code knows; a config cannot add one (there would be no adapter).
CHANNELS: tuple[str, ...] = ("inbox", "push", "sms", "email", "webhook")
#: Same values as ``pipeline.models.Priority.ALL`` (kept here so config has no deps).
PRIORITIES: tuple[str, ...] = ("high", "normal", "low")

DEFAULTS_PATH = Path(__file__).with_name("defaults.toml")
PACKAGE_TEMPLATES_DIR = Path(__file__).with_name("templates")

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_LOCALE_RE = re.compile(r"^[A-Za-z]{2,8}(?:[-_][A-Za-z0-9]{1,8})*$")
_EXEMPT = ("exempt", "none")


class ConfigError(ValueError):
    """A bad setting: ``key`` is the dotted key, ``value`` what was found."""

    def __init__(self, msg: str, key: str | None = None, value: Any = None) -> None:
        super().__init__(msg)
        self.key = key
        self.value = value


@dataclass(frozen=True)
class ChannelConfig:
    """Limits of one channel. Lengths in code points; None = no limit."""

    name: str
    max_length: int | None = None
    title_max_length: int | None = None
    lane_batch_size: int = 100
    #: push only: the devices a notification goes to at most, newest first (the
    #: devices table keeps no more than this many per user)
    max_devices: int = 10


@dataclass(frozen=True)
class CategoryConfig:
    """Routing and guard rules of one notification category."""

    name: str
    priority: str
    daily_limit: int | None  # None = exempt from the daily cap
    dedup_window_s: int
    inbox_fallback: bool
    default_channels: tuple[str, ...]
    #: the highest priority an event of this category may ask for (its own
    #: ``priority`` when unset); a higher one is lowered to it, unless the API key
    #: holds the ``priority:any`` scope (pipeline/rules/priority.py)
    max_priority: str | None = None
    #: seed 002's sliding windows per user: ``((seconds, n), ...)``, at most ``n``
    #: notifications of the category in any ``seconds`` (pipeline/rules/guard.py)
    rate_windows: tuple[tuple[int, int], ...] = ()
    #: its deliveries carry a signed one-click unsubscribe link (RFC 8058,
    #: pipeline/rules/tracking.py; ``unsubscribe_url`` in templates, ``List-Unsubscribe``
    #: in e-mail), and ``/u/<token>`` switches it off; off (OTP, security, transactional
    #: mail the user cannot refuse): the link is not made and the page says so
    one_click_unsubscribe: bool = False


@dataclass(frozen=True)
class ProviderConfig:
    """One ``[providers.<name>]`` table (config/providers.py): its token bucket (``rate``
    per second, ``burst``; None: no bucket), breaker overrides, and, with a ``kind``, the
    provider itself: ``options`` are the kind's settings, secrets as references
    (``<secret>_env`` / ``<secret>_file``), built by :mod:`adapters.registry`. Without a
    kind it only limits a provider of that name built elsewhere (simulators, fakes)."""

    name: str
    rate: float | None = None
    burst: float | None = None
    kind: str | None = None
    channel: str | None = None
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    breaker: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class BreakerConfig:
    """Circuit breaker thresholds, the same for every provider."""

    failure_threshold: int = 5
    reset_timeout_s: float = 5.0
    half_open_max: int = 1


@dataclass(frozen=True)
class ApiConfig:
    """Limits of the HTTP API's door (``[api]``): how long a client may take to
    send a request's headers (also the idle keep-alive) and its body, and the
    dates a signed receipt may carry."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    receipt_max_age_s: float = 7 * 86400.0
    receipt_max_ahead_s: float = 300.0


@dataclass(frozen=True)
class BackpressureConfig:
    """Seed 001's backpressure (``[backpressure]``): when the oldest unprocessed
    entry of any lane or intents topic is older than ``after_s``, the intake of
    ``categories`` (non-critical marketing) is deferred by ``retry_s`` at a time
    (``SCHEDULED backpressure``) until the age falls under half of ``after_s``."""

    after_s: float = 60.0
    retry_s: float = 30.0
    categories: tuple[str, ...] = ("marketing",)


@dataclass(frozen=True)
class CallbacksConfig:
    """Producer status callbacks (``[callbacks]``, agents/callbacks.py): the retry
    schedule (``base_delay_s`` doubling up to ``max_delay_s``, with jitter, for at
    least ``retry_for_s`` after the first failure), one POST's ``timeout_s``, POSTs
    in flight per worker, state changes per POST, how long an event's own
    ``callback_url`` is kept after its ``send_at``, and the target guard's allowlist
    (``NOTIFY_CALLBACK_ALLOW`` adds to it). ``enabled = false``: no agent reads
    the outcome stream back for callbacks."""

    enabled: bool = True
    base_delay_s: float = 5.0
    max_delay_s: float = 3600.0
    retry_for_s: float = 86400.0
    timeout_s: float = 10.0
    concurrency: int = 32
    max_batch: int = 100
    target_ttl_s: float = 3 * 86400.0
    allow: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrackingConfig:
    """Click, read and open tracking (``[tracking]``, pipeline/rules/tracking.py):
    ``base_url`` is the API's public URL the rewritten links point at (default:
    ``NOTIFY_API_PUBLIC_URL``, else http://127.0.0.1:8080); ``open_pixel`` adds a
    1×1 image to HTML email. The signing key is not a setting
    (``NOTIFY_TRACKING_SECRET`` or ``<data_dir>/tracking.key``, pipeline/keyfile.py)."""

    enabled: bool = True
    base_url: str = "http://127.0.0.1:8080"
    open_pixel: bool = False


@dataclass(frozen=True)
class Settings:
    templates_dir: str
    default_locale: str
    max_event_bytes: int
    max_recipients: int
    max_params_depth: int
    redis_url: str | None  # None = start an embedded server
    data_dir: str
    partitions: int
    db_path: str
    channels: Mapping[str, ChannelConfig]
    categories: Mapping[str, CategoryConfig]
    providers: Mapping[str, ProviderConfig] = field(default_factory=lambda: MappingProxyType({}))
    #: ``[routes]``: channel → provider names in failover order; empty: the config names
    #: no providers (the simulators or the fakes are used, pipeline/runtime.py)
    routes: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    #: seconds after ACCEPTED to ask a provider with a status query for a missing
    #: receipt (0 = never)
    receipt_poll_s: float = 60.0
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    #: size of an event's params as compact JSON (they are copied into every intent)
    max_params_bytes: int = 65536
    #: priority → deliveries a lane agent of that priority takes at once, for every
    #: channel (``[lane_batch_size]``); a priority absent here uses the channel's own
    lane_batch_sizes: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    #: priority → longest a lane of that priority waits for one provider call before
    #: it counts as a timeout (UNKNOWN: reconciled by query before any resend), for
    #: providers with a status query (``[call_deadline_s]``); a priority absent here
    #: waits for the adapter's own timeout
    call_deadlines: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    #: an event's ``send_at`` is at most this far after the time it is read (else 400 /
    #: dead letter bad_value), and, at the door (the API), at most ``max_send_past_s`` before it
    max_send_ahead_s: float = 30 * 86400.0
    max_send_past_s: float = 86400.0
    api: ApiConfig = field(default_factory=ApiConfig)
    backpressure: BackpressureConfig = field(default_factory=BackpressureConfig)
    #: gray releases from the config (``[releases.<name>]``, pipeline/rules/release.py);
    #: the API's (PUT /v1/releases/<name>) win over these by name
    releases: tuple = ()
    callbacks: CallbacksConfig = field(default_factory=CallbacksConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    #: ``outcome_entries``: "grouped" (an entry of notify.outcomes holds every outcome
    #: one step made for one user: a JSON array when there are several) or "single"
    #: (one outcome an entry, for readers that take each entry for one object)
    outcome_entries: str = "grouped"
    #: the process's knobs from the environment (config/environment.py): read once, here
    env: Environment = field(default_factory=Environment)

    def category(self, name: str) -> CategoryConfig:
        """The category's config; KeyError when unknown."""
        return self.categories[name]

    def lane_batch_size(self, channel: str, priority: str) -> int:
        """Provider calls the ``notify.send.<channel>.<priority>`` agent keeps in flight (its
        window, docs/adr/0001): the priority's ``[lane_batch_size]`` when set, else
        ``channels.<channel>.lane_batch_size``."""
        return self.lane_batch_sizes.get(priority) or self.channels[channel].lane_batch_size

    def channel_limits(self) -> dict[str, dict[str, int]]:
        """``{channel: {part: max_length}}`` for :class:`pipeline.templates.Renderer`."""
        out: dict[str, dict[str, int]] = {}
        for name, ch in self.channels.items():
            limits: dict[str, int] = {}
            if ch.max_length is not None and name != "email":
                limits["body"] = ch.max_length
            if ch.title_max_length is not None:
                limits["subject" if name == "email" else "title"] = ch.title_max_length
            out[name] = limits
        return out


# --------------------------------------------------------------------------- loading


def load_settings(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] = os.environ) -> Settings:
    """Defaults, then the user file (``path`` or ``$NOTIFY_CONFIG``), then env vars."""
    try:
        knobs = read_env(env)
    except EnvError as exc:
        raise ConfigError(str(exc), exc.key, exc.value) from None
    raw = _read_toml(DEFAULTS_PATH)
    user_dir: Path | None = None
    path = path or knobs.config or None
    if path:
        user_path = Path(path)
        raw = _merge(raw, _read_toml(user_path))
        user_dir = user_path.resolve().parent
    return _build(raw, knobs, user_dir)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {str(path)!r}", "NOTIFY_CONFIG", str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}", None, str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc}", None, str(path)) from None


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Tables merge recursively; any other value in ``over`` replaces the default."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


_TOP_KEYS = {
    "templates_dir",
    "default_locale",
    "max_event_bytes",
    "max_recipients",
    "max_params_depth",
    "max_params_bytes",
    "redis_url",
    "data_dir",
    "partitions",
    "db_path",
    "channels",
    "categories",
    "providers",
    "routes",
    "breaker",
    "receipt_poll_s",
    "lane_batch_size",
    "call_deadline_s",
    "max_send_ahead_s",
    "max_send_past_s",
    "api",
    "backpressure",
    "releases",
    "callbacks",
    "tracking",
    "outcome_entries",
}
_CHANNEL_KEYS = {"max_length", "title_max_length", "lane_batch_size", "max_devices"}
_CATEGORY_KEYS = {"priority", "max_priority", "rate_windows", "daily_limit", "dedup_window_s", "inbox_fallback", "default_channels",
                  "one_click_unsubscribe"}
_API_KEYS = {"header_timeout_s", "body_timeout_s", "receipt_max_age_s", "receipt_max_ahead_s"}


def _build(raw: dict[str, Any], env: Environment, user_dir: Path | None) -> Settings:
    _no_unknown(raw, _TOP_KEYS, "")

    tdir = raw.get("templates_dir", "")
    if not isinstance(tdir, str):
        raise _bad("templates_dir", tdir, "a path string")
    if tdir == "":
        tpath = PACKAGE_TEMPLATES_DIR
    else:
        tpath = Path(tdir).expanduser()
        if not tpath.is_absolute() and user_dir is not None:
            tpath = user_dir / tpath
    if not tpath.is_dir():
        raise ConfigError(f"templates_dir: not a directory: {str(tpath)!r}", "templates_dir", tdir)

    locale = raw.get("default_locale", "en")
    if not isinstance(locale, str) or not _LOCALE_RE.match(locale):
        raise _bad("default_locale", locale, "a locale like 'en' or 'zh-CN'")

    data_dir = env.data_dir or raw.get("data_dir", "./data")
    if not isinstance(data_dir, str) or not data_dir:
        raise _bad("data_dir", data_dir, "a non-empty path string")
    db_path = env.db or raw.get("db_path") or os.path.join(data_dir, "records.db")
    if not isinstance(db_path, str):
        raise _bad("db_path", db_path, "a path string")
    redis_url = env.redis_url or raw.get("redis_url") or None
    if redis_url is not None and (not isinstance(redis_url, str) or "://" not in redis_url):
        raise _bad("redis_url", redis_url, "a URL like redis://host:6379/0")
    if env.partitions:
        part_raw: Any = env.partitions
        try:
            part_raw = int(part_raw)
        except ValueError:
            raise _bad("NOTIFY_PARTITIONS", part_raw, "an integer ≥ 1") from None
        partitions = _int("NOTIFY_PARTITIONS", part_raw, 1)
    else:
        partitions = _int("partitions", raw.get("partitions", 8), 1)

    channels = _channels(raw.get("channels", {}))
    categories = _categories(raw.get("categories", {}))
    providers = _providers(raw.get("providers", {}), user_dir)
    routes = _routes(raw.get("routes"), providers)

    return Settings(
        templates_dir=str(tpath.resolve()),
        default_locale=locale,
        max_event_bytes=_int("max_event_bytes", raw.get("max_event_bytes", 262144), 1),
        max_recipients=_int("max_recipients", raw.get("max_recipients", 10000), 1),
        max_params_depth=_int("max_params_depth", raw.get("max_params_depth", 8), 1),
        max_params_bytes=_int("max_params_bytes", raw.get("max_params_bytes", 65536), 2),
        redis_url=redis_url,
        data_dir=data_dir,
        partitions=partitions,
        db_path=db_path,
        channels=MappingProxyType(channels),
        categories=MappingProxyType(categories),
        providers=MappingProxyType(providers),
        routes=MappingProxyType(routes),
        breaker=_breaker(raw.get("breaker", {})),
        receipt_poll_s=_number("receipt_poll_s", raw.get("receipt_poll_s", 60.0), 0),
        lane_batch_sizes=MappingProxyType(_lane_batch_sizes(raw.get("lane_batch_size", {}))),
        call_deadlines=MappingProxyType(_call_deadlines(raw.get("call_deadline_s", {}))),
        max_send_ahead_s=_number("max_send_ahead_s", raw.get("max_send_ahead_s", 30 * 86400), 1),
        max_send_past_s=_number("max_send_past_s", raw.get("max_send_past_s", 86400), 0),
        api=_api(raw.get("api", {})),
        backpressure=_backpressure(raw.get("backpressure", {}), categories),
        releases=_releases(raw.get("releases", {})),
        callbacks=_callbacks(raw.get("callbacks", {}), env),
        tracking=_tracking(raw.get("tracking", {}), env),
        outcome_entries=_choice("outcome_entries", raw.get("outcome_entries", "grouped"), ("grouped", "single")),
        env=env,
    )


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise _bad(name, value, " or ".join(f'"{a}"' for a in allowed))
    return value


def _tracking(raw: Any, env: Environment) -> TrackingConfig:
    if not isinstance(raw, dict):
        raise _bad("tracking", raw, "a table")
    _no_unknown(raw, {"enabled", "base_url", "open_pixel"}, "tracking.")
    out = {}
    for key in ("enabled", "open_pixel"):
        v = raw.get(key, getattr(TrackingConfig, key))
        if not isinstance(v, bool):
            raise _bad(f"tracking.{key}", v, "true or false")
        out[key] = v
    base = raw.get("base_url") or env.api_public_url or TrackingConfig.base_url
    if not isinstance(base, str) or not re.match(r"^https?://[^/\s?#]+(/[^\s?#]*)?$", base):
        raise _bad("tracking.base_url", base, "an http(s) URL like https://notify.example.com")
    return TrackingConfig(base_url=base.rstrip("/"), **out)


def _releases(raw: Any) -> tuple:
    from pipeline.rules.release import parse_release

    if not isinstance(raw, dict):
        raise _bad("releases", raw, "a table of [releases.<name>] tables")
    out = []
    for name, table in raw.items():
        try:
            out.append(parse_release(name, table, CHANNELS))
        except ValueError as exc:
            key = str(exc).split(":", 1)[0]
            raise ConfigError(str(exc), key, table) from None
    return tuple(out)


def _backpressure(raw: Any, categories: Mapping[str, Any]) -> BackpressureConfig:
    if not isinstance(raw, dict):
        raise _bad("backpressure", raw, "a table")
    _no_unknown(raw, {"after_s", "retry_s", "categories"}, "backpressure.")
    d = BackpressureConfig()
    cats = raw.get("categories", list(d.categories))
    if not isinstance(cats, list) or not all(isinstance(c, str) for c in cats):
        raise _bad("backpressure.categories", cats, "a list of category names")
    for c in cats:
        if c not in categories:
            raise ConfigError(f"backpressure.categories: unknown category {c!r}", "backpressure.categories", c)
        if categories[c].priority == "high":
            raise ConfigError(f"backpressure.categories: {c!r} is high priority: never throttled",
                              "backpressure.categories", c)
    return BackpressureConfig(
        after_s=_number("backpressure.after_s", raw.get("after_s", d.after_s), 1),
        retry_s=_number("backpressure.retry_s", raw.get("retry_s", d.retry_s), 0.1),
        categories=tuple(dict.fromkeys(cats)),
    )


def _api(raw: Any) -> ApiConfig:
    if not isinstance(raw, dict):
        raise _bad("api", raw, "a table")
    _no_unknown(raw, _API_KEYS, "api.")
    d = ApiConfig()
    return ApiConfig(
        header_timeout_s=_number("api.header_timeout_s", raw.get("header_timeout_s", d.header_timeout_s), 0.01),
        body_timeout_s=_number("api.body_timeout_s", raw.get("body_timeout_s", d.body_timeout_s), 0.01),
        receipt_max_age_s=_number("api.receipt_max_age_s", raw.get("receipt_max_age_s", d.receipt_max_age_s), 1),
        receipt_max_ahead_s=_number("api.receipt_max_ahead_s", raw.get("receipt_max_ahead_s", d.receipt_max_ahead_s), 0),
    )


_CALLBACK_KEYS = {"enabled", "base_delay_s", "max_delay_s", "retry_for_s", "timeout_s", "concurrency", "max_batch",
                  "target_ttl_s", "allow"}


def _callbacks(raw: Any, env: Environment) -> CallbacksConfig:
    if not isinstance(raw, dict):
        raise _bad("callbacks", raw, "a table")
    _no_unknown(raw, _CALLBACK_KEYS, "callbacks.")
    d = CallbacksConfig()
    enabled = raw.get("enabled", d.enabled)
    if not isinstance(enabled, bool):
        raise _bad("callbacks.enabled", enabled, "true or false")
    allow = raw.get("allow", [])
    if isinstance(allow, str):
        allow = [allow]
    if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
        raise _bad("callbacks.allow", allow, "a list of hosts, CIDRs or address:port endpoints")
    allow = allow + [env.callback_allow]
    entries = tuple(x.strip() for a in allow for x in a.split(",") if x.strip())
    num = lambda k, lo: _number(f"callbacks.{k}", raw.get(k, getattr(d, k)), lo)  # noqa: E731
    base, top = num("base_delay_s", 0.001), num("max_delay_s", 0.001)
    if top < base:
        raise ConfigError(f"callbacks.max_delay_s: {top} is below base_delay_s {base}", "callbacks.max_delay_s", top)
    return CallbacksConfig(
        enabled=enabled, base_delay_s=base, max_delay_s=top, retry_for_s=num("retry_for_s", 0),
        timeout_s=num("timeout_s", 0.01), concurrency=_int("callbacks.concurrency", raw.get("concurrency", d.concurrency), 1),
        max_batch=_int("callbacks.max_batch", raw.get("max_batch", d.max_batch), 1),
        target_ttl_s=num("target_ttl_s", 1), allow=entries,
    )


def _lane_batch_sizes(raw: Any) -> dict[str, int]:
    if not isinstance(raw, dict):
        raise _bad("lane_batch_size", raw, "a table of priority = batch size")
    _no_unknown(raw, set(PRIORITIES), "lane_batch_size.")
    return {p: _int(f"lane_batch_size.{p}", v, 1) for p, v in raw.items()}


def _call_deadlines(raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise _bad("call_deadline_s", raw, "a table of priority = seconds")
    _no_unknown(raw, set(PRIORITIES), "call_deadline_s.")
    return {p: _number(f"call_deadline_s.{p}", v, 0.05) for p, v in raw.items()}


def _number(key: str, value: Any, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < minimum:
        raise _bad(key, value, f"a number >= {minimum}")
    return float(value)


def _providers(raw: Any, user_dir: Path | None = None) -> dict[str, ProviderConfig]:
    from .providers import parse_providers  # kinds, their settings, secret references

    return parse_providers(raw, user_dir)


def _routes(raw: Any, providers: dict[str, ProviderConfig]) -> dict[str, tuple[str, ...]]:
    from .providers import parse_routes

    return parse_routes(raw, providers)


def _breaker(raw: Any) -> BreakerConfig:
    if not isinstance(raw, dict):
        raise _bad("breaker", raw, "a table")
    _no_unknown(raw, {"failure_threshold", "reset_timeout_s", "half_open_max"}, "breaker.")
    return BreakerConfig(
        failure_threshold=_int("breaker.failure_threshold", raw.get("failure_threshold", 5), 1),
        reset_timeout_s=_number("breaker.reset_timeout_s", raw.get("reset_timeout_s", 5.0), 0),
        half_open_max=_int("breaker.half_open_max", raw.get("half_open_max", 1), 1),
    )


def _channels(raw: Any) -> dict[str, ChannelConfig]:
    if not isinstance(raw, dict):
        raise _bad("channels", raw, "a table")
    out: dict[str, ChannelConfig] = {}
    for name, table in raw.items():
        if name not in CHANNELS:
            raise ConfigError(
                f"channels.{name}: unknown channel {name!r} (known: {', '.join(CHANNELS)})", f"channels.{name}", name
            )
        if not isinstance(table, dict):
            raise _bad(f"channels.{name}", table, "a table")
        _no_unknown(table, _CHANNEL_KEYS, f"channels.{name}.")
        if "max_devices" in table and name != "push":
            raise ConfigError(f"channels.{name}.max_devices: only push goes to devices", f"channels.{name}.max_devices",
                              table["max_devices"])
        out[name] = ChannelConfig(
            name=name,
            max_length=_opt_int(f"channels.{name}.max_length", table.get("max_length"), 1),
            title_max_length=_opt_int(f"channels.{name}.title_max_length", table.get("title_max_length"), 1),
            lane_batch_size=_int(f"channels.{name}.lane_batch_size", table.get("lane_batch_size", 100), 1),
            max_devices=_int(f"channels.{name}.max_devices", table.get("max_devices", 10), 1),
        )
    for name in CHANNELS:  # every known channel has a config, even if the files dropped one
        out.setdefault(name, ChannelConfig(name=name))
    return {name: out[name] for name in CHANNELS}


def _categories(raw: Any) -> dict[str, CategoryConfig]:
    if not isinstance(raw, dict):
        raise _bad("categories", raw, "a table")
    if not raw:
        raise ConfigError("categories: at least one category is needed", "categories", raw)
    out: dict[str, CategoryConfig] = {}
    for name, table in raw.items():
        key = f"categories.{name}"
        if not _NAME_RE.match(name):
            raise _bad(key, name, "a category name of a-z, 0-9 and _ starting with a letter")
        if not isinstance(table, dict):
            raise _bad(key, table, "a table")
        _no_unknown(table, _CATEGORY_KEYS, key + ".")
        for required in ("priority", "dedup_window_s", "inbox_fallback", "default_channels"):
            if required not in table:
                raise ConfigError(f"{key}.{required}: missing", f"{key}.{required}", None)

        priority = table["priority"]
        if priority not in PRIORITIES:
            raise ConfigError(
                f"{key}.priority: unknown priority {priority!r} (known: {', '.join(PRIORITIES)})",
                f"{key}.priority",
                priority,
            )
        max_priority = table.get("max_priority", priority)
        if max_priority not in PRIORITIES:
            raise ConfigError(
                f"{key}.max_priority: unknown priority {max_priority!r} (known: {', '.join(PRIORITIES)})",
                f"{key}.max_priority",
                max_priority,
            )
        if PRIORITIES.index(priority) < PRIORITIES.index(max_priority):  # PRIORITIES: highest first
            raise ConfigError(
                f"{key}.max_priority: {max_priority!r} is below the category's own priority {priority!r}",
                f"{key}.max_priority",
                max_priority,
            )
        limit_raw = table.get("daily_limit")
        if limit_raw is None or (isinstance(limit_raw, str) and limit_raw.lower() in _EXEMPT):
            daily_limit = None
        else:
            if isinstance(limit_raw, str):
                raise _bad(f"{key}.daily_limit", limit_raw, 'an integer ≥ 0 or "exempt"')
            daily_limit = _int(f"{key}.daily_limit", limit_raw, 0)
        inbox_fallback = table["inbox_fallback"]
        if not isinstance(inbox_fallback, bool):
            raise _bad(f"{key}.inbox_fallback", inbox_fallback, "true or false")
        chans = table["default_channels"]
        if not isinstance(chans, list) or not chans:
            raise _bad(f"{key}.default_channels", chans, "a non-empty list of channels")
        for ch in chans:
            if ch not in CHANNELS:
                raise ConfigError(
                    f"{key}.default_channels: unknown channel {ch!r} (known: {', '.join(CHANNELS)})",
                    f"{key}.default_channels",
                    ch,
                )
        windows_raw = table.get("rate_windows", [])
        if not isinstance(windows_raw, list):
            raise _bad(f"{key}.rate_windows", windows_raw, "a list of [seconds, max] pairs")
        windows = []
        for i, pair in enumerate(windows_raw):
            if not isinstance(pair, list) or len(pair) != 2:
                raise _bad(f"{key}.rate_windows[{i}]", pair, "[seconds, max]")
            windows.append((_int(f"{key}.rate_windows[{i}]", pair[0], 1), _int(f"{key}.rate_windows[{i}]", pair[1], 0)))
        one_click = table.get("one_click_unsubscribe", False)
        if not isinstance(one_click, bool):
            raise _bad(f"{key}.one_click_unsubscribe", one_click, "true or false")
        out[name] = CategoryConfig(
            name=name,
            priority=priority,
            daily_limit=daily_limit,
            dedup_window_s=_int(f"{key}.dedup_window_s", table["dedup_window_s"], 0),
            inbox_fallback=inbox_fallback,
            default_channels=tuple(dict.fromkeys(chans)),
            max_priority=max_priority,
            rate_windows=tuple(sorted(set(windows))),
            one_click_unsubscribe=one_click,
        )
    return out


# --------------------------------------------------------------------------- checks


def _bad(key: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"{key}: expected {expected}, got {value!r}", key, value)


def _int(key: str, value: Any, minimum: int) -> int:
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(key, value, f"an integer ≥ {minimum}")
    if value < minimum:
        what = "negative" if value < 0 else "too small"
        raise ConfigError(f"{key}: {what} value {value!r} (must be ≥ {minimum})", key, value)
    return value


def _opt_int(key: str, value: Any, minimum: int) -> int | None:
    return None if value is None else _int(key, value, minimum)


def _no_unknown(table: dict[str, Any], allowed: set[str], prefix: str) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(
                f"{prefix}{key}: unknown setting (known: {', '.join(sorted(allowed))})", f"{prefix}{key}", table[key]
            )
