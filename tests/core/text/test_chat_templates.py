"""tests/core/text/test_chat_templates.py: kvguard's chat-template renderer against jinja2.

For every real template in llama.cpp's models/templates/ (Llama 3.x, Qwen 2.5/3, DeepSeek R1,
Mistral, Gemma 2, Phi-3.5, Kimi K2, gpt-oss, ...) and every message list of CASES, the prompt
`kvguard model render-chat` prints must be byte-equal to what jinja2 renders the way
HuggingFace's apply_chat_template does; where jinja2 refuses (raise_exception, an undefined
attribute), kvguard must refuse too, with a message and exit status 1.

The templates are not in this repository: KVGUARD_LLAMA_CPP_MODELS names llama.cpp's
vendor/llama.cpp/models folder (the llama-cpp-python sdist's copy); without it these tests are
skipped with that reason. The GGUF and limit tests below need no templates."""
import json
import os
import subprocess
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

KVGUARD = os.environ.get("KVGUARD_BIN", "build/default/tools/kvguard")
MODELS = os.environ.get("KVGUARD_LLAMA_CPP_MODELS", "")
TEMPLATE_DIR = Path(MODELS) / "templates" if MODELS else None
TEMPLATES = sorted(TEMPLATE_DIR.glob("*.jinja")) if TEMPLATE_DIR and TEMPLATE_DIR.is_dir() else []
BOS, EOS = "<s>", "</s>"


# ---- the reference: jinja2 as HuggingFace's apply_chat_template sets it up ----

def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def reference(source, messages, tools=None, add_generation_prompt=True, bos=BOS, eos=EOS,
              extra=None):
    """The text jinja2 renders, or None when it refuses."""
    context = dict(messages=messages, add_generation_prompt=add_generation_prompt,
                   bos_token=bos, eos_token=eos)
    if tools is not None:
        context["tools"] = tools
    context.update(extra or {})
    try:
        return _environment().from_string(source).render(**context)
    except Exception:  # noqa: BLE001 - any refusal of jinja2's is a refusal
        return None


def kvguard(args, tmp_path, messages, tools=None, add_generation_prompt=True, extra=None):
    (tmp_path / "messages.json").write_text(json.dumps(messages, ensure_ascii=False),
                                            encoding="utf-8")
    cmd = [KVGUARD, "model", "render-chat", *args, "--messages", str(tmp_path / "messages.json")]
    if tools is not None:
        (tmp_path / "tools.json").write_text(json.dumps(tools), encoding="utf-8")
        cmd += ["--tools", str(tmp_path / "tools.json")]
    if not add_generation_prompt:
        cmd.append("--no-generation-prompt")
    for name, value in (extra or {}).items():
        cmd += ["--var", f"{name}={json.dumps(value)}"]
    return subprocess.run(cmd, capture_output=True, timeout=60)


# ---- the table of message lists ----

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

TOOL_CALL = {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}

