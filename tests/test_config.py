import dataclasses

import pytest
from scrapy.settings import Settings

from distcrawl.config import DistcrawlConfig
from distcrawl.config._convert import ConfigError


def config(**values):
    return DistcrawlConfig.from_settings(Settings(values))


def test_defaults():
    c = config()
    assert c.redis_url == "redis://127.0.0.1:6379/0"
    assert c.serializer == "msgpack"
    assert c.idle_timeout is None  # stay up by default
    # two engines' worth: a place answers twice an interval at 100 ms a page
    assert (c.flush_interval, c.prefetch, c.reserves_per_place) == (0.2, 32, 3)
    assert c.flush_on_start is False


def test_prefetch_follows_concurrency_and_the_interval():
    assert config(CONCURRENT_REQUESTS=40).prefetch == 80
    assert config(CONCURRENT_REQUESTS=40, DISTCRAWL_PREFETCH=5).prefetch == 5
    # a worker holds at most its prefetch, a full engine and an interval of acknowledgements
    assert config(CONCURRENT_REQUESTS=40).max_held == 200
    assert config(CONCURRENT_REQUESTS=40, DISTCRAWL_PREFETCH=5).max_held == 50
    # what a place answers between two batches at 100 ms a page (never less than one), and
    # the reserves that keep a place's 20 pages a second of the 0.1 s interval
    for interval, pages, reserves in ((0.1, 1, 1), (0.05, 1, 1), (0.15, 2, 3), (0.3, 3, 5)):
        c = config(CONCURRENT_REQUESTS=40, DISTCRAWL_FLUSH_INTERVAL=interval)
        assert (c.prefetch, c.reserves_per_place) == (40 * pages, reserves), interval
    assert config(DISTCRAWL_FLUSH_INTERVAL=0.3, DISTCRAWL_PREFETCH=7).prefetch == 7


def test_zero_idle_timeout_is_kept_not_dropped():
    assert config(DISTCRAWL_IDLE_TIMEOUT=0).idle_timeout == 0.0
    assert config(DISTCRAWL_IDLE_TIMEOUT="2.5").idle_timeout == 2.5
    assert config(DISTCRAWL_IDLE_TIMEOUT=None).idle_timeout is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DISTCRAWL_SERIALIZER", "yaml"),
        ("DISTCRAWL_LEASE_TIMEOUT", "soon"),
        ("DISTCRAWL_LEASE_TIMEOUT", 0),
        ("DISTCRAWL_IDLE_TIMEOUT", -1),
        ("DISTCRAWL_PREFETCH", 0),
        ("DISTCRAWL_FLUSH_ON_START", "maybe"),
        ("DISTCRAWL_ALLOWED_SCHEMES", []),
        ("DISTCRAWL_THROTTLE_WINDOW", 0),
        ("DISTCRAWL_THROTTLE_SHARE", 1.5),
        ("DISTCRAWL_MAX_PENDING_PER_SLOT", 0),
        ("DISTCRAWL_REDIS_CLUSTER", "maybe"),
    ],
)
def test_bad_values_name_the_setting(name, value):
    with pytest.raises(ConfigError, match=name):
        config(**{name: value})


def test_config_is_frozen():
    c = config()
    with pytest.raises(AttributeError):
        c.prefetch = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        c.lease.timeout = 1  # type: ignore[misc]


def test_booleans_from_command_line_strings():
    assert config(DISTCRAWL_FLUSH_ON_START="true").flush_on_start is True
    assert config(DISTCRAWL_FLUSH_ON_START="0").flush_on_start is False


