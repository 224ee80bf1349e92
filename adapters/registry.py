"""Build providers from configuration.

From the settings' ``[providers.<name>]`` tables and ``[routes]`` (config/providers.py
reads and checks them)::

    from config.settings import load_settings
    s = load_settings("notify.toml")
    built = build_routes(s.providers, s.routes)        # secrets from os.environ or files
    built.providers, built.routes                     # for adapters.dispatch.Dispatcher
    built.describe()                                  # {channel: [(name, kind, endpoint), ...]}
    await check_all(s.providers, s.routes)            # notify providers check: each one's auth

The defaults ``notify run`` uses (the provider simulators, the in-process fakes) are
configs of the same shape (:func:`pipeline.layout.simulator_providers`,
:func:`pipeline.providers.fake_providers`), built here the same way.

From a plain dict (tests, scripts)::

    build_provider("twilio", {"account_sid": "AC…", "auth_token": "…",
                              "from_number": "+1…", "status_callback": "https://…/v1/receipts/twilio"})

``kind`` picks the module; the dict's keys are the fields of that module's
config dataclass (unknown keys are an error, so typos fail loudly). The
provider's ``name`` defaults to the kind and can be overridden with ``name``
(e.g. two Twilio accounts as "sms_a" and "sms_a2").
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import ssl
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence
from urllib.parse import urlsplit

from config.providers import SECRETS, UNROUTED, resolve_secret
from config.settings import ConfigError, ProviderConfig
from pipeline.models import AttemptResult

from ._http import response_json
from ._token import load_private_key
from .base import PermanentKind, Provider, QueryResult, QueryStatus, SendResult
from .registry_cloud import CLOUD_KINDS, CLOUD_PROBES, cloud_endpoint, cloud_fields

__all__ = ["PROVIDER_KINDS", "ProviderSet", "build_provider", "build_spec", "build_routes", "endpoint",
           "check_all", "check_credentials", "probe", "CheckLine", "UnroutedProvider"]


def _apns(cfg: dict[str, Any]) -> Provider:
    from .apns import ApnsConfig, ApnsProvider

    return ApnsProvider(_make(ApnsConfig, cfg))


def _fcm(cfg: dict[str, Any]) -> Provider:
    from .fcm import FcmConfig, FcmProvider

    sa = cfg.pop("service_account", None)
    if sa is not None:
        return FcmProvider(FcmConfig.from_service_account(sa, **cfg))
    return FcmProvider(_make(FcmConfig, cfg))


def _hms(cfg: dict[str, Any]) -> Provider:
    from .hms import HmsConfig, HmsProvider

    return HmsProvider(_make(HmsConfig, cfg))


def _twilio(cfg: dict[str, Any]) -> Provider:
    from .sms_twilio import TwilioConfig, TwilioSmsProvider

    return TwilioSmsProvider(_make(TwilioConfig, cfg))


def _vendor(cfg: dict[str, Any]) -> Provider:
    from .sms_vendor import VendorSmsConfig, VendorSmsProvider

    return VendorSmsProvider(_make(VendorSmsConfig, cfg))


def _smtp(cfg: dict[str, Any]) -> Provider:
    from .email_smtp import SmtpConfig, SmtpProvider

    return SmtpProvider(_make(SmtpConfig, cfg))


def _webhook(cfg: dict[str, Any]) -> Provider:
    from .webhook import WebhookConfig, WebhookProvider

    if isinstance(cfg.get("allow"), str):
        cfg["allow"] = tuple(x.strip() for x in cfg["allow"].split(",") if x.strip())
    return WebhookProvider(_make(WebhookConfig, cfg))


def _inbox(cfg: dict[str, Any]) -> Provider:
    from .inbox import InboxProvider

    return InboxProvider(cfg.get("name", "inbox"))


def _fake(cfg: dict[str, Any]) -> Provider:
    from .fake import FakeProvider

    cfg = dict(cfg)
    name, channel = cfg.pop("name"), cfg.pop("channel")
    unknown = set(cfg) - {"latency_s", "primary", "query_supported"}
    if unknown:
        raise ValueError(f"FakeProvider: unknown settings {sorted(unknown)}")
    return FakeProvider(name, channel, **cfg)


PROVIDER_KINDS: dict[str, Callable[[dict[str, Any]], Provider]] = {
    "apns": _apns,
    "fcm": _fcm,
    "hms": _hms,
    "twilio": _twilio,
    "smsvendor": _vendor,
    "smtp": _smtp,
    **CLOUD_KINDS,  # sendgrid, ses, sns (adapters/registry_cloud.py)
    "webhook": _webhook,
    "inbox": _inbox,
    "fake": _fake,
}


def _make(cls: Any, cfg: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(cfg) - names
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown settings {sorted(unknown)}")
    return cls(**cfg)


def build_provider(kind: str, config: Mapping[str, Any]) -> Provider:
    try:
        factory = PROVIDER_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown provider kind {kind!r}; one of {sorted(PROVIDER_KINDS)}") from None
    cfg = dict(config)
    cfg.setdefault("name", kind)
    return factory(cfg)


# --------------------------------------------------------------------------- from the settings


class UnroutedProvider(Provider):
    """The provider of a channel turned off (``[routes] <channel> = []``): every delivery
    fails at once, permanently (reason ``rejected``), saying so; nothing waits for a
    provider that will never come."""

    name = UNROUTED
    channel = "*"

    async def send(self, delivery: Any) -> SendResult:
        return SendResult(AttemptResult.PERMANENT_ERROR, UNROUTED, permanent_kind=PermanentKind.REJECTED,
                          error=f"no provider: [routes] {delivery.channel} = [] turns the channel off")

    async def query(self, delivery_id: str, provider_msg_id: Optional[str] = None) -> QueryResult:
        return QueryResult(False, status=QueryStatus.NOT_FOUND, supported=False, provider=UNROUTED)


@dataclass
class ProviderSet:
    """What :func:`build_routes` built: the providers by name, each channel's route
    (failover order) and the tables they came from."""

    providers: dict[str, Any]
    routes: dict[str, list[str]]
    specs: dict[str, ProviderConfig] = field(default_factory=dict)

    def describe(self) -> dict[str, list[tuple[str, Optional[str], Optional[str]]]]:
        """``{channel: [(provider, kind, endpoint), ...]}`` in route order."""
        return {c: [(n, *(_kind_endpoint(self.specs.get(n)))) for n in names] for c, names in self.routes.items()}

    async def close(self) -> None:
        for p in self.providers.values():
            await p.close()


def _kind_endpoint(spec: Optional[ProviderConfig]) -> tuple[Optional[str], Optional[str]]:
    return (spec.kind, endpoint(spec)) if spec is not None else (None, None)


_DEFAULT_URL = {"apns": "https://api.push.apple.com", "fcm": "https://fcm.googleapis.com",
                "hms": "https://push-api.cloud.huawei.com",
                "twilio": "https://api.twilio.com"}


def endpoint(spec: ProviderConfig) -> Optional[str]:
    """Where the provider is called: its base URL, ``smtp(s)://host:port``; None for
    the kinds that call nothing fixed (webhook: each user's URL; inbox; fake)."""
    o = spec.options
    if spec.kind in ("apns", "fcm", "hms", "twilio", "smsvendor"):
        return str(o.get("base_url") or _DEFAULT_URL[spec.kind]).rstrip("/")
    if spec.kind in CLOUD_KINDS:
        return cloud_endpoint(spec)
    if spec.kind == "smtp":
        return f"{'smtps' if o.get('use_tls') else 'smtp'}://{o.get('host', '127.0.0.1')}:{o.get('port', 587)}"
    return None


def _tls(verify: Any) -> Any:
    """A CA bundle path as an SSLContext (httpx and the aiohttp transport both take one)."""
    if isinstance(verify, str):
        try:
            return ssl.create_default_context(cafile=verify)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"verify: cannot load the CA bundle {verify!r}: {exc}") from None
    return verify


