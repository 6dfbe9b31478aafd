// Tests for ByteTokenizer (round trips, BOS/EOS, the id >= 258 mapping) and the streaming UTF-8
// decoder (split sequences, ill-formed input, flush), with an independent UTF-8 validator as
// the oracle.
#include "core/text/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/text/utf8.h"

namespace kvguard::core {
namespace {

constexpr std::string_view kFffd = "\xEF\xBF\xBD";

std::unique_ptr<ByteTokenizer> MakeTokenizer(int vocab_size) {
  absl::StatusOr<std::unique_ptr<ByteTokenizer>> t = ByteTokenizer::Create(vocab_size);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

// RefValidUtf8 is RFC 3629 read literally: decode each sequence to its code point and refuse
// the overlong, the surrogate and the too large. Written independently of the decoder.
bool RefValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c >> 5) == 0x6) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c >> 4) == 0xE) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c >> 3) == 0x1E) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t j = 1; j < len; ++j) {
      const auto b = static_cast<unsigned char>(s[i + j]);
      if ((b >> 6) != 0x2) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    const uint32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

std::string DecodeWhole(std::string_view bytes) {
  Utf8StreamDecoder d;
  std::string out = d.Push(bytes);
  out += d.Flush();
  return out;
}

std::string DecodeByteByByte(std::string_view bytes) {
  Utf8StreamDecoder d;
  std::string out;
  for (const char c : bytes) {
    const std::string piece = d.Push(std::string_view(&c, 1));
    EXPECT_TRUE(RefValidUtf8(piece));
    out += piece;
  }
  out += d.Flush();
  return out;
}

const std::vector<std::string>& Texts() {
  static const std::vector<std::string> texts = {
      "",
      "Hello, world! 0123456789 ~`!@#$%^&*()",
      "Привет, мир! Съешь же ещё этих мягких французских булок",  // Cyrillic
      "你好，世界。日本語のテキスト、한국어 텍스트",              // CJK
      "مرحبا بالعالم",                                            // Arabic (RTL)
      "emoji: 🙂👍🏽🇺🇦 👨‍👩‍👧 𝄞",      // 4-byte, ZWJ, flags
      "mixed: a\u00e9\u20ac\U0001F600z",
  };
  return texts;
}

TEST(ByteTokenizerTest, CreateRefusesVocabWithoutRoomForBytesBosEos) {
  EXPECT_FALSE(ByteTokenizer::Create(257).ok());
  EXPECT_FALSE(ByteTokenizer::Create(0).ok());
  EXPECT_FALSE(ByteTokenizer::Create(-5).ok());
  const absl::Status s = ByteTokenizer::Create(100).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("vocab_size"), std::string_view::npos) << s;
  // Positive twins.
  ASSERT_TRUE(ByteTokenizer::Create(ByteTokenizer::kMinVocab).ok());
  absl::StatusOr<std::unique_ptr<ByteTokenizer>> big = ByteTokenizer::Create(32000);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ((*big)->vocab_size(), 32000);
  EXPECT_EQ((*big)->bos_id(), 256);
  EXPECT_EQ((*big)->eos_id(), 257);
}

TEST(ByteTokenizerTest, EncodeIsTheBytes) {
  auto tok = MakeTokenizer(32000);
  EXPECT_EQ(tok->Encode("Hi!", false), (std::vector<int>{72, 105, 33}));
  EXPECT_EQ(tok->Encode("Hi!", true), (std::vector<int>{256, 72, 105, 33}));
  EXPECT_EQ(tok->Encode("", false), std::vector<int>{});
  EXPECT_EQ(tok->Encode("", true), std::vector<int>{256});
  // Bytes above 0x7F are ids 128..255, not negative (char may be signed).
  EXPECT_EQ(tok->Encode("\xC3\xA9\xFF", false), (std::vector<int>{0xC3, 0xA9, 0xFF}));
}

