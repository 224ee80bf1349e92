"""Local provider simulators: real servers on 127.0.0.1 speaking each
provider's protocol, for tests, fault drills and the embedded demo.

=========  ===================================  ==========================================
simulator  protocol                             auth
=========  ===================================  ==========================================
apns       HTTP/2 cleartext (prior knowledge)   ES256 provider JWT (kid / iss / iat)
fcm        HTTP/1.1, FCM v1 + OAuth token URL   RS256 JWT grant → Bearer access token
hms        HTTP/1.1, Push Kit v1 + OAuth URL    client credentials → Bearer access token
twilio     HTTP/1.1, Twilio Messages API        Basic AccountSid:AuthToken
smsvendor  HTTP/1.1, JSON vendor API            X-Api-Key
smtp       SMTP (aiosmtpd), optional STARTTLS   optional AUTH PLAIN/LOGIN
webhook    HTTP/1.1 receiver                    verifies Standard Webhooks signatures
=========  ===================================  ==========================================

Every HTTP simulator serves ``POST /_sim/mode`` (``{"mode": "ok"|"down"|
"slow"|"flaky"|"ratelimit"|"timeout", "status"?, "delay"?, "rate"?,
"retry_after"?, "for_s"?, "count"?}``), ``GET /_sim/ledger[?key=<delivery_id>]``
and ``POST /_sim/reset``; in process the same is ``sims.twilio.core.set_mode(...)``,
``.core.ledger_view(key)``, ``.core.calls(key)``. Per-message scenarios are
listed in :mod:`adapters.simulators.common` and each simulator's module.

Use::

    sims = await start_all("http://127.0.0.1:8080/v1/receipts")  # receipts → <url>/<provider>
    providers = sims.build_providers()      # {"apns": ApnsProvider, "twilio": ..., ...}
    ...
    await sims.stop()

``python -m adapters.simulators`` runs them standalone and prints the URLs and
generated credentials as JSON; a worker started with ``NOTIFY_PROVIDERS=simulators``
and ``NOTIFY_SIMULATORS=<that JSON in a file>`` uses those running simulators
(:func:`build_providers_from_info`) instead of starting its own, so their state and
ledger outlive the worker (fault drills kill workers). ``ledger_path`` (``--ledger``)
appends every provider call of every simulator to one JSON-lines file.

By provider family, each in a process of its own (what ``notify run`` starts, so a
burst at one family never slows another's answers)::

    python -m adapters.simulators --family push    --info data/simulators.json  # apns, fcm, hms
    python -m adapters.simulators --family sms     --info data/simulators.json  # twilio, smsvendor
    python -m adapters.simulators --family email   --info data/simulators.json  # smtp
    python -m adapters.simulators --family webhook --info data/simulators.json  # the webhook receiver

Each writes its part (:func:`part_path`: ``data/simulators.push.json``, …) and,
once every family's part is there, the merged info file ``--info`` (the same
keys as :meth:`Simulators.as_dict`; :func:`publish_part`), so readers of
``NOTIFY_SIMULATORS`` see one file as before. In process: :func:`start_family`.
A simulator's rng is seeded with ``--seed`` + its place in :data:`ORDER` in
either layout, and ``--ledger`` may name one file for every family (one
``write(2)`` per line on an ``O_APPEND`` descriptor: lines never interleave).
"""

from __future__ import annotations

import os
import random
import secrets
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from ..apns import ApnsConfig, ApnsProvider
from ..base import Provider
from ..email_smtp import SmtpConfig, SmtpProvider
from ..fcm import FcmConfig, FcmProvider
from ..hms import HmsConfig, HmsProvider
from ..inbox import InboxProvider
from ..receipts import MemoryReplayGuard, ReceiptVerifier, ReplayGuard
from ..sms_twilio import TwilioConfig, TwilioSmsProvider
from ..sms_vendor import VendorSmsConfig, VendorSmsProvider
from ..webhook import WebhookConfig, WebhookProvider, endpoint_of
from .apns_sim import ApnsSim
from .common import SimProfile
from .fcm_sim import FcmSim
from .group import SimGroup, receipt_url
from .hms_sim import HmsSim
from .smtp_sim import SmtpSim
from .twilio_sim import IDEMPOTENCY_HEADER, RECONCILE_PARAM, TwilioSim
from .vendor_sim import VendorSim
from .webhook_sim import WebhookSim

__all__ = ["Simulators", "SimProfile", "start_all", "build_providers_from_info", "read_ledger", "FAMILIES", "ORDER",
           "FamilySims", "start_family", "part_path", "publish_part", "merge_parts"]

