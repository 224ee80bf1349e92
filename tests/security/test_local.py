"""Other local users and processes (issue 26, hostile input: rows 1-3 of "local").

The attacker is another account, or any process, on the host that runs
`notify run`: it can connect to 127.0.0.1, read what the file modes let it read,
list processes (`ps` shows every command line) and start `notify run` itself.

1. The embedded broker asks every client for a password `notify run` generated;
   the URL with it is in `data/broker.url` (0600) and in the children's
   environment, never in logs, `notify status`, the status page or argv; every
   command still works, and `REDIS_URL` with an ACL user over `rediss://` too.
2. `data/`, the AOF directory 0700; `records.db` (-wal, -shm), `broker.url`,
   `api_keys.json`, the AOF files 0600, whatever the user's umask and whatever an
   earlier version left.
3. One `notify run` per data directory: a second refuses with one line, and the
   lock (flock on `data/notify.lock`) goes with `notify run` and its broker,
   `kill -9` included.

On real `notify run` processes and a real valkey-server. Run as root, the "other
user" is a real one (`nobody`, uid 65534), started with `subprocess`'s ``user=``.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import shutil
import signal
import sqlite3
import ssl
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import redis
from yarl import URL

from pipeline.embedded import EmbeddedRedis, free_port
from pipeline.transport.keys import Keys
from tests.cli.test_cli import ROOT, notify
from tests.transport.helpers import wait_until

IS_ROOT = os.geteuid() == 0
NOBODY = 65534
SHIP = ["--category", "transaction", "--template", "order_shipped", "--param", "order_no=1", "--param", "carrier=UPS",
        "--param", "tracking_no=T", "--param", "tracking_url=https://t"]


def _open_base() -> Path:
    """A directory every user may traverse (as a home directory usually is), so only
    the modes notify gives its own files stand between them and another user."""
    base = Path(tempfile.mkdtemp(prefix="notify-local-"))
    os.chmod(base, 0o755)
    return base


def _start_run(env: dict, log: Path, *extra: str) -> subprocess.Popen:
    """`notify run` as a user starts it, with the common umask 022."""
    return subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", "--metrics-port", "0", "--providers", "fake",
                             "--workers", "1", "--no-priority-process", *extra],
                            cwd=str(ROOT), env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, umask=0o022)


def _env(data: Path, **more: str) -> dict:
    env = dict(os.environ, NOTIFY_DATA_DIR=str(data), PYTHONPATH=str(ROOT), **more)
    for k in ("REDIS_URL", "NOTIFY_BROKER", "NOTIFY_DEBUG"):
        if k not in more:
            env.pop(k, None)
    cfg = data.parent / "notify.toml"
    cfg.write_text("receipt_poll_s = 0\n")
    env["NOTIFY_CONFIG"] = str(cfg)
    return env


def _wait_workers(url: str, timeout: float = 60) -> None:
    r = redis.Redis.from_url(url)
    try:
        wait_until(lambda: r.exists(Keys().lease("notify", 0)), timeout, 0.2, "the worker holds its slot")
    finally:
        r.close()


def _stop(run: subprocess.Popen, log: Path) -> None:
    kids = psutil.Process(run.pid).children(recursive=True) if run.poll() is None else []
    run.terminate()
    code = run.wait(60)
    for k in kids:
        if k.is_running():
            k.kill()
    assert code == 0, log.read_text()[-3000:]


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _as_nobody(fn) -> str:
    """What ``fn()`` returns when run by another user: a child forked from this
    process that drops to uid/gid 65534 first (no interpreter to exec: this one may
    live where that user cannot reach)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(w, fn().encode())
        except BaseException as exc:  # noqa: BLE001
            os.write(w, f"child error {exc!r}".encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()


def _try_read(path) -> str:
    try:
        with open(path, "rb") as fh:
            fh.read(1)
        return f"read {path}\n"
    except OSError as exc:
        return f"denied {type(exc).__name__}\n"


def _resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


@pytest.fixture(scope="module")
def run():
    """One `notify run` (the API on, one worker) in a data directory an earlier
    version left readable: data/ 0755 with a records.db 0644."""
    base = _open_base()
    data = base / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    con = sqlite3.connect(data / "records.db")
    con.execute("PRAGMA user_version = 0")
    con.close()
    os.chmod(data / "records.db", 0o644)
    api_port = free_port()
    env = _env(data)
    log = base / "run.log"
    proc = _start_run(env, log, "--api-port", str(api_port))
    try:
        wait_until(lambda: (data / "broker.url").exists() or proc.poll() is not None, 30, 0.1, "the broker")
        assert proc.poll() is None, log.read_text()
        url = (data / "broker.url").read_text().strip()
        _wait_workers(url)
        wait_until(lambda: _get(api_port, "/healthz") is not None, 30, 0.2, "the API")
        yield {"env": env, "data": data, "url": url, "proc": proc, "log": log, "api_port": api_port, "base": base}
    finally:
        _stop(proc, log)
        shutil.rmtree(base, ignore_errors=True)


def _get(port: int, path: str):
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10).read().decode()
    except OSError:
        return None