def test_name_lists_are_stripped_and_checked():
    config = DistcrawlConfig.from_settings(
        Settings({"DISTCRAWL_START_META_KEYS": "download_timeout, dont_filter"})
    )
    assert config.start_meta_keys == ("download_timeout", "dont_filter")
    assert config.allowed_callbacks is None
    narrowed = DistcrawlConfig.from_settings(Settings({"DISTCRAWL_ALLOWED_CALLBACKS": []}))
    assert narrowed.allowed_callbacks == ()
    with pytest.raises(ConfigError, match="DISTCRAWL_START_META_KEYS"):
        DistcrawlConfig.from_settings(Settings({"DISTCRAWL_START_META_KEYS": '["proxy"]'}))


def test_throttle_window_and_share_reach_the_scripts():
    from distcrawl.codec.politeness import politeness

    assert politeness(config()).throttle == "1000:60000:0:30:0.3"
    tuned = config(DISTCRAWL_THROTTLE_WINDOW="50", DISTCRAWL_THROTTLE_SHARE="0.5")
    assert (tuned.throttle.window, tuned.throttle.share) == (50, 0.5)
    assert politeness(tuned).throttle.endswith(":50:0.5")


def test_redis_cluster_is_auto_unless_set():
    assert config().redis_cluster is None
    assert config(DISTCRAWL_REDIS_CLUSTER="auto").redis_cluster is None
    assert config(DISTCRAWL_REDIS_CLUSTER="AUTO").redis_cluster is None
    assert config(DISTCRAWL_REDIS_CLUSTER="true").redis_cluster is True
    assert config(DISTCRAWL_REDIS_CLUSTER=False).redis_cluster is False
    assert config(DISTCRAWL_REDIS_CLUSTER="no").redis_cluster is False


def test_a_crawlers_frozen_settings_are_parsed_once_for_all_its_components():
    settings = Settings({"DISTCRAWL_LEASE_TIMEOUT": 12})
    first = DistcrawlConfig.from_settings(settings)
    assert DistcrawlConfig.from_settings(settings) is not first  # not frozen: parsed again
    settings.set("DISTCRAWL_LEASE_TIMEOUT", 13)
    settings.freeze()
    config = DistcrawlConfig.from_settings(settings)
    assert config.lease.timeout == 13
    assert DistcrawlConfig.from_settings(settings) is config
    assert DistcrawlConfig.from_settings(settings.frozencopy()) == config


def test_every_default_is_written_once_in_the_dataclass():
    """An empty project gets exactly the dataclass' defaults (the parser has none of its
    own to drift from them), but for the ones derived from Scrapy's own settings; the
    groups (lease, retry, robots, throttle) field by field, with their own defaults."""
    derived = {"prefetch", "lease.reclaim_interval", "domain_concurrency", "throttle.max_delay"}

    def compare(parsed, prefix=""):
        for field in dataclasses.fields(parsed):
            value = getattr(parsed, field.name)
            if field.default_factory is not dataclasses.MISSING:  # a group of settings
                assert type(value) is field.default_factory, field.name
                compare(value, f"{field.name}.")
            elif prefix + field.name not in derived:
                assert value == field.default, prefix + field.name

    compare(DistcrawlConfig.from_settings(Settings()))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (9410, (9410, 9410)),
        ("9410", (9410, 9410)),
        ([9410, 9420], (9410, 9420)),
        ("9410,9420", (9410, 9420)),
        ("[9410, 9420]", (9410, 9420)),
        (0, (0, 0)),
    ],
)
def test_metrics_port_takes_a_port_or_a_range(raw, expected) -> None:
    from scrapy.settings import Settings

    config = DistcrawlConfig.from_settings(Settings({"DISTCRAWL_METRICS_PORT": raw}))
    assert config.metrics_port == expected


@pytest.mark.parametrize("raw", [-1, [9420, 9410], [1, 2, 3], "x", 70000])
def test_a_bad_metrics_port_names_the_setting(raw) -> None:
    from scrapy.settings import Settings

    with pytest.raises(ConfigError, match="DISTCRAWL_METRICS_PORT="):
        DistcrawlConfig.from_settings(Settings({"DISTCRAWL_METRICS_PORT": raw}))