CASES = {
    "system_multi_turn": dict(messages=[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "What is 2+2?"},
    ]),
    "single_user": dict(messages=[{"role": "user", "content": "Hello"}]),
    "no_system_multi_turn": dict(messages=[
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "First answer"},
        {"role": "user", "content": "Second question"},
    ]),
    "empty_content": dict(messages=[
        {"role": "system", "content": ""},
        {"role": "user", "content": ""},
    ]),
    "unicode": dict(messages=[
        {"role": "system", "content": "Réponds en français. 日本語も OK. \u00a0"},
        {"role": "user", "content": "\u3000 Ünïcödé: 你好, мир, مرحبا, 🦙🚀 \"quotes\" 'single' \\back\n\tTab"},
        {"role": "assistant", "content": "D'accord — ça marche ✓"},
        {"role": "user", "content": "Encore?\r\nOui."},
    ]),
    # OpenAI's content parts: templates that expect a string print Python's repr of them, or
    # iterate them, or refuse.
    "content_parts": dict(messages=[
        {"role": "user", "content": [{"type": "text", "text": "Describe 'this'"},
                                     {"type": "text", "text": "and \"that\" \u00e9"}]},
    ]),
    "whitespace_content": dict(messages=[
        {"role": "user", "content": "  padded question  \n\n"},
    ]),
    "no_generation_prompt": dict(messages=[
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ], add_generation_prompt=False),
    "reasoning": dict(messages=[
        {"role": "user", "content": "Think first"},
        {"role": "assistant", "content": "<think>\nsome reasoning\n</think>\n\nThe answer"},
        {"role": "user", "content": "And now?"},
    ]),
    "thinking_off": dict(messages=[{"role": "user", "content": "Quick"}],
                         extra={"enable_thinking": False}),
    # Firefunction v2 takes its tools as a `functions` string and the date as `datetime`.
    "functions_and_datetime": dict(messages=[
        {"role": "system", "content": "Be exact."},
        {"role": "user", "content": "Weather in Paris?"},
    ], extra={"functions": json.dumps([WEATHER_TOOL["function"]], indent=2),
              "datetime": "2024-07-26 10:00"}),
    "tools_offered": dict(messages=[
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Paris?"},
    ], tools=[WEATHER_TOOL]),
    "tool_round_trip": dict(messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
         "content": "{\"temperature\": 21, \"unit\": \"celsius\"}"},
    ], tools=[WEATHER_TOOL]),
    "tool_call_string_arguments": dict(messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_2", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "cold"},
        {"role": "assistant", "content": "It is cold in Oslo."},
        {"role": "user", "content": "Thanks"},
    ], tools=[WEATHER_TOOL]),
}

needs_templates = pytest.mark.skipif(
    not TEMPLATES,
    reason="KVGUARD_LLAMA_CPP_MODELS does not name llama.cpp's models/ folder (with templates/"
           "*.jinja): the real templates are not available")


@needs_templates
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: getattr(p, "stem", str(p)))
def test_template_matches_jinja2(template, case, tmp_path):
    spec = CASES[case]
    source = template.read_text(encoding="utf-8")
    want = reference(source, spec["messages"], spec.get("tools"),
                     spec.get("add_generation_prompt", True), extra=spec.get("extra"))
    got = kvguard(["--chat-template", str(template), "--bos-token", BOS, "--eos-token", EOS],
                  tmp_path, spec["messages"], spec.get("tools"),
                  spec.get("add_generation_prompt", True), spec.get("extra"))
    if want is None:
        assert got.returncode == 1, f"jinja2 refuses but kvguard printed {got.stdout[:200]!r}"
        assert b"chat template" in got.stderr and got.stdout == b""
    else:
        assert got.returncode == 0, got.stderr.decode()
        assert got.stdout.decode("utf-8") == want


@needs_templates
def test_every_template_renders_the_basic_case(tmp_path):
    # A refusal is matched above; this twin makes sure the table does not pass by refusing:
    # every template must render a plain multi-turn chat (Gemma's only without a system turn).
    for template in TEMPLATES:
        got = kvguard(["--chat-template", str(template)], tmp_path,
                      CASES["no_system_multi_turn"]["messages"])
        if got.returncode != 0 and "functions" in got.stderr.decode():
            continue  # firefunction-v2 needs its `functions` variable (jinja2 refuses too)
        assert got.returncode == 0, f"{template.stem}: {got.stderr.decode()}"
        assert b"Second question" in got.stdout


# ---- without the templates: our own templates, GGUF input, plain rendering, refusals ----

# The chat_template fuzz target's seeds: templates written for kvguard that exercise the whole
# subset (each file is the template, then the 9 bytes the fuzzer reads its limits from). Two
# are left out here: big_loop passes the loop limit on purpose (test_runaway_template_is_refused
# covers it) and generation uses HuggingFace's {% generation %} tag, which plain jinja2 lacks.
SEEDS = Path(__file__).resolve().parents[3] / "fuzz" / "corpus" / "chat_template"
FUZZ_MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi \u00e9\u6f22 \U0001f999"},
    {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello", "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "f", "arguments": {"x": 1, "y": [True, None, 2.5]}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"ok\": 1}"},
    {"role": "user", "content": ""},
]


@pytest.mark.parametrize("seed", sorted(p.name for p in SEEDS.iterdir()
                                        if p.name not in ("big_loop", "generation")))
