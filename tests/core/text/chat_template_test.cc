// tests/core/text/chat_template_test.cc: the chat-template renderer's rules and bounds. The
// byte-for-byte comparison with jinja2 over real templates is test_chat_templates.py; here each
// rule has a refusal and, beside it, the nearest input that must pass.
#include "core/text/chat_template.h"

#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvguard::core {
namespace {

using json = nlohmann::ordered_json;
using ::testing::HasSubstr;

MATCHER_P(IsOkAndHolds, text, "") {
  if (!arg.ok()) {
    *result_listener << "status " << arg.status();
    return false;
  }
  *result_listener << "text \"" << *arg << "\"";
  return *arg == text;
}

MATCHER_P2(StatusIs, code, substring, "") {
  const absl::Status s = arg.status();
  *result_listener << "status " << s;
  return s.code() == code && s.message().find(substring) != absl::string_view::npos;
}

// Render parses and renders `source` over `context`.
absl::StatusOr<std::string> Render(const std::string& source, const json& context = json::object(),
                                   const ChatTemplateLimits& limits = {}) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
  if (!t.ok()) return t.status();
  return t->Render(context, limits);
}

json Messages() {
  return json::parse(R"([{"role": "system", "content": "S"},
                         {"role": "user", "content": "  hi  "},
                         {"role": "assistant", "content": "yo"}])");
}

TEST(ChatTemplateTest, TrimBlocksAndLstripBlocks) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indent before one.
  EXPECT_THAT(Render("  {% if true %}\n    x\n  {% endif %}\ny"), IsOkAndHolds("    x\ny"));
  // The twins: `{%+` keeps the indent, a `{{ }}` tag neither strips nor trims.
  EXPECT_THAT(Render("  {%+ if true %}x{% endif %}"), IsOkAndHolds("  x"));
  EXPECT_THAT(Render("  {{ 'x' }}\ny"), IsOkAndHolds("  x\ny"));
  EXPECT_THAT(Render("a  {%- if true -%}  b  {%- endif -%}  c"), IsOkAndHolds("abc"));
  // One trailing newline of the template goes (keep_trailing_newline off), and \r\n is \n.
  EXPECT_THAT(Render("a\r\nb\n"), IsOkAndHolds("a\nb"));
  EXPECT_THAT(Render("{# note #}\nx"), IsOkAndHolds("x"));
}

TEST(ChatTemplateTest, LoopsNamespacesAndScopes) {
  const json ctx = {{"messages", Messages()}};
  EXPECT_THAT(Render("{% for m in messages %}{{ loop.index }}{{ m.role[0] }}"
                     "{{ '|' if not loop.last }}{% endfor %}",
                     ctx),
              IsOkAndHolds("1s|2u|3a"));
  // A loop body's `set` stays in the body; a namespace carries values out.
  EXPECT_THAT(
      Render("{% set n = 0 %}{% for m in messages %}{% set n = n + 1 %}{% endfor %}{{ n }}", ctx),
      IsOkAndHolds("0"));
  EXPECT_THAT(Render("{% set ns = namespace(n=0) %}{% for m in messages %}"
                     "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
                     ctx),
              IsOkAndHolds("3"));
  EXPECT_THAT(
      Render("{% for m in messages if m.role != 'system' %}{{ loop.length }}{% endfor %}", ctx),
      IsOkAndHolds("22"));
  EXPECT_THAT(Render("{% for m in [] %}x{% else %}empty{% endfor %}"), IsOkAndHolds("empty"));
  EXPECT_THAT(Render("{% for m in [1] %}x{% else %}empty{% endfor %}"), IsOkAndHolds("x"));
  // jinja2 quirk: else also runs when no pass reached the end of the body.
  EXPECT_THAT(Render("{% for m in [1, 2] %}{% if m == 1 %}{% continue %}{% endif %}{% break %}"
                     "{% else %}else{% endfor %}"),
              IsOkAndHolds("else"));
  EXPECT_THAT(Render("{% for m in [1, 2] %}{% if m == 1 %}{% continue %}{% endif %}"
                     "{% else %}else{% endfor %}"),
              IsOkAndHolds(""));
}

