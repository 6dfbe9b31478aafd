#include "core/text/jinja/pystr.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvguard::core::jinja {

std::vector<char32_t> CodePoints(absl::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    const size_t n = core::Utf8SequenceAt(std::string_view(s.data(), s.size()), i, &cp);
    out.push_back(n == 0 ? static_cast<unsigned char>(s[i]) : cp);  // callers pass valid UTF-8
    i += n == 0 ? 1 : n;
  }
  return out;
}

std::string EncodeUtf8(const std::vector<char32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) AppendUtf8(cps[i], &out);
  return out;
}

size_t CodePointCount(absl::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool IsPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::string PyStrip(absl::string_view s, const std::string* chars, bool left, bool right) {
  const std::vector<char32_t> cps = CodePoints(s);
  std::vector<char32_t> set;
  if (chars != nullptr) set = CodePoints(*chars);
  auto strip = [&](char32_t c) {
    return chars == nullptr ? IsPySpace(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  return EncodeUtf8(cps, b, e);
}

std::vector<std::string> PySplit(absl::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep != nullptr) {
    size_t pos = 0;
    while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
      const size_t at = s.find(*sep, pos);
      if (at == absl::string_view::npos) break;
      out.emplace_back(s.substr(pos, at - pos));
      pos = at + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  const std::vector<char32_t> cps = CodePoints(s);
  size_t i = 0;
  while (true) {
    while (i < cps.size() && IsPySpace(cps[i])) ++i;
    if (i == cps.size()) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      size_t e = cps.size();
      while (e > i && IsPySpace(cps[e - 1])) --e;
      out.push_back(EncodeUtf8(cps, i, e));
      break;
    }
    size_t j = i;
    while (j < cps.size() && !IsPySpace(cps[j])) ++j;
    out.push_back(EncodeUtf8(cps, i, j));
    i = j;
  }
  return out;
}

std::string PyReplace(absl::string_view s, absl::string_view from, absl::string_view to,
                      int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` before every code point and at the end.
    const std::vector<char32_t> cps = CodePoints(s);
    int64_t done = 0;
    for (char32_t c : cps) {
      if (count < 0 || done < count) {
        absl::StrAppend(&out, to);
        ++done;
      }
      AppendUtf8(c, &out);
    }
    if (count < 0 || done < count) absl::StrAppend(&out, to);
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(from, pos);
    if (at == absl::string_view::npos) break;
    absl::StrAppend(&out, s.substr(pos, at - pos));
    absl::StrAppend(&out, to);
    pos = at + from.size();
    ++done;
  }
  absl::StrAppend(&out, s.substr(pos));
  return out;
}

std::string AsciiLower(absl::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  }
  return out;
}

std::string AsciiUpper(absl::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = char(c - 'a' + 'A');
  }
  return out;
}

std::string PyTitle(absl::string_view s) {
  std::string out(s);
  bool prev_letter = false;
  for (char& c : out) {
    const bool lower = c >= 'a' && c <= 'z', upper = c >= 'A' && c <= 'Z';
    if (lower && !prev_letter) c = char(c - 'a' + 'A');
    if (upper && prev_letter) c = char(c - 'A' + 'a');
    // Non-ASCII bytes count as letters (most are), so "éa" stays "éa" as Python's would.
    prev_letter = lower || upper || (static_cast<unsigned char>(c) >= 0x80);
  }
  return out;
}

std::string PyCapitalize(absl::string_view s) {
  std::string out = AsciiLower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = char(out[0] - 'a' + 'A');
  return out;
}

}  // namespace kvguard::core::jinja
