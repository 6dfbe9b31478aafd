// Tests of core/service/openai_api.h: request validation (every bad input gets the right 4xx, the
// field and the code; each has a valid twin), response and chunk shapes, SSE framing, bearer keys.
#include "core/service/openai_api.h"

#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace kvguard::core {
namespace {

using json = nlohmann::json;

RequestLimits Limits() {
  RequestLimits l;
  l.model = "small";
  l.max_tokens = 100;
  l.default_max_tokens = 16;
  l.max_prompt_bytes = 64;
  l.vocab_size = 300;
  return l;
}

struct BadCase {
  const char* name;
  bool chat;
  std::string body;
  int status;
  std::string param;
  std::string code;
};

TEST(OpenAiApiTest, RefusesBadRequests) {
  const BadCase cases[] = {
      {"not json", false, "{\"model\": ", 400, "", "invalid_value"},
      {"not an object", false, "[1, 2]", 400, "", "invalid_value"},
      {"invalid utf-8", false, "{\"model\": \"small\", \"prompt\": \"\xC3\x28\"}", 400, "",
       "invalid_value"},
      {"overlong utf-8", false, "{\"model\": \"small\", \"prompt\": \"\xC0\xAF\"}", 400, "",
       "invalid_value"},
      {"surrogate", false, "{\"model\": \"small\", \"prompt\": \"\xED\xA0\x80\"}", 400, "",
       "invalid_value"},
      {"no model", false, R"({"prompt": "hi"})", 400, "model", "invalid_value"},
      {"model not string", false, R"({"model": 3, "prompt": "hi"})", 400, "model", "invalid_type"},
      {"unknown model", false, R"({"model": "gpt-5", "prompt": "hi"})", 404, "model",
       "model_not_found"},
      {"no prompt", false, R"({"model": "small"})", 400, "prompt", "invalid_value"},
      {"prompt not string", false, R"({"model": "small", "prompt": 5})", 400, "prompt",
       "invalid_type"},
      {"mixed token prompt", false, R"({"model": "small", "prompt": [1, "a"]})", 400, "prompt",
       "invalid_type"},
      {"float token", false, R"({"model": "small", "prompt": [1, 2.5]})", 400, "prompt",
       "invalid_type"},
      {"token outside the vocabulary", false, R"({"model": "small", "prompt": [1, 300]})", 400,
       "prompt", "invalid_value"},
      {"negative token", false, R"({"model": "small", "prompt": [[-1]]})", 400, "prompt",
       "invalid_value"},
      {"two token prompts", false, R"({"model": "small", "prompt": [[1], [2]]})", 400, "prompt",
       "invalid_type"},
      {"no tokens", false, R"({"model": "small", "prompt": [[]]})", 400, "prompt", "invalid_value"},
      {"empty prompt", false, R"({"model": "small", "prompt": ""})", 400, "prompt",
       "invalid_value"},
      {"prompt too long", false, R"({"model": "small", "prompt": ")" + std::string(65, 'x') + "\"}",
       400, "prompt", "context_length_exceeded"},
      {"max_tokens 0", false, R"({"model": "small", "prompt": "hi", "max_tokens": 0})", 400,
       "max_tokens", "invalid_value"},
      {"max_tokens negative", false, R"({"model": "small", "prompt": "hi", "max_tokens": -5})", 400,
       "max_tokens", "invalid_value"},
      {"max_tokens huge", false, R"({"model": "small", "prompt": "hi", "max_tokens": 99999999999})",
       400, "max_tokens", "invalid_value"},
      {"max_tokens float", false, R"({"model": "small", "prompt": "hi", "max_tokens": 1.5})", 400,
       "max_tokens", "invalid_type"},
      {"max_tokens string", false, R"({"model": "small", "prompt": "hi", "max_tokens": "4"})", 400,
       "max_tokens", "invalid_type"},
      {"temperature", false, R"({"model": "small", "prompt": "hi", "temperature": 3})", 400,
       "temperature", "invalid_value"},
      {"temperature type", false, R"({"model": "small", "prompt": "hi", "temperature": "hot"})",
       400, "temperature", "invalid_type"},
      {"top_p zero", false, R"({"model": "small", "prompt": "hi", "top_p": 0})", 400, "top_p",
       "invalid_value"},
      {"seed type", false, R"({"model": "small", "prompt": "hi", "seed": "x"})", 400, "seed",
       "invalid_type"},
      {"stop type", false, R"({"model": "small", "prompt": "hi", "stop": 3})", 400, "stop",
       "invalid_type"},
      {"five stops", false,
       R"({"model": "small", "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]})", 400, "stop",
       "invalid_value"},
      {"empty stop", false, R"({"model": "small", "prompt": "hi", "stop": [""]})", 400, "stop",
       "invalid_value"},
      {"n 2", false, R"({"model": "small", "prompt": "hi", "n": 2})", 400, "n", "invalid_value"},
      {"ignore_eos type", false, R"({"model": "small", "prompt": "hi", "ignore_eos": 1})", 400,
       "ignore_eos", "invalid_type"},
      {"stream type", false, R"({"model": "small", "prompt": "hi", "stream": "yes"})", 400,
       "stream", "invalid_type"},
      {"logprobs 6", false, R"({"model": "small", "prompt": "hi", "logprobs": 6})", 400, "logprobs",
       "invalid_value"},
      {"logprobs negative", false, R"({"model": "small", "prompt": "hi", "logprobs": -1})", 400,
       "logprobs", "invalid_value"},
      {"logprobs bool", false, R"({"model": "small", "prompt": "hi", "logprobs": true})", 400,
       "logprobs", "invalid_type"},
      {"echo type", false, R"({"model": "small", "prompt": "hi", "echo": 1})", 400, "echo",
       "invalid_type"},
      {"max_tokens 0 without echo", false,
       R"({"model": "small", "prompt": "hi", "max_tokens": 0, "logprobs": 1})", 400, "max_tokens",
       "invalid_value"},
      {"echo on chat", true,
       R"({"model": "small", "messages": [{"role": "user", "content": "x"}], "echo": true})", 400,
       "echo", "unsupported_parameter"},
      {"chat logprobs int", true,
       R"({"model": "small", "messages": [{"role": "user", "content": "x"}], "logprobs": 2})", 400,
       "logprobs", "invalid_type"},
      {"top_logprobs without logprobs", true,
       R"({"model": "small", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
       400, "top_logprobs", "invalid_value"},
      {"top_logprobs 21", true,
       R"({"model": "small", "messages": [{"role": "user", "content": "x"}], "logprobs": true,
           "top_logprobs": 21})",
       400, "top_logprobs", "invalid_value"},
      {"no messages", true, R"({"model": "small"})", 400, "messages", "invalid_value"},
      {"empty messages", true, R"({"model": "small", "messages": []})", 400, "messages",
       "invalid_type"},
      {"message not object", true, R"({"model": "small", "messages": ["hi"]})", 400, "messages[0]",
       "invalid_type"},
      {"bad role", true, R"({"model": "small", "messages": [{"role": "god", "content": "x"}]})",
       400, "messages[0].role", "invalid_value"},
      {"no content", true, R"({"model": "small", "messages": [{"role": "user"}]})", 400,
       "messages[0].content", "invalid_value"},
      {"image part", true,
       R"({"model": "small", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       400, "messages[0].content[0].type", "invalid_value"},
  };
  for (const BadCase& c : cases) {
    CompletionRequest out;
    std::optional<ApiError> e = ParseCompletionRequest(c.body, c.chat, Limits(), &out);
    ASSERT_TRUE(e.has_value()) << c.name;
    EXPECT_EQ(e->status, c.status) << c.name;
    EXPECT_EQ(e->param, c.param) << c.name << ": " << e->message;
    EXPECT_EQ(e->code, c.code) << c.name << ": " << e->message;
    EXPECT_FALSE(e->message.empty()) << c.name;
    // The body has OpenAI's shape.
    const json body = json::parse(ErrorBody(*e));
    EXPECT_TRUE(body["error"].contains("message")) << c.name;
    EXPECT_TRUE(body["error"].contains("type")) << c.name;
    EXPECT_TRUE(body["error"].contains("param")) << c.name;
    EXPECT_EQ(body["error"]["code"], c.code) << c.name;
  }
}