# -- 1. the broker: a password, everywhere but in sight --------------------------------


def test_the_embedded_broker_refuses_a_client_without_its_password(run):
    u = URL(run["url"])
    assert u.password and len(u.password) >= 32 and u.host == "127.0.0.1"
    receipts = Keys().stream("notify.receipts", 0)
    forged = b'{"provider": "twilio", "provider_msg_id": "SM1", "status": "DELIVERED"}'
    anonymous = redis.Redis(host="127.0.0.1", port=u.port)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.ping()
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.xadd(receipts, {"v": forged})
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=u.port, password="guessed").ping()
    owner = redis.Redis.from_url(run["url"])
    assert owner.ping() and not owner.exists(receipts)
    # another user: no password to read, and the server says NOAUTH to a forged receipt
    assert stat.S_IMODE((run["data"] / "broker.url").stat().st_mode) == 0o600
    if IS_ROOT:
        def attempt() -> str:
            import socket

            with socket.create_connection(("127.0.0.1", u.port), timeout=5) as s:
                s.sendall(_resp(b"XADD", receipts.encode(), b"*", b"v", forged))
                reply = s.recv(200).decode(errors="replace")
            return _try_read(run["data"] / "broker.url") + reply

        out = _as_nobody(attempt)
        assert out.startswith("denied PermissionError\n-NOAUTH"), out
    assert not owner.exists(receipts)


def test_the_broker_password_shows_in_no_log_status_page_or_process_arguments(run):
    password = URL(run["url"]).password
    status = notify(run["env"], "status").stdout
    assert f"broker redis://:***@127.0.0.1:{URL(run['url']).port}/0" in status and password not in status
    for path in ("/", "/v1/status.json", "/metrics"):
        page = _get(run["api_port"], path)
        assert page is not None and password not in page, path
    assert json.loads(_get(run["api_port"], "/v1/status.json"))["broker"]["ok"]
    tree = _tree(run["proc"].pid)
    assert len(tree) >= 4  # notify run, the broker, the worker, the API
    for p in tree:
        assert password not in " ".join(p.cmdline()), p.cmdline()
    # the children have it from the environment (readable by this user only: /proc/<pid>/environ 0400)
    worker = next(p for p in tree if "worker" in p.cmdline())
    assert worker.environ().get("NOTIFY_BROKER") == run["url"]
    assert password not in run["log"].read_text()
    assert password not in (run["data"] / "redis" / "server.log").read_text()
    assert stat.S_IMODE((run["data"] / "redis" / "server.conf").stat().st_mode) == 0o600


def test_every_command_works_against_the_password_protected_broker(run):
    env = run["env"]
    assert json.loads(notify(env, "user", "set", "loc1", "--email", "l@example.com").stdout)["user"] == "loc1"
    p = notify(env, "send", *SHIP, "--to", "loc1", "--biz-key", "local:1", "--wait", "60", timeout=90)
    assert "loc1 inbox DELIVERED" in p.stdout, p.stdout
    assert any(r["status"] == "DELIVERED" for r in json.loads(notify(env, "records", "show", "local:1").stdout))
    assert any(json.loads(line)["biz_key"] == "local:1" for line in notify(env, "outcomes", "tail").stdout.splitlines())
    refused = notify(env, "send", "--json", json.dumps({"category": "transaction", "template": "order_shipped",
                                                        "recipients": ["loc1"], "params": {}}), check=False)
    assert refused.returncode == 2 and "missing_params" in refused.stderr
    assert notify(env, "dlq", "ls").returncode == 0
    assert "notify.events" in notify(env, "status").stdout
    key = json.loads(notify(env, "keys", "add", "shop", "--scopes", "events:write").stdout)["key"]
    assert key and "shop" in notify(env, "keys", "ls").stdout


# -- 2. files: this user's only ---------------------------------------------------------


