#include "core/text/chat_template.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/text/jinja/ast.h"
#include "core/text/jinja/builtins.h"
#include "core/text/jinja/lexer.h"
#include "core/text/jinja/parser.h"
#include "core/text/jinja/renderer.h"

namespace kvguard::core {

struct ChatTemplate::Program {
  jinja::Body body;
};

namespace {

absl::Status Prefixed(const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("chat template: ", s.message()));
}

// CheckNames refuses a filter or test name that no builtin has, wherever it stands (jinja2
// refuses those when it compiles the template, before rendering anything).
absl::Status CheckNames(const jinja::Expr& e) {
  if (e.kind == jinja::ExprKind::kFilter && jinja::FindFilter(e.name) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("line ", e.line, ": no filter named '", e.name, "'"));
  }
  if (e.kind == jinja::ExprKind::kTest && jinja::FindTest(e.name) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("line ", e.line, ": no test named '", e.name, "'"));
  }
  for (const jinja::ExprPtr& c : e.children) {
    if (c) {
      if (absl::Status s = CheckNames(*c); !s.ok()) return s;
    }
  }
  for (const auto& [unused, c] : e.kwargs) {
    if (absl::Status s = CheckNames(*c); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckNames(const jinja::Body& body) {
  for (const jinja::StmtPtr& s : body) {
    for (const jinja::Expr* e : {s->expr.get(), s->cond.get(), s->filter.get()}) {
      if (e != nullptr) {
        if (absl::Status st = CheckNames(*e); !st.ok()) return st;
      }
    }
    for (const jinja::ExprPtr& d : s->defaults) {
      if (d) {
        if (absl::Status st = CheckNames(*d); !st.ok()) return st;
      }
    }
    for (const auto& [cond, branch] : s->branches) {
      if (cond) {
        if (absl::Status st = CheckNames(*cond); !st.ok()) return st;
      }
      if (absl::Status st = CheckNames(branch); !st.ok()) return st;
    }
    if (absl::Status st = CheckNames(s->body); !st.ok()) return st;
    if (absl::Status st = CheckNames(s->else_body); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  absl::StatusOr<std::vector<jinja::Token>> tokens =
      jinja::Tokenize(absl::string_view(source.data(), source.size()));
  if (!tokens.ok()) return Prefixed(tokens.status());
  absl::StatusOr<jinja::Body> body = jinja::Parse(*tokens);
  if (!body.ok()) return Prefixed(body.status());
  if (absl::Status s = CheckNames(*body); !s.ok()) return Prefixed(s);
  auto program = std::make_shared<Program>();
  program->body = *std::move(body);
  return ChatTemplate(std::move(program));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context,
                                                 const ChatTemplateLimits& limits) const {
  if (!context.is_object()) {
    return absl::InvalidArgumentError("chat template: the context must be a JSON object");
  }
  jinja::Dict vars;
  for (const auto& [k, v] : context.items()) vars.Set(k, jinja::FromJson(v));
  jinja::RenderLimits l;
  l.max_steps = limits.max_steps;
  l.max_depth = limits.max_depth;
  l.max_output_bytes = limits.max_output_bytes;
  l.max_loop_iterations = limits.max_loop_iterations;
  jinja::Renderer renderer(l, vars);
  absl::StatusOr<std::string> out = renderer.Run(program_->body);
  if (!out.ok()) return Prefixed(out.status());
  return out;
}

nlohmann::ordered_json ChatContext(const ChatInputs& inputs) {
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = inputs.messages;
  if (!inputs.tools.is_null()) context["tools"] = inputs.tools;
  context["add_generation_prompt"] = inputs.add_generation_prompt;
  context["bos_token"] = inputs.bos_token;
  context["eos_token"] = inputs.eos_token;
  if (inputs.extra.is_object()) {
    for (const auto& [k, v] : inputs.extra.items()) context[k] = v;
  }
  return context;
}

absl::StatusOr<std::string> RenderChat(const ChatTemplate& tmpl, const ChatInputs& inputs,
                                       const ChatTemplateLimits& limits) {
  return tmpl.Render(ChatContext(inputs), limits);
}

std::string RenderPlainChat(const ChatInputs& inputs) {
  std::string out;
  for (const auto& m : inputs.messages) {
    const auto role = m.find("role");
    const auto content = m.find("content");
    absl::StrAppend(&out, role != m.end() && role->is_string() ? role->get<std::string>() : "",
                    ": ");
    if (content != m.end() && content->is_string()) {
      absl::StrAppend(&out, content->get<std::string>());
    } else if (content != m.end() && !content->is_null()) {
      absl::StrAppend(&out, content->dump());
    }
    out += "\n";
  }
  if (inputs.add_generation_prompt) out += "assistant: ";
  return out;
}

}  // namespace kvguard::core