#: the simulators by provider family (the channel they serve), one process each in
#: ``notify run``'s layout (pipeline/layout.py); SNS SMS, SendGrid and SES
#: (:mod:`adapters.simulators.cloud`) are not among them: the default routes do not use them
FAMILIES: dict[str, tuple[str, ...]] = {
    "push": ("apns", "fcm", "hms"),
    "sms": ("twilio", "smsvendor"),
    "email": ("smtp",),
    "webhook": ("webhook",),
}
#: :func:`start_all`'s order; a simulator's rng is seeded with the profile's seed
#: plus its place here, whether it runs with all the others or with its family
ORDER: tuple[str, ...] = ("apns", "fcm", "twilio", "smsvendor", "smtp", "webhook", "hms")


def _urls_of(name: str, sim: Any) -> dict[str, str]:
    """The ``urls`` entries of one simulator in :meth:`Simulators.as_dict`."""
    if name == "fcm":
        return {"fcm": sim.base_url, "fcm_token_uri": sim.token_uri}
    if name == "hms":
        return {"hms": sim.base_url, "hms_token_url": sim.token_url}
    if name == "smtp":
        return {"smtp": f"smtp://{sim.host}:{sim.port}"}
    if name == "webhook":
        return {"webhook": sim.url("ok")}
    return {name: sim.base_url}


def _entry_of(name: str, sim: Any) -> dict[str, Any]:
    """One simulator's own entry (URL and generated credentials) in :meth:`Simulators.as_dict`."""
    if name == "fcm":
        return {"service_account": sim.service_account(), "base_url": sim.base_url}
    if name == "twilio":
        return {**sim.credentials(), "base_url": sim.base_url, "reconcile_param": RECONCILE_PARAM}
    if name == "smtp":
        return {**sim.credentials(), "cert_pem": sim.cert_pem.decode() if sim.cert_pem else None}
    if name == "webhook":
        return {**sim.credentials(), "url": sim.url("ok")}
    if name == "hms":
        return {**sim.credentials(), "base_url": sim.base_url, "token_url": sim.token_url, **sim.receipt_credentials()}
    return {**sim.credentials(), "base_url": sim.base_url}  # apns, smsvendor


@dataclass
class Simulators(SimGroup):
    apns: ApnsSim
    fcm: FcmSim
    twilio: TwilioSim
    vendor: VendorSim
    smtp: SmtpSim
    webhook: WebhookSim
    hms: HmsSim
    receipts_url: Optional[str] = None
    _started: list[Any] = field(default_factory=list, repr=False)
    _ledger_fd: Optional[int] = field(default=None, repr=False)

    @property
    def all(self) -> dict[str, Any]:
        return {"apns": self.apns, "fcm": self.fcm, "twilio": self.twilio, "smsvendor": self.vendor, "smtp": self.smtp, "webhook": self.webhook,
                "hms": self.hms}

    def urls(self) -> dict[str, str]:
        return {k: v for name, sim in self.all.items() for k, v in _urls_of(name, sim).items()}

    # ------------------------------------------------------------ provider configs

    def provider_configs(self, timeout: float = 5.0) -> dict[str, Any]:
        """Adapter configs pointing at the simulators: swapping these for the
        real endpoints and credentials is the whole difference in production."""
        apns = self.apns.credentials()
        return {
            "apns": ApnsConfig(base_url=self.apns.base_url, timeout=timeout, **apns),
            "fcm": FcmConfig.from_service_account(self.fcm.service_account(), base_url=self.fcm.base_url, timeout=timeout),
            "twilio": TwilioConfig(
                account_sid=self.twilio.account_sid,
                auth_token=self.twilio.auth_token,
                from_number=self.twilio.from_number,
                base_url=self.twilio.base_url,
                status_callback=receipt_url(self.receipts_url, "twilio"),
                idempotency_header=IDEMPOTENCY_HEADER,
                reconcile_param=RECONCILE_PARAM,
                timeout=timeout,
            ),
            "smsvendor": VendorSmsConfig(
                api_key=self.vendor.api_key,
                base_url=self.vendor.base_url,
                sender="NOTIFY",
                callback_url=receipt_url(self.receipts_url, "smsvendor"),
                timeout=timeout,
            ),
            "smtp": SmtpConfig(
                host=self.smtp.host,
                port=self.smtp.port,
                username=self.smtp.username,
                password=self.smtp.password,
                start_tls=True if self.smtp.tls else False,
                tls_context=self.smtp.client_tls_context(),
                timeout=timeout,
                from_addr="notify@example.com",
                msgid_domain="notify.example.com",
            ),
            # the receiver simulator's own address and port, nothing else of this machine
            "webhook": WebhookConfig(secret=self.webhook.secret, allow=(endpoint_of(self.webhook.base_url),),
                                     timeout=timeout),
            "hms": HmsConfig(**self.hms.credentials(), base_url=self.hms.base_url, token_url=self.hms.token_url,
                             timeout=timeout),
        }

    def build_providers(self, timeout: float = 5.0) -> dict[str, Provider]:
        c = self.provider_configs(timeout)
        return {
            "apns": ApnsProvider(c["apns"]),
            "fcm": FcmProvider(c["fcm"]),
            "twilio": TwilioSmsProvider(c["twilio"]),
            "smsvendor": VendorSmsProvider(c["smsvendor"]),
            "smtp": SmtpProvider(c["smtp"]),
            "webhook": WebhookProvider(c["webhook"]),
            "hms": HmsProvider(c["hms"]),
            "inbox": InboxProvider(),
        }

    def receipt_verifier(self, guard: Optional[ReplayGuard] = None, **kw: Any) -> ReceiptVerifier:
        return ReceiptVerifier(
            twilio_auth_token=self.twilio.auth_token,
            vendor_secret=self.vendor.webhook_secret,
            hms_username=self.hms.receipt_username,
            hms_key=self.hms.receipt_key,
            guard=guard or MemoryReplayGuard(),
            **kw,
        )

    # ------------------------------------------------------------ ledgers

    def ledger(self, key: Optional[str] = None) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for sim in self.all.values():
            rows.extend(sim.core.ledger_view(key))
        rows.sort(key=lambda r: r["t"])
        return rows

    def set_profile(self, profile: SimProfile) -> None:
        for sim in self.all.values():
            sim.core.profile = profile
            sim.core.rng = random.Random(profile.seed)

    def reset(self) -> None:
        for sim in self.all.values():
            sim.core.reset()

    def as_dict(self) -> dict[str, Any]:
        """URLs and generated credentials (JSON-able) for an external process."""
        return {"urls": self.urls(), "receipts_url": self.receipts_url,
                **{name: _entry_of(name, sim) for name, sim in self.all.items()}}

    async def stop(self) -> None:
        await super().stop()
        _close_ledger(self)


