"""/tokenize and /detokenize end to end (vLLM's shapes): per-tenant keys as on /v1, the ids a
completion of the same prompt feeds the engine, the round trip of ASCII and non-ASCII text, and a
400 naming the field for every bad request, each beside its accepted twin."""

import httpx
import pytest

from conftest import MODEL, TENANTS

AUTH = {"Authorization": f"Bearer {TENANTS['acme']['key']}"}


def post(server, route, body, headers=AUTH):
    return httpx.post(server.base + route, json=body, headers=headers, timeout=60)


def tokenize(server, prompt, **kw):
    r = post(server, "/tokenize", {"model": MODEL, "prompt": prompt, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def detokenize(server, tokens):
    r = post(server, "/detokenize", {"model": MODEL, "tokens": tokens})
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


@pytest.mark.parametrize("text", ["Hello, world", "h\u00e9llo \u4e16\u754c \U0001F600"])
def test_round_trip(server, text):
    body = tokenize(server, text)
    assert body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 512  # tiny's context
    assert body["token_strs"] is None
    assert detokenize(server, body["tokens"]) == text


@pytest.mark.parametrize("text", ["Hi", "caf\u00e9 \u4e16\u754c"])
def test_tokens_are_the_completion_prompt(server, text):
    # The same prompt through /v1/completions: its usage counts the ids /tokenize returned.
    ids = tokenize(server, text)["tokens"]
    r = server.client("acme").completions.create(model=MODEL, prompt=text, max_tokens=1)
    assert r.usage.prompt_tokens == len(ids)
    # Given as ids (used as they are), the completion sees the same prompt.
    r = server.client("acme").completions.create(model=MODEL, prompt=ids, max_tokens=1, echo=True)
    assert r.choices[0].text.startswith(text)


def test_chat_form_tokens_are_the_chat_completion_prompt(server):
    # vLLM's chat form: the messages rendered and tokenized as /v1/chat/completions does.
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "caf\u00e9?"}]
    r = post(server, "/tokenize", {"model": MODEL, "messages": messages})
    assert r.status_code == 200, r.text
    ids = r.json()["tokens"]
    c = server.client("acme").chat.completions.create(model=MODEL, messages=messages,
                                                      max_tokens=1)
    assert c.usage.prompt_tokens == len(ids)
    # Without the generation prompt the prompt is shorter by exactly that suffix.
    r = post(server, "/tokenize", {"model": MODEL, "messages": messages,
                                   "add_generation_prompt": False})
    assert r.status_code == 200, r.text
    shorter = r.json()["tokens"]
    assert len(shorter) < len(ids) and ids[:len(shorter)] == shorter


def test_add_special_tokens_false_drops_bos(server):
    with_bos = tokenize(server, "abc")["tokens"]
    without = tokenize(server, "abc", add_special_tokens=False)["tokens"]
    assert with_bos[1:] == without
    assert len(with_bos) == len(without) + 1
    # BOS contributes no text.
    assert detokenize(server, with_bos) == detokenize(server, without) == "abc"


def test_return_token_strs(server):
    body = tokenize(server, "ab\u00e9", return_token_strs=True)
    assert len(body["token_strs"]) == body["count"]
    # BOS has no text; the byte tokenizer splits é into its two bytes.
    assert body["token_strs"] == ["", "a", "b", "bytes:\\xc3", "bytes:\\xa9"]


def test_ids_that_cut_a_character_give_valid_text(server):
    ids = tokenize(server, "\u00e9", add_special_tokens=False)["tokens"]
    assert len(ids) == 2
    assert detokenize(server, ids[:1]) == "\ufffd"
    assert detokenize(server, ids) == "\u00e9"


def test_needs_a_tenant_key(server):
    for route, body in [("/tokenize", {"model": MODEL, "prompt": "x"}),
                        ("/detokenize", {"model": MODEL, "tokens": [104]})]:
        r = post(server, route, body, headers={})
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
        r = post(server, route, body, headers={"Authorization": "Bearer not-a-key"})
        assert r.status_code == 401
        # The twin: with the tenant's key.
        assert post(server, route, body).status_code == 200
    m = server.metrics()
    for route in ("/tokenize", "/detokenize"):
        assert m[f'kvguard_requests_total{{tenant="",route="{route}",code="401"}}'] >= 2
        assert m[f'kvguard_requests_total{{tenant="acme",route="{route}",code="200"}}'] >= 1


# (route, refused body, status, param, accepted twin)
OK_TOK = {"model": MODEL, "prompt": "hi"}
OK_DETOK = {"model": MODEL, "tokens": [104, 105]}
REFUSED = [
    ("/detokenize", {"model": MODEL, "tokens": [259]}, 400, "tokens",
     {"model": MODEL, "tokens": [258]}),
    ("/detokenize", {"model": MODEL, "tokens": [-1]}, 400, "tokens", {"model": MODEL, "tokens": [0]}),
    ("/detokenize", {"model": MODEL, "tokens": [1.5]}, 400, "tokens", {"model": MODEL, "tokens": [1]}),
    ("/detokenize", {"model": MODEL, "tokens": "hi"}, 400, "tokens", {"model": MODEL, "tokens": []}),
    ("/detokenize", {"model": MODEL}, 400, "tokens", OK_DETOK),
    ("/tokenize", {"model": MODEL, "prompt": [104]}, 400, "prompt", OK_TOK),
    ("/tokenize", {"model": MODEL}, 400, "prompt", OK_TOK),
    ("/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                   "add_special_tokens": True}, 400, "add_special_tokens",
     {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
    ("/tokenize", {"model": MODEL, "messages": []}, 400, "messages",
     {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
    ("/tokenize", {**OK_TOK, "add_generation_prompt": True}, 400, "add_generation_prompt", OK_TOK),
    ("/tokenize", {**OK_TOK, "add_special_tokens": "no"}, 400, "add_special_tokens",
     {**OK_TOK, "add_special_tokens": False}),
    ("/detokenize", {**OK_DETOK, "skip_special_tokens": True}, 400, "skip_special_tokens",
     OK_DETOK),
    ("/tokenize", {**OK_TOK, "model": "gpt-5"}, 404, "model", OK_TOK),
    ("/detokenize", {**OK_DETOK, "model": "gpt-5"}, 404, "model", OK_DETOK),
]


@pytest.mark.parametrize("route,refused,status,param,twin", REFUSED,
                         ids=[f"{c[0]}-{c[3]}-{i}" for i, c in enumerate(REFUSED)])
def test_bad_request_is_refused_naming_the_field(server, route, refused, status, param, twin):
    r = post(server, route, refused)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param
    assert param in r.json()["error"]["message"]
    assert post(server, route, twin).status_code == 200
    assert server.metrics()[
        f'kvguard_requests_total{{tenant="acme",route="{route}",code="{status}"}}'] >= 1


@pytest.mark.parametrize("route", ["/tokenize", "/detokenize"])
def test_body_errors_match_completions(server, route):
    # Not JSON, not an object: the same refusal as /v1/completions gives.
    for content in [b'{"model": ', b"[1, 2]", b'{"model": "\xc3\x28"}']:
        r = httpx.post(server.base + route, content=content, headers=AUTH, timeout=60)
        c = httpx.post(server.base + "/v1/completions", content=content, headers=AUTH, timeout=60)
        assert r.status_code == c.status_code == 400
        assert r.json()["error"]["message"] == c.json()["error"]["message"]
