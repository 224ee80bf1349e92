"""The process's knobs from the environment: every ``NOTIFY_*`` variable is read
here, once, into :class:`Environment` (``Settings.env``), and nowhere else.

A process builds its settings once (:func:`config.settings.load_settings`, which
calls :func:`read_env`) and passes them down: the app factory
(pipeline/app.py ``create_app``), the API, the CLI. The table below is the one
list of these variables; docs/CONFIG.md prints it (``notify env`` too). Secrets
(``secret=True``) are kept out of ``repr``.

Provider credentials named by a provider table (``auth_token_env = "..."``,
config/providers.py) are not knobs: they are looked up by the name the
operator chose, in the environment given to the provider registry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional

__all__ = ["Environment", "EnvError", "ROLES", "SCHED_CLASSES", "debug_requested", "outside_ephemeral", "port_range", "read_env", "table"]

ROLES = ("all", "main", "priority")
#: NOTIFY_MAIN_SCHED → the Linux scheduling class a ``main`` worker takes at start
SCHED_CLASSES = {"idle": "SCHED_IDLE", "batch": "SCHED_BATCH", "normal": None}


def _knob(var: str, default: Any, doc: str, *, secret: bool = False) -> Any:
    return field(default=default, repr=not secret, metadata={"var": var, "doc": doc, "secret": secret})


@dataclass(frozen=True)
class Environment:
    # -- where things are (also in the config file; the variable wins) -----------
    config: Optional[str] = _knob("NOTIFY_CONFIG", None, "the TOML config file over config/defaults.toml")
    redis_url: Optional[str] = _knob("REDIS_URL", None, "the broker (a Redis or Redis Cluster URL); unset: `notify run` starts the embedded server")
    data_dir: Optional[str] = _knob("NOTIFY_DATA_DIR", None, "data directory (default ./data)")
    db: Optional[str] = _knob("NOTIFY_DB", None, "the SQLite record store (default <data_dir>/records.db)")
    partitions: Optional[str] = _knob("NOTIFY_PARTITIONS", None, "partitions of every user-keyed topic (default 8)")
    callback_allow: str = _knob("NOTIFY_CALLBACK_ALLOW", "", "producers' callback targets allowed besides public addresses")
    # -- a worker process (set by `notify run` / `notify worker`) --------------------
    broker: Optional[str] = _knob("NOTIFY_BROKER", None, "the broker URL a worker uses (set by `notify run` once the server is up)")
    role: str = _knob("NOTIFY_ROLE", "all", "all | main | priority: which agents a worker runs (pipeline/roles.py)")
    workers: int = _knob("NOTIFY_WORKERS", 1, "worker slots the partitions are split into")
    worker_index: Optional[int] = _knob("NOTIFY_WORKER_INDEX", None, "this worker's preferred slot")
    lease: Optional[float] = _knob("NOTIFY_LEASE", None, "partition lease (s) of the static ownership")
    members: Optional[str] = _knob("NOTIFY_MEMBERS", None, "`dynamic`: elastic group membership")
    main_nice: int = _knob("NOTIFY_MAIN_NICE", 10, "nice increment a `main` worker takes (0: none)")
    main_sched: str = _knob("NOTIFY_MAIN_SCHED", "idle", "idle | batch | normal: a `main` worker's scheduling class")
    metrics_port: Optional[int] = _knob("NOTIFY_METRICS_PORT", None, "a worker's Prometheus port on 127.0.0.1")
    free_ports: str = _knob("NOTIFY_FREE_PORTS", "", "lo-hi: where a port for a server of ours is picked (default: from 10000 to below the kernel's ephemeral range)")
    loop: str = _knob("NOTIFY_LOOP", "uvloop", "uvloop | asyncio: a worker's event loop")
    debug: bool = _knob("NOTIFY_DEBUG", False, "CLI errors with their traceback")
    profile_dir: Optional[str] = _knob("NOTIFY_PROFILE_DIR", None, "a worker runs under cProfile and writes <dir>/worker-<role>-<pid>.prof when it stops (bench/real.py --calls)")
    # -- tuning of the hot path ----------------------------------------------------
    slice_ms: float = _knob("NOTIFY_SLICE_MS", 2.0, "longest an agent runs before it yields to the others (ms)")
    record_within_ms: float = _knob("NOTIFY_RECORD_WITHIN_MS", 20.0, "how long an outcome waits for company before its records are written (ms)")
    purge_every_s: float = _knob("NOTIFY_PURGE_EVERY_S", 60.0, "how often expired dedup keys, counters and marks are purged (s)")
    inflight_keep_s: float = _knob("NOTIFY_INFLIGHT_KEEP_S", 3600.0, "how long a done delivery's inflight mark is kept (s)")
    purge_chunk: int = _knob("NOTIFY_PURGE_CHUNK", 500, "tombstones the purge sends before it waits for them")
    scheduler_batch: int = _knob("NOTIFY_SCHEDULER_BATCH", 1000, "timers fired per scheduler pass")
    handoff: bool = _knob("NOTIFY_HANDOFF", True, "a delivery planned for a lane of the same worker with a free slot is handed to it in memory, not through its topic (0: always through the topic; docs/adr/0002)")
    # -- the clock (tests move it) -------------------------------------------------
    clock_offset_s: float = _knob("NOTIFY_CLOCK_OFFSET_S", 0.0, "seconds added to the pipeline's wall clock")
    clock_file: Optional[str] = _knob("NOTIFY_CLOCK_FILE", None, "a file holding a clock offset, re-read when it changes")
    # -- providers -----------------------------------------------------------------
    providers: Optional[str] = _knob("NOTIFY_PROVIDERS", None, "config | simulators | fake (default: config with [routes], else fake)")
    provider_timeout_s: float = _knob("NOTIFY_PROVIDER_TIMEOUT", 5.0, "the simulators' adapters' timeout (s)")
    fake_latency_s: float = _knob("NOTIFY_FAKE_LATENCY", 0.0, "latency of the in-process fake providers (s)")
    simulators: Optional[str] = _knob("NOTIFY_SIMULATORS", None, "the simulators' info file (simulators in another process)")
    receipts_url: Optional[str] = _knob("NOTIFY_RECEIPTS_URL", None, "where in-process simulators post receipts")
    twilio_auth_token: Optional[str] = _knob("NOTIFY_TWILIO_AUTH_TOKEN", None, "in-process Twilio simulator's token", secret=True)
    vendor_secret: Optional[str] = _knob("NOTIFY_VENDOR_SECRET", None, "in-process SMS vendor simulator's secret", secret=True)
    hms_receipt_key: Optional[str] = _knob("NOTIFY_HMS_RECEIPT_KEY", None, "Push Kit simulator's receipt callback key", secret=True)
    webhook_allow: str = _knob("NOTIFY_WEBHOOK_ALLOW", "", "webhook targets allowed besides public addresses")
    callback_secret: Optional[str] = _knob("NOTIFY_CALLBACK_SECRET", None, "the operator's key signing status callbacks", secret=True)
    # -- the API -------------------------------------------------------------------
    api_key: Optional[str] = _knob("NOTIFY_API_KEY", None, "a bootstrap API key with every scope", secret=True)
    api_public_url: Optional[str] = _knob("NOTIFY_API_PUBLIC_URL", None, "the API's externally visible base URL")
    api_idempotency_ttl: Optional[int] = _knob("NOTIFY_API_IDEMPOTENCY_TTL", None, "seconds an idempotency record is kept")
    tracking_secret: Optional[str] = _knob("NOTIFY_TRACKING_SECRET", None, "the key signing tracked links (unset: one generated into <data_dir>/tracking.key)", secret=True)

    def worker_slot(self) -> str:
        """``<role>-<index>``: how this worker names itself (breakers, processes)."""
        return f"{self.role}-{self.worker_index or 0}"


class EnvError(ValueError):
    """A knob with a value it cannot take: names the variable."""

    def __init__(self, var: str, value: Any, expected: str) -> None:
        super().__init__(f"{var}={value!r}: expected {expected}")
        self.key, self.value = var, value


def _convert(var: str, raw: str, kind: Any) -> Any:
    text = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    try:
        if "bool" in text:
            return raw.strip().lower() not in ("", "0", "false", "no", "off")
        if "int" in text:
            return int(raw)
        if "float" in text:
            return float(raw)
    except ValueError:
        raise EnvError(var, raw, "an integer" if "int" in text else "a number") from None
    return raw


def read_env(env: Optional[Mapping[str, str]] = None) -> Environment:
    """The knobs set in ``env`` (default: this process's environment), checked.
    Unset or empty variables keep their defaults."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for f in fields(Environment):
        raw = env.get(f.metadata["var"])
        if raw is None or raw == "":
            continue
        values[f.name] = _convert(f.metadata["var"], raw, f.type)
    out = Environment(**values)
    if out.role not in ROLES:
        raise EnvError("NOTIFY_ROLE", out.role, "one of " + ", ".join(ROLES))
    if out.main_sched not in SCHED_CLASSES:
        raise EnvError("NOTIFY_MAIN_SCHED", out.main_sched, "one of " + ", ".join(SCHED_CLASSES))
    if out.workers < 1:
        raise EnvError("NOTIFY_WORKERS", out.workers, "an integer ≥ 1")
    if out.free_ports and not _port_range(out.free_ports):
        raise EnvError("NOTIFY_FREE_PORTS", out.free_ports, "lo-hi, two ports with lo < hi")
    if out.loop not in ("uvloop", "asyncio"):
        raise EnvError("NOTIFY_LOOP", out.loop, "uvloop or asyncio")
    return out


def _port_range(text: str) -> Optional[tuple[int, int]]:
    lo, sep, hi = text.partition("-")
    try:
        a, b = int(lo), int(hi)
    except ValueError:
        return None
    return (a, b) if sep and 0 < a < b < 65536 else None


def port_range(env: Environment) -> tuple[int, int]:
    """Where :func:`pipeline.embedded.free_port` looks (``NOTIFY_FREE_PORTS``, lo and
    hi inclusive). Default: clear of the kernel's ephemeral range, the ports
    outgoing connections draw from (:func:`outside_ephemeral`: from 10000 to just
    below it, on Linux's default), so a port picked now and bound
    seconds later (a server that starts after its broker) is not taken meanwhile
    as the local end of some connection."""
    if env.free_ports:
        return _port_range(env.free_ports)  # type: ignore[return-value] - checked by read_env
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(v) for v in f.read().split()[:2])
    except (OSError, ValueError):
        lo, hi = 32768, 60999  # Linux's default
    return outside_ephemeral(lo, hi)


def outside_ephemeral(lo: int, hi: int) -> tuple[int, int]:
    """The ports :func:`port_range` picks from, given the kernel's ephemeral range
    ``lo``-``hi``: below it from 10000 when there are a thousand there, else above
    it; a kernel that lends out nearly every port leaves 10000-65535."""
    if lo - 10000 >= 1000:
        return 10000, lo - 1
    if 65535 - hi >= 1000:
        return hi + 1, 65535
    return 10000, 65535


def debug_requested(env: Optional[Mapping[str, str]] = None) -> bool:
    """``NOTIFY_DEBUG``, read even when another knob is bad (the CLI's error path)."""
    env = os.environ if env is None else env
    return _convert("NOTIFY_DEBUG", env.get("NOTIFY_DEBUG", ""), "bool")


def table() -> str:
    """The variables as a Markdown table (docs/CONFIG.md)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for f in fields(Environment):
        default = "" if f.default in (None, "") else f"`{f.default}`"
        rows.append(f"| `{f.metadata['var']}` | {default} | {f.metadata['doc']} |")
    return "\n".join(rows)
