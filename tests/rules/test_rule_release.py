"""Gray release (pipeline/rules/release.py): stages, deterministic buckets,
template versions and channels."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from config.settings import CHANNELS
from pipeline.rules.release import Release, bucket, channel_held, parse_release, reaches, template_version


def test_stages_reach_who_they_say():
    users = [f"u{i}" for i in range(2000)]
    internal = Release("r", "internal", template="t", version=2, internal_users=("u1", "u2"))
    assert [u for u in users if reaches(internal, u)] == ["u1", "u2"]
    ten = Release("r", "percent", template="t", version=2, internal_users=("u1",), percent=10)
    share = sum(reaches(ten, u) for u in users) / len(users)
    assert 0.07 < share < 0.13 and reaches(ten, "u1")
    assert all(reaches(Release("r", "all", channel="webhook"), u) for u in users[:50])
    assert not any(reaches(Release("r", "off", channel="webhook", internal_users=("u1",)), u) for u in users[:50])


@given(st.text(min_size=1, max_size=20), st.floats(0, 100), st.floats(0, 100))
def test_raising_the_percentage_only_adds_users(user, a, b):
    lo, hi = sorted((a, b))
    if reaches(Release("r", "percent", channel="sms", percent=lo), user):
        assert reaches(Release("r", "percent", channel="sms", percent=hi), user)
    assert 0 <= bucket("r", user) < 100 and bucket("r", user) == bucket("r", user)


def test_template_versions_and_channels():
    rs = (Release("v2", "internal", template="order_shipped", version=2, internal_users=("boss",)),
          Release("hook", "internal", channel="webhook", internal_users=("boss",)))
    assert template_version(rs, "order_shipped", 1, "boss") == 2
    assert template_version(rs, "order_shipped", 1, "anyone") == 1
    assert template_version(rs, "order_shipped", 3, "boss") == 3  # asked for newer: kept
    assert template_version(rs, "otp", 1, "boss") == 1
    assert not channel_held(rs, "webhook", "boss") and channel_held(rs, "webhook", "anyone")
    assert not channel_held(rs, "sms", "anyone")


@pytest.mark.parametrize("raw,field", [
    ({"stage": "soon", "channel": "sms"}, "stage"),
    ({"stage": "all"}, "releases.r"),
    ({"stage": "all", "template": "t", "version": 1}, "version"),
    ({"stage": "all", "template": "t", "version": 2, "channel": "sms"}, "releases.r"),
    ({"stage": "all", "channel": "fax"}, "channel"),
    ({"stage": "percent", "channel": "sms", "percent": 101}, "percent"),
    ({"stage": "internal", "channel": "sms", "internal_users": "boss"}, "internal_users"),
    ({"stage": "all", "channel": "sms", "extra": 1}, "extra"),
])
def test_bad_releases_name_the_field(raw, field):
    with pytest.raises(ValueError) as e:
        parse_release("r", raw, CHANNELS)
    assert str(e.value).split(":", 1)[0].endswith(field)