_HTTP_MAP = {"pool": "max_connections"}


def _check_pem(spec: ProviderConfig, secret: str, pem: str, what: str) -> None:
    """The key parses and is of the type its signature needs (ES256: EC P-256, RS256: RSA)."""
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    key = _secret_key(spec, secret)
    try:
        loaded = load_private_key(pem)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{key}: not a PEM private key without a passphrase ({what}): "
                          f"{type(exc).__name__}", key, None) from None
    if spec.kind == "apns":
        ok = isinstance(loaded, ec.EllipticCurvePrivateKey) and loaded.curve.name == "secp256r1"
    else:
        ok = isinstance(loaded, rsa.RSAPrivateKey)
    if not ok:
        raise ConfigError(f"{key}: a {type(loaded).__name__.lstrip('_')}, not {what}", key, None)


def _secret_key(spec: ProviderConfig, secret: str) -> str:
    o = spec.options
    suffix = "_env" if f"{secret}_env" in o else "_file"
    return f"providers.{spec.name}.{secret}{suffix}"


def _fields(spec: ProviderConfig, env: Mapping[str, str]) -> dict[str, Any]:
    """The adapter's config dataclass fields of ``spec``, secrets resolved."""
    o = dict(spec.options)
    for secret in SECRETS[spec.kind]:
        o.pop(f"{secret}_env", None)
        o.pop(f"{secret}_file", None)
    cfg: dict[str, Any] = {_HTTP_MAP.get(k, k): v for k, v in o.items()}
    cfg["name"] = spec.name
    if "verify" in cfg:
        try:
            cfg["verify"] = _tls(cfg["verify"])
        except ValueError as exc:
            raise ConfigError(f"providers.{spec.name}.{exc}", f"providers.{spec.name}.verify", None) from None
    secret = lambda s: resolve_secret(spec, s, env)  # noqa: E731
    kind = spec.kind
    if kind == "apns":
        cfg["private_key"] = secret("key")
        _check_pem(spec, "key", cfg["private_key"], "an APNs auth key (.p8, EC P-256)")
    elif kind == "fcm":
        sa_text = secret("service_account")
        if sa_text is not None:
            key = _secret_key(spec, "service_account")
            try:
                sa = json.loads(sa_text)
            except ValueError:
                raise ConfigError(f"{key}: not JSON (a Google service-account key file is)", key, None) from None
            missing = [k for k in ("project_id", "client_email", "private_key")
                       if not isinstance(sa, dict) or not sa.get(k)]
            if missing:
                raise ConfigError(f"{key}: not a service-account key: no {', '.join(missing)}", key, None)
            base = {"project_id": sa["project_id"], "client_email": sa["client_email"],
                    "private_key": sa["private_key"], "private_key_id": sa.get("private_key_id")}
            if sa.get("token_uri"):
                base["token_uri"] = sa["token_uri"]
            cfg = {**base, **cfg}
            _check_pem(spec, "service_account", cfg["private_key"], "a service account's RSA key")
        else:
            cfg["private_key"] = secret("private_key")
            for need in ("project_id", "client_email"):
                if need not in cfg:
                    raise ConfigError(f"providers.{spec.name}.{need}: missing (needed with private_key_env / "
                                      f"private_key_file; or give service_account_file)",
                                      f"providers.{spec.name}.{need}", None)
            _check_pem(spec, "private_key", cfg["private_key"], "a service account's RSA key")
    elif kind == "hms":
        cfg["client_secret"] = secret("client_secret")
    elif kind == "twilio":
        cfg["auth_token"] = secret("auth_token")
    elif kind == "smsvendor":
        cfg["api_key"] = secret("api_key")
    elif kind == "smtp":
        if "username" in cfg:
            cfg["password"] = secret("password")
        ca = secret("ca")
        if ca is not None:
            try:
                cfg["tls_context"] = _client_context(ca)
            except (ssl.SSLError, ValueError) as exc:
                key = _secret_key(spec, "ca")
                raise ConfigError(f"{key}: not a PEM certificate: {exc}", key, None) from None
        if "bulk_categories" in cfg:
            cfg["bulk_categories"] = tuple(cfg["bulk_categories"])
    elif kind in CLOUD_KINDS:
        cfg = cloud_fields(spec, cfg, secret)
    elif kind == "webhook":
        cfg["secret"] = secret("secret")
        if "allow" in cfg:
            cfg["allow"] = tuple(cfg["allow"])
    return cfg


