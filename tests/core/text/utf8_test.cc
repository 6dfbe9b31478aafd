// Tests for the one UTF-8 codec (core/text/utf8.h): every code point round-trips through
// AppendUtf8 and Utf8SequenceAt; every ill-formed form of Table 3-7 is refused, each beside the
// well-formed sequence nearest to it.
#include "core/text/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace kvguard::core {
namespace {

bool IsSurrogate(char32_t cp) { return cp >= 0xD800 && cp <= 0xDFFF; }

TEST(Utf8Test, EveryScalarValueRoundTrips) {
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (IsSurrogate(cp)) continue;
    std::string s;
    AppendUtf8(cp, &s);
    const size_t want = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    ASSERT_EQ(s.size(), want) << std::hex << static_cast<uint32_t>(cp);
    char32_t got = 0;
    ASSERT_EQ(Utf8SequenceAt(s, 0, &got), want) << std::hex << static_cast<uint32_t>(cp);
    ASSERT_EQ(got, cp);
    ASSERT_TRUE(IsValidUtf8(s));
  }
}

// Negative twin of EveryScalarValueRoundTrips: the same values in forms Table 3-7 excludes.
TEST(Utf8Test, SurrogatesOverlongsAndValuesPastTheRangeAreRefused) {
  char32_t cp = 0;
  for (char32_t s = 0xD800; s <= 0xDFFF; ++s) {  // encoded surrogates (ED A0..BF xx)
    std::string text;
    AppendUtf8(s, &text);
    ASSERT_EQ(Utf8SequenceAt(text, 0, &cp), 0u) << std::hex << static_cast<uint32_t>(s);
    ASSERT_FALSE(IsValidUtf8(text));
  }
  for (char32_t v = 0; v < 0x80; ++v) {  // two-byte overlongs (C0, C1 lead bytes)
    const std::string text{static_cast<char>(0xC0 | (v >> 6)),
                           static_cast<char>(0x80 | (v & 0x3F))};
    ASSERT_EQ(Utf8SequenceAt(text, 0, &cp), 0u);
  }
  for (char32_t v = 0; v < 0x800; ++v) {  // three-byte overlongs (E0 80..9F xx)
    const std::string text{static_cast<char>(0xE0), static_cast<char>(0x80 | (v >> 6)),
                           static_cast<char>(0x80 | (v & 0x3F))};
    ASSERT_EQ(Utf8SequenceAt(text, 0, &cp), 0u);
  }
  EXPECT_EQ(Utf8SequenceAt("\xF0\x8F\xBF\xBF", 0, &cp), 0u);  // four-byte overlong of U+FFFF
  EXPECT_EQ(Utf8SequenceAt("\xF4\x90\x80\x80", 0, &cp), 0u);  // U+110000
  EXPECT_EQ(Utf8SequenceAt("\xF4\x8F\xBF\xBF", 0, &cp), 4u);  // U+10FFFF, the last value
  EXPECT_EQ(cp, char32_t{0x10FFFF});
  for (int lead = 0xF5; lead <= 0xFF; ++lead) {
    const std::string text{static_cast<char>(lead), '\x80', '\x80', '\x80'};
    EXPECT_EQ(Utf8SequenceAt(text, 0, &cp), 0u) << lead;
  }
}

TEST(Utf8Test, SequencesCutShortAndStrayContinuationBytesAreRefused) {
  char32_t cp = 0;
  const std::string euro = "\xE2\x82\xAC";  // U+20AC
  EXPECT_EQ(Utf8SequenceAt(euro, 0, &cp), 3u);
  EXPECT_EQ(cp, char32_t{0x20AC});
  EXPECT_TRUE(IsValidUtf8("a" + euro + "b"));
  for (size_t cut = 1; cut < euro.size(); ++cut) {
    EXPECT_EQ(Utf8SequenceAt(euro.substr(0, cut), 0, &cp), 0u) << cut;
    EXPECT_FALSE(IsValidUtf8("a" + euro.substr(0, cut))) << cut;
  }
  EXPECT_EQ(Utf8SequenceAt(euro, 1, &cp), 0u);  // a continuation byte on its own
  EXPECT_FALSE(IsValidUtf8("\x80"));
  EXPECT_FALSE(IsValidUtf8("\xE2\x28\xAC"));  // a non-continuation byte inside the sequence
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8(std::string("\0", 1)));
}

}  // namespace
}  // namespace kvguard::core
