"""The per-priority lane batch size (``[lane_batch_size]``): the knob bench/otp.py
turns between a low-lane backlog's drain rate and high-priority latency."""

import pytest

from config.settings import ConfigError, load_settings


def write(tmp_path, text):
    p = tmp_path / "user.toml"
    p.write_text(text)
    return p


def test_default_is_the_channels_batch_size():
    s = load_settings(env={})
    assert dict(s.lane_batch_sizes) == {}
    assert s.lane_batch_size("email", "low") == s.channels["email"].lane_batch_size == 100


def test_priority_overrides_every_channel_of_that_lane(tmp_path):
    s = load_settings(write(tmp_path, "[lane_batch_size]\nlow = 10\n\n[channels.sms]\nlane_batch_size = 7\n"), env={})
    assert s.lane_batch_size("email", "low") == 10
    assert s.lane_batch_size("sms", "low") == 10
    assert s.lane_batch_size("sms", "high") == 7  # no high override: the channel's
    assert s.lane_batch_size("push", "normal") == 100


@pytest.mark.parametrize(
    "text, key, value",
    [
        ("[lane_batch_size]\nlow = 0\n", "lane_batch_size.low", 0),
        ('[lane_batch_size]\nlow = "big"\n', "lane_batch_size.low", "big"),
        ("[lane_batch_size]\nurgent = 5\n", "lane_batch_size.urgent", 5),
        ("lane_batch_size = 5\n", "lane_batch_size", 5),
    ],
)
def test_bad_values_name_key_and_value(tmp_path, text, key, value):
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, text), env={})
    assert err.value.key == key and err.value.value == value
