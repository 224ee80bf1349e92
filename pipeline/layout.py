"""The process layout ``notify run`` starts, the same one a deployment runs on many
hosts (README "Deployment"):

    broker       the embedded server (unless REDIS_URL points at one)
    simulators   the provider simulators, in a process of their own (--providers simulators)
    priority     one worker of role ``priority``: the OTP / security path (pipeline/roles.py)
    main-0..N-1  N workers of role ``main`` (default: one per core), splitting the partitions
    api          the HTTP API and the status page

``--no-priority-process`` runs N workers of role ``all`` instead (every agent in
each). Each entry is a :class:`Proc`: a name, the ``notify`` arguments and the
environment; :mod:`pipeline.supervise` starts and restarts them.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["Proc", "plan", "default_workers", "describe"]


@dataclass(frozen=True)
class Proc:
    name: str
    argv: tuple[str, ...]  # after ``python -m``
    env: dict = field(default_factory=dict, compare=False)
    metrics_port: Optional[int] = None
    waits_for: Optional[str] = None  # a file the process writes once it serves


def default_workers() -> int:
    """One main worker per core (at least one)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def plan(env: dict, *, workers: int, priority_process: bool, api_port: int, metrics_port: int,
         loglevel: str, simulators_info: Optional[str] = None) -> list[Proc]:
    """The processes to start, in order (the broker is started before, by the caller)."""
    procs: list[Proc] = []
    if simulators_info:
        argv = ("adapters.simulators", "--info", simulators_info)
        if env.get("NOTIFY_RECEIPTS_URL"):
            argv += ("--receipts-url", env["NOTIFY_RECEIPTS_URL"])
        procs.append(Proc("simulators", argv, env, waits_for=simulators_info))
        env = dict(env, NOTIFY_SIMULATORS=simulators_info)
    role = "main" if priority_process else "all"
    port = metrics_port or None
    if priority_process:
        penv = dict(env, NOTIFY_ROLE="priority", NOTIFY_WORKERS="1", NOTIFY_WORKER_INDEX="0")
        if port:
            penv["NOTIFY_METRICS_PORT"] = str(port + workers)
        procs.append(Proc("priority", ("pipeline.cli", "worker", "-l", loglevel, "--role", "priority"), penv,
                          metrics_port=port + workers if port else None))
    for i in range(workers):
        wenv = dict(env, NOTIFY_ROLE=role, NOTIFY_WORKERS=str(workers), NOTIFY_WORKER_INDEX=str(i))
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