TEST(OpenAiApiTest, AcceptsValidRequests) {
  CompletionRequest r;
  ASSERT_EQ(ParseCompletionRequest(
                R"({"model": "small", "prompt": "h\u00e9", "max_tokens": 100, "temperature": 0,
                    "top_p": 0.5, "seed": 7, "stop": ["a", "b", "c", "d"], "stream": true,
                    "stream_options": {"include_usage": true}, "user": "ignored", "n": 1,
                    "best_of": 1, "presence_penalty": 0, "frequency_penalty": 0,
                    "ignore_eos": true})",
                false, Limits(), &r),
            std::nullopt);
  EXPECT_EQ(r.prompt, "h\xC3\xA9");
  EXPECT_EQ(r.max_tokens, 100);
  EXPECT_EQ(r.temperature, 0.0f);
  EXPECT_EQ(r.top_p, 0.5f);
  EXPECT_EQ(r.seed, std::optional<uint64_t>(7));
  EXPECT_EQ(r.stop.size(), 4u);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.ignore_eos);

  ASSERT_EQ(ParseCompletionRequest(R"({"model": "small", "prompt": ["one"], "stop": "x"})", false,
                                   Limits(), &r),
            std::nullopt);
  EXPECT_EQ(r.prompt, "one");
  EXPECT_EQ(r.max_tokens, 16);  // the default
  EXPECT_EQ(r.temperature, 1.0f);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});

  ASSERT_EQ(ParseCompletionRequest(R"({"model": "small", "max_completion_tokens": 1, "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]}
    ]})",
                                   true, Limits(), &r),
            std::nullopt);
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.max_tokens, 1);
  EXPECT_EQ(r.prompt, "system: Be brief.\nuser: Hi!\nassistant: ");
}

