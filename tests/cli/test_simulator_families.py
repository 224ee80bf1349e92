"""The provider simulators in one process per family (push, sms, email, webhook), as
`notify run` starts them (pipeline/layout.py): one info file as before, every
provider in it, the receipts' secrets shared, one ledger, and a family frozen with
SIGSTOP does not stop another from answering. Real processes, real servers on
127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from adapters.receipts import HMS_CALLBACK_HEADER, MemoryReplayGuard, ReceiptVerifier
from adapters.simulators import (FAMILIES, ORDER, SimProfile, build_providers_from_info, part_path, read_ledger,
                                 start_all, start_family)
from pipeline import layout
from pipeline.cli.run import spawner, start_together
from pipeline.models import AttemptResult, Delivery
from pipeline.procs import stop_all
from pipeline.supervise import Child
from tests.adapters.helpers import ReceiptCollector
from tests.cli.test_cli import ROOT, notify
from tests.transport.helpers import wait_until

SECRETS = {"NOTIFY_TWILIO_AUTH_TOKEN": "tw" * 16, "NOTIFY_VENDOR_SECRET": "ve" * 16,
           "NOTIFY_HMS_RECEIPT_KEY": "hm" * 16}


def _plan(info: str, env: dict) -> list:
    return layout.plan(env, workers=2, priority_process=True, api_port=8080, metrics_port=9100, loglevel="warn",
                       simulators_info=info)


def _ports(info: dict) -> dict[str, int]:
    """Every simulator's port, from the info file."""
    return {name: urlsplit(info["urls"][name]).port for name in ORDER}


def _listening(pid: int) -> set[int]:
    return {c.laddr.port for c in psutil.Process(pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}


_n = 0


def _delivery(channel: str, address: str, content: dict) -> Delivery:
    global _n
    _n += 1
    did = f"n_fam{_n:04d}{int(time.time() * 1000) % 100000:05d}.{channel}"
    return Delivery(delivery_id=did, notification_id=did.rsplit(".", 1)[0], biz_key=f"fam:{_n}", user_id=f"u{_n}",
                    channel=channel, category="account", template="t", priority="high", address=address,
                    content=content)


class Receipts(ReceiptCollector):
    """The SMS providers' callbacks and Push Kit's (``/hms``), as the API's receipts endpoint takes them."""

    async def verify(self, provider, request, body):
        if provider == "hms":
            return await self.verifier_factory().hms(body, request.headers.get(HMS_CALLBACK_HEADER))
        return await super().verify(provider, request, body)


# -- the layout ---------------------------------------------------------------------


def test_the_default_layout_has_one_simulators_process_per_family(tmp_path):
    info = str(tmp_path / "simulators.json")
    env = {"NOTIFY_RECEIPTS_URL": "http://127.0.0.1:8080/v1/receipts"}
    procs = _plan(info, env)
    sims = [p for p in procs if p.restarts_workers]
    assert [p.name for p in sims] == ["sims-push", "sims-sms", "sims-email", "sims-webhook"]
    assert [p.name for p in procs][len(sims):] == ["priority", "main-0", "main-1", "api"]  # the workers after them
    for p, family in zip(sims, layout.SIMULATOR_FAMILIES, strict=True):
        assert p.argv == ("adapters.simulators", "--family", family, "--info", info, "--nice", "5",
                          "--receipts-url", "http://127.0.0.1:8080/v1/receipts")
        # the file the launcher waits for is the one the family's process writes
        assert p.waits_for == part_path(info, family) == str(tmp_path / f"simulators.{family}.json")
    # every worker reads the one merged file
    assert {p.env.get("NOTIFY_SIMULATORS") for p in procs if "worker" in p.argv} == {info}
    # the families are the simulators' routes' channels, and together every simulator start_all starts
    assert tuple(FAMILIES) == layout.SIMULATOR_FAMILIES
    assert {c: list(n) for c, n in FAMILIES.items()} == \
        {c: n for c, n in layout.SIMULATOR_ROUTES.items() if c != "inbox"}
    assert sorted(n for names in FAMILIES.values() for n in names) == sorted(ORDER)
    # the banner: one line per family process
    banner = layout.describe(procs).splitlines()
    for family in FAMILIES:
        assert sum(line.split()[0] == f"sims-{family}" and f"--family {family} " in line for line in banner) == 1
    # --simulators-in-worker (no info file): none of them
    assert not [p for p in _plan(None, env) if p.restarts_workers or "adapters.simulators" in p.argv]


async def test_a_family_s_simulators_have_the_seeds_start_all_gives_them():
    profile = SimProfile.realistic(seed=11)
    every = await start_all(None, profile=profile)
    try:
        want = {name: sim.core.rng.random() for name, sim in every.all.items()}
    finally:
        await every.stop()
    got = {}
    for family in FAMILIES:
        sims = await start_family(family, None, profile=profile)
        try:
            got.update({name: sim.core.rng.random() for name, sim in sims.all.items()})
        finally:
            await sims.stop()
    assert got == want


# -- the family processes, started as notify run starts them ------------------------


def _start_families(tmp_path: Path, receipts_url: str, *extra: str) -> tuple[list[Child], str]:
    """The simulators' processes of the default layout, started by the functions
    `notify run` starts them with (pipeline/cli/run.py ``spawner``, ``start_together``)."""
    info = str(tmp_path / "simulators.json")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NOTIFY_RECEIPTS_URL=receipts_url, **SECRETS)
    children = [Child(p.name, spawner(p.argv + extra, p.env, p.waits_for))
                for p in _plan(info, env) if p.restarts_workers]
    start_together(children)
    return children, info