def _client_context(ca_pem: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca_pem)
    return ctx


def build_spec(spec: ProviderConfig, env: Mapping[str, str] = os.environ) -> Provider:
    """One provider from its table; ConfigError naming the key when a credential is
    missing or unusable."""
    if spec.kind is None:
        raise ConfigError(f"providers.{spec.name}.kind: missing", f"providers.{spec.name}.kind", None)
    cfg = _fields(spec, env)
    try:
        provider = build_provider(spec.kind, cfg)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"providers.{spec.name}: {exc}", f"providers.{spec.name}", None) from None
    if spec.kind in ("apns", "fcm", "hms"):
        # the push platform a device token names ("apns:<token>"): picks this provider
        # among the route's, whatever its name (adapters/dispatch.py)
        provider.platform = spec.kind
    return provider


def check_credentials(providers: Mapping[str, ProviderConfig], routes: Mapping[str, Sequence[str]],
                      env: Mapping[str, str] = os.environ) -> None:
    """Every credential the routed providers need, read (environment variables set,
    files readable, keys that parse), without building a client: a worker's check at
    start, so a missing one stops it with the key's name instead of failing its sends."""
    for names in routes.values():
        for n in names:
            _fields(providers[n], env)


def build_routes(providers: Mapping[str, ProviderConfig], routes: Mapping[str, Sequence[str]],
                 env: Mapping[str, str] = os.environ) -> ProviderSet:
    """Every provider ``routes`` names, built; a channel routed to ``[]`` gets the
    :class:`UnroutedProvider`. On a ConfigError, what was built is closed."""
    out = ProviderSet({}, {}, {})
    try:
        for channel, names in routes.items():
            if not names:
                out.providers.setdefault(UNROUTED, UnroutedProvider())
                out.routes[channel] = [UNROUTED]
                continue
            for n in names:
                if n not in out.providers:
                    out.providers[n] = build_spec(providers[n], env)
                    out.specs[n] = providers[n]
            out.routes[channel] = list(names)
    except BaseException:
        for p in out.providers.values():
            _close_soon(p)
        raise
    return out


