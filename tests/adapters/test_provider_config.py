"""Providers from config (issue 22, item 1): ``[providers.<name>]`` tables with a kind
and ``[routes]`` build the same routes as the default (the simulators), credentials
come from environment variables or files and never from the file itself, a bad
config names its key and the reason, and ``notify providers check`` tries each
provider's credentials against the simulators without sending anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.registry import build_routes, check_all, check_credentials
from adapters.simulators import SimProfile, build_providers_from_info, start_all
from config.settings import ConfigError, load_settings
from pipeline.layout import simulator_providers
from pipeline.providers import provider_set, provider_specs
from tests.adapters.helpers import notify_toml
from tests.transport.helpers import ROOT

SECRET_TOKEN = "f00dfeedf00dfeedf00dfeedf00dfeed"


def sim_config(info: dict, tmp: Path, names: dict | None = None, receipts: bool = True) -> tuple[str, dict]:
    """A user's config file pointing at the simulators by URL, as one for the real
    services would (README "Real providers"); the secrets in files and in the
    returned environment."""
    n = {"apns": "apns", "fcm": "fcm", "twilio": "twilio", "smsvendor": "smsvendor", "smtp": "smtp",
         "webhook": "webhook", "hms": "hms", **(names or {})}
    (tmp / "AuthKey.p8").write_text(info["apns"]["private_key"])
    (tmp / "service-account.json").write_text(json.dumps(info["fcm"]["service_account"]))
    tw, ve, sm = info["twilio"], info["smsvendor"], info["smtp"]
    receipts_url = info.get("receipts_url")
    text = f"""
[providers.{n['apns']}]
kind = "apns"
base_url = "{info['apns']['base_url']}"
team_id = "{info['apns']['team_id']}"
key_id = "{info['apns']['key_id']}"
key_file = "AuthKey.p8"
topic = "{info['apns']['topic']}"
timeout = 5

[providers.{n['fcm']}]
kind = "fcm"
base_url = "{info['fcm']['base_url']}"
service_account_file = "service-account.json"
timeout = 5

[providers.{n['twilio']}]
kind = "twilio"
base_url = "{tw['base_url']}"
account_sid = "{tw['account_sid']}"
auth_token_env = "TEST_TWILIO_AUTH_TOKEN"
from_number = "{tw['from_number']}"
idempotency_header = "X-Notify-Idempotency-Key"
reconcile_param = "{tw['reconcile_param']}"
timeout = 5
{f'status_callback = "{receipts_url}/twilio"' if receipts and receipts_url else ''}

[providers.{n['smsvendor']}]
kind = "smsvendor"
base_url = "{ve['base_url']}"
api_key_env = "TEST_VENDOR_API_KEY"
sender = "NOTIFY"
timeout = 5
{f'callback_url = "{receipts_url}/smsvendor"' if receipts and receipts_url else ''}

[providers.{n['smtp']}]
kind = "smtp"
host = "{sm['host']}"
port = {sm['port']}
start_tls = false
from_addr = "notify@example.com"
msgid_domain = "notify.example.com"
timeout = 5
{f'username = "{sm["username"]}"' if sm.get('username') else ''}
{'password_env = "TEST_SMTP_PASSWORD"' if sm.get('username') else ''}

[providers.{n['webhook']}]
kind = "webhook"
secret_env = "TEST_WEBHOOK_SECRET"
allow = ["{info['webhook']['url'].split('/')[2]}"]
timeout = 5

[providers.{n['hms']}]
kind = "hms"
base_url = "{info['hms']['base_url']}"
token_url = "{info['hms']['token_url']}"
client_id = "{info['hms']['client_id']}"
app_id = "{info['hms']['app_id']}"
client_secret_env = "TEST_HMS_CLIENT_SECRET"
timeout = 5

[routes]
push = ["{n['apns']}", "{n['fcm']}", "{n['hms']}"]
sms = ["{n['twilio']}", "{n['smsvendor']}"]
email = ["{n['smtp']}"]
webhook = ["{n['webhook']}"]
"""
    path = notify_toml(tmp, text)
    env = {"TEST_TWILIO_AUTH_TOKEN": tw["auth_token"], "TEST_VENDOR_API_KEY": ve["api_key"],
           "TEST_WEBHOOK_SECRET": info["webhook"]["secret"], "TEST_SMTP_PASSWORD": sm.get("password") or "",
           "TEST_HMS_CLIENT_SECRET": info["hms"]["client_secret"]}
    return path, env


@pytest.fixture
async def sims():
    s = await start_all("http://127.0.0.1:9/v1/receipts", profile=SimProfile.clean(), smtp_auth=True)
    yield s
    await s.stop()


def _endpoints(providers: dict) -> dict[str, tuple[str, str]]:
    """Each provider's class and where it calls, read from the built adapters."""
    out = {}
    for name, p in providers.items():
        cfg = getattr(p, "config", None)
        where = getattr(cfg, "base_url", None) or (f"{cfg.host}:{cfg.port}" if hasattr(cfg, "host") else None)
        out[name] = (type(p).__name__, where)
    return out


