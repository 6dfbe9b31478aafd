#include "core/service/openai_api.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/text/chat_prompt.h"
#include "core/text/tokenizer.h"
#include "core/text/utf8.h"

namespace kvguard::core {
namespace {

using json = nlohmann::json;

ApiError Invalid(std::string param, std::string message) {
  ApiError e;
  e.param = std::move(param);
  e.code = "invalid_value";
  e.message = std::move(message);
  return e;
}

ApiError WrongType(const std::string& param, const char* want) {
  ApiError e = Invalid(param, absl::StrCat("'", param, "' must be ", want));
  e.code = "invalid_type";
  return e;
}

// ReadNumber reads an optional number field into *out; an error if present and not a number
// in [lo, hi].
std::optional<ApiError> ReadNumber(const json& doc, const char* name, double lo, double hi,
                                   bool lo_open, float* out) {
  auto it = doc.find(name);
  if (it == doc.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return WrongType(name, "a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v > hi || (lo_open ? v <= lo : v < lo)) {
    return Invalid(
        name, absl::StrCat("'", name, "' must be in ", lo_open ? "(" : "[", lo, ", ", hi, "]"));
  }
  *out = static_cast<float>(v);
  return std::nullopt;
}

// ReadContent returns a chat message's content: a string, or an array of {"type": "text",
// "text": ...} parts (concatenated).
std::optional<ApiError> ReadContent(const json& content, const std::string& param,
                                    std::string* out) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) return WrongType(param, "a string or an array of text parts");
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string p = absl::StrCat(param, "[", i, "]");
    if (!part.is_object()) return WrongType(p, "an object");
    auto type = part.find("type");
    auto text = part.find("text");
    if (type == part.end() || !type->is_string() || *type != "text") {
      return Invalid(p + ".type", "only text content parts are supported");
    }
    if (text == part.end() || !text->is_string()) return WrongType(p + ".text", "a string");
    out->append(text->get_ref<const std::string&>());
  }
  return std::nullopt;
}

// Unsupported returns the refusal of a parameter this server does not implement.
ApiError Unsupported(const std::string& param, const char* why) {
  ApiError e = Invalid(param, absl::StrCat("'", param, "' is not supported by this server", why));
  e.code = "unsupported_parameter";
  return e;
}

// UnsupportedValue returns the refusal of a parameter accepted only at the value that changes
// nothing.
ApiError UnsupportedValue(const std::string& param, const char* accepted) {
  ApiError e = Invalid(param, absl::StrCat("'", param, "' is only supported as ", accepted,
                                           " (this server does not implement it)"));
  e.code = "unsupported_value";
  return e;
}

// Endpoints a field belongs to.
enum Endpoints : unsigned { kCompletions = 1, kChat = 2, kBoth = 3 };

// FieldRule says what ParseCompletionRequest does with one top-level field. `no_effect` is
// null for a field it implements (read below, by name); otherwise the field is accepted only
// when it is null or no_effect(value) holds, the value at which it changes nothing, which
// `accepted` names for the error. Every other field, OpenAI's or not, is refused: a parameter
// that was silently ignored would give the client an answer to a question it did not ask.
// README.md (API) tabulates the same decisions.
struct FieldRule {
  std::string_view name;
  unsigned endpoints;
  bool (*no_effect)(const json&);
  const char* accepted;
};

bool IsString(const json& v) { return v.is_string(); }
bool IsBool(const json& v) { return v.is_boolean(); }
bool IsFalse(const json& v) { return v == false; }
bool IsZero(const json& v) { return v.is_number() && v.get<double>() == 0; }
bool IsOne(const json& v) { return v.is_number_integer() && v.get<int64_t>() == 1; }
bool IsEmptyString(const json& v) { return v == ""; }
bool IsNone(const json& v) { return v == "none"; }
bool IsDefaultTier(const json& v) { return v == "auto" || v == "default"; }
bool IsTextOnly(const json& v) { return v == json::array({"text"}); }
bool IsTextFormat(const json& v) { return v == json{{"type", "text"}}; }
bool IsZeroBias(const json& v) {
  if (!v.is_object()) return false;
  for (const auto& [token, bias] : v.items()) {
    if (!IsZero(bias)) return false;
  }
  return true;
}
bool IsStringMap(const json& v) {
  if (!v.is_object()) return false;
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string()) return false;
  }
  return true;
}
bool Never(const json&) { return false; }