def _attach_ledger(group: Any, path: Optional[str]) -> None:
    if path:
        group._ledger_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        for sim in group.all.values():
            sim.core.attach_ledger_file(group._ledger_fd)


def _close_ledger(group: Any) -> None:
    if group._ledger_fd is not None:
        for sim in group.all.values():
            sim.core.attach_ledger_file(None)
        os.close(group._ledger_fd)
        group._ledger_fd = None


def _make(name: str, profile: SimProfile, host: str, receipts_url: Optional[str], *, smtp_tls: bool, smtp_auth: bool,
          twilio_auth_token: Optional[str], vendor_secret: Optional[str], hms_receipt_key: Optional[str]) -> Any:
    """One simulator of :data:`ORDER`, as :func:`start_all` and :func:`start_family` make it."""
    if name == "apns":
        return ApnsSim(profile, host=host)
    if name == "fcm":
        return FcmSim(profile, host=host)
    if name == "twilio":
        return TwilioSim(profile, host=host, receipts_url=receipt_url(receipts_url, "twilio"),
                         auth_token=twilio_auth_token)
    if name == "smsvendor":
        return VendorSim(profile, host=host, receipts_url=receipt_url(receipts_url, "smsvendor"),
                         webhook_secret=vendor_secret)
    if name == "smtp":
        return SmtpSim(profile, host=host, tls=smtp_tls, username="notify" if smtp_auth else None,
                       password=secrets.token_hex(8) if smtp_auth else None)
    if name == "webhook":
        return WebhookSim(profile, host=host)
    if name == "hms":
        return HmsSim(profile, host=host, receipts_url=receipt_url(receipts_url, "hms"), receipt_key=hms_receipt_key)
    raise ValueError(f"no simulator {name!r}")