// ChatFormatOf parses `source` into a chat format with BOS text "<s>".
ChatFormat ChatFormatOf(const std::string& source) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
  EXPECT_TRUE(t.ok()) << t.status();
  ChatFormat f;
  if (t.ok()) f.chat_template = std::make_shared<const ChatTemplate>(*std::move(t));
  f.bos_token = "<s>";
  return f;
}

constexpr char kNoSystemTemplate[] =
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}"
    "{{ raise_exception('system messages are not supported') }}{% endif %}"
    "<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>";

TEST(OpenAiApiTest, ChatTemplateRenders) {
  const ChatFormat format = ChatFormatOf(kNoSystemTemplate);
  RequestLimits limits = Limits();
  limits.chat_format = &format;
  CompletionRequest r;
  ASSERT_EQ(ParseCompletionRequest(
                R"({"model": "small", "messages": [{"content": "Hi", "role": "user"}]})", true,
                limits, &r),
            std::nullopt);
  EXPECT_TRUE(r.templated);
  EXPECT_EQ(r.prompt, "<s><|user|>Hi<|assistant|>");
  EXPECT_EQ(r.client_texts, std::vector<std::string>{"Hi"});
}

TEST(OpenAiApiTest, ChatTemplateErrorIsA400) {  // the twin of ChatTemplateRenders
  const ChatFormat format = ChatFormatOf(kNoSystemTemplate);
  RequestLimits limits = Limits();
  limits.chat_format = &format;
  CompletionRequest r;
  std::optional<ApiError> e = ParseCompletionRequest(
      R"({"model": "small", "messages": [{"role": "system", "content": "Hi"}]})", true, limits, &r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->param, "messages");
  EXPECT_EQ(e->code, "chat_template_error");
  EXPECT_NE(e->message.find("system messages are not supported"), std::string::npos) << e->message;
}

TEST(OpenAiApiTest, ChatTemplateKeepsTheClientsKeyOrder) {
  const ChatFormat format = ChatFormatOf("{% for m in messages %}{{ m | tojson }}{% endfor %}");
  RequestLimits limits = Limits();
  limits.chat_format = &format;
  CompletionRequest r;
  ASSERT_EQ(ParseCompletionRequest(
                R"({"model": "small", "messages": [{"content": "a", "role": "user", "name": null},
                    {"role": "user", "content": "b"}]})",
                true, limits, &r),
            std::nullopt);
  EXPECT_EQ(r.prompt, R"({"content": "a", "role": "user"}{"role": "user", "content": "b"})");
}

TEST(OpenAiApiTest, ControlTextInChatContentIsRefusedWhenTheTemplateHidesIt) {
  // A tokenizer whose control token the template writes, and a template that changes the content
  // (upper-case) so that where its control text went cannot be known: refused, naming the message.
  class OneControl final : public Tokenizer {
   public:
    std::vector<int> Encode(std::string_view text, bool) const override {
      return std::vector<int>(text.begin(), text.end());
    }
    std::string Decode(std::span<const int>) const override { return ""; }
    std::string DecodeToken(int) const override { return ""; }
    int bos_id() const override { return -1; }
    int eos_id() const override { return -1; }
    int vocab_size() const override { return 300; }
    std::span<const std::string_view> ControlTokenTexts() const override { return controls; }
    std::string_view controls[1] = {"<end>"};
  } tok;
  const ChatFormat format =
      ChatFormatOf("{% for m in messages %}{{ m.content | upper }}{% endfor %}");
  RequestLimits limits = Limits();
  limits.chat_format = &format;
  for (const bool control : {true, false}) {
    CompletionRequest r;
    const std::string body =
        control
            ? R"({"model": "small", "messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "x<end>"}]})"
            : R"({"model": "small", "messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "x"}]})";
    ASSERT_EQ(ParseCompletionRequest(body, true, limits, &r), std::nullopt);
    std::vector<int> ids;
    std::optional<ApiError> e = TokenizePrompt(tok, &r, &ids);
    EXPECT_EQ(e.has_value(), control);
    if (e) {
      EXPECT_EQ(e->status, 400);
      EXPECT_EQ(e->param, "messages[1].content");
    }
  }
}

