// core/text/utf8.h: the project's one UTF-8 codec (decode one sequence, validate, encode), used
// by the tokenizers, the chat-template interpreter and the API's input checks alike, so that
// every part agrees on what well-formed UTF-8 is.
#ifndef KVGUARD_CORE_TEXT_UTF8_H_
#define KVGUARD_CORE_TEXT_UTF8_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace kvguard::core {

// Utf8Lead describes a sequence's first byte as Table 3-7 does: how many bytes the sequence
// has (1..4; 0 for a byte that cannot start one: a continuation byte, C0, C1, F5..FF) and the
// range the second byte must fall in (E0 and F0 exclude overlong forms, ED surrogates, F4 code
// points past U+10FFFF). Every decoder here (Utf8SequenceAt, the tokenizers' streaming
// decoder) reads the rules from it.
struct Utf8Lead {
  int length = 0;
  unsigned char second_lo = 0x80, second_hi = 0xBF;
};
Utf8Lead Utf8LeadOf(unsigned char c);

// Utf8SequenceAt returns the length (1..4) of the well-formed UTF-8 sequence that starts at
// text[pos] (pos < text.size()) and sets *cp to its code point; it returns 0 when the bytes
// there are not one (a stray continuation byte, a lead byte C0, C1 or F5..FF, an overlong form,
// a surrogate, a code point past U+10FFFF, or a sequence cut short), leaving *cp unspecified.
// The rules are the Unicode Standard's Table 3-7 (well-formed byte sequences).
size_t Utf8SequenceAt(std::string_view text, size_t pos, char32_t* cp);

// IsValidUtf8 returns whether `text` is well-formed UTF-8 throughout (the empty string is).
bool IsValidUtf8(std::string_view text);

// AppendUtf8 appends the UTF-8 encoding of code point `cp` (<= U+10FFFF; surrogates are
// encoded as they come, for callers that build text from byte-level tables) to `out`.
void AppendUtf8(char32_t cp, std::string* out);

}  // namespace kvguard::core

#endif  // KVGUARD_CORE_TEXT_UTF8_H_
