"""The OpenAI-compatible API through the official `openai` client: completions, streaming,
chat, models, sampling parameters, usage, and two tenants at once."""

import concurrent.futures

import httpx
import openai
import pytest

from conftest import MODEL, TENANTS


def test_models(server):
    models = server.client("acme").models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_completion(server):
    r = server.client("acme").completions.create(model=MODEL, prompt="Once upon a time",
                                                 max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 8
    assert r.usage.prompt_tokens == len("Once upon a time".encode()) + 1  # bytes + BOS
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8
    assert isinstance(r.choices[0].text, str)


def test_stream_matches_non_stream(server):
    c = server.client("acme")
    whole = c.completions.create(model=MODEL, prompt="The KV cache", max_tokens=12, temperature=0)
    chunks = list(c.completions.create(model=MODEL, prompt="The KV cache", max_tokens=12,
                                       temperature=0, stream=True))
    assert len(chunks) >= 2
    assert "".join(ch.choices[0].text for ch in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(ch.choices[0].finish_reason is None for ch in chunks[:-1])


def test_stream_usage(server):
    chunks = list(server.client("acme").completions.create(
        model=MODEL, prompt="abc", max_tokens=5, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == 5
    assert chunks[-1].usage.prompt_tokens == 4


def test_chat_and_chat_stream(server):
    c = server.client("beta")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == 6
    chunks = list(c.chat.completions.create(model=MODEL, messages=messages, max_tokens=6,
                                            temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert text == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_seed_makes_sampling_reproducible(server):
    c = server.client("gamma")
    kw = dict(model=MODEL, prompt="Seeds", max_tokens=16, temperature=1.0, top_p=0.95)
    a = c.completions.create(seed=11, **kw).choices[0].text
    b = c.completions.create(seed=11, **kw).choices[0].text
    other = c.completions.create(seed=12, **kw).choices[0].text
    assert a == b
    assert a != other


def test_stop_sequence_ends_the_text(server):
    c = server.client("acme")
    full = c.completions.create(model=MODEL, prompt="Stop here", max_tokens=24,
                                temperature=0).choices[0].text
    # A stop sequence taken from the greedy output itself: the same run must stop there.
    cut = next((i for i in range(4, len(full)) if full[i].isprintable()), None)
    if cut is None:
        pytest.skip("the greedy output has no printable character to stop at")
    stop = full[cut]
    r = c.completions.create(model=MODEL, prompt="Stop here", max_tokens=24, temperature=0,
                             stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[:full.index(stop)]


def test_two_tenants_at_once(server):
    """Requests of two tenants interleave; each gets its own complete answer, and the server's
    log attributes each response id to the tenant whose key sent it."""

    def one(i):
        tenant = "acme" if i % 2 else "beta"
        r = server.client(tenant).completions.create(model=MODEL, prompt=f"request {i}",
                                                     max_tokens=10, temperature=0)
        return tenant, r

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(16)))
    for tenant, r in results:
        assert r.usage.completion_tokens == 10
    log = server.request_tenants()
    for tenant, r in results:
        assert log[int(r.id.split("-")[1])] == tenant
    server.wait_idle()


def test_key_decides_the_tenant_not_the_body(server):
    """A body naming another tenant changes nothing: 'user' is accepted and unused, 'tenant' (no
    OpenAI field) is refused like every field the server does not implement."""
    def post(**extra):
        return httpx.post(server.base + "/v1/completions", timeout=30,
                          headers={"Authorization": f"Bearer {TENANTS['acme']['key']}"},
                          json={"model": MODEL, "prompt": "x", "max_tokens": 2, **extra})
    r = post(user="beta")
    assert r.status_code == 200
    assert server.request_tenants()[int(r.json()["id"].split("-")[1])] == "acme"
    r = post(user="beta", tenant="beta")
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "tenant"


def test_wrong_and_missing_key(server):
    bad = openai.OpenAI(base_url=server.base + "/v1", api_key="not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert e.value.body["code"] == "invalid_api_key"
    r = httpx.post(server.base + "/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    # A tenant key is not an admin key.
    r = httpx.get(server.admin + "/admin/tenants",
                  headers={"Authorization": f"Bearer {TENANTS['acme']['key']}"})
    assert r.status_code == 401


def test_health_and_metrics(server):
    assert httpx.get(server.base + "/healthz").status_code == 200
    assert httpx.get(server.base + "/readyz").json()["ready"] is True
    text = httpx.get(server.admin + "/metrics").text
    for family in ["kvguard_requests_total", "kvguard_output_tokens_total",
                   "kvguard_output_tokens_per_second", "kvguard_requests_running",
                   "kvguard_requests_queued", "kvguard_kv_pages", "kvguard_kv_capacity_tokens",
                   "kvguard_verify_seconds_per_step", "kvguard_violations_total",
                   "kvguard_audit_log_healthy"]:
        assert f"# TYPE {family} " in text, family
    m = server.metrics()
    assert m['kvguard_kv_capacity_tokens{dtype="fp8_e4m3"}'] > 0
    assert m["kvguard_audit_log_healthy"] == 1
    assert m['kvguard_requests_total{tenant="acme",route="/v1/completions",code="200"}'] >= 1
