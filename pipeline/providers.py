"""Which providers a worker calls, as a provider config built by
:mod:`adapters.registry` (pipeline/runtime.py opens them once per process).

``NOTIFY_PROVIDERS`` picks the config:

* ``config``: the settings' own ``[providers.*]`` and ``[routes]`` (README "Real
  providers"); the default when the config file has ``[routes]``;
* ``fake`` (the default otherwise): in-process fakes, :func:`fake_providers`;
* ``simulators``: the provider simulators, :func:`pipeline.layout.simulator_providers`
  from their info (their addresses and generated credentials).

Whatever the source, the settings' ``[providers.<name>]`` table of a provider's name
gives its token bucket (``rate``, ``burst``) and breaker overrides. Nothing here
imports the Faust app: ``notify providers check`` and the tests use it as it is.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Optional

log = logging.getLogger(__name__)

#: the fakes' routes (a fake per name; sms_b is provider B)
ROUTES_FAKE = {
    "inbox": ["inbox"],
    "push": ["apns", "fcm", "hms"],
    "sms": ["sms_a", "sms_b"],
    "email": ["email"],
    "webhook": ["webhook"],
}


def fake_providers(latency: Optional[float] = None) -> tuple[dict, dict]:
    """The in-process fakes as a provider config (``kind = "fake"``, zero latency
    unless ``NOTIFY_FAKE_LATENCY``): ``(tables, secrets)`` as
    :func:`pipeline.layout.simulator_providers` gives them (the fakes have no secret)."""
    if latency is None:
        from config.environment import read_env

        latency = read_env().fake_latency_s
    tables: dict = {"inbox": {"kind": "inbox"}}
    for name, channel in (("apns", "push"), ("fcm", "push"), ("hms", "push"), ("sms_a", "sms"), ("sms_b", "sms"),
                          ("email", "email"), ("webhook", "webhook")):
        tables[name] = {"kind": "fake", "channel": channel, "latency_s": latency}
    tables["sms_b"]["primary"] = False  # provider B: healthy whatever the scenario of the address
    return {"providers": tables, "routes": {c: list(n) for c, n in ROUTES_FAKE.items()}}, {}


def provider_specs(tables: dict, conf: Any) -> tuple[dict, dict]:
    """A produced provider config (the simulators', the fakes') read as a config file's
    would be, each provider's rate, burst and breaker taken from the settings' table of
    the same name: ``({name: ProviderConfig}, {channel: (name, ...)})``."""
    import dataclasses

    from config.providers import parse_providers, parse_routes

    specs = parse_providers(tables["providers"], None)
    for name, spec in specs.items():
        own = conf.providers.get(name)
        if own is not None:
            specs[name] = dataclasses.replace(spec, rate=own.rate, burst=own.burst, breaker=own.breaker)
    return specs, parse_routes(tables["routes"], specs)


def provider_source(conf: Any) -> str:
    """``NOTIFY_PROVIDERS`` (``conf.env.providers``), else ``config`` when the settings
    have ``[routes]``, else ``fake``."""
    return conf.env.providers or ("config" if conf.routes else "fake")


def provider_set(conf: Any, env: Optional[Mapping[str, str]] = None, info: Optional[dict] = None) -> tuple[Any, dict]:
    """The providers this worker calls, built (adapters/registry.py), and their tables:
    ``(ProviderSet, {name: ProviderConfig})``. ``info``: the simulators' (source
    ``simulators``). Raises ConfigError naming the key (a credential missing, …)."""
    from adapters.registry import build_routes
    from config.settings import ConfigError

    from .layout import simulator_providers

    env = os.environ if env is None else env
    source = provider_source(conf)
    if source == "config":
        if not conf.routes:
            raise ConfigError("NOTIFY_PROVIDERS=config: the config has no [routes] (README \"Real providers\")",
                              "routes", None)
        specs, routes, secrets = dict(conf.providers), dict(conf.routes), env
    elif source in ("simulators", "fake"):
        if conf.routes:
            log.warning("the config's [routes] are not used: NOTIFY_PROVIDERS=%s", source)
        if source == "simulators":
            if info is None:
                raise ConfigError("NOTIFY_PROVIDERS=simulators: no simulators' info", "NOTIFY_SIMULATORS", None)
            tables, secrets = simulator_providers(info, conf.env.provider_timeout_s)
        else:
            tables, secrets = fake_providers(conf.env.fake_latency_s)
        specs, routes = provider_specs(tables, conf)
    else:
        raise ConfigError(f"NOTIFY_PROVIDERS: unknown {source!r} (config, simulators or fake)", "NOTIFY_PROVIDERS",
                          source)
    return build_routes(specs, routes, secrets), specs


def check_at_start(conf: Any, env: Optional[Mapping[str, str]] = None) -> None:
    """A worker's check before it starts, with the config's own providers: every
    credential the routes need is there (environment variables set, files readable,
    keys that parse). Raises ConfigError naming the key: the worker stops with one
    line instead of failing its sends."""
    from adapters.registry import check_credentials
    from config.settings import ConfigError

    env = os.environ if env is None else env
    if provider_source(conf) != "config":
        return
    if not conf.routes:
        raise ConfigError("NOTIFY_PROVIDERS=config: the config has no [routes] (README \"Real providers\")",
                          "routes", None)
    check_credentials(conf.providers, conf.routes, env)
