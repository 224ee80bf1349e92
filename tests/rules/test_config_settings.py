"""config.settings: defaults, merging, env vars, and a clear error for each bad value."""

import dataclasses
from pathlib import Path

import pytest

from config.settings import (
    CHANNELS,
    PACKAGE_TEMPLATES_DIR,
    CategoryConfig,
    ConfigError,
    Settings,
    load_settings,
)


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "notify.toml"
    p.write_text(text)
    return str(p)


def test_defaults():
    s = load_settings(env={})
    assert isinstance(s, Settings)
    assert s.templates_dir == str(PACKAGE_TEMPLATES_DIR.resolve())
    assert s.default_locale == "en"
    assert (s.max_event_bytes, s.max_recipients, s.max_params_depth) == (256 * 1024, 10000, 8)
    assert s.redis_url is None
    assert s.data_dir == "./data"
    assert s.partitions == 8
    assert s.db_path == "./data/records.db"
    assert tuple(s.channels) == CHANNELS
    assert s.channels["sms"].max_length == 160
    assert s.channels["push"].max_length == 178
    assert s.channels["push"].title_max_length == 64
    # the inbox's window bounds the rows of one write, not a provider's load (config/defaults.toml)
    assert {name: ch.lane_batch_size for name, ch in s.channels.items()} == {
        name: 1000 if name == "inbox" else 100 for name in CHANNELS}


@pytest.mark.parametrize(
    "name, priority, limit, window, fallback",
    [
        ("security", "high", None, 300, False),
        ("otp", "high", None, 60, False),
        ("transaction", "normal", 20, 3600, True),
        ("marketing", "low", 3, 86400, True),
        ("social", "normal", 10, 3600, True),
    ],
)
def test_default_categories(name, priority, limit, window, fallback):
    c = load_settings(env={}).category(name)
    assert isinstance(c, CategoryConfig)
    assert (c.name, c.priority, c.daily_limit, c.dedup_window_s, c.inbox_fallback) == (
        name,
        priority,
        limit,
        window,
        fallback,
    )
    assert c.default_channels and set(c.default_channels) <= set(CHANNELS)


def test_outcome_entries(tmp_path):
    assert load_settings(env={}).outcome_entries == "grouped"
    assert load_settings(write(tmp_path, 'outcome_entries = "single"\n'), env={}).outcome_entries == "single"


def test_frozen():
    s = load_settings(env={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.partitions = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.categories["x"] = s.categories["otp"]  # type: ignore[index]


def test_channel_limits():
    limits = load_settings(env={}).channel_limits()
    assert limits["sms"] == {"body": 160}
    assert limits["push"] == {"title": 64, "body": 178}
    assert "body" not in limits["email"] and limits["email"]["subject"] > 0


def test_user_file_merges(tmp_path):
    path = write(
        tmp_path,
        """
default_locale = "zh"
[categories.marketing]
daily_limit = 5
[categories.transaction]
daily_limit = "exempt"
[categories.news]
priority = "low"
dedup_window_s = 0
inbox_fallback = true
default_channels = ["email", "email", "inbox"]
[channels.sms]
max_length = 70
""",
    )
    s = load_settings(path, env={})
    assert s.default_locale == "zh"
    m = s.category("marketing")
    assert m.daily_limit == 5 and m.priority == "low" and m.dedup_window_s == 86400  # rest kept
    assert s.category("transaction").daily_limit is None
    assert s.category("news").default_channels == ("email", "inbox")
    assert s.category("news").daily_limit is None  # absent = exempt
    assert s.channels["sms"].max_length == 70 and s.channels["sms"].lane_batch_size == 100


def test_config_path_from_env(tmp_path):
    path = write(tmp_path, "max_recipients = 5\n")
    assert load_settings(env={"NOTIFY_CONFIG": path}).max_recipients == 5


def test_env_vars():
    s = load_settings(
        env={"REDIS_URL": "redis://h:1/0", "NOTIFY_DATA_DIR": "/tmp/d", "NOTIFY_PARTITIONS": "4"}
    )
    assert (s.redis_url, s.data_dir, s.partitions, s.db_path) == ("redis://h:1/0", "/tmp/d", 4, "/tmp/d/records.db")
    assert load_settings(env={"NOTIFY_DB": "/x/y.db"}).db_path == "/x/y.db"


def test_relative_templates_dir_is_relative_to_the_file(tmp_path):
    (tmp_path / "tpl").mkdir()
    s = load_settings(write(tmp_path, 'templates_dir = "tpl"\n'), env={})
    assert s.templates_dir == str((tmp_path / "tpl").resolve())


@pytest.mark.parametrize(
    "text, key, value",
    [
        ('[categories.otp]\npriority = "urgent"\n', "categories.otp.priority", "urgent"),
        ("[categories.marketing]\ndaily_limit = -1\n", "categories.marketing.daily_limit", -1),
        ('[categories.marketing]\ndaily_limit = "lots"\n', "categories.marketing.daily_limit", "lots"),
        ("[categories.otp]\ndedup_window_s = -5\n", "categories.otp.dedup_window_s", -5),
        ('[categories.otp]\ndefault_channels = ["fax"]\n', "categories.otp.default_channels", "fax"),
        ("[categories.otp]\ndefault_channels = []\n", "categories.otp.default_channels", []),
        ('[categories.otp]\ninbox_fallback = "yes"\n', "categories.otp.inbox_fallback", "yes"),
        ('[categories.otp]\none_click_unsubscribe = "yes"\n', "categories.otp.one_click_unsubscribe", "yes"),
        ("[categories.otp]\ncolour = 1\n", "categories.otp.colour", 1),
        ('[categories.new]\npriority = "low"\n', "categories.new.dedup_window_s", None),
        ('[categories."Bad-Name"]\npriority = "low"\n', "categories.Bad-Name", "Bad-Name"),
        ("[channels.fax]\nmax_length = 10\n", "channels.fax", "fax"),
        ("[channels.sms]\nmax_length = -160\n", "channels.sms.max_length", -160),
        ("[channels.sms]\nlane_batch_size = 0\n", "channels.sms.lane_batch_size", 0),
        ('templates_dir = "/nonexistent/dir"\n', "templates_dir", "/nonexistent/dir"),
        ('default_locale = "../x"\n', "default_locale", "../x"),
        ("max_recipients = -1\n", "max_recipients", -1),
        ("max_event_bytes = true\n", "max_event_bytes", True),
        ("partitions = 0\n", "partitions", 0),
        ('redis_url = "localhost"\n', "redis_url", "localhost"),
        ("typo_key = 1\n", "typo_key", 1),
        ('outcome_entries = "batched"\n', "outcome_entries", "batched"),
    ],
)
def test_bad_values_name_key_and_value(tmp_path, text, key, value):
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, text), env={})
    assert err.value.key == key
    assert err.value.value == value
    assert key in str(err.value)


def test_bad_partitions_env():
    with pytest.raises(ConfigError, match="NOTIFY_PARTITIONS"):
        load_settings(env={"NOTIFY_PARTITIONS": "many"})
    with pytest.raises(ConfigError, match="NOTIFY_PARTITIONS"):
        load_settings(env={"NOTIFY_PARTITIONS": "-2"})


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_settings(str(tmp_path / "nope.toml"), env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(write(tmp_path, "this is = = not toml"), env={})