constexpr FieldRule kFieldRules[] = {
    // Implemented (read by ParseCompletionRequest).
    {"model", kBoth, nullptr, nullptr},
    {"prompt", kCompletions, nullptr, nullptr},
    {"messages", kChat, nullptr, nullptr},
    {"max_tokens", kBoth, nullptr, nullptr},
    {"max_completion_tokens", kBoth, nullptr, nullptr},
    {"temperature", kBoth, nullptr, nullptr},
    {"top_p", kBoth, nullptr, nullptr},
    {"seed", kBoth, nullptr, nullptr},
    {"stop", kBoth, nullptr, nullptr},
    {"stream", kBoth, nullptr, nullptr},
    {"stream_options", kBoth, nullptr, nullptr},
    {"n", kBoth, nullptr, nullptr},
    {"logprobs", kBoth, nullptr, nullptr},
    {"top_logprobs", kChat, nullptr, nullptr},
    {"echo", kCompletions, nullptr, nullptr},
    {"ignore_eos", kBoth, nullptr, nullptr},  // vLLM's extension
    // No effect on the output at these values.
    {"user", kBoth, IsString, "a string (it is not used)"},
    {"safety_identifier", kChat, IsString, "a string (it is not used)"},
    {"prompt_cache_key", kChat, IsString, "a string (the prefix cache is per tenant)"},
    {"metadata", kChat, IsStringMap, "an object of strings (nothing is stored)"},
    {"store", kChat, IsFalse, "false (nothing is stored)"},
    {"best_of", kCompletions, IsOne, "1"},
    {"frequency_penalty", kBoth, IsZero, "0"},
    {"presence_penalty", kBoth, IsZero, "0"},
    {"logit_bias", kBoth, IsZeroBias, "{} (or biases of 0)"},
    {"suffix", kCompletions, IsEmptyString, "\"\""},
    {"service_tier", kChat, IsDefaultTier, "\"auto\" or \"default\""},
    {"modalities", kChat, IsTextOnly, "[\"text\"]"},
    {"response_format", kChat, IsTextFormat, "{\"type\": \"text\"}"},
    {"tool_choice", kChat, IsNone, "\"none\" (tools are not supported)"},
    {"function_call", kChat, IsNone, "\"none\" (functions are not supported)"},
    {"parallel_tool_calls", kChat, IsBool, "a boolean (tools are not supported)"},
    // Never: these change the output and are not implemented.
    {"tools", kChat, Never, "null"},
    {"functions", kChat, Never, "null"},
    {"audio", kChat, Never, "null"},
    {"prediction", kChat, Never, "null"},
    {"reasoning_effort", kChat, Never, "null"},
    {"verbosity", kChat, Never, "null"},
    {"web_search_options", kChat, Never, "null"},
};

// CheckFields refuses every field of `doc` that kFieldRules does not accept for the endpoint.
std::optional<ApiError> CheckFields(const json& doc, bool chat) {
  const unsigned endpoint = chat ? kChat : kCompletions;
  for (const auto& [name, value] : doc.items()) {
    const FieldRule* rule = nullptr;
    for (const FieldRule& r : kFieldRules) {
      if (r.name == name && (r.endpoints & endpoint) != 0) rule = &r;
    }
    if (rule == nullptr) {
      return Unsupported(name, chat ? " on /v1/chat/completions" : " on /v1/completions");
    }
    if (rule->no_effect == nullptr || value.is_null() || rule->no_effect(value)) continue;
    if (rule->no_effect == Never) return Unsupported(name, "");
    return UnsupportedValue(name, rule->accepted);
  }
  return std::nullopt;
}

