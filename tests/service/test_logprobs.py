"""logprobs and echo through the official `openai` client: completions' `logprobs: N` and
`echo` (with `max_tokens: 0`, as lm-evaluation-harness scores text), chat's `logprobs` and
`top_logprobs`, streamed and not. Each refusal has an accepted twin."""

import math

import openai
import pytest

from conftest import MODEL

PROMPT = "Once upon a time"
PROMPT_TOKENS = len(PROMPT.encode()) + 1  # bytes + BOS


def test_completion_logprobs(server):
    c = server.client("acme")
    r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert len(lp.text_offset) == 6 and lp.text_offset[0] == 0
    assert lp.text_offset == sorted(lp.text_offset)
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0
        assert 1 <= len(top) <= 2  # two alternatives (one name if two ids share a text)
        # Greedy: the token is the most likely one, and its logprob is the best alternative's.
        assert math.isclose(logprob, max(top.values()), abs_tol=1e-6)
        assert top.get(token, logprob) == pytest.approx(logprob)
    # The twin without logprobs: the same text, and logprobs null.
    plain = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    assert plain.choices[0].text == r.choices[0].text
    assert plain.choices[0].logprobs is None
    # Sampling does not change them: they are of the raw logits, whatever the temperature.
    hot = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=1.5,
                               seed=3, logprobs=0, echo=True)
    cold = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0,
                                logprobs=0, echo=True)
    n = PROMPT_TOKENS
    assert hot.choices[0].logprobs.token_logprobs[:n] == cold.choices[0].logprobs.token_logprobs[:n]


def test_completion_logprobs_out_of_range(server):
    c = server.client("acme")
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, logprobs=6)
    assert e.value.body["param"] == "logprobs"
    r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, logprobs=5)
    assert all(1 <= len(top) <= 5 for top in r.choices[0].logprobs.top_logprobs)


def test_echo(server):
    c = server.client("beta")
    r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
    plain = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    assert r.choices[0].text == PROMPT + plain.choices[0].text
    assert r.choices[0].logprobs is None


def test_echo_logprobs_score_the_prompt(server):
    """lm-evaluation-harness's loglikelihood request: echo, logprobs 1, max_tokens 0."""
    c = server.client("gamma")
    score = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True,
                                 logprobs=1, temperature=0)
    ch = score.choices[0]
    assert ch.text == PROMPT
    assert ch.finish_reason == "length"
    assert score.usage.completion_tokens == 0
    assert score.usage.prompt_tokens == PROMPT_TOKENS
    lp = ch.logprobs
    assert len(lp.tokens) == PROMPT_TOKENS
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts BOS
    assert all(x <= 0 for x in lp.token_logprobs[1:])
    assert all(len(top) == 1 for top in lp.top_logprobs[1:])
    # Token texts (BOS is "") line up with the text: text_offset indexes it.
    assert lp.tokens[0] == "" and "".join(lp.tokens) == PROMPT
    assert [PROMPT[o:o + len(t)] for o, t in zip(lp.text_offset, lp.tokens)] == lp.tokens
    # The same prompt with generation reports the same prompt logprobs, then the new tokens'.
    more = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, echo=True,
                                logprobs=1, temperature=0).choices[0]
    assert more.logprobs.token_logprobs[:PROMPT_TOKENS] == lp.token_logprobs
    assert len(more.logprobs.tokens) == PROMPT_TOKENS + 3
    assert more.text.startswith(PROMPT)


def test_max_tokens_zero_needs_echo(server):
    c = server.client("gamma")
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, logprobs=1)
    assert e.value.body["param"] == "max_tokens"
    r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True)
    assert r.choices[0].text == PROMPT


def test_chat_logprobs(server):
    c = server.client("acme")
    messages = [{"role": "user", "content": "Hi"}]
    r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0,
                                  logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 5
    for e in content:
        assert e.logprob <= 0
        assert len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob)  # greedy
        assert [t.logprob for t in e.top_logprobs] == sorted(
            (t.logprob for t in e.top_logprobs), reverse=True)
        assert isinstance(e.bytes, list) and all(0 <= b < 256 for b in e.bytes)
    # The content is the tokens' bytes, decoded.
    text = bytes(b for e in content for b in e.bytes).decode("utf-8", errors="replace")
    assert text == r.choices[0].message.content
    # logprobs alone: no alternatives. Without: null.
    r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, logprobs=True)
    assert all(e.top_logprobs == [] for e in r.choices[0].logprobs.content)
    r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert r.choices[0].logprobs is None


@pytest.mark.parametrize("kw", [{"top_logprobs": 2}, {"logprobs": True, "top_logprobs": 21},
                                {"logprobs": 2}])
def test_chat_logprobs_refused(server, kw):
    c = server.client("acme")
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, **kw)
    assert e.value.body["param"] in kw
    r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, logprobs=True,
                                  top_logprobs=20)
    assert len(r.choices[0].logprobs.content[0].top_logprobs) == 20


def test_completion_stream_logprobs(server):
    c = server.client("delta")
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2)
    whole = c.completions.create(**kw).choices[0]
    chunks = list(c.completions.create(stream=True, **kw))
    assert "".join(ch.choices[0].text for ch in chunks) == whole.text
    tokens, logprobs, offsets = [], [], []
    for ch in chunks:
        if ch.choices[0].logprobs is not None:
            tokens += ch.choices[0].logprobs.tokens
            logprobs += ch.choices[0].logprobs.token_logprobs
            offsets += ch.choices[0].logprobs.text_offset
    assert tokens == whole.logprobs.tokens
    assert logprobs == whole.logprobs.token_logprobs
    assert offsets == whole.logprobs.text_offset


def test_completion_stream_echo(server):
    c = server.client("delta")
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=1)
    whole = c.completions.create(**kw).choices[0]
    chunks = list(c.completions.create(stream=True, **kw))
    assert chunks[0].choices[0].text.startswith(PROMPT)
    assert "".join(ch.choices[0].text for ch in chunks) == whole.text
    streamed = [x for ch in chunks if ch.choices[0].logprobs
                for x in ch.choices[0].logprobs.token_logprobs]
    assert streamed == whole.logprobs.token_logprobs
    # max_tokens 0: the prompt alone.
    chunks = list(c.completions.create(stream=True, **{**kw, "max_tokens": 0}))
    assert "".join(ch.choices[0].text for ch in chunks) == PROMPT
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_stream_logprobs(server):
    c = server.client("beta")
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
              temperature=0, logprobs=True, top_logprobs=2)
    whole = c.chat.completions.create(**kw).choices[0]
    chunks = list(c.chat.completions.create(stream=True, **kw))
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs
                for e in ch.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in whole.logprobs.content]
    assert [e.logprob for e in streamed] == [e.logprob for e in whole.logprobs.content]
    server.wait_idle()


def test_token_id_prompt_scores_like_text(server):
    """lm-evaluation-harness sends its requests tokenized: [[ids]] (here BOS and the bytes)."""
    c = server.client("acme")
    ids = [256] + list(PROMPT.encode())
    text = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    for prompt in (ids, [ids]):
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=1)
        assert r.choices[0].text == PROMPT
        assert r.usage.prompt_tokens == len(ids)
        assert r.choices[0].logprobs.token_logprobs == text.choices[0].logprobs.token_logprobs
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt=[1, 10**6], max_tokens=1)
    assert e.value.body["param"] == "prompt"
