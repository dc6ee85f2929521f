import pytest

from distcrawl.keys import FrontierKeys


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
    assert k.workers == "site:workers"
    assert k.alive == "site:alive"
    assert k.commits == "site:commits"
    assert k.stats == "site:stats"
    assert k.domains == "site:domains"
    assert k.paused == "site:paused"
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
        "site:seen",
        "site:bloom",
        "site:seq",
        "site:dead",
        "site:workers",
        "site:alive",
        "site:commits",
        "site:stats",
        "site:domains",
        "site:paused",
        "site:meta",
        "site:sweep",
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
    }


def test_every_key_is_in_its_namespace():
    for name in FrontierKeys("shop").all():
        assert name.startswith("shop:")


def test_bloom_parts_are_in_the_namespace_and_distinct():
    k = FrontierKeys("shop")
    parts = {k.bloom_part(i, j) for i in range(3) for j in range(3)}
    assert len(parts) == 9 and all(p.startswith("shop:bloom:") for p in parts)
    assert parts.isdisjoint(k.all())
    with pytest.raises(ValueError):
        k.bloom_part(-1, 0)


def test_claim_lists_are_per_worker_in_the_namespace():
    k = FrontierKeys("shop")
    assert k.claims("0a0b0c0d") != k.claims("01020304")
    assert k.claims("0a0b0c0d").startswith("shop:") and k.claims("0a0b0c0d") not in k.all()
    for bad in ("", "a b"):
        with pytest.raises(ValueError):
            k.claims(bad)


@pytest.mark.parametrize("bad", ["", "a b", "tab\there"])
def test_invalid_namespace_is_refused(bad):
    with pytest.raises(ValueError):
        FrontierKeys(bad)