// ReadTokenIds reads the token ids of field `param` (a prompt, or /detokenize's tokens):
// integers in [0, limits.vocab_size), at most limits.max_prompt_bytes of them.
std::optional<ApiError> ReadTokenIds(const json& ids, const std::string& param,
                                     const RequestLimits& limits, std::vector<int>* out) {
  if (ids.size() > limits.max_prompt_bytes) {
    ApiError e = Invalid(
        param, absl::StrCat("'", param, "' has more than ", limits.max_prompt_bytes, " tokens"));
    e.code = "context_length_exceeded";
    return e;
  }
  for (const json& id : ids) {
    if (!id.is_number_integer()) return WrongType(param, "an array of integer token ids");
    const int64_t v = id.get<int64_t>();
    if (v < 0 || v >= limits.vocab_size) {
      return Invalid(param, absl::StrCat("'", param, "' holds token id ", v,
                                         ", outside the vocabulary [0, ", limits.vocab_size, ")"));
    }
    out->push_back(static_cast<int>(v));
  }
  return std::nullopt;
}

// ParseBody parses a request body into *doc: valid UTF-8 holding one JSON object, as every API
// route that takes a body requires.
std::optional<ApiError> ParseBody(std::string_view body, json* doc) {
  if (!IsValidUtf8(body)) return Invalid("", "the request body is not valid UTF-8");
  *doc = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (doc->is_discarded()) return Invalid("", "the request body is not valid JSON");
  if (!doc->is_object()) return Invalid("", "the request body must be a JSON object");
  return std::nullopt;
}

// ReadModel reads the required `model` into *out; 404 model_not_found unless it is the one
// served.
std::optional<ApiError> ReadModel(const json& doc, const RequestLimits& limits, std::string* out) {
  auto model = doc.find("model");
  if (model == doc.end()) return Invalid("model", "'model' is required");
  if (!model->is_string()) return WrongType("model", "a string");
  *out = model->get<std::string>();
  if (*out != limits.model) {
    ApiError e =
        Invalid("model", absl::StrCat("the model '", *out, "' does not exist (this server has '",
                                      limits.model, "')"));
    e.status = 404;
    e.code = "model_not_found";
    return e;
  }
  return std::nullopt;
}

// ReadLogprobs reads echo (completions), logprobs and top_logprobs into *r.
std::optional<ApiError> ReadLogprobs(const json& doc, bool chat, CompletionRequest* r) {
  if (auto it = doc.find("echo"); it != doc.end() && !it->is_null()) {
    if (!it->is_boolean()) return WrongType("echo", "a boolean");
    r->echo = it->get<bool>();
  }
  auto it = doc.find("logprobs");
  const bool given = it != doc.end() && !it->is_null();
  if (!chat) {  // logprobs: N, the alternatives per token (OpenAI allows 0..5)
    if (!given) return std::nullopt;
    if (!it->is_number_integer()) return WrongType("logprobs", "an integer");
    const int64_t n = it->get<int64_t>();
    if (n < 0 || n > kMaxCompletionLogprobs) {
      return Invalid("logprobs",
                     absl::StrCat("'logprobs' must be in [0, ", kMaxCompletionLogprobs, "]"));
    }
    r->logprobs = static_cast<int>(n);
    return std::nullopt;
  }
  // Chat: logprobs: true, and top_logprobs: N alternatives (0..20).
  if (given && !it->is_boolean()) return WrongType("logprobs", "a boolean");
  const bool on = given && it->get<bool>();
  auto top = doc.find("top_logprobs");
  int n = 0;
  if (top != doc.end() && !top->is_null()) {
    if (!top->is_number_integer()) return WrongType("top_logprobs", "an integer");
    const int64_t v = top->get<int64_t>();
    if (v < 0 || v > kMaxTopLogprobs) {
      return Invalid("top_logprobs",
                     absl::StrCat("'top_logprobs' must be in [0, ", kMaxTopLogprobs, "]"));
    }
    if (!on) return Invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    n = static_cast<int>(v);
  }
  r->logprobs = on ? n : -1;
  return std::nullopt;
}

}  // namespace