async def test_a_config_pointing_at_the_simulators_builds_the_default_routes(sims, tmp_path, make_delivery):
    info = sims.as_dict()
    default, _ = provider_set(load_settings(env={"NOTIFY_PROVIDERS": "simulators"}), info=info)
    path, env = sim_config(info, tmp_path)
    settings = load_settings(path, env={})
    configured, specs = provider_set(settings, env=env)
    try:
        # per channel: the same provider names, kinds and endpoints, in the same failover order
        assert configured.describe() == default.describe()
        assert configured.describe()["sms"] == [("twilio", "twilio", info["twilio"]["base_url"]),
                                                ("smsvendor", "smsvendor", info["smsvendor"]["base_url"])]
        assert configured.routes == default.routes
        # ... the same adapters as before the routes were config (build_providers_from_info)
        legacy = build_providers_from_info(info)
        try:
            assert _endpoints(configured.providers) == _endpoints(default.providers) == _endpoints(legacy)
        finally:
            for p in legacy.values():
                await p.close()
        # the token buckets of defaults.toml still apply by name
        assert (specs["twilio"].rate, specs["twilio"].burst) == (200.0, 400.0)
        # and the credentials work: each adapter is taken by its simulator
        sends = {"push": "apns:" + "a1" * 32, "sms": "+15550001234", "email": "someone@example.com"}
        for channel, address in sends.items():
            name = configured.routes[channel][0]
            result = await configured.providers[name].send(make_delivery(channel, address))
            assert result.result == "ACCEPTED", (name, result)
        fcm = await configured.providers["fcm"].send(make_delivery("push", "fcm:tok-" + "c" * 30))
        assert fcm.result == "ACCEPTED", fcm
    finally:
        await configured.close()
        await default.close()


async def test_push_platform_is_the_kind_whatever_the_providers_are_called(sims, tmp_path, make_delivery):
    """An APNs token goes to the provider of kind apns when it is not called "apns"
    (the device's platform picks among the route's providers)."""
    from adapters.dispatch import Dispatcher

    path, env = sim_config(sims.as_dict(), tmp_path, names={"apns": "ios_prod", "fcm": "android_prod",
                                                            "hms": "huawei_prod"})
    built, _ = provider_set(load_settings(path, env={}), env=env)
    try:
        assert built.routes["push"] == ["ios_prod", "android_prod", "huawei_prod"]
        disp = Dispatcher(built.providers, built.routes)
        fcm = await disp.send(make_delivery("push", "fcm:tok-" + "d" * 30))
        apns = await disp.send(make_delivery("push", "apns:" + "b2" * 32))
        hms = await disp.send(make_delivery("push", "hms:tok-" + "e" * 30))
        assert [(r.provider, r.result) for r in fcm.results] == [("android_prod", "ACCEPTED")]
        assert [(r.provider, r.result) for r in apns.results] == [("ios_prod", "ACCEPTED")]
        assert [(r.provider, r.result) for r in hms.results] == [("huawei_prod", "ACCEPTED")]
    finally:
        await built.close()


async def test_smtp_pool_settings_reach_the_session_pool(sims, tmp_path, make_delivery):
    """``pool`` (sessions kept, as for the HTTP kinds), ``keepalive_s`` and
    ``max_messages`` of a ``kind = "smtp"`` table reach SmtpConfig and its pool."""
    path, env = sim_config(sims.as_dict(), tmp_path)
    text = Path(path).read_text().replace('kind = "smtp"\n', 'kind = "smtp"\npool = 2\nkeepalive_s = 12.5\nmax_messages = 3\n')
    Path(path).write_text(text)
    settings = load_settings(path, env={})
    assert {k: settings.providers["smtp"].options[k] for k in ("pool", "keepalive_s", "max_messages")} == {
        "pool": 2, "keepalive_s": 12.5, "max_messages": 3}
    built, _ = provider_set(settings, env=env)
    try:
        p = built.providers["smtp"]
        assert (p.config.max_connections, p.config.keepalive_s, p.config.max_messages) == (2, 12.5, 3)
        for i in range(4):
            r = await p.send(make_delivery("email", f"user{i}@example.com"))
            assert r.result == "ACCEPTED", r
        assert (p.pool.size, p.pool.idle_s, p.pool.max_messages) == (2, 12.5, 3)
        assert p.pool.opened == 2  # a session quit after its 3 messages, the 4th on a new one
    finally:
        await built.close()


