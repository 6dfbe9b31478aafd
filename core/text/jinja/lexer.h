// core/text/jinja/lexer.h: template source -> tokens, with jinja2's whitespace rules as
// HuggingFace configures them (trim_blocks, lstrip_blocks, keep_trailing_newline off).
//
// Newlines are normalised first (\r\n and \r become \n) and one trailing newline dropped, as
// jinja2 does. Text between tags becomes one kText token; `{{ ... }}` and `{% ... %}` become a
// begin token, the expression tokens, an end token; comments vanish. `{%- `/` -%}` strip the
// whitespace beside the tag; trim_blocks drops the first newline after `%}` and `#}`;
// lstrip_blocks drops spaces and tabs before `{%` and `{#` on their line (not before `{{`, and
// not after `{%+`).
#ifndef KVGUARD_CORE_TEXT_JINJA_LEXER_H_
#define KVGUARD_CORE_TEXT_JINJA_LEXER_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvguard::core::jinja {

enum class Tok {
  kText,        // text: the raw output
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // text: identifier
  kString,      // text: the literal's value, escapes resolved
  kInt,         // text: digits (underscores removed)
  kFloat,       // text: the literal
  kOp,          // text: operator or punctuation
  kEof,
};

struct Token {
  Tok kind;
  std::string text;
  int line;
};

// Tokenize returns the tokens of `source`, or InvalidArgument naming the line of an
// unterminated tag, comment or string, or an unexpected character.
absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source);

}  // namespace kvguard::core::jinja

#endif  // KVGUARD_CORE_TEXT_JINJA_LEXER_H_