json ErrorJson(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  if (e.request_id != 0) err["request_id"] = e.request_id;
  return json{{"error", err}};
}

std::string ErrorBody(const ApiError& e) { return Dump(ErrorJson(e)); }

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string SseEvent(const json& data) { return absl::StrCat("data: ", Dump(data), "\n\n"); }

std::optional<std::string_view> BearerToken(std::string_view authorization) {
  // (Debian's Abseil has its own string_view, so trimming and case folding are done here.)
  auto trim = [](std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
  };
  authorization = trim(authorization);
  if (authorization.size() < 7) return std::nullopt;
  std::string scheme(authorization.substr(0, 7));
  for (char& c : scheme) c = absl::ascii_tolower(static_cast<unsigned char>(c));
  if (scheme != "bearer ") return std::nullopt;
  std::string_view key = trim(authorization.substr(7));
  if (key.empty()) return std::nullopt;
  return key;
}

std::optional<ApiError> TokenizePrompt(const Tokenizer& tokenizer, CompletionRequest* request,
                                       std::vector<int>* ids) {
  if (!request->prompt_tokens.empty()) {
    *ids = std::move(request->prompt_tokens);
    request->prompt_tokens.clear();
  } else if (!request->templated) {
    *ids = tokenizer.Encode(request->prompt, /*add_bos=*/true);
  } else {
    size_t failed = 0;
    absl::StatusOr<std::vector<int>> encoded =
        EncodeChatPrompt(tokenizer, request->prompt, request->client_texts, &failed);
    if (!encoded.ok()) {
      ApiError e =
          Invalid(absl::StrCat("messages[", failed, "].content"),
                  absl::StrCat("messages[", failed, "].content: ", encoded.status().message()));
      e.code = "unsafe_chat_content";
      return e;
    }
    *ids = *std::move(encoded);
  }
  if (request->prompt.empty()) request->prompt = tokenizer.Decode(*ids);  // echo, logs
  return std::nullopt;
}

// ParseChatMessages reads `doc`'s `messages` (the body, `body`, is parsed again in key order
// for a template) into r->prompt, rendered with the model's chat template (r->templated, and
// r->client_texts for the special-token rule of TokenizePrompt) or the plain rendering; the
// error names the message and field. Shared by /v1/chat/completions and /tokenize's chat form,
// so both give the engine the same prompt.
std::optional<ApiError> ParseChatMessages(const json& doc, std::string_view body,
                                          const RequestLimits& limits, bool add_generation_prompt,
                                          CompletionRequest* r) {
  auto messages = doc.find("messages");
  if (messages == doc.end()) return Invalid("messages", "'messages' is required");
  if (!messages->is_array() || messages->empty()) {
    return WrongType("messages", "a non-empty array");
  }
  const ChatFormat* format = limits.chat_format;
  const bool templated = format != nullptr && format->chat_template != nullptr;
  // A template sees the messages' keys in the client's order (`tojson`), which `doc` (sorted)
  // lost: the body once more as ordered_json, only then.
  nlohmann::ordered_json ordered;
  if (templated) ordered = nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, false);
  ChatInputs inputs;
  inputs.add_generation_prompt = add_generation_prompt;
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string p = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return WrongType(p, "an object");
    for (const auto& [key, value] : m.items()) {
      // name, tool_calls, function_call, audio, ...: each would change the prompt.
      if (key != "role" && key != "content" && !value.is_null()) {
        return Unsupported(absl::StrCat(p, ".", key), " in messages");
      }
    }
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return WrongType(p + ".role", "a string");
    const std::string& rs = role->get_ref<const std::string&>();
    if (rs != "system" && rs != "user" && rs != "assistant" && rs != "developer") {
      return Invalid(p + ".role", p + ".role must be system, developer, user or assistant");
    }
    auto content = m.find("content");
    if (content == m.end()) return Invalid(p + ".content", "'content' is required");
    std::string text;
    if (auto e = ReadContent(*content, p + ".content", &text)) return e;
    // The template gets role and content only (null fields are absent, as everywhere in this
    // API), content as one string (text parts joined), in the client's key order.
    nlohmann::ordered_json message = nlohmann::ordered_json::object();
    bool content_first = false;
    if (templated && ordered.is_object()) {
      const auto& om = ordered["messages"][i];
      for (auto it = om.begin(); it != om.end(); ++it) {
        if (it.key() == "content" || it.key() == "role") {
          content_first = it.key() == "content";
          break;
        }
      }
    }
    if (content_first) message["content"] = text;
    message["role"] = rs;
    message["content"] = text;
    inputs.messages.push_back(std::move(message));
    r->client_texts.push_back(std::move(text));
  }
  if (templated) {
    inputs.bos_token = format->bos_token;
    inputs.eos_token = format->eos_token;
    absl::StatusOr<std::string> rendered = RenderChat(*format->chat_template, inputs);
    if (!rendered.ok()) {
      ApiError e = Invalid("messages", absl::StrCat("the model's chat template refused the "
                                                    "messages: ",
                                                    rendered.status().message()));
      e.code = "chat_template_error";
      return e;
    }
    r->prompt = *std::move(rendered);
    r->templated = true;
  } else {
    r->prompt = RenderPlainChat(inputs);
    r->client_texts.clear();
  }
  return std::nullopt;
}