# --------------------------------------------------------------------------- bad configs

FAKES = """
[providers.p]
kind = "fake"
channel = "push"
[providers.e]
kind = "fake"
channel = "email"
[providers.w]
kind = "fake"
channel = "webhook"
"""
TWILIO = """
[providers.twilio]
kind = "twilio"
account_sid = "AC0123456789abcdef0123456789abcdef"
auth_token_env = "TEST_TWILIO_TOKEN"
from_number = "+15550001111"
"""
ROUTES = """
[routes]
push = ["p"]
sms = ["twilio"]
email = ["e"]
webhook = ["w"]
"""


def load(tmp_path: Path, text: str):
    return load_settings(notify_toml(tmp_path, text), env={})


async def test_a_good_config_loads_with_its_references(tmp_path):
    s = load(tmp_path, FAKES + TWILIO + ROUTES)
    assert dict(s.routes) == {"inbox": ("inbox",), "push": ("p",), "sms": ("twilio",), "email": ("e",),
                              "webhook": ("w",)}
    tw = s.providers["twilio"]
    assert (tw.kind, tw.channel, tw.rate, tw.burst) == ("twilio", "sms", 200.0, 400.0)  # defaults.toml's bucket
    assert tw.options["auth_token_env"].env == "TEST_TWILIO_TOKEN"
    assert s.providers["inbox"].kind == "inbox"  # the inbox needs no table
    built = build_routes(s.providers, s.routes, {"TEST_TWILIO_TOKEN": SECRET_TOKEN})
    assert built.providers["twilio"].config.auth_token == SECRET_TOKEN
    await built.close()


@pytest.mark.parametrize("text, key, reason", [
    (FAKES + TWILIO + ROUTES + '[providers.pigeon]\nkind = "pigeon"\n',
     "providers.pigeon.kind", "unknown provider kind 'pigeon'"),
    (FAKES + TWILIO + ROUTES.replace('sms = ["twilio"]', 'sms = ["twilio", "sms_b2"]'),
     "routes.sms", "unknown provider 'sms_b2'"),
    (FAKES + TWILIO.replace('auth_token_env = "TEST_TWILIO_TOKEN"', f'auth_token = "{SECRET_TOKEN}"') + ROUTES,
     "providers.twilio.auth_token", "a secret is never written in the config file"),
    # the secret pasted where the variable's name goes
    (FAKES + TWILIO.replace('"TEST_TWILIO_TOKEN"', f'"{SECRET_TOKEN}"') + ROUTES,
     "providers.twilio.auth_token_env", "not one (is it the secret itself?"),
    (FAKES + TWILIO.replace('kind = "twilio"', 'kind = "twilio"\npassword = "hunter2"') + ROUTES,
     "providers.twilio.password", "a secret is never written in the config file"),
    (FAKES + TWILIO.replace('kind = "twilio"', 'kind = "twilio"\nbase_url = "https://AC1:hunter2@api.twilio.com"')
     + ROUTES, "providers.twilio.base_url", "a URL with a password"),
    (FAKES + TWILIO.replace('kind = "twilio"', 'kind = "twilio"\ntimout = 5') + ROUTES,
     "providers.twilio.timout", "unknown setting for kind 'twilio'"),
    (FAKES + TWILIO + ROUTES + '[providers.relay]\nkind = "smtp"\nhost = "smtp.example.com"\npool = 0\n',
     "providers.relay.pool", "must be ≥ 1"),
    (FAKES + TWILIO + ROUTES + '[providers.relay]\nkind = "smtp"\nhost = "smtp.example.com"\nkeepalive_s = 0\n',
     "providers.relay.keepalive_s", "a number > 0"),
    (FAKES + TWILIO + ROUTES + '[providers.relay]\nkind = "smtp"\nhost = "smtp.example.com"\nmax_messages = 1.5\n',
     "providers.relay.max_messages", "an integer ≥ 1"),
    (FAKES + TWILIO + ROUTES + '[providers.relay]\nkind = "smtp"\nhost = "smtp.example.com"\nmax_connections = 5\n',
     "providers.relay.max_connections", "unknown setting for kind 'smtp'"),
    (FAKES + TWILIO.replace('kind = "twilio"', 'kind = "twilio"\ntimeout = "fast"') + ROUTES,
     "providers.twilio.timeout", "expected a number"),
    (FAKES + TWILIO.replace('from_number = "+15550001111"', '') + ROUTES,
     "providers.twilio.from_number", "missing from_number or messaging_service_sid"),
    (FAKES + TWILIO + ROUTES.replace('push = ["p"]', 'push = ["twilio"]').replace('sms = ["twilio"]', 'sms = []'),
     "routes.push", "provider 'twilio' (kind twilio) serves sms, not push"),
    (FAKES + TWILIO + ROUTES.replace('webhook = ["w"]\n', ''),
     "routes.webhook", "missing: with [routes], every channel"),
    (FAKES + TWILIO + ROUTES.replace('sms = ["twilio"]', 'sms = ["sms_a"]'),
     "routes.sms", "provider 'sms_a' has no kind"),
    (FAKES + TWILIO + ROUTES + '[providers.apns]\nkind = "apns"\nteam_id = "T"\nkey_id = "K"\ntopic = "com.x"\n',
     "providers.apns.key", "missing key_env / key_file"),
    (FAKES + TWILIO.replace('kind = "twilio"', 'kind = "twilio"\nbreaker = { failure_treshold = 3 }') + ROUTES,
     "providers.twilio.breaker.failure_treshold", "unknown setting"),
])
def test_a_bad_config_names_the_key_and_the_reason(tmp_path, text, key, reason):
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, text)
    assert exc.value.key == key, str(exc.value)
    assert reason in str(exc.value)
    assert str(exc.value).startswith(key.split(".")[0])
    assert SECRET_TOKEN not in str(exc.value) and "hunter2" not in str(exc.value)  # never echoed


