import re

import pytest
from scrapy.settings import Settings

from distcrawl.config import DistcrawlConfig
from distcrawl.config._convert import ConfigError
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.names import NamespaceError, glob_escape


def test_key_names_are_pinned():
    k = FrontierKeys("site")
    assert k.start_urls == "site:start_urls"
    assert k.claims("0a0b0c0d") == "site:claims:0a0b0c0d"
    assert k.claimants == "site:claimants"
    assert k.queue == "site:queue"
    assert k.requests == "site:requests"
    assert k.leases == "site:leases"
    assert k.seen == "site:seen"
    assert k.bloom == "site:bloom"
    assert k.bloom_part(0, 0) == "site:bloom:0:0"
    assert k.bloom_part(3, 1) == "site:bloom:3:1"
    assert k.seq == "site:seq"
    assert k.dead == "site:dead"
    assert k.delayed == "site:delayed"
    assert k.revisits == "site:revisits"
    assert k.revisit_queue == "site:revisit_queue"
    assert k.revisit_of == "site:revisit_of"
    assert k.workers == "site:workers"
    assert k.alive == "site:alive"
    assert k.commits == "site:commits"
    assert k.stats == "site:stats"
    assert k.domains == "site:domains"
    assert k.history_minutes == "site:history:1m"
    assert k.history_ten_minutes == "site:history:10m"
    assert k.paused == "site:paused"
    assert k.runnable == "site:runnable"
    assert k.lifecycle == "site:lifecycle"
    assert k.webhook_lock == "site:lifecycle:webhook"
    assert k.events == "site:events"
    assert k.ready == "site:ready"
    assert k.slots == "site:slots"
    assert k.inflight == "site:inflight"
    assert k.placeless == "site:placeless"
    assert k.throttle == "site:throttle"
    assert k.throttle_raised == "site:throttle:raised"
    assert k.throttle_state == "site:throttle:state"
    assert k.limits == "site:limits"
    assert k.hungry == "site:hungry"
    assert k.robots == "site:robots"
    assert k.robotstxt == "site:robotstxt"
    assert k.settings == "site:settings"
    assert k.meta == "site:meta"
    assert k.sweep == "site:sweep"
    assert k.wake == "site:wake"
    assert k.import_queue == "site:import:queue"
    assert k.imported == "site:import:done"
    assert k.legacy_seen == "site:seen:legacy"
    assert k.migration == "site:migration"
    assert k.wake_of("0a0b0c0d") == "site:wake:0a0b0c0d"
    # a pub/sub channel, not a key: in no key list, the same for every shard
    assert k.holds == "site:holds" and k.holds not in k.all()
    assert k.sharded(4).of_shard(2).holds == "site:holds"
    assert k.robots_lock("a.test:8080") == "site:robotstxt:lock:a.test:8080"
    assert k.robots_txt("a.test:8080") == "site:robotstxt:a.test:8080"
    assert k.robots_txt_pattern == "site:robotstxt:*"
    assert set(k.all()) == {
        "site:start_urls",
        "site:claimants",
        "site:queue",
        "site:requests",
        "site:leases",
        "site:delayed",
        "site:revisits",
        "site:revisit_queue",
        "site:revisit_of",
        "site:seen",
        "site:seen:legacy",
        "site:bloom",
        "site:seq",
        "site:dead",
        "site:workers",
        "site:alive",
        "site:commits",
        "site:stats",
        "site:domains",
        "site:history:1m",
        "site:history:10m",
        "site:paused",
        "site:meta",
        "site:sweep",
        "site:reaper",
        "site:reaper:idle",
        "site:wake",
        "site:runnable",
        "site:lifecycle",
        "site:lifecycle:webhook",
        "site:events",
        "site:ready",
        "site:slots",
        "site:inflight",
        "site:placeless",
        "site:throttle",
        "site:throttle:raised",
        "site:throttle:state",
        "site:limits",
        "site:hungry",
        "site:robots",
        "site:robotstxt",
        "site:settings",
        "site:import:queue",
        "site:import:done",
        "site:migration",
    }


def test_every_key_is_in_its_namespace():
    for name in FrontierKeys("shop").all():
        assert name.startswith("shop:")


def test_bloom_parts_are_in_the_namespace_and_distinct():
    k = FrontierKeys("shop")
    parts = {k.bloom_part(i, j) for i in range(3) for j in range(3)}
    assert len(parts) == 9 and all(p.startswith("shop:bloom:") for p in parts)
    assert parts.isdisjoint(k.all())
    with pytest.raises(ValueError, match="invalid Bloom layer -1 part 0"):
        k.bloom_part(-1, 0)


def test_claim_lists_are_per_worker_in_the_namespace():
    k = FrontierKeys("shop")
    assert k.claims("0a0b0c0d") != k.claims("01020304")
    assert k.claims("0a0b0c0d").startswith("shop:") and k.claims("0a0b0c0d") not in k.all()
    for bad in ("", "a b"):
        with pytest.raises(ValueError, match="invalid worker tag"):
            k.claims(bad)


@pytest.mark.parametrize("bad", ["", "a b", "tab\there"])
def test_invalid_namespace_is_refused(bad):
    with pytest.raises(ValueError, match="invalid crawl name"):
        FrontierKeys(bad)


