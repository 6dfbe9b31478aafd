// core/text/jinja/pystr.h: Python's str semantics over UTF-8: strings are sequences of code
// points (len, indexing and slicing count them), and str.strip()/split() know Unicode
// whitespace. Case mapping (upper/lower/title/capitalize) is ASCII only: other letters are
// kept as they are (documented in README.md, "Chat templates").
#ifndef KVGUARD_CORE_TEXT_JINJA_PYSTR_H_
#define KVGUARD_CORE_TEXT_JINJA_PYSTR_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/text/utf8.h"

namespace kvguard::core::jinja {

// The one UTF-8 codec (core/text/utf8.h), over Abseil's string_view (Debian's is its own type).
using core::AppendUtf8;
inline bool IsValidUtf8(absl::string_view s) {
  return core::IsValidUtf8(std::string_view(s.data(), s.size()));
}

// CodePoints: the code points of valid UTF-8 `s`.
std::vector<char32_t> CodePoints(absl::string_view s);

// EncodeUtf8: the UTF-8 of cps[begin, end).
std::string EncodeUtf8(const std::vector<char32_t>& cps, size_t begin, size_t end);

// CodePointCount: len(s).
size_t CodePointCount(absl::string_view s);

// IsPySpace: str.isspace() for one code point.
bool IsPySpace(char32_t c);

// PyStrip: str.strip/lstrip/rstrip with `chars` (nullptr: whitespace).
std::string PyStrip(absl::string_view s, const std::string* chars, bool left, bool right);

// PySplit: str.split(sep, maxsplit); sep nullptr splits on runs of whitespace.
std::vector<std::string> PySplit(absl::string_view s, const std::string* sep, int64_t maxsplit);

// PyReplace: str.replace(old, new, count) (count < 0: all).
std::string PyReplace(absl::string_view s, absl::string_view from, absl::string_view to,
                      int64_t count);

std::string AsciiLower(absl::string_view s);
std::string AsciiUpper(absl::string_view s);
// PyTitle: str.title(): a letter after a non-letter is upper case, the rest lower case.
std::string PyTitle(absl::string_view s);
// PyCapitalize: str.capitalize(): the first character upper case, the rest lower case.
std::string PyCapitalize(absl::string_view s);

}  // namespace kvguard::core::jinja

#endif  // KVGUARD_CORE_TEXT_JINJA_PYSTR_H_
