#include "core/text/jinja/renderer.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/text/jinja/builtins.h"
#include "core/text/jinja/pystr.h"
#include "core/text/jinja/status_macros.h"

namespace kvguard::core::jinja {
absl::Status WithLine(const absl::Status& s, int line) {
  if (s.ok() || absl::StartsWith(s.message(), "line ")) return s;
  return absl::Status(s.code(), absl::StrCat("line ", line, ": ", s.message()));
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return std::vector<Value>{};
    case Kind::kList:
      return v.list();
    case Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.dict().items.size());
      for (const auto& [k, unused] : v.dict().items) keys.push_back(Value::String(k));
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> chars;
      for (char32_t c : CodePoints(v.str())) {
        std::string s;
        AppendUtf8(c, &s);
        chars.push_back(Value::String(std::move(s)));
      }
      return chars;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("'", v.TypeName(), "' object is not iterable"));
  }
}

const Value* Renderer::Scope::Find(const std::string& name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

Renderer::Renderer(const RenderLimits& limits, const Dict& context)
    : limits_(limits), globals_(std::make_shared<Scope>()) {
  for (const auto& [name, fn] : Globals()) globals_->vars[name] = fn;
  for (const auto& [k, v] : context.items) globals_->vars[k] = v;
}

absl::StatusOr<std::string> Renderer::Run(const Body& body) {
  std::string out;
  out_ = &out;
  auto top = std::make_shared<Scope>();
  top->parent = globals_;
  JINJA_ASSIGN_OR_RETURN(Flow flow, Exec(body, top));
  (void)flow;
  out_ = nullptr;
  return out;
}

absl::Status Renderer::Charge(int64_t steps) {
  steps_ += steps;
  if (steps_ > limits_.max_steps) {
    return absl::ResourceExhaustedError(
        absl::StrCat("template ran past its step limit (", limits_.max_steps, ")"));
  }
  return absl::OkStatus();
}

absl::Status Renderer::CheckSize(size_t size) {
  if (size > limits_.max_output_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("template built a value of ", size,
                                                     " bytes or items, past its output limit (",
                                                     limits_.max_output_bytes, ")"));
  }
  return Charge(int64_t(size / 64));
}

absl::Status Renderer::CheckDepth() const {
  if (depth_ > limits_.max_depth) {
    return absl::ResourceExhaustedError(
        absl::StrCat("template nested past its depth limit (", limits_.max_depth, ")"));
  }
  return absl::OkStatus();
}

absl::Status Renderer::Emit(absl::string_view text) {
  if (out_->size() + text.size() > limits_.max_output_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("template output passed its limit (", limits_.max_output_bytes, " bytes)"));
  }
  absl::StrAppend(out_, text);
  return Charge(int64_t(text.size() / 64));
}

