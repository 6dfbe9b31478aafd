// core/service/openai_api.h: the OpenAI-compatible wire format of `kvguard serve`, apart from any
// socket: request parsing and validation (/v1/completions, /v1/chat/completions, /tokenize,
// /detokenize), response and stream-chunk bodies, server-sent events, and the error body every
// refusal carries:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// Everything here is pure (no engine, no I/O), so tests drive it with strings.
#ifndef KVGUARD_CORE_SERVICE_OPENAI_API_H_
#define KVGUARD_CORE_SERVICE_OPENAI_API_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/text/chat_template.h"
#include "core/text/logprobs.h"
#include "core/text/tokenizer.h"
#include "nlohmann/json.hpp"

namespace kvguard::core {

// ApiError is one refusal: the HTTP status and the OpenAI error fields.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string code;         // machine-readable, e.g. "invalid_api_key", "kv_integrity_violation"
  std::string param;        // the request field at fault, "" if none
  std::string message;      // for people; never holds prompt text or key material
  uint64_t request_id = 0;  // the engine request (and audit log `request`), 0 if none
};

// ErrorBody returns the JSON body of `e` (with "request_id" inside "error" when set).
std::string ErrorBody(const ApiError& e);
// ErrorJson is ErrorBody's object (streams send it as one SSE event).
nlohmann::json ErrorJson(const ApiError& e);

// CompletionRequest is a validated request. For chat, `prompt` is the rendered conversation
// (the model's chat template, else RenderPlainChat).
struct CompletionRequest {
  bool chat = false;
  std::string model;
  std::string prompt;
  // Chat under a template: `prompt` is the template's text, whose control tokens become ids
  // except inside the client's texts (the message contents), which EncodeChatPrompt keeps apart
  // (core/text/chat_prompt.h). Otherwise the prompt is text and has no control tokens.
  bool templated = false;
  std::vector<std::string> client_texts;
  // Completions: the prompt as token ids, when given so (used as they are: no BOS is added);
  // `prompt` is then empty until the server decodes them.
  std::vector<int> prompt_tokens;
  int max_tokens = 0;
  float temperature = 1.0f;  // OpenAI's default; 0 = greedy
  float top_p = 1.0f;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  bool ignore_eos = false;     // vLLM's extension: generate max_tokens even past EOS
  // logprobs >= 0: report each token's logprob and its `logprobs` most likely alternatives
  // (completions' `logprobs: N`; chat's `logprobs: true` with `top_logprobs: N`); -1: none.
  int logprobs = -1;
  bool echo = false;  // completions: the prompt comes back before the completion
};

// The most alternatives completions' `logprobs` may ask for (chat's top_logprobs: 20).
inline constexpr int kMaxCompletionLogprobs = 5;

// ChatFormat: how chat messages become a prompt: the model's chat template (parsed once at start,
// core/service/chat_format.h) with the BOS/EOS texts it is given; no template: RenderPlainChat.
struct ChatFormat {
  std::shared_ptr<const ChatTemplate> chat_template;
  std::string bos_token;
  std::string eos_token;
};

// RequestLimits are the bounds a request is validated against.
struct RequestLimits {
  const ChatFormat* chat_format = nullptr;  // null or no template: the plain rendering
  std::string model;                        // the one model served
  int max_tokens = 2048;        // ceiling for max_tokens (the tenant's tokens_per_request)
  int default_max_tokens = 16;  // when the request gives none (OpenAI's completions default)
  size_t max_prompt_bytes = 1 << 20;
  int vocab_size = 0;  // token ids in a prompt must be below it
};

// ParseCompletionRequest validates `body` (JSON) for /v1/chat/completions when `chat`, else
// /v1/completions, into *out. Returns nullopt on success, else the error naming the field:
// malformed JSON or invalid UTF-8, a field of the wrong type, a missing prompt/messages/model,
// a prompt of token ids outside [0, limits.vocab_size),
// max_tokens < 1 (< 0 with echo) or above limits.max_tokens, temperature outside [0, 2],
// top_p outside (0, 1], more than 4 stop sequences, n != 1, logprobs outside [0, 5]
// (completions), top_logprobs outside [0, 20] or without logprobs (chat), an unknown model
// (404 model_not_found), a chat template that refuses the messages (raise_exception, a limit:
// its message, param "messages"). Fails closed: a field this server does not implement is refused
// (code "unsupported_parameter", or "unsupported_value" for one accepted only at the value
// that changes nothing, such as presence_penalty 0), never ignored; README.md (API) lists
// every field. Accepts vLLM's `ignore_eos` extension (generate max_tokens whatever the model
// emits).
std::optional<ApiError> ParseCompletionRequest(std::string_view body, bool chat,
                                               const RequestLimits& limits, CompletionRequest* out);

// TokenizeRequest is a validated /tokenize request: vLLM's completion form (`prompt`), or its
// chat form (`messages`, rendered as /v1/chat/completions renders them: chat_request, to be
// tokenized with TokenizePrompt).
struct TokenizeRequest {
  std::string model;
  std::string prompt;
  bool add_special_tokens = true;  // BOS, as /v1/completions encodes a text prompt
  bool return_token_strs = false;
  bool chat = false;
  CompletionRequest chat_request;  // chat form: the rendered prompt and its client texts
};

