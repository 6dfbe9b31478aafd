// core/text/chat_template.h: chat templates (the Jinja text a GGUF carries as
// `tokenizer.chat_template`) turned into prompts, by a sandboxed Jinja subset of our own.
//
// Design. The template is untrusted input from a model file, so it gets its own small
// interpreter rather than a general one: core/text/jinja/ holds the lexer (whitespace rules),
// parser (the grammar, to an AST), renderer (scopes, limits) and builtins (filters, tests,
// methods, globals). The language is jinja2's as HuggingFace's apply_chat_template runs it:
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
// extension, the globals `raise_exception` and `strftime_now`, and `tojson` as HuggingFace
// defines it (ensure_ascii off, indent optional). It covers the statements, filters and tests
// real templates use (README.md, "Chat templates", lists them and the templates checked
// byte-for-byte against jinja2). An unsupported tag, filter or test is refused at Parse; an
// unsupported method or a type error refuses the render (no partial prompt is returned).
//
// Bounds: parsing is linear with a nesting cap; rendering counts steps, loop iterations,
// evaluation depth (macro recursion included) and output bytes, and any string or list it
// builds is capped at the output limit, so a template can neither hang nor exhaust memory.
// Every failure is a Status: InvalidArgument for a bad template or one that raises (the request
// is refused with that message), ResourceExhausted for a template that passes a limit.
//
// Use: parse once per model (ChatTemplate::Parse; a GGUF's template and BOS/EOS texts come from
// gguf_chat_template.h), render per request (RenderChat; RenderPlainChat when the model has no
// template). A parsed template is immutable and may be rendered from many threads at once.
#ifndef KVGUARD_CORE_TEXT_CHAT_TEMPLATE_H_
#define KVGUARD_CORE_TEXT_CHAT_TEMPLATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvguard::core {

struct ChatTemplateLimits {
  int64_t max_steps = 2'000'000;          // statements and expressions evaluated
  int max_depth = 200;                    // nesting of evaluation, macro calls included
  size_t max_output_bytes = 8u << 20;     // the prompt, and any one string or list built
  int64_t max_loop_iterations = 200'000;  // all loops together
};

// ChatInputs: what a chat request gives the template. JSON objects keep their key order
// (ordered_json), as `tojson` of a tool's schema must print keys in the order they came: take
// `messages` and `tools` from the request body parsed as ordered_json (nlohmann::json sorts
// keys, and HuggingFace's output follows the client's order).
struct ChatInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null: no tools (the template sees `tools` undefined)
  bool add_generation_prompt = true;
  std::string bos_token;
  std::string eos_token;
  // extra: further variables (e.g. {"enable_thinking": false}); an object or null.
  nlohmann::ordered_json extra;
};

class ChatTemplate {
 public:
  // Parse returns the template compiled from `source`, or InvalidArgument naming the line and
  // the problem (syntax, an unsupported tag, nesting past the cap, invalid UTF-8).
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source);

  // Render returns the text the template produces for the variables of `context` (a JSON
  // object), or InvalidArgument / ResourceExhausted as above.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context,
                                     const ChatTemplateLimits& limits = {}) const;

 private:
  struct Program;
  explicit ChatTemplate(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;
};

// ChatContext: the variables HuggingFace gives a chat template: messages, tools (when given),
// add_generation_prompt, bos_token, eos_token, then `extra`'s.
nlohmann::ordered_json ChatContext(const ChatInputs& inputs);

// RenderChat: the prompt for `inputs` (Render over ChatContext(inputs)).
absl::StatusOr<std::string> RenderChat(const ChatTemplate& tmpl, const ChatInputs& inputs,
                                       const ChatTemplateLimits& limits = {});

// RenderPlainChat: the prompt for models without a template: each message as
// "<role>: <content>\n", then "assistant: " when add_generation_prompt. Content that is not a
// string is printed as JSON.
std::string RenderPlainChat(const ChatInputs& inputs);

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_TEXT_CHAT_TEMPLATE_H_
