"""Chat templates behind /v1/chat/completions: `kvguard serve --chat-template FILE` renders each
chat with the template (here llama.cpp's copies of Qwen2.5's and Llama 3.1's, from the cache
scripts/setup fills; skipped without it) and the engine sees exactly `kvguard model render-chat`'s
prompt: usage.prompt_tokens equals its token count (the built-in model's byte tokenizer: one id
per byte, and BOS). A template the service cannot use stops the start, naming the file; a
template that raises refuses that request with a 400 carrying its message, and the next one is
served."""

import json
import os
import pathlib
import subprocess

import openai
import pytest

from conftest import KVGUARD, Server

CACHE = pathlib.Path(os.environ.get("KVGUARD_LLAMA_CPP_MODELS")
                     or pathlib.Path.home() / ".cache/kvguard/llama-vocabs") / "templates"
TEMPLATES = ["Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja"]
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi <|im_end|><|eot_id|> there"}]


def render_chat(template, messages, tmp_path):
    path = tmp_path / "messages.json"
    path.write_text(json.dumps(messages))
    return subprocess.run([KVGUARD, "model", "render-chat", "--chat-template", str(template),
                           "--messages", str(path)], check=True, capture_output=True).stdout


@pytest.mark.parametrize("name", TEMPLATES)
def test_served_prompt_is_the_templates(name, tmp_path):
    template = CACHE / name
    if not template.exists():
        pytest.skip(f"{template} not found: run scripts/setup (it unpacks llama.cpp's templates)")
    s = Server(tmp_path, extra=["--chat-template", str(template)])
    try:
        c = s.client("acme")
        r = c.chat.completions.create(model=s.model, messages=MESSAGES, max_tokens=1)
        prompt = render_chat(template, MESSAGES, tmp_path)
        assert b"<|im_start|>" in prompt or b"<|start_header_id|>" in prompt
        assert r.usage.prompt_tokens == len(prompt) + 1  # bytes, and BOS
    finally:
        assert s.stop() == 0


def test_template_error_is_a_400_and_the_next_request_is_served(tmp_path):
    template = tmp_path / "no-system.jinja"
    template.write_text("{% for m in messages %}{% if m.role == 'system' %}"
                        "{{ raise_exception('no system turns here') }}{% endif %}"
                        "<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>")
    s = Server(tmp_path, extra=["--chat-template", str(template)])
    try:
        c = s.client("acme")
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=s.model, messages=MESSAGES, max_tokens=1)
        assert e.value.body["param"] == "messages"
        assert "no system turns here" in e.value.body["message"]
        r = c.chat.completions.create(model=s.model, messages=MESSAGES[1:], max_tokens=1)
        assert r.usage.prompt_tokens == len(f"<|user|>{MESSAGES[1]['content']}<|assistant|>") + 1
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("text,ok", [("{% for m in messages %}{{ m.content }}", False),
                                     ("{% for m in messages %}{{ m.content }}{% endfor %}", True)])
def test_start_refuses_a_template_that_does_not_parse(tmp_path, text, ok):
    template = tmp_path / "t.jinja"
    template.write_text(text)
    if ok:
        assert Server(tmp_path, extra=["--chat-template", str(template)]).stop() == 0
        return
    with pytest.raises(RuntimeError) as e:
        Server(tmp_path, extra=["--chat-template", str(template)])
    assert f"--chat-template {template}: " in str(e.value)