def _close_soon(p: Any) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    loop.create_task(p.close())


def breaker_settings(defaults: Mapping[str, Any], spec: Optional[ProviderConfig]) -> dict[str, Any]:
    """The CircuitBreaker arguments of one provider: ``[breaker]`` overridden by its own."""
    out = dict(defaults)
    for k, v in (spec.breaker if spec is not None else {}).items():
        out["reset_timeout" if k == "reset_timeout_s" else k] = v
    return out


# --------------------------------------------------------------------------- checks


@dataclass
class CheckLine:
    name: str
    kind: Optional[str]
    ok: bool
    message: str

    def __str__(self) -> str:
        return f"{self.name:14} {self.kind or '-':9} {'ok' if self.ok else 'FAILED'}: {self.message}"


class ProbeFailed(Exception):
    pass


async def probe(provider: Any, spec: ProviderConfig, timeout: float = 10.0) -> str:
    """Try ``provider``'s credentials without sending a message; what was proven, or
    :class:`ProbeFailed` with the reason."""
    kind = spec.kind
    try:
        return await asyncio.wait_for(_PROBES[kind](provider, spec), timeout)
    except ProbeFailed:
        raise
    except asyncio.TimeoutError:
        raise ProbeFailed(f"no answer within {timeout:g} s from {endpoint(spec)}") from None
    except Exception as exc:  # noqa: BLE001 - a connection refused, a TLS failure, DNS
        raise ProbeFailed(f"{type(exc).__name__}: {exc}"[:300] or type(exc).__name__) from None


