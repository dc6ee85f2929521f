import pytest

from distcrawl.keys import FrontierKeys


def test_key_names_are_pinned():
    k = FrontierKeys("site")
    assert k.start_urls == "site:start_urls"
    assert k.queue == "site:queue"
    assert k.requests == "site:requests"
    assert k.leases == "site:leases"
    assert k.seen == "site:seen"
    assert k.seq == "site:seq"
    assert k.dead == "site:dead"
    assert k.delayed == "site:delayed"
    assert k.workers == "site:workers"
    assert k.stats == "site:stats"
    assert k.domains == "site:domains"
    assert k.paused == "site:paused"
    assert k.ready == "site:ready"
    assert k.slots == "site:slots"
    assert k.inflight == "site:inflight"
    assert k.throttle == "site:throttle"
    assert k.limits == "site:limits"
    assert k.robots == "site:robots"
    assert k.robotstxt == "site:robotstxt"
    assert k.settings == "site:settings"
    assert k.robots_lock("a.test:8080") == "site:robotstxt:lock:a.test:8080"
    assert set(k.all()) == {
        "site:start_urls",
        "site:queue",
        "site:requests",
        "site:leases",
        "site:delayed",
        "site:seen",
        "site:seq",
        "site:dead",
        "site:workers",
        "site:stats",
        "site:domains",
        "site:paused",
        "site:ready",
        "site:slots",
        "site:inflight",
        "site:throttle",
        "site:limits",
        "site:robots",
        "site:robotstxt",
        "site:settings",
    }


def test_every_key_is_in_its_namespace():
    for name in FrontierKeys("shop").all():
        assert name.startswith("shop:")


@pytest.mark.parametrize("bad", ["", "a b", "tab\there"])
def test_invalid_namespace_is_refused(bad):
    with pytest.raises(ValueError):
        FrontierKeys(bad)
