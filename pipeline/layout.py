"""The process layout ``notify run`` starts, the same one a deployment runs on many
hosts (README "Deployment"):

    broker       the embedded server (unless REDIS_URL points at one)
    sims-push    the provider simulators, one process per family (--providers simulators):
    sims-sms       push (apns, fcm, hms), sms (twilio, smsvendor), email (smtp) and
    sims-email     webhook (the receiver), so a burst at one family never slows
    sims-webhook   another's answers, as separate providers would not
    priority     one worker of role ``priority``: the OTP / security path (pipeline/roles.py)
    main-0..N-1  N workers of role ``main`` (default: one per core), splitting the partitions
    api          the HTTP API and the status page

``--no-priority-process`` runs N workers of role ``all`` instead (every agent in
each). Each entry is a :class:`Proc`: a name, the ``notify`` arguments and the
environment; :mod:`pipeline.supervise` starts and restarts them.

The simulators run at nice +5 (:data:`SIMULATOR_NICE`): they stand for providers,
which answer from machines of their own; on one box they would otherwise take the
cores from the priority worker when an OTP wakes it (they used 50 of the 207 CPU
seconds of bench/real.py). Their answers keep their latency profile; under a
saturated box they come later, as a provider's would over a congested link.

Each simulators' process writes its family's part next to the info file
(``simulators.push.json``, …: :func:`simulator_part`) and, once every family's part
is there, the merged info file itself (``simulators.json``, what
``NOTIFY_SIMULATORS`` names: the same keys as when one process ran them all), before
the workers start.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Optional

from .procs import worker_env

__all__ = ["Proc", "plan", "default_workers", "describe", "simulator_providers", "simulator_part", "SIMULATOR_ROUTES",
           "SIMULATOR_FAMILIES"]


@dataclass(frozen=True)
class Proc:
    name: str
    argv: tuple[str, ...]  # after ``python -m``
    env: dict = field(default_factory=dict, compare=False)
    metrics_port: Optional[int] = None
    waits_for: Optional[str] = None  # a file the process writes once it serves
    #: the workers hold what it gave them at start (the simulators' ports and
    #: credentials): restarted with it
    restarts_workers: bool = False

    @property
    def group(self) -> Optional[str]:
        """The consumer group a worker process reads as (None for the others)."""
        if "worker" not in self.argv or "--role" not in self.argv:
            return None
        from .roles import app_id

        return app_id(self.argv[self.argv.index("--role") + 1])


#: how much the simulators' processes lower their CPU priority (see the module docs)
SIMULATOR_NICE = 5


def default_workers() -> int:
    """One main worker per core (at least one)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def plan(env: dict, *, workers: int, priority_process: bool, api_port: int, metrics_port: int,
         loglevel: str, simulators_info: Optional[str] = None, priority_workers: int = 1) -> list[Proc]:
    """The processes to start, in order (the broker is started before, by the caller)."""
    procs: list[Proc] = []
    if simulators_info:
        # one process per family, all writing their parts of the one info file
        for family in SIMULATOR_FAMILIES:
            argv = ("adapters.simulators", "--family", family, "--info", simulators_info,
                    "--nice", str(SIMULATOR_NICE))
            if env.get("NOTIFY_RECEIPTS_URL"):
                argv += ("--receipts-url", env["NOTIFY_RECEIPTS_URL"])
            procs.append(Proc(f"sims-{family}", argv, env, waits_for=simulator_part(simulators_info, family),
                              restarts_workers=True))
        env = dict(env, NOTIFY_SIMULATORS=simulators_info)
    role = "main" if priority_process else "all"
    port = metrics_port or None
    if priority_process:
        n = max(1, priority_workers)
        for i in range(n):
            penv = worker_env(env, role="priority", workers=n, index=i)
            if port:
                penv["NOTIFY_METRICS_PORT"] = str(port + workers + i)
            procs.append(Proc("priority" if n == 1 else f"priority-{i}",
                              ("pipeline.cli", "worker", "-l", loglevel, "--role", "priority"), penv,
                              metrics_port=port + workers + i if port else None))
    for i in range(workers):
        wenv = worker_env(env, role=role, workers=workers, index=i)
        if port:
            wenv["NOTIFY_METRICS_PORT"] = str(port + i)
        procs.append(Proc(f"{role if priority_process else 'worker'}-{i}",
                          ("pipeline.cli", "worker", "-l", loglevel, "--role", role), wenv,
                          metrics_port=port + i if port else None))
    if api_port:
        procs.append(Proc("api", ("pipeline.cli", "api", "--port", str(api_port)), env))
    return procs


def describe(procs: list[Proc]) -> str:
    """One line per process, for ``notify run``'s start banner."""
    lines = []
    for p in procs:
        extra = f"  metrics :{p.metrics_port}" if p.metrics_port else ""
        lines.append(f"  {p.name:12} {sys.executable.rsplit('/', 1)[-1]} -m {' '.join(p.argv)}{extra}")
    return "\n".join(lines)


# -- the simulators as providers ------------------------------------------------

#: the simulators' routes: one provider of each kind, named as the kind
SIMULATOR_ROUTES = {
    "inbox": ["inbox"],
    "push": ["apns", "fcm", "hms"],
    "sms": ["twilio", "smsvendor"],
    "email": ["smtp"],
    "webhook": ["webhook"],
}