absl::StatusOr<Renderer::Flow> Renderer::Exec(const Body& body, const ScopePtr& scope) {
  for (const StmtPtr& s : body) {
    JINJA_ASSIGN_OR_RETURN(Flow flow, ExecStmt(*s, scope));
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

absl::StatusOr<std::string> Renderer::Capture(const Body& body, const ScopePtr& scope, Flow* flow) {
  std::string captured;
  std::string* saved = out_;
  out_ = &captured;
  auto result = Exec(body, scope);
  out_ = saved;
  if (!result.ok()) return result.status();
  *flow = *result;
  return captured;
}

absl::StatusOr<Renderer::Flow> Renderer::ExecStmt(const Stmt& s, const ScopePtr& scope) {
  Depth depth(this);
  JINJA_RETURN_IF_ERROR(CheckDepth());
  JINJA_RETURN_IF_ERROR(Charge(1));
  absl::StatusOr<Flow> flow = Flow::kNormal;
  switch (s.kind) {
    case StmtKind::kText:
      JINJA_RETURN_IF_ERROR(Emit(s.text));
      break;
    case StmtKind::kPrint: {
      JINJA_ASSIGN_OR_RETURN(Value v, Eval(*s.expr, scope));
      JINJA_RETURN_IF_ERROR(Emit(ToStr(v)));
      break;
    }
    case StmtKind::kIf:
      for (const auto& [cond, body] : s.branches) {
        bool take = cond == nullptr;
        if (!take) {
          JINJA_ASSIGN_OR_RETURN(Value c, Eval(*cond, scope));
          take = c.Truthy();
        }
        if (take) return Exec(body, scope);
      }
      break;
    case StmtKind::kFor:
      flow = ExecFor(s, scope);
      break;
    case StmtKind::kSet:
      if (absl::Status st = ExecSet(s, scope); !st.ok()) return WithLine(st, s.line);
      break;
    case StmtKind::kSetBlock: {
      Flow inner;
      JINJA_ASSIGN_OR_RETURN(std::string text, Capture(s.body, scope, &inner));
      Value v = Value::String(std::move(text));
      if (s.filter) {
        block_input_ = v;
        JINJA_ASSIGN_OR_RETURN(v, Eval(*s.filter, scope));
      }
      scope->vars[s.targets[0]] = std::move(v);
      return inner;
    }
    case StmtKind::kMacro:
      scope->vars[s.name] = MakeMacro(s, scope);
      break;
    case StmtKind::kFilterBlock: {
      Flow inner;
      JINJA_ASSIGN_OR_RETURN(std::string text, Capture(s.body, scope, &inner));
      block_input_ = Value::String(std::move(text));
      JINJA_ASSIGN_OR_RETURN(Value v, Eval(*s.filter, scope));
      JINJA_RETURN_IF_ERROR(Emit(ToStr(v)));
      return inner;
    }
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
    case StmtKind::kBlock:
      return Exec(s.body, scope);
  }
  if (!flow.ok()) return WithLine(flow.status(), s.line);
  return flow;
}

absl::Status Renderer::ExecSet(const Stmt& s, const ScopePtr& scope) {
  JINJA_ASSIGN_OR_RETURN(Value v, Eval(*s.expr, scope));
  if (!s.attr.empty()) {
    const Value* ns = scope->Find(s.targets[0]);
    if (ns == nullptr || ns->kind() != Kind::kNamespace) {
      return absl::InvalidArgumentError(absl::StrCat("cannot assign attribute '", s.attr, "' on '",
                                                     s.targets[0], "': not a namespace"));
    }
    ns->mutable_namespace().Set(s.attr, std::move(v));
    return absl::OkStatus();
  }
  if (s.targets.size() == 1) {
    scope->vars[s.targets[0]] = std::move(v);
    return absl::OkStatus();
  }
  JINJA_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (items.size() != s.targets.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot unpack ", items.size(), " values into ", s.targets.size(), " names"));
  }
  for (size_t i = 0; i < items.size(); ++i) scope->vars[s.targets[i]] = items[i];
  return absl::OkStatus();
}

absl::StatusOr<Renderer::Flow> Renderer::ExecFor(const Stmt& s, const ScopePtr& scope) {
  JINJA_ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr, scope));
  JINJA_ASSIGN_OR_RETURN(std::vector<Value> all, Iterate(iterable));
  auto bind = [&](Scope* target, const Value& item) -> absl::Status {
    if (s.targets.size() == 1) {
      target->vars[s.targets[0]] = item;
      return absl::OkStatus();
    }
    JINJA_ASSIGN_OR_RETURN(std::vector<Value> parts, Iterate(item));
    if (parts.size() != s.targets.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot unpack ", parts.size(), " values into ", s.targets.size(), " loop names"));
    }
    for (size_t i = 0; i < parts.size(); ++i) target->vars[s.targets[i]] = parts[i];
    return absl::OkStatus();
  };
  // The `if` filter runs before the loop, so loop.index and loop.length count what passes.
  std::vector<Value> items;
  if (s.cond) {
    for (const Value& item : all) {
      JINJA_RETURN_IF_ERROR(Charge(1));
      auto probe = std::make_shared<Scope>();
      probe->parent = scope;
      JINJA_RETURN_IF_ERROR(bind(probe.get(), item));
      JINJA_ASSIGN_OR_RETURN(Value keep, Eval(*s.cond, probe));
      if (keep.Truthy()) items.push_back(item);
    }
  } else {
    items = std::move(all);
  }
  // jinja2 runs the else block unless some iteration reached the end of the body: a loop whose
  // every pass ends in break or continue runs it too.
  bool body_completed = false;
  const int64_t n = int64_t(items.size());
  for (int64_t i = 0; i < n; ++i) {
    if (++iterations_ > limits_.max_loop_iterations) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "template ran past its loop iteration limit (", limits_.max_loop_iterations, ")"));
    }
    auto body_scope = std::make_shared<Scope>();
    body_scope->parent = scope;
    JINJA_RETURN_IF_ERROR(bind(body_scope.get(), items[size_t(i)]));
    Dict loop;
    loop.Set("index0", Value::Int(i));
    loop.Set("index", Value::Int(i + 1));
    loop.Set("revindex0", Value::Int(n - i - 1));
    loop.Set("revindex", Value::Int(n - i));
    loop.Set("first", Value::Bool(i == 0));
    loop.Set("last", Value::Bool(i == n - 1));
    loop.Set("length", Value::Int(n));
    loop.Set("depth", Value::Int(1));
    loop.Set("depth0", Value::Int(0));
    loop.Set("previtem",
             i > 0 ? items[size_t(i - 1)] : Value::Undefined("'loop.previtem' is undefined"));
    loop.Set("nextitem",
             i + 1 < n ? items[size_t(i + 1)] : Value::Undefined("'loop.nextitem' is undefined"));
    loop.Set("cycle",
             Value::Function("loop.cycle", [i](Renderer&, CallArgs& args) -> absl::StatusOr<Value> {
               if (args.positional.empty()) {
                 return absl::InvalidArgumentError("loop.cycle needs at least one value");
               }
               return args.positional[size_t(i) % args.positional.size()];
             }));
    body_scope->vars["loop"] = Value::Namespace(std::move(loop));
    JINJA_ASSIGN_OR_RETURN(Flow flow, Exec(s.body, body_scope));
    if (flow == Flow::kNormal) body_completed = true;
    if (flow == Flow::kBreak) break;
  }
  if (!body_completed && !s.else_body.empty()) {
    auto else_scope = std::make_shared<Scope>();
    else_scope->parent = scope;
    JINJA_ASSIGN_OR_RETURN(Flow flow, Exec(s.else_body, else_scope));
    (void)flow;
  }
  return Flow::kNormal;
}