def test_cluster_key_names_are_pinned():
    """On a Redis Cluster every key but start_urls carries the hash tag {<ns>:start_urls}."""
    k = FrontierKeys("site", cluster=True)
    assert k.start_urls == "site:start_urls"  # unchanged: producers LPUSH to it as before
    assert k.queue == "{site:start_urls}:queue"
    assert k.requests == "{site:start_urls}:requests"
    assert k.throttle_state == "{site:start_urls}:throttle:state"
    assert k.bloom_part(3, 1) == "{site:start_urls}:bloom:3:1"
    assert k.robots_txt("a.test:8080") == "{site:start_urls}:robotstxt:a.test:8080"
    assert k.robots_lock("a.test") == "{site:start_urls}:robotstxt:lock:a.test"
    assert k.robots_txt_pattern == "{site:start_urls}:robotstxt:*"
    assert k.prefix == "{site:start_urls}:"
    assert k.holds == "{site:start_urls}:holds"
    plain = FrontierKeys("site")
    assert {name.replace("{site:start_urls}:", "site:") for name in k.all()} == set(plain.all())
    assert all(n == k.start_urls or n.startswith(k.prefix) for n in k.all())
    assert plain.on_cluster(True) == k and k.on_cluster(False) == plain


@pytest.mark.parametrize("bad", ["a}b", "{a", "x{y}"])
def test_a_namespace_with_braces_is_refused(bad):
    """On a cluster a brace would move the hash tag; on a single server too, since ``{site``
    would name keys ``{site:...``, and its worker user (``~{site:*``) would reach the
    shards of crawl ``site`` (``{site:0}:queue``)."""
    for cluster in (False, True):
        with pytest.raises(NamespaceError, match="may not contain"):
            FrontierKeys(bad, cluster=cluster)


#: a crawl name with one of these would have keys another crawl's patterns match
REFUSED = [":", "*", "?", "[", "]", "\\", "{", "}", " ", "\t", "\n", "\x00", "\x7f", '"', "'"]


@pytest.mark.parametrize("char", REFUSED)
def test_names_that_would_reach_another_crawls_keys_are_refused_naming_their_source(char):
    name = f"si{char}te"
    with pytest.raises(NamespaceError, match=re.escape(repr(char))) as refused:
        FrontierKeys(name)
    assert "invalid crawl name" in str(refused.value)
    with pytest.raises(NamespaceError, match="invalid DISTCRAWL_NAMESPACE"):
        FrontierKeys.of_crawl("site", name)
    with pytest.raises(NamespaceError, match=r"invalid spider name .*; set DISTCRAWL_NAMESPACE"):
        FrontierKeys.of_crawl(name)
    with pytest.raises(ConfigError, match="invalid DISTCRAWL_NAMESPACE"):
        DistcrawlConfig.from_settings(Settings({"DISTCRAWL_NAMESPACE": name}))
    # the spider's own name is fine with a namespace that is
    assert FrontierKeys.of_crawl(name, "site").queue == "site:queue"


def test_names_extending_another_crawls_without_a_separator_are_kept():
    for name in ("site2", "site-eu", "site_eu", "site.eu", "site@eu", "sité"):
        assert FrontierKeys(name).queue == f"{name}:queue"


def test_the_robots_scan_pattern_is_escaped():
    """No crawl name holds a glob character now; the pattern is escaped all the same, since
    it is the one SCAN built from a name."""
    assert glob_escape("a*b?c[d]e\\f") == "a\\*b\\?c\\[d\\]e\\\\f"
    keys = FrontierKeys("site")
    object.__setattr__(keys, "namespace", "s?te")  # as if a name had slipped through
    assert keys.robots_txt_pattern == "s\\?te:robotstxt:*"


def test_every_cluster_key_is_in_the_slot_of_start_urls(redis_cluster):
    """CLUSTER KEYSLOT, asked of a real cluster node, of every key a crawl may use."""
    k = FrontierKeys("site", cluster=True)
    names = [
        *k.all(),
        k.bloom_part(0, 0),
        k.bloom_part(12, 7),
        k.robots_txt("a.test:8080"),
        k.robots_lock("b.test"),
    ]
    node = redis_cluster.node(redis_cluster.ports[0])
    try:
        slots = {name: int(node.execute_command("CLUSTER", "KEYSLOT", name)) for name in names}
    finally:
        node.close()
    assert set(slots.values()) == {slots[k.start_urls]}, slots


def test_same_key_in_another_naming_keeps_the_suffix():
    """distcrawl migrate names each key on the target from its name on the source."""
    plain, tagged = FrontierKeys("site"), FrontierKeys("site", cluster=True)
    for name in (*plain.all(), plain.claims("0a0b0c0d"), plain.bloom_part(1, 2)):
        moved = plain.same_key_in(name, tagged)
        assert moved == tagged.start_urls or moved.startswith("{site:start_urls}:"), moved
        assert tagged.same_key_in(moved, plain) == name
    assert plain.same_key_in(plain.queue, tagged) == tagged.queue
    assert plain.same_key_in(plain.start_urls, tagged) == "site:start_urls"
    assert plain.same_key_in(plain.robots_txt("a.test:80"), tagged) == tagged.robots_txt(
        "a.test:80"
    )
    with pytest.raises(ValueError, match="'other:queue' is not a key of the crawl 'site'"):
        plain.same_key_in("other:queue", tagged)