@dataclass
class FamilySims(SimGroup):
    """The simulators of one family (:data:`FAMILIES`), started by :func:`start_family`."""

    family: str
    sims: dict[str, Any]
    receipts_url: Optional[str] = None
    _started: list[Any] = field(default_factory=list, repr=False)
    _ledger_fd: Optional[int] = field(default=None, repr=False)

    @property
    def all(self) -> dict[str, Any]:
        return self.sims

    def as_dict(self) -> dict[str, Any]:
        """This family's part of :meth:`Simulators.as_dict` (its ``urls`` and its
        simulators' entries), with ``family`` and ``pid`` (the process serving them),
        which :func:`merge_parts` leaves out."""
        return {"family": self.family, "pid": os.getpid(),
                "urls": {k: v for name, sim in self.sims.items() for k, v in _urls_of(name, sim).items()},
                "receipts_url": self.receipts_url, **{name: _entry_of(name, sim) for name, sim in self.sims.items()}}

    async def stop(self) -> None:
        await super().stop()
        _close_ledger(self)


async def start_all(
    receipts_url: Optional[str] = None,
    *,
    profile: Optional[SimProfile] = None,
    host: str = "127.0.0.1",
    smtp_tls: bool = False,
    smtp_auth: bool = False,
    twilio_auth_token: Optional[str] = None,
    vendor_secret: Optional[str] = None,
    ledger_path: Optional[str] = None,
    hms_receipt_key: Optional[str] = None,
) -> Simulators:
    """Start every simulator on ``host`` (ephemeral ports). ``receipts_url``:
    where SMS receipts go, as ``<receipts_url>/<provider>`` (or a template with
    ``{provider}``); ``profile``: random behaviour (default: realistic, mostly
    successful); ``smtp_tls``/``smtp_auth``: require STARTTLS / AUTH;
    ``twilio_auth_token``/``vendor_secret``/``hms_receipt_key``: the secrets receipts
    are signed with (default: random), shared with the receipts endpoint of the API
    (Push Kit's receipts go to ``<receipts_url>/hms``, its callback user name is
    ``notify-sim``);
    ``ledger_path``: also append every ledger row of every simulator to this file
    (JSON lines, see :func:`read_ledger`)."""
    profile = profile or SimProfile.realistic()
    kw = dict(smtp_tls=smtp_tls, smtp_auth=smtp_auth, twilio_auth_token=twilio_auth_token, vendor_secret=vendor_secret,
              hms_receipt_key=hms_receipt_key)
    made = {name: _make(name, profile, host, receipts_url, **kw) for name in ORDER}
    sims = Simulators(apns=made["apns"], fcm=made["fcm"], twilio=made["twilio"], vendor=made["smsvendor"],
                      smtp=made["smtp"], webhook=made["webhook"], hms=made["hms"], receipts_url=receipts_url)
    sims.seed_rngs(profile)  # the place in ORDER, as start_family seeds them
    _attach_ledger(sims, ledger_path)
    await sims.start_each()
    return sims


async def start_family(
    family: str,
    receipts_url: Optional[str] = None,
    *,
    profile: Optional[SimProfile] = None,
    host: str = "127.0.0.1",
    smtp_tls: bool = False,
    smtp_auth: bool = False,
    twilio_auth_token: Optional[str] = None,
    vendor_secret: Optional[str] = None,
    ledger_path: Optional[str] = None,
    hms_receipt_key: Optional[str] = None,
) -> FamilySims:
    """Start the simulators of one family of :data:`FAMILIES` on ``host``, with the
    same arguments as :func:`start_all` (those of other families are ignored): the
    same simulators, the same seeds, the same receipts' secrets."""
    if family not in FAMILIES:
        raise ValueError(f"no simulator family {family!r} (one of {', '.join(FAMILIES)})")
    profile = profile or SimProfile.realistic()
    kw = dict(smtp_tls=smtp_tls, smtp_auth=smtp_auth, twilio_auth_token=twilio_auth_token, vendor_secret=vendor_secret,
              hms_receipt_key=hms_receipt_key)
    sims = FamilySims(family, {name: _make(name, profile, host, receipts_url, **kw) for name in FAMILIES[family]},
                      receipts_url=receipts_url)
    for name, sim in sims.sims.items():  # the seed start_all gives it
        sim.core.rng = random.Random(None if profile.seed is None else profile.seed + ORDER.index(name))
    _attach_ledger(sims, ledger_path)
    await sims.start_each()
    return sims


# -- one info file from the families' parts ------------------------------------


def part_path(info_path: str, family: str) -> str:
    """Where the ``family`` process writes its part of ``info_path``:
    ``simulators.json`` → ``simulators.<family>.json`` (pipeline/layout.py waits for it)."""
    root, ext = os.path.splitext(str(info_path))
    return f"{root}.{family}{ext or '.json'}"