def test_a_missing_credential_is_named_when_the_providers_are_built(tmp_path):
    s = load(tmp_path, FAKES + TWILIO + ROUTES)  # loading needs no credential (notify status, notify send)
    for env, reason in (({}, "environment variable TEST_TWILIO_TOKEN is not set"),
                        ({"TEST_TWILIO_TOKEN": " "}, "environment variable TEST_TWILIO_TOKEN is empty")):
        with pytest.raises(ConfigError) as exc:
            check_credentials(s.providers, s.routes, env)
        assert (exc.value.key, reason in str(exc.value)) == ("providers.twilio.auth_token_env", True), str(exc.value)
        with pytest.raises(ConfigError):
            build_routes(s.providers, s.routes, env)


def test_key_files_are_read_and_checked(tmp_path):
    apns = ('[providers.apns]\nkind = "apns"\nteam_id = "T"\nkey_id = "K"\ntopic = "com.x"\nkey_file = "keys/a.p8"\n'
            '[providers.p2]\nkind = "fake"\nchannel = "push"\n')
    s = load(tmp_path, FAKES + TWILIO + ROUTES.replace('push = ["p"]', 'push = ["apns", "p"]') + apns)
    assert s.providers["apns"].options["key_file"].file == str(tmp_path / "keys" / "a.p8")  # relative to the file
    env = {"TEST_TWILIO_TOKEN": SECRET_TOKEN}
    with pytest.raises(ConfigError) as exc:
        check_credentials(s.providers, s.routes, env)
    assert exc.value.key == "providers.apns.key_file" and "cannot read" in str(exc.value)
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "a.p8").write_text("not a key\n")
    with pytest.raises(ConfigError) as exc:
        check_credentials(s.providers, s.routes, env)
    assert exc.value.key == "providers.apns.key_file" and "not a PEM private key" in str(exc.value)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    def pem(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    (tmp_path / "keys" / "a.p8").write_bytes(pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)))
    with pytest.raises(ConfigError) as exc:
        check_credentials(s.providers, s.routes, env)
    assert "RSAPrivateKey, not an APNs auth key (.p8, EC P-256)" in str(exc.value)
    (tmp_path / "keys" / "a.p8").write_bytes(pem(ec.generate_private_key(ec.SECP256R1())))
    check_credentials(s.providers, s.routes, env)