async def test_the_families_write_one_info_file_with_every_provider(tmp_path):
    # the secrets notify run hands every family (and the API) in the environment
    verifier = ReceiptVerifier(twilio_auth_token=SECRETS["NOTIFY_TWILIO_AUTH_TOKEN"],
                               vendor_secret=SECRETS["NOTIFY_VENDOR_SECRET"], hms_username="notify-sim",
                               hms_key=SECRETS["NOTIFY_HMS_RECEIPT_KEY"], guard=MemoryReplayGuard())
    collector = Receipts(lambda: verifier)
    await collector.start()
    ledger = tmp_path / "ledger.jsonl"
    children: list[Child] = []
    providers: dict = {}
    one = await start_all(collector.base_url, profile=SimProfile.clean())  # the single process's info, to compare
    try:
        children, path = await asyncio.to_thread(_start_families, tmp_path, collector.base_url, "--clean",
                                                 "--ledger", str(ledger))
        info = json.loads(Path(path).read_text())
        single = one.as_dict()
        # the same keys as start_all's as_dict, each provider's entry with the same keys too
        assert list(info) == list(single)
        assert set(info["urls"]) == set(single["urls"])
        assert {k: set(v) for k, v in info.items() if isinstance(v, dict)} == \
            {k: set(v) for k, v in single.items() if isinstance(v, dict)}
        # the receipts' URL and secrets shared by every family, as notify run hands them over
        assert info["receipts_url"] == collector.base_url
        assert info["twilio"]["auth_token"] == SECRETS["NOTIFY_TWILIO_AUTH_TOKEN"]
        assert info["smsvendor"]["webhook_secret"] == SECRETS["NOTIFY_VENDOR_SECRET"]
        assert info["hms"]["receipt_key"] == SECRETS["NOTIFY_HMS_RECEIPT_KEY"]
        # each family in its own process, serving its own simulators' ports and no other's
        ports = _ports(info)
        pids = {c.name.removeprefix("sims-"): c.proc.pid for c in children}
        assert len(set(pids.values())) == len(FAMILIES)
        for family, names in FAMILIES.items():
            part = json.loads(Path(part_path(path, family)).read_text())
            assert part["family"] == family and part["pid"] == pids[family]
            assert _listening(pids[family]) == {ports[n] for n in names}, family

        # one delivery per provider through the adapters built from the merged file
        providers = build_providers_from_info(info, timeout=3)
        cases = {
            "apns": _delivery("push", "apns:abc123", {"title": "t", "body": "b"}),
            "fcm": _delivery("push", "fcm:xyz", {"title": "t", "body": "b"}),
            "hms": _delivery("push", "hms:tok123", {"title": "t", "body": "b"}),
            "twilio": _delivery("sms", "+14155550100", {"body": "hi"}),
            "smsvendor": _delivery("sms", "+14155550101", {"body": "hi"}),
            "smtp": _delivery("email", "a@example.org", {"subject": "s", "text": "t", "html": "<b>h</b>"}),
            "webhook": _delivery("webhook", info["webhook"]["url"], {"body": {"k": "v"}}),
        }
        results = dict(zip(cases, await asyncio.gather(*(providers[n].send(d) for n, d in cases.items())),
                           strict=True))
        assert {n: r.result for n, r in results.items()} == {n: AttemptResult.ACCEPTED for n in cases}, results
        # the receipts, signed with the shared secrets, verify at the receipts URL
        for name in ("twilio", "smsvendor", "hms"):
            await collector.receipt_for(results[name])
        assert collector.rejected == []
        # every family's process appended to the one ledger: whole lines, every send there
        raw = ledger.read_bytes().splitlines()
        rows = read_ledger(str(ledger))
        assert len(rows) == len(raw) and all(line.startswith(b"{") for line in raw)
        sent = {(r["sim"], r.get("key")) for r in rows}
        for name, d in cases.items():
            assert (name, d.delivery_id) in sent, (name, sorted(sent))

        # `notify providers check` reads the merged file in the data directory as before
        env = dict(os.environ, PYTHONPATH=str(ROOT), NOTIFY_DATA_DIR=str(tmp_path))
        env.pop("NOTIFY_CONFIG", None)
        out = await asyncio.to_thread(notify, env, "providers", "check", timeout=60)
        checked = {line.split()[0]: line.split()[2] for line in out.stdout.splitlines()
                   if line.split() and line.split()[0] in ORDER}
        assert {n: checked.get(n) for n in ORDER} == {n: "ok:" for n in ORDER}, out.stdout
    finally:
        for p in providers.values():
            await p.close()
        await one.stop()
        await collector.stop()
        await asyncio.to_thread(stop_all, [c.proc for c in children], 10)


