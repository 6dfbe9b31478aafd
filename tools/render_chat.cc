// `kvguard model render-chat [MODEL.gguf] [--chat-template FILE] --messages FILE.json`: prints
// the prompt the model's chat template (`tokenizer.chat_template`, or FILE's instead) makes of
// a chat request's `messages` array, with the generation prompt added; a model without a
// template gets the plain rendering ("role: content" lines, then "assistant: ").
#include "tools/render_chat.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/gguf/gguf.h"
#include "core/service/chat_format.h"
#include "core/text/chat_template.h"
#include "core/text/gguf_chat_template.h"
#include "nlohmann/json.hpp"
#include "tools/flags.h"

namespace kvguard::tools {
namespace {

int Usage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "kvguard model render-chat: %s\n\n", error.c_str());
  std::fprintf(
      stderr,
      "usage: kvguard model render-chat [MODEL.gguf] [--chat-template FILE] --messages FILE\n"
      "  prints the prompt the chat template makes of FILE (a JSON array: the `messages` of a\n"
      "  chat request), with the generation prompt added, and nothing else\n"
      "  MODEL.gguf             its tokenizer.chat_template and BOS/EOS token texts\n"
      "  --chat-template FILE   use FILE's template instead (MODEL.gguf then optional)\n"
      "  --tools FILE           a JSON array: the request's `tools`\n"
      "  --bos-token S, --eos-token S   override the BOS/EOS texts\n"
      "  --var NAME=JSON        another template variable (e.g. enable_thinking=false)\n"
      "  --no-generation-prompt leave out the assistant turn's header\n"
      "  a model without a template (and no --chat-template) gets the plain rendering:\n"
      "  \"role: content\" lines, then \"assistant: \"\n");
  return error.empty() ? 0 : 2;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<nlohmann::ordered_json> ReadJsonArray(const std::string& path,
                                                     const std::string& what) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(*text, nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not JSON"));
  if (!j.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what, " must be a JSON array"));
  }
  return j;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kvguard model render-chat: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int RunRenderChat(const std::vector<std::string>& argv) {
  std::string model, template_path, messages_path, tools_path;
  std::string bos, eos;
  bool bos_set = false, eos_set = false;
  core::ChatInputs inputs;
  inputs.extra = nlohmann::ordered_json::object();
  Args a(argv);
  while (!a.done()) {
    absl::Status s;
    if (a.Flag("--help") || a.Flag("-h")) {
      return Usage("");
    } else if (a.Flag("--chat-template")) {
      s = a.Value(&template_path);
    } else if (a.Flag("--messages")) {
      s = a.Value(&messages_path);
    } else if (a.Flag("--tools")) {
      s = a.Value(&tools_path);
    } else if (a.Flag("--bos-token")) {
      s = a.Value(&bos);
      bos_set = true;
    } else if (a.Flag("--eos-token")) {
      s = a.Value(&eos);
      eos_set = true;
    } else if (a.Flag("--no-generation-prompt")) {
      inputs.add_generation_prompt = false;
    } else if (a.Flag("--var")) {
      std::string var;
      s = a.Value(&var);
      const size_t eq = var.find('=');
      if (s.ok() && (eq == std::string::npos || eq == 0)) {
        s = absl::InvalidArgumentError("--var wants NAME=JSON");
      }
      if (s.ok()) {
        auto value = nlohmann::ordered_json::parse(var.substr(eq + 1), nullptr, false);
        if (value.is_discarded()) {
          s = absl::InvalidArgumentError(absl::StrCat("--var ", var, ": the value is not JSON"));
        } else {
          inputs.extra[var.substr(0, eq)] = value;
        }
      }
    } else if (model.empty() && a.peek().rfind("--", 0) != 0) {
      model = a.peek();
      a.Skip();
    } else {
      return Usage("unknown argument '" + a.peek() + "'");
    }
    if (!s.ok()) return Usage(std::string(s.message()));
  }
  if (messages_path.empty()) return Usage("missing --messages FILE");
  if (model.empty() && template_path.empty()) return Usage("missing MODEL.gguf or --chat-template");

  std::optional<std::string> source;
  if (!model.empty()) {
    absl::StatusOr<std::unique_ptr<core::gguf::File>> file = core::gguf::File::Open(model);
    if (!file.ok()) return Fail(file.status());
    absl::StatusOr<core::GgufChatTemplate> from_gguf = core::ReadGgufChatTemplate(**file);
    if (!from_gguf.ok()) return Fail(from_gguf.status());
    source = from_gguf->source;
    inputs.bos_token = from_gguf->bos_token;
    inputs.eos_token = from_gguf->eos_token;
  }
  if (!template_path.empty()) {
    absl::StatusOr<std::string> text = core::ReadChatTemplateFile(template_path);  // 1 MiB cap
    if (!text.ok()) return Fail(text.status());
    source = *text;
  }
  if (bos_set) inputs.bos_token = bos;
  if (eos_set) inputs.eos_token = eos;
  absl::StatusOr<nlohmann::ordered_json> messages = ReadJsonArray(messages_path, "messages");
  if (!messages.ok()) return Fail(messages.status());
  inputs.messages = *messages;
  if (!tools_path.empty()) {
    absl::StatusOr<nlohmann::ordered_json> tools = ReadJsonArray(tools_path, "tools");
    if (!tools.ok()) return Fail(tools.status());
    inputs.tools = *tools;
  }

  std::string prompt;
  if (!source.has_value()) {
    prompt = core::RenderPlainChat(inputs);
  } else {
    absl::StatusOr<core::ChatTemplate> tmpl = core::ChatTemplate::Parse(*source);
    if (!tmpl.ok()) return Fail(tmpl.status());
    absl::StatusOr<std::string> rendered = core::RenderChat(*tmpl, inputs);
    if (!rendered.ok()) return Fail(rendered.status());
    prompt = *std::move(rendered);
  }
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace kvguard::tools