async def _probe_apns(p: Any, spec: ProviderConfig) -> str:
    p.bearer_token(force=True)  # ES256 with the key: raises on a key that cannot sign
    url = urlsplit(endpoint(spec) or "")
    host, tls = url.hostname or "", url.scheme == "https"
    port = url.port or (443 if tls else 80)
    ctx = None
    if tls:
        verify = p.config.verify
        ctx = verify if isinstance(verify, ssl.SSLContext) else ssl.create_default_context()
        if verify is False:
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
    _r, w = await asyncio.open_connection(host, port, ssl=ctx, server_hostname=host if tls else None)
    w.close()
    return (f"provider JWT signed (ES256, key {p.config.key_id}, team {p.config.team_id}); {host}:{port} reachable"
            f"{' over TLS' if tls else ''} (APNs has no call that checks the key alone: it is checked at the first "
            f"push, a refusal is 403 InvalidProviderToken)")


async def _probe_fcm(p: Any, spec: ProviderConfig) -> str:
    from .fcm import fcm_error

    try:
        bearer = await p.access_token()
    except Exception as exc:  # noqa: BLE001
        raise ProbeFailed(f"oauth token from {p.config.token_uri}: {exc}"[:300]) from None
    # validate_only: FCM checks the request (our right to send for the project) and
    # delivers nothing; a made-up registration token is refused as such
    resp = await p._client.post(
        f"/v1/projects/{p.config.project_id}/messages:send",
        json={"validate_only": True, "message": {"token": "notify-auth-probe", "data": {"probe": "1"}}},
        headers={"authorization": f"Bearer {bearer}"})
    code, message = fcm_error(response_json(resp))
    if resp.status_code == 200 or (resp.status_code == 400 and code in ("INVALID_ARGUMENT", "UNREGISTERED")):
        return (f"oauth token for {p.config.client_email}; project {p.config.project_id} took a validate_only "
                f"request (nothing sent)")
    what = "auth: " if resp.status_code in (401, 403) else ""
    raise ProbeFailed(f"{what}project {p.config.project_id}: {resp.status_code} {code} {message}".strip()[:300])


async def _probe_hms(p: Any, spec: ProviderConfig) -> str:
    from .hms import INVALID_TOKENS, SUCCESS

    try:
        bearer = await p.access_token()
    except Exception as exc:  # noqa: BLE001
        raise ProbeFailed(f"oauth token from {p.config.token_url}: {exc}"[:300]) from None
    # validate_only: Push Kit checks the request (our right to send for the app) and
    # delivers nothing; a made-up push token is refused as such (80300007)
    body = {"validate_only": True, "message": {"token": ["notify-auth-probe"], "data": '{"probe":"1"}'}}
    resp = await p._client.post(p.config.send_path, json=body,
                                headers={"authorization": f"Bearer {bearer}"})
    answer = response_json(resp)
    code = str(answer.get("code") or "")
    app = p.config.app_id or p.config.client_id
    if code in (SUCCESS, INVALID_TOKENS):
        return f"oauth token for client {p.config.client_id}; app {app} took a validate_only request (nothing sent)"
    what = "auth: " if resp.status_code in (401, 403) else ""
    raise ProbeFailed(f"{what}app {app}: {resp.status_code} {code} {answer.get('msg') or ''}".strip()[:300])


async def _probe_twilio(p: Any, spec: ProviderConfig) -> str:
    # the account resource: Basic auth checked, nothing sent
    resp = await p._client.get(f"{p._prefix}.json", auth=p._auth, headers={"accept": "application/json"})
    body = response_json(resp)
    if resp.status_code == 200:
        status = body.get("status")
        if status not in (None, "active"):
            raise ProbeFailed(f"account {p.config.account_sid} is {status}")
        return f"account {p.config.account_sid} authenticated" + (f" ({status})" if status else "")
    what = "auth: " if resp.status_code in (401, 403) else ""
    raise ProbeFailed(f"{what}GET account: {resp.status_code} {body.get('code') or ''} "
                      f"{body.get('message') or resp.reason_phrase}".strip()[:300])