# -- notify run ---------------------------------------------------------------------


def test_notify_run_starts_the_families_apart_and_a_stopped_one_stops_no_other(tmp_path):
    data = tmp_path / "data"
    env = dict(os.environ, NOTIFY_DATA_DIR=str(data), PYTHONPATH=str(ROOT))
    env.pop("REDIS_URL", None)
    (tmp_path / "notify.toml").write_text("receipt_poll_s = 0\n")  # no [routes]: the simulators
    env["NOTIFY_CONFIG"] = str(tmp_path / "notify.toml")
    log_path = tmp_path / "run.log"
    log = open(log_path, "w")
    run = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", "--workers", "1", "--api-port", "0",
                            "--metrics-port", "0"], cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT)
    frozen = None
    kids: list = []
    try:
        info_path = data / "simulators.json"
        wait_until(lambda: (info_path.exists() and (data / "broker.url").exists()) or run.poll() is not None, 60,
                   0.1, "the simulators' info")
        assert run.poll() is None, log_path.read_text()[-3000:]
        info = json.loads(info_path.read_text())
        assert set(info) >= {"urls", "receipts_url", *ORDER}
        # the banner: one line per family process
        banner = log_path.read_text()
        for family in FAMILIES:
            assert f"sims-{family}" in banner and f"--family {family} " in banner, banner
        # one child of notify run per family, each serving its own simulators' ports
        kids = psutil.Process(run.pid).children()
        of = {f: next(k for k in kids if f"--family {f} " in " ".join(k.cmdline()) + " ") for f in FAMILIES}
        assert len({k.pid for k in of.values()}) == len(FAMILIES)
        # at a lower CPU priority than the workers (pipeline/layout.py SIMULATOR_NICE)
        assert all(k.nice() >= psutil.Process(run.pid).nice() + 5 for k in of.values())
        ports = _ports(info)
        for family, names in FAMILIES.items():
            assert _listening(of[family].pid) == {ports[n] for n in names}, family
        # notify status shows them, each up with its pid
        status = notify(env, "status").stdout
        rows = {line.split()[0].split("/", 1)[1]: line.split()[1:] for line in status.splitlines()
                if line.split() and "/sims-" in line.split()[0]}
        assert {name: row[:2] for name, row in rows.items()} == \
            {f"sims-{f}": ["up", str(of[f].pid)] for f in FAMILIES}, status

        # the push family's process frozen: the SMS family still answers, within a second
        frozen = of["push"]
        frozen.send_signal(signal.SIGSTOP)
        wait_until(lambda: frozen.status() == psutil.STATUS_STOPPED, 5, 0.02, "the push simulators stopped")
        with pytest.raises(httpx.TimeoutException):  # it is stopped: FCM's simulator does not answer
            httpx.get(info["urls"]["fcm"] + "/_sim/mode", timeout=0.5)
        providers = build_providers_from_info(info, timeout=1.0)

        async def sms() -> tuple:
            try:
                t0 = time.monotonic()
                # a scenario number (…0005, accepted then undelivered): notify run's simulators are the
                # realistic ones, whose random 5xx and 429 (~1.5%) would answer a plain number now and then
                r = await providers["twilio"].send(_delivery("sms", "+14155550005", {"body": "code 123456"}))
                return r, time.monotonic() - t0
            finally:
                for p in providers.values():
                    await p.close()

        result, took = asyncio.run(sms())
        assert result.result == AttemptResult.ACCEPTED and took < 1.0, (result, took)
        assert httpx.get(info["urls"]["webhook"].rsplit("/hook/", 1)[0] + "/_sim/mode", timeout=1).status_code == 200
        # the SMS family killed: started again alone, on new ports, the info file merged anew
        # (the other families' parts kept), the workers restarted with it
        of["sms"].send_signal(signal.SIGKILL)

        def merged_anew() -> dict:
            try:
                now = json.loads(info_path.read_text())
            except (OSError, ValueError):
                return {}
            return now if now["urls"]["twilio"] != info["urls"]["twilio"] else {}

        again = wait_until(merged_anew, 30, 0.1, "the SMS family started again")
        assert {k: v for k, v in again.items() if k not in FAMILIES["sms"] + ("urls",)} == \
            {k: v for k, v in info.items() if k not in FAMILIES["sms"] + ("urls",)}
        new_sms = next(k for k in psutil.Process(run.pid).children() if "--family sms " in " ".join(k.cmdline()) + " ")
        assert new_sms.pid != of["sms"].pid and _listening(new_sms.pid) == {_ports(again)[n] for n in FAMILIES["sms"]}
        assert all(of[f].is_running() for f in FAMILIES if f != "sms")
        # and the pipeline sends an OTP by SMS meanwhile (the restarted workers read the merged file)
        from pipeline.cli.demo import wait_ready

        wait_ready((data / "broker.url").read_text().strip(), 90)
        notify(env, "user", "set", "fam1", "--phone", "+15550001234")
        sent = notify(env, "send", "--category", "otp", "--template", "otp", "--to", "fam1", "--param",
                      "code=123456", "--biz-key", "fam:otp", "--wait", "60", timeout=90).stdout.strip().splitlines()
        assert len(sent) == 2 and sent[1].split()[:2] == ["fam1", "sms"], sent
        assert sent[1].split()[2] in ("ACCEPTED", "DELIVERED"), sent
        frozen.send_signal(signal.SIGCONT)
        frozen = None
    finally:
        if frozen is not None:
            frozen.send_signal(signal.SIGCONT)
        if run.poll() is None:
            kids = list({k.pid: k for k in kids + psutil.Process(run.pid).children()}.values())
        run.terminate()
        code = run.wait(60)
        log.close()
    # stopping notify run stopped every family's process too
    assert code == 0, log_path.read_text()[-3000:]
    gone, alive = psutil.wait_procs(kids, timeout=10)
    assert not [k for k in alive if k.status() != psutil.STATUS_ZOMBIE]