Value Renderer::MakeMacro(const Stmt& s, const ScopePtr& scope) {
  // The macro holds its defining scope (a weak cycle otherwise: the scope holds the macro).
  std::weak_ptr<Scope> weak_scope = scope;
  const Stmt* def = &s;
  return Value::Function(
      s.name, [def, weak_scope](Renderer& r, CallArgs& args) -> absl::StatusOr<Value> {
        ScopePtr parent = weak_scope.lock();
        if (!parent) {
          return absl::InvalidArgumentError(
              absl::StrCat("macro '", def->name, "' outlived its scope"));
        }
        if (args.positional.size() > def->targets.size()) {
          return absl::InvalidArgumentError(absl::StrCat("macro '", def->name, "' takes at most ",
                                                         def->targets.size(), " arguments"));
        }
        auto scope = std::make_shared<Scope>();
        scope->parent = parent;
        std::vector<bool> bound(def->targets.size(), false);
        for (size_t i = 0; i < args.positional.size(); ++i) {
          scope->vars[def->targets[i]] = args.positional[i];
          bound[i] = true;
        }
        for (auto& [key, value] : args.keyword) {
          size_t i = 0;
          while (i < def->targets.size() && def->targets[i] != key) ++i;
          if (i == def->targets.size()) {
            return absl::InvalidArgumentError(
                absl::StrCat("macro '", def->name, "' has no parameter '", key, "'"));
          }
          if (bound[i]) {
            return absl::InvalidArgumentError(
                absl::StrCat("macro '", def->name, "' got '", key, "' twice"));
          }
          scope->vars[key] = value;
          bound[i] = true;
        }
        for (size_t i = 0; i < def->targets.size(); ++i) {
          if (bound[i]) continue;
          if (def->defaults[i]) {
            JINJA_ASSIGN_OR_RETURN(Value v, r.Eval(*def->defaults[i], scope));
            scope->vars[def->targets[i]] = std::move(v);
          } else {
            scope->vars[def->targets[i]] = Value::Undefined(
                absl::StrCat("parameter '", def->targets[i], "' was not provided"));
          }
        }
        Flow flow;
        JINJA_ASSIGN_OR_RETURN(std::string text, r.Capture(def->body, scope, &flow));
        return Value::String(std::move(text));
      });
}

}  // namespace kvguard::core::jinja