// A parameter the server does not implement, and its twin at the value that changes nothing
// (or the same request without it): the first is refused with its name, the second accepted.
struct UnsupportedCase {
  bool chat;
  std::string field;     // `"name": value` added to a valid request
  std::string param;     // the error's param
  std::string code;      // the error's code
  std::string accepted;  // the twin: `"name": value` the server accepts ("" = leave it out)
};

std::string WithField(bool chat, const std::string& field) {
  const std::string base =
      chat ? R"({"model": "small", "messages": [{"role": "user", "content": "hi"}])"
           : R"({"model": "small", "prompt": "hi")";
  return field.empty() ? base + "}" : base + ", " + field + "}";
}

const UnsupportedCase kUnsupported[] = {
    {false, R"("best_of": 3)", "best_of", "unsupported_value", R"("best_of": 1)"},
    {false, R"("frequency_penalty": 0.5)", "frequency_penalty", "unsupported_value",
     R"("frequency_penalty": 0)"},
    {true, R"("presence_penalty": -1)", "presence_penalty", "unsupported_value",
     R"("presence_penalty": 0.0)"},
    {false, R"("logit_bias": {"50256": -100})", "logit_bias", "unsupported_value",
     R"("logit_bias": {"50256": 0})"},
    {true, R"("logit_bias": {"1": 5})", "logit_bias", "unsupported_value", R"("logit_bias": {})"},
    {false, R"("suffix": "end")", "suffix", "unsupported_value", R"("suffix": "")"},
    {true, R"("response_format": {"type": "json_object"})", "response_format", "unsupported_value",
     R"("response_format": {"type": "text"})"},
    {true, R"("tools": [{"type": "function", "function": {"name": "f"}}])", "tools",
     "unsupported_parameter", R"("tools": null)"},
    {true, R"("tool_choice": "auto")", "tool_choice", "unsupported_value",
     R"("tool_choice": "none")"},
    {true, R"("functions": [{"name": "f"}])", "functions", "unsupported_parameter", ""},
    {true, R"("function_call": "auto")", "function_call", "unsupported_value",
     R"("function_call": "none")"},
    {true, R"("parallel_tool_calls": 1)", "parallel_tool_calls", "unsupported_value",
     R"("parallel_tool_calls": false)"},
    {true, R"("store": true)", "store", "unsupported_value", R"("store": false)"},
    {true, R"("metadata": {"a": 1})", "metadata", "unsupported_value", R"("metadata": {"a": "b"})"},
    {true, R"("service_tier": "flex")", "service_tier", "unsupported_value",
     R"("service_tier": "auto")"},
    {true, R"("modalities": ["text", "audio"])", "modalities", "unsupported_value",
     R"("modalities": ["text"])"},
    {true, R"("audio": {"voice": "alloy", "format": "wav"})", "audio", "unsupported_parameter", ""},
    {true, R"("prediction": {"type": "content", "content": "x"})", "prediction",
     "unsupported_parameter", ""},
    {true, R"("reasoning_effort": "low")", "reasoning_effort", "unsupported_parameter", ""},
    {true, R"("verbosity": "low")", "verbosity", "unsupported_parameter", ""},
    {true, R"("web_search_options": {})", "web_search_options", "unsupported_parameter", ""},
    {true, R"("user": 5)", "user", "unsupported_value", R"("user": "u1")"},
    {true, R"("safety_identifier": 5)", "safety_identifier", "unsupported_value",
     R"("safety_identifier": "s")"},
    {true, R"("prompt_cache_key": 5)", "prompt_cache_key", "unsupported_value",
     R"("prompt_cache_key": "k")"},
    {false, R"("stream_options": {"include_obfuscation": true})",
     "stream_options.include_obfuscation", "unsupported_value",
     R"("stream_options": {"include_obfuscation": false})"},
    {false, R"("stream_options": {"chunk_size": 4})", "stream_options.chunk_size",
     "unsupported_parameter", R"("stream_options": {"include_usage": false})"},
    // Not OpenAI's (vLLM's and others' extensions), or OpenAI's on the other endpoint.
    {false, R"("top_k": 40)", "top_k", "unsupported_parameter", ""},
    {true, R"("repetition_penalty": 1.1)", "repetition_penalty", "unsupported_parameter", ""},
    {false, R"("tenant": "beta")", "tenant", "unsupported_parameter", ""},
    {false, R"("tools": [])", "tools", "unsupported_parameter", ""},
    {true, R"("suffix": "")", "suffix", "unsupported_parameter", ""},
    {true, R"("best_of": 1)", "best_of", "unsupported_parameter", ""},
};