std::optional<ApiError> ParseCompletionRequest(std::string_view body, bool chat,
                                               const RequestLimits& limits,
                                               CompletionRequest* out) {
  json doc;
  if (auto e = ParseBody(body, &doc)) return e;
  if (auto e = CheckFields(doc, chat)) return e;
  CompletionRequest r;
  r.chat = chat;
  if (auto e = ReadModel(doc, limits, &r.model)) return e;

  if (chat) {
    if (auto e = ParseChatMessages(doc, body, limits, /*add_generation_prompt=*/true, &r)) {
      return e;
    }
  } else {
    auto prompt = doc.find("prompt");
    if (prompt == doc.end()) return Invalid("prompt", "'prompt' is required");
    // Token ids: [1, 2, ...], or a batch of one, [[1, 2, ...]] (lm-evaluation-harness sends
    // its requests tokenized so).
    const json* ids = nullptr;
    if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number()) ids = &*prompt;
    if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_array()) ids = &(*prompt)[0];
    if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
      r.prompt = (*prompt)[0].get<std::string>();
    } else if (prompt->is_string()) {
      r.prompt = prompt->get<std::string>();
    } else if (ids != nullptr) {
      if (auto e = ReadTokenIds(*ids, "prompt", limits, &r.prompt_tokens)) return e;
    } else {
      return WrongType("prompt",
                       "a string, an array of one string, or an array of token ids (or of one)");
    }
    if (r.prompt.empty() && r.prompt_tokens.empty()) {
      return Invalid("prompt", "'prompt' must not be empty");
    }
  }
  if (r.prompt.size() > limits.max_prompt_bytes) {
    ApiError e =
        Invalid(chat ? "messages" : "prompt",
                absl::StrCat("the prompt is longer than ", limits.max_prompt_bytes, " bytes"));
    e.code = "context_length_exceeded";
    return e;
  }

  if (auto e = ReadLogprobs(doc, chat, &r)) return e;
  // echo with max_tokens 0 scores a text without generating (lm-evaluation-harness's
  // loglikelihood requests); without echo there would be nothing to return.
  const int64_t min_tokens = r.echo ? 0 : 1;
  r.max_tokens = std::min(limits.default_max_tokens, limits.max_tokens);
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    auto it = doc.find(name);
    if (it == doc.end() || it->is_null()) continue;
    if (!it->is_number_integer()) return WrongType(name, "an integer");
    const int64_t v = it->get<int64_t>();
    if (v < min_tokens || v > limits.max_tokens) {
      return Invalid(name,
                     absl::StrCat("'", name, "' must be in [", min_tokens, ", ", limits.max_tokens,
                                  "] (this tenant's tokens_per_request; 0 only with echo), "
                                  "got ",
                                  v));
    }
    r.max_tokens = static_cast<int>(v);
  }
  if (auto e = ReadNumber(doc, "temperature", 0, 2, false, &r.temperature)) return e;
  if (auto e = ReadNumber(doc, "top_p", 0, 1, true, &r.top_p)) return e;
  if (auto it = doc.find("seed"); it != doc.end() && !it->is_null()) {
    if (!it->is_number_integer()) return WrongType("seed", "an integer");
    r.seed =
        it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>());
  }
  if (auto it = doc.find("n"); it != doc.end() && !it->is_null()) {
    if (!it->is_number_integer()) return WrongType("n", "an integer");
    if (it->get<int64_t>() != 1) return Invalid("n", "only n = 1 is supported");
  }
  if (auto it = doc.find("stop"); it != doc.end() && !it->is_null()) {
    if (it->is_string()) {
      r.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > 4) return Invalid("stop", "at most 4 stop sequences");
      for (const json& s : *it) {
        if (!s.is_string()) return WrongType("stop", "a string or an array of strings");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or an array of strings");
    }
    for (const std::string& s : r.stop) {
      if (s.empty()) return Invalid("stop", "stop sequences must not be empty");
    }
  }
  if (auto it = doc.find("stream"); it != doc.end() && !it->is_null()) {
    if (!it->is_boolean()) return WrongType("stream", "a boolean");
    r.stream = it->get<bool>();
  }
  if (auto it = doc.find("ignore_eos"); it != doc.end() && !it->is_null()) {
    if (!it->is_boolean()) return WrongType("ignore_eos", "a boolean");
    r.ignore_eos = it->get<bool>();
  }
  if (auto it = doc.find("stream_options"); it != doc.end() && !it->is_null()) {
    if (!it->is_object()) return WrongType("stream_options", "an object");
    for (const auto& [key, value] : it->items()) {
      const std::string param = "stream_options." + key;
      if (value.is_null()) continue;
      if (key == "include_usage") {
        if (!value.is_boolean()) return WrongType(param, "a boolean");
        r.include_usage = value.get<bool>();
      } else if (key == "include_obfuscation") {
        // The obfuscation field pads chunks to hide their lengths; none is sent.
        if (value != false) return UnsupportedValue(param, "false");
      } else {
        return Unsupported(param, "");
      }
    }
  }
  *out = std::move(r);
  return std::nullopt;
}