def test_rate_only_tables_and_breaker_overrides_stay_compatible(tmp_path):
    s = load(tmp_path, '[providers.twilio]\nrate = 50\n[providers.twilio.breaker]\nfailure_threshold = 2\n')
    assert not s.routes
    assert (s.providers["twilio"].kind, s.providers["twilio"].rate, s.providers["twilio"].burst) == (None, 50.0, 400.0)
    assert dict(s.providers["twilio"].breaker) == {"failure_threshold": 2}
    from adapters.registry import breaker_settings

    assert breaker_settings({"failure_threshold": 5, "reset_timeout": 5.0, "half_open_max": 1},
                            s.providers["twilio"]) == {"failure_threshold": 2, "reset_timeout": 5.0, "half_open_max": 1}


async def test_an_empty_route_turns_a_channel_off(tmp_path, make_delivery):
    s = load(tmp_path, FAKES + TWILIO + ROUTES.replace('webhook = ["w"]', 'webhook = []'))
    built = build_routes(s.providers, s.routes, {"TEST_TWILIO_TOKEN": SECRET_TOKEN})
    try:
        assert built.routes["webhook"] == ["unrouted"]
        r = await built.providers["unrouted"].send(make_delivery("webhook", "https://example.com/hook"))
        assert (r.result, r.permanent_kind) == ("PERMANENT_ERROR", "rejected")
    finally:
        await built.close()


async def test_the_fakes_are_a_config_too():
    built, specs = provider_set(load_settings(env={"NOTIFY_PROVIDERS": "fake"}))
    assert built.describe() == {
        "inbox": [("inbox", "inbox", None)],
        "push": [("apns", "fake", None), ("fcm", "fake", None), ("hms", "fake", None)],
        "sms": [("sms_a", "fake", None), ("sms_b", "fake", None)], "email": [("email", "fake", None)],
        "webhook": [("webhook", "fake", None)]}
    assert (built.providers["sms_a"].primary, built.providers["sms_b"].primary) == (True, False)
    assert (specs["sms_a"].rate, specs["sms_b"].rate) == (200.0, 100.0)
    await built.close()


# --------------------------------------------------------------------------- notify providers check


async def test_check_tries_each_providers_credentials_against_the_simulators(sims, tmp_path):
    info = sims.as_dict()
    tables, secrets = simulator_providers(info)
    specs, routes = provider_specs(tables, load_settings(env={}))
    lines = await check_all(specs, routes, secrets, timeout=5)
    names = ("inbox", "apns", "fcm", "hms", "twilio", "smsvendor", "smtp", "webhook")
    assert {line.name: line.ok for line in lines} == {n: True for n in names}
    said = {line.name: line.message for line in lines}
    assert "authenticated (active)" in said["twilio"] and "validate_only" in said["fcm"]
    assert "AUTH as notify" in said["smtp"] and "JWT signed" in said["apns"] and "validate_only" in said["hms"]
    # nothing was sent: the simulators saw credential checks only
    assert [r for r in sims.ledger() if r["op"] == "send"] == []
    assert {r["op"] for r in sims.ledger()} >= {"auth", "oauth", "validate", "query"}

    # wrong credentials: each provider says why
    path, env = sim_config(info, tmp_path)
    (tmp_path / "service-account.json").write_text(json.dumps({**info["fcm"]["service_account"],
                                                               "client_email": "someone@else.example"}))
    bad_env = {**env, "TEST_TWILIO_AUTH_TOKEN": "0" * 32, "TEST_VENDOR_API_KEY": "vk_wrong",
               "TEST_SMTP_PASSWORD": "wrong"}
    del bad_env["TEST_WEBHOOK_SECRET"]
    s = load_settings(path, env={})
    lines = {line.name: line for line in await check_all(s.providers, s.routes, bad_env, timeout=5)}
    assert {n: line.ok for n, line in lines.items()} == {"inbox": True, "apns": True, "fcm": False, "twilio": False,
                                                       "smsvendor": False, "smtp": False, "webhook": False,
                                                       "hms": True}
    assert "auth: GET account: 401 20003 Authenticate" in lines["twilio"].message
    assert "auth: status query: 401" in lines["smsvendor"].message
    assert "auth: 535" in lines["smtp"].message
    assert "oauth token" in lines["fcm"].message and "invalid_grant" in lines["fcm"].message
    assert "TEST_WEBHOOK_SECRET is not set" in lines["webhook"].message
    # a provider that is down: the address and what happened
    await sims.stop()
    lines = {line.name: line for line in await check_all(s.providers, s.routes, env, timeout=5)}
    assert not lines["twilio"].ok and not lines["apns"].ok and not lines["smtp"].ok