TEST(OpenAiApiTest, RefusesUnimplementedParameters) {
  for (const UnsupportedCase& c : kUnsupported) {
    CompletionRequest out;
    std::optional<ApiError> e =
        ParseCompletionRequest(WithField(c.chat, c.field), c.chat, Limits(), &out);
    ASSERT_TRUE(e.has_value()) << c.field;
    EXPECT_EQ(e->status, 400) << c.field;
    EXPECT_EQ(e->param, c.param) << c.field << ": " << e->message;
    EXPECT_EQ(e->code, c.code) << c.field << ": " << e->message;
    EXPECT_NE(e->message.find(c.param), std::string::npos) << e->message;
    EXPECT_EQ(json::parse(ErrorBody(*e))["error"]["param"], c.param) << c.field;
  }
}

TEST(OpenAiApiTest, AcceptsParametersAtTheirNoEffectValues) {
  for (const UnsupportedCase& c : kUnsupported) {
    CompletionRequest out;
    std::optional<ApiError> e =
        ParseCompletionRequest(WithField(c.chat, c.accepted), c.chat, Limits(), &out);
    EXPECT_EQ(e, std::nullopt) << c.accepted << ": " << (e ? e->message : "");
  }
}

TEST(OpenAiApiTest, RefusesUnimplementedMessageFields) {
  CompletionRequest out;
  std::optional<ApiError> e = ParseCompletionRequest(
      R"({"model": "small", "messages": [{"role": "user", "content": "hi", "name": "bob"}]})", true,
      Limits(), &out);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "messages[0].name");
  EXPECT_EQ(e->code, "unsupported_parameter");
  // Null (as some clients send for absent fields) changes nothing.
  EXPECT_EQ(ParseCompletionRequest(
                R"({"model": "small", "messages": [{"role": "assistant", "content": "hi",
                    "tool_calls": null, "refusal": null}]})",
                true, Limits(), &out),
            std::nullopt);
}

TEST(OpenAiApiTest, ReadsTokenIdPrompts) {
  CompletionRequest r;
  ASSERT_EQ(ParseCompletionRequest(R"({"model": "small", "prompt": [256, 104, 299]})", false,
                                   Limits(), &r),
            std::nullopt);
  EXPECT_EQ(r.prompt_tokens, (std::vector<int>{256, 104, 299}));
  EXPECT_TRUE(r.prompt.empty());
  ASSERT_EQ(
      ParseCompletionRequest(R"({"model": "small", "prompt": [[0, 7]]})", false, Limits(), &r),
      std::nullopt);
  EXPECT_EQ(r.prompt_tokens, (std::vector<int>{0, 7}));
}

TEST(OpenAiApiTest, ReadsLogprobsAndEcho) {
  CompletionRequest r;
  ASSERT_EQ(ParseCompletionRequest(R"({"model": "small", "prompt": "hi"})", false, Limits(), &r),
            std::nullopt);
  EXPECT_EQ(r.logprobs, -1);
  EXPECT_FALSE(r.echo);
  // lm-evaluation-harness's loglikelihood request.
  ASSERT_EQ(
      ParseCompletionRequest(
          R"({"model": "small", "prompt": "hi", "echo": true, "logprobs": 1, "max_tokens": 0})",
          false, Limits(), &r),
      std::nullopt);
  EXPECT_EQ(r.logprobs, 1);
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.max_tokens, 0);
  ASSERT_EQ(ParseCompletionRequest(R"({"model": "small", "prompt": "hi", "logprobs": 0})", false,
                                   Limits(), &r),
            std::nullopt);
  EXPECT_EQ(r.logprobs, 0);
  const std::string chat = R"({"model": "small", "messages": [{"role": "user", "content": "x"}])";
  ASSERT_EQ(ParseCompletionRequest(chat + R"(, "logprobs": true, "top_logprobs": 20})", true,
                                   Limits(), &r),
            std::nullopt);
  EXPECT_EQ(r.logprobs, 20);
  ASSERT_EQ(ParseCompletionRequest(chat + R"(, "logprobs": true})", true, Limits(), &r),
            std::nullopt);
  EXPECT_EQ(r.logprobs, 0);
  ASSERT_EQ(ParseCompletionRequest(chat + R"(, "logprobs": false, "top_logprobs": null})", true,
                                   Limits(), &r),
            std::nullopt);
  EXPECT_EQ(r.logprobs, -1);
}

