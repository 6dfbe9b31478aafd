// core/text/jinja/parser.h: tokens -> statements, by jinja2's grammar and operator precedence
// (loosest first: `if`-expressions, or, and, not, comparisons, + -, ~, * / // %, **, unary
// minus, then primaries with `.attr`, `[index]`, `(call)`, `| filter` and `is test`).
//
// Tags: if/elif/else, for (with `if` filter and `else`), set (names, tuples, `ns.attr`, block
// set), macro, filter, break/continue, generation. Anything else, and nesting past
// kMaxNesting, is an error: the template is refused at load, never half-run.
#ifndef KVGUARD_CORE_TEXT_JINJA_PARSER_H_
#define KVGUARD_CORE_TEXT_JINJA_PARSER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "core/text/jinja/ast.h"
#include "core/text/jinja/lexer.h"

namespace kvguard::core::jinja {

// kMaxNesting bounds how deep expressions and blocks nest (the parser and renderer recurse
// once per level); real templates stay under 20.
inline constexpr int kMaxNesting = 100;

// Parse returns the statements of `tokens` (Tokenize's output), or InvalidArgument naming the
// line and what was expected.
absl::StatusOr<Body> Parse(const std::vector<Token>& tokens);

}  // namespace kvguard::core::jinja

#endif  // KVGUARD_CORE_TEXT_JINJA_PARSER_H_