def test_the_priority_role_in_several_processes_splits_its_partitions():
    """``notify run --priority-workers N``: N processes of the priority role, each with
    its share of the partitions and a metrics port of its own after the main workers'."""
    procs = layout.plan({}, workers=2, priority_process=True, api_port=0, metrics_port=9100, loglevel="warn",
                        priority_workers=2)
    prio = [p for p in procs if "priority" in p.argv]
    assert [p.name for p in prio] == ["priority-0", "priority-1"]
    assert [(p.env["NOTIFY_WORKERS"], p.env["NOTIFY_WORKER_INDEX"]) for p in prio] == [("2", "0"), ("2", "1")]
    assert [p.metrics_port for p in prio] == [9102, 9103]
    # the consumer group each worker reads as (reported by the supervisor: `notify user set` waits for it)
    assert {p.name: p.group for p in procs if p.group} == {"priority-0": "notify-priority", "priority-1": "notify-priority",
                                                           "main-0": "notify", "main-1": "notify"}
    assert {p.name: p.group for p in layout.plan({}, workers=1, priority_process=False, api_port=8080,
                                                 metrics_port=0, loglevel="warn")} == {"worker-0": "notify", "api": None}
    assert [p.name for p in layout.plan({}, workers=2, priority_process=True, api_port=0, metrics_port=0,
                                        loglevel="warn") if "priority" in p.argv] == ["priority"]


def test_notify_run_refuses_a_priority_workers_count_below_one():
    for bad in ("0", "-1", "two"):
        out = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", "--priority-workers", bad], cwd=str(ROOT),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "--priority-workers" in out.stderr, out.stderr