TEST(OpenAiApiTest, LogprobsShapes) {
  auto tokenizer = *ByteTokenizer::Create(300);
  const int bos = tokenizer->bos_id();
  // "é" is two byte tokens, neither valid UTF-8 alone.
  const std::vector<int> echoed = {bos, 'h', 0xC3, 0xA9};
  const std::vector<TokenLogprobs> echoed_logprobs = {{'h', -1.5f, {{'a', -0.5f}}},
                                                      {0xC3, -2.0f, {{0xC3, -2.0f}}},
                                                      {0xA9, -0.25f, {{0xA9, -0.25f}}}};
  const std::vector<TokenLogprobs> generated = {
      {'!', -std::numeric_limits<float>::infinity(), {{'?', -0.1f}}}};
  CompletionRequest r;
  r.logprobs = 1;
  int64_t offset = 0;
  json lp = LogprobsJson(r, *tokenizer, echoed, echoed_logprobs, generated, &offset);
  EXPECT_EQ(lp["tokens"], json::array({"", "h", "bytes:\\xc3", "bytes:\\xa9", "!"}));
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["token_logprobs"][1], -1.5f);
  EXPECT_EQ(lp["top_logprobs"][1], (json{{"a", -0.5f}}));
  EXPECT_EQ(lp["token_logprobs"][4], -9999.0f);  // -inf
  // Offsets in code points of "hé!": the second byte of é starts nothing.
  EXPECT_EQ(lp["text_offset"], json::array({0, 0, 1, 2, 2}));
  EXPECT_EQ(offset, 3);
  // Without echo: the generated tokens alone, from the offset carried over.
  lp = LogprobsJson(r, *tokenizer, {}, {}, generated, &offset);
  EXPECT_EQ(lp["text_offset"], json::array({3}));
  EXPECT_EQ(lp["tokens"], json::array({"!"}));

  r.chat = true;
  lp = LogprobsJson(r, *tokenizer, {}, {}, echoed_logprobs, &offset);
  ASSERT_EQ(lp["content"].size(), 3u);
  EXPECT_TRUE(lp["refusal"].is_null());
  EXPECT_EQ(lp["content"][0]["token"], "h");
  EXPECT_EQ(lp["content"][0]["logprob"], -1.5f);
  EXPECT_EQ(lp["content"][0]["bytes"], json::array({'h'}));
  EXPECT_EQ(lp["content"][0]["top_logprobs"],
            json::array({{{"token", "a"}, {"logprob", -0.5f}, {"bytes", json::array({'a'})}}}));
  EXPECT_EQ(lp["content"][1]["bytes"], json::array({0xC3}));
  // The body carries it; without logprobs the field is null.
  json body = CompletionBody(r, "c", 5, "x", "stop", Usage{1, 1}, lp);
  EXPECT_EQ(body["choices"][0]["logprobs"], lp);
  EXPECT_TRUE(
      CompletionBody(r, "c", 5, "x", "stop", Usage{1, 1})["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(ChunkBody(r, "c", 5, "x", std::nullopt, false, lp)["choices"][0]["logprobs"], lp);
}

TEST(OpenAiApiTest, BearerToken) {
  EXPECT_EQ(BearerToken("Bearer abc"), std::optional<std::string_view>("abc"));
  EXPECT_EQ(BearerToken("bearer  abc "), std::optional<std::string_view>("abc"));
  EXPECT_EQ(BearerToken("Basic abc"), std::nullopt);
  EXPECT_EQ(BearerToken("Bearer "), std::nullopt);
  EXPECT_EQ(BearerToken(""), std::nullopt);
  EXPECT_EQ(BearerToken("abc"), std::nullopt);
}

TEST(OpenAiApiTest, ResponseShapes) {
  CompletionRequest r;
  r.model = "small";
  json body = CompletionBody(r, "cmpl-1", 5, "text", "length", Usage{3, 4});
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], "text");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["total_tokens"], 7);
  r.chat = true;
  body = CompletionBody(r, "chatcmpl-1", 5, "text", "stop", Usage{3, 4});
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "text");

  json first = ChunkBody(r, "c", 5, "He", std::nullopt, true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "He");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  json later = ChunkBody(r, "c", 5, "llo", std::nullopt, false);
  EXPECT_FALSE(later["choices"][0]["delta"].contains("role"));
  json last = ChunkBody(r, "c", 5, "", "stop", false);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(last["choices"][0]["delta"].contains("content"));
  json usage = UsageChunkBody(r, "c", 5, Usage{1, 2});
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 2);
}

