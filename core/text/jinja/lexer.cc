#include "core/text/jinja/lexer.h"

#include <cctype>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/text/jinja/pystr.h"

namespace kvguard::core::jinja {
namespace {

absl::Status Error(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", what));
}

// SpaceAt: the byte length of the whitespace code point at `pos` (Python's \s), or 0.
size_t SpaceAt(absl::string_view s, size_t pos) {
  if (pos >= s.size()) return 0;
  const unsigned char c = s[pos];
  if (c < 0x80) return IsPySpace(c) ? 1 : 0;
  char32_t cp = 0;
  const size_t n = core::Utf8SequenceAt(std::string_view(s.data(), s.size()), pos, &cp);
  return n > 0 && IsPySpace(cp) ? n : 0;
}

size_t SkipSpace(absl::string_view s, size_t pos) {
  while (size_t n = SpaceAt(s, pos)) pos += n;
  return pos;
}

// Unescape resolves a string literal's escapes as Python's unicode-escape codec does (jinja2
// decodes literals with it): unknown escapes stay as written.
absl::StatusOr<std::string> Unescape(absl::string_view body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out.push_back(body[i]);
      continue;
    }
    const char e = body[++i];
    auto hex = [&](int digits) -> absl::StatusOr<char32_t> {
      if (i + digits >= body.size()) {
        return Error(line, "truncated \\x, \\u or \\U escape in a string");
      }
      char32_t v = 0;
      for (int k = 1; k <= digits; ++k) {
        const char h = body[i + k];
        if (!std::isxdigit(static_cast<unsigned char>(h))) {
          return Error(line, "bad \\x, \\u or \\U escape in a string");
        }
        v = v * 16 + char32_t(std::isdigit(static_cast<unsigned char>(h))
                                  ? h - '0'
                                  : std::tolower(static_cast<unsigned char>(h)) - 'a' + 10);
      }
      i += digits;
      return v;
    };
    char32_t cp;
    switch (e) {
      case 'n':
        out.push_back('\n');
        continue;
      case 't':
        out.push_back('\t');
        continue;
      case 'r':
        out.push_back('\r');
        continue;
      case '\\':
        out.push_back('\\');
        continue;
      case '\'':
        out.push_back('\'');
        continue;
      case '"':
        out.push_back('"');
        continue;
      case 'a':
        out.push_back('\a');
        continue;
      case 'b':
        out.push_back('\b');
        continue;
      case 'f':
        out.push_back('\f');
        continue;
      case 'v':
        out.push_back('\v');
        continue;
      case '\n':
        continue;
      case 'x': {
        auto v = hex(2);
        if (!v.ok()) return v.status();
        cp = *v;
        break;
      }
      case 'u': {
        auto v = hex(4);
        if (!v.ok()) return v.status();
        cp = *v;
        break;
      }
      case 'U': {
        auto v = hex(8);
        if (!v.ok()) return v.status();
        cp = *v;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          cp = char32_t(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k) {
            cp = cp * 8 + char32_t(body[++i] - '0');
          }
          break;
        }
        out.push_back('\\');
        out.push_back(e);
        continue;
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return Error(line, "string escape names no Unicode scalar value");
    }
    AppendUtf8(cp, &out);
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t open = pos;
      while (true) {
        open = src_.find('{', open);
        if (open == std::string::npos || open + 1 >= src_.size()) {
          open = std::string::npos;
          break;
        }
        const char c = src_[open + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++open;
      }
      if (open == std::string::npos) {
        Text(absl::string_view(src_).substr(pos));
        break;
      }
      const char type = src_[open + 1];
      const char sign = open + 2 < src_.size() ? src_[open + 2] : '\0';
      absl::string_view text = absl::string_view(src_).substr(pos, open - pos);
      if (sign == '-') {
        size_t end = text.size();
        // rstrip: walk back over whitespace code points.
        while (end > 0) {
          size_t start = end - 1;
          while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
          if (SpaceAt(text, start) != end - start) break;
          end = start;
        }
        text = text.substr(0, end);
      } else if (sign != '+' && type != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == absl::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            SkipSpace(text, l_pos) == text.size()) {
          text = text.substr(0, l_pos);
        }
      }
      Text(text);
      line_ = LineAt(open);
      pos = open + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      size_t end_pos;
      if (type == '#') {
        const size_t close = src_.find("#}", pos);
        if (close == std::string::npos) return Error(line_, "unterminated comment");
        end_pos = close + 2;
        if (close > pos && src_[close - 1] == '-') {
          end_pos = SkipSpace(src_, end_pos);
        } else if (end_pos < src_.size() && src_[end_pos] == '\n') {
          ++end_pos;
        }
      } else {
        auto r = Expression(pos, type == '%');
        if (!r.ok()) return r.status();
        end_pos = *r;
      }
      line_starting = end_pos > 0 && src_[end_pos - 1] == '\n';
      pos = end_pos;
    }
    tokens_.push_back(Token{Tok::kEof, "", LineAt(src_.size())});
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t pos) {
    // Lines are counted incrementally: positions only move forward.
    while (line_pos_ < pos && line_pos_ < src_.size()) {
      line_count_ += src_[line_pos_] == '\n';
      ++line_pos_;
    }
    return line_count_;
  }

  void Text(absl::string_view text) {
    if (!text.empty()) tokens_.push_back(Token{Tok::kText, std::string(text), line_});
  }

  // Expression lexes from `pos` (just past `{{` or `{%`) to the closing tag; returns the
  // position after it (and the whitespace it strips).
  absl::StatusOr<size_t> Expression(size_t pos, bool block) {
    tokens_.push_back(Token{block ? Tok::kBlockBegin : Tok::kVarBegin, "", LineAt(pos)});
    std::string balance;
    const absl::string_view s = src_;
    while (true) {
      pos = SkipSpace(s, pos);
      const int line = LineAt(pos);
      if (pos >= s.size()) return Error(line, block ? "unterminated '{%'" : "unterminated '{{'");
      if (balance.empty()) {
        const absl::string_view close = block ? "%}" : "}}";
        if (s.substr(pos, 3) == absl::StrCat("-", close)) {
          tokens_.push_back(Token{block ? Tok::kBlockEnd : Tok::kVarEnd, "", line});
          return SkipSpace(s, pos + 3);
        }
        if (block && s.substr(pos, 3) == "+%}") {
          tokens_.push_back(Token{Tok::kBlockEnd, "", line});
          return pos + 3;
        }
        if (s.substr(pos, 2) == close) {
          tokens_.push_back(Token{block ? Tok::kBlockEnd : Tok::kVarEnd, "", line});
          pos += 2;
          if (block && pos < s.size() && s[pos] == '\n') ++pos;
          return pos;
        }
      }
      const char c = s[pos];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos;
        while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) {
          ++e;
        }
        tokens_.push_back(Token{Tok::kName, std::string(s.substr(pos, e - pos)), line});
        pos = e;
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        pos = Number(pos, line);
        // Python (and so jinja2) reads "010" as no number at all: leading zeros need a float.
        const std::string& digits = tokens_.back().text;
        if (tokens_.back().kind == Tok::kInt && digits.size() > 1 && digits[0] == '0' &&
            digits.find_first_not_of('0') != std::string::npos) {
          return Error(line, absl::StrCat("leading zeros in the integer literal '", digits, "'"));
        }
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t e = pos + 1;
        while (e < s.size() && s[e] != c) e += s[e] == '\\' ? 2 : 1;
        if (e >= s.size()) return Error(line, "unterminated string");
        auto value = Unescape(s.substr(pos + 1, e - pos - 1), line);
        if (!value.ok()) return value.status();
        tokens_.push_back(Token{Tok::kString, *std::move(value), line});
        pos = e + 1;
        continue;
      }
      static constexpr absl::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
      bool two = false;
      for (absl::string_view op : kTwo) {
        if (s.substr(pos, 2) == op) {
          tokens_.push_back(Token{Tok::kOp, std::string(op), line});
          pos += 2;
          two = true;
          break;
        }
      }
      if (two) continue;
      static constexpr absl::string_view kOne = "+-/*%~[](){}<>=.:|,";
      if (kOne.find(c) == absl::string_view::npos) {
        return Error(line, absl::StrCat("unexpected character '", std::string(1, c), "' in a tag"));
      }
      if (c == '(' || c == '[' || c == '{') balance.push_back(c);
      if (c == ')' || c == ']' || c == '}') {
        const char want = c == ')' ? '(' : c == ']' ? '[' : '{';
        if (balance.empty() || balance.back() != want) {
          return Error(line, absl::StrCat("unbalanced '", std::string(1, c), "'"));
        }
        balance.pop_back();
      }
      tokens_.push_back(Token{Tok::kOp, std::string(1, c), line});
      ++pos;
    }
  }

  size_t Number(size_t pos, int line) {
    const absl::string_view s = src_;
    auto digits = [&](size_t p) {
      while (p < s.size() && (std::isdigit(static_cast<unsigned char>(s[p])) ||
                              (s[p] == '_' && p + 1 < s.size() &&
                               std::isdigit(static_cast<unsigned char>(s[p + 1]))))) {
        ++p;
      }
      return p;
    };
    size_t e = digits(pos);
    bool is_float = false;
    // A float needs digits after the dot, and none follows an attribute dot (`x.0.1`).
    const bool after_dot = pos > 0 && s[pos - 1] == '.';
    if (!after_dot && e + 1 < s.size() && s[e] == '.' &&
        std::isdigit(static_cast<unsigned char>(s[e + 1]))) {
      e = digits(e + 1);
      is_float = true;
    }
    if (!after_dot && e < s.size() && (s[e] == 'e' || s[e] == 'E')) {
      size_t p = e + 1;
      if (p < s.size() && (s[p] == '+' || s[p] == '-')) ++p;
      if (p < s.size() && std::isdigit(static_cast<unsigned char>(s[p]))) {
        e = digits(p);
        is_float = true;
      }
    }
    std::string text;
    for (char ch : s.substr(pos, e - pos)) {
      if (ch != '_') text.push_back(ch);
    }
    tokens_.push_back(Token{is_float ? Tok::kFloat : Tok::kInt, std::move(text), line});
    return e;
  }

  std::string src_;
  std::vector<Token> tokens_;
  int line_ = 1;
  size_t line_pos_ = 0;
  int line_count_ = 1;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source) {
  if (!IsValidUtf8(source)) return absl::InvalidArgumentError("template is not valid UTF-8");
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src.push_back(source[i]);
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src)).Run();
}

}  // namespace kvguard::core::jinja