def test_data_files_are_private_whatever_the_umask(run):
    data = run["data"]
    notify(run["env"], "send", *SHIP, "--to", "loc2", "--biz-key", "local:2", "--wait", "60", timeout=90)
    (data / "api_keys.json").exists() or notify(run["env"], "keys", "add", "ops", "--scopes", "records:read")
    time.sleep(1.2)  # the AOF's everysec fsync
    redis_dir, aof = data / "redis", data / "redis" / "appendonlydir"
    dirs = [data, redis_dir, aof, data / "worker"]
    files = [data / n for n in ("records.db", "records.db-wal", "records.db-shm", "broker.url", "api_keys.json",
                                "notify.lock")]
    files += [redis_dir / "server.log", redis_dir / "server.conf", *aof.iterdir()]
    assert len(list(aof.iterdir())) >= 2
    modes = {str(p.relative_to(data)): oct(stat.S_IMODE(p.stat().st_mode)) if p.exists() else "missing"
             for p in dirs + files}
    assert modes == {**{str(d.relative_to(data)): "0o700" for d in dirs},
                     **{str(f.relative_to(data)): "0o600" for f in files}}
    # nothing else in data/ that another user could read or enter
    for p in data.rglob("*"):
        assert stat.S_IMODE(p.lstat().st_mode) & 0o077 == 0, p
    if IS_ROOT:
        def attempt() -> str:
            out = "".join(_try_read(p) for p in (data / "records.db", data / "records.db-wal",
                                                 aof / "appendonly.aof.manifest"))
            try:
                os.listdir(data)
                return out + "listed\n"
            except OSError as exc:
                return out + f"denied {type(exc).__name__}\n"

        assert _as_nobody(attempt) == "denied PermissionError\n" * 4


# -- 3. one notify run per data directory -----------------------------------------------