namespace {

// Envelope returns the fields every response and chunk share.
json Envelope(const CompletionRequest& request, std::string_view id, int64_t created, bool chunk) {
  const char* object =
      request.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return json{{"id", id}, {"object", object}, {"created", created}, {"model", request.model}};
}

json UsageJson(const Usage& usage) {
  return json{{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

}  // namespace

namespace {

// TokenText is how a token is named in `logprobs`: its text, or "bytes:\xNN..." when its bytes
// are not valid UTF-8 on their own.
std::string TokenText(const std::string& bytes) {
  if (IsValidUtf8(bytes)) return bytes;
  std::string out = "bytes:";
  for (const char c : bytes) {
    absl::StrAppend(&out, "\\x", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
  }
  return out;
}

// CodePoints counts the characters `bytes` starts (its bytes that are not continuation bytes).
int64_t CodePoints(const std::string& bytes) {
  int64_t n = 0;
  for (const char c : bytes) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

// Logprob is a logprob as JSON can carry it: -inf (probability 0) becomes OpenAI's -9999.
json Logprob(float logprob) { return std::isfinite(logprob) ? logprob : -9999.0f; }

json BytesJson(const std::string& bytes) {
  json out = json::array();
  for (const char c : bytes) out.push_back(static_cast<unsigned char>(c));
  return out;
}

}  // namespace

json LogprobsJson(const CompletionRequest& request, const Tokenizer& tokenizer,
                  std::span<const int> echoed, std::span<const TokenLogprobs> echoed_logprobs,
                  std::span<const TokenLogprobs> generated, int64_t* offset) {
  if (request.chat) {
    json content = json::array();
    for (const TokenLogprobs& e : generated) {
      const std::string bytes = tokenizer.DecodeToken(e.token);
      json top = json::array();
      for (const TopLogprob& t : e.top) {
        const std::string b = tokenizer.DecodeToken(t.token);
        top.push_back(
            {{"token", TokenText(b)}, {"logprob", Logprob(t.logprob)}, {"bytes", BytesJson(b)}});
      }
      content.push_back({{"token", TokenText(bytes)},
                         {"logprob", Logprob(e.logprob)},
                         {"bytes", BytesJson(bytes)},
                         {"top_logprobs", top}});
    }
    return json{{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  auto add = [&](int token, const TokenLogprobs* e) {
    const std::string bytes = tokenizer.DecodeToken(token);
    tokens.push_back(TokenText(bytes));
    text_offset.push_back(*offset);
    *offset += CodePoints(bytes);
    if (e == nullptr) {  // the first echoed token: nothing predicts it
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      return;
    }
    token_logprobs.push_back(Logprob(e->logprob));
    json top = json::object();
    for (const TopLogprob& t : e->top) {
      top.emplace(TokenText(tokenizer.DecodeToken(t.token)), Logprob(t.logprob));
    }
    top_logprobs.push_back(top);
  };
  for (size_t i = 0; i < echoed.size(); ++i) {
    add(echoed[i], i == 0 || i > echoed_logprobs.size() ? nullptr : &echoed_logprobs[i - 1]);
  }
  for (const TokenLogprobs& e : generated) add(e.token, &e);
  return json{{"tokens", tokens},
              {"token_logprobs", token_logprobs},
              {"top_logprobs", top_logprobs},
              {"text_offset", text_offset}};
}

json CompletionBody(const CompletionRequest& request, std::string_view id, int64_t created,
                    std::string_view text, std::string_view finish_reason, const Usage& usage,
                    const json& logprobs) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason}, {"logprobs", logprobs}};
  if (request.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  json body = Envelope(request, id, created, /*chunk=*/false);
  body["choices"] = json::array({choice});
  body["usage"] = UsageJson(usage);
  return body;
}

json ChunkBody(const CompletionRequest& request, std::string_view id, int64_t created,
               std::string_view text, std::optional<std::string_view> finish_reason, bool first,
               const json& logprobs) {
  json choice = {{"index", 0},
                 {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)},
                 {"logprobs", logprobs}};
  if (request.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || !finish_reason) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  json body = Envelope(request, id, created, /*chunk=*/true);
  body["choices"] = json::array({choice});
  return body;
}

json UsageChunkBody(const CompletionRequest& request, std::string_view id, int64_t created,
                    const Usage& usage) {
  json body = Envelope(request, id, created, /*chunk=*/true);
  body["choices"] = json::array();
  body["usage"] = UsageJson(usage);
  return body;
}

namespace {

// CheckOnly refuses every field of `doc` not in `known` (unsupported_parameter): /tokenize and
// /detokenize implement every field they accept, so none has a no-effect value to allow.
std::optional<ApiError> CheckOnly(const json& doc, std::initializer_list<std::string_view> known,
                                  const char* on) {
  for (const auto& item : doc.items()) {
    const std::string& name = item.key();
    if (std::find(known.begin(), known.end(), name) == known.end()) return Unsupported(name, on);
  }
  return std::nullopt;
}

// ReadBool reads an optional boolean field (null = absent) into *out.
std::optional<ApiError> ReadBool(const json& doc, const char* name, bool* out) {
  auto it = doc.find(name);
  if (it == doc.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return WrongType(name, "a boolean");
  *out = it->get<bool>();
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseTokenizeRequest(std::string_view body, const RequestLimits& limits,
                                             TokenizeRequest* out) {
  json doc;
  if (auto e = ParseBody(body, &doc)) return e;
  // vLLM's chat form: `messages` rendered and tokenized exactly as /v1/chat/completions does
  // (ParseChatMessages, then TokenizePrompt), so the ids are the ones the engine would see. BOS
  // is the template's business there, so `add_special_tokens` is not taken in this form.
  if (doc.contains("messages")) {
    if (auto e = CheckOnly(doc, {"model", "messages", "add_generation_prompt", "return_token_strs"},
                           " on /tokenize with messages (the chat form tokenizes as "
                           "/v1/chat/completions does)")) {
      return e;
    }
    TokenizeRequest r;
    if (auto e = ReadModel(doc, limits, &r.model)) return e;
    bool add_generation_prompt = true;
    if (auto e = ReadBool(doc, "add_generation_prompt", &add_generation_prompt)) return e;
    if (auto e = ReadBool(doc, "return_token_strs", &r.return_token_strs)) return e;
    r.chat = true;
    r.chat_request.chat = true;
    r.chat_request.model = r.model;
    if (auto e = ParseChatMessages(doc, body, limits, add_generation_prompt, &r.chat_request)) {
      return e;
    }
    *out = std::move(r);
    return std::nullopt;
  }
  if (auto e = CheckOnly(doc, {"model", "prompt", "add_special_tokens", "return_token_strs"},
                         " on /tokenize")) {
    return e;
  }
  TokenizeRequest r;
  if (auto e = ReadModel(doc, limits, &r.model)) return e;
  auto prompt = doc.find("prompt");
  if (prompt == doc.end()) return Invalid("prompt", "'prompt' is required");
  // A string only: ids are what /tokenize returns, and the empty string is a valid question
  // (its answer is BOS alone), as in vLLM.
  if (!prompt->is_string()) return WrongType("prompt", "a string");
  r.prompt = prompt->get<std::string>();
  if (r.prompt.size() > limits.max_prompt_bytes) {
    ApiError e = Invalid(
        "prompt", absl::StrCat("the prompt is longer than ", limits.max_prompt_bytes, " bytes"));
    e.code = "context_length_exceeded";
    return e;
  }
  if (auto e = ReadBool(doc, "add_special_tokens", &r.add_special_tokens)) return e;
  if (auto e = ReadBool(doc, "return_token_strs", &r.return_token_strs)) return e;
  *out = std::move(r);
  return std::nullopt;
}

json TokenizeBody(const TokenizeRequest& request, const Tokenizer& tokenizer,
                  std::span<const int> tokens, int max_model_len) {
  json strs = nullptr;
  if (request.return_token_strs) {
    strs = json::array();
    for (const int id : tokens) strs.push_back(TokenText(tokenizer.DecodeToken(id)));
  }
  return json{{"count", tokens.size()},
              {"max_model_len", max_model_len},
              {"tokens", std::vector<int>(tokens.begin(), tokens.end())},
              {"token_strs", strs}};
}

std::optional<ApiError> ParseDetokenizeRequest(std::string_view body, const RequestLimits& limits,
                                               DetokenizeRequest* out) {
  json doc;
  if (auto e = ParseBody(body, &doc)) return e;
  if (auto e = CheckOnly(doc, {"model", "tokens"}, " on /detokenize")) return e;
  DetokenizeRequest r;
  if (auto e = ReadModel(doc, limits, &r.model)) return e;
  auto tokens = doc.find("tokens");
  if (tokens == doc.end()) return Invalid("tokens", "'tokens' is required");
  if (!tokens->is_array()) return WrongType("tokens", "an array of integer token ids");
  if (auto e = ReadTokenIds(*tokens, "tokens", limits, &r.tokens)) return e;
  *out = std::move(r);
  return std::nullopt;
}

json DetokenizeBody(const Tokenizer& tokenizer, std::span<const int> tokens) {
  // Decode's bytes may cut a character (ids are anyone's choice); the stream decoder that makes
  // generated text valid UTF-8 does the same here, so both agree on every byte sequence.
  Utf8StreamDecoder utf8;
  std::string text = utf8.Push(tokenizer.Decode(tokens));
  text += utf8.Flush();
  return json{{"prompt", text}};
}

}  // namespace kvguard::core