TEST(ChatTemplateTest, MacrosStringsAndFilters) {
  EXPECT_THAT(
      Render("{% macro f(a, b='B') %}<{{ a }}{{ b }}>{% endmacro %}{{ f(1) }}{{ f(2, b=3) }}"),
      IsOkAndHolds("<1B><23>"));
  EXPECT_THAT(
      Render(
          "{{ ' a b '.strip() }}|{{ 'a,b'.split(',') }}|{{ 'x</think>y'.split('</think>')[-1] }}"),
      IsOkAndHolds("a b|['a', 'b']|y"));
  EXPECT_THAT(Render("{{ {'b': [1, 2.0, none, true], 'a': 'é\"'} | tojson }}"),
              IsOkAndHolds("{\"b\": [1, 2.0, null, true], \"a\": \"é\\\"\"}"));
  EXPECT_THAT(Render("{{ {'a': [1]} | tojson(indent=2) }}"),
              IsOkAndHolds("{\n  \"a\": [\n    1\n  ]\n}"));
  EXPECT_THAT(Render("{{ 'ab'[::-1] }}{{ [1, 2, 3][1:] }}{{ 7 // 2 }}{{ -7 % 3 }}{{ 0.5 + 1 }}"),
              IsOkAndHolds("ba[2, 3]321.5"));
}

TEST(ChatTemplateTest, UndefinedIsQuietUntilItsAttributeIsRead) {
  EXPECT_THAT(Render("[{{ missing }}]{{ missing is defined }}{{ missing | length }}"),
              IsOkAndHolds("[]False0"));
  EXPECT_THAT(Render("line 1\n{{ missing.attr }}"),
              StatusIs(absl::StatusCode::kInvalidArgument, "line 2: 'missing' is undefined"));
  EXPECT_THAT(Render("{{ present.attr }}", {{"present", {{"attr", "x"}}}}), IsOkAndHolds("x"));
}

TEST(ChatTemplateTest, RaiseExceptionRefusesWithItsMessage) {
  const std::string t =
      "{% if messages|length > 1 %}{{ raise_exception('one turn only') }}{% endif %}ok";
  EXPECT_THAT(
      Render(t, {{"messages", Messages()}}),
      StatusIs(absl::StatusCode::kInvalidArgument, "template raised an error: one turn only"));
  EXPECT_THAT(Render(t, {{"messages", json::array()}}), IsOkAndHolds("ok"));
}

TEST(ChatTemplateTest, StrftimeNowIsTheLocalTime) {
  const std::time_t now = std::time(nullptr);
  std::tm tm;
  localtime_r(&now, &tm);
  char year[16];
  std::strftime(year, sizeof(year), "%Y", &tm);
  EXPECT_THAT(Render("{{ strftime_now('%Y') }}"), IsOkAndHolds(year));
}