def test_a_second_notify_run_on_the_same_data_dir_refuses_to_start(run):
    before = (run["data"] / "broker.url").read_text()
    brokers = [p for p in psutil.process_iter(["name"]) if p.info["name"] and "valkey" in p.info["name"]]
    second = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", "--api-port", "0", "--metrics-port", "0",
                               "--providers", "fake"], cwd=str(ROOT), env=run["env"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = second.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # it started: stop it and all it started
        for k in _tree(second.pid)[1:]:
            k.kill()
        second.kill()
        out, err = second.communicate()
        pytest.fail(f"a second notify run started on the same data directory:\n{out[-1500:]}")
    assert second.returncode == 2 and out == "", out
    assert err.strip().splitlines() == [
        f"notify: {run['data']} is in use by another `notify run` (pid {run['proc'].pid}) or the broker it started; "
        f"one `notify run` per data directory (stop it, or set NOTIFY_DATA_DIR)"]
    assert (run["data"] / "broker.url").read_text() == before
    assert redis.Redis.from_url(run["url"]).ping()
    after = [p for p in psutil.process_iter(["name"]) if p.info["name"] and "valkey" in p.info["name"]]
    assert len(after) <= len(brokers)


def test_the_lock_goes_with_notify_run_and_its_broker_kill_9_included(tmp_path):
    data = tmp_path / "data"
    env = _env(data)
    first = _start_run(env, tmp_path / "first.log", "--api-port", "0")
    tree: list = []
    try:
        wait_until(lambda: (data / "broker.url").exists() or first.poll() is not None, 30, 0.1, "the broker")
        url = (data / "broker.url").read_text().strip()
        _wait_workers(url)
        tree = _tree(first.pid)
        broker = next(p for p in tree if "valkey" in p.name())
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        # its broker, orphaned, still runs on the AOF: holding the lock, so no second broker joins it
        assert broker.is_running() and redis.Redis.from_url(url).ping()
        refused = notify(env, "run", "--api-port", "0", "--metrics-port", "0", "--providers", "fake", check=False,
                         timeout=30)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
        assert f"in use by another `notify run` (pid {first.pid}) or the broker it started" in refused.stderr
        assert (data / "broker.url").read_text().strip() == url
    finally:
        if first.poll() is None:
            tree = _tree(first.pid)
            first.kill()
        for p in tree[1:]:
            if p.is_running():
                p.kill()
        psutil.wait_procs(tree[1:], timeout=10)
    # all of them gone (kill -9): the lock with them; the next run starts, on a new password
    second = _start_run(env, tmp_path / "second.log", "--api-port", "0")
    try:
        wait_until(lambda: (data / "broker.url").exists() and (data / "broker.url").read_text().strip() != url
                   or second.poll() is not None, 30, 0.1, "the second broker")
        assert second.poll() is None, (tmp_path / "second.log").read_text()
        again = (data / "broker.url").read_text().strip()
        assert URL(again).password != URL(url).password and redis.Redis.from_url(again).ping()
    finally:
        _stop(second, tmp_path / "second.log")
    assert not (data / "broker.url").exists()  # a stopped run leaves no password of a dead server behind


# -- 1b. REDIS_URL: an ACL user, over TLS -----------------------------------------------


def _self_signed(dirpath: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    certfile, keyfile = dirpath / "cert.pem", dirpath / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return certfile, keyfile


class TLSFront:
    """TLS in front of a plain server (as stunnel or a managed Redis's TLS endpoint):
    the valkey-server of the wheel is built without TLS."""

    def __init__(self, target_port: int, certfile: Path, keyfile: Path) -> None:
        self.target_port = target_port
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(certfile, keyfile)
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.handshakes = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0, ssl=self.ctx))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _client(self, reader, writer) -> None:
        self.handshakes += 1
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pipe(r, w) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (OSError, ssl.SSLError):
                pass
            finally:
                w.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_redis_url_with_an_acl_user_over_rediss_for_every_process(tmp_path):
    secret = "acl-user-s3cret-" + os.urandom(8).hex()
    server = EmbeddedRedis(tmp_path / "redis", extra=("--user", "notify", "on", f">{secret}", "~*", "&*", "+@all")).start()
    certfile, keyfile = _self_signed(tmp_path)
    front = TLSFront(server.port, certfile, keyfile)
    url = f"rediss://notify:{secret}@127.0.0.1:{front.port}/0?ssl_ca_certs={certfile}"
    data = tmp_path / "data"
    env = _env(data, REDIS_URL=url)
    api_port = free_port()
    run = _start_run(env, tmp_path / "run.log", "--api-port", str(api_port))
    try:
        wait_until(lambda: redis.Redis.from_url(server.url).exists(Keys().lease("notify", 0)) or run.poll() is not None,
                   60, 0.2, "the worker over TLS")
        assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        # no embedded server: the URL given is remembered for later commands, private
        assert (data / "broker.url").stat().st_mode & 0o777 == 0o600
        notify(env, "send", *SHIP, "--to", "tls1", "--biz-key", "tls:1")
        wait_until(lambda: "DELIVERED" in notify(env, "records", "show", "tls:1", check=False).stdout, 60, 0.5,
                   "delivered through the TLS broker")
        status = notify(env, "status").stdout
        assert f"broker rediss://notify:***@127.0.0.1:{front.port}/0" in status and secret not in status
        assert any(json.loads(line)["biz_key"] == "tls:1" for line in notify(env, "outcomes", "tail").stdout.splitlines())
        page = _get(api_port, "/v1/status.json")
        assert page and json.loads(page)["broker"]["ok"] and secret not in page
        for p in _tree(run.pid):
            assert secret not in " ".join(p.cmdline())
        assert front.handshakes >= 3  # the worker, the API, the supervisor and the commands all came through TLS
        # a client without TLS is refused
        with pytest.raises(redis.exceptions.ConnectionError):
            redis.Redis(host="127.0.0.1", port=front.port, username="notify", password=secret,
                        socket_timeout=3).ping()
    finally:
        _stop(run, tmp_path / "run.log")
        front.close()
        server.stop()
    assert secret not in (tmp_path / "run.log").read_text()


def test_a_sigterm_while_notify_run_starts_stops_it_and_its_broker(tmp_path):
    """SIGTERM the moment the embedded server is up (its URL written), before the
    workers are: `notify run` stops as when running, exit 0, its broker gone with
    it. Before, the signal killed it there and left the broker running, orphaned,
    with the data directory's lock (a CI run met it)."""
    data = tmp_path / "data"
    run = _start_run(_env(data), tmp_path / "run.log")
    tree: list = []
    try:
        wait_until(lambda: (data / "broker.url").exists() or run.poll() is not None, 30, 0.005, "the broker")
        tree = _tree(run.pid)  # its embedded server among them
        assert any("valkey" in p.name() for p in tree), tree
        run.send_signal(signal.SIGTERM)
        code = run.wait(60)
        assert code == 0, (tmp_path / "run.log").read_text()[-3000:]
        gone, alive = psutil.wait_procs(tree[1:], timeout=10)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
        assert not (data / "broker.url").exists()
    finally:
        if run.poll() is None:
            run.kill()
        for p in tree[1:]:
            if p.is_running():
                p.kill()
