"""The CLI over hostile input (issue 26, hostile input: the CLI row): what a user
types, what the environment says, what another writer left in the broker or the
data directory. Every refusal is one line on stderr and a non-zero exit, never a
traceback; a stream entry reaches the terminal escaped, never raw. `notify` runs as
a subprocess against the test session's valkey-server."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import redis

from pipeline.topics import ALL
from pipeline.transport.keys import Keys
from tests.cli.test_cli import ROOT, notify
from tests.transport.helpers import produce_async

PARTITIONS = 8
SHIP = ["--category", "transaction", "--template", "order_shipped", "--to", "h1", "--param", "order_no=1",
        "--param", "carrier=UPS", "--param", "tracking_no=T", "--param", "tracking_url=https://t"]


@pytest.fixture
def env(tmp_path, redis_url):
    e = dict(os.environ, NOTIFY_BROKER=redis_url, NOTIFY_DATA_DIR=str(tmp_path / "data"),
             NOTIFY_PARTITIONS=str(PARTITIONS), PYTHONPATH=str(ROOT))
    for k in ("REDIS_URL", "NOTIFY_DEBUG"):
        e.pop(k, None)
    return e


def one_line(p, code: int = 2) -> str:
    """The refusal: exit ``code``, one line on stderr starting ``notify:``, no traceback."""
    err = p.stderr.strip()
    assert p.returncode == code and "Traceback" not in p.stderr and len(err.splitlines()) == 1 \
        and err.startswith("notify: "), (p.returncode, p.stderr[-3000:])
    return err


def highwater(url: str) -> int:
    r, keys = redis.Redis.from_url(url), Keys()
    try:
        return sum(int(r.get(keys.counter(t, p)) or 0) for t in ALL for p in range(PARTITIONS))
    finally:
        r.close()


COMMANDS = [
    ["status"],
    ["send", *SHIP],
    ["dlq", "ls"],
    ["dlq", "replay"],
    ["outcomes", "tail"],
    ["records", "replay"],
    ["user", "set", "h1", "--email", "h@example.com"],
    ["worker"],
    ["api", "--port", "0"],
]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: "-".join(c[:2]))
def test_a_broker_url_that_is_not_one_is_one_line_for_every_command(env, cmd):
    err = one_line(notify(dict(env, NOTIFY_BROKER="notaurl"), *cmd, check=False, timeout=60))
    assert err == "notify: NOTIFY_BROKER: unsupported broker URL 'notaurl': scheme must be one of redis://, rediss://"


@pytest.mark.parametrize("url, says", [
    ("foo://127.0.0.1:6379/0", "scheme must be one of redis://, rediss://"),
    ("redis://:s3cret@127.0.0.1:99999/0", "does not parse"),
    ("redis://:s3cret@127.0.0.1:6379/x", "database must be a number"),
    ("redis:///0", "has no host"),
])
def test_a_bad_redis_url_is_one_line_without_its_password(env, url, says):
    env = dict(env, REDIS_URL=url)
    env.pop("NOTIFY_BROKER")
    for cmd in (["status"], ["send", *SHIP], ["run", "--api-port", "0", "--metrics-port", "0"]):
        err = one_line(notify(env, *cmd, check=False, timeout=60))
        assert err.startswith("notify: REDIS_URL: ") and says in err and "s3cret" not in err, err


def test_send_refuses_what_the_api_refuses_and_writes_nothing(env, redis_url, tmp_path):
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe{\"category\": 1}")
    (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
    cases = {
        ("--category", "nope", "--template", "otp", "--to", "h1", "--param", "code=1"): "unknown_category",
        ("--category", "otp", "--template", "nope", "--to", "h1", "--param", "code=1"): "unknown_template",
        ("--category", "otp", "--template", "otp", "--to", "h1", "--param", "code=1", "--channel", "fax"):
            "unknown_channel",
        ("--category", "otp", "--template", "otp", "--to", "h1"): "missing_params",
        ("--category", "otp", "--template", "otp", "--to", "h1", "--param", "code"): "--param wants key=value",
        ("--json", "{nope"): "--json is not a JSON event",
        ("--json", "[1, 2]"): "--json must be a JSON object",
        ("--json", "null"): "--json must be a JSON object",
        ("--json", f"@{tmp_path / 'missing.json'}"): "No such file",
        ("--json", f"@{tmp_path / 'bin.json'}"): "--json is not a JSON event",
        ("--json", f"@{tmp_path / 'deep.json'}"): "--json",
        ("--json", '{"category": "otp", "template": "otp", "recipients": ["h1"], "params": {"code": NaN}}'):
            "--json is not a JSON event",
        ("--json", '{"biz_key": 5, "category": "otp", "template": "otp", "recipients": ["h1"]}'): "wrong_type",
        ("--json", '{"category": "otp", "template": "otp", "recipients": "h1", "params": {"code": "1"}}'):
            "wrong_type",
    }
    for args, says in cases.items():
        err = one_line(notify(env, "send", *args, check=False))
        assert says in err, (args, err)
    assert highwater(redis_url) == 0  # nothing reached the broker


def test_dlq_ls_and_outcomes_tail_never_put_raw_bytes_on_the_terminal(env, redis_url):
    hostile = [
        b"\xff\xfe not UTF-8",
        b"\x1b]0;owned\x07\x1b[2J\x1b[1A a terminal escape",
        b'{"source": "lane", "payload": "x"}\n{"forged": "second line"}',
        "\u202eevil bidi".encode(),
    ]
    good = b'{"reason": "unknown_category", "note": "caf\xc3\xa9 \\u001b"}'
    for topic in ("notify.dlq", "notify.outcomes"):
        asyncio.run(produce_async(redis_url, topic, [(b"k", v) for v in [*hostile, good]], partitions=PARTITIONS,
                                  partition=0))
    for cmd in (["dlq", "ls"], ["outcomes", "tail"]):
        p = notify(env, *cmd, check=False)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
        out = p.stdout
        lines = out.splitlines()
        assert len(lines) == 5, lines  # one line an entry: a newline inside one cannot forge another
        assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f or c in "\u202e\u2028" for c in out.replace("\n", ""))
        assert lines[1] == "\\u001b]0;owned\\u0007\\u001b[2J\\u001b[1A a terminal escape"
        assert lines[3] == "\\u202eevil bidi"
        # bytes that are not UTF-8 shown as such (dlq ls masks addresses in a decoded letter: U+FFFD there)
        assert lines[0] in ("\\xff\\xfe not UTF-8", "\ufffd\ufffd not UTF-8")
        assert json.loads(lines[4]) == {"reason": "unknown_category", "note": "café \x1b"}  # valid JSON unchanged
    replay = notify(env, "dlq", "replay", check=False)
    assert replay.returncode == 0 and json.loads(replay.stdout)["not_replayed"]


def test_status_over_what_another_writer_left_in_the_broker(env, redis_url):
    r, keys = redis.Redis.from_url(redis_url), Keys()
    r.set(keys.counter("notify.events", 1), b"\xff")
    r.hset(keys.offsets("notify"), keys.tp_field("notify.events", 2), b"not a number")
    r.hset(keys.offsets("notify"), b"\xfe\xff", b"1")
    r.set(keys.lease("notify", 0), b"\x1b[2J\xff")
    r.hset(keys.supervisor, b"host/x", b"\xff not json")
    p = notify(env, "status", check=False)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    row = next(line.split() for line in p.stdout.splitlines() if line.startswith("notify.events "))
    assert row == ["notify.events", "?", "?", "?"]
    assert "\x1b" not in p.stdout and "slots: 0→\\u001b[2J\\xff" in p.stdout


def test_an_unexpected_error_is_one_line_with_a_hint_and_debug_shows_the_traceback(env, tmp_path):
    data = Path(env["NOTIFY_DATA_DIR"])
    data.mkdir(parents=True)
    (data / "records.db").write_bytes(b"this is not a SQLite database, whoever wrote it" * 100)
    err = one_line(notify(env, "records", "show", "x", check=False), code=1)
    assert err.startswith("notify: unexpected ") and "--debug or NOTIFY_DEBUG=1 shows the traceback" in err, err
    for debug_env, args in ((dict(env, NOTIFY_DEBUG="1"), ("records", "show", "x")),
                            (env, ("--debug", "records", "show", "x"))):
        p = notify(debug_env, *args, check=False)
        assert p.returncode != 0 and "Traceback (most recent call last)" in p.stderr, p.stderr[-2000:]


def test_a_broker_that_refuses_us_is_one_line(env, redis_url):
    """Wrong credentials, or a server that says no: the server's word, on one line."""
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    err = one_line(notify(dict(env, NOTIFY_BROKER=f"redis://nobody:wrong-pass@127.0.0.1:{port}/0"), "status",
                          check=False), code=1)
    assert "wrong-pass" not in err and ("WRONGPASS" in err or "invalid" in err.lower()), err
