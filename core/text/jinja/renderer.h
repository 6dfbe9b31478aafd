// core/text/jinja/renderer.h: runs a parsed template over a context, within hard bounds.
//
// A tree walk over ast.h's statements and expressions with jinja2's semantics (default
// Undefined: printing, testing and iterating an undefined name is quiet, reading an attribute
// of one is an error). Scopes follow jinja2: `for` bodies and macros get their own, `if` does
// not; `namespace()` objects are the one thing a loop body can write through.
//
// Every step (statement or expression evaluated) is counted, as are loop iterations, the
// nesting of evaluation (macro recursion included) and the bytes of every string built; each
// has a limit and passing one ends the render with ResourceExhausted. Errors in the template
// (undefined attributes, type errors, raise_exception) end it with InvalidArgument naming the
// line. Nothing the template does can reach outside the context it is given.
#ifndef KVGUARD_CORE_TEXT_JINJA_RENDERER_H_
#define KVGUARD_CORE_TEXT_JINJA_RENDERER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/text/jinja/ast.h"
#include "core/text/jinja/value.h"

namespace kvguard::core::jinja {

struct RenderLimits {
  int64_t max_steps = 0;
  int max_depth = 0;
  size_t max_output_bytes = 0;  // also the largest string or list any step may build
  int64_t max_loop_iterations = 0;
};

class Renderer {
 public:
  Renderer(const RenderLimits& limits, const Dict& context);

  // Run renders `body`; the output, or the first error.
  absl::StatusOr<std::string> Run(const Body& body);

  // For the builtins (builtins.cc).
  const RenderLimits& limits() const { return limits_; }
  // Charge counts `steps` more steps; ResourceExhausted past max_steps.
  absl::Status Charge(int64_t steps);
  // CheckSize refuses a string or list of `size` bytes or items past max_output_bytes, and
  // charges one step per 64 of them (building it took that long).
  absl::Status CheckSize(size_t size);
  // Call calls `fn` (a callable Value) with `args`.
  absl::StatusOr<Value> Call(const Value& fn, CallArgs& args);
  // Attr: `obj.name` (jinja2's getattr: attribute, then item; Undefined when neither).
  absl::StatusOr<Value> Attr(const Value& obj, const std::string& name);
  // ApplyFilter / ApplyTest: the named builtin filter or test.
  absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& input, CallArgs& args);
  absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& input, CallArgs& args);

 private:
  struct Scope {
    std::shared_ptr<Scope> parent;
    absl::flat_hash_map<std::string, Value> vars;
    const Value* Find(const std::string& name) const;
  };
  using ScopePtr = std::shared_ptr<Scope>;
  enum class Flow { kNormal, kBreak, kContinue };

  absl::StatusOr<Flow> Exec(const Body& body, const ScopePtr& scope);
  absl::StatusOr<Flow> ExecStmt(const Stmt& s, const ScopePtr& scope);
  absl::StatusOr<Flow> ExecFor(const Stmt& s, const ScopePtr& scope);
  absl::Status ExecSet(const Stmt& s, const ScopePtr& scope);
  Value MakeMacro(const Stmt& s, const ScopePtr& scope);
  // Capture renders `body` into a string of its own (block set, filter block, macro call).
  absl::StatusOr<std::string> Capture(const Body& body, const ScopePtr& scope, Flow* flow);
  absl::Status Emit(absl::string_view text);

  absl::StatusOr<Value> Eval(const Expr& e, const ScopePtr& scope);
  absl::StatusOr<Value> EvalInner(const Expr& e, const ScopePtr& scope);
  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first, const ScopePtr& scope);
  absl::StatusOr<Value> Binary(const std::string& op, const Value& a, const Value& b);
  absl::StatusOr<Value> Item(const Value& obj, const Value& index);
  absl::StatusOr<Value> Slice(const Value& obj, const Value& start, const Value& stop,
                              const Value& step);
  absl::StatusOr<bool> Contains(const Value& container, const Value& item);

  // Depth guards recursion: one level per statement and expression being evaluated.
  struct Depth {
    explicit Depth(Renderer* r) : r(r) { ++r->depth_; }
    ~Depth() { --r->depth_; }
    Renderer* r;
  };
  absl::Status CheckDepth() const;

  RenderLimits limits_;
  ScopePtr globals_;
  std::string* out_ = nullptr;
  int64_t steps_ = 0;
  int64_t iterations_ = 0;
  int depth_ = 0;
  Value block_input_;  // the captured body a {% filter %} chain starts from
};

// WithLine prefixes an error with the template line it happened on, once: the innermost
// statement or expression that fails names it.
absl::Status WithLine(const absl::Status& s, int line);

// Iterate: the items `for` walks over `v` (list items, dict keys, string characters; nothing
// for Undefined), or an error for values that are not iterable.
absl::StatusOr<std::vector<Value>> Iterate(const Value& v);

}  // namespace kvguard::core::jinja

#endif  // KVGUARD_CORE_TEXT_JINJA_RENDERER_H_