TEST(ByteTokenizerTest, RoundTripsEveryScript) {
  auto tok = MakeTokenizer(32000);
  const Tokenizer& t = *tok;  // the engine only sees the interface
  for (const std::string& text : Texts()) {
    SCOPED_TRACE(text);
    for (const bool bos : {false, true}) {
      const std::vector<int> ids = t.Encode(text, bos);
      EXPECT_EQ(ids.size(), text.size() + (bos ? 1 : 0));
      EXPECT_EQ(t.Decode(ids), text);
    }
  }
}

TEST(ByteTokenizerTest, RoundTripsInvalidUtf8AndNul) {
  auto tok = MakeTokenizer(258);
  const std::string cases[] = {
      std::string("a\0b\0", 4),
      std::string(1, '\0'),
      "\xFF\xFE\xC0\x80\xED\xA0\x80",
      "\xE2\x82",  // truncated euro sign
      "\x80\x80\x80",
  };
  for (const std::string& text : cases) {
    EXPECT_EQ(tok->Decode(tok->Encode(text, true)), text);
    EXPECT_EQ(tok->Decode(tok->Encode(text, false)), text);
  }
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::vector<int> ids = tok->Encode(all, false);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[static_cast<size_t>(b)], b);
  EXPECT_EQ(tok->Decode(ids), all);

  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text(rng() % 64, '\0');
    for (char& c : text) c = static_cast<char>(rng());
    const std::vector<int> enc = tok->Encode(text, false);
    for (const int id : enc) ASSERT_LT(id, 256);  // never BOS/EOS nor the >= 258 ids
    ASSERT_EQ(tok->Decode(enc), text);
  }
}

TEST(ByteTokenizerTest, SpecialTokensHaveNoText) {
  auto tok = MakeTokenizer(32000);
  EXPECT_EQ(tok->DecodeToken(256), "");
  EXPECT_EQ(tok->DecodeToken(257), "");
  EXPECT_EQ(tok->Decode(std::vector<int>{256, 'o', 'k', 257}), "ok");
  // Positive twin: the ids around them do have text.
  EXPECT_EQ(tok->DecodeToken(255), "\xFF");
  EXPECT_EQ(tok->DecodeToken(258), std::string(1, '\0'));
}

TEST(ByteTokenizerTest, HighIdsMapToByteModulo256) {
  auto tok = MakeTokenizer(32000);
  EXPECT_EQ(tok->DecodeToken(258 + 'A'), "A");
  EXPECT_EQ(tok->DecodeToken(258 + 256 + 'A'), "A");
  EXPECT_EQ(tok->DecodeToken(258 + 255), "\xFF");
  EXPECT_EQ(tok->DecodeToken(31999), std::string(1, static_cast<char>((31999 - 258) % 256)));
  EXPECT_EQ(static_cast<unsigned char>(tok->DecodeToken(31999)[0]), 253);
  std::vector<int> ids;
  std::string expected;
  for (int id = 258; id < 32000; ++id) {
    const std::string piece = tok->DecodeToken(id);
    ASSERT_EQ(piece.size(), 1u) << id;  // every sampled id yields exactly one visible byte
    ASSERT_EQ(static_cast<unsigned char>(piece[0]), (id - 258) % 256) << id;
    ids.push_back(id);
    expected += piece;
  }
  EXPECT_EQ(tok->Decode(ids), expected);
}

TEST(ByteTokenizerTest, OutOfRangeIdsDecodeToNothing) {
  auto tok = MakeTokenizer(300);
  EXPECT_EQ(tok->DecodeToken(300), "");
  EXPECT_EQ(tok->DecodeToken(-1), "");
  EXPECT_EQ(tok->DecodeToken(1 << 30), "");
  EXPECT_EQ(tok->Decode(std::vector<int>{-7, 'x', 300, 299, 5000}), std::string("x") + "\x29");
  // Positive twin: the last in-range id.
  EXPECT_EQ(tok->DecodeToken(299), std::string(1, static_cast<char>(299 - 258)));
  auto minimal = MakeTokenizer(258);
  EXPECT_EQ(minimal->DecodeToken(258), "");  // out of that vocabulary
}

