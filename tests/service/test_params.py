"""Fail closed on the API, through the official `openai` client: every parameter kvguard does not
implement is refused with a 400 that names it (`param`), and each refusal has an accepted twin
(the same parameter at the value that changes nothing, or the request without it)."""

import httpx
import openai
import pytest

from conftest import MODEL, TENANTS

CHAT = [{"role": "user", "content": "Hi"}]

# (endpoint, refused kwargs, param, accepted twin kwargs)
REFUSED = [
    ("completions", {"best_of": 3}, "best_of", {"best_of": 1}),
    ("completions", {"frequency_penalty": 0.5}, "frequency_penalty", {"frequency_penalty": 0}),
    ("completions", {"logit_bias": {"65": 10}}, "logit_bias", {"logit_bias": {}}),
    ("completions", {"suffix": "the end"}, "suffix", {"suffix": ""}),
    ("completions", {"extra_body": {"top_k": 5}}, "top_k", {}),
    ("chat", {"presence_penalty": 1}, "presence_penalty", {"presence_penalty": 0}),
    ("chat", {"response_format": {"type": "json_object"}}, "response_format",
     {"response_format": {"type": "text"}}),
    ("chat", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
     "tools", {}),
    ("chat", {"tool_choice": "required"}, "tool_choice", {"tool_choice": "none"}),
    ("chat", {"store": True}, "store", {"store": False}),
    ("chat", {"extra_body": {"reasoning_effort": "high"}}, "reasoning_effort", {}),
    ("chat", {"service_tier": "flex"}, "service_tier", {"service_tier": "auto"}),
    ("chat", {"stream": True, "stream_options": {"include_obfuscation": True}},
     "stream_options.include_obfuscation",
     {"stream": True, "stream_options": {"include_obfuscation": False}}),
]


def call(client, endpoint, **kw):
    if endpoint == "chat":
        r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, **kw)
    else:
        r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, **kw)
    return list(r) if kw.get("stream") else r


@pytest.mark.parametrize("endpoint,refused,param,twin", REFUSED, ids=[c[2] for c in REFUSED])
def test_unimplemented_parameter_is_refused(server, endpoint, refused, param, twin):
    c = server.client("acme")
    with pytest.raises(openai.BadRequestError) as e:
        call(c, endpoint, **refused)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param
    assert e.value.body["code"] in ("unsupported_parameter", "unsupported_value")
    assert param in e.value.body["message"]
    # The twin: at the value that changes nothing (or without it), the request is served.
    r = call(c, endpoint, **twin)
    assert r


def test_message_name_is_refused(server):
    c = server.client("gamma")
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, max_tokens=2,
                                  messages=[{"role": "user", "content": "Hi", "name": "bob"}])
    assert e.value.body["param"] == "messages[0].name"
    r = c.chat.completions.create(model=MODEL, max_tokens=2,
                                  messages=[{"role": "user", "content": "Hi"}])
    assert r.usage.completion_tokens == 2


def test_refusals_are_counted_and_the_server_goes_on(server):
    r = httpx.post(server.base + "/v1/completions", timeout=30,
                   headers={"Authorization": f"Bearer {TENANTS['delta']['key']}"},
                   json={"model": MODEL, "prompt": "x", "max_tokens": 2, "tenant": "beta"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "tenant"
    m = server.metrics()
    assert m['kvguard_requests_total{tenant="delta",route="/v1/completions",code="400"}'] >= 1
    r = httpx.post(server.base + "/v1/completions", timeout=30,
                   headers={"Authorization": f"Bearer {TENANTS['delta']['key']}"},
                   json={"model": MODEL, "prompt": "x", "max_tokens": 2})
    assert r.status_code == 200
    server.wait_idle()
