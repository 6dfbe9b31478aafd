// fuzz/chat_template_fuzzer.cc: the chat-template renderer (core/text/chat_template.h) on
// arbitrary templates, the untrusted text a GGUF file carries.
//
// The first bytes pick small limits (steps, depth, output bytes, loop iterations) and which of
// a few fixed conversations to render; the rest is the template. Oracles: no crash, hang or
// sanitizer report; a refusal is InvalidArgument or ResourceExhausted with a "chat template: "
// message (never another code, never empty); a render that succeeds stays within the output
// limit and renders the same text again (no state leaks between renders of a template).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "core/text/chat_template.h"
#include "fuzzer/FuzzedDataProvider.h"
#include "nlohmann/json.hpp"

namespace {

[[noreturn]] void Oracle(const char* name, const std::string& why) {
  std::fprintf(stderr, "==kvguard-fuzz== ORACLE %s: %s\n", name, why.c_str());
  std::abort();
}

void CheckRefusal(const absl::Status& s, const char* where) {
  if (s.code() != absl::StatusCode::kInvalidArgument &&
      s.code() != absl::StatusCode::kResourceExhausted) {
    Oracle("chat-template-error-kind", std::string(where) + ": " + s.ToString());
  }
  if (!absl::StartsWith(s.message(), "chat template: ") || s.message().size() < 20) {
    Oracle("chat-template-error-message", std::string(where) + ": " + s.ToString());
  }
}

kvguard::core::ChatInputs Conversation(int which) {
  using json = nlohmann::ordered_json;
  kvguard::core::ChatInputs in;
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.messages = json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi \u00e9\u6f22 \ud83e\udd99"},
    {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello", "tool_calls": [
      {"id": "c1", "type": "function",
       "function": {"name": "f", "arguments": {"x": 1, "y": [true, null, 2.5]}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"ok\": 1}"},
    {"role": "user", "content": ""}])");
  if (which & 1) {
    in.tools = json::parse(R"([{"type": "function", "function": {"name": "f",
      "description": "d", "parameters": {"type": "object", "properties": {"x": {"type":
      "integer"}}, "required": ["x"]}}}])");
  }
  if (which & 2) in.messages = json::array();
  in.add_generation_prompt = (which & 4) == 0;
  return in;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  kvguard::core::ChatTemplateLimits limits;
  limits.max_steps = in.ConsumeIntegralInRange<int64_t>(1, 20000);
  limits.max_depth = in.ConsumeIntegralInRange<int>(1, 64);
  limits.max_output_bytes = in.ConsumeIntegralInRange<size_t>(0, 1 << 16);
  limits.max_loop_iterations = in.ConsumeIntegralInRange<int64_t>(0, 2000);
  const int which = in.ConsumeIntegralInRange<int>(0, 7);
  const std::string source = in.ConsumeRemainingBytesAsString();

  absl::StatusOr<kvguard::core::ChatTemplate> tmpl = kvguard::core::ChatTemplate::Parse(source);
  if (!tmpl.ok()) {
    CheckRefusal(tmpl.status(), "parse");
    return 0;
  }
  const kvguard::core::ChatInputs inputs = Conversation(which);
  absl::StatusOr<std::string> out = kvguard::core::RenderChat(*tmpl, inputs, limits);
  if (!out.ok()) {
    CheckRefusal(out.status(), "render");
    return 0;
  }
  if (out->size() > limits.max_output_bytes) {
    Oracle("chat-template-output-limit", std::to_string(out->size()) + " bytes past a limit of " +
                                             std::to_string(limits.max_output_bytes));
  }
  // strftime_now reads the clock, so a second render may differ across a second boundary.
  if (source.find("strftime_now") == std::string::npos) {
    absl::StatusOr<std::string> again = kvguard::core::RenderChat(*tmpl, inputs, limits);
    if (!again.ok() || *again != *out) {
      Oracle("chat-template-deterministic", "a second render of the same inputs differs");
    }
  }
  return 0;
}
