// fuzz/openai_request_fuzzer.cc: the service's request parser (core/service/openai_api.h), the
// first code a client's bytes reach. Every body is either a valid request or an error with a 4xx
// status, a code and a message, whose body is JSON; an accepted request must keep the parser's
// bounds; and the text of any stream chunk, whatever bytes the model produced, must stay one
// SSE event (no raw newline inside the data line).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/service/openai_api.h"
#include "nlohmann/json.hpp"

namespace {

[[noreturn]] void Fail(const std::string& why) {
  std::fprintf(stderr, "==kvguard-fuzz== ORACLE openai-request: %s\n", why.c_str());
  std::abort();
}

void CheckOne(std::string_view body, bool chat) {
  using kvguard::core::ApiError;
  using kvguard::core::CompletionRequest;
  kvguard::core::RequestLimits limits;
  limits.model = "small";
  limits.max_tokens = 64;
  limits.max_prompt_bytes = 256;
  limits.vocab_size = 300;
  CompletionRequest r;
  std::optional<ApiError> e = kvguard::core::ParseCompletionRequest(body, chat, limits, &r);
  if (e) {
    if (e->status != 400 && e->status != 404) Fail("status " + std::to_string(e->status));
    if (e->code.empty() || e->message.empty()) Fail("an error without code or message");
    const nlohmann::json j = nlohmann::json::parse(kvguard::core::ErrorBody(*e), nullptr, false);
    if (j.is_discarded() || !j.contains("error")) Fail("error body is not JSON");
    return;
  }
  if (r.model != limits.model) Fail("accepted model '" + r.model + "'");
  if (r.max_tokens < (r.echo ? 0 : 1) || r.max_tokens > limits.max_tokens)
    Fail("accepted max_tokens out of range");
  if (r.echo && chat) Fail("accepted echo on chat");
  if (r.logprobs < -1 || r.logprobs > (chat ? kvguard::core::kMaxTopLogprobs
                                            : kvguard::core::kMaxCompletionLogprobs)) {
    Fail("accepted logprobs out of range");
  }
  for (const int id : r.prompt_tokens) {
    if (chat || id < 0 || id >= limits.vocab_size) Fail("accepted a token id out of range");
  }
  if (!(r.temperature >= 0 && r.temperature <= 2)) Fail("accepted temperature out of range");
  if (!(r.top_p > 0 && r.top_p <= 1)) Fail("accepted top_p out of range");
  if (r.stop.size() > 4) Fail("accepted more than 4 stop sequences");
  // (A chat prompt is the rendered conversation: the limit applies to it as rendered.)
  if ((r.prompt.empty() && r.prompt_tokens.empty()) || r.prompt.size() > limits.max_prompt_bytes) {
    Fail("accepted a prompt of " + std::to_string(r.prompt.size()) + " bytes");
  }
  // The request's own text (stop sequences, prompt) as if the model had produced it.
  for (const std::string& text : {r.prompt, r.stop.empty() ? std::string() : r.stop[0]}) {
    const std::string event =
        kvguard::core::SseEvent(kvguard::core::ChunkBody(r, "cmpl-1", 0, text, std::nullopt, true));
    if (event.rfind("data: ", 0) != 0 || event.size() < 8 ||
        event.compare(event.size() - 2, 2, "\n\n") != 0 || event.find('\n') != event.size() - 2) {
      Fail("a chunk broke SSE framing");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  CheckOne(body, /*chat=*/false);
  CheckOne(body, /*chat=*/true);
  return 0;
}