async def _probe_vendor(p: Any, spec: ProviderConfig) -> str:
    # a status query of a reference never sent: the key is checked, nothing is sent
    resp = await p._client.get("/v1/sms/status", params={"client_ref": "notify-auth-probe"})
    if resp.status_code in (200, 404):
        return "API key accepted (status query)"
    what = "auth: " if resp.status_code in (401, 403) else ""
    raise ProbeFailed(f"{what}status query: {resp.status_code} {resp.text[:200]}".strip())


async def _probe_smtp(p: Any, spec: ProviderConfig) -> str:
    import aiosmtplib

    smtp = p._client()
    done = ["connected"]
    try:
        await smtp.connect()  # implicit TLS, or STARTTLS when required or offered
        await smtp.ehlo()
        done.append(f"EHLO {p.config.ehlo_name}")
        if smtp.get_transport_info("sslcontext") is not None:
            done.append("TLS")
        if p.config.username:
            try:
                await smtp.login(p.config.username, p.config.password or "")
            except aiosmtplib.SMTPAuthenticationError as exc:
                raise ProbeFailed(f"auth: {exc.code} {exc.message}"[:300]) from None
            done.append(f"AUTH as {p.config.username}")
        else:
            done.append("no AUTH configured")
        await smtp.quit()
    except ProbeFailed:
        smtp.close()
        raise
    except aiosmtplib.SMTPException as exc:
        smtp.close()
        raise ProbeFailed(f"after {done[-1]}: {type(exc).__name__}: {exc}"[:300]) from None
    return f"{endpoint(spec)}: " + ", ".join(done)


async def _probe_webhook(p: Any, spec: ProviderConfig) -> str:
    n = len(p.config.allow)
    return ("signing secret valid (whsec_); each user's URL is checked at send time by the target guard"
            + (f"; {n} allowlist entr{'y' if n == 1 else 'ies'}" if n else ""))


async def _probe_none(p: Any, spec: ProviderConfig) -> str:
    return "no credentials (nothing to try)"


_PROBES: dict[str, Callable[[Any, ProviderConfig], Any]] = {
    "apns": _probe_apns, "fcm": _probe_fcm, "hms": _probe_hms, "twilio": _probe_twilio, "smsvendor": _probe_vendor,
    "smtp": _probe_smtp, "webhook": _probe_webhook, "inbox": _probe_none, "fake": _probe_none,
    **CLOUD_PROBES,
}


async def check_all(providers: Mapping[str, ProviderConfig], routes: Mapping[str, Sequence[str]],
                    env: Mapping[str, str] = os.environ, timeout: float = 10.0) -> list[CheckLine]:
    """``notify providers check``: every provider with a kind (routed or not), built and
    its credentials tried (:func:`probe`), one line each, routed ones first."""
    routed = [n for names in routes.values() for n in names]
    names = list(dict.fromkeys(routed + [n for n, s in providers.items() if s.kind is not None]))
    lines = []
    for name in names:
        spec = providers.get(name)
        if spec is None or spec.kind is None:
            continue
        try:
            provider = build_spec(spec, env)
        except ConfigError as exc:
            lines.append(CheckLine(name, spec.kind, False, str(exc)))
            continue
        started = time.monotonic()
        try:
            msg = await probe(provider, spec, timeout)
            lines.append(CheckLine(name, spec.kind, True, msg + f" [{(time.monotonic() - started) * 1000:.0f} ms]"))
        except ProbeFailed as exc:
            lines.append(CheckLine(name, spec.kind, False, str(exc)))
        finally:
            try:
                await provider.close()
            except Exception:  # noqa: BLE001
                pass
    for channel, rnames in routes.items():
        if not rnames:
            lines.append(CheckLine(f"routes.{channel}", None, True, "[]: the channel is off (its deliveries fail)"))
    return lines