def test_own_templates_match_jinja2(seed, tmp_path):
    source = (SEEDS / seed).read_bytes()[:-9].decode("utf-8")
    (tmp_path / "t.jinja").write_text(source, encoding="utf-8")
    want = reference(source, FUZZ_MESSAGES)
    got = kvguard(["--chat-template", str(tmp_path / "t.jinja"), "--bos-token", BOS,
                   "--eos-token", EOS], tmp_path, FUZZ_MESSAGES)
    assert want is not None, "the seeds are meant to render"
    assert got.returncode == 0, got.stderr.decode()
    assert got.stdout.decode("utf-8") == want


SIMPLE = ("{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}{{ eos_token }}"
          "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def write_gguf(path, template=None):
    import gguf  # noqa: PLC0415 - only these tests need it
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(["<unk>", "<bos>", "</eos>", "a", "b"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if template is not None:
        writer.add_chat_template(template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


MESSAGES = CASES["system_multi_turn"]["messages"]


def test_gguf_template_and_tokens(tmp_path):
    write_gguf(tmp_path / "m.gguf", SIMPLE)
    got = kvguard([str(tmp_path / "m.gguf")], tmp_path, MESSAGES)
    assert got.returncode == 0, got.stderr.decode()
    assert got.stdout.decode() == reference(SIMPLE, MESSAGES, bos="<bos>", eos="</eos>")
    assert got.stdout.startswith(b"<bos><|system|>")


def test_chat_template_file_overrides_gguf(tmp_path):
    write_gguf(tmp_path / "m.gguf", SIMPLE)
    (tmp_path / "t.jinja").write_text("{% for m in messages %}[{{ m.role }}]{% endfor %}")
    got = kvguard([str(tmp_path / "m.gguf"), "--chat-template", str(tmp_path / "t.jinja")],
                  tmp_path, MESSAGES)
    assert got.returncode == 0, got.stderr.decode()
    assert got.stdout == b"[system][user][assistant][user]"


def test_gguf_without_template_gets_plain_rendering(tmp_path):
    write_gguf(tmp_path / "m.gguf")
    got = kvguard([str(tmp_path / "m.gguf")], tmp_path, MESSAGES[:2])
    assert got.returncode == 0, got.stderr.decode()
    assert got.stdout == b"system: You are a helpful assistant.\nuser: Hi there\nassistant: "


def test_bad_template_is_refused_with_its_line(tmp_path):
    (tmp_path / "bad.jinja").write_text("line one\n{% for m in messages %}{{ m.role }\n")
    got = kvguard(["--chat-template", str(tmp_path / "bad.jinja")], tmp_path, MESSAGES)
    assert got.returncode == 1 and got.stdout == b""
    assert b"chat template: line 2" in got.stderr
    # The twin: the same template, closed properly, renders.
    (tmp_path / "good.jinja").write_text("line one\n{% for m in messages %}{{ m.role }}{% endfor %}")
    got = kvguard(["--chat-template", str(tmp_path / "good.jinja")], tmp_path, MESSAGES)
    assert got.returncode == 0 and got.stdout == b"line one\nsystemuserassistantuser"


def test_runaway_template_is_refused(tmp_path):
    (tmp_path / "loop.jinja").write_text(
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}")
    got = kvguard(["--chat-template", str(tmp_path / "loop.jinja")], tmp_path, MESSAGES)
    assert got.returncode == 1 and got.stdout == b""
    assert b"limit" in got.stderr
    (tmp_path / "small.jinja").write_text(
        "{% for i in range(100) %}{% for j in range(100) %}x{% endfor %}{% endfor %}")
    got = kvguard(["--chat-template", str(tmp_path / "small.jinja")], tmp_path, MESSAGES)
    assert got.returncode == 0 and got.stdout == b"x" * 10000


def test_messages_must_be_an_array(tmp_path):
    (tmp_path / "t.jinja").write_text(SIMPLE)
    (tmp_path / "obj.json").write_text('{"messages": []}')
    got = subprocess.run([KVGUARD, "model", "render-chat", "--chat-template",
                          str(tmp_path / "t.jinja"), "--messages", str(tmp_path / "obj.json")],
                         capture_output=True, timeout=60)
    assert got.returncode == 1 and b"must be a JSON array" in got.stderr