TEST(Utf8StreamDecoderTest, HoldsMultiByteCharacterSplitAcrossTokens) {
  Utf8StreamDecoder d;
  EXPECT_EQ(d.Push("a\xE2"), "a");  // euro sign E2 82 AC
  EXPECT_EQ(d.Push("\x82"), "");
  EXPECT_EQ(d.Push("\xAC"
                   "b"),
            "\xE2\x82\xAC"
            "b");
  EXPECT_EQ(d.Push("\xF0\x9F"), "");  // U+1F642 F0 9F 99 82
  EXPECT_EQ(d.Push("\x99"), "");
  EXPECT_EQ(d.Push("\x82"), "\xF0\x9F\x99\x82");
  EXPECT_EQ(d.Flush(), "");
}

TEST(Utf8StreamDecoderTest, TokenStreamReassemblesEveryScript) {
  auto tok = MakeTokenizer(32000);
  for (const std::string& text : Texts()) {
    SCOPED_TRACE(text);
    Utf8StreamDecoder d;
    std::string out;
    for (const int id : tok->Encode(text, true)) {
      const std::string piece = d.Push(tok->DecodeToken(id));
      EXPECT_TRUE(RefValidUtf8(piece));
      out += piece;
    }
    out += d.Flush();
    EXPECT_EQ(out, text);
  }
}

TEST(Utf8StreamDecoderTest, ReplacesIllFormedSequencesWithFffd) {
  const std::string r(kFffd);
  struct Case {
    std::string in, out;
  };
  const Case cases[] = {
      {"\xFF", r},
      {"\x80", r},                               // stray continuation
      {"\xC0\xAF", r + r},                       // C0 never starts a sequence (overlong '/')
      {"\xC1\xBF", r + r},                       // overlong
      {"\xE0\x80\x80", r + r + r},               // overlong 3-byte form
      {"\xE0\x9F\xBF", r + r + r},               // overlong (just below U+0800)
      {"\xE0\xA0\x80", "\xE0\xA0\x80"},          // U+0800, the first valid one
      {"\xED\xA0\x80", r + r + r},               // surrogate U+D800
      {"\xED\x9F\xBF", "\xED\x9F\xBF"},          // U+D7FF, the last before the surrogates
      {"\xF0\x8F\xBF\xBF", r + r + r + r},       // overlong 4-byte form
      {"\xF4\x90\x80\x80", r + r + r + r},       // U+110000
      {"\xF4\x8F\xBF\xBF", "\xF4\x8F\xBF\xBF"},  // U+10FFFF
      {"\xF5\x80", r + r},
      {"\xE2\x82"
       "A",
       r + "A"},  // truncated: one U+FFFD for both
      {"\xF0\x9F\x99"
       "x\xF0\x9F\x99\x82",
       r + "x\xF0\x9F\x99\x82"},
      // The example of the Unicode Standard, section 3.9 (U+FFFD substitution of maximal
      // subparts): 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64.
      {"a\xF1\x80\x80\xE1\x80\xC2"
       "b\x80"
       "c\x80\xBF"
       "d",
       "a" + r + r + r + "b" + r + "c" + r + r + "d"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::PrintToString(c.in));
    EXPECT_EQ(DecodeWhole(c.in), c.out);
    EXPECT_EQ(DecodeByteByByte(c.in), c.out);
    EXPECT_EQ(IsValidUtf8(c.in), c.in == c.out);
  }
}

TEST(Utf8StreamDecoderTest, FlushEmitsFffdForIncompleteTailAndResets) {
  Utf8StreamDecoder d;
  EXPECT_EQ(d.Push("ab\xF0\x9F\x99"), "ab");
  EXPECT_EQ(d.Flush(), kFffd);
  EXPECT_EQ(d.Flush(), "");  // nothing held any more
  // Reset: a continuation byte is now stray, not the end of the old sequence.
  EXPECT_EQ(d.Push("\x82"), kFffd);
  // Positive twin: a complete stream flushes nothing.
  EXPECT_EQ(d.Push("\xC3\xA9"), "\xC3\xA9");
  EXPECT_EQ(d.Flush(), "");
  EXPECT_EQ(d.Push("\xC3"), "");
  EXPECT_EQ(d.Flush(), kFffd);
}

