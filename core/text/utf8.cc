// core/text/utf8.cc: see utf8.h.
#include "core/text/utf8.h"

namespace kvguard::core {

size_t Utf8SequenceAt(std::string_view text, size_t pos, char32_t* cp) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[pos + i]); };
  const unsigned char c = byte(0);
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  // The lead byte fixes the length and the range of the second byte (Table 3-7): E0 and F0
  // exclude overlong forms, ED surrogates, F4 code points past U+10FFFF.
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  char32_t value = 0;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2, value = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3, value = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4, value = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (text.size() - pos < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    const unsigned char b = byte(i);
    if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) return 0;
    value = (value << 6) | (b & 0x3F);
  }
  *cp = value;
  return n;
}

bool IsValidUtf8(std::string_view text) {
  char32_t cp;
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = Utf8SequenceAt(text, pos, &cp);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace kvguard::core
