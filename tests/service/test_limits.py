"""Per-tenant limits: concurrent requests (429 beyond), tokens per request (400 beyond), and the
KV page quota (a request reserves ceil((prompt + max_tokens) / page size) pages while in
flight: 429 when the tenant's other requests hold the rest, 400 when it alone is over)."""

import threading

import openai
import pytest

from conftest import MODEL, TESTSERVER, Server


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    # Page size 16: "x" + BOS = 2 prompt tokens; max_tokens 46 -> 3 pages; 62 -> 4 pages. The
    # test server paces decoding, so requests stay in flight exactly as long as a test needs.
    s = Server(tmp_path_factory.mktemp("limits"), binary=TESTSERVER,
               limits={"concurrent_requests": 2, "tokens_per_request": 100, "kv_page_quota": 6})
    yield s
    assert s.stop() == 0


def complete(server, tenant, max_tokens, results):
    """A completion, run in a thread; its usage (or the error) lands in results."""
    try:
        results.append(server.client(tenant).completions.create(
            model=MODEL, prompt="x", max_tokens=max_tokens, extra_body={"ignore_eos": True}).usage)
    except openai.APIError as e:
        results.append(e)


@pytest.fixture(autouse=True)
def unpaced(limited):
    """Every test leaves the shared server's engine unpaced, even when it fails midway."""
    yield
    limited.pace(prefill=None, decode=None)


def held(server, requests):
    """Starts (tenant, max_tokens) requests with decoding paused and waits until all of them
    are in the decode batch: in flight, holding their pages, until the test resumes decoding."""
    results = []
    server.pace(decode=0)
    threads = [threading.Thread(target=complete, args=(server, t, n, results)) for t, n in requests]
    for t in threads:
        t.start()
    server.wait_running(len(requests))
    return threads, results


def let_go(server, threads, results, n):
    server.pace(decode=None)
    for t in threads:
        t.join(60)
    assert len(results) == n and all(not isinstance(r, Exception) for r in results), results


def test_kv_page_quota(limited):
    c = limited.client("acme")
    with pytest.raises(openai.BadRequestError) as e:  # 7 pages > quota 6, whatever else runs
        c.completions.create(model=MODEL, prompt="x", max_tokens=100)
    assert e.value.body["code"] == "kv_page_quota_exceeded"
    threads, results = held(limited, [("acme", 62)])  # 4 pages
    with pytest.raises(openai.RateLimitError) as e:  # 4 held + 3 > 6
        c.completions.create(model=MODEL, prompt="x", max_tokens=46)
    assert e.value.body["code"] == "kv_page_quota_exceeded"
    # Another tenant's quota is its own: admitted beside acme's held request.
    threads.append(threading.Thread(target=complete, args=(limited, "beta", 46, results)))
    threads[-1].start()
    limited.wait_running(2)
    let_go(limited, threads, results, 2)
    # Released: the same request now fits (its positive twin).
    assert c.completions.create(model=MODEL, prompt="x", max_tokens=46).usage
    limited.wait_idle()


def test_concurrent_requests(limited):
    threads, results = held(limited, [("gamma", 40), ("gamma", 40)])
    with pytest.raises(openai.RateLimitError) as e:
        limited.client("gamma").completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert e.value.body["code"] == "concurrency_limit_exceeded"
    # Another tenant is served meanwhile.
    threads.append(threading.Thread(target=complete, args=(limited, "delta", 2, results)))
    threads[-1].start()
    limited.wait_running(3)
    let_go(limited, threads, results, 3)
    assert limited.client("gamma").completions.create(model=MODEL, prompt="x", max_tokens=2)