TEST(OpenAiApiTest, SseFraming) {
  EXPECT_EQ(SseEvent(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");
  // Text with newlines stays on one data line (JSON escapes it), so one event stays one event.
  EXPECT_EQ(SseEvent(json{{"t", "x\n\ny"}}), "data: {\"t\":\"x\\n\\ny\"}\n\n");
  // Invalid UTF-8 in generated text cannot throw: it becomes U+FFFD.
  EXPECT_EQ(Dump(json("\xFF")), "\"\xEF\xBF\xBD\"");
}

TEST(OpenAiApiTest, ErrorBodyCarriesTheRequestId) {
  ApiError e;
  e.status = 500;
  e.type = "isolation_error";
  e.code = "kv_integrity_violation";
  e.message = "aborted";
  e.request_id = 42;
  const json body = json::parse(ErrorBody(e));
  EXPECT_EQ(body["error"]["code"], "kv_integrity_violation");
  EXPECT_EQ(body["error"]["request_id"], 42);
  EXPECT_TRUE(body["error"]["param"].is_null());
  e.request_id = 0;
  EXPECT_FALSE(json::parse(ErrorBody(e))["error"].contains("request_id"));
}

// A refusal of /tokenize or /detokenize and its twin: the same request put right, accepted.
struct TokenizerCase {
  const char* name;
  bool detokenize;
  std::string body;
  int status;
  std::string param;
  std::string code;
  std::string twin;
};

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

std::optional<ApiError> ParseTokenizerBody(bool detokenize, const std::string& body) {
  if (detokenize) {
    DetokenizeRequest r;
    return ParseDetokenizeRequest(body, Limits(), &r);
  }
  TokenizeRequest r;
  return ParseTokenizeRequest(body, Limits(), &r);
}

TEST(OpenAiApiTest, TokenizeAndDetokenizeRefuseBadRequestsAndAcceptTheirTwins) {
  const std::string ok_tok = R"({"model": "small", "prompt": "hi"})";
  const std::string ok_detok = R"({"model": "small", "tokens": [104, 105]})";
  const TokenizerCase cases[] = {
      {"not json", false, "{\"model\": ", 400, "", "invalid_value", ok_tok},
      {"not an object", true, "[1, 2]", 400, "", "invalid_value", ok_detok},
      {"invalid utf-8", false, "{\"model\": \"small\", \"prompt\": \"\xC3\x28\"}", 400, "",
       "invalid_value", "{\"model\": \"small\", \"prompt\": \"\xC3\xA9\"}"},
      {"no model", false, R"({"prompt": "hi"})", 400, "model", "invalid_value", ok_tok},
      {"model not string", true, R"({"model": 3, "tokens": [1]})", 400, "model", "invalid_type",
       ok_detok},
      {"unknown model", false, R"({"model": "gpt-5", "prompt": "hi"})", 404, "model",
       "model_not_found", ok_tok},
      {"unknown model (detokenize)", true, R"({"model": "gpt-5", "tokens": [1]})", 404, "model",
       "model_not_found", ok_detok},
      {"no prompt", false, R"({"model": "small"})", 400, "prompt", "invalid_value", ok_tok},
      {"prompt of ids", false, R"({"model": "small", "prompt": [1, 2]})", 400, "prompt",
       "invalid_type", R"({"model": "small", "prompt": ""})"},
      {"prompt too long", false, R"({"model": "small", "prompt": ")" + std::string(65, 'x') + "\"}",
       400, "prompt", "context_length_exceeded",
       R"({"model": "small", "prompt": ")" + std::string(64, 'x') + "\"}"},
      {"add_special_tokens not bool", false,
       R"({"model": "small", "prompt": "hi", "add_special_tokens": 1})", 400, "add_special_tokens",
       "invalid_type", R"({"model": "small", "prompt": "hi", "add_special_tokens": false})"},
      {"return_token_strs not bool", false,
       R"({"model": "small", "prompt": "hi", "return_token_strs": "yes"})", 400,
       "return_token_strs", "invalid_type",
       R"({"model": "small", "prompt": "hi", "return_token_strs": true})"},
      {"chat form with add_special_tokens", false,
       R"({"model": "small", "messages": [{"role": "user", "content": "hi"}],
           "add_special_tokens": true})",
       400, "add_special_tokens", "unsupported_parameter",
       R"({"model": "small", "messages": [{"role": "user", "content": "hi"}],
           "add_generation_prompt": false, "return_token_strs": true})"},
      {"chat form bad role", false,
       R"({"model": "small", "messages": [{"role": "wizard", "content": "hi"}]})", 400,
       "messages[0].role", "invalid_value",
       R"({"model": "small", "messages": [{"role": "user", "content": "hi"}]})"},
      {"unknown field", false,
       R"({"model": "small", "prompt": "hi", "add_generation_prompt": true})", 400,
       "add_generation_prompt", "unsupported_parameter", ok_tok},
      {"completion field", false, R"({"model": "small", "prompt": "hi", "max_tokens": 1})", 400,
       "max_tokens", "unsupported_parameter", ok_tok},
      {"unknown field (detokenize)", true, R"({"model": "small", "tokens": [1], "prompt": "x"})",
       400, "prompt", "unsupported_parameter", ok_detok},
      {"no tokens", true, R"({"model": "small"})", 400, "tokens", "invalid_value", ok_detok},
      {"tokens not array", true, R"({"model": "small", "tokens": "hi"})", 400, "tokens",
       "invalid_type", R"({"model": "small", "tokens": []})"},
      {"token not integer", true, R"({"model": "small", "tokens": [1, 2.5]})", 400, "tokens",
       "invalid_type", R"({"model": "small", "tokens": [1, 2]})"},
      {"token string", true, R"({"model": "small", "tokens": ["1"]})", 400, "tokens",
       "invalid_type", R"({"model": "small", "tokens": [1]})"},
      {"token outside the vocabulary", true, R"({"model": "small", "tokens": [300]})", 400,
       "tokens", "invalid_value", R"({"model": "small", "tokens": [299]})"},
      {"negative token", true, R"({"model": "small", "tokens": [-1]})", 400, "tokens",
       "invalid_value", R"({"model": "small", "tokens": [0]})"},
      {"nested tokens", true, R"({"model": "small", "tokens": [[1]]})", 400, "tokens",
       "invalid_type", R"({"model": "small", "tokens": [1]})"},
      {"too many tokens", true, R"({"model": "small", "tokens": [)" + Repeat("1, ", 64) + "1]}",
       400, "tokens", "context_length_exceeded",
       R"({"model": "small", "tokens": [)" + Repeat("1, ", 63) + "1]}"},
  };
  for (const TokenizerCase& c : cases) {
    std::optional<ApiError> e = ParseTokenizerBody(c.detokenize, c.body);
    ASSERT_TRUE(e.has_value()) << c.name;
    EXPECT_EQ(e->status, c.status) << c.name;
    EXPECT_EQ(e->param, c.param) << c.name << ": " << e->message;
    EXPECT_EQ(e->code, c.code) << c.name << ": " << e->message;
    if (!c.param.empty()) {
      EXPECT_NE(e->message.find(c.param), std::string::npos) << e->message;
    }
    std::optional<ApiError> twin = ParseTokenizerBody(c.detokenize, c.twin);
    EXPECT_EQ(twin, std::nullopt) << c.name << ": " << (twin ? twin->message : "");
  }
}

