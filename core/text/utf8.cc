// core/text/utf8.cc: see utf8.h.
#include "core/text/utf8.h"

namespace kvguard::core {

Utf8Lead Utf8LeadOf(unsigned char c) {
  Utf8Lead lead;
  if (c < 0x80) {
    lead.length = 1;
  } else if (c >= 0xC2 && c <= 0xDF) {
    lead.length = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    lead.length = 3;
    if (c == 0xE0) lead.second_lo = 0xA0;
    if (c == 0xED) lead.second_hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    lead.length = 4;
    if (c == 0xF0) lead.second_lo = 0x90;
    if (c == 0xF4) lead.second_hi = 0x8F;
  }
  return lead;
}

size_t Utf8SequenceAt(std::string_view text, size_t pos, char32_t* cp) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[pos + i]); };
  const unsigned char c = byte(0);
  const Utf8Lead lead = Utf8LeadOf(c);
  const size_t n = static_cast<size_t>(lead.length);
  if (n == 0 || text.size() - pos < n) return 0;
  // The lead byte's payload bits: 7, 5, 4 or 3 of them.
  char32_t value = n == 1 ? c : c & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) {
    const unsigned char b = byte(i);
    if (b < (i == 1 ? lead.second_lo : 0x80) || b > (i == 1 ? lead.second_hi : 0xBF)) return 0;
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