#: the simulators' families, one process each (``python -m adapters.simulators --family F``;
#: adapters/simulators/__init__.py ``FAMILIES`` says which simulators): the channels
#: of SIMULATOR_ROUTES but the inbox, which has no simulator
SIMULATOR_FAMILIES = ("push", "sms", "email", "webhook")


def simulator_part(info: str, family: str) -> str:
    """The file the ``family`` process writes (its part of ``info``), as
    adapters/simulators/__init__.py ``part_path`` names it (not imported here: the
    launcher does not load the simulators): ``simulators.json`` → ``simulators.sms.json``."""
    root, ext = os.path.splitext(str(info))
    return f"{root}.{family}{ext or '.json'}"


def simulator_providers(info: dict, timeout: float = 5.0) -> tuple[dict, dict]:
    """The provider config of the simulators described by ``info`` (what ``python -m
    adapters.simulators --info`` writes, or ``Simulators.as_dict()``): the same
    ``[providers.*]`` and ``[routes]`` tables a deployment writes for the real
    services (README "Real providers"), their endpoints the simulators' addresses.
    Returns ``(tables, secrets)``: ``tables`` as TOML would give them, with every
    credential an ``*_env`` reference; ``secrets`` the values of those references
    (handed over in memory, never put in the environment)."""
    import json

    from adapters.simulators.twilio_sim import IDEMPOTENCY_HEADER, RECONCILE_PARAM
    from adapters.webhook import endpoint_of

    receipts = info.get("receipts_url")

    def receipt_url(provider: str) -> Optional[str]:
        if not receipts:
            return None
        return receipts.format(provider=provider) if "{provider}" in receipts else receipts.rstrip("/") + "/" + provider

    apns, sa, tw, vendor, smtp = (info["apns"], info["fcm"]["service_account"], info["twilio"], info["smsvendor"],
                                  info["smtp"])
    secrets = {
        "NOTIFY_SIM_APNS_KEY": apns["private_key"],
        "NOTIFY_SIM_FCM_SERVICE_ACCOUNT": json.dumps(sa),
        "NOTIFY_SIM_TWILIO_AUTH_TOKEN": tw["auth_token"],
        "NOTIFY_SIM_VENDOR_API_KEY": vendor["api_key"],
        "NOTIFY_SIM_WEBHOOK_SECRET": info["webhook"]["secret"],
    }
    providers: dict = {
        "apns": {"kind": "apns", "base_url": apns["base_url"], "team_id": apns["team_id"], "key_id": apns["key_id"],
                 "topic": apns["topic"], "key_env": "NOTIFY_SIM_APNS_KEY", "timeout": timeout},
        "fcm": {"kind": "fcm", "base_url": info["fcm"]["base_url"],
                "service_account_env": "NOTIFY_SIM_FCM_SERVICE_ACCOUNT", "timeout": timeout},
        "twilio": {"kind": "twilio", "base_url": tw["base_url"], "account_sid": tw["account_sid"],
                   "auth_token_env": "NOTIFY_SIM_TWILIO_AUTH_TOKEN", "from_number": tw["from_number"],
                   "idempotency_header": IDEMPOTENCY_HEADER,
                   "reconcile_param": tw.get("reconcile_param", RECONCILE_PARAM), "timeout": timeout},
        "smsvendor": {"kind": "smsvendor", "base_url": vendor["base_url"], "api_key_env": "NOTIFY_SIM_VENDOR_API_KEY",
                      "sender": "NOTIFY", "timeout": timeout},
        "smtp": {"kind": "smtp", "host": smtp["host"], "port": smtp["port"], "start_tls": bool(smtp.get("starttls")),
                 "timeout": timeout, "from_addr": "notify@example.com", "msgid_domain": "notify.example.com"},
        # the receiver simulator's own address and port, nothing else of this machine
        "webhook": {"kind": "webhook", "secret_env": "NOTIFY_SIM_WEBHOOK_SECRET",
                    "allow": [endpoint_of(info["webhook"]["url"])], "timeout": timeout},
        "inbox": {"kind": "inbox"},
    }
    hms = info.get("hms")  # simulators started before Push Kit's was added have none
    if hms:
        providers["hms"] = {"kind": "hms", "base_url": hms["base_url"], "token_url": hms["token_url"],
                            "client_id": hms["client_id"], "app_id": hms["app_id"],
                            "client_secret_env": "NOTIFY_SIM_HMS_CLIENT_SECRET", "timeout": timeout}
        secrets["NOTIFY_SIM_HMS_CLIENT_SECRET"] = hms["client_secret"]
    if receipt_url("twilio"):
        providers["twilio"]["status_callback"] = receipt_url("twilio")
        providers["smsvendor"]["callback_url"] = receipt_url("smsvendor")
    if smtp.get("username"):
        providers["smtp"].update(username=smtp["username"], password_env="NOTIFY_SIM_SMTP_PASSWORD")
        secrets["NOTIFY_SIM_SMTP_PASSWORD"] = smtp.get("password") or ""
    if smtp.get("cert_pem"):
        providers["smtp"]["ca_env"] = "NOTIFY_SIM_SMTP_CA"
        secrets["NOTIFY_SIM_SMTP_CA"] = smtp["cert_pem"]
    routes = {c: [n for n in names if n in providers] for c, names in SIMULATOR_ROUTES.items()}
    return {"providers": providers, "routes": routes}, secrets
