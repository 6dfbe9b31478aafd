"""Per-tenant limits: concurrent requests (429 beyond), tokens per request (400 beyond), and the
KV page quota (a request reserves ceil((prompt + max_tokens) / page size) pages while in
flight: 429 when the tenant's other requests hold the rest, 400 when it alone is over)."""

import threading

import openai
import pytest

from conftest import MODEL, Server


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    # Page size 16: "x" + BOS = 2 prompt tokens; max_tokens 46 -> 3 pages; 62 -> 4 pages.
    s = Server(tmp_path_factory.mktemp("limits"), model="small",
               limits={"concurrent_requests": 2, "tokens_per_request": 100, "kv_page_quota": 6})
    yield s
    assert s.stop() == 0


def hold(server, tenant, max_tokens, started, done):
    """A streaming request that stays in flight until its generation ends."""
    try:
        for _ in server.client(tenant).completions.create(
                model="small", prompt="x", max_tokens=max_tokens, stream=True,
                extra_body={"ignore_eos": True}):
            started.set()
    finally:
        started.set()
        done.set()


def test_kv_page_quota(limited):
    c = limited.client("acme")
    with pytest.raises(openai.BadRequestError) as e:  # 7 pages > quota 6, whatever else runs
        c.completions.create(model="small", prompt="x", max_tokens=100)
    assert e.value.body["code"] == "kv_page_quota_exceeded"
    started, done = threading.Event(), threading.Event()
    t = threading.Thread(target=hold, args=(limited, "acme", 62, started, done))  # 4 pages
    t.start()
    assert started.wait(60)
    with pytest.raises(openai.RateLimitError) as e:  # 4 held + 3 > 6
        c.completions.create(model="small", prompt="x", max_tokens=46)
    assert e.value.body["code"] == "kv_page_quota_exceeded"
    # Another tenant's quota is its own.
    assert limited.client("beta").completions.create(model="small", prompt="x", max_tokens=46)
    t.join(60)
    # Released: the same request now fits (its positive twin).
    assert c.completions.create(model="small", prompt="x", max_tokens=46).usage
    limited.wait_idle()


def test_concurrent_requests(limited):
    events = [(threading.Event(), threading.Event()) for _ in range(2)]
    threads = [threading.Thread(target=hold, args=(limited, "gamma", 40, s, d))
               for s, d in events]
    for t in threads:
        t.start()
    for s, _ in events:
        assert s.wait(60)
    with pytest.raises(openai.RateLimitError) as e:
        limited.client("gamma").completions.create(model="small", prompt="x", max_tokens=2)
    assert e.value.body["code"] == "concurrency_limit_exceeded"
    assert limited.client("delta").completions.create(model="small", prompt="x", max_tokens=2)
    for t in threads:
        t.join(60)
    assert limited.client("gamma").completions.create(model="small", prompt="x", max_tokens=2)
