#include "core/service/openai_api.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/text/tokenizer.h"  // IsValidUtf8, the one UTF-8 validator

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

std::string RenderChat(const std::vector<std::pair<std::string, std::string>>& messages) {
  std::string out;
  for (const auto& [role, content] : messages) absl::StrAppend(&out, role, ": ", content, "\n");
  out += "assistant: ";
  return out;
}

std::optional<ApiError> ParseCompletionRequest(std::string_view body, bool chat,
                                               const RequestLimits& limits,
                                               CompletionRequest* out) {
  if (!IsValidUtf8(body)) return Invalid("", "the request body is not valid UTF-8");
  const json doc = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Invalid("", "the request body is not valid JSON");
  if (!doc.is_object()) return Invalid("", "the request body must be a JSON object");
  CompletionRequest r;
  r.chat = chat;

  auto model = doc.find("model");
  if (model == doc.end()) return Invalid("model", "'model' is required");
  if (!model->is_string()) return WrongType("model", "a string");
  r.model = model->get<std::string>();
  if (r.model != limits.model) {
    ApiError e =
        Invalid("model", absl::StrCat("the model '", r.model, "' does not exist (this server has '",
                                      limits.model, "')"));
    e.status = 404;
    e.code = "model_not_found";
    return e;
  }

  if (chat) {
    auto messages = doc.find("messages");
    if (messages == doc.end()) return Invalid("messages", "'messages' is required");
    if (!messages->is_array() || messages->empty()) {
      return WrongType("messages", "a non-empty array");
    }
    std::vector<std::pair<std::string, std::string>> turns;
    for (size_t i = 0; i < messages->size(); ++i) {
      const json& m = (*messages)[i];
      const std::string p = absl::StrCat("messages[", i, "]");
      if (!m.is_object()) return WrongType(p, "an object");
      auto role = m.find("role");
      if (role == m.end() || !role->is_string()) return WrongType(p + ".role", "a string");
      const std::string& rs = role->get_ref<const std::string&>();
      if (rs != "system" && rs != "user" && rs != "assistant" && rs != "developer") {
        return Invalid(p + ".role", "role must be system, developer, user or assistant");
      }
      auto content = m.find("content");
      if (content == m.end()) return Invalid(p + ".content", "'content' is required");
      std::string text;
      if (auto e = ReadContent(*content, p + ".content", &text)) return e;
      turns.emplace_back(rs, std::move(text));
    }
    r.prompt = RenderChat(turns);
  } else {
    auto prompt = doc.find("prompt");
    if (prompt == doc.end()) return Invalid("prompt", "'prompt' is required");
    if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
      r.prompt = (*prompt)[0].get<std::string>();
    } else if (prompt->is_string()) {
      r.prompt = prompt->get<std::string>();
    } else {
      return WrongType("prompt", "a string (or an array of one string)");
    }
    if (r.prompt.empty()) return Invalid("prompt", "'prompt' must not be empty");
  }
  if (r.prompt.size() > limits.max_prompt_bytes) {
    ApiError e =
        Invalid(chat ? "messages" : "prompt",
                absl::StrCat("the prompt is longer than ", limits.max_prompt_bytes, " bytes"));
    e.code = "context_length_exceeded";
    return e;
  }

  r.max_tokens = std::min(limits.default_max_tokens, limits.max_tokens);
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    auto it = doc.find(name);
    if (it == doc.end() || it->is_null()) continue;
    if (!it->is_number_integer()) return WrongType(name, "an integer");
    const int64_t v = it->get<int64_t>();
    if (v < 1 || v > limits.max_tokens) {
      return Invalid(name, absl::StrCat("'", name, "' must be in [1, ", limits.max_tokens,
                                        "] (this tenant's tokens_per_request), got ", v));
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
    if (auto u = it->find("include_usage"); u != it->end()) {
      if (!u->is_boolean()) return WrongType("stream_options.include_usage", "a boolean");
      r.include_usage = u->get<bool>();
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

json CompletionBody(const CompletionRequest& request, std::string_view id, int64_t created,
                    std::string_view text, std::string_view finish_reason, const Usage& usage) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason}, {"logprobs", nullptr}};
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
               std::string_view text, std::optional<std::string_view> finish_reason, bool first) {
  json choice = {{"index", 0},
                 {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)},
                 {"logprobs", nullptr}};
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

}  // namespace kvguard::core