def test_notify_providers_check_command(tmp_path):
    """The command: one line per provider, exit 0 when every one is ok, 1 otherwise."""
    from tests.faults.drill import Sims

    sims = Sims(tmp_path / "sims").start()
    try:
        path, env = sim_config(sims.info, tmp_path, names={"twilio": "sms_main"})
        run_env = {**os.environ, **env, "PYTHONPATH": str(ROOT), "NOTIFY_DATA_DIR": str(tmp_path / "data")}
        run_env.pop("NOTIFY_CONFIG", None)
        out = subprocess.run([sys.executable, "-m", "pipeline.cli", "providers", "check", "--config", path],
                             cwd=str(ROOT), env=run_env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        lines = out.stdout.splitlines()
        assert lines[0].startswith("providers of config: ") and "sms: sms_main → smsvendor" in lines[0]
        assert sorted(line.split()[0] for line in lines[1:]) == sorted(
            ["inbox", "apns", "fcm", "hms", "sms_main", "smsvendor", "smtp", "webhook"])
        assert all(" ok: " in line for line in lines[1:]), out.stdout
        assert [r for r in sims.ledger() if r.get("op") == "send"] == []

        run_env["TEST_TWILIO_AUTH_TOKEN"] = "0" * 32
        out = subprocess.run([sys.executable, "-m", "pipeline.cli", "providers", "check", "--config", path],
                             cwd=str(ROOT), env=run_env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 1, out.stdout + out.stderr
        failed = [line for line in out.stdout.splitlines() if "FAILED" in line]
        assert len(failed) == 1 and failed[0].startswith("sms_main") and "401" in failed[0], out.stdout
        assert "0" * 32 not in out.stdout

        # a config that does not load: the key and the reason, exit 1
        Path(path).write_text(Path(path).read_text().replace('kind = "smtp"', 'kind = "smtp2"'))
        out = subprocess.run([sys.executable, "-m", "pipeline.cli", "providers", "check", "--config", path],
                             cwd=str(ROOT), env=run_env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and "providers.smtp.kind: unknown provider kind 'smtp2'" in out.stderr, out.stderr
    finally:
        sims.stop()


async def test_the_readme_example_loads_and_builds(tmp_path):
    """README "Real providers": the example config is a valid one (its key files and
    variables stood in for)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    readme = (ROOT / "README.md").read_text()
    start = readme.index("```toml\n# /etc/notify/notify.toml")
    text = readme[start + len("```toml\n"):readme.index("```", start + 7)]

    def pem(key) -> str:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption()).decode()

    (tmp_path / "AuthKey_KEY1234567.p8").write_text(pem(ec.generate_private_key(ec.SECP256R1())))
    (tmp_path / "firebase-service-account.json").write_text(json.dumps({
        "type": "service_account", "project_id": "example", "client_email": "sender@example.iam.gserviceaccount.com",
        "private_key": pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)), "private_key_id": "k1"}))
    s = load(tmp_path, text.replace("/etc/notify/", ""))
    assert {c: list(n) for c, n in s.routes.items()} == {"inbox": ["inbox"], "push": ["apns", "fcm", "hms"],
                                                         "sms": ["twilio"], "email": ["smtp"], "webhook": ["webhook"]}
    env = {"NOTIFY_TWILIO_AUTH_TOKEN": SECRET_TOKEN, "SMTP_PASSWORD": "pw",
           "NOTIFY_WEBHOOK_SECRET": "whsec_c2VjcmV0LWtleS1vZi10aGUtcmVhZG1l", "NOTIFY_HMS_CLIENT_SECRET": "hms-secret"}
    built = build_routes(s.providers, s.routes, env)
    assert built.describe()["push"] == [("apns", "apns", "https://api.push.apple.com"),
                                        ("fcm", "fcm", "https://fcm.googleapis.com"),
                                        ("hms", "hms", "https://push-api.cloud.huawei.com")]
    assert built.describe()["email"] == [("smtp", "smtp", "smtp://smtp.example.com:587")]
    assert (s.providers["twilio"].rate, dict(s.providers["twilio"].breaker)) == (
        100.0, {"failure_threshold": 3, "reset_timeout_s": 10.0})
    assert built.providers["fcm"].config.project_id == "example"
    await built.close()