TEST(Utf8StreamDecoderTest, AgreesWithReferenceOnEveryShortString) {
  // Every string of 1 to 4 bytes over the bytes where UTF-8's rules change.
  const unsigned char alphabet[] = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0,
                                    0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xED,
                                    0xEF, 0xF0, 0xF1, 0xF4, 0xF5, 0xFF};
  constexpr size_t kA = sizeof(alphabet);
  size_t checked = 0;
  for (size_t len = 1; len <= 4; ++len) {
    size_t combos = 1;
    for (size_t i = 0; i < len; ++i) combos *= kA;
    for (size_t code = 0; code < combos; ++code) {
      std::string s(len, '\0');
      size_t c = code;
      for (size_t i = 0; i < len; ++i, c /= kA) s[i] = static_cast<char>(alphabet[c % kA]);
      const std::string whole = DecodeWhole(s);
      ASSERT_TRUE(RefValidUtf8(whole)) << testing::PrintToString(s);
      ASSERT_EQ(IsValidUtf8(s), RefValidUtf8(s)) << testing::PrintToString(s);
      if (RefValidUtf8(s)) {
        ASSERT_EQ(whole, s);
      }
      // Cut once at every position: the output may not depend on where the pieces split.
      for (size_t cut = 1; cut < len; ++cut) {
        Utf8StreamDecoder d;
        std::string out = d.Push(std::string_view(s).substr(0, cut));
        out += d.Push(std::string_view(s).substr(cut));
        out += d.Flush();
        ASSERT_EQ(out, whole) << testing::PrintToString(s) << " cut at " << cut;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 240000u);
}

TEST(Utf8StreamDecoderTest, RandomStreamsAreValidAndSplitInvariant) {
  std::mt19937 rng(11);
  const std::string pieces[] = {"a", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x99\x82", "\xE4\xB8"};
  for (int trial = 0; trial < 500; ++trial) {
    std::string s;
    const size_t n = rng() % 40;
    for (size_t i = 0; i < n; ++i) {
      if (rng() % 4 == 0) {
        s.push_back(static_cast<char>(rng()));
      } else {
        s += pieces[rng() % std::size(pieces)];
      }
    }
    const std::string whole = DecodeWhole(s);
    ASSERT_TRUE(RefValidUtf8(whole));
    if (RefValidUtf8(s)) {
      ASSERT_EQ(whole, s);
    }
    Utf8StreamDecoder d;
    std::string out;
    for (size_t pos = 0; pos < s.size();) {
      const size_t len = std::min<size_t>(s.size() - pos, rng() % 5);
      const std::string piece = d.Push(std::string_view(s).substr(pos, len));
      ASSERT_TRUE(RefValidUtf8(piece));
      out += piece;
      pos += len;
    }
    out += d.Flush();
    ASSERT_EQ(out, whole);
  }
}

TEST(IsValidUtf8Test, AcceptsTextAndRefusesBrokenBytes) {
  for (const std::string& text : Texts()) EXPECT_TRUE(IsValidUtf8(text)) << text;
  EXPECT_TRUE(IsValidUtf8(std::string("\0", 1)));
  EXPECT_FALSE(IsValidUtf8("abc\xE2\x82"));
  EXPECT_FALSE(IsValidUtf8("\xEF\xBF"));  // U+FFFD cut short
  EXPECT_TRUE(IsValidUtf8("\xEF\xBF\xBD"));
  EXPECT_FALSE(IsValidUtf8("\xC0\x80"));  // "modified UTF-8" NUL
}

}  // namespace
}  // namespace kvguard::core
