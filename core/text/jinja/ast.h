// core/text/jinja/ast.h: the parsed template: statements holding expressions.
//
// One node type per family with the operands in `children`, so the parser and the renderer read
// as two switch statements; the comment on each kind says what its children are.
#ifndef KVGUARD_CORE_TEXT_JINJA_AST_H_
#define KVGUARD_CORE_TEXT_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/text/jinja/value.h"

namespace kvguard::core::jinja {

enum class ExprKind {
  kLiteral,     // literal
  kName,        // name
  kList,        // children: items
  kTuple,       // children: items
  kDict,        // children: key, value, key, value, ...
  kAttr,        // children: [object]; name: the attribute (`x.name`)
  kItem,        // children: [object, index] (`x[i]`)
  kSlice,       // children: [object, start, stop, step], absent ones null (`x[a:b:c]`)
  kCall,        // children: [callee, args...]; kwargs
  kFilter,      // children: [input, args...]; kwargs; name: the filter
  kTest,        // children: [input, args...]; kwargs; name: the test; negated: `is not`
  kNot,         // children: [operand]
  kNeg,         // children: [operand]
  kPos,         // children: [operand]
  kBinary,      // children: [left, right]; name: + - * / // % ** ~
  kAnd,         // children: [left, right]
  kOr,          // children: [left, right]
  kCompare,     // children: [first, operand...]; ops: == != < <= > >= in notin, one per operand
  kCond,        // children: [then, condition, else or null] (`a if c else b`)
  kBlockInput,  // the body text of `{% filter %}` / `{% set x | f %}`, for their filter chain
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  int line = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> children;
  std::vector<std::string> ops;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;
};

enum class StmtKind {
  kText,         // text
  kPrint,        // expr (`{{ expr }}`)
  kIf,           // branches: (condition, body)...; the else branch has a null condition
  kFor,          // targets `in` expr [`if` cond]; body; else_body
  kSet,          // targets (names; one name plus attr for `ns.attr`) = expr
  kSetBlock,     // targets[0]; body; filter (over kBlockInput) or null
  kMacro,        // name; targets: parameters; defaults (null: required); body
  kFilterBlock,  // filter (over kBlockInput); body
  kBreak,
  kContinue,
  kBlock,  // body (`{% generation %}`: HuggingFace's marker, rendered as its body)
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  std::string name;
  std::string attr;
  ExprPtr expr;
  ExprPtr cond;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::vector<ExprPtr> defaults;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
};

}  // namespace kvguard::core::jinja

#endif  // KVGUARD_CORE_TEXT_JINJA_AST_H_
