"""SMS through Amazon SNS (issue 27, item 3): Publish to a phone number (SigV4 by
botocore) against the simulator on 127.0.0.1 (accepted, permanent, opted out,
rate limited, transient, timeout → UNKNOWN, configuration faults), the provider
kind from config and its credentials check (GetSMSAttributes). Judged by
botocore's own SNS client: it talks to the simulator (signature, XML answers
and error codes as SNS's service model has them), and it sends the same form as
our adapter for the same message."""

from __future__ import annotations

import asyncio

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.session import get_session

from adapters.base import Fault, PermanentKind, QueryStatus
from adapters.dispatch import Dispatcher
from adapters.registry import build_spec, check_all
from adapters.simulators.sns_sim import SnsSim
from adapters.sns import SnsSmsConfig, SnsSmsProvider
from config.settings import ConfigError, load_settings
from pipeline.models import AttemptResult
from tests.adapters.helpers import notify_toml

OK = "+14155550123"


@pytest.fixture
async def sns(profile):
    sim = SnsSim(profile)
    await sim.start()
    yield sim
    await sim.stop()


def provider_for(sim: SnsSim, **kw) -> SnsSmsProvider:
    cfg = dict(region=sim.region, access_key_id=sim.access_key_id, secret_access_key=sim.secret_access_key,
               base_url=sim.base_url, sender_id="NOTIFY", timeout=2.0)
    cfg.update(kw)
    return SnsSmsProvider(SnsSmsConfig(**cfg))


def boto_sns(sim: SnsSim, secret: str | None = None):
    return get_session().create_client(
        "sns", region_name=sim.region, endpoint_url=sim.base_url, aws_access_key_id=sim.access_key_id,
        aws_secret_access_key=secret or sim.secret_access_key,
        config=Config(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=2))


async def test_accepted_with_the_form_botocore_sends(sns, make_delivery):
    p = provider_for(sns)
    try:
        d = make_delivery("sms", OK, {"body": "Your code is 123456"})
        r = await p.send(d)
        assert r.result == AttemptResult.ACCEPTED, r
        assert r.provider == "sns" and r.provider_msg_id in sns.core.messages
        ours = sns.core.messages[r.provider_msg_id]
        assert ours["attributes"] == {"AWS.SNS.SMS.SMSType": "Transactional", "AWS.SNS.SMS.SenderID": "NOTIFY"}
        q = await p.query(d.delivery_id, r.provider_msg_id)
        assert (q.supported, q.status) == (False, QueryStatus.NOT_FOUND)
    finally:
        await p.close()
    # the judge: botocore's own client, the same message
    client = boto_sns(sns)
    out = await asyncio.to_thread(
        client.publish, PhoneNumber=OK, Message="Your code is 123456 (boto)", MessageAttributes={
            "AWS.SNS.SMS.SMSType": {"DataType": "String", "StringValue": "Transactional"},
            "AWS.SNS.SMS.SenderID": {"DataType": "String", "StringValue": "NOTIFY"}})
    theirs = sns.core.messages[out["MessageId"]]
    assert {**theirs["form"], "Message": ""} == {**ours["form"], "Message": ""}
    attrs = await asyncio.to_thread(client.get_sms_attributes)
    assert attrs["attributes"]["DefaultSMSType"] == "Transactional"


async def test_botocore_reads_the_simulators_errors_as_sns_codes(sns):
    client = boto_sns(sns)
    cases = {"+14155550001": "InvalidParameter", "+14155550002": "Throttling", "12345": "InvalidParameter"}
    for number, code in cases.items():
        with pytest.raises(ClientError) as exc:
            await asyncio.to_thread(client.publish, PhoneNumber=number, Message="x")
        assert exc.value.response["Error"]["Code"] == code
    with pytest.raises(ClientError) as exc:
        await asyncio.to_thread(boto_sns(sns, secret="z" * 40).publish, PhoneNumber=OK, Message="x")
    assert exc.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


async def test_invalid_and_opted_out_numbers_are_permanent(sns, make_delivery):
    p = provider_for(sns)
    try:
        got = {}
        for number in ("+14155550001", "+14155550008", "0123"):
            r = await p.send(make_delivery("sms", number, {"body": "x"}))
            got[number] = (r.result, r.permanent_kind)
        assert got == {"+14155550001": (AttemptResult.PERMANENT_ERROR, PermanentKind.INVALID_NUMBER),
                       "+14155550008": (AttemptResult.PERMANENT_ERROR, PermanentKind.OPTED_OUT),
                       "0123": (AttemptResult.PERMANENT_ERROR, PermanentKind.INVALID_NUMBER)}
        r = await p.send(make_delivery("sms", OK, {"body": ""}))
        assert (r.result, r.permanent_kind) == (AttemptResult.PERMANENT_ERROR, PermanentKind.INVALID_REQUEST)
    finally:
        await p.close()


