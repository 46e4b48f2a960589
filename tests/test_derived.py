"""DerivedCache: computed once per source and key, shared across threads, freed with the source."""

import gc
import threading
import time

from tractlens.app.derived import DerivedCache


class Source:
    pass


def test_computes_once_per_source_kind_and_key():
    cache, calls = DerivedCache(), []
    a, b = Source(), Source()

    def compute(tag):
        calls.append(tag)
        return tag

    assert cache.get(a, "metric", 1, lambda: compute("a1")) == "a1"
    assert cache.get(a, "metric", 1, lambda: compute("again")) == "a1"
    assert cache.get(a, "metric", 2, lambda: compute("a2")) == "a2"
    assert cache.get(b, "metric", 1, lambda: compute("b1")) == "b1"
    assert cache.get(a, "index", 1, lambda: compute("ai")) == "ai"
    assert calls == ["a1", "a2", "b1", "ai"]
    cache.discard(a, "metric")
    assert cache.peek(a, "metric", 1) is None and cache.peek(a, "index", 1) == "ai"


def test_entries_go_with_their_source_and_beyond_the_limit():
    cache = DerivedCache(max_entries=2)
    a = Source()
    cache.get(a, "k", 0, lambda: 0)
    assert len(cache) == 1
    del a
    gc.collect()
    assert len(cache) == 0
    keep = Source()
    for key in range(3):
        cache.get(keep, "k", key, lambda key=key: key)
    assert len(cache) == 2 and cache.peek(keep, "k", 0) is None


def test_concurrent_requests_compute_once():
    cache, calls = DerivedCache(), []
    source = Source()

    def slow():
        calls.append(1)
        time.sleep(0.05)
        return 42

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get(source, "k", 0, slow))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [42] * 4 and calls == [1]