def merge_parts(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The families' parts (:meth:`FamilySims.as_dict`) as one info: the keys and
    the shape of :meth:`Simulators.as_dict` (``urls`` merged, simulators in
    :data:`ORDER`; ``family`` and ``pid`` left out)."""
    parts = list(parts)
    urls: dict[str, str] = {}
    entries: dict[str, Any] = {}
    receipts = None
    for part in parts:
        urls.update(part.get("urls") or {})
        receipts = receipts or part.get("receipts_url")
        entries.update({k: v for k, v in part.items() if k not in ("family", "pid", "urls", "receipts_url")})
    ordered = {name: entries.pop(name) for name in ORDER if name in entries}
    return {"urls": urls, "receipts_url": receipts, **ordered, **entries}


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def publish_part(info_path: str, family: str, part: bytes, families: Iterable[str] = FAMILIES) -> bool:
    """Write ``family``'s part (JSON bytes) next to ``info_path`` and, when every
    family of ``families`` has its part there, the merged info to ``info_path``,
    both atomically. Under an exclusive lock (``<info_path>.lock``), so families
    publishing at once never lose one another's part; the merged file is written
    before the part, so it is complete (and current) once the last part is there.
    True if the merged file was written."""
    import fcntl

    import orjson

    families = tuple(families)
    lock = os.open(str(info_path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        parts = {family: orjson.loads(part)}
        for other in families:
            if other == family:
                continue
            try:
                with open(part_path(info_path, other), "rb") as fh:
                    parts[other] = orjson.loads(fh.read())
            except (FileNotFoundError, orjson.JSONDecodeError):
                continue
        complete = all(f in parts for f in families)
        if complete:
            _write_atomic(str(info_path), orjson.dumps(merge_parts(parts[f] for f in families)))
        _write_atomic(part_path(info_path, family), part)
        return complete
    finally:
        os.close(lock)


def read_ledger(path: str) -> list[dict[str, Any]]:
    """The rows of a ledger file (``ledger_path``), in the order they were written
    (a last line cut short by a killed process is skipped)."""
    import orjson

    rows = []
    try:
        with open(path, "rb") as fh:
            for line in fh:
                try:
                    rows.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return rows


def build_providers_from_info(info: dict[str, Any], timeout: float = 5.0) -> dict[str, Provider]:
    """Adapters for simulators running elsewhere (another process), from what
    :meth:`Simulators.as_dict` printed: the same configs as
    :meth:`Simulators.provider_configs`, built from plain JSON."""
    from .tls import client_tls_context

    receipts = info.get("receipts_url")
    apns, tw, vendor, smtp = info["apns"], info["twilio"], info["smsvendor"], info["smtp"]
    fcm = FcmConfig.from_service_account(info["fcm"]["service_account"], base_url=info["fcm"]["base_url"], timeout=timeout)
    return {
        "apns": ApnsProvider(ApnsConfig(base_url=apns["base_url"], timeout=timeout, team_id=apns["team_id"],
                                        key_id=apns["key_id"], private_key=apns["private_key"], topic=apns["topic"])),
        "fcm": FcmProvider(fcm),
        "twilio": TwilioSmsProvider(TwilioConfig(
            account_sid=tw["account_sid"], auth_token=tw["auth_token"], from_number=tw["from_number"],
            base_url=tw["base_url"], status_callback=receipt_url(receipts, "twilio"),
            idempotency_header=IDEMPOTENCY_HEADER, reconcile_param=tw.get("reconcile_param", RECONCILE_PARAM),
            timeout=timeout)),
        "smsvendor": VendorSmsProvider(VendorSmsConfig(
            api_key=vendor["api_key"], base_url=vendor["base_url"], sender="NOTIFY",
            callback_url=receipt_url(receipts, "smsvendor"), timeout=timeout)),
        "smtp": SmtpProvider(SmtpConfig(
            host=smtp["host"], port=smtp["port"], username=smtp.get("username"), password=smtp.get("password"),
            start_tls=True if smtp.get("starttls") else False,
            tls_context=client_tls_context(smtp["cert_pem"].encode()) if smtp.get("cert_pem") else None,
            timeout=timeout, from_addr="notify@example.com", msgid_domain="notify.example.com")),
        "webhook": WebhookProvider(WebhookConfig(secret=info["webhook"]["secret"],
                                                 allow=(endpoint_of(info["webhook"]["url"]),), timeout=timeout)),
        **({"hms": HmsProvider(HmsConfig(client_id=info["hms"]["client_id"], client_secret=info["hms"]["client_secret"],
                                         app_id=info["hms"]["app_id"], base_url=info["hms"]["base_url"],
                                         token_url=info["hms"]["token_url"], timeout=timeout))}
           if "hms" in info else {}),
        "inbox": InboxProvider(),
    }