TEST(ChatTemplateTest, BadTemplatesAreRefusedAtParseWithTheLine) {
  struct Case {
    const char* bad;
    const char* error;
    const char* good;  // the nearest template that parses
  };
  const Case cases[] = {
      {"a\n{% if x %}", "expected '{% endif %}'", "a\n{% if x %}{% endif %}"},
      {"a\n{{ x ", "line 2: unterminated '{{'", "a\n{{ x }}"},
      {"{% include 'f' %}", "unsupported tag 'include'", "{% set f = 1 %}"},
      {"{% break %}", "'break' outside a for loop", "{% for i in [1] %}{% break %}{% endfor %}"},
      {"{{ 'x }}", "unterminated string", "{{ 'x' }}"},
      {"{{ (1 }}", "unbalanced", "{{ (1) }}"},
      {"{# c", "unterminated comment", "{# c #}"},
      {"{{ a b }}", "expected '}}'", "{{ a ~ b }}"},
      {"\xff{{ 1 }}", "not valid UTF-8", "\xc3\xbf{{ 1 }}"},
      // Unknown filters and tests are refused at load, even in a branch never taken.
      {"{% if false %}{{ x | nosuch }}{% endif %}", "no filter named 'nosuch'",
       "{% if false %}{{ x | trim }}{% endif %}"},
      {"{% for m in [] %}{{ m is nosuch }}{% endfor %}", "no test named 'nosuch'",
       "{% for m in [] %}{{ m is string }}{% endfor %}"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ChatTemplate::Parse(c.bad), StatusIs(absl::StatusCode::kInvalidArgument, c.error))
        << c.bad;
    EXPECT_TRUE(ChatTemplate::Parse(c.good).ok()) << c.good;
  }
  std::string deep(200, '(');
  EXPECT_THAT(ChatTemplate::Parse("{{ " + deep + "1" + std::string(200, ')') + " }}"),
              StatusIs(absl::StatusCode::kInvalidArgument, "nested more than"));
  EXPECT_TRUE(
      ChatTemplate::Parse("{{ " + std::string(20, '(') + "1" + std::string(20, ')') + " }}").ok());
}

TEST(ChatTemplateTest, EveryLimitRefusesAndItsTwinPasses) {
  ChatTemplateLimits limits;
  limits.max_steps = 10'000;
  limits.max_loop_iterations = 1'000;
  limits.max_output_bytes = 1'000;
  limits.max_depth = 40;
  const auto exhausted = absl::StatusCode::kResourceExhausted;
  // Loop iterations.
  EXPECT_THAT(Render("{% for i in range(30) %}{% for j in range(40) %}{% endfor %}{% endfor %}",
                     json::object(), limits),
              StatusIs(exhausted, "loop iteration limit"));
  EXPECT_THAT(Render("{% for i in range(20) %}{% for j in range(40) %}{% endfor %}{% endfor %}",
                     json::object(), limits),
              IsOkAndHolds(""));
  // Steps.
  EXPECT_THAT(Render("{% for i in range(900) %}{% set x = i + i + i + i + i + i %}{% endfor %}",
                     json::object(), limits),
              StatusIs(exhausted, "step limit"));
  EXPECT_TRUE(Render("{% for i in range(90) %}{% set x = i + i + i + i + i + i %}{% endfor %}",
                     json::object(), limits)
                  .ok());
  // Output bytes: the prompt, and any string built on the way.
  EXPECT_THAT(Render("{% for i in range(101) %}0123456789{% endfor %}", json::object(), limits),
              StatusIs(exhausted, "output"));
  std::string thousand;
  for (int i = 0; i < 100; ++i) thousand += "0123456789";
  EXPECT_THAT(Render("{% for i in range(100) %}0123456789{% endfor %}", json::object(), limits),
              IsOkAndHolds(thousand));
  EXPECT_THAT(Render("{% set s = 'x' * 1001 %}", json::object(), limits),
              StatusIs(exhausted, "output limit"));
  EXPECT_THAT(Render("{% set s = 'x' * 1000 %}{{ s|length }}", json::object(), limits),
              IsOkAndHolds("1000"));
  EXPECT_THAT(Render("{% set s = 'x' * 9223372036854775807 %}", json::object(), limits),
              StatusIs(exhausted, "output limit"));
  // Depth: a macro that recurses without end, and one that stops.
  const std::string rec = "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}.{% endmacro %}";
  EXPECT_THAT(Render(rec + "{{ f(1000) }}", json::object(), limits),
              StatusIs(exhausted, "depth limit"));
  EXPECT_THAT(Render(rec + "{{ f(3) }}", json::object(), limits), IsOkAndHolds("...."));
}