TEST(OpenAiApiTest, ReadsTokenizeRequests) {
  TokenizeRequest r;
  ASSERT_EQ(ParseTokenizeRequest(R"({"model": "small", "prompt": "h\u00e9"})", Limits(), &r),
            std::nullopt);
  EXPECT_EQ(r.model, "small");
  EXPECT_EQ(r.prompt, "h\xC3\xA9");
  EXPECT_TRUE(r.add_special_tokens);  // vLLM's default: BOS, as completions add it
  EXPECT_FALSE(r.return_token_strs);
  ASSERT_EQ(ParseTokenizeRequest(R"({"model": "small", "prompt": "x", "add_special_tokens": false,
                                     "return_token_strs": true})",
                                 Limits(), &r),
            std::nullopt);
  EXPECT_FALSE(r.add_special_tokens);
  EXPECT_TRUE(r.return_token_strs);
  // Null (as some clients send for absent fields) keeps the default.
  ASSERT_EQ(ParseTokenizeRequest(R"({"model": "small", "prompt": "x", "add_special_tokens": null})",
                                 Limits(), &r),
            std::nullopt);
  EXPECT_TRUE(r.add_special_tokens);

  DetokenizeRequest d;
  ASSERT_EQ(
      ParseDetokenizeRequest(R"({"model": "small", "tokens": [256, 104, 299]})", Limits(), &d),
      std::nullopt);
  EXPECT_EQ(d.tokens, (std::vector<int>{256, 104, 299}));
}

TEST(OpenAiApiTest, TokenizeAndDetokenizeShapes) {
  auto tokenizer = ByteTokenizer::Create(300);
  ASSERT_TRUE(tokenizer.ok());
  const ByteTokenizer& t = **tokenizer;
  TokenizeRequest r;
  r.prompt = "h\xC3\xA9";
  const std::vector<int> ids = t.Encode(r.prompt, /*add_bos=*/true);
  json body = TokenizeBody(r, t, ids, 512);
  EXPECT_EQ(body["count"], 4);
  EXPECT_EQ(body["max_model_len"], 512);
  EXPECT_EQ(body["tokens"], json({256, 104, 0xC3, 0xA9}));
  EXPECT_TRUE(body["token_strs"].is_null());
  r.return_token_strs = true;
  body = TokenizeBody(r, t, ids, 512);
  // Named as logprobs name tokens: BOS has no text; half a character is shown as its bytes.
  EXPECT_EQ(body["token_strs"], json({"", "h", "bytes:\\xc3", "bytes:\\xa9"}));

  // The round trip; BOS contributes no text.
  EXPECT_EQ(DetokenizeBody(t, ids)["prompt"], "h\xC3\xA9");
  EXPECT_EQ(DetokenizeBody(t, {})["prompt"], "");
  // Ids that cut a character still give valid UTF-8: each ill-formed piece is one U+FFFD.
  const std::vector<int> cut = {104, 0xC3};
  EXPECT_EQ(DetokenizeBody(t, cut)["prompt"], "h\xEF\xBF\xBD");
  const std::vector<int> stray = {0xA9, 105};
  EXPECT_EQ(DetokenizeBody(t, stray)["prompt"], "\xEF\xBF\xBDi");
}

}  // namespace
}  // namespace kvguard::core