async def test_throttling_is_rate_limited_5xx_transient_timeout_unknown(sns, make_delivery, free_port):
    p = provider_for(sns, timeout=0.5)
    try:
        d = make_delivery("sms", "+14155550002", {"body": "code 1"})
        r = await p.send(d)
        assert r.result == AttemptResult.RATE_LIMITED and "Throttling" in r.error
        assert (await p.send(d)).result == AttemptResult.ACCEPTED  # the same message passes the second time
        r = await p.send(make_delivery("sms", "+14155550006", {"body": "code 2"}))
        assert r.result == AttemptResult.TRANSIENT_ERROR and "ServiceUnavailable" in r.error
        r = await p.send(make_delivery("sms", "+14155550007", {"body": "code 3"}))
        assert r.result == AttemptResult.TRANSIENT_ERROR and "InternalError" in r.error
        r = await p.send(make_delivery("sms", "+14155550004", {"body": "code 4"}))
        assert r.result == AttemptResult.TIMEOUT_UNKNOWN, r
        assert len(sns.by_number("+14155550004")) == 1  # it was taken: never fail over on UNKNOWN
    finally:
        await p.close()
    refused = provider_for(sns, base_url=f"http://127.0.0.1:{free_port}")
    try:
        assert (await refused.send(make_delivery("sms", OK, {"body": "x"}))).result == AttemptResult.TRANSIENT_ERROR
    finally:
        await refused.close()


async def test_wrong_credentials_are_a_configuration_fault_and_fail_over(sns, make_delivery):
    from adapters.fake import FakeProvider

    faults = []
    wrong = provider_for(sns, secret_access_key="q" * 40)
    disp = Dispatcher({"sns": wrong, "sms_b": FakeProvider("sms_b", "sms", primary=False)},
                      {"sms": ["sns", "sms_b"]}, on_fault=lambda n, r: faults.append(n))
    try:
        rnd = await disp.send(make_delivery("sms", OK, {"body": "code"}))
        assert [(r.provider, r.result, r.fault) for r in rnd.results] == [
            ("sns", AttemptResult.TRANSIENT_ERROR, Fault.CONFIG), ("sms_b", AttemptResult.ACCEPTED, None)]
        assert rnd.results[0].error.startswith("auth: 403 SignatureDoesNotMatch") and faults == ["sns"]
    finally:
        await disp.close()


def _config(tmp_path, sim: SnsSim, extra: str = "") -> str:
    (tmp_path / "aws_secret").write_text(sim.secret_access_key + "\n")
    return notify_toml(tmp_path, f"""
[providers.sms_aws]
kind = "sns"
base_url = "{sim.base_url}"
region = "{sim.region}"
access_key_id = "{sim.access_key_id}"
secret_access_key_file = "aws_secret"
sms_type = "Transactional"
sender_id = "NOTIFY"
timeout = 5
{extra}
""")


async def test_from_config_and_notify_providers_check(sns, tmp_path, make_delivery):
    s = load_settings(_config(tmp_path, sns), env={})
    spec = s.providers["sms_aws"]
    assert (spec.kind, spec.channel) == ("sns", "sms")
    p = build_spec(spec, {})
    try:
        assert p.config.secret_access_key == sns.secret_access_key  # the file's newline is not part of it
        assert (await p.send(make_delivery("sms", OK, {"body": "hi"}))).result == AttemptResult.ACCEPTED
    finally:
        await p.close()
    [line] = await check_all(s.providers, {}, {}, timeout=5)
    assert line.ok and "GetSMSAttributes, default Transactional" in line.message, line
    (tmp_path / "aws_secret").write_text("w" * 40)
    [line] = await check_all(s.providers, {}, {}, timeout=5)
    assert not line.ok and line.message.startswith("auth: GetSMSAttributes: 403 SignatureDoesNotMatch")
    assert [r["op"] for r in sns.core.ledger].count("send") == 1


def test_config_refuses_an_inline_secret_and_needs_a_region(tmp_path):
    sim = SnsSim()
    with pytest.raises(ConfigError) as exc:
        load_settings(_config(tmp_path, sim, 'secret_access_key = "abc"'), env={})
    assert exc.value.key == "providers.sms_aws.secret_access_key" and "abc" not in str(exc.value)
    (tmp_path / "n.toml").write_text((tmp_path / "notify.toml").read_text()
                                     .replace('secret_access_key = "abc"', "").replace(f'region = "{sim.region}"', ""))
    with pytest.raises(ConfigError) as exc:
        load_settings(str(tmp_path / "n.toml"), env={})
    assert exc.value.key == "providers.sms_aws.region"
    assert SnsSmsConfig(region="ap-south-1", access_key_id="A", secret_access_key="s").endpoint == \
        "https://sns.ap-south-1.amazonaws.com"


def test_the_simulators_sigv4_check_takes_awss_published_example():
    """The simulators' SigV4 check (written from the specification) against the
    "get-vanilla" case of AWS's Signature Version 4 test suite, and refusing it changed."""
    import datetime as dt

    from aiohttp.test_utils import make_mocked_request

    from adapters.simulators.aws_sim import check_sigv4

    keys = {"AKIDEXAMPLE": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"}
    at = dt.datetime(2015, 8, 30, 12, 36, tzinfo=dt.timezone.utc)
    auth = ("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
            "SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31")

    def req(path="/", host="example.amazonaws.com", authorization=auth):
        return make_mocked_request("GET", path, headers={"Host": host, "X-Amz-Date": "20150830T123600Z",
                                                         "Authorization": authorization})

    assert check_sigv4(req(), b"", keys, "us-east-1", "service", now=at) is None
    assert check_sigv4(req(path="/x"), b"", keys, "us-east-1", "service", now=at)[0] == "SignatureDoesNotMatch"
    assert check_sigv4(req(host="other.example"), b"", keys, "us-east-1", "service", now=at)[0] == \
        "SignatureDoesNotMatch"
    assert check_sigv4(req(), b"", keys, "us-east-1", "service", now=at + dt.timedelta(minutes=16))[0] == \
        "RequestExpired"
    assert check_sigv4(req(), b"", {}, "us-east-1", "service", now=at)[0] == "InvalidClientTokenId"
