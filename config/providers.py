"""``[providers.<name>]`` and ``[routes]``: which providers the pipeline calls, read
and checked when the settings load (:func:`config.settings.load_settings`).

A provider table with a ``kind`` describes one provider: its endpoint, timeouts,
pool, token bucket, breaker overrides and credentials; ``[routes]`` gives each
channel its providers in failover order::

    [providers.twilio]
    kind = "twilio"
    account_sid = "AC0123…"
    auth_token_env = "TWILIO_AUTH_TOKEN"     # the secret: an environment variable …
    from_number = "+15550001111"
    rate = 200
    burst = 400

    [providers.apns]
    kind = "apns"
    team_id = "ABCDE12345"
    key_id = "KEY1234567"
    key_file = "/etc/notify/AuthKey_KEY1234567.p8"   # … or a file, never the file's text
    topic = "com.example.app"

    [routes]
    push = ["apns", "fcm"]
    sms = ["twilio", "sms_b"]

Secrets are never written in the file: each kind's secret settings (``SECRETS``)
are given as ``<secret>_env`` (the name of an environment variable) or
``<secret>_file`` (a path; relative to the config file). Writing the secret
itself (``auth_token = "…"``) is refused at load, naming the key; so are an
unknown kind or setting, a value of the wrong type, a route naming a provider
that is not defined or is of another channel. Whether the environment variable
is set and the file readable is checked when the providers are built (a worker,
``notify providers check``): a command that sends no message needs no credential.

A provider table without ``kind`` is, as before, only a token bucket (``rate``,
``burst``) and breaker overrides for a provider of that name built elsewhere: the
provider simulators or the in-process fakes, which ``notify run`` and the tests use
when the config has no ``[routes]``.

This module has no dependencies beyond the standard library (the adapters are
built from what it returns by :mod:`adapters.registry`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Optional
from urllib.parse import urlsplit

__all__ = ["KINDS", "KIND_CHANNEL", "SECRETS", "UNROUTED", "parse_providers", "parse_routes", "resolve_secret",
           "secret_ref"]

#: the reserved name of the provider of a channel turned off (``[routes] <channel> = []``)
UNROUTED = "unrouted"

_HTTP = {"base_url": "url", "timeout": "pos", "connect_timeout": "pos", "pool": "int1", "verify": "verify"}

#: kind → its settings and their types (``str``, ``url``, ``pos`` a number > 0, ``num0`` a
#: number ≥ 0, ``int0``/``int1`` an integer ≥ 0 / ≥ 1, ``bool``, ``strs`` a list of strings,
#: ``verify`` true/false or the path of a CA bundle, ``channel``)
KINDS: Mapping[str, Mapping[str, str]] = MappingProxyType({
    "apns": {**_HTTP, "team_id": "str", "key_id": "str", "topic": "str", "token_ttl": "pos",
             "device_retry_after": "pos", "expiration_s": "int0", "push_type": "str"},
    "fcm": {**_HTTP, "project_id": "str", "client_email": "str", "private_key_id": "str", "token_uri": "url",
            "ttl_s": "int0", "http2": "bool"},
    "hms": {**_HTTP, "client_id": "str", "app_id": "str", "token_url": "url", "ttl_s": "int0",
            "receipt_username": "str"},
    "twilio": {**_HTTP, "account_sid": "str", "from_number": "str", "messaging_service_sid": "str",
               "status_callback": "url", "idempotency_header": "str", "reconcile_param": "str"},
    "smsvendor": {**_HTTP, "sender": "str", "callback_url": "url"},
    "smtp": {"host": "str", "port": "port", "timeout": "pos", "from_addr": "str", "from_name": "str",
             "username": "str", "use_tls": "bool", "start_tls": "bool", "validate_certs": "bool",
             "msgid_domain": "str", "local_hostname": "str", "bulk_categories": "strs",
             # the session pool (adapters/_smtp_pool.py): ``pool`` → SmtpConfig.max_connections
             "pool": "int1", "keepalive_s": "pos", "max_messages": "int1"},
    "sendgrid": {**_HTTP, "from_addr": "str", "from_name": "str", "reply_to": "str", "bulk_categories": "strs",
                 "event_webhook_public_key": "str"},
    "ses": {**_HTTP, "region": "str", "access_key_id": "str", "from_addr": "str", "from_name": "str",
            "reply_to": "str", "configuration_set": "str", "bulk_categories": "strs", "sns_topic_arns": "strs",
            "sns_cert_urls": "strs"},
    "sns": {**_HTTP, "region": "str", "access_key_id": "str", "sms_type": "str", "sender_id": "str",
            "origination_number": "str"},
    "webhook": {"timeout": "pos", "connect_timeout": "pos", "pool": "int1", "verify": "verify",
                "user_agent": "str", "allow": "strs"},
    "inbox": {},
    "fake": {"channel": "channel", "latency_s": "num0", "primary": "bool", "query_supported": "bool"},
})

#: kind → the channel its providers serve (``fake``: the table's ``channel``)
KIND_CHANNEL: Mapping[str, Optional[str]] = MappingProxyType({
    "apns": "push", "fcm": "push", "hms": "push", "twilio": "sms", "smsvendor": "sms", "smtp": "email",
    "webhook": "webhook",
    "sendgrid": "email", "ses": "email", "sns": "sms",
    "inbox": "inbox", "fake": None,
})

#: kind → its secrets, each given as ``<secret>_env`` or ``<secret>_file``
SECRETS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "apns": ("key",),  # the .p8 signing key (PEM)
    "fcm": ("service_account", "private_key"),  # the service-account JSON, or its private key (PEM)
    # the app's OAuth 2.0 client secret; the callback key of its receipt configuration
    # (AppGallery Connect: Push Kit's receipts, verified by POST /v1/receipts/<name>)
    "hms": ("client_secret", "receipt_key"),
    "twilio": ("auth_token",),
    "smsvendor": ("api_key",),
    "smtp": ("password", "ca"),  # ca: the PEM of a private relay's CA (not secret, but a file)
    "sendgrid": ("api_key",),
    # AWS: the access key id may be a setting or, like the secret key, a reference
    "ses": ("access_key_id", "secret_access_key", "session_token"),
    "sns": ("access_key_id", "secret_access_key", "session_token"),
    "webhook": ("secret",),
    "inbox": (),
    "fake": (),
})

#: what must be there, per kind: a setting, or one of several (``a|b``; secrets by their name)
_REQUIRED: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "apns": ("team_id", "key_id", "topic", "key"),
    "fcm": ("service_account|private_key",),
    "hms": ("client_id", "client_secret"),
    "twilio": ("account_sid", "auth_token", "from_number|messaging_service_sid"),
    "smsvendor": ("base_url", "api_key"),
    "smtp": ("host",),
    "sendgrid": ("api_key", "from_addr"),
    "ses": ("region", "access_key_id", "secret_access_key", "from_addr"),
    "sns": ("region", "access_key_id", "secret_access_key"),
    "webhook": ("secret",),
    "inbox": (),
    "fake": ("channel",),
})

#: settings of every table, with or without a kind
_COMMON = ("kind", "rate", "burst", "breaker")
_BREAKER_KEYS = ("failure_threshold", "reset_timeout_s", "half_open_max")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
#: what an inline secret may be called besides the kind's own secret names
_SECRET_WORDS = ("password", "secret", "token", "private_key", "api_key", "key")


@dataclass(frozen=True)
class SecretRef:
    """Where a secret is: ``env`` (a variable's name) or ``file`` (an absolute path)."""

    key: str  #: the dotted key it was given as, for errors
    env: Optional[str] = None
    file: Optional[str] = None


def _cfg():
    from . import settings  # the helpers and ConfigError (settings imports this module lazily)

    return settings


def parse_providers(raw: Any, user_dir: Optional[Path]) -> dict[str, Any]:
    """``[providers]`` → ``{name: ProviderConfig}``; raises ConfigError naming the key."""
    s = _cfg()
    if not isinstance(raw, dict):
        raise s._bad("providers", raw, "a table")
    out = {}
    for name, table in raw.items():
        key = f"providers.{name}"
        if not _NAME.match(str(name)):
            raise s._bad(key, name, "a provider name of a-z, 0-9 and _ starting with a letter")
        if name == UNROUTED:
            raise s.ConfigError(f"{key}: the name {UNROUTED!r} is reserved (the provider of a channel turned off)",
                                key, name)
        if not isinstance(table, dict):
            raise s._bad(key, table, "a table")
        out[name] = _provider(name, table, user_dir)
    return out


def _provider(name: str, table: dict[str, Any], user_dir: Optional[Path]) -> Any:
    s = _cfg()
    key = f"providers.{name}"
    kind = table.get("kind")
    rate = table.get("rate")
    if rate is not None:
        rate = s._number(f"{key}.rate", rate, 0.001)
    burst = table.get("burst")
    burst = s._number(f"{key}.burst", burst, 1) if burst is not None else rate
    breaker = _breaker(key, table.get("breaker", {}))
    if kind is None:  # a token bucket (and breaker) for a provider built elsewhere
        for k in table:
            if k not in _COMMON and _looks_secret(k):
                raise s.ConfigError(f"{key}.{k}: a secret is never written in the config file (and a table "
                                    f"without a kind takes none: give it kind = \"…\" and {k}_env or {k}_file)",
                                    f"{key}.{k}", None)
        s._no_unknown(table, {"rate", "burst", "breaker", "kind"}, key + ".")
        if rate is None:
            raise s.ConfigError(f"{key}.kind: missing (a provider table without a kind only sets the rate of "
                                f"a provider of that name, and then needs rate)", f"{key}.kind", None)
        return s.ProviderConfig(name, rate, burst, breaker=breaker)
    if not isinstance(kind, str) or kind not in KINDS:
        raise s.ConfigError(f"{key}.kind: unknown provider kind {kind!r} (known: {', '.join(KINDS)})",
                            f"{key}.kind", kind)
    fields = KINDS[kind]
    secrets = SECRETS[kind]
    options: dict[str, Any] = {}
    for k, v in table.items():
        if k in _COMMON:
            continue
        if k in fields:
            options[k] = _typed(f"{key}.{k}", fields[k], v, user_dir)
            continue
        base, _, how = k.rpartition("_")
        if base in secrets and how in ("env", "file"):
            if f"{base}_{'file' if how == 'env' else 'env'}" in table:
                raise s.ConfigError(f"{key}.{k}: give {base}_env or {base}_file, not both", f"{key}.{k}", None)
            options[k] = _ref(f"{key}.{k}", how, v, user_dir)
            continue
        if k in secrets or _looks_secret(k):
            # receipt_password → receipt_key: the kind's secret of the same first word, else its first
            hint = k if k in secrets else next((x for x in secrets if x.split("_")[0] == k.split("_")[0]),
                                               secrets[0] if secrets else k)
            raise s.ConfigError(
                f"{key}.{k}: a secret is never written in the config file: give {hint}_env = \"VARIABLE\" "
                f"(an environment variable) or {hint}_file = \"/path\" instead", f"{key}.{k}", None)
        known = sorted([*fields, *_COMMON, *(f"{x}_{h}" for x in secrets for h in ("env", "file"))])
        raise s.ConfigError(f"{key}.{k}: unknown setting for kind {kind!r} (known: {', '.join(known)})",
                            f"{key}.{k}", None)
    for need in _REQUIRED[kind]:
        alts = need.split("|")
        if not any(a in options or f"{a}_env" in options or f"{a}_file" in options for a in alts):
            what = " or ".join(f"{a}_env / {a}_file" if a in secrets else a for a in alts)
            raise s.ConfigError(f"{key}: missing {what} (needed by kind {kind!r})", f"{key}.{alts[0]}", None)
    if kind == "smtp" and ("password_env" in options or "password_file" in options) and "username" not in options:
        raise s.ConfigError(f"{key}.username: missing (a password is for AUTH, which needs a username)",
                            f"{key}.username", None)
    if kind == "hms" and ("receipt_username" in options) != any(f"receipt_key_{h}" in options for h in ("env", "file")):
        # Push Kit authenticates its receipt callbacks only when both are configured
        missing = "receipt_key_env / receipt_key_file" if "receipt_username" in options else "receipt_username"
        raise s.ConfigError(f"{key}: missing {missing} (receipt callbacks are authenticated with the callback "
                            f"user name and key together)", f"{key}.{missing.split(' ')[0]}", None)
    channel = KIND_CHANNEL[kind] or options.get("channel")
    return s.ProviderConfig(name, rate, burst, kind=kind, channel=channel, options=MappingProxyType(options),
                            breaker=breaker)


def _looks_secret(k: str) -> bool:
    return any(k == w or k.endswith("_" + w) for w in _SECRET_WORDS)


def _breaker(key: str, raw: Any) -> Mapping[str, Any]:
    s = _cfg()
    if not isinstance(raw, dict):
        raise s._bad(f"{key}.breaker", raw, "a table (failure_threshold, reset_timeout_s, half_open_max)")
    s._no_unknown(raw, set(_BREAKER_KEYS), f"{key}.breaker.")
    out: dict[str, Any] = {}
    if "failure_threshold" in raw:
        out["failure_threshold"] = s._int(f"{key}.breaker.failure_threshold", raw["failure_threshold"], 1)
    if "reset_timeout_s" in raw:
        out["reset_timeout_s"] = s._number(f"{key}.breaker.reset_timeout_s", raw["reset_timeout_s"], 0)
    if "half_open_max" in raw:
        out["half_open_max"] = s._int(f"{key}.breaker.half_open_max", raw["half_open_max"], 1)
    return MappingProxyType(out)


def _path(value: str, user_dir: Optional[Path]) -> str:
    p = Path(value).expanduser()
    if not p.is_absolute() and user_dir is not None:
        p = user_dir / p
    return str(p)


def _ref(key: str, how: str, value: Any, user_dir: Optional[Path]) -> SecretRef:
    s = _cfg()
    if how == "env":
        if not isinstance(value, str) or not _ENV_NAME.match(value):
            # never echoed: it may be the secret pasted where its variable's name goes
            raise s.ConfigError(f"{key}: expected the name of an environment variable (A-Z, 0-9 and _, e.g. "
                                f"TWILIO_AUTH_TOKEN); the value given is not one (is it the secret itself? secrets "
                                f"are never written in the config file)", key, None)
        return SecretRef(key, env=value)
    if not isinstance(value, str) or not value or "\n" in value:
        raise s.ConfigError(f"{key}: expected the path of a file (is it the secret itself? secrets are never "
                            f"written in the config file)", key, None)
    return SecretRef(key, file=_path(value, user_dir))


def _typed(key: str, t: str, v: Any, user_dir: Optional[Path]) -> Any:
    s = _cfg()
    if t == "str":
        if not isinstance(v, str) or not v:
            raise s._bad(key, v, "a non-empty string")
        return v
    if t == "url":
        if not isinstance(v, str) or urlsplit(v).scheme not in ("http", "https") or not urlsplit(v).hostname:
            raise s._bad(key, v if not _has_password(v) else "***", "an http:// or https:// URL")
        if _has_password(v):
            raise s.ConfigError(f"{key}: a URL with a password: secrets are never written in the config file",
                                key, None)
        return v
    if t == "pos":
        value = s._number(key, v, 0)
        if value <= 0:
            raise s._bad(key, v, "a number > 0")
        return value
    if t == "num0":
        return s._number(key, v, 0)
    if t == "int0":
        return s._int(key, v, 0)
    if t == "int1":
        return s._int(key, v, 1)
    if t == "port":
        port = s._int(key, v, 1)
        if port > 65535:
            raise s._bad(key, v, "a port (1-65535)")
        return port
    if t == "bool":
        if not isinstance(v, bool):
            raise s._bad(key, v, "true or false")
        return v
    if t == "strs":
        if isinstance(v, str):
            v = [x.strip() for x in v.split(",") if x.strip()]
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            raise s._bad(key, v, "a list of strings")
        return tuple(v)
    if t == "verify":
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v:
            return _path(v, user_dir)
        raise s._bad(key, v, "true, false or the path of a CA bundle")
    if t == "channel":
        if v not in s.CHANNELS:
            raise s.ConfigError(f"{key}: unknown channel {v!r} (known: {', '.join(s.CHANNELS)})", key, v)
        return v
    raise AssertionError(t)  # pragma: no cover


def _has_password(v: Any) -> bool:
    try:
        return isinstance(v, str) and urlsplit(v).password is not None
    except ValueError:
        return False


def parse_routes(raw: Any, providers: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """``[routes]`` → ``{channel: (provider, ...)}`` in failover order; ``{}`` when there
    is none (the simulators or fakes then). Every channel but inbox must be routed
    (an empty list turns it off: its deliveries fail, reason ``rejected``); inbox
    defaults to a provider ``inbox`` of kind inbox, added to ``providers`` when absent."""
    s = _cfg()
    if raw is None or raw == {}:
        return {}
    if not isinstance(raw, dict):
        raise s._bad("routes", raw, "a table of channel = [provider, ...]")
    out: dict[str, tuple[str, ...]] = {}
    for channel, names in raw.items():
        key = f"routes.{channel}"
        if channel not in s.CHANNELS:
            raise s.ConfigError(f"{key}: unknown channel {channel!r} (known: {', '.join(s.CHANNELS)})", key, channel)
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise s._bad(key, names, "a list of provider names, in failover order")
        if len(set(names)) != len(names):
            raise s.ConfigError(f"{key}: a provider named twice in {names!r}", key, names)
        for n in names:
            p = providers.get(n)
            if p is None:
                defined = ", ".join(sorted(k for k, v in providers.items() if v.kind)) or "none"
                raise s.ConfigError(f"{key}: unknown provider {n!r}: no [providers.{n}] table (defined: {defined})",
                                    key, n)
            if p.kind is None:
                raise s.ConfigError(f"{key}: provider {n!r} has no kind ([providers.{n}] only sets a rate); "
                                    f"give it kind = \"…\" and its settings", key, n)
            if p.channel != channel:
                raise s.ConfigError(f"{key}: provider {n!r} (kind {p.kind}) serves {p.channel}, not {channel}", key, n)
        out[channel] = tuple(names)
    if "inbox" not in out:
        if "inbox" not in providers or providers["inbox"].kind is None:
            base = providers.get("inbox")
            providers["inbox"] = s.ProviderConfig("inbox", base.rate if base else None, base.burst if base else None,
                                                  kind="inbox", channel="inbox")
        elif providers["inbox"].channel != "inbox":
            raise s.ConfigError("routes.inbox: missing, and [providers.inbox] is not of the inbox channel",
                                "routes.inbox", None)
        out["inbox"] = ("inbox",)
    for channel in s.CHANNELS:
        if channel not in out:
            raise s.ConfigError(
                f"routes.{channel}: missing: with [routes], every channel lists its providers in failover order "
                f"(an empty list, {channel} = [], turns the channel off: its deliveries fail)",
                f"routes.{channel}", None)
    return {c: out[c] for c in s.CHANNELS}


def secret_ref(spec: Any, secret: str) -> Optional[SecretRef]:
    """Where ``spec`` (a ProviderConfig) keeps ``secret``, or None when it gives none."""
    return spec.options.get(f"{secret}_env") or spec.options.get(f"{secret}_file")


def resolve_secret(spec: Any, secret: str, env: Mapping[str, str] = os.environ) -> Optional[str]:
    """The value of ``secret`` of ``spec``: from its environment variable (in ``env``) or
    its file; None when the table gives none. Raises ConfigError naming the key, never
    with the secret in the message."""
    s = _cfg()
    ref = secret_ref(spec, secret)
    if ref is None:
        return None
    if ref.env is not None:
        value = env.get(ref.env)
        if value is None:
            raise s.ConfigError(f"{ref.key}: environment variable {ref.env} is not set", ref.key, ref.env)
        if not value.strip():
            raise s.ConfigError(f"{ref.key}: environment variable {ref.env} is empty", ref.key, ref.env)
        return value
    try:
        with open(ref.file, encoding="utf-8") as fh:  # type: ignore[arg-type]
            value = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise s.ConfigError(f"{ref.key}: cannot read {ref.file!r}: {reason}", ref.key, ref.file) from None
    if not value.strip():
        raise s.ConfigError(f"{ref.key}: {ref.file!r} is empty", ref.key, ref.file)
    # a token or password file usually ends with a newline: it is not part of the secret
    return value if "-----BEGIN" in value or value.lstrip().startswith("{") else value.strip()