// ParseTokenizeRequest validates `body` (JSON) for /tokenize into *out: {"model", "prompt": a
// string, "add_special_tokens": bool, "return_token_strs": bool}. Returns nullopt on success,
// else the error naming the field, with ParseCompletionRequest's body and model checks (the same
// errors). The chat form takes {"model", "messages", "add_generation_prompt": bool (default
// true), "return_token_strs": bool}. Every other field is refused (unsupported_parameter).
std::optional<ApiError> ParseTokenizeRequest(std::string_view body, const RequestLimits& limits,
                                             TokenizeRequest* out);

// TokenizeBody returns /tokenize's response for `tokens` (the prompt's ids, encoded as
// /v1/completions encodes it): {"count", "max_model_len" (the model's context, in tokens),
// "tokens", "token_strs"}; token_strs is null unless request.return_token_strs, else each token
// named as `logprobs` names it (its text; "" for a special token such as BOS).
nlohmann::json TokenizeBody(const TokenizeRequest& request, const Tokenizer& tokenizer,
                            std::span<const int> tokens, int max_model_len);

// DetokenizeRequest is a validated /detokenize request.
struct DetokenizeRequest {
  std::string model;
  std::vector<int> tokens;
};

// ParseDetokenizeRequest validates `body` (JSON) for /detokenize into *out: {"model", "tokens":
// an array of integer ids in [0, limits.vocab_size), at most limits.max_prompt_bytes of them}.
// Returns nullopt on success, else the error naming the field (body and model checks as
// ParseCompletionRequest's).
std::optional<ApiError> ParseDetokenizeRequest(std::string_view body, const RequestLimits& limits,
                                               DetokenizeRequest* out);

// DetokenizeBody returns /detokenize's response, {"prompt": the text of `tokens`}: Decode's
// bytes made valid UTF-8 as generated text is (each ill-formed piece becomes one U+FFFD).
nlohmann::json DetokenizeBody(const Tokenizer& tokenizer, std::span<const int> tokens);

// RenderChat turns chat messages into one prompt: "<role>: <content>\n" per message, then
// "assistant: ". The built-in models have no chat template of their own; a GGUF model's
// template is not applied (documented limitation).
std::string RenderChat(const std::vector<std::pair<std::string, std::string>>& messages);

// TokenizePrompt sets *ids to `request`'s prompt as token ids: the ids it came as, else the
// text encoded (BOS added as the model says); a templated chat prompt through EncodeChatPrompt,
// so that no client text becomes a control token. A prompt given as ids gets its text (echo,
// logs). Returns the refusal (400 naming messages[N].content) when a message's control-token
// text cannot be kept apart from the template's (core/text/chat_prompt.h), else nullopt.
std::optional<ApiError> TokenizePrompt(const Tokenizer& tokenizer, CompletionRequest* request,
                                       std::vector<int>* ids);

// BearerToken returns the key of an "Authorization: Bearer KEY" header value, or nullopt.
std::optional<std::string_view> BearerToken(std::string_view authorization);

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

// LogprobsJson returns a choice's `logprobs` for `request` (request.logprobs >= 0), over the
// echoed prompt's tokens (`echoed`, empty without echo; their entries are `echoed_logprobs`,
// for tokens 1.., since nothing predicts the first) and then the `generated` entries:
//  completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}
//    (the first echoed token's logprob and top_logprobs are null);
//  chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{token, logprob, bytes}]}],
//    "refusal": null}.
// A token is its text, or "bytes:\xNN..." when its bytes are not valid UTF-8 on their own (a
// piece of a character). A logprob of -inf (probability 0) is written as -9999.0, as OpenAI
// does. `*offset` is where the first token's text starts in the choice's text, in code points
// (text_offset), and is advanced past the last token: a stream carries it from chunk to chunk.
nlohmann::json LogprobsJson(const CompletionRequest& request, const Tokenizer& tokenizer,
                            std::span<const int> echoed,
                            std::span<const TokenLogprobs> echoed_logprobs,
                            std::span<const TokenLogprobs> generated, int64_t* offset);

// CompletionBody returns the non-streaming response ("text_completion" or "chat.completion");
// `logprobs` is the choice's (LogprobsJson, or null).
nlohmann::json CompletionBody(const CompletionRequest& request, std::string_view id,
                              int64_t created, std::string_view text,
                              std::string_view finish_reason, const Usage& usage,
                              const nlohmann::json& logprobs = nullptr);
// ChunkBody returns one stream chunk carrying `text` (chat: the first chunk also carries
// role "assistant") and, on the last, `finish_reason` (null before); `logprobs` is the
// choice's for the chunk's tokens (LogprobsJson, or null).
nlohmann::json ChunkBody(const CompletionRequest& request, std::string_view id, int64_t created,
                         std::string_view text, std::optional<std::string_view> finish_reason,
                         bool first, const nlohmann::json& logprobs = nullptr);
// UsageChunkBody returns the final chunk with no choices and `usage` (include_usage).
nlohmann::json UsageChunkBody(const CompletionRequest& request, std::string_view id,
                              int64_t created, const Usage& usage);

// SseEvent returns `data: <json>\n\n`; kSseDone ends a stream.
std::string SseEvent(const nlohmann::json& data);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// Dump serialises `j` compactly; invalid UTF-8 becomes U+FFFD rather than an exception.
std::string Dump(const nlohmann::json& j);

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_SERVICE_OPENAI_API_H_