TEST(ChatTemplateTest, ArithmeticErrorsAreRefusals) {
  EXPECT_THAT(Render("{{ 1 // 0 }}"), StatusIs(absl::StatusCode::kInvalidArgument, "by zero"));
  EXPECT_THAT(Render("{{ 9223372036854775807 + 1 }}"),
              StatusIs(absl::StatusCode::kInvalidArgument, "integer overflow"));
  EXPECT_THAT(Render("{{ 2 ** 70 }}"), StatusIs(absl::StatusCode::kInvalidArgument, "overflow"));
  EXPECT_THAT(Render("{{ 'a' + 1 }}"),
              StatusIs(absl::StatusCode::kInvalidArgument, "unsupported operand types for +"));
  EXPECT_THAT(Render("{{ (-8) ** 0.5 }}"),
              StatusIs(absl::StatusCode::kInvalidArgument, "fractional power"));
  EXPECT_THAT(Render("{{ 4 ** 10000.5 }}"),
              StatusIs(absl::StatusCode::kInvalidArgument, "overflows"));
  EXPECT_THAT(Render("{{ 010 }}"), StatusIs(absl::StatusCode::kInvalidArgument, "leading zeros"));
  EXPECT_THAT(Render("{{ 8 ** 0.5 }} {{ 10 % -2.5 }} {{ 10 }} {{ 00 }}"),
              IsOkAndHolds("2.8284271247461903 -0.0 10 0"));
  EXPECT_THAT(Render("{{ 1 // 1 }}{{ 9223372036854775806 + 1 }}{{ 2 ** 62 }}{{ 'a' ~ 1 }}"),
              IsOkAndHolds("192233720368547758074611686018427387904a1"));
}

TEST(ChatTemplateTest, RenderChatGivesHuggingFacesVariables) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(
      "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content | trim }}{{ eos_token }}"
      "{% endfor %}{% if tools is defined %}T{{ tools | length }}{% endif %}"
      "{% if add_generation_prompt %}assistant:{% endif %}{{ extra_flag }}");
  ASSERT_TRUE(t.ok()) << t.status();
  ChatInputs in;
  in.messages = Messages();
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  EXPECT_THAT(RenderChat(*t, in),
              IsOkAndHolds("<s>system:S</s>user:hi</s>assistant:yo</s>assistant:"));
  in.tools = json::array({json::object()});
  in.add_generation_prompt = false;
  in.extra = {{"extra_flag", false}};
  EXPECT_THAT(RenderChat(*t, in),
              IsOkAndHolds("<s>system:S</s>user:hi</s>assistant:yo</s>T1False"));
}

TEST(ChatTemplateTest, OneTemplateRendersFromManyThreads) {
  // The documented contract: a parsed template is immutable; renders share nothing else.
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(
      "{% macro m(x) %}[{{ x }}]{% endmacro %}{% set ns = namespace(n=0) %}"
      "{% for msg in messages %}{% set ns.n = ns.n + 1 %}{{ m(msg.content) }}{% endfor %}{{ ns.n "
      "}}");
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<std::string> out(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      json messages = json::array();
      for (int k = 0; k <= i; ++k) messages.push_back({{"content", std::to_string(i)}});
      for (int round = 0; round < 200; ++round) {
        absl::StatusOr<std::string> r = t->Render({{"messages", messages}});
        out[i] = r.ok() ? *r : std::string(r.status().message());
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int i = 0; i < 8; ++i) {
    std::string want;
    for (int k = 0; k <= i; ++k) want += "[" + std::to_string(i) + "]";
    EXPECT_EQ(out[i], want + std::to_string(i + 1));
  }
}

TEST(ChatTemplateTest, PlainRenderingForModelsWithoutATemplate) {
  ChatInputs in;
  in.messages = Messages();
  EXPECT_EQ(RenderPlainChat(in), "system: S\nuser:   hi  \nassistant: yo\nassistant: ");
  in.add_generation_prompt = false;
  EXPECT_EQ(RenderPlainChat(in), "system: S\nuser:   hi  \nassistant: yo\n");
}

}  // namespace
}  // namespace kvguard::core
